"""A deterministic, offline set of diverse chat prompts, split TRAIN / HELD-OUT.

Prompts are templates x topics over five kinds (chat, code, lists, stories,
arithmetic); "chat" also covers explanations, how-to, comparisons, advice and
summaries of short offline passages (Python's own pydoc topics, PSF licence).
Everything here is written in this file or taken from the running Python's
pydoc_data. The passages differ between Python minor versions, and since one seeded
random stream makes every split, on another Python *every* kind's topic split after
them differs too (seen on a GPU machine's Python 3.12, 2026-11-30: 31 of the 80
held-out prompts had their topic, 14 their exact text, among that machine's TRAIN
prompts). So the lists are frozen: ``build()`` (run on Python 3.11) wrote
tools/data/train_prompts.jsonl.gz and tools/data/heldout_prompts.jsonl, and
``train_prompts()`` / ``heldout_prompts()`` read those files on every machine.

The split is by *topic*: each kind's topic pool is shuffled with a fixed seed and
its first slice is reserved for HELD-OUT, so no held-out prompt shares a topic (story
character, arithmetic person or item) with any training prompt, and the two sets
never share a prompt string.

The TRAIN list has two batches. The first (indices 0..FIRST_EXTRA-1, 8479 prompts) is
what build() made until 2026-11-30; every answerable one has its answer in
fixtures/peagle-data. The second (``_extra``, 4135 prompts, appended on 2026-11-30 when
the first had run out) reuses the first batch's TRAIN topics under new templates and new
seeded draws, from its own random stream, so the first batch, the held-out split and the
calibration prompts (drawn from the first batch only) are unchanged.

    python tools/prompts.py --check    # build() here equals the frozen files? (exit 1 if not)
    python tools/prompts.py --write    # (re)write the frozen files from build() on this Python
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

KINDS = ("chat", "code", "lists", "stories", "arithmetic")
HELDOUT_PER_KIND = 16
SEED = 20261129
HELDOUT_PATH = Path(__file__).resolve().parent / "data" / "heldout_prompts.jsonl"
TRAIN_PATH = Path(__file__).resolve().parent / "data" / "train_prompts.jsonl.gz"
BUILT_ON = (3, 11)  # the Python minor version whose pydoc_data the frozen lists come from

# --- topic pools -------------------------------------------------------------

SUBJECTS = """photosynthesis; the water cycle; black holes; volcanoes; earthquakes; plate tectonics;
the immune system; vaccines; antibiotics; DNA; evolution by natural selection; the human heart;
the nervous system; sleep; dreams; memory; the placebo effect; gravity; magnetism; electricity;
static electricity; rainbows; lightning; tides; the seasons; the phases of the moon; solar eclipses;
comets; the Big Bang; exoplanets; the Milky Way; neutron stars; the speed of light; sound waves;
the greenhouse effect; climate change; ocean currents; coral reefs; rainforests; deserts; glaciers;
the ozone layer; recycling; composting; renewable energy; solar panels; wind turbines;
nuclear power; batteries; electric cars; hydrogen fuel; the internet; email; encryption; passwords;
cloud computing; machine learning; neural networks; search engines; databases; operating systems;
compilers; open source software; version control; blockchain; smartphones; GPS; Wi-Fi; 3D printing;
robots; drones; the printing press; the steam engine; the industrial revolution; the Roman empire;
ancient Egypt; the pyramids; the Great Wall of China; the Renaissance; the French revolution;
the Silk Road; the Vikings; the Olympic games; the moon landing; democracy; taxes; inflation;
interest rates; the stock market; supply and demand; banks; credit cards; budgeting; insurance;
globalization; trade; unemployment; honey bees; ants; penguins; dolphins; octopuses; elephants;
wolves; migratory birds; butterflies; sharks; bats; camouflage in animals; hibernation; mushrooms;
trees; seeds; bread making; fermentation; coffee; tea; chocolate; cheese; spices; vegetarian diets;
vitamins; exercise; stretching; meditation; stress; habits; procrastination; time management;
public speaking; teamwork; leadership; negotiation; learning a language; reading; libraries;
museums; jazz music; classical music; the piano; the guitar; painting; photography; poetry;
theatre; movies; animation; video games; chess; board games; football; basketball; tennis;
swimming; running a marathon; cycling; mountain climbing; camping; maps; time zones; calendars;
clocks; money; recycling plastic; water purification; bridges; skyscrapers; tunnels; airplanes;
helicopters; trains; ships; submarines; rockets; satellites; the International Space Station;
telescopes; microscopes; thermometers; refrigerators; microwaves; washing machines; light bulbs;
lasers; radio; television; cameras; paper; glass; steel; plastics; concrete; cotton; silk;
volunteering; friendship; kindness; gratitude; curiosity; creativity; critical thinking;
the scientific method; statistics; probability; prime numbers; fractions; geometry; algebra;
infinity; zero; percentages; graphs; logic puzzles; origami; gardening; houseplants; beekeeping;
bird watching; astronomy as a hobby; knitting; cooking rice; baking cookies; making pizza;
first aid; fire safety; road safety; sunscreen; hand washing; hydration; allergies; the common cold;
earth's atmosphere; clouds; snowflakes; hurricanes; tornadoes; floods; droughts; soil; rivers;
lakes; mountains; islands; caves; waterfalls; the Amazon river; the Sahara desert; Antarctica;
the Arctic; the Pacific Ocean; the Himalayas; Mars; Jupiter; Saturn's rings; the Sun; asteroids;
meteor showers; the periodic table; atoms; molecules; chemical reactions; acids and bases; rust;
salt; sugar; water; oxygen; carbon; diamonds; gold; copper; iron"""

HOWTO = """make a cup of tea; boil an egg; plant a tree; start a vegetable garden; change a flat bicycle tire;
write a cover letter; prepare for a job interview; learn to touch type; save money each month;
make a budget; organize a closet; clean a laptop keyboard; back up computer files; choose a strong password;
start running; improve sleep quality; study for an exam; take better notes; write a short essay;
give a presentation; make new friends in a new city; learn to juggle; care for a cat; train a puppy;
set up a fish tank; make pancakes; bake banana bread; cook pasta; make a salad; brew coffee at home;
wash clothes by hand; iron a shirt; sew a button; fold a paper airplane; read a map; use a compass;
pack for a trip; plan a birthday party; write a thank-you note; meditate for five minutes;
keep a journal; learn a new word every day; read more books; reduce screen time; stay focused while working;
set goals; stay hydrated; stretch after exercise; prepare for a hike; build a campfire safely;
remove a coffee stain; repot a houseplant; compost kitchen scraps; recycle at home; save energy at home;
write a simple poem; draw a cat; tune a guitar; practice the piano; learn chess openings;
solve a Rubik's cube; start a podcast; take good photos with a phone; edit a photo; write a blog post;
install Python; create a virtual environment in Python; read a CSV file in Python; use git for the first time;
debug a program; write unit tests; name variables well; review someone's code; learn a programming language;
estimate a tip at a restaurant; convert Celsius to Fahrenheit; calculate a percentage; split a bill;
measure ingredients without a scale; make lemonade; host a picnic; prepare a first aid kit;
clean a bathroom; wash a car; paint a room; hang a picture; fix a squeaky door; unclog a sink"""

PAIRS = """cats and dogs; tea and coffee; trains and airplanes; books and movies; summer and winter;
the sun and the moon; oceans and lakes; rivers and canals; bicycles and cars; cities and villages;
Python and JavaScript; lists and tuples in Python; RAM and hard drives; laptops and desktops;
email and letters; paper books and e-books; running and swimming; chess and checkers;
violins and cellos; frogs and toads; alligators and crocodiles; butterflies and moths;
weather and climate; viruses and bacteria; stars and planets; meteors and comets; rain and snow;
mountains and hills; deserts and tundras; wolves and foxes; bees and wasps; apples and oranges;
baking and frying; democracy and monarchy; saving and investing; renting and buying a home;
solar power and wind power; analog and digital clocks; radio and podcasts; painting and photography;
classical music and jazz; football and rugby; tennis and badminton; sharks and dolphins;
mammals and reptiles; weeds and flowers; vinegar and lemon juice; sugar and honey;
walking and cycling to work; working from home and working in an office; cotton and wool;
a loop and recursion; a compiler and an interpreter; TCP and UDP; HTTP and HTTPS;
arrays and linked lists; stacks and queues; speed and velocity; mass and weight; heat and temperature;
atoms and molecules; acids and bases; bones and muscles; arteries and veins; fiction and nonfiction;
poems and songs; novels and short stories; museums and libraries; maps and globes"""

LIST_SUBJECTS = """fruits that are high in vitamin C; ways to save water at home; animals that live in the ocean;
famous inventions of the 20th century; tips for a good night's sleep; healthy breakfast ideas;
hobbies you can start at home; things to pack for a beach trip; benefits of reading; uses for baking soda;
reasons to learn a second language; planets in the solar system; musical instruments with strings;
ways to reduce stress; indoor plants that are easy to care for; board games for families;
tips for studying effectively; kitchen tools every cook needs; ways to be more productive;
common mistakes new programmers make; Python built-in functions; features of a good website;
things to do on a rainy day; ways to stay active in winter; renewable energy sources;
birds that cannot fly; things that are made of glass; safety tips for cycling;
questions to ask in a job interview; qualities of a good friend; ways to help the environment;
vegetables that grow quickly; rules of good email etiquette; tips for public speaking;
famous landmarks in Europe; fun facts about the moon; ways to practice gratitude;
things to check before a long car trip; ingredients for a simple soup; exercises you can do without equipment;
ways to make a small room look bigger; tips for taking care of a dog; signs of dehydration;
things a first aid kit should contain; benefits of walking; types of clouds; kinds of triangles;
data structures every programmer should know; sorting algorithms; ways to keep a conversation going;
tips for writing clearly; ideas for a science fair project; ways to reuse glass jars;
careers in science; reasons to visit a museum; snacks for a long hike; ways to learn new words;
cheap date ideas; tips for saving money on groceries; things to do in a new city; ways to cool down in summer;
animals that hibernate; spices used in Indian cooking; herbs you can grow on a windowsill;
common cooking methods; parts of a computer; parts of a flower; layers of the Earth;
ways to improve handwriting; tips for learning to code; things to include in a resume;
ways to celebrate a birthday; games to play at a party; signs that it is going to rain;
ways to make your mornings easier; uses for a spreadsheet; reasons people keep diaries;
fun things to do with kids; tips for a successful garden; ways to reduce food waste;
elements of a good story; famous scientists; famous painters; types of bridges; ways to travel cheaply"""

CODE_TASKS = """reverses a string; checks whether a string is a palindrome; counts the vowels in a string;
returns the factorial of a number; returns the n-th Fibonacci number; checks whether a number is prime;
finds the largest number in a list; computes the average of a list of numbers; removes duplicates from a list;
merges two sorted lists; flattens a nested list; counts how often each word appears in a text;
converts Celsius to Fahrenheit; checks whether two strings are anagrams; capitalizes every word in a sentence;
finds the second largest number in a list; sums the digits of an integer; converts a decimal number to binary;
checks whether a year is a leap year; returns the greatest common divisor of two numbers;
returns all even numbers from a list; sorts a list of dictionaries by a key; reads a text file and counts its lines;
writes a list of strings to a file; finds the longest word in a sentence; rotates a list by k positions;
checks whether a list is sorted; returns the intersection of two lists; computes the power set of a list;
implements binary search; implements bubble sort; implements insertion sort; implements a stack class;
implements a queue class; validates an email address with a simple check; generates a random password;
counts the characters in a string; returns the median of a list; transposes a matrix given as a list of lists;
multiplies two matrices; checks balanced parentheses; converts a Roman numeral to an integer;
converts an integer to a Roman numeral; computes the area of a circle; chunks a list into pieces of size n;
finds the missing number in a list from 1 to n; removes all whitespace from a string;
returns the n largest items of a list; computes compound interest; converts seconds to hours, minutes and seconds;
checks whether a number is a perfect square; generates the first n prime numbers; computes a running total of a list;
groups words by their first letter; swaps the keys and values of a dictionary; merges two dictionaries;
finds the most common element in a list; reverses the words in a sentence; counts uppercase letters in a string;
returns the Collatz sequence of a number; computes the distance between two points; checks whether a number is even;
returns a list of squares from 1 to n; interleaves two lists; removes punctuation from a string;
computes the dot product of two vectors; formats a number with thousands separators; truncates a string to n characters;
parses a date string in the format YYYY-MM-DD; returns the day of the week for a date; retries a function three times on error;
memoizes a function; times how long a function takes; reads a JSON file; writes a dictionary to a JSON file;
reads a CSV file into a list of dictionaries; finds all files with a given extension in a folder;
counts the words in a file; implements a simple calculator; implements a linked list; implements FizzBuzz;
prints a multiplication table; draws a triangle of stars; simulates rolling two dice; shuffles a deck of cards;
implements a simple to-do list class; validates a password's strength; converts a string to snake_case;
converts snake_case to camelCase; checks whether a string contains only digits; pads a number with leading zeros"""

MODULES = """argparse; array; asyncio; base64; bisect; calendar; collections; contextlib; copy; csv; dataclasses;
datetime; decimal; difflib; enum; fractions; functools; glob; gzip; hashlib; heapq; html; itertools; json;
logging; math; operator; os; pathlib; pickle; pprint; queue; random; re; secrets; shutil; sqlite3; statistics;
string; struct; subprocess; sys; tempfile; textwrap; threading; time; timeit; typing; unittest; urllib.parse;
uuid; zipfile; zlib; io; abc; weakref; shlex; fnmatch"""

CHARACTERS = """a curious cat; a retired astronaut; a shy dragon; a young inventor; a lost robot; a brave mouse;
an old lighthouse keeper; a talking tree; a clumsy wizard; a little girl who loves maps; a baker; a detective dog;
a penguin who wants to fly; a grandmother and her grandson; a painter who lost her colors; a friendly ghost;
a pirate who is afraid of water; a fox and a crow; a snowman; a kid who finds a secret door;
a librarian; a lonely whale; a firefighter; a squirrel collecting nuts; a knight without a sword;
a gardener; a musician on the street; a teacher on her last day; a star that fell from the sky;
a turtle in a race; a student on exam day; two rival chefs; a boy and his kite; a tiny ant; a giant; a queen;
an owl who cannot sleep; a scientist in Antarctica; a farmer; a taxi driver; a mail carrier; a lost puppy"""

SETTINGS = """in a small village; on a rainy day; in space; under the sea; in a busy city; in a magical forest;
on a train; at the beach; in a library; on a mountain; in a desert; at a school; in the year 3000;
during a snowstorm; at a market; in a castle; on an island; at night; in a bakery; at a carnival"""

THEMES = """friendship; courage; kindness; learning from mistakes; patience; honesty; sharing; curiosity;
never giving up; teamwork; finding home; helping others"""

NAMES = """Anna; Ben; Carla; David; Emma; Farid; Grace; Hugo; Iris; Jonas; Kai; Lena; Marco; Nora; Omar; Priya;
Quinn; Rosa; Sam; Tara; Umar; Vera; Wen; Xavier; Yara; Zoe; Leo; Mia; Noah; Lily"""

ITEMS = """apples; pencils; stickers; marbles; cookies; books; oranges; stamps; cards; balloons; coins; eggs;
candies; shells; toy cars; flowers; bottles of water; notebooks; cupcakes; beads"""

# --- templates ----------------------------------------------------------------

T_EXPLAIN = ["Explain {t} in simple terms.", "What is {t}?", "Can you explain how {t} works?",
             "Explain {t} to a ten-year-old.", "Give me a short overview of {t}.",
             "Why is {t} important?", "Write a short paragraph about {t}.",
             "What are some interesting facts about {t}?", "Describe {t} in three sentences.",
             "Tell me about {t}.", "What should a beginner know about {t}?",
             "What are the advantages and disadvantages of {t}?"]
T_HOWTO = ["How do I {t}?", "Give me step-by-step instructions to {t}.", "What is the best way to {t}?",
           "Explain how to {t}.", "I want to {t}. Where should I start?", "Give me some tips to {t}."]
T_COMPARE = ["What is the difference between {t}?", "Compare {t}.", "Explain the main differences between {t}.",
             "Which is better, {a} or {b}? Explain briefly.", "What do {t} have in common?"]
T_SUMMARY = ["Summarize the following text in two sentences:\n\n{t}",
             "Explain this passage in simple words:\n\n{t}",
             "What is the main idea of this text?\n\n{t}"]
T_LIST = ["List five {t}.", "Give me a list of {t}.", "What are some {t}? Give a numbered list.",
          "Name three {t} and explain each in one sentence.", "Make a bullet list of {t}.",
          "List ten {t}."]
T_CODE = ["Write a Python function that {t}.", "Write Python code that {t}.",
          "Show me a Python function that {t}, with a short explanation.",
          "How would you write a function in Python that {t}?",
          "Write a Python function that {t}. Include a docstring and an example.",
          "Write a short Python program that {t}, and explain how it works.",
          "Write a Python function that {t}. Add type hints."]
T_MODULE = ["Show a short example of using the Python `{t}` module.", "What is the Python `{t}` module used for?",
            "Explain the Python `{t}` module with an example.", "Give me three common uses of Python's `{t}` module."]
T_STORY = ["Write a short story about {c} {s}.", "Tell me a short story about {c} {s} with a lesson about {m}.",
           "Write a bedtime story about {c}.", "Write a short story about {m}, featuring {c}.",
           "Write a poem about {c} {s}.", "Write a fable about {c} that teaches {m}."]

POOL_SEP = ";"

# Templates of the second TRAIN batch (``_extra``): none equals one above, so every
# extra prompt is a new string; they reuse only the TRAIN topics.
T_EXPLAIN2 = ["How would you explain {t} to a friend?", "Write a short blog post about {t}.",
              "What are the most common misconceptions about {t}?", "Summarize what is known about {t}.",
              "Give me five quick facts about {t}.", "How does {t} affect everyday life?",
              "What is the history of {t}?", "Explain {t} using an analogy.",
              "Write a short quiz with three questions about {t}, with answers.",
              "What questions do people often ask about {t}? Answer two of them."]
T_HOWTO2 = ["What mistakes should I avoid when I {t}?", "Write a checklist to {t}.",
            "My friend asked me how to {t}. What should I tell them?", "How long does it take to {t}, and what do I need?"]
T_COMPARE2 = ["Write a short essay comparing {t}.", "Give three similarities and three differences between {t}.",
              "Make a table comparing {t}."]
T_LIST2 = ["Give me seven {t}, each with a short explanation.", "What are the top five {t}?",
           "Write a numbered list of {t} for a beginner.", "Can you suggest some {t}?"]
T_CODE2 = ["Write a Python function that {t}, and write two tests for it.",
           "Write a Python class with a method that {t}.",
           "Explain step by step how to write a Python function that {t}.",
           "Write a Python function that {t}, without using any imports."]
T_MODULE2 = ["Write a small script that uses Python's `{t}` module.", "What are the main functions of Python's `{t}` module?"]
T_STORY2 = ["Write a funny short story about {c} {s}.", "Write a story for children about {c} who learns about {m}.",
            "Write a short adventure story about {c} {s}.", "Write a diary entry by {c} {s}.",
            "Write a short dialogue between {c} and a friend about {m}."]
EXTRA_SEED = SEED + 1


def _add(dst: list[dict], kind: str, prompts) -> None:
    """Append ``prompts`` to ``dst`` as {"prompt", "kind"} rows."""
    dst.extend({"prompt": p, "kind": kind} for p in prompts)


def _pool(text: str) -> list[str]:
    return [x.strip() for x in text.replace("\n", " ").split(POOL_SEP) if x.strip()]


def _split_topics(pool: list[str], rng: random.Random, n_held: int) -> tuple[list[str], list[str]]:
    """Shuffle ``pool`` and return (train_topics, heldout_topics)."""
    pool = sorted(set(pool))
    rng.shuffle(pool)
    return pool[n_held:], pool[:n_held]


def _pydoc_passages() -> list[str]:
    """Short paragraphs from Python's pydoc topics (PSF licence), for summary prompts."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some minimal Pythons omit pydoc_data
        return []
    out = []
    for key in sorted(topics):
        for para in topics[key].split("\n\n"):
            para = " ".join(para.split())
            prose = para[:1].isupper() and not any(m in para for m in ("|", "+--", "::", ">>>"))
            if 250 <= len(para) <= 700 and prose:
                out.append(para)
    return out


def _arithmetic(rng: random.Random, names: list[str], items: list[str], n: int) -> list[str]:
    """Word problems with seeded numbers over the given names and items."""
    templates = [
        "{a} has {x} {i}. {b} gives {a} {y} more. How many {i} does {a} have now?",
        "{a} had {x} {i} and gave {y} to {b}. How many {i} does {a} have left?",
        "A box holds {y} {i}. How many {i} are in {x} boxes?",
        "{a} wants to share {p} {i} equally among {d} friends. How many {i} does each friend get?",
        "{a} buys {x} {i} at {d} dollars each. How much does {a} spend in total?",
        "{a} reads {y} pages a day. How many pages does {a} read in {d} days?",
        "A train travels at {x} km per hour for {d} hours. How far does it go?",
        "{a} has {x} {i} and {b} has {y} {i}. How many do they have together, and who has more?",
        "What is {x} plus {y}, multiplied by {d}? Show your steps.",
        "{a} saves {d} dollars every week. How much will {a} have after {y} weeks?",
        "A shop sells {i} in packs of {d}. {a} needs {p} {i}. How many packs must {a} buy?",
        "{a} scored {x}, {y} and {z} points in three games. What is the average score?",
        "A rectangle is {x} cm long and {d} cm wide. What are its area and its perimeter?",
        "{a} is {d} years old. {b} is {y} years older. How old will {b} be in {z} years?",
        "If {d} workers build a wall in {y} days, how many days would {x} workers need, working at the same rate?",
        "A recipe needs {d} eggs for {y} people. How many eggs are needed for {x} people?",
        "A shirt costs {x} dollars and is on sale for {d}0% off. What is the sale price?",
        "What is {y} percent of {p}?",
    ]
    out = []
    for _ in range(n):
        d = rng.randint(2, 9)
        x, y, z = rng.randint(3, 60), rng.randint(2, 40), rng.randint(2, 30)
        a, b = rng.sample(names, 2)
        out.append(rng.choice(templates).format(
            a=a, b=b, i=rng.choice(items), x=x, y=y, z=z, d=d, p=d * rng.randint(2, 15)))
    return out


def build() -> tuple[list[dict], list[dict]]:
    """Return (train, heldout): lists of {"prompt", "kind"} dicts, deterministic."""
    rng = random.Random(SEED)
    h = HELDOUT_PER_KIND
    train: list[dict] = []
    held: list[dict] = []
    # chat: explanations, how-to, comparisons, summaries
    # Held-out: 8 subjects, 4 how-tos, 2 pairs, 2 passages, one template each.
    subj_tr, subj_ho = _split_topics(_pool(SUBJECTS), rng, 8)
    how_tr, how_ho = _split_topics(_pool(HOWTO), rng, 4)
    pair_tr, pair_ho = _split_topics(_pool(PAIRS), rng, 2)
    pas = _pydoc_passages()
    pas_tr, pas_ho = _split_topics(pas, rng, 2) if pas else ([], [])

    def chat(subjects, howtos, pairs, passages, pick):
        out = [t.format(t=s) for s in subjects for t in pick(T_EXPLAIN)]
        out += [t.format(t=s) for s in howtos for t in pick(T_HOWTO)]
        for p in pairs:
            a, b = p.split(" and ", 1)
            out += [t.format(t=p, a=a, b=b) for t in pick(T_COMPARE)]
        out += [rng.choice(T_SUMMARY).format(t=p) for p in passages]
        return out

    _add(train, "chat", chat(subj_tr, how_tr, pair_tr, pas_tr, lambda ts: ts))
    _add(held, "chat", chat(subj_ho, how_ho, pair_ho, pas_ho, lambda ts: [rng.choice(ts)]))

    # code: tasks and stdlib modules
    code_tr, code_ho = _split_topics(_pool(CODE_TASKS), rng, 12)
    mod_tr, mod_ho = _split_topics(_pool(MODULES), rng, 4)
    _add(train, "code", [t.format(t=c) for c in code_tr for t in T_CODE]
        + [t.format(t=m) for m in mod_tr for t in T_MODULE])
    ho_code = [rng.choice(T_CODE).format(t=c) for c in code_ho] + [rng.choice(T_MODULE).format(t=m) for m in mod_ho]
    _add(held, "code", ho_code[:h])

    # lists
    list_tr, list_ho = _split_topics(_pool(LIST_SUBJECTS), rng, h)
    _add(train, "lists", [t.format(t=s) for s in list_tr for t in T_LIST])
    _add(held, "lists", [rng.choice(T_LIST).format(t=s) for s in list_ho])

    # stories: held-out characters never appear in training stories
    char_tr, char_ho = _split_topics(_pool(CHARACTERS), rng, 8)
    settings, themes = _pool(SETTINGS), _pool(THEMES)

    def stories(chars, n):
        out = set()
        while len(out) < n:
            out.add(rng.choice(T_STORY).format(c=rng.choice(chars), s=rng.choice(settings), m=rng.choice(themes)))
        return sorted(out)

    _add(train, "stories", stories(char_tr, 1500))
    _add(held, "stories", stories(char_ho, h))

    # arithmetic: held-out names and items never appear in training problems
    name_tr, name_ho = _split_topics(_pool(NAMES), rng, 6)
    item_tr, item_ho = _split_topics(_pool(ITEMS), rng, 4)
    _add(train, "arithmetic", sorted(set(_arithmetic(rng, name_tr, item_tr, 1500))))
    _add(held, "arithmetic", sorted(set(_arithmetic(rng, name_ho, item_ho, h)))[:h])

    rng.shuffle(train)  # kinds interleaved, so any prefix of TRAIN is a balanced sample
    held_set = {d["prompt"] for d in held}
    assert len(held_set) == len(held), "duplicate held-out prompt"
    # Drop duplicate strings (keeping order) and the few arithmetic problems whose
    # template names no person or item and whose numbers happen to equal a held-out one.
    train = [d for d in {d["prompt"]: d for d in train}.values() if d["prompt"] not in held_set]
    topics = dict(subjects=subj_tr, howtos=how_tr, pairs=pair_tr, code=code_tr, modules=mod_tr, lists=list_tr,
                  chars=char_tr, settings=settings, themes=themes, names=name_tr, items=item_tr)
    seen = held_set | {d["prompt"] for d in train}
    return train + [d for d in _extra(topics) if d["prompt"] not in seen], held


def _extra(t: dict) -> list[dict]:
    """The second TRAIN batch (from index FIRST_EXTRA of the frozen list): the TRAIN topics
    only, under new templates (T_*2) and new seeded draws, from its own random stream
    (EXTRA_SEED), so the first batch and the held-out split stay what they were."""
    rng = random.Random(EXTRA_SEED)
    out: list[dict] = []
    _add(out, "chat", [x.format(t=s) for s in t["subjects"] for x in rng.sample(T_EXPLAIN2, 3)]
        + [x.format(t=s) for s in t["howtos"] for x in rng.sample(T_HOWTO2, 2)]
        + [x.format(t=p) for p in t["pairs"] for x in rng.sample(T_COMPARE2, 2)])
    _add(out, "code", [x.format(t=c) for c in t["code"] for x in T_CODE2]
         + [x.format(t=m) for m in t["modules"] for x in T_MODULE2])
    _add(out, "lists", [x.format(t=s) for s in t["lists"] for x in T_LIST2])
    stories: set[str] = set()
    while len(stories) < 1200:
        stories.add(rng.choice(T_STORY2).format(c=rng.choice(t["chars"]), s=rng.choice(t["settings"]),
                                                m=rng.choice(t["themes"])))
    _add(out, "stories", sorted(stories))
    _add(out, "arithmetic", sorted(set(_arithmetic(rng, t["names"], t["items"], 1200))))
    out = list({d["prompt"]: d for d in out}.values())
    rng.shuffle(out)  # kinds interleaved, so any prefix of the batch is a balanced sample
    return out


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def train_prompts() -> list[dict]:
    """The frozen TRAIN list (TRAIN_PATH), the same on every Python."""
    return _read_jsonl(TRAIN_PATH)


def heldout_prompts() -> list[dict]:
    """The frozen HELD-OUT list (HELDOUT_PATH), the same on every Python."""
    return _read_jsonl(HELDOUT_PATH)


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    text = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in rows)
    if path.suffix == ".gz":
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:  # byte-stable
            f.write(text.encode("utf-8"))
    else:
        tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


CALIBRATION_PATH = Path(__file__).resolve().parent / "data" / "calibration_prompts.jsonl"
FIRST_EXTRA = 8479  # the second TRAIN batch (_extra, appended 2026-11-30) starts here
FIRST_UNTRAINED = 2560  # no TRAIN prompt from here on had been answered for draft training when the
# calibration prompts were drawn; answerable_train_prompts keeps those out of training since


def write_calibration(path: Path = CALIBRATION_PATH, per_kind: int = 12, seed: int = 0) -> Path:
    """DSpark calibration prompts: ``per_kind`` of each kind, drawn (fixed seed) from TRAIN
    prompts the draft never saw (index >= FIRST_UNTRAINED), so calibration measures the
    draft as it behaves on new text; topics stay disjoint from the held-out prompts."""
    rng = random.Random(seed)
    pool = train_prompts()[FIRST_UNTRAINED:FIRST_EXTRA]
    out = []
    for kind in KINDS:
        out += rng.sample([d for d in pool if d["kind"] == kind], per_kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for d in out:
            f.write(json.dumps({"prompt": d["prompt"], "kind": d["kind"]}, ensure_ascii=False) + "\n")
    return path


def calibration_prompt_texts() -> set[str]:
    """The DSpark calibration prompts' texts (CALIBRATION_PATH; empty if not written)."""
    if not CALIBRATION_PATH.is_file():
        return set()
    return {json.loads(line)["prompt"] for line in CALIBRATION_PATH.read_text().splitlines() if line.strip()}


def answerable_train_prompts(limit: int | None = None) -> list[tuple[int, dict]]:
    """(index, prompt) of the first ``limit`` TRAIN prompts that draft training may answer:
    every one except the DSpark calibration prompts (CALIBRATION_PATH, drawn from index
    FIRST_UNTRAINED on), so that data generated past the committed draft's 2560 prompts
    never puts a calibration prompt into training and calibration keeps measuring the
    draft on text it never saw."""
    reserved = calibration_prompt_texts()
    return [(i, d) for i, d in enumerate(train_prompts()[:limit]) if d["prompt"] not in reserved]


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the frozen lists from build() on this Python")
    ap.add_argument("--check", action="store_true", help="exit 1 unless build() here equals the frozen lists")
    args = ap.parse_args(argv)
    train, held = build()
    counts = {k: (sum(d["kind"] == k for d in train), sum(d["kind"] == k for d in held)) for k in KINDS}
    print(f"train {len(train)}  heldout {len(held)}  (train, heldout) by kind: {counts}", file=sys.stderr)
    if args.write:
        if sys.version_info[:2] != BUILT_ON:
            print(f"warning: Python {sys.version_info[0]}.{sys.version_info[1]}, not {BUILT_ON[0]}.{BUILT_ON[1]}: "
                  "these lists differ from those the committed draft and its data used", file=sys.stderr)
        print(_write_jsonl(TRAIN_PATH, train))
        print(_write_jsonl(HELDOUT_PATH, held))
        print(write_calibration())
        return 0
    same = train == train_prompts() and held == heldout_prompts()
    print(f"build() on Python {sys.version_info[0]}.{sys.version_info[1]} "
          + ("equals the frozen lists" if same else "DIFFERS from the frozen lists (they stay what every tool reads)"))
    return 0 if same or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())

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

The TRAIN list has four batches. The first (indices 0..FIRST_EXTRA-1, 8479 prompts) is
what build() made until 2026-11-30. The second (``_extra``, indices FIRST_EXTRA..FIRST_THIRD-1,
4135 prompts, appended on 2026-11-30 when the first had run out) reuses the first batch's
TRAIN topics under new templates and new seeded draws, from its own random stream
(EXTRA_SEED). The third (``_third``, indices FIRST_THIRD = 12614..FIRST_FOURTH-1, 10,129
prompts, appended on 2026-12-04 for more diverse data) has new topic pools (SUBJECTS3 ...
ITEMS3, editing requests, short notes, pros and cons) under new templates (T_*3), from its
own random stream (THIRD_SEED). Every answerable prompt of these three has its answer in
fixtures/peagle-data (22,683; the third's in chat-third.jsonl.gz and chat-third-rest.jsonl.gz).
The fourth (``_fourth``, from index FIRST_FOURTH = 22743, 10,282 prompts, appended on
2026-12-04 when the draft had trained on every answer of the first three) has new topic pools
again (SUBJECTS4 ... ITEMS4), new chat forms (short definitions, proverbs, examples of a
concept, yes/no questions with a reason, short passages to summarise or retell) and new
word-problem shapes (percentages, speed and distance, clock times, unit conversions, ratios,
sequences) under new templates (T_*4), from its own random stream (FOURTH_SEED); its answers
are fixtures/peagle-data/chat-fourth.jsonl.gz (every one, made on a lent H200). No prompt of the third or fourth batch mentions a held-out topic or a
word close to one (NEAR_HELDOUT; build() asserts it). Each batch is appended, so the earlier
batches, the held-out split and the calibration prompts (drawn from the first batch only)
are unchanged.

    python tools/prompts.py --check    # build() here equals the frozen files? (exit 1 if not)
    python tools/prompts.py --write    # (re)write the frozen files from build() on this Python
"""

from __future__ import annotations

import gzip
import json
import random
import re
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

# --- the third TRAIN batch (``_third``): new topic pools and new templates ------------
# Written 2026-12-04 for more diverse draft data. No pool below shares a topic with a
# held-out one: every prompt of the batch is checked against the held-out topics build()
# reserves and against NEAR_HELDOUT (build() asserts it). Topics dropped while writing the
# pools because they named or came close to a held-out topic (in brackets):
#   subjects: fungi (mushrooms), fjords (glaciers), the Berlin Wall and ancient China
#     (the Great Wall of China), file compression (zlib), the binary number system (binary
#     search, decimal to binary), watercolor painting (water), queueing (queue), the
#     invention of the wheel (a young inventor);
#   how-tos: memorize a speech (public speaking, give a presentation), make a bird feeder
#     (bird watching);
#   code tasks: converts a sentence to title case (capitalizes every word), finds all email
#     addresses in a text (email and letters), converts a number to base 2..16 (decimal to
#     binary), returns the number of days between two dates and computes an age from a birth
#     date (day of the week for a date), replaces a word in every line of a file (counts the
#     words in a file), counts the sentences in a text (counts the words / characters);
#     modules bz2 and lzma (zlib);
#   list subjects: parts of speech (public speaking), inventions that changed daily life (a
#     young inventor);
#   characters: a bus driver (a taxi driver), a kind witch (a clumsy wizard), a toy soldier
#     (toy cars), a young astronomer (a star that fell from the sky);
#   items: lemons (make lemonade), paintbrushes (a painter who lost her colors);
#   decisions (pros and cons): smart speakers (public speaking); "buying a house with friends"
#     became "... with a sibling" (qualities of a good friend).
# Then, from a check of shared lower-case content words between each new topic and each
# held-out one, also dropped: animal migration (animals that hibernate), functions and
# methods in Python (Python built-in functions), implements selection sort / merge sort /
# quicksort (implements insertion sort), finds the k-th smallest number in a list (returns
# the median of a list), checks whether a string is a valid hexadecimal color code and
# whether a time string such as 14:30 is valid (checks whether a string contains only
# digits), ways to save electricity (ways to save water at home), questions to ask a doctor
# (questions to ask in a job interview); "the history of writing" became "the history of
# the alphabet" (tips for writing clearly). Kept, as sharing only a word used in another
# sense: sorts a list of ... by ... (sorted(), not a sort algorithm), breadth-first and
# depth-first search on a graph (binary search), file tasks other than counting words,
# self-driving cars (toy cars), a young chef (a young inventor), jobs that did not exist
# thirty years ago (job interview).
THIRD_SEED = SEED + 2

SUBJECTS3 = """the Doppler effect; friction; buoyancy; surface tension; density; air pressure; inertia; momentum;
centripetal force; air resistance; pendulums; levers; pulleys; simple machines; Newton's laws of motion;
kinetic energy; potential energy; heat conduction; thermal insulation; convection; ultraviolet light;
infrared light; X-rays; radioactivity; half-life; isotopes; electrons; semiconductors; transistors;
electric circuits; resistors; electric motors; generators; the power grid; fuses and circuit breakers;
quantum computers; cells; mitochondria; proteins; enzymes; hormones; the digestive system; the lungs;
the kidneys; the liver; the skeleton; blood types; red blood cells; white blood cells; the skin; the eye;
hearing; taste buds; the sense of smell; reflexes; genes; chromosomes; gut bacteria; lichens; mosses; ferns;
cacti; pollination; food chains; ecosystems; biodiversity; endangered species; invasive species;
symbiosis; parasites; plankton; giraffes; kangaroos; koalas; pandas; cheetahs; horses;
the Nile; the Alps; the Andes; the Rocky Mountains; the Mediterranean Sea; the Dead Sea;
the Great Barrier Reef; Iceland; the Australian outback; the Grand Canyon; river deltas; peninsulas;
continents; latitude and longitude; the equator; monsoons; the jet stream; fog; hail; wildfires;
avalanches; sand dunes; the Ring of Fire; tsunamis; geysers; the Aztecs; the Incas; the Maya;
ancient Greece; the Ottoman Empire; the Mongol Empire; the Byzantine Empire; medieval castles;
the Black Death; the Magna Carta; the age of exploration; the history of the alphabet; the Bronze Age;
the Stone Age; the Cold War; the space race; the abolition of slavery; the women's suffrage movement;
the telegraph; the telephone; the Titanic; the Wright brothers; commuting; grocery shopping; laundry;
meal planning; moving house; household chores; minimalism; second-hand shopping; daylight saving time;
tipping in restaurants; table manners; small talk; QR codes; barcodes; USB drives; Bluetooth;
touchscreens; pixels; computer viruses; spam filters; web browsers; domain names; IP addresses;
routers; fiber optic cables; data centers; artificial intelligence; chatbots; voice assistants;
self-driving cars; smartwatches; e-readers; video calls; spreadsheets; word processors; keyboards;
computer memory; processors; graphics cards; balanced diets; dietary fiber; caffeine; posture; eye strain;
yoga; dental care; blood pressure; cholesterol; headaches; fever; sunburn; mental health; loneliness;
breathing exercises; warming up before sport; sports injuries; opportunity cost; scarcity; pensions;
mortgages; loans; compound interest; currency exchange; cryptocurrencies; small businesses;
entrepreneurship; advertising; brands; monopolies; wages; the minimum wage; the gig economy; tourism;
fair trade; recessions; gross domestic product; sculpture; pottery; calligraphy; architecture;
Gothic cathedrals; impressionism; opera; ballet; hip hop; folk music; drums; the violin; orchestras;
choirs; musicals; comic books; fairy tales; Greek mythology; street art; film soundtracks;
stand-up comedy"""

HOWTO3 = """make a smoothie; cook an omelette; roast vegetables; make soup from leftovers; plan a weekly menu;
sharpen a kitchen knife; store fresh herbs; freeze leftovers safely; clean an oven; descale a kettle;
fold a fitted sheet; plan a road trip; learn to swim; fix a leaky faucet; replace a light bulb;
assemble flat-pack furniture; set up a home printer; speed up a slow computer; free up storage on a phone;
set up two-factor authentication; spot a phishing message; write a good commit message;
learn keyboard shortcuts; organize digital photos; write down a family recipe; remember people's names;
apologize sincerely; say no politely; ask for a raise; run a short meeting; take notes in a meeting;
grow tomatoes; grow herbs indoors; care for a succulent; build a simple bookshelf; knit a scarf;
learn to draw faces; practice calligraphy; learn to whistle; learn to skateboard; jump rope;
do a push-up correctly; warm up before running; plan a family game night;
teach a child to tie shoelaces; make a paper boat; prepare for a driving test; check tire pressure;
jump-start a car; clean a bike chain; read a nutrition label; choose a ripe avocado; make guacamole;
make hummus; brew iced tea; make hot chocolate; pickle vegetables; make yogurt at home; start a book club;
donate old clothes; declutter a kitchen; make a to-do list; prioritize tasks; take a power nap;
wake up earlier; stop biting nails; calm down before an exam"""

PAIRS3 = """lions and tigers; rabbits and hares; horses and donkeys; turtles and tortoises; octopuses and squids;
seals and sea lions; bread and rice; butter and margarine; baking soda and baking powder;
Windows and Linux; SQL and NoSQL databases; a for loop and a while loop; hurricanes and typhoons;
sets and lists in Python; git merge and git rebase; unit tests and integration tests; a CPU and a GPU;
SSDs and hard drives; Wi-Fi and Bluetooth; LED bulbs and incandescent bulbs; AC and DC current;
hotels and hostels; cooking and baking; jogging and sprinting; yoga and pilates; guitars and ukuleles;
poetry and prose; comedy and tragedy; myths and legends; introverts and extroverts;
optimism and pessimism; needs and wants; goods and services; debit cards and credit cards;
stocks and bonds; inflation and deflation; imports and exports; the Arctic and the Antarctic;
islands and peninsulas; frost and dew; fog and mist; hail and sleet; asteroids and meteoroids;
DNA and RNA; genes and chromosomes; canoes and kayaks"""

CODE_TASKS3 = """replaces every vowel in a string with an asterisk; checks whether a sentence is a pangram;
returns the longest common prefix of a list of strings; run-length encodes a string such as 'aaabcc';
decodes a run-length encoded string; checks whether one string is a rotation of another;
removes consecutive repeated symbols from a string; returns the initials of a full name;
masks a credit card number except its last four symbols; centers a text inside a box of asterisks;
wraps a long text at a given width; converts a string to alternating upper and lower case;
extracts all hashtags from a post;
formats a ten-symbol phone number as (123) 456-7890; encrypts a text with a Caesar cipher;
decrypts a text encrypted with a Caesar cipher; converts text to Morse code; checks whether a word is an isogram;
returns the most frequent vowel in a text; generates all permutations of a short string;
splits a list into two halves; returns every second element of a list; moves all zeros in a list to the end;
finds two numbers in a list that add up to a target; returns the cumulative product of a list;
removes all None values from a list; returns the smallest and the largest value of a list together;
returns the differences between consecutive numbers in a list; checks whether all elements of a list are equal;
returns how many numbers in a list are negative; zips three lists into a list of tuples;
returns the index of every occurrence of a value in a list;
splits a list into the items that pass a test and the items that do not;
finds the longest run of increasing numbers in a list; returns a sliding window of size k over a list;
sorts a list of strings by their length; sorts a list of tuples by their second item;
deduplicates a list of dictionaries by one key; inverts a dictionary whose values are lists;
builds a dictionary from a list of keys and a list of values; returns the key with the highest value in a dictionary;
keeps only the dictionary entries whose keys are in a given set;
adds up the values of equal keys across a list of dictionaries; flattens a nested dictionary into dotted keys;
looks up a nested key in a dictionary without raising an error; groups a list of people into a dictionary by age;
sorts a dictionary by its values; computes the total price of a shopping cart stored as a dictionary;
appends a line with the current time to a log file; copies a text file line by line;
finds the longest line in a text file; removes blank lines from a text file;
reads a file of numbers, one per line, and returns their sum;
reads a configuration file of key=value lines into a dictionary; returns the size of a file in kilobytes;
lists the five largest files in a folder; checks whether a file exists before reading it;
merges two CSV files that have the same columns; renames all .txt files in a folder to .md;
defines a BankAccount class with deposit and withdraw methods;
defines a Rectangle class with area and perimeter methods;
defines a Temperature class that converts between Celsius and Kelvin;
defines a Point class with a method for the distance to another point;
defines an Inventory class for a small shop; defines a Student class that keeps grades and their average;
defines a Timer class that can be used in a with statement;
defines a Book class and a Library class that lends books;
defines a Vector class with addition and multiplication by a number;
defines a dataclass for a contact in an address book; defines a TrafficLight class that cycles through its colors;
implements the sieve of Eratosthenes; returns the n-th triangular number;
computes the least common multiple of two numbers; checks whether a number is an Armstrong number;
finds all divisors of a number; checks whether a number is a perfect number;
computes the binomial coefficient n choose k; generates the first n rows of Pascal's triangle;
solves the Tower of Hanoi for n disks; does a breadth-first search on a graph stored as a dictionary;
does a depth-first search on a graph stored as a dictionary; finds the shortest path through a grid maze;
computes the edit distance between two strings; finds the longest common subsequence of two strings;
evaluates an arithmetic expression written in reverse Polish notation;
computes a square root with Newton's method; finds the largest sum of a contiguous part of a list;
implements Dijkstra's shortest path algorithm on a small graph; checks whether two rectangles overlap;
plays rock, paper, scissors against the computer; implements a number guessing game;
calculates a person's body mass index; computes the monthly payment of a loan; converts kilometers to miles;
simulates a thousand coin tosses and reports the share of heads;
implements a small least-recently-used cache with a dictionary; converts a 24-hour time to a 12-hour time with am or pm"""

MODULES3 = """mimetypes; getpass; platform; locale; colorsys; graphlib; ipaddress; keyword; reprlib; sched; socket;
tomllib; types; warnings; webbrowser; zoneinfo; inspect; traceback; configparser; codecs; unicodedata;
cmath; filecmp; linecache; http.server; urllib.request; xml.etree.ElementTree; turtle; signal"""

LIST_SUBJECTS3 = """ways to keep a home cool without air conditioning; foods that are rich in protein;
countries in South America; capital cities of Europe; rivers in Africa; deserts of the world; famous bridges;
ancient wonders of the world; Greek gods and goddesses; constellations visible in winter; well-known dinosaurs;
animals that live in the desert; animals native to Australia; insects that help gardeners;
trees that change color in autumn; flowers that bloom in spring; vegetables that grow well in pots;
ways to use leftover bread; dishes to bring to a potluck dinner; breakfast foods from around the world;
desserts that need no baking; ways to make a commute more pleasant; habits of organized people;
signs that you need a break from work; skills every adult should have; ways to be a better listener;
conversation starters for meeting new people; polite phrases in English; common English idioms and their meanings;
words that are often misspelled; punctuation marks and their uses; literary devices; famous novels for teenagers;
genres of music; instruments in an orchestra; famous composers; sports played with a ball; Olympic sports;
exercises for a strong back; stretches for people who sit all day; healthy snacks for children;
symptoms of the flu; ways to avoid catching a cold; things to do when you cannot sleep; uses for old newspapers;
things you can recycle; programming languages and what they are used for;
git commands every beginner should know; keyboard shortcuts that save time; common HTTP status codes;
Linux commands for beginners; ways to keep a computer secure; signs of a phishing message;
units of measurement in the metric system; famous mathematicians; shapes with four sides; prime numbers below 50;
chemical elements that are metals; layers of the atmosphere; types of rocks; dwarf planets;
jobs that did not exist thirty years ago; foods that keep well in a cupboard; ways to thank a teacher;
things to do before moving house; tips for a long flight; things to see in Paris; board games for two players;
card games for beginners; outdoor games for children; classic fairy tales; New Year traditions around the world;
ways to stay safe in hot weather; items for an emergency kit at home; hobbies that cost little money;
fun ways to learn history"""

CHARACTERS3 = """a shy giraffe; a grumpy tortoise; a nervous goalkeeper; a train conductor; a sleepy bear;
a baby elephant; a curious octopus; a hedgehog who wants a hug; a retired sea captain; a young chef;
a clockmaker; a beekeeper; a carpenter; a shepherd; a tailor; a nurse on a night shift; a zookeeper;
a ballet dancer; a chess champion; a twelve-year-old reporter; a grandfather who tells jokes; a pair of twins;
a new student; a stray kitten; a little tugboat; a paper boat; a cloud who wants to rain; a tiny seed;
an old oak tree; a rabbit who is always late; a lazy lion; a mountain goat; a camel crossing the desert;
a firefly; a caterpillar; a polar bear cub; a fisherman; a museum guard; a violinist; a circus acrobat;
a forgetful king; a princess who builds bridges; a lonely alien; a time traveler; a girl detective;
an old sailor; a young archaeologist; a goat who eats everything; a frog who wants to sing; a sloth in a hurry"""

SETTINGS3 = """in a hot-air balloon; in a busy hospital; at a football stadium; in an old museum; on a farm;
in a jungle; on a pirate ship; in a tiny apartment; in a secret garden; on the first day of spring;
during a power cut; at a music festival; in an underground city; on a frozen lake; on a windy hill;
in a clock tower; at a railway station; in a cave full of crystals; at a summer camp; in a kingdom of clouds;
on the night of a big storm; at a village fair; in a bookshop; in a school garden; on a distant planet"""

THEMES3 = """forgiveness; being yourself; accepting change; responsibility; generosity; listening to others;
hard work; trust; keeping promises; humility; respect for nature; overcoming fear; asking for help;
saying sorry; staying calm"""

NAMES3 = """Amir; Bianca; Chen; Diego; Elif; Felix; Greta; Hana; Ivan; Jamal; Keiko; Lucas; Nadia; Oscar; Paula;
Ravi; Sofia; Tomas; Ursula; Victor; Wanda; Yusuf; Zara; Aisha; Bruno; Clara; Dmitri; Eva; Fatima; Gabriel;
Hiro; Ines; Jack; Kofi; Lucia; Mateo; Nina; Olga; Pedro; Rahul; Selma; Theo; Uma; Wei"""

ITEMS3 = """pears; bananas; peaches; plums; muffins; bagels; crayons; erasers; rulers; paper clips; postcards;
puzzles; kites; socks; buttons; ribbons; candles; packets of seeds; tomatoes; potatoes; carrots; pebbles;
bricks; tickets; badges; comic books; jars of jam; tennis balls; sandwiches; pies; magnets"""

# sentences to rewrite (wordy or formal) and to correct (with mistakes), for editing requests
WORDY3 = """At this point in time we are not in a position to make a decision regarding the matter.;
Due to the fact that it was raining, the outdoor event was postponed until a later date.;
It is of the utmost importance that all staff members arrive in a timely manner.;
The meeting has been rescheduled to a time that will be communicated in due course.;
In the event that you require further assistance, do not hesitate to contact our office.;
The purchase of a ticket is a prerequisite for entry into the exhibition.;
We would like to express our sincere gratitude for your continued patronage.;
It has come to our attention that the library books were returned in a damaged condition.;
Customers are kindly requested to refrain from leaving bags unattended.;
The vast majority of participants expressed a preference for the morning session.;
Please be advised that the office will be closed for the duration of the holiday period.;
The new policy will be implemented with effect from the first day of next month.;
Owing to unforeseen circumstances, the train service has been temporarily suspended.;
It is recommended that passengers retain their tickets until the end of the journey.;
The committee reached the conclusion that further investigation was necessary.;
In spite of the fact that he was tired, he continued working on the report.;
The children exhibited a high level of enthusiasm with regard to the museum visit.;
Kindly ensure that all windows are securely fastened prior to your departure.;
The residents are of the opinion that the park should be made larger.;
We regret to inform you that your application was not successful on this occasion.;
The utilization of mobile phones is prohibited during the examination.;
It would be appreciated if you could provide your feedback at your earliest convenience.;
A large number of people were in attendance at the concert last night.;
The vehicle came to a complete stop in close proximity to the station.;
The price of the product has been subject to an increase of ten percent.;
The project was completed in a satisfactory manner within the allocated time frame.;
Prior to commencing the exercise, participants should consult a doctor.;
The restaurant is in possession of a license to serve food outdoors.;
Our team is currently engaged in the process of reviewing all applications.;
There is a possibility that the flight may be subject to a delay."""

MISTAKES3 = """Me and him goes to the market every saturday.; She don't like coffe in the morning.;
Their going to the park after school tommorow.; I has three brother and one sister.;
The childs was playing outside when it start to rain.; He runned very fast but he loose the race.;
We was very exited about the trip to the mountains.; Its a beautifull day, lets go outside.;
The book who I readed yesterday was very intresting.; Can you borrow me your pen for a minute?;
There is many reasons to learn a second language.; She have been living here since five years.;
I didn't saw nobody at the station.; The informations in this report is not correct.;
He is more taller than his brother.; We discussed about the problem for a hour.;
If I would have known, I would of come earlier.; The team are playing good this season.;
Everyone have finished there homework.; I am agree with your idea about the trip.;
She said me that she is busy tomorow.; The weather are very cold in january.;
They was late because the bus brake down.; Who's book is laying on the table?;
Less people came to the meeting then we expected."""

RECIPIENTS3 = """a neighbour; a teacher; a colleague; your landlord; your manager; a classmate; your grandmother;
the school principal; a new coworker; the building manager; a hotel receptionist; a local librarian;
your sports coach; a shop's customer service team; your cousin; a client"""

PURPOSES3 = """to thank them for their help; to apologize for being late; to ask for a day off;
to say you will miss a meeting; to ask about a missing parcel; to invite them to a small dinner;
to complain politely about noise; to ask for more time to finish a task; to welcome them to the neighbourhood;
to ask them to return a borrowed book; to confirm a meeting time; to congratulate them on a new job;
to ask for a recommendation; to cancel an appointment; to report a broken heater; to share good news;
to ask for directions to an event; to say goodbye before moving away"""

DECISIONS3 = """living in a big city; working night shifts; buying a used car; learning to code as an adult;
online shopping; electric scooters; public transport; a four-day work week; school uniforms; social media;
buying food in bulk; renting furniture; shared offices; paper maps; spending a year abroad;
self-checkout machines; tiny houses; moving to the countryside; taking a gap year; wearing a smartwatch;
paying only by card; remote meetings; fast food; electric bikes; keeping chickens at home;
video games for children; getting up very early; living alone; online courses; paper notebooks;
standing desks; car sharing; homework for young children; open-plan offices; wearing a school blazer;
learning two languages at once; e-books for children; solar panels on every roof; banning cars from city centres;
reading the news every day; working while at university; buying a house with a sibling; adopting a cat;
cooking every meal at home; taking photos of everything; a long summer holiday for schools"""

T_EXPLAIN3 = ["Write a haiku about {t}.", "Explain {t} in one paragraph for a high school student.",
              "What is a common myth about {t}, and what is the truth?",
              "Give a simple example that explains {t}.",
              "Write three questions a student might ask about {t}, and answer them.",
              "Explain {t} in five bullet points.", "How would a teacher introduce {t} in a first lesson?",
              "What is one surprising fact about {t}? Explain it briefly.",
              "Describe {t} to someone who has never heard of it.",
              "Write a short encyclopedia-style entry about {t}.", "Why do people find {t} interesting?",
              "Explain the key terms someone needs to understand {t}.", "Write a two-sentence summary of {t}.",
              "How has our understanding of {t} changed over time?",
              "What would a simple diagram of {t} show? Describe it in words.",
              "Write a short paragraph about {t} that a child could read.",
              "Explain {t} using an everyday example.", "Write a short poem about {t}."]
T_HOWTO3 = ["What do I need to {t}?", "Explain to a beginner how to {t}, in numbered steps.",
            "What is the quickest way to {t}?", "I have never tried to {t}. Can you guide me through it?",
            "Write short instructions to {t} for a child.",
            "What are common problems when people {t}, and how can they be fixed?",
            "How can I {t} on a small budget?", "Describe how to {t} in five steps.",
            "What should I prepare before I {t}?"]
T_COMPARE3 = ["How are {t} alike, and how are they different?", "Explain the difference between {a} and {b} to a child.",
              "When would you choose {a} over {b}?", "Write a short paragraph comparing {t}.",
              "List the key differences between {t}.", "What are the pros and cons of {a} compared with {b}?"]
T_WORDY3 = ["Rewrite this sentence in plain English: {t}", "Make this sentence shorter without changing its meaning: {t}",
            "Rewrite this sentence so that it sounds warmer and less formal: {t}",
            "Rewrite this sentence for a young reader: {t}", "Say this more simply: {t}"]
T_MISTAKES3 = ["Correct the mistakes in this sentence: {t}", "Fix the grammar and spelling in this sentence: {t}",
               "What is wrong with this sentence? Give the corrected version: {t}"]
T_NOTE3 = ["Write a short note to {r} {p}.", "Write a short, polite message to {r} {p}.",
           "Draft a text message to {r} {p}."]
T_DECIDE3 = ["What are the pros and cons of {t}?", "Give me two arguments for and two against {t}.",
             "Is {t} a good idea? Give a balanced answer.", "Write a short balanced paragraph about {t}."]
T_LIST3 = ["List eight {t}.", "Give me a short list of {t}, with one sentence about each.", "Name four {t}.",
           "What are a few {t}? Keep it short.", "Write a bullet list of {t} for a school poster.",
           "List six {t} and say why each one matters.", "Suggest five {t}.",
           "Give me a numbered list of {t}, starting with the best known.", "Tell me about three {t}."]
T_CODE3 = ["Write a Python function that {t}, and show how to call it.",
           "Write a simple Python function for beginners that {t}.",
           "Write a Python function that {t}. Keep it under fifteen lines.",
           "Write a Python function that {t}, and explain its time complexity.",
           "Write a Python function that {t}, and handle invalid input.",
           "Give two different ways to write Python code that {t}.",
           "Write Python code that {t}, with a comment on each step.",
           "Write a Python script that {t}, and print the result for a sample input.",
           "Write Python code that {t}, and explain it line by line."]
T_MODULE3 = ["Show a practical example of Python's `{t}` module.",
             "When would I use Python's `{t}` module? Give an example.",
             "Explain the most useful functions in Python's `{t}` module."]
T_STORY3 = ["Write a haiku about {c} {s}.", "Write a short story about {c} {s} that ends with a surprise.",
            "Write a five-sentence story about {c} {s}.", "Write a limerick about {c}.",
            "Write a short story about {c} {s}, told in the first person.",
            "Write the opening paragraph of a story about {c} {s}.",
            "Write a short scene where {c} faces a problem {s}.",
            "Write a rhyming poem for children about {c} and {m}.",
            "Write a short story with a happy ending about {c} {s}.",
            "Write a story about {c} {s} that shows the value of {m}.",
            "Write a short fairy tale about {c} and {m}."]

# Key words of the held-out topics (and words close to them), lower case, as regular
# expressions: no third-batch prompt may match one (build() asserts it, and so do the tests).
NEAR_HELDOUT = (r"water", r"glacier", r"\bwall\b", r"\bchin(a|ese)\b", r"teamwork", r"speak", r"speech",
                r"microwave", r"mushroom", r"fung(i|us)", r"\bbirds?\b", r"watching", r"pupp(y|ies)", r"\bdogs?\b",
                r"picnic", r"presentation", r"lemon", r"javascript", r"e-?mail", r"\bletters?\b", r"median",
                r"intersection", r"insertion", r"capitali[sz]", r"\bdigits?\b", r"binary", r"transpos",
                r"matri(x|ces)", r"\bstacks?\b", r"day of the week", r"weekday", r"zlib", r"compress",
                r"itertools", r"queue", r"\barrays?\b", r"built-in", r"interview", r"\bwalk", r"etiquette",
                r"science fair", r"birthday", r"friend", r"spice", r"indian", r"hibernat", r"\bmoon", r"\bstud(y|ies|ying)\b",
                r"vitamin", r"taxi", r"\bsnow", r"wizard", r"\bmouse\b", r"\bmice\b", r"painter", r"paintbrush",
                r"robot", r"\binventors?\b", r"\bstars?\b", r"\b(tara|rosa|ben|sam|yara|leo)\b", r"shell", r"\btoys?\b",
                r"marble", r"apple", r"\bcounts? the (words|characters)\b")

# --- the fourth TRAIN batch (``_fourth``): new topic pools, new chat forms, new templates ----
# Written 2026-12-04 (second session): the draft scores tau 2.39 on its training prompts against
# 2.12 on held-out ones, so more diverse prompts are the next data. Same rules as the third
# batch: no entry of a pool below equals one of an earlier pool, and no prompt of the batch
# mentions a held-out topic or a NEAR_HELDOUT word (build() asserts it, and so do the tests).
# New chat forms: short definitions of a word, proverbs to explain, examples of a concept,
# yes/no questions answered with a reason, short passages to summarise or retell; new
# word-problem shapes (percentages, speed and distance, clock times and durations, unit
# conversions, ratios, sequences, fractions of an amount, order of operations). Left out while
# writing the pools, as naming or coming close to a held-out topic or a NEAR_HELDOUT word:
# anything with water (waterfalls, watermelons, hydroponics, aqueducts), snow sports
# (skiing), stars and the moon (supernovae, light from stars), birds (hummingbirds, building a
# birdhouse), dogs, toys, friends ("beginner-friendly" in a template), letters (a grade letter,
# Greek letters, a cover letter), speaking, walking ("walk me through" in a template), studying,
# shells ("in a nutshell"), apples (pineapples), spices and curry, magicians (a clumsy wizard),
# painters and cartoonists (a painter who lost her colors), inventions (a young inventor),
# teamwork proverbs ("two heads are better than one", "many hands make light work"), and code
# tasks that count words or characters, sort by insertion or any other sort algorithm, use
# digits, binary, stacks, queues, arrays, matrices, medians or weekdays (the held-out code
# tasks). build()'s assertion then caught "weekdays" in a passage (now "from Monday to Friday").
# From the same check of shared lower-case content words as the third batch's, also dropped:
# fruits and vegetables, and foods that are high in iron (fruits that are high in vitamin C),
# wild animals of North America (animals that hibernate), the human voice (public speaking),
# copying a file to a backup with today's date in its name (the day of the week for a date), a
# histogram of the word lengths in a sentence (counts the words in a file); and a night guard at
# a museum, too close to the third batch's "a museum guard". Kept, as sharing only a word used
# in another sense: a radio host (host a picnic), rounding to two decimal places (a decimal
# number to binary), reading a train timetable (train a puppy), caring for a cast-iron pan
# (taking care of a dog), early cars (toy cars).
FOURTH_SEED = SEED + 3

SUBJECTS4 = """echoes; shadows; the reflection of light; refraction; lenses; prisms; optical illusions; color vision;
the colors of the sky at sunset; the Northern Lights; temperature scales; absolute zero; states of matter;
melting and freezing; evaporation; condensation; boiling points; solutions and mixtures; crystals; the pH scale;
catalysts; combustion; polymers; rubber; ceramics; aluminium; silver; alloys; electromagnets; elasticity; springs;
acoustics; ultrasound; sonar; radar; the solar wind; space suits; Venus; Mercury; Neptune; Pluto; the Kuiper belt;
cosmic rays; gravitational waves; light-years; galaxies; dark matter; space debris; Mars rovers;
the Hubble Space Telescope; sinkholes; erosion; fossils; dinosaurs; amber; minerals; quartz; hot springs;
landslides; permafrost; wetlands; mangroves; savannas; prairies; kelp forests; the deep sea; hydrothermal vents;
estuaries; the Congo River; the Danube; the Mississippi River; Lake Baikal; the Caspian Sea; Madagascar;
Greenland; New Zealand; Patagonia; the Galapagos Islands; Mount Everest; the Atlantic Ocean; Siberia;
the Scottish Highlands; the Earth's core; cell division; blood circulation; the brain; left-handedness;
fingerprints; teeth; hair growth; yawning; hiccups; sneezing; goosebumps; the appendix; the inner ear and balance;
color blindness; identical twins; metabolism; calories; carbohydrates; asthma; diabetes; germs; CPR;
blood donation; organ transplants; how broken bones heal; the sense of touch; muscle cramps; the circadian rhythm;
jet lag; snakes; lizards; chameleons; seahorses; jellyfish; whales; orcas; sea otters; beavers; hedgehogs;
earthworms; spiders; snails; ladybugs; mosquitoes; termites; gorillas; chimpanzees; rhinos; hippos; zebras;
reindeer; bison; llamas; axolotls; platypuses; tardigrades; salmon; nocturnal animals; animal senses; sunflowers;
bamboo; seaweed; orchids; plant roots; pine trees; carnivorous plants; Venus flytraps; tree rings;
the history of computers; punch cards; the abacus; pocket calculators; microchips; RFID tags;
contactless payments; online banking; video streaming; file formats; PDF files; fonts; emoji; browser cookies;
ad blockers; Wikipedia; online reviews; e-commerce; digital privacy; software updates; error messages;
software bugs; algorithms; the command line; web servers; APIs; Unicode; ASCII; screen resolution; dishwashers;
vacuum cleaners; air conditioners; heat pumps; thermostats; smoke detectors; elevators; escalators;
traffic lights; roundabouts; vending machines; ATMs; zippers; Velcro; safety pins; umbrellas; locks;
bicycle gears; car engines; brakes; seat belts; airbags; parachutes; gliders; dams; lighthouses; windmills;
sewers; Pompeii; the Colosseum; Stonehenge; Machu Picchu; the Parthenon; the Enlightenment;
the American Revolution; the Gold Rush; the Suez Canal; the Panama Canal; the Eiffel Tower;
the Statue of Liberty; the Taj Mahal; the Phoenicians; samurai; ancient Persia; the Celts; the Khmer Empire;
early cars; the history of medicine; the history of the bicycle; the census; elections; voting systems;
the United Nations; human rights; juries; city planning; traffic jams; bike lanes; charities; crowdfunding;
subscriptions; coupons; receipts; auctions; bartering; the euro; savings accounts; debt; credit scores;
supply chains; shipping containers; warehouses; factories; assembly lines; organic food; fast fashion;
landfills; e-waste; air pollution; noise pollution; light pollution; national parks; aquariums; zoos; mosaics;
stained glass; puppetry; mime; improv theatre; radio dramas; audiobooks; manga; Norse mythology; limericks;
crossword puzzles; sudoku; riddles; tap dancing; the saxophone; the trumpet; the flute; the accordion;
the bagpipes; karaoke; film festivals; sourdough; sushi; tacos; olive oil; maple syrup; popcorn; ice cream;
nuts; beans; lentils; black pepper; canned food; frozen food; street food; school lunches; motivation;
self-confidence; shyness; boredom; anger; happiness; laughter; daily routines; willpower; decision making;
first impressions; peer pressure; body language; active listening; daydreaming; nostalgia; homesickness;
jealousy; resilience; mindfulness; the Tour de France; the World Cup; cricket; baseball; volleyball;
table tennis; golf; ice skating; surfing; sailing; rowing; judo; fencing; archery; gymnastics; the Paralympics;
triathlons; rock climbing; referees; sportsmanship"""

HOWTO4 = """hem a pair of trousers; polish leather shoes; clean white sneakers; remove chewing gum from clothes;
get rid of fruit flies; defrost a freezer; organize a fridge; make French toast; cook scrambled eggs;
make a fruit salad; make popcorn on the stove; make a cheese sauce; whip cream by hand; knead bread dough;
cut an onion without crying; peel a mango; carve a pumpkin; set a dinner table; wrap a present neatly;
tie a tie; fold a T-shirt quickly; pack a suitcase with only hand luggage; read a train timetable;
find cheap flights; get over jet lag; pitch a tent; light a barbecue safely; read a weather forecast;
dress for very cold weather; keep houseplants alive while on holiday; grow a plant from a cutting;
get rid of weeds without chemicals; mow a lawn; set up a new phone; clear a web browser's cache;
take a screenshot on a computer; improve a weak Wi-Fi signal; restart a home router; write a formal complaint;
write a resignation note; build a simple personal website; use a formula in a spreadsheet; make a pie chart;
keep track of monthly expenses; open a savings account; compare mobile phone plans; negotiate a lower price;
return an item to a shop; sell old things online; give constructive feedback; accept criticism gracefully;
stay calm in an argument; settle a disagreement with a roommate; learn a poem by heart;
remember what you read; start learning sign language; fall asleep faster; beat the afternoon slump;
stay motivated to exercise; start lifting weights safely; hold a plank; improve your balance;
prevent back pain at a desk; care for a cast-iron pan; remove rust from a tool; paint a wooden fence;
put up a shelf; bleed a radiator; keep a house warm in winter; make a home safe for a toddler;
store bread so it stays fresh; make a simple tomato sauce; plan meals for a week on a budget;
make a shopping list that saves money; clean a computer screen; untangle a necklace"""

PAIRS4 = """cheetahs and leopards; dolphins and porpoises; hamsters and guinea pigs; llamas and alpacas;
bison and buffalo; jam and jelly; soup and stew; ice cream and gelato; pasta and noodles;
beans and peas; knitting and crochet; pens and pencils; theatre and cinema; cartoons and anime;
plays and musicals; baseball and cricket; karate and judo; gyms and home workouts; breakfast and brunch;
hardware and software; HTML and CSS; frontend and backend; modems and routers;
uploading and downloading; passwords and passkeys; earthquakes and volcanoes; oceans and seas;
ponds and lakes; valleys and canyons; rocks and minerals; conductors and insulators; energy and power;
force and pressure; area and perimeter; odd and even numbers; prime and composite numbers;
fractions and decimals; squares and rectangles; immigration and emigration; laws and rules;
rights and responsibilities; skills and talents; habits and routines; confidence and arrogance;
sympathy and empathy; envy and jealousy; showers and baths; weather forecasts and horoscopes"""

CODE_TASKS4 = """checks whether a number is a power of two; returns the sum of all odd numbers up to n;
converts hours and minutes into a total number of minutes; converts a number of minutes into hours and minutes;
computes simple interest; converts Fahrenheit to Celsius; converts pounds to kilograms;
computes the perimeter of a triangle from its three sides; computes the area of a triangle with Heron's formula;
checks whether three lengths can form a triangle; computes the hypotenuse of a right triangle;
returns the difference between the largest and the smallest item of a list;
returns how many times a given item appears in a list; returns a list without its first and last items;
finds the first repeated item in a list; finds the first symbol in a string that does not repeat;
reverses a list without using slicing; removes every number smaller than a given limit from a list;
returns the product of all numbers in a list; checks whether a list contains any duplicates;
joins a list of words into a sentence with commas and a final 'and'; returns the last n items of a list;
rounds every number in a list to two decimal places; scales a list of numbers so that they sum to one;
rescales a list of numbers to the range 0 to 1; computes the standard deviation of a list of numbers;
computes the percentage change between two numbers; computes a weighted average;
computes the sum of the first n terms of a geometric series; checks whether a number reads the same backwards;
converts a number of bytes into KB, MB or GB; checks whether a string is a valid IPv4 address;
checks whether a URL starts with http or https; extracts the domain name from a URL;
finds the most common first name in a list of full names; sorts a list of full names by last name;
swaps two items of a list given their positions; removes repeated words from a sentence but keeps the order;
makes a username from a first and a last name; turns a list of pairs into a dictionary;
returns how many keys of a dictionary have a given value; removes the entries of a dictionary whose values are empty;
merges a list of dictionaries into one dictionary; returns how deeply a list is nested;
checks whether every key and value of one dictionary is also in another; finds the keys two dictionaries share;
finds the longest palindrome inside a string; draws a square of # signs of a given size;
prints a diamond of asterisks; prints the numbers from 1 to 100 that are divisible by 7;
prints a countdown from n to 1; simulates a simple dice game between two players;
picks a random winner from a list of names; deals a hand of five cards from a deck;
flips a coin until it lands heads three times in a row; estimates pi with random points;
formats a number of seconds as mm:ss; adds a number of minutes to a time written as HH:MM;
returns the number of minutes between two times written as HH:MM; returns the season for a month number;
returns the name of a month from its number; defines a Car class with a method that describes the car;
defines a Circle class with area and circumference methods; defines a Playlist class that can add, remove and shuffle songs;
defines a Recipe class that scales its ingredients for more people; defines a Fraction class that adds two fractions;
defines a Budget class that tracks income and expenses; defines a Stopwatch class with start and stop methods;
defines a Person class with a greeting method; defines a ParkingLot class that tracks free spaces;
defines a ShoppingList class with add and remove methods; defines a Thermostat class with a target temperature;
implements a text adventure with three rooms; checks a tic-tac-toe board for a winner;
plays a simple game of hangman; runs a short quiz of three questions and keeps the score;
simulates a vending machine that gives change; defines a PhoneBook class with add, search and delete methods;
computes the Hamming distance between two strings of equal length; converts a sentence to pig latin;
finds all words in a list that start with a given prefix; returns the words of a sentence that are longer than n symbols;
sorts the words of a sentence alphabetically; checks whether the quotes in a string are balanced;
removes HTML tags from a string; converts a Markdown heading line into HTML;
prints a text file with a number in front of each line; writes the multiplication table of n to a text file;
reads a CSV file and prints the average of one column; writes a list of dictionaries to a CSV file;
finds files with the same content in a folder; creates a folder if it does not exist yet;
deletes the files in a folder that are older than thirty days; copies a file to a backup file whose name ends in .bak;
splits a large text file into smaller files of 100 lines; computes the SHA-256 hash of a file;
parses a command such as 'add 3 5' and prints the result; solves a quadratic equation;
checks whether a point lies inside a circle; computes the slope of a line through two points;
computes the angle between the hands of a clock at a given time; converts degrees to radians;
finds the point closest to the origin in a list of points; rotates a point around the origin by an angle;
computes one step of Conway's Game of Life; fills a connected region of a grid with a new value;
finds the number of islands of 1s in a grid of 0s and 1s;
finds the path with the smallest sum through a grid, moving only right or down; implements a trie for word lookups;
implements a min-heap; implements a hash table with separate chaining; implements a ring buffer of fixed size;
finds the majority element of a list; checks whether a list reads the same forwards and backwards;
returns all pairs of numbers in a list whose sum is even; generates all subsets of size k of a list;
generates all valid combinations of n pairs of parentheses; spells out an integer in words, such as 42 as forty-two;
converts a number to its ordinal form, such as 1st, 2nd and 3rd; prints a list of numbers as a table with aligned columns;
computes a restaurant tip and splits the bill among n people; computes the final price after a discount and sales tax;
converts a price from one currency to another at a given rate; returns a grade such as A, B or C for a test score"""

MODULES4 = """tarfile; gettext; numbers; ast; dis; pdb; cProfile; pstats; tracemalloc; multiprocessing;
concurrent.futures; selectors; ssl; hmac; http.client; http.cookies; xml.dom.minidom; plistlib; shelve; atexit;
gc; importlib; pkgutil; doctest; unittest.mock; venv; zipapp; fileinput; getopt; errno; ctypes; contextvars;
html.parser; wave; cmd; tkinter; tokenize; sysconfig; socketserver"""

LIST_SUBJECTS4 = """games to play on a long car journey; things to bring to a sleepover; animals with stripes or spots;
animals of the African savanna; insects that live in colonies; reptiles that people keep as pets;
outdoor activities for a sunny day; famous operas; famous ballets; famous buildings around the world;
famous museums around the world; the tallest mountains in the world; the longest rivers in the world;
the largest countries by area; countries in Africa; capital cities of Asia; national dishes of different countries;
languages spoken in Europe; traditional dances from around the world; sports played on ice; individual sports;
martial arts; pieces of equipment needed for camping; things to check before buying a used bike; ways to cut down on sugar;
tools every home should have; things to keep in a car; uses for vinegar around the house; uses for old T-shirts;
signs that a plant needs more light; pests that attack houseplants; vegetables that grow in the shade;
berries that are safe to eat; nuts and seeds that are good for you; drinks that contain caffeine;
foods from Italy; foods from Mexico; Japanese dishes; French pastries; breads from around the world;
cheeses from around the world; types of pasta; coffee drinks you can order in a cafe;
cooking terms every beginner should know; kitchen safety rules; common phobias; natural disasters;
ways to prepare for a storm; things to do during a power cut; famous explorers; famous women in science;
famous poets; famous playwrights; famous architects; famous statues; wonders of nature;
national parks in the United States; three-dimensional shapes; units of time; units of length; metric prefixes;
parts of a bicycle; parts of a car engine; bones of the human body; organs of the human body;
exercises for better balance; foods that help you sleep; bedtime routines for children; habits that waste time;
note-taking methods; memory techniques; computer terms every beginner should know; file formats and what they store;
online safety rules for children; signs that a website is not safe; Python libraries for data analysis;
Python data types; text editors for programmers; things to include in a README file; rules for readable code;
common errors in Python and what they mean"""

CHARACTERS4 = """a badger who cannot find his glasses; a shy otter; a busy beaver; a raccoon who loves to tidy up;
a moose with a cold; a hippo who wants to dance; a zebra who lost her stripes; a chameleon who cannot change color;
a platypus who does not fit in; a walrus with a sore tooth; a jellyfish who wants to hug; a crab who wants to move forwards;
a snail in a hurry; a ladybug with no spots; a dragonfly; a bumblebee who is afraid of flowers; a lamb;
a piglet who hates mud; a duckling; a night porter at a hotel; a potter; a glassblower; a blacksmith; a florist;
a plumber; a mechanic; a park ranger; a pilot; a deep-sea diver; a mountain guide; a school cook; a street sweeper;
a puppeteer; a juggler; a clown who cannot laugh; a shopkeeper; an ice cream seller; a window cleaner; a cobbler;
a radio host; a nervous drummer; an old umbrella; a talking teapot; a runaway balloon; a little lantern;
a grumpy alarm clock; a squeaky bicycle; a rusty tractor; a sleepy volcano; a raindrop; a leaf in autumn;
a sunflower; a pumpkin; a troll under a bridge; a mermaid; a unicorn; an elf; a goblin who loves books; a genie;
a sea monster; a yeti; a girl who collects rocks; a boy who cannot whistle; a young gymnast; a boy who talks to plants"""

SETTINGS4 = """at a bus stop; in a treehouse; on a houseboat; in an empty theatre; on a rooftop garden; in a haunted house;
in a bamboo forest; on a sailboat; at a zoo; at a wedding; in a laundromat; at an airport; in a post office;
in an old windmill; in a cornfield; on a foggy morning; at sunrise; in a lighthouse; in a busy kitchen;
at a flea market; in a garden shed; on a long bus journey; in a village high in the mountains; during a heatwave;
on the last day of summer; in an ice cave"""

THEMES4 = """fairness; loyalty; hope; empathy; perseverance; self-confidence; gentleness; cooperation; thankfulness;
modesty; being on time; taking turns; looking after animals; making amends; imagination; good manners"""

NAMES4 = """Abel; Alma; Arjun; Bea; Camila; Cyrus; Dana; Elena; Emil; Esther; Finn; Freya; Gita; Hassan; Helga; Ingrid;
Isaac; Jasmine; Joel; Kamal; Kira; Lars; Malik; Mira; Nils; Noor; Oliver; Pablo; Petra; Rania; Sven; Talia;
Tobias; Ulla; Valentina; Yosef; Zainab; Hamid; Irene; Marta"""

ITEMS4 = """cherries; strawberries; apricots; mangoes; kiwis; lollipops; donuts; pretzels; crackers; glue sticks;
folders; paper cups; spoons; napkins; tulips; acorns; pine cones; feathers; keychains; bracelets; hair clips; dice;
bookmarks; mugs; towels; T-shirts; hats; gloves; plates; forks"""

# words to define, proverbs to explain, concepts to give an example of, yes/no questions
# to answer with a reason, and short passages to summarise or retell
WORDS4 = """ambiguous; resilient; meticulous; gregarious; frugal; candid; tedious; serendipity; eloquent; diligent;
skeptical; ubiquitous; ephemeral; pragmatic; benevolent; reluctant; vivid; obsolete; abundant; mundane; tenacious;
cautious; ambitious; sincere; gullible; hesitant; impartial; inevitable; versatile; concise; verbose; ambivalent;
nonchalant; pessimistic; sarcastic; witty; naive; stubborn; thrifty; lavish; arrogant; bland; fragile; sturdy;
feasible; plausible; redundant; trivial; crucial; temporary; permanent; hectic; tranquil; chaotic; spontaneous;
deliberate; reliable; punctual; reckless; vague; obvious; subtle; genuine; dormant; adapt; persuade; contribute;
anticipate; exaggerate; improvise; interrupt; postpone; reconcile; scrutinize; wander; linger; ponder; cherish;
thrive; dwindle; flourish; mitigate; bias; consensus; dilemma; paradox; hypothesis; irony; analogy; cliche;
jargon; anecdote; deadline; milestone; loophole; bottleneck; trade-off; benchmark"""

PROVERBS4 = """Don't count your chickens before they hatch; Rome wasn't built in a day; A stitch in time saves nine;
Look before you leap; Too many cooks spoil the broth; Don't judge a book by its cover; Practice makes perfect;
Where there's smoke, there's fire; The grass is always greener on the other side; Better late than never;
When in Rome, do as the Romans do; Don't put all your eggs in one basket; A penny saved is a penny earned;
Haste makes waste; Honesty is the best policy; The pen is mightier than the sword;
Beauty is in the eye of the beholder; You can't have your cake and eat it too; Absence makes the heart grow fonder;
Slow and steady wins the race; Curiosity killed the cat; Fortune favors the bold; No pain, no gain;
All that glitters is not gold; A picture is worth a thousand words; Don't cry over spilled milk;
Great minds think alike; Out of sight, out of mind; Time is money; Knowledge is power;
Strike while the iron is hot; You reap what you sow; It takes two to tango; Easier said than done;
Every cloud has a silver lining; Ignorance is bliss; Laughter is the best medicine; Measure twice, cut once;
Old habits die hard; The squeaky wheel gets the grease; Don't bite the hand that feeds you;
The best things in life are free"""

EXAMPLES4 = """a simile; an onomatopoeia; a compound word; a pair of homophones; a prime number greater than 50;
an herbivore; a carnivore; an omnivore; a renewable resource; a non-renewable resource; a chemical change;
a physical change; a material that conducts electricity; a lever in everyday life; an open question;
a closed question; a sentence that states an opinion; a polite request; a persuasive sentence;
a symmetrical shape; an acute angle; an irrational number; a SMART goal; a thesis statement; a topic sentence;
a rhetorical question; an oxymoron; an alliteration; a pun; a tongue twister; a mammal that can fly;
a plant that eats insects; an invertebrate; a cold-blooded animal; a fossil fuel; a greenhouse gas;
an element that is a gas at room temperature; a chemical compound; a mixture that can be separated;
an alloy; a transparent material; an opaque material; a Python list comprehension; a Python dictionary comprehension;
a lambda function in Python; a Python f-string; a Python generator; a Python decorator; a recursive function;
an infinite loop; an off-by-one error; a syntax error; a boolean expression; a try/except block in Python;
a docstring; a simple SQL query; a regular expression"""

YESNO4 = """Is a tomato a fruit?; Can penguins fly?; Is glass a liquid?; Is zero an even number?; Is a whale a fish?;
Do plants breathe?; Can lightning strike the same place twice?; Do camels store fat in their humps?;
Does hot air rise?; Is Pluto a planet?; Is a square a rectangle?; Is 1 a prime number?;
Does sound travel through space?; Is a virus alive?; Do all mammals give birth to live young?; Is a bat a mammal?;
Is a peanut a nut?; Is a strawberry a berry?; Is a banana a berry?;
Can a goldfish remember things for more than a few seconds?; Do we use only ten percent of our brains?;
Does cracking your knuckles cause arthritis?; Does reading in dim light damage your eyes?;
Does sugar make children hyperactive?; Can you catch a cold from being cold?;
Is breakfast the most important meal of the day?; Should you charge a phone battery to 100 percent every time?;
Is it safe to leave a laptop plugged in all the time?; Is Python a good first programming language?;
Is HTML a programming language?; Does a faster processor always make a computer faster?; Can a computer think?;
Is 0.999... equal to 1?; Is infinity a number?; Can a triangle have two right angles?;
Is the square root of 2 a fraction?; Can you divide a number by zero?;
Is a negative number times a negative number positive?; Do heavier objects fall faster than lighter ones?;
Is the Earth a perfect sphere?; Is there gravity on the International Space Station?;
Is the Earth closer to the Sun in summer?; Is it colder at the top of a mountain?;
Can it rain when the sun is shining?; Are all deserts hot?; Is Antarctica a desert?;
Is lightning hotter than the surface of the Sun?; Do cats see in the dark?; Are bats blind?;
Do ostriches bury their heads in the sand?; Is a spider an insect?; Is a shark a mammal?;
Does honey ever go bad?; Is brown bread always healthier than white bread?; Is it rude to be late for a meeting?;
Is it okay to say no when someone asks for a favor?; Can money buy happiness?; Do opposites attract?;
Is it better to rent than to buy a car?; Should everyone learn to cook?; Are video games a waste of time?;
Is it possible to learn a language in a month?; Can you be too tired to fall asleep?"""

PASSAGES4 = """Our town opened a new library this week. It has a reading room for children, a small cafe and free
computers. It is open every day except Monday.;
The city council has decided to close the main street to cars on Sundays. Cyclists and families will be able to use
the whole road. Shop owners are not sure whether this will help their business.;
A local bakery gives its unsold bread to a food bank every evening. The owner says that throwing good bread away
felt wrong. Other shops in the area now want to do the same.;
Scientists have found a small frog that can change the color of its skin in less than a minute. They think it does
this to hide from predators. The frog lives only in a few forests in South America.;
The school will start fifteen minutes later from next month. Teachers hope that students will be less tired in the
first lesson. Buses will run on a new timetable.;
Tomas wanted to run a marathon, but he had never run more than five kilometers. He trained three times a week for
six months. Last Sunday he finished the race in just under four hours.;
More people are repairing their old phones instead of buying new ones. Repair shops say they are busier than ever.
Some companies now sell spare parts directly to customers.;
A heatwave is expected to reach the region on Thursday. Temperatures may rise above 35 degrees. People are advised
to stay in the shade and avoid hard exercise at midday.;
The museum has a new exhibition about the history of flight. Visitors can sit in a copy of an early plane and try a
flight simulator. The exhibition runs until the end of the year.;
A group of neighbours turned an empty lot into a community garden. They grow tomatoes, beans and herbs and share the
harvest. Anyone who helps on Saturdays can take vegetables home.;
The train company has announced new fares. Tickets bought online at least a week in advance will be cheaper. Tickets
bought at the station on the day will cost more.;
Elena bought a second-hand bicycle for her commute. It was old and rusty, but she fixed the brakes and oiled the
chain herself. Now she rides to the office every day and saves money on bus tickets.;
The football club has a new coach. In his first month the team won four games in a row. Fans hope the club can
finish in the top three this season.;
Honey bees tell each other where to find flowers by dancing. The direction of the dance shows the direction of the
flowers. The length of the dance shows how far away they are.;
A new app lets people borrow tools from their neighbours. Instead of buying a drill that they use twice a year, they
can borrow one nearby. The app has already been downloaded by thousands of people.;
The village shop was about to close because its owner was retiring. The villagers decided to buy it together. Now
volunteers run it, and the profits pay for a weekly bus to the nearest town.;
Many people feel sleepy after lunch. This is partly because of a natural dip in the body's clock in the early
afternoon. A short rest or some fresh air can help.;
The national park has limited the number of visitors on its most popular trail. Hikers must now book a time slot
online. The park says this protects the paths and the wildlife.;
A ten-year-old girl noticed that the playground in her town had no swings for children in wheelchairs. She wrote to
the mayor and collected signatures. Next spring the town will build a new swing for everyone.;
The price of coffee has gone up this year because of poor harvests in several countries. Some cafes have raised
their prices. Others now serve smaller cups.;
Researchers asked two groups of people to learn a list of words. One group slept after learning and the other stayed
awake. The group that slept remembered more words the next day.;
The old cinema in the town centre will reopen next month after two years of repairs. It will show classic films from
Monday to Friday and new films at weekends. Tickets for the opening night sold out in an hour.;
Hiro started learning the guitar at the age of sixty. At first his fingers hurt and he wanted to give up. A year
later he played his first song in front of his family.;
A city has painted some of its roofs white. White roofs reflect sunlight and keep buildings cooler in summer. The
city hopes this will reduce the use of air conditioning.;
The company will let its staff choose where they work two days a week. Managers say that the office will stay open
for meetings. Some staff are happy, but others miss seeing their colleagues every day.;
Octopuses have three hearts and blue blood. They can squeeze through tiny gaps because they have no bones. Some can
even open jars to reach food inside.;
A farmer has started using sheep to keep the grass short under his solar panels. The sheep eat the grass and the
panels give them shade. The farmer says both the sheep and the panels are doing well.;
The local theatre is looking for volunteers to help with its summer show. Volunteers can help with costumes, lights
or tickets. No experience is needed, and training will be given.;
A new bridge across the river will open in the autumn. It will cut the drive between the two towns from forty
minutes to ten. A path for cyclists runs along one side.;
Some schools have started teaching children how to cook simple meals. The children learn to plan a meal, shop for it
and cook it safely. Teachers say the lessons also help with maths and reading."""

T_EXPLAIN4 = ["Explain {t} in two short paragraphs.", "What is the most important thing to know about {t}?",
              "Write a short explanation of {t} for a curious adult.", "Why should someone learn about {t}?",
              "What are three key facts about {t}?", "Explain {t} like I am five years old.",
              "How would you describe {t} in plain words?", "Write a short fact sheet about {t}.",
              "Give me a short summary of what {t} is and why it matters.",
              "Write a short paragraph about {t} using simple words.",
              "Explain {t} in a few sentences, then give one example.", "What do most people not know about {t}?",
              "Write a short radio script that explains {t}.", "Write a tweet-length explanation of {t}.",
              "What is worth knowing about {t}?"]
T_HOWTO4 = ["How do people usually {t}?", "What are the steps to {t}?", "Give me a simple guide to {t}.",
            "I am a complete beginner. How do I {t}?", "What is a good first step to {t}?",
            "Can you give me step-by-step instructions on how to {t}?", "What is an easy way to {t}?",
            "Explain in three steps how to {t}.", "What should I know before I try to {t}?"]
T_COMPARE4 = ["What is the main difference between {t}?", "How can you tell {a} and {b} apart?",
              "Compare {t} in a short table.", "Give one way {a} and {b} are alike and two ways they differ.",
              "Explain the difference between {t} with an example.", "Why do people sometimes confuse {a} and {b}?",
              "Describe {a} and {b} in two sentences each."]
T_DEFINE4 = ['Define the word "{t}" in one sentence.', 'What does "{t}" mean? Use it in a sentence.',
             'Give a short definition of "{t}" and an example sentence.']
T_PROVERB4 = ['What does the proverb "{t}" mean?', 'Explain the saying "{t}" with an example.',
              'Is the saying "{t}" true? Explain briefly.', 'Describe a situation where the saying "{t}" applies.']
T_EXAMPLE4 = ["Give an example of {t}.", "What is a good example of {t}? Explain briefly.",
              "Give me one example of {t}, with a one-line explanation."]
T_YESNO4 = ["{t} Answer yes or no, and explain why.", "{t} Give a short answer with a reason.",
            "{t} Explain your answer in two sentences."]
T_PASSAGE4 = ["Summarize this in one sentence: {t}", "Write a short headline for this text: {t}",
              "What is the main point of this text? {t}", "Retell this for a young child: {t}"]
T_LIST4 = ["List seven {t}.", "Name five {t}.", "Give me a quick list of {t}.", "Write a short list of {t}, one per line.",
           "Can you list some {t}? Add a short note to each.", "I need a list of {t}. Please keep it brief.",
           "Make a numbered list of six {t}.", "What are five good examples of {t}?",
           "List three {t} and say one interesting thing about each."]
T_CODE4 = ["Write a Python function that {t}. Use clear variable names.",
           "Write a Python function that {t}, and add three example calls with their output.",
           "Write a Python function that {t}, and test it with assert statements.",
           "I need a Python function that {t}. Can you write it?",
           "Write a Python function that {t}. Keep it short and readable.",
           "Write a Python function that {t}, and explain your approach first.",
           "Show Python code that {t}, and describe one edge case.",
           "Write a well-documented Python function that {t}.",
           "Write a Python function that {t}, and say how it could be made faster."]
T_MODULE4 = ["What is Python's `{t}` module for? Show a short example.",
             "Write a short example program that uses Python's `{t}` module, with comments.",
             "Explain in simple terms what Python's `{t}` module does."]
T_STORY4 = ["Write a short mystery story about {c} {s}.", "Write a story of about 150 words about {c} {s}.",
            "Write a short story about {c} {s} that teaches children about {m}.", "Write a four-line poem about {c}.",
            "Write a short story that begins with {c} waking up {s}.",
            "Write a bedtime story about {c} {s}, ending with a lesson about {m}.",
            "Write a short comic story about {c} {s}.", "Write a short story about {c} {s}, in the present tense.",
            "Write a short story in which {c} helps someone {s}.", "Write a short story about {c} {s}, with a title.",
            "Write a short poem about {c} and {m}.", "Write a short story about {c} {s} for a seven-year-old.",
            "Write a short story about {c} {s} in which {m} saves the day."]


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


def _stories(rng: random.Random, templates: list[str], chars: list[str], settings: list[str], themes: list[str],
             n: int) -> list[str]:
    """``n`` different story prompts, each a template drawn with a character, setting and theme
    (in that order from ``rng``: every batch's draws)."""
    out: set[str] = set()
    while len(out) < n:
        out.add(rng.choice(templates).format(c=rng.choice(chars), s=rng.choice(settings), m=rng.choice(themes)))
    return sorted(out)


def build() -> tuple[list[dict], list[dict]]:
    """Return (train, heldout): lists of {"prompt", "kind"} dicts, deterministic."""
    train, held, _ = _build()
    return train, held


def heldout_topics() -> dict[str, list[str]]:
    """The topics build() reserves for HELD-OUT on this Python, by pool: chat subjects,
    how-tos, pairs, code tasks, stdlib modules, list subjects, story characters, arithmetic
    names and items (on BUILT_ON: those of the frozen held-out list)."""
    return _build()[2]


def _build() -> tuple[list[dict], list[dict], dict[str, list[str]]]:
    """build()'s lists and the held-out topics."""
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

    _add(train, "stories", _stories(rng, T_STORY, char_tr, settings, themes, 1500))
    _add(held, "stories", _stories(rng, T_STORY, char_ho, settings, themes, h))

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
    train += [d for d in _extra(topics) if d["prompt"] not in seen]
    ho = dict(subjects=subj_ho, howtos=how_ho, pairs=pair_ho, code=code_ho, modules=mod_ho, lists=list_ho,
              chars=char_ho, names=name_ho, items=item_ho)
    seen = held_set | {d["prompt"] for d in train}
    train += [d for d in _third(ho) if d["prompt"] not in seen]
    seen = held_set | {d["prompt"] for d in train}
    return train + [d for d in _fourth(ho) if d["prompt"] not in seen], held, ho


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
    _add(out, "stories", _stories(rng, T_STORY2, t["chars"], t["settings"], t["themes"], 1200))
    _add(out, "arithmetic", sorted(set(_arithmetic(rng, t["names"], t["items"], 1200))))
    out = list({d["prompt"]: d for d in out}.values())
    rng.shuffle(out)  # kinds interleaved, so any prefix of the batch is a balanced sample
    return out


def _arithmetic3(rng: random.Random, names: list[str], items: list[str], n: int) -> list[str]:
    """Word problems of the third batch: multiplication, division with a remainder, money
    and change, clock times, units and fractions, with seeded numbers."""
    templates = [
        "What is {x} times {y}? Show your working.",
        "What is {big} divided by {d}, and what is the remainder?",
        "{a} has {big} {i} and puts them into bags of {d}. How many bags are full, and how many {i} are left over?",
        "{a} puts {i} in {r} rows of {y}. How many {i} are there in all?",
        "{a} has {y} {i}. {b} has {r} times as many. How many {i} does {b} have?",
        "{a} buys {r} {i} at {c} cents each. How much does {a} pay, in dollars and cents?",
        "{a} buys {r} {i} at {d} dollars each and pays with a {bill}-dollar bill. How much change does {a} get?",
        "{a} earns {d} dollars an hour and works {y} hours. How much does {a} earn?",
        "{a} has {bill} dollars, spends {d} dollars on {i} and {r} dollars on lunch. How much is left?",
        "A film starts at {h}:{mm} and lasts {dur} minutes. At what time does it end?",
        "{a} leaves home at {h}:{mm} and arrives {dur} minutes later. At what time does {a} arrive?",
        "{a} goes to bed at {pm} p.m. and gets up at {am} a.m. How many hours is that?",
        "{a} runs {y} laps of a {m}-meter track. How many kilometers is that?",
        "A pizza is cut into {slices} slices. {a} eats {k} and {b} eats {j}. What fraction of the pizza is left?",
        "A bus holds {cap} people. How many buses are needed for {big} people?",
        "{a} has {t3} {i} and gives a third of them to {b}. How many {i} does {a} keep?",
        "{a} collects {x} {i} on Monday, {y} on Tuesday and twice as many on Wednesday as on Tuesday. "
        "How many {i} does {a} collect in all?",
    ]
    out = []
    for _ in range(n):
        d, r = rng.randint(2, 9), rng.randint(2, 12)
        x, y = rng.randint(11, 99), rng.randint(3, 40)
        slices = rng.choice((6, 8, 10, 12))
        k = rng.randint(1, slices // 2 - 1)
        a, b = rng.sample(names, 2)
        out.append(rng.choice(templates).format(
            a=a, b=b, i=rng.choice(items), x=x, y=y, d=d, r=r, big=rng.randint(50, 999),
            c=rng.choice((15, 20, 25, 35, 40, 45, 55, 60, 75, 80, 95)), bill=min(v for v in (10, 20, 50, 100, 200) if v > r * d),
            h=rng.randint(1, 11), mm=f"{rng.randrange(0, 60, 5):02d}", dur=rng.randint(25, 170),
            pm=rng.randint(7, 11), am=rng.randint(5, 8), m=rng.choice((200, 250, 400, 500)), slices=slices, k=k,
            j=rng.randint(1, slices - k - 1), t3=3 * rng.randint(2, 30), cap=rng.randint(20, 60)))
    return out


def _mentions_heldout(text: str, ho: dict[str, list[str]]) -> list[str]:
    """The held-out topics (``ho``, as build() reserves them) and NEAR_HELDOUT patterns that
    ``text`` contains: topic strings as case-insensitive substrings, stdlib modules, story
    characters, names and items as whole words."""
    low = text.lower()
    hits = [t for k in ("subjects", "howtos", "pairs", "code", "lists") for t in ho[k] if t.lower() in low]
    hits += [t for k in ("modules", "chars", "names", "items") for t in ho[k]
             if re.search(rf"\b{re.escape(t.lower())}\b", low)]
    return hits + [p for p in NEAR_HELDOUT if re.search(p, low)]


def _sampled(rng: random.Random, pool: str, templates: list[str], n: int) -> list[str]:
    """Each topic of ``pool`` under ``n`` of ``templates`` drawn from ``rng`` (in pool order)."""
    return [x.format(t=s) for s in _pool(pool) for x in rng.sample(templates, n)]


def _compared(rng: random.Random, pool: str, templates: list[str], n: int) -> list[str]:
    """Each pair "A and B" of ``pool`` under ``n`` of ``templates`` ({t}, {a}, {b}) drawn from ``rng``."""
    out = []
    for p in _pool(pool):
        a, b = p.split(" and ", 1)
        out += [x.format(t=p, a=a, b=b) for x in rng.sample(templates, n)]
    return out


def _finish(out: list[dict], rng: random.Random, ho: dict[str, list[str]], name: str) -> list[dict]:
    """A batch's prompts once each, shuffled, none mentioning a held-out topic."""
    out = list({d["prompt"]: d for d in out}.values())
    rng.shuffle(out)  # kinds interleaved, so any prefix of the batch is a balanced sample
    bad = {h for d in out for h in _mentions_heldout(d["prompt"], ho)}
    assert not bad, f"{name} batch mentions held-out topics: {sorted(bad)}"
    return out


def _third(ho: dict[str, list[str]]) -> list[dict]:
    """The third TRAIN batch (from index FIRST_THIRD of the frozen list): new topic pools
    (SUBJECTS3 ... ITEMS3) under new templates (T_*3), from its own random stream
    (THIRD_SEED), so the first two batches and the held-out split stay what they were.
    ``ho``: the held-out topics; no prompt of the batch mentions one."""
    rng = random.Random(THIRD_SEED)
    out: list[dict] = []
    chat = _sampled(rng, SUBJECTS3, T_EXPLAIN3, 12) + _sampled(rng, HOWTO3, T_HOWTO3, 7)
    chat += _compared(rng, PAIRS3, T_COMPARE3, 5)
    chat += _sampled(rng, WORDY3, T_WORDY3, 4) + _sampled(rng, MISTAKES3, T_MISTAKES3, 2)
    notes = sorted({rng.choice(T_NOTE3).format(r=rng.choice(_pool(RECIPIENTS3)), p=rng.choice(_pool(PURPOSES3)))
                    for _ in range(400)})
    chat += notes + _sampled(rng, DECISIONS3, T_DECIDE3, 3)
    _add(out, "chat", chat)
    code = [x.format(t=c) for c in _pool(CODE_TASKS3) for x in T_CODE3]
    # a class is not a function: "Write a Python function that defines a ... class" -> "Write Python code that ..."
    code = [c.replace("a simple Python function for beginners that defines", "simple Python code for beginners that defines")
            .replace("a Python function that defines", "Python code that defines") for c in code]
    _add(out, "code", code
         + [x.format(t=m) for m in _pool(MODULES3) for x in T_MODULE3])
    _add(out, "lists", [x.format(t=s) for s in _pool(LIST_SUBJECTS3) for x in T_LIST3])
    _add(out, "stories", _stories(rng, T_STORY3, _pool(CHARACTERS3), _pool(SETTINGS3), _pool(THEMES3), 2200))
    _add(out, "arithmetic", sorted(set(_arithmetic3(rng, _pool(NAMES3), _pool(ITEMS3), 2300))))
    return _finish(out, rng, ho, "third")


def _arithmetic4(rng: random.Random, names: list[str], items: list[str], n: int) -> list[str]:
    """Word problems of the fourth batch: percentages, speed, distance and time, clock times
    and durations, unit conversions, ratios, averages, sequences, fractions of an amount and
    the order of operations, with seeded numbers chosen so that each has one clear answer."""
    # (unit, smaller unit, how many of the smaller make one)
    units = (("meters", "centimeters", 100), ("kilometers", "meters", 1000), ("kilograms", "grams", 1000),
             ("liters", "milliliters", 1000), ("hours", "minutes", 60), ("minutes", "seconds", 60),
             ("feet", "inches", 12), ("pounds", "ounces", 16), ("days", "hours", 24))
    templates = [
        "{a} got {k} out of {q} questions right on a quiz. What percentage is that?",
        "A coat costs {p20} dollars. Its price goes up by {pc} percent. What is the new price?",
        "Find {pc5} percent of {p20}.",
        "{a} earns {p20} dollars a week and saves {pc5} percent of it. How much does {a} save each week?",
        "In a school of {p20} students, {pc5} percent bring lunch from home. How many students is that?",
        "A bike that costs {p20} dollars is on sale for {pc} percent off. How much money do you save?",
        "A cyclist rides at {v} km per hour. How long does it take to ride {vt} km?",
        "{a} drives {dt} km in {t} hours. What is the average speed?",
        "A train travels at {tv} km per hour. How far does it go in {tm} minutes?",
        "{a} jogs {k2} km in {pace_k2} minutes. At the same pace, how long would {k3} km take?",
        "A lesson starts at {h}:{mm} and ends at {end}. How many minutes long is it?",
        "A flight leaves at {h2}:{mm} and lands {fh} hours and {fm} minutes later. At what time does it land?",
        "How many minutes are there in {hh} hours and {fm} minutes?",
        "How many hours and minutes is {mins} minutes?",
        "{a} practices the piano for {prac} minutes every day. How many hours is that in {w} weeks?",
        "How many {small} are there in {qty} {big}?",
        "Convert {qsmall} {small} to {big}.",
        "A rope is {rl} meters long. {a} cuts it into pieces of {rp} centimeters. "
        "How many pieces does {a} get?",
        "{a}'s scores on four tests are {s1}, {s2}, {s3} and {s4}. What is the average score?",
        "{a} and {b} share {ratio_n} {i} in the ratio {r1}:{r2}. How many {i} does each of them get?",
        "A pack of {n1} {i} costs {c1} dollars and a pack of {n2} {i} costs {c2} dollars. "
        "Which pack is cheaper per item?",
        "The temperature was {t1} degrees in the morning and fell by {fall} degrees by the evening. "
        "What was the temperature in the evening?",
        "What is the next number in the sequence {seq}?",
        "A car uses {f} liters of fuel for every 100 km. How many liters does it need for {km} km?",
        "Work out {x} plus {y} times {z}, using the correct order of operations.",
        "A square garden has a perimeter of {sq4} meters. How long is each side, and what is its area?",
        "{a} spends {fk}/{fd} of {money} dollars on {i}. How much money does {a} have left?",
        "A printer prints {pr} pages a minute. How long does it take to print {prn} pages?",
        "A recipe for {rn} pancakes needs {rg} grams of flour. "
        "How many grams are needed for {rn2} pancakes?",
        "{a} has a {card}-dollar gift card and buys {bq} {i} at {bp} dollars each. "
        "How much is left on the card?",
    ]
    out = []
    for _ in range(n):
        # Every number is drawn so that the answer comes out clean: prices are multiples of
        # 20 (any multiple-of-5 percent of them is whole), distances are speed x time, sums
        # of scores divide by 4, shares by the ratio's sum, amounts by the fraction's
        # denominator, and no clock time passes midnight.
        a, b = rng.sample(names, 2)
        q, v, t = rng.choice((10, 20, 25, 50)), rng.randint(10, 30), rng.randint(2, 6)
        h, mm, dur = rng.randint(8, 15), rng.randrange(0, 60, 5), rng.randrange(35, 155, 5)
        big, small, per = rng.choice(units)
        qty = rng.randint(2, 25)
        s1, s2, s3 = (rng.randint(55, 100) for _ in range(3))
        s4 = rng.choice([s for s in range(55, 101) if (s1 + s2 + s3 + s) % 4 == 0])
        r1, r2 = rng.sample(range(1, 6), 2)
        n1, n2 = rng.sample(range(4, 13), 2)
        p1, p2 = rng.sample(range(1, 7), 2)  # different prices per item: one pack is cheaper
        k2, pace = rng.randint(2, 6), rng.randint(4, 8)
        fd = rng.choice((3, 4, 5, 8))
        if rng.random() < 0.8:  # most sequences add a step; a few multiply (fewer of them exist)
            s0, step = rng.randint(1, 50), rng.randint(2, 15)
            seq = ", ".join(str(s0 + i * step) for i in range(4))
        else:
            s0, step = rng.randint(1, 12), rng.choice((2, 3))
            seq = ", ".join(str(s0 * step ** i) for i in range(4))
        rn, bq, bp, pr = rng.choice((4, 6, 8, 10, 12)), rng.randint(2, 9), rng.randint(2, 9), rng.randint(5, 30)
        end = h * 60 + mm + dur
        values = dict(
            a=a, b=b, i=rng.choice(items), q=q, k=rng.randint(q // 2, q), p20=20 * rng.randint(2, 15),
            pc=rng.choice((5, 10, 15, 20, 25, 30, 40, 50)), pc5=rng.randrange(5, 100, 5),
            v=v, vt=v * t, t=t, dt=rng.randrange(40, 115, 5) * t, tv=12 * rng.randint(4, 12),
            tm=5 * rng.randint(2, 18), k2=k2, pace_k2=pace * k2, k3=rng.choice([k for k in range(3, 16) if k != k2]),
            h=h, mm=f"{mm:02d}", end=f"{end // 60}:{end % 60:02d}", h2=rng.randint(6, 17), fh=rng.randint(2, 5),
            hh=rng.randint(2, 12), fm=rng.randrange(5, 60, 5), mins=rng.randint(70, 500),
            prac=rng.choice((15, 20, 30, 45, 60)), w=rng.randint(2, 4),
            big=big, small=small, qty=qty, qsmall=qty * per, rl=rng.randint(2, 12), rp=rng.choice((20, 25, 50)),
            s1=s1, s2=s2, s3=s3, s4=s4, r1=r1, r2=r2, ratio_n=(r1 + r2) * rng.randint(2, 12),
            n1=n1, n2=n2, c1=n1 * p1, c2=n2 * p2, t1=rng.randint(-5, 20), fall=rng.randint(3, 18), seq=seq,
            f=rng.randint(4, 12), km=100 * rng.randint(2, 15),
            x=rng.randint(2, 50), y=rng.randint(2, 12), z=rng.randint(2, 12), sq4=4 * rng.randint(3, 60),
            fk=rng.randint(1, fd - 1), fd=fd, money=fd * rng.randint(4, 30), pr=pr, prn=pr * rng.randint(3, 20),
            rn=rn, rg=rn * rng.choice((20, 25, 30, 40, 50)),
            rn2=rng.choice([r for r in (2, 4, 6, 8, 10, 12, 16, 20) if r != rn]),
            bq=bq, bp=bp, card=rng.choice([c for c in (20, 25, 50, 100) if c > bq * bp]))
        out.append(rng.choice(templates).format(**values))
    return out


def _fourth(ho: dict[str, list[str]]) -> list[dict]:
    """The fourth TRAIN batch (from index FIRST_FOURTH of the frozen list): new topic pools
    (SUBJECTS4 ... ITEMS4), new chat forms (definitions, proverbs, examples, yes/no questions,
    short passages) and new word-problem shapes under new templates (T_*4), from its own
    random stream (FOURTH_SEED), so the first three batches and the held-out split stay what
    they were. ``ho``: the held-out topics; no prompt of the batch mentions one."""
    rng = random.Random(FOURTH_SEED)
    out: list[dict] = []
    chat = _sampled(rng, SUBJECTS4, T_EXPLAIN4, 8) + _sampled(rng, HOWTO4, T_HOWTO4, 6)
    chat += _compared(rng, PAIRS4, T_COMPARE4, 5)
    chat += _sampled(rng, WORDS4, T_DEFINE4, 2) + _sampled(rng, PROVERBS4, T_PROVERB4, 3)
    chat += _sampled(rng, EXAMPLES4, T_EXAMPLE4, 2) + _sampled(rng, YESNO4, T_YESNO4, 2)
    chat += _sampled(rng, PASSAGES4, T_PASSAGE4, 3)
    _add(out, "chat", chat)
    code = [x.format(t=c) for c in _pool(CODE_TASKS4) for x in rng.sample(T_CODE4, 7)]
    # a class is not a function: "Write a Python function that defines a ... class" -> "Write Python code that ..."
    code = [re.sub(r"\ba ((?:well-documented )?)Python function that defines", r"\1Python code that defines", c)
            for c in code]
    _add(out, "code", code + [x.format(t=m) for m in _pool(MODULES4) for x in T_MODULE4])
    _add(out, "lists", [x.format(t=s) for s in _pool(LIST_SUBJECTS4) for x in T_LIST4])
    _add(out, "stories", _stories(rng, T_STORY4, _pool(CHARACTERS4), _pool(SETTINGS4), _pool(THEMES4), 2200))
    problems: set[str] = set()
    while len(problems) < 2300:  # seeded draws repeat a few problems: draw until 2300 differ
        problems.update(_arithmetic4(rng, _pool(NAMES4), _pool(ITEMS4), 2300 - len(problems)))
    _add(out, "arithmetic", sorted(problems))
    return _finish(out, rng, ho, "fourth")


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
FIRST_THIRD = 12614  # the third TRAIN batch (_third, appended 2026-12-04) starts here
FIRST_FOURTH = 22743  # the fourth TRAIN batch (_fourth, appended 2026-12-04, second session) starts here
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
    for name, rows in (("first", train[:FIRST_EXTRA]), ("second", train[FIRST_EXTRA:FIRST_THIRD]),
                       ("third", train[FIRST_THIRD:FIRST_FOURTH]), ("fourth", train[FIRST_FOURTH:])):
        print(f"  {name} batch {len(rows)}: " + ", ".join(f"{k} {sum(d['kind'] == k for d in rows)}" for k in KINDS),
              file=sys.stderr)
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

"""Upper bounds on the counts a user gives, each in one place: the CLI declares it with
``click.IntRange(max=...)`` where the option is declared, and the code a Python caller reaches
checks the same constant; and ``whole``, the test of a whole number that every reader of
user-given or stored counts applies (a bool is an int to Python, and JSON's true is 1 there),
and ``digits``, the test of a number written as text before int() reads it.
Imports nothing: cli.py reads these when its options are declared."""

# ONNX Runtime's SessionOptions take a C int: a larger thread count was pybind11's TypeError, a
# traceback, when the first session was made (build --threads, bench --threads, engines.json)
MAX_THREADS = 2**31 - 1

# Timed passes per engine and past length for a cost table (build --profile-repeats, profile
# --repeats; the median is kept). The median is steady after tens of passes; 10000 leaves room
# for a tiny model (the tests' build: ~3 ms a pass, half a minute) and is already over an hour
# for SmolLM2 (~0.5 s a pass with 2 cores), while a mistyped count (2**40) is refused instead of
# running for ever.
MAX_PROFILE_REPEATS = 10_000

# Times `specrt bench --repeats` runs the whole prompt list (each repeat: minutes to hours for
# SmolLM2's prompt files): a mistyped count (10**30) ran for ever, without a word under --quiet
MAX_BENCH_REPEATS = 1000

# The deepest verify depth (build --depths) and the most tokens a draft may say it proposes
# (speculators_config's speculative_tokens: a P-EAGLE draft of 10**9 exported without a word)
MAX_DEPTH = 64


def whole(value, lo: int | None = None, hi: int | None = None) -> bool:
    """``value`` is a Python int, not a bool, within [lo, hi] (each bound optional)."""
    return (isinstance(value, int) and not isinstance(value, bool) and (lo is None or value >= lo)
            and (hi is None or value <= hi))


def digits(text: str) -> bool:
    """``text`` is ASCII digits only, as int() reads them: str.isdigit() alone is true of '²',
    which int() refuses (a ValueError traceback where a check had passed it)."""
    return text.isascii() and text.isdigit()

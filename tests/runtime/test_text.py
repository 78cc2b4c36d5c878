"""Stop strings over streamed text (runtime/text.py StopScanner): what is emitted does
not depend on how the text arrives in pieces (one token at a time, or a verify round's
burst), the first stop string to complete wins, and a bad stop string is refused."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from specrt.cli import main
from specrt.errors import UserError
from specrt.runtime.text import StopScanner


def scan(pieces, stops) -> tuple[str, bool]:
    s = StopScanner(stops)
    out = "".join(s.push(p) for p in pieces)
    return out + s.flush(), s.hit


def first_complete(text: str, stops) -> str:
    """The definition: cut at the stop string whose first occurrence ends first (at the
    same end, the one starting first); the whole text when none occurs."""
    ends = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    return text[: min(ends)[1]] if ends else text


def test_a_stop_string_across_pieces_ends_the_text_before_it():
    assert scan(["Hello wor", "ld\nUs", "er: more"], ["\nUser:"]) == ("Hello world", True)
    assert scan(["\nUser: at once"], ["\nUser:"]) == ("", True)
    assert scan(["no stop ", "here\nUse"], ["\nUser:"]) == ("no stop here\nUse", False)
    assert scan(["abc"], []) == ("abc", False)


def test_text_is_held_back_only_while_it_could_begin_a_stop_string():
    s = StopScanner(["STOP"])
    assert s.push("abcdef") == "abc"  # the last len("STOP") - 1 characters are held
    assert s.push("S") == "d"
    assert s.push("TO") == "ef"  # "STO" is still held
    assert s.push("P and more") == "" and s.hit
    assert s.push("after") == "" and s.flush() == ""


def test_the_stop_string_complete_first_wins_however_the_text_arrives():
    # "c" is complete at the third character, "abcd" only at the fourth
    assert scan(["abcd"], ["abcd", "c"]) == ("ab", True)
    assert scan(list("abcd"), ["abcd", "c"]) == ("ab", True)
    # at the same end the longer string: "bc" and "c" end together
    assert scan(["abc"], ["c", "bc"]) == ("a", True)
    rng = np.random.default_rng(0)
    for _ in range(400):
        text = "".join(rng.choice(list("abc"), int(rng.integers(0, 24))))
        stops = ["".join(rng.choice(list("abc"), int(rng.integers(1, 5)))) for _ in range(int(rng.integers(1, 4)))]
        cuts = sorted(rng.choice(len(text) + 1, int(rng.integers(0, len(text) + 1)), replace=False)) if text else []
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        want = first_complete(text, stops)
        assert scan(pieces, stops)[0] == want, (text, stops, pieces)
        assert scan(list(text), stops)[0] == want, (text, stops)


@pytest.mark.parametrize("stops", [[""], ["ok", ""], [3]])
def test_a_bad_stop_string_is_refused(stops):
    with pytest.raises(UserError, match="stop string .*: expected a non-empty string"):
        StopScanner(stops)


def test_the_cli_refuses_an_empty_stop_string_before_loading(tmp_path):
    r = CliRunner().invoke(main, ["run", str(tmp_path), "--prompt", "hi", "--stop", ""])
    assert r.exit_code == 1 and "stop string '': expected a non-empty string" in r.output, r.output
    assert "Traceback" not in r.output

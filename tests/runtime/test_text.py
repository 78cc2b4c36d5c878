"""Stop strings over streamed text (runtime/text.py StopScanner): what is emitted does
not depend on how the text arrives in pieces (one token at a time, or a verify round's
burst), the first stop string to complete wins, and a bad stop string is refused. End to
end on a tiny model with a word-level tokenizer: the same text and output token ids
(through the token that completed the stop string) with and without speculation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specrt.cli import main
from specrt.errors import UserError
from specrt.runtime.text import StopScanner, not_text


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
    # a byte that was not UTF-8 (`--stop $'\xe9'`, Python's lone surrogate for it) or a JSON UTF-16 half:
    # no answer holds it, and the stop never matched without a word (said in not_text's words: h73a)
    for bad, said in (("\udce9", "is not valid UTF-8 text (byte 0xe9 at its start; "),
                      ("ok\ud800", "holds a lone surrogate U+D800 (after 'ok'), which is not text")):
        r = CliRunner().invoke(main, ["run", str(tmp_path), "--prompt", "hi", "--stop", "x", "--stop", bad])
        assert r.exit_code == 1 and f"error: stop string {bad!r} {said}" in r.output \
            and r.output.endswith("; no answer holds it\n"), r.output


def test_a_bad_byte_or_lone_surrogate_at_the_start_is_said_at_its_start():
    """A text that begins with a byte not UTF-8 (`--prompt $'\\xe9t\\xe9'`) or a lone surrogate was
    said "... after ''": the empty text before it quoted (h73a's report, session 73, left there;
    h78k). Said as at its start; one later keeps the text before it."""
    assert not_text("\udce9t\u00e9", "the prompt") == ("the prompt is not valid UTF-8 text (byte 0xe9 at its start; "
                                                     "or a JSON \\udce9 escape, a UTF-16 half)")
    assert not_text("\ud800ok", "--system").startswith("--system holds a lone surrogate U+D800 (at its start), ")
    assert "(byte 0xe9 after 'caf';" in not_text("caf\udce9", "the prompt")


def _tiny_text_pair(root, vocab: int, draft_vocab: int, with_tokenizer, **target_config) -> Path:
    """A tiny random Llama of ``vocab`` tokens (``target_config``: its config.json's other
    values), ``with_tokenizer(folder)`` writing its tokenizer files, and a random P-EAGLE
    draft, built for depths 1 and 3 (context 128)."""
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(root / "t", "llama", vocab_size=vocab, **target_config)
    with_tokenizer(t)
    d = write_tiny_draft(root / "d", t, kind="peagle", num_layers=1, draft_vocab=draft_vocab, mask_token_id=vocab - 1)
    export(t, d, root / "exp")
    build_engines(root / "exp", "onnxruntime", (1, 3), root / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=128)
    return root / "eng"


@pytest.fixture(scope="module")
def worded(tmp_path_factory):
    """A tiny Llama (16 tokens) with a word-level tokenizer ("w0" .. "w15") and a random
    P-EAGLE draft, built for depths 1 and 3: text in and out through real engines."""
    return _tiny_text_pair(tmp_path_factory.mktemp("worded"), 16, 12, _words)


def _words(t, special: tuple[str, ...] = ()) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(16)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(special))  # (an EOS as real tokenizers mark theirs: left out of the text)
    tok.save(str(t / "tokenizer.json"))
    # a chat template in words: system w3, user w1, assistant w2, a message's ``name`` after
    # its content when it has one (and a variable ``cue`` after the assistant's w2 when the
    # template is given one)
    roles = "{'system': 'w3', 'user': 'w1', 'assistant': 'w2'}"
    (t / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}{{ " + roles + "[m.role] }} {{ m.content }} "
        "{% if m.name is defined %}{{ m.name }} {% endif %}{% endfor %}"
        "{% if add_generation_prompt %}w2{% if cue is defined %} {{ cue }}{% endif %}{% endif %}")}))


def templated_engines(tmp_path, before: str, after: str = "") -> Path:
    """Engines (a tiny Llama with ``_words``' tokenizer, depth 1, context 64) in tmp_path/"e",
    whose chat template is ``_words``' between ``before`` and ``after`` (a template that
    refuses, or renders nothing, on some condition); its target in tmp_path/"t"."""
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_target

    target = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    _words(target)
    cfg = target / "tokenizer_config.json"
    good = json.loads(cfg.read_text())
    cfg.write_text(json.dumps({**good, "chat_template": before + good["chat_template"] + after}))
    export(target, None, tmp_path / "x")
    build_engines(tmp_path / "x", "onnxruntime", (1,), tmp_path / "e", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=64)
    return tmp_path / "e"


def test_stop_strings_end_the_same_text_and_tokens_under_every_governor(worded):
    from specrt.runtime.session import Session

    prompt = "w3 w1 w4 w1 w5 w9"
    with Session(worded, governor="off") as s:
        full = "".join(s.stream(prompt, max_new_tokens=40))
        ids = s.stats()["output_token_ids"]
    assert full[0] == " "  # the text after the prompt's
    words = full[1:].split(" ")
    assert len(words) == 40
    stop = " ".join(words[16:19])  # three words from the middle; maybe found earlier
    at = full.index(stop)
    # the definition: the fewest tokens whose text holds the stop string
    need = next(k for k in range(len(ids) + 1) if stop in " ".join(f"w{i}" for i in ids[:k]))
    for gov in ("off", "fixed:1", "fixed:3"):
        with Session(worded, governor=gov) as s:
            pieces = list(s.stream(prompt, max_new_tokens=40, stop=(stop, "no such words")))
            st = s.stats()
        assert "".join(pieces) == full[:at], gov
        assert st["output_token_ids"] == ids[:need] and st["finish_reason"] == "stop", gov
        # the tokens given, whatever a round accepted past the stop (a user walk: off counted 39, auto 60)
        assert st["new_tokens"] == need, (gov, st["new_tokens"], need)
        if gov == "fixed:3":
            assert st["accepted"] > 0  # bursts of accepted tokens reached the stop scanner
    with Session(worded, governor="fixed:3") as s:  # a caller that stops at the last piece
        got = ""
        for piece in s.stream(prompt, max_new_tokens=40, stop=(stop,)):
            got += piece
            if got == full[:at]:
                break
        assert s.stats()["finish_reason"] == "stop" and s.stats()["output_token_ids"] == ids[:need]
    # and `specrt run --stop` prints the same text (and no word of the context limit: the stop ended it)
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", prompt, "--max-new-tokens", "40", "--governor",
                                  "fixed:3", "--stop", stop])
    assert r.exit_code == 0 and r.stdout == full[:at] + "\n" and "context limit" not in r.output, r.output


def test_auto_is_dspark_with_a_tree_where_the_engines_verify_trees(worded, tmp_path):
    """The default governor: dspark:tree=3 on engines that verify token trees, dspark on
    engines built before them, off without a draft, each with prompt lookup; the CLI
    reports the resolved one."""
    import json
    import shutil

    from specrt.engines.engine_set import load_engines
    from specrt.runtime.session import Session, resolve_spec

    with Session(worded) as s:
        assert s.governor_spec == "dspark:tree=3:ngram:grow" and s.generator.governor.tree_width == 3
        assert s.generator.governor.lookup and s.generator.governor.grow
        text = "".join(s.stream("w3 w1 w4", max_new_tokens=12))
        note = s.calibration_note
    old = tmp_path / "old"
    shutil.copytree(worded, old)
    m = json.loads((old / "engines.json").read_text())
    del m["graphs"]["target"]["tree"]
    (old / "engines.json").write_text(json.dumps(m))
    with Session(old) as s:
        assert s.governor_spec == "dspark:ngram:grow" and s.generator.governor.tree_width == 1
        assert "".join(s.stream("w3 w1 w4", max_new_tokens=12)) == text

    class NoDraft:
        export = {"draft": None}

    assert resolve_spec("auto", NoDraft()) == "off:ngram:grow" and resolve_spec("fixed:2", NoDraft()) == "fixed:2"
    assert resolve_spec("auto:ngram", NoDraft()) == "off:ngram:grow" == resolve_spec("auto:grow", NoDraft())
    # a cap kept however it is spelt (the spec's options are read without case)
    assert resolve_spec("auto:grow=500", NoDraft()) == "off:ngram:grow=500" == resolve_spec("AUTO:GROW=500", NoDraft())
    # and a lookup chain's length (`--governor auto:ngram=4` ran as a bare :ngram, its length dropped unsaid)
    assert resolve_spec("auto:ngram=4", NoDraft()) == "off:ngram=4:grow"
    with load_engines(old) as engines:  # (no tree verify: dspark's chains)
        assert resolve_spec("auto:ngram=4:grow=9", engines) == "dspark:ngram=4:grow=9"
    with pytest.raises(UserError, match="'auto:ngram=0': ':ngram=L' takes"):  # (taken as a bare :ngram)
        resolve_spec("auto:ngram=0", NoDraft())
    stats = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1 w4", "--max-new-tokens", "6", "--quiet",
                                  "--stats", str(stats)])
    assert r.exit_code == 0, r.output
    assert json.loads(stats.read_text())["governor"] == "dspark:tree=3:ngram:grow"
    assert f"dspark:tree=3:ngram:grow: {note}" in r.output, r.output  # (DSpark says which calibration it runs)
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1 w4", "--max-new-tokens", "6", "--quiet",
                                  "--governor", "auto:ngram=5", "--stats", str(stats)])
    assert r.exit_code == 0 and json.loads(stats.read_text())["governor"] == "dspark:tree=3:ngram=5:grow", r.output
    # a tree's rounds are summed up on the closing line
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1 w4", "--max-new-tokens", "6", "--quiet",
                                  "--governor", "fixed:1:tree=2", "--stats", str(stats)])
    t = json.loads(stats.read_text())["tree"]
    assert r.exit_code == 0 and t["rounds"] > 0, r.output
    rounds = f"{t['rounds']} round{'' if t['rounds'] == 1 else 's'}"  # ("in 1 rounds" was said)
    assert f"governor fixed:1:tree=2, runners-up in {rounds}, {t['sibling_accepts']} won]" in r.output


def test_run_says_how_many_rejections_went_to_tokens_outside_the_draft_vocabulary(worded, tmp_path):
    """The closing line counts the rejected drafts whose correction the draft's reduced
    vocabulary (12 of 16 words here) lacks, as the stats do; where none did, it says nothing."""
    import json

    stats, said = tmp_path / "s.json", 0
    for prompt in ("w3 w1 w4", "w2 w7", "w5 w5 w9 w1"):
        r = CliRunner().invoke(main, ["run", str(worded), "--prompt", prompt, "--max-new-tokens", "24", "--quiet",
                                      "--governor", "fixed:1", "--stats", str(stats)])
        rej = json.loads(stats.read_text())["rejections"]
        assert r.exit_code == 0 and rej["rounds"] > 0, r.output
        line = (f", {rej['outside_draft_vocab']} of {rej['rounds']} rejected drafts to tokens outside the draft's "
                "vocabulary]")
        assert (line in r.output) == (rej["outside_draft_vocab"] > 0), r.output
        assert ("outside the draft's vocabulary" in r.output) == (rej["outside_draft_vocab"] > 0), r.output
        said += rej["outside_draft_vocab"] > 0
    assert said > 0  # at least one prompt's rejections reached a word the draft lacks


def test_run_refuses_one_file_for_two_options(worded, tmp_path):
    """--stats naming the --prompts file replaced the prompts with the stats; --stats and
    --grow-file on one path lost the stats."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w3 w1"}\n')
    for extra, words in ((["--prompts", str(prompts), "--stats", str(prompts)], "--prompts and --stats name the same"),
                         (["--prompt", "w3", "--stats", str(tmp_path / "s"), "--grow-file", str(tmp_path / "s")],
                          "--stats and --grow-file name the same")):
        r = CliRunner().invoke(main, ["run", str(worded), "--max-new-tokens", "4", *extra])
        assert r.exit_code == 1 and words in r.output and "Traceback" not in r.output, r.output
    assert prompts.read_text() == '{"prompt": "w3 w1"}\n' and not (tmp_path / "s").exists()


def test_run_checks_its_stats_path_before_decoding_and_writes_it_whole(worded, tmp_path):
    """--stats under a file, or naming a folder, is refused before the engines decode
    anything; a missing folder is made, and the file gets the umask's usual permissions."""
    import json
    import os

    (tmp_path / "afile").write_text("")
    for bad, message in ((tmp_path / "afile" / "s.json", "is a file, not a folder"),
                         (tmp_path, "is a folder; expected a file")):
        r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1 w4", "--max-new-tokens", "6",
                                      "--stats", str(bad)])
        assert r.exit_code == 1 and f"--stats {bad}: " in r.output and message in r.output, r.output
        assert "Traceback" not in r.output and "tokens in" not in r.output, r.output
    grow = tmp_path / "afile" / "g.npz"  # --grow-file too (it is written at the end, after every answer)
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1 w4", "--max-new-tokens", "6",
                                  "--grow-file", str(grow)])
    assert r.exit_code == 1 and f"--grow-file {grow}: " in r.output and "is a file, not a folder" in r.output, r.output
    assert "Traceback" not in r.output and "tokens in" not in r.output, r.output
    stats = tmp_path / "new" / "dir" / "s.json"
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1 w4", "--max-new-tokens", "6", "--quiet",
                                  "--stats", str(stats)])
    assert r.exit_code == 0, r.output
    st = json.loads(stats.read_text())
    assert st["new_tokens"] == 6
    # the run's identity beside its counts: which engines (and export), the governor, not interrupted
    from specrt.engines.manifest import read_engines_manifest

    assert st["engines"] == str(worded) and st["governor"] and st["interrupted"] is False and st["failed"] is None, st
    assert st["export_digest"] == read_engines_manifest(worded)["export"]["digest"]
    assert [p["prompt"] for p in st["prompts"]] == ["w3 w1 w4"]
    umask = os.umask(0)
    os.umask(umask)
    assert stats.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [x.name for x in stats.parent.iterdir()] == ["s.json"]  # no temporary file left


def test_run_stats_grow_a_corpus(worded, tmp_path):
    """`specrt run --prompts ... --governor SPEC:grow --stats S` prints what `off` does (the
    session's answers grow its search); `specrt corpus ENGINES S` makes the engines' corpus
    from those stats (each prompt's prompt_ids and output_token_ids: a deployment's own
    traffic); a stats file without them is refused naming it, writing nothing."""
    import json

    from specrt.runtime.corpus import FILE

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ["w3 w1 w4", "w2 w7", "w3 w1 w4"]))
    outs = {}
    for gov in ("off", "off:grow", "dspark:ngram:grow"):
        stats = tmp_path / f"{gov}.json"
        r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(prompts), "--max-new-tokens", "12",
                                      "--governor", gov, "--stats", str(stats)])
        assert r.exit_code == 0, r.output
        outs[gov] = [(q["prompt_ids"], q["output_token_ids"]) for q in json.loads(stats.read_text())["prompts"]]
    assert outs["off:grow"] == outs["off"] == outs["dspark:ngram:grow"]
    assert outs["off"][0] == outs["off"][2] and len(outs["off"][0][1]) == 12
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"prompts": [{"prompt": "w1", "output_token_ids": [1, 2]}]}))
    r = CliRunner().invoke(main, ["corpus", str(worded), str(bad)])
    assert r.exit_code == 1 and f"{bad}: prompts[0]: expected prompt_ids and output_token_ids" in r.output, r.output
    assert "Traceback" not in r.output and not (worded / FILE).exists()
    # stats of other engines (another export: other token ids) are refused; they were taken
    # and the corpus stamped with these engines' digest
    other = json.loads((tmp_path / "off.json").read_text())
    assert other["export_digest"] == json.loads((worded / "engines.json").read_text())["export"]["digest"]
    other["export_digest"] = "f" * 64
    (tmp_path / "other.json").write_text(json.dumps(other))
    r = CliRunner().invoke(main, ["corpus", str(worded), str(tmp_path / "other.json")])
    assert r.exit_code == 1 and "written by engines for another export" in r.output, r.output
    assert not (worded / FILE).exists()
    try:
        r = CliRunner().invoke(main, ["corpus", str(worded), str(tmp_path / "off.json")])
        assert r.exit_code == 0 and "from 3 answers" in r.output, r.output
        from specrt.runtime.corpus import Corpus

        c = Corpus.load(worded / FILE)
        ids, out = outs["off"][0]
        assert c.next(ids + out[:5])[0] == out[5]  # the answer's own continuation
        # text answers are tokenized with the engines' tokenizer (loaded once, for them only)
        from specrt.runtime.text import Text

        texts = tmp_path / "texts.jsonl"
        texts.write_text(json.dumps({"text": "w5 w6 w7 w8 w9"}) + "\n" + json.dumps({"text": "w9 w8 w7 w6"}) + "\n")
        r = CliRunner().invoke(main, ["corpus", str(worded), str(tmp_path / "off.json"), str(texts)])
        assert r.exit_code == 0 and "from 5 answers" in r.output, r.output
        export_dir = worded / json.loads((worded / "engines.json").read_text())["export"]["folder"]
        words = Text(export_dir).encode("w5 w6 w7 w8 w9", chat=False)
        assert Corpus.load(worded / FILE).next(words[:-1])[0] == words[-1]
    finally:
        (worded / FILE).unlink(missing_ok=True)


def test_grow_file_carries_growth_across_runs(worded, tmp_path, monkeypatch):
    """`specrt run --grow-file F`: the run's sequences are written to F at the end; the next
    run starts its growth from them, so a prompt of the first run is proposed from its
    earlier answer at once (grown keys, >= 40; lookup forced into every round it can take,
    as the policy's choice depends on measured times), its output still `off`'s. A governor
    without :grow, or a file that is not a growth file, exits 1 naming it, before decoding."""
    import json

    from tests.runtime.test_generate import _always_look_up

    _always_look_up(monkeypatch)

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ["w3 w1 w4", "w2 w7"]))
    again = tmp_path / "again.jsonl"
    again.write_text(json.dumps({"prompt": "w3 w1 w4"}) + "\n")
    grow = tmp_path / "state" / "grow.npz"

    def run(prompts_file, gov, *extra):
        stats = tmp_path / "s.json"
        r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(prompts_file), "--max-new-tokens", "12",
                                      "--governor", gov, "--stats", str(stats), "--quiet", *extra])
        return r, (json.loads(stats.read_text()) if r.exit_code == 0 else None)

    _, off = run(again, "off")
    r, first = run(prompts, "off:grow", "--grow-file", str(grow))
    assert r.exit_code == 0 and grow.is_file(), r.output
    r, second = run(again, "off:grow", "--grow-file", str(grow))
    assert r.exit_code == 0 and "session growth from" in r.output and "(2 sequences)" in r.output, r.output
    # its closing line names where the lookup rounds looked: the context and the earlier answers
    assert "lookup in the context and earlier answers in " in r.output and "prompt lookup" not in r.output, r.output
    # no draft ran: "no draft rounds", not "tau 1.00" (read as a draft that accepted nothing)
    assert second["draft_rounds"] == 0 and ", no draft rounds, governor off:grow" in r.output, r.output
    assert "tau" not in r.output, r.output
    assert second["prompts"][0]["output_token_ids"] == off["prompts"][0]["output_token_ids"]
    assert any(int(k) >= 40 for k in second["lookup"]["by_match"]), second["lookup"]  # grown at once
    r, fresh = run(again, "off:grow")  # without the file: nothing grown in a first prompt
    assert not any(int(k) >= 40 for k in fresh["lookup"]["by_match"])
    from specrt.runtime.corpus import Growth

    held = Growth.load(grow, vocab_size=16)
    assert len(held.seqs) == 3  # the second run's sequence joined
    learnt = [k for k, v in second["lookup"]["by_match"].items() if int(k) >= 40]
    assert all(sum(held.rates[int(k)][1]) > 16.0 * len(held.rates[int(k)][1]) for k in learnt)  # past the priors
    r, _ = run(again, "off", "--grow-file", str(grow))
    assert r.exit_code == 1 and f"--grow-file {grow}: governor 'off' has no session growth" in r.output, r.output
    assert "Traceback" not in r.output
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    r, _ = run(again, "auto", "--grow-file", str(junk))
    assert r.exit_code == 1 and "junk.npz: not a growth file" in r.output and "Traceback" not in r.output
    junk.write_text("plain text")  # numpy reads it as a pickle: said as no archive, no unpickling hinted
    r, _ = run(again, "auto", "--grow-file", str(junk))
    assert r.exit_code == 1 and "junk.npz: not a growth file (not an .npz archive)" in r.output, r.output
    assert "allow_pickle" not in r.output


def test_a_grow_file_holding_no_sequences_is_said_read(worded, tmp_path):
    """mutant m71b-20 (the note keyed on the sequences read, not on the file existing): a
    --grow-file that exists but holds none (a session that saved before any answer) is said
    read, "(0 sequences)"; a file not there yet is not."""
    from specrt.runtime.session import Session

    grow = tmp_path / "grow.npz"
    args = ["run", str(worded), "--prompt", "w3 w1", "--max-new-tokens", "4", "--governor", "off:grow", "--quiet",
            "--grow-file", str(grow)]
    with Session(worded, governor="off:grow") as s:
        s.save_growth(grow)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and f"off:grow: session growth from {grow} (0 sequences)" in r.output, r.output
    grow.unlink()
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "session growth from" not in r.output and grow.is_file(), r.output


def test_run_closing_line_names_where_lookup_looked():
    """run's closing line says "prompt lookup" only where lookup searched the context alone
    (:ngram); :corpus and :grow (each of which looks up in the context too) are named, as a list
    ("lookup in the context, earlier answers in 7 rounds" read as two of the line's items: a walk, h73a)."""
    from specrt.cli import _lookup_words

    assert _lookup_words("dspark:tree=3:ngram") == _lookup_words("off:ngram=8") == "prompt lookup"
    assert _lookup_words("off:corpus") == "lookup in the context and the corpus"
    assert _lookup_words("fixed:2:grow=500") == "lookup in the context and earlier answers"
    assert _lookup_words("dspark:ngram:corpus:grow") == "lookup in the context, the corpus and earlier answers"


def test_run_closing_line_gives_the_stats_figures_and_each_part_where_it_has_rounds(capsys):
    """run's closing line states the stats' own figures (first token after first_token_s, tau
    to two places); a tree's runners-up where it had a tree round, won or not, and lookup
    where it took a round; a run stopped before its first token (no seconds) says zeros."""
    from specrt.cli import _run_closing_lines
    from specrt.runtime.telemetry import Telemetry

    _run_closing_lines(Telemetry().to_json(), "off", [], "", None)
    assert capsys.readouterr().err == ("[0 tokens in 0.00 s: 0.0 tok/s, first token after 0.00 s, no draft rounds, "
                                       "governor off]\n")
    st = Telemetry().to_json()
    st.update(new_tokens=12, seconds=1.5, tokens_per_s=8.0, first_token_s=0.25, tau=2.4567, draft_rounds=4)
    st["tree"].update(rounds=1, sibling_accepts=0)
    st["lookup"].update(rounds=1, tokens_per_round=3.456)
    _run_closing_lines(st, "fixed:3:tree=2:ngram", [], "", None)
    assert capsys.readouterr().err == ("[12 tokens in 1.50 s: 8.0 tok/s, first token after 0.25 s, tau 2.46, governor "
                                       "fixed:3:tree=2:ngram, runners-up in 1 round, 0 won, prompt lookup in 1 round, "
                                       "3.46 tokens a round]\n")
    # a part of one: one prompt token reused, one rejected draft outside the draft's vocabulary (mutant m71b-78:
    # the rejections' part said from 2 on)
    st = Telemetry().to_json()
    st.update(new_tokens=5, seconds=1.0, tokens_per_s=5.0, first_token_s=0.5, prefix_reused=1, prompt_tokens=9)
    st["rejections"].update(rounds=3, outside_draft_vocab=1)
    _run_closing_lines(st, "off", [], "", None)
    assert capsys.readouterr().err == ("[5 tokens in 1.00 s: 5.0 tok/s, first token after 0.50 s, no draft rounds, "
                                       "governor off, 1 of 9 prompt tokens reused from the one before, 1 of 3 "
                                       "rejected drafts to tokens outside the draft's vocabulary]\n")


def test_each_governor_learns_on_its_own_copy_of_the_calibration(worded):
    """make_governor hands DSpark a copy of the session's calibration: two governors made
    from it (two configurations of one `specrt bench` worker, Session.new_governor) learn
    apart, and the session's own stays the stored one. They shared one object, so each
    configuration learnt from the others' rounds too, and a 'fresh' governor was not."""
    from specrt.runtime.governor import Calibration
    from specrt.runtime.session import Session, make_governor
    from specrt.runtime.telemetry import RoundResult

    cal = Calibration(positions=4)
    with Session(worded, governor="dspark") as s:
        g1, g2 = (make_governor("dspark:tree=2", s.engines, cal) for _ in range(2))
        assert g1.calibration is not cal and g2.calibration is not g1.calibration
        for _ in range(40):
            g1.observe(RoundResult(2, 0, 0.001, 0.002, None, np.array([0.9, 0.9])))
        assert g1.calibration([0.9])[0] < 0.8  # it learnt: first drafts at 0.9 were all rejected
        assert g2.calibration([0.9])[0] == pytest.approx(0.9) and cal([0.9])[0] == pytest.approx(0.9)
        s.calibration = g1.calibration  # (a learnt one: new_governor starts from it, not the identity; S46)
        s.new_governor()
        fresh = s.generator.governor.calibration
        assert fresh is not g1.calibration and fresh([0.9])[0] < 0.8


def test_run_names_the_prompt_line_that_fails_and_refuses_no_new_tokens_before_loading(worded, tmp_path):
    import json

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "w3 w1 w4"}) + "\n" + json.dumps({"prompt": "w1 " * 5000}) + "\n")
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "4", "--quiet"])
    assert r.exit_code == 1 and f"{f}:2: the prompt has 5000 tokens" in r.output, r.output
    # every line is checked before the first is decoded (line 1's answer, its --stats, were lost work)
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "4"])
    lines = r.output.splitlines()
    assert r.exit_code == 1 and "no prompt was decoded" in lines[-1], r.output
    # the notes, then the error: no answer printed between, and no note of the calibration the run never used
    # (it came before the error: a user walk)
    # (a note that the engines' cost table was profiled on a busy machine, as the tests' builds on a loaded host
    # are, may stand among them)
    assert all(x.startswith("note: ") for x in lines[:-1]) and "calibration" not in r.output, r.output
    assert any(x.startswith("note: no acceptance receipt") for x in lines[:-1]), r.output
    f.write_text("\n" + f.read_text().replace("\n", "\n\n", 1))  # blank lines: the line, not the prompt's index
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "4", "--quiet"])
    assert r.exit_code == 1 and f"{f}:4: the prompt has 5000 tokens" in r.output, r.output
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3", "--max-new-tokens", "0"])
    assert r.exit_code == 1 and "--max-new-tokens" in r.output and "calibration" not in r.output, r.output


def test_run_and_calibrate_name_every_prompt_line_they_refuse(worded, tmp_path):
    """A prompts file with several bad lines was said one line a run (session 71's calibrate walk,
    7; h73a): the first refused line's error, then how many more are refused and which (3 at most
    named), in run and calibrate alike; nothing decoded."""
    import json

    from specrt.prompt_files import check_each

    f = tmp_path / "p.jsonl"
    good, long = json.dumps({"prompt": "w3 w1 w4"}), json.dumps({"prompt": "w1 " * 5000})
    f.write_text("\n".join([good, long, good, json.dumps({"prompt_ids": [1, 10000000]}), good]) + "\n")
    for cmd in (["run", str(worded), "--prompts", str(f), "--max-new-tokens", "4"],
                ["calibrate", str(worded), "--prompts", str(f), "--max-new-tokens", "4"]):
        r = CliRunner().invoke(main, cmd)
        assert r.exit_code == 1 and f"error: {f}:2: the prompt has 5000 tokens" in r.output \
            and r.output.endswith(f"; 1 more is refused too ({f}:4); no prompt was decoded\n"), r.output
        assert "w3" not in r.output and "prompt 1/" not in r.output, r.output  # (nothing decoded)
    # past 3 more, the rest counted; one refused alone is said as before
    def bad(p):
        if p <= 0:
            raise UserError(f"{p} is bad")
        return p

    with pytest.raises(UserError, match=r"^b: 0 is bad; 4 more are refused too \(c, d, e, \.\.\.\); no prompt was "
                                        "decoded$"):
        check_each([1, 0, 0, 0, 0, 0], bad, list("abcdef"))
    with pytest.raises(UserError, match=r"^a: -1 is bad; no prompt was decoded$"):
        check_each([-1, 1], bad, ["a", "b"])
    assert check_each([1, 2], bad, ["a", "b"]) == [1, 2]


def test_run_reuses_a_prompts_prefix_unless_told_not_to(worded, tmp_path):
    """`specrt run --prompts`: a prompt that begins as the one before reuses its KV rows
    (stats and the summary line say how many), with the output it has without reuse
    (`--no-prefix-reuse`)."""
    import json

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("w3 w1 w4 w1 w5 w9", "w3 w1 w4 w1 w5 w2 w6")))
    out, lines = {}, {}
    for flag in ((), ("--no-prefix-reuse",)):
        s = tmp_path / f"s{len(flag)}.json"
        r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "6", "--quiet",
                                      "--governor", "fixed:3", "--stats", str(s), *flag])
        assert r.exit_code == 0, r.output
        out[flag], lines[flag] = json.loads(s.read_text()), r.output
    reused = [p["prefix_reused"] for p in out[()]["prompts"]]
    assert reused[0] == 0 and reused[1] >= 5, reused
    assert f"{reused[1]} of {out[()]['prompt_tokens']} prompt tokens reused from the one before" in lines[()]
    assert [p["prefix_reused"] for p in out[("--no-prefix-reuse",)]["prompts"]] == [0, 0]
    assert "reused" not in lines[("--no-prefix-reuse",)]
    for st in out.values():  # time to the first token: each prompt's, and their mean
        firsts = [p["first_token_s"] for p in st["prompts"]]
        assert st["prompt_count"] == len(st["prompts"]) == 2 and all(0 < f <= p["seconds"] for f, p in zip(firsts, st["prompts"]))
        assert st["first_token_s"] == pytest.approx(sum(firsts) / 2)
    assert "first token after " in lines[()] and f", tau {out[()]['tau']:.2f}, governor fixed:3" in lines[()]
    assert [p["output_token_ids"] for p in out[()]["prompts"]] == \
        [p["output_token_ids"] for p in out[("--no-prefix-reuse",)]["prompts"]]


def test_the_python_api_names_its_own_parameters(worded, tmp_path):
    """Errors of the Python API named the CLI's options (``Session(governor="dpsark")``:
    "--governor 'dpsark'"); they name the governor as given, and a growth file by its path."""
    from specrt.runtime.session import Session

    for spec, want in (("dpsark", "expected one of"), ("fixed:9", "depth 9 is not built"),
                       ("auto:tree=3", "'auto' takes no ':tree=W'"), ("dspark:block=9", "block 9")):
        with pytest.raises(UserError) as e:
            Session(worded, governor=spec)
        assert str(e.value).startswith(f"governor '{spec}': ") and want in str(e.value) and "--" not in str(e.value)
        r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3", "--governor", spec])  # a command's words
        assert r.exit_code == 1 and f"error: --governor '{spec}': " in r.output and want in r.output, r.output
    with Session(worded, governor="off") as s, pytest.raises(UserError) as e:
        s.load_growth(tmp_path / "g.npz")
    assert str(e.value).startswith(f"{tmp_path / 'g.npz'}: governor 'off' has no session growth"), e.value
    with Session(worded, governor="off") as s:  # a numpy bool is a bool (ids and flags that came through numpy)
        assert "".join(s.stream("w3", chat=np.True_, max_new_tokens=2)) == "".join(s.stream("w3", chat=True,
                                                                                            max_new_tokens=2))
    with Session(worded, governor="off:ngram") as s:  # prompt lookup without :grow: no growth to save or load
        for io in (s.save_growth, s.load_growth):
            with pytest.raises(UserError, match="governor 'off:ngram' has no session growth"):
                io(tmp_path / "g.npz")


def test_the_python_api_takes_numpy_ids_and_refuses_bad_arguments_as_the_callers(worded):
    """A user walk's findings: an id outside the vocabulary at a prompt's end reached the
    tokenizer first (OverflowError); a list of numpy ints was read as a conversation;
    ``ort_overrides`` errors blamed the engines' engines.json; stats() after a refused stream
    showed the stream before's ids with no telemetry; bytes were taken as stop strings;
    stream() checked its arguments only when first read; "no" was a true flag."""
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3") as s:
        for ids, bad in (([1, -2, 3], -2), ([1, 2, 2**64], 2**64), (np.array([4, 99]), 99)):
            with pytest.raises(UserError, match=rf"^prompt token id {bad} is outside the vocabulary \[0, 16\)$"):
                "".join(s.stream(ids, max_new_tokens=3))
        want = "".join(s.stream([3, 1, 4], max_new_tokens=6, logprobs=2))
        ids = s.stats()["output_token_ids"]
        for form in ([np.int64(3), np.int32(1), 4], (np.int64(3), 1, np.uint8(4))):
            assert "".join(s.stream(form, max_new_tokens=6, logprobs=np.int64(2))) == want
            st = s.stats()
            assert st["prompt_ids"] == [3, 1, 4] and type(st["prompt_ids"][0]) is int and st["output_token_ids"] == ids
            assert len(st["output_logprobs"][0]["top_logprobs"]) == 2
        with pytest.raises(UserError, match="^the prompt is empty$"):
            "".join(s.stream([], max_new_tokens=3))
        with pytest.raises(UserError, match="a conversation must be"):  # a bool is no token id
            "".join(s.stream([True, 1], max_new_tokens=3))
        turn = {"role": "user", "content": "w4"}  # a conversation as a tuple, as a list (refused in session 52)
        assert "".join(s.stream((turn,), max_new_tokens=3)) == "".join(s.stream([turn], max_new_tokens=3)) != ""
        before = s.stats()
        with pytest.raises(UserError, match="max_new_tokens=0"):
            s.stream([3, 1, 4], max_new_tokens=0)  # refused when called, not when first read
        assert s.stats() == before  # refused before anything ran: the stream before's, whole
        for bad in (dict(chat="yes"), dict(max_new_tokens=-1), dict(logprobs=-1), dict(stop=b"w4")):
            with pytest.raises(UserError):
                s.stream([3, 1, 4], **bad)
        with pytest.raises(UserError, match=r"^chat='no': expected True or False$"):
            s.check_prompt("w3 w1", chat="no")
        with pytest.raises(UserError, match="max_new_tokens=0"):
            s.stream_ids([3, 1, 4], 0)  # refused by the decoding itself
        st = s.stats()  # the refused stream's: nothing, not the one before's ids
        assert st["prompt_ids"] == [] and st["output_token_ids"] == [] and st["new_tokens"] == 0
        for stop in (b"w4", bytearray(b"w4"), {"w4": 1}):
            with pytest.raises(UserError, match=r"^stop=.*: expected a string or a list of strings$"):
                "".join(s.stream([3, 1, 4], max_new_tokens=3, stop=stop))
    with pytest.raises(UserError, match="this Session is closed"):  # when called, as the other checks
        s.stream([3, 1, 4], max_new_tokens=3)
    for bad, why in (({"bogus": 1}, "bogus"), ({"intra_op_num_threads": "x"}, "intra_op_num_threads 'x'")):
        with pytest.raises(UserError) as e:
            Session(worded, ort_overrides=bad)
        msg = str(e.value)
        assert msg.startswith(f"ort_overrides={bad!r}: ") and why in msg and "engines.json" not in msg, msg
        # the settings' names where a name was unknown, not beside a bad value of a known one
        assert ("expected some of " in msg) == (why == "bogus")
        assert why != "bogus" or "intra_op_num_threads" in msg.split("expected some of ")[1]
    with pytest.raises(UserError, match=r"^ort_overrides=5: expected a dict of ONNX Runtime settings"):
        Session(worded, ort_overrides=5)
    with pytest.raises(UserError, match=r"^reuse_prefix='no': expected True or False$"):  # ("no" is true)
        Session(worded, reuse_prefix="no")
    with pytest.raises(UserError, match=r"^coupled='yes': expected True or False$"):
        SamplingParams(temperature=0.5, coupled="yes")


def test_stream_ids_takes_whole_token_ids_only(worded):
    """A user walk's findings: stream_ids read its ids with int(), so [1.7, 2.2] decoded as
    [1, 2], ["3", "1"] as [3, 1] and [True, 1] as [1, 1], stats()["prompt_ids"] showing them
    as given; a str, None or a conversation raised ValueError or TypeError with a traceback."""
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3") as s:
        want = [t for c in s.stream_ids([3, 1, 4], 5) for t in c]
        for bad, shown in (([3.0, 1, 4], "3.0"), ([3, "1", 4], "'1'"), ([True, 1, 4], "True"), ([3, None], "None"),
                           ([{"role": "user", "content": "w4"}], "{'role'")):
            with pytest.raises(UserError, match=rf"^prompt token id {re.escape(shown)}.* \(at \d\): expected an int"):
                s.stream_ids(bad, 5)
        for bad in ("w3 w1 w4", None, 5, np.array([[3, 1, 4]])):
            with pytest.raises(UserError, match=r"^prompt token (ids .*: expected a list of integers|id \[3, 1, 4\] )"):
                s.stream_ids(bad, 5)
        for form in (np.array([3, 1, 4]), (np.int32(3), 1, np.uint8(4))):
            assert [t for c in s.stream_ids(form, 5) for t in c] == want
            st = s.stats()
            assert st["prompt_ids"] == [3, 1, 4] and all(type(i) is int for i in st["prompt_ids"]), st["prompt_ids"]
        # stream's prompt neither text, a conversation nor ids (None said "the prompt is empty")
        for bad in (None, 5, {"role": "user"}):
            with pytest.raises(UserError, match=rf"^prompt {re.escape(repr(bad))}: expected text, a conversation"):
                next(s.stream(bad, max_new_tokens=3))


def test_a_session_refuses_pickling_and_copying_and_documents_its_arguments(worded):
    """A user walk's findings: pickle.dumps(session) failed naming an ONNX Runtime
    InferenceSession, and copy.copy made a second Session over the same engines and caches
    (closed with the first); help(Session) described none of its arguments."""
    import copy
    import inspect
    import pickle

    from specrt.runtime.session import Session

    with Session(worded, governor="off") as s:
        for how in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(UserError, match=r"^a Session cannot be pickled or copied .*in each process$"):
                how(s)
        assert "".join(s.stream("w3 w1 w4", max_new_tokens=3))  # the refusals left it working
    for name in list(inspect.signature(Session).parameters):
        assert f"``{name}``" in Session.__doc__, name
    for method in ("stream", "stream_ids", "stats", "close"):
        assert getattr(Session, method).__doc__, method


def test_a_session_refused_after_its_engines_started_releases_them(worded, monkeypatch):
    """Mutation round (session 64): Session() refused after it activated the engines (here
    ':corpus' asked for by name on engines without a corpus) releases them, as close() does:
    a caller that catches the error holds no ONNX Runtime sessions."""
    import specrt.engines.engine_set as engine_set
    from specrt.runtime.session import Session

    loaded, load = [], engine_set.load_engines
    monkeypatch.setattr(engine_set, "load_engines", lambda *a, **k: loaded.append(load(*a, **k)) or loaded[-1])
    with pytest.raises(UserError, match="^':corpus' needs "):
        Session(worded, governor="fixed:3:corpus")
    assert len(loaded) == 1 and not loaded[0].is_active


def test_a_growth_file_brings_back_the_grown_sequences_rates(worded, tmp_path):
    """Mutation round (session 64): load_growth restores the rates the saving session's rounds
    left for its grown sequences (save_growth writes them), not the priors a new session starts at."""
    from specrt.runtime.session import Session

    grow = tmp_path / "g.npz"
    with Session(worded, governor="fixed:3:ngram:grow") as s:
        for _ in range(3):  # (a prompt again: its earlier answer, grown, proposes)
            list(s.stream_ids([3, 1, 4], 16))
        s.save_growth(grow)
        p = s.generator.resolve_lookup()
        saved = {k: (list(p.wins[k]), list(p.tries[k])) for k in p.growth.source_priors() if k in p.wins}
    with Session(worded, governor="fixed:3:ngram:grow") as s:
        s.load_growth(grow)
        p = s.generator.resolve_lookup()
        fresh = {k: (list(p.wins[k]), list(p.tries[k])) for k in saved if k in p.wins}
    assert saved and fresh == saved, (saved, fresh)


def _blocked_writing(pid: int, timeout: float = 60) -> bool:
    """Whether process ``pid`` comes to wait on a full pipe within ``timeout`` seconds."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if "pipe_write" in Path(f"/proc/{pid}/wchan").read_text():
            return True
        time.sleep(0.05)
    return False


def _run_signalled_in_a_write(args: list[str], sig: str, stderr) -> tuple[int, bytes, bytes | None]:
    """`specrt ARGS` with its stdout a 4 KiB pipe read no further after 800 bytes (two answers
    at least, about 350 bytes each), so that it waits in a write, mid-answer or between
    answers, when signal ``sig`` comes; its exit code, all of its stdout and its stderr
    (``stderr``: subprocess.PIPE, or STDOUT to share stdout's pipe as a terminal)."""
    import fcntl
    import signal
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "from specrt.cli import entry; entry()", *args],
                         stdout=subprocess.PIPE, stderr=stderr, env={**os.environ, "SPECRT_THP": "0"},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        fcntl.fcntl(p.stdout, fcntl.F_SETPIPE_SZ, 4096)
        first = p.stdout.read(800)
        assert len(first) == 800
        assert _blocked_writing(p.pid)
        p.send_signal(getattr(signal, sig))
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    return p.returncode, first + out, err


@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="needs Linux's /proc/PID/wchan")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_run_interrupted_keeps_the_answered_prompts_stats_and_growth(worded, tmp_path, sig):
    """Ctrl-C (or SIGTERM) during `specrt run --prompts` lost every answered prompt's
    --stats and --grow-file. They are written with what was decoded: the answered prompts as
    an uninterrupted run gives them, the one cut short marked "interrupted" (its tokens a
    prefix of its whole answer), the stats' ``interrupted`` true; then "Aborted!", exit 1
    (SIGTERM: "Terminated", 143; a review found it wrote nothing then). Made deterministic:
    the run's stdout is a 4 KiB pipe read no further, so it waits in a write, mid-answer or
    between answers, when the signal comes."""
    import subprocess

    from specrt.runtime.session import Session

    f = tmp_path / "p.jsonl"
    n = 40
    f.write_text("".join(json.dumps({"prompt": f"w3 w1 w{4 + i % 12} w{4 + i % 5}"}) + "\n" for i in range(n)))
    whole = tmp_path / "whole.json"
    args = ["--prompts", str(f), "--max-new-tokens", "100", "--governor", "auto"]
    r = CliRunner().invoke(main, ["run", str(worded), *args, "--quiet", "--stats", str(whole)])
    assert r.exit_code == 0, r.output
    want = [p["output_token_ids"] for p in json.loads(whole.read_text())["prompts"]]
    stats, grow = tmp_path / "s.json", tmp_path / "g.npz"
    rc, _, err = _run_signalled_in_a_write(["run", str(worded), *args, "--stats", str(stats), "--grow-file", str(grow)],
                                           sig, subprocess.PIPE)
    err = err.decode()
    code, said = (1, "Aborted!") if sig == "SIGINT" else (143, "Terminated")
    assert rc == code and said in err and "Traceback" not in err, err
    st = json.loads(stats.read_text())
    got = st["prompts"]
    done = [g for g in got if g["finish_reason"] != "interrupted"]
    assert st["interrupted"] is True and 2 <= len(done) < n, err
    assert f"[interrupted: {len(done)} of {n} prompts answered" in err, err
    assert [g["output_token_ids"] for g in done] == want[:len(done)]
    assert len(got) - len(done) <= 1 and all(g["finish_reason"] == "interrupted" for g in got[len(done):])
    # "one cut short" exactly when a prompt was stopped mid-answer (not when the signal came between answers)
    assert (", one cut short" in err) == (len(got) > len(done)), err
    for g in got[len(done):]:  # the answer cut short: what it had decoded of its whole one
        assert g["output_token_ids"] == want[len(done)][:len(g["output_token_ids"])]
        assert 0 < len(g["output_token_ids"]) < len(want[len(done)])
    assert st["new_tokens"] == sum(len(g["output_token_ids"]) for g in got)
    assert f"{st['new_tokens']} tokens in " in err
    with Session(worded) as s:  # the growth saved: every answered prompt's sequence
        assert s.load_growth(grow) >= len(done)


def test_an_interrupt_just_after_an_answer_ended_keeps_its_finish(worded, tmp_path, monkeypatch):
    """A Ctrl-C landing after a prompt's answer ended but before the run recorded it (here: as
    the run asks for the answer's stats, the first time) records that answer as it finished
    ("length", answered in full), not "interrupted", and the closing line counts it answered
    with none cut short."""
    from specrt.runtime.session import Session

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "w3 w1 w4"}) + "\n" + json.dumps({"prompt": "w5 w6"}) + "\n")
    monkeypatch.setattr(Session, "stats", _raising_once(Session.stats, KeyboardInterrupt))
    out = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "3",
                                  "--governor", "fixed:1", "--stats", str(out)])
    assert r.exit_code == 1 and r.output.rstrip().endswith("Aborted!"), r.output
    assert "[interrupted: 1 of 2 prompts answered; --stats " in r.output and "cut short" not in r.output, r.output
    st = json.loads(out.read_text())
    assert st["interrupted"] is True and [p["finish_reason"] for p in st["prompts"]] == ["length"], st["prompts"]


def _first_of_two_answered_then_stopped(worded, tmp_path) -> dict:
    """`specrt run --prompts` of two prompts (3 tokens each, fixed:1) where the caller's patch
    stops the run as the first answer ends: its --stats, which must hold that answer alone."""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "w3 w1 w4"}) + "\n" + json.dumps({"prompt": "w5 w6"}) + "\n")
    out = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "3",
                                  "--governor", "fixed:1", "--stats", str(out)])
    assert r.exit_code == 1 and "[interrupted: 1 of 2 prompts answered; --stats " in r.output, r.output
    st = json.loads(out.read_text())
    assert [(p["finish_reason"], len(p["output_token_ids"])) for p in st["prompts"]] == [("length", 3)], st
    return st


def test_an_interrupt_as_an_answer_is_recorded_counts_its_tokens_once(worded, tmp_path, monkeypatch):
    """A Ctrl-C landing after run merged a finished answer's telemetry into the run's, before
    it recorded the answer (here: as the answer's stats are copied into its record, the first
    time): the answer is recorded once, as it finished, and its tokens counted once (mutation
    round: cut_short merging it again doubled the run's new_tokens)."""
    from specrt.runtime.session import Session

    class StoppedWhenCopied(dict):
        def __iter__(self):  # (a dict's own __iter__ would let {**d} copy it without keys())
            return super().__iter__()

        def keys(self):
            raise KeyboardInterrupt

    stats_of, calls = Session.stats, []

    def stats(self):
        calls.append(1)
        return StoppedWhenCopied(stats_of(self)) if len(calls) == 1 else stats_of(self)

    monkeypatch.setattr(Session, "stats", stats)
    assert _first_of_two_answered_then_stopped(worded, tmp_path)["new_tokens"] == 3


def test_an_interrupt_as_an_answer_is_merged_counts_its_tokens_once(worded, tmp_path, monkeypatch):
    """A Ctrl-C landing right after run merged a finished answer's telemetry into the run's,
    before it marked the answer merged (here: as the merge returns, the first time): its
    tokens are counted once (the merge and its mark were two steps, and cut_short merged it
    again: new_tokens 6 for one answer of 3; the merge goes into a copy now, which takes the
    run's place with the mark in one step)."""
    from specrt.runtime.telemetry import Telemetry

    merge_of, calls = Telemetry.merge, []

    def merge(self, other):
        merge_of(self, other)
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(Telemetry, "merge", merge)
    assert _first_of_two_answered_then_stopped(worded, tmp_path)["new_tokens"] == 3 and len(calls) == 2, calls


@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="needs Linux's /proc/PID/wchan")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupt_mid_answer_is_said_on_a_line_of_its_own_after_the_summary(worded, tmp_path, sig):
    """SIGTERM in the middle of an answer said "Terminated" at once, on the answer's line of
    a terminal and before the run's summary (session 56's chat walk); it is said last, on a
    line of its own, as click says "Aborted!" for Ctrl-C. stdout and stderr share one 4 KiB
    pipe here, as they share a terminal, read no further until the run waits in a write."""
    import subprocess

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"w3 w1 w{4 + i % 12}"}) + "\n" for i in range(40)))
    rc, out, _ = _run_signalled_in_a_write(["run", str(worded), "--prompts", str(f), "--max-new-tokens", "100"], sig,
                                           subprocess.STDOUT)
    lines = out.decode().splitlines()
    code, said = (1, "Aborted!") if sig == "SIGINT" else (143, "Terminated")
    assert rc == code and lines[-1] == said and lines[-2] == "", lines[-6:]  # (a line of its own, as click's)
    summary = [i for i, ln in enumerate(lines) if ln.startswith("[interrupted: ")]
    assert len(summary) == 1 and said not in "\n".join(lines[:-1]), lines[-6:]


def _raising_once(original, raised, calls: list | None = None):
    """``original`` (a function, or a method taken from its class) raising ``raised`` at its
    first call, as a stop landing there, and running as itself after; ``calls`` counts them."""
    calls = [] if calls is None else calls

    def once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise raised
        return original(*args, **kwargs)
    return once


@pytest.mark.parametrize("signal", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("where", ["closing line", "stats write", "growth write"])
def test_an_interrupt_after_the_last_answer_still_writes_stats_and_growth(worded, tmp_path, monkeypatch, where,
                                                                          signal):
    """Ctrl-C or SIGTERM landing after a run's last answer, in its closing line or in one of
    its writes, left neither --stats nor --grow-file written (a stale one kept), "Aborted!"
    alone (session 55's interruption walk): both are written whole, and it says the run had
    ended."""
    import specrt.cli as cli
    import specrt.paths as paths
    from specrt.runtime.session import Session

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"w3 w{4 + i}"}) + "\n" for i in range(3)))
    stats, grow = tmp_path / "s.json", tmp_path / "g.npz"
    stats.write_text('{"stale": true}')
    real = {"closing line": (cli, "_run_closing_lines"), "stats write": (paths, "write_atomic"),
            "growth write": (Session, "save_growth")}[where]
    # (SIGTERM: cli._terminated's SystemExit(143))
    monkeypatch.setattr(*real, _raising_once(getattr(*real), KeyboardInterrupt if signal == "SIGINT" else
                                             SystemExit(143)))
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "5", "--quiet",
                                  "--stats", str(stats), "--grow-file", str(grow)])
    assert (r.exit_code, "Aborted!" in r.output) == ((1, True) if signal == "SIGINT" else (143, False)), r.output
    assert f"[interrupted after all 3 prompts were answered; --stats {stats} and --grow-file {grow} hold them]" in r.output
    st = json.loads(stats.read_text())
    assert st["interrupted"] is False and len(st["prompts"]) == 3 and st["new_tokens"] == 15
    monkeypatch.undo()
    with Session(worded) as s:
        assert s.load_growth(grow) >= 3


def test_a_run_cut_short_and_interrupted_again_in_its_write_does_not_say_it_ended(worded, tmp_path, monkeypatch):
    """A run stopped mid-prompt writes what it decoded; a second interrupt in that write lets
    it be written (once again), and the run is not said to have answered all its prompts."""
    import specrt.paths as paths
    from specrt.runtime.session import Session

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"w3 w{4 + i}"}) + "\n" for i in range(3)))
    stats = tmp_path / "s.json"
    stream, write, seen, writes = Session.stream, paths.write_atomic, [], []

    def cut_at_the_second(self, *args, **kwargs):
        seen.append(1)
        for piece in stream(self, *args, **kwargs):
            if len(seen) == 2:
                raise KeyboardInterrupt
            yield piece

    monkeypatch.setattr(Session, "stream", cut_at_the_second)
    monkeypatch.setattr(paths, "write_atomic", _raising_once(write, KeyboardInterrupt, writes))
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "5", "--quiet",
                                  "--stats", str(stats)])
    assert r.exit_code == 1 and "[interrupted: 1 of 3 prompts answered" in r.output, r.output
    assert "after all" not in r.output and json.loads(stats.read_text())["interrupted"] is True, r.output


def test_run_without_stats_keeps_no_prompt_s_stats(worded, tmp_path, monkeypatch):
    """`specrt run --prompts` without --stats kept every prompt's stats (its ids, histograms,
    timings: 5-9 KB a prompt, 0.5-0.9 GB over 100k prompts) for nothing (session 71's F5, h73b):
    without --stats the run keeps a prompt's finish alone, one shared record a finish, and
    says the same closing counts; with --stats every prompt's whole stats, as before. A
    Ctrl-C in the second answer still counts the one answered and the one cut short."""
    import specrt.cli as cli
    from specrt.runtime.session import Session

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"w3 w1 w{4 + i}"}) + "\n" for i in range(6)))
    summary, kept = cli._run_summary, []

    def keeping(s, engines_dir, governor, total, per_prompt, *args, **kwargs):  # (what the run kept, then its summary)
        kept.append((total.new_tokens, list(per_prompt)))
        return summary(s, engines_dir, governor, total, per_prompt, *args, **kwargs)

    monkeypatch.setattr(cli, "_run_summary", keeping)
    stats = tmp_path / "s.json"
    args = ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "5", "--governor", "fixed:1", "--quiet"]
    for extra in (["--stats", str(stats)], []):
        r = CliRunner().invoke(main, args + extra)
        assert r.exit_code == 0 and f"[{kept[-1][0]} tokens in " in r.output, r.output
    (n_whole, whole), (n_bare, bare) = kept
    assert n_bare == n_whole == 30 and len(whole) == len(bare) == 6
    assert [p["prompt"] for p in whole] == [f"w3 w1 w{4 + i}" for i in range(6)] and whole[0]["output_token_ids"]
    assert [p["finish_reason"] for p in bare] == [p["finish_reason"] for p in whole] == ["length"] * 6
    assert all(p == {"finish_reason": "length"} for p in bare) and len({id(p) for p in bare}) == 1, bare
    stream, seen = Session.stream, []

    def cut_in_the_second(self, *args, **kwargs):  # (after its first piece)
        seen.append(1)
        for piece in stream(self, *args, **kwargs):
            yield piece
            if len(seen) == 2:
                raise KeyboardInterrupt

    monkeypatch.setattr(Session, "stream", cut_in_the_second)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "[interrupted: 1 of 6 prompts answered, one cut short]" in r.output, r.output
    assert kept[-1][1] == [{"finish_reason": "length"}, {"finish_reason": "interrupted"}], kept[-1]


def test_a_run_stopped_while_it_prints_an_answer_closes_its_stream_before_the_files(worded, tmp_path, monkeypatch):
    """A Ctrl-C landing as run prints a piece of its second answer (the stream waiting at its
    yield, not raising itself) closes the stream before --stats and --grow-file are written:
    the growth holds the answer cut short besides the one before (mutation round: without the
    close, the stream stayed open until the command returned, after the write, and the growth
    lacked the answer)."""
    import click

    from specrt.runtime.session import Session

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"w3 w1 w{4 + i}"}) + "\n" for i in range(3)))
    stats, grow = tmp_path / "s.json", tmp_path / "g.npz"
    echo, ends, stopped = click.echo, [], []

    def echo_stopping_the_second_answer(message=None, file=None, nl=True, err=False, color=None):
        if message is None and not err:  # an answer's line ended, or the blank line between answers
            ends.append(1)
        elif not nl and not err and len(ends) == 2 and not stopped:  # the second answer's first piece
            stopped.append(message)
            raise KeyboardInterrupt
        return echo(message, file, nl, err, color)

    monkeypatch.setattr(click, "echo", echo_stopping_the_second_answer)
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "6",
                                  "--stats", str(stats), "--grow-file", str(grow)])
    monkeypatch.undo()
    assert r.exit_code == 1 and stopped and "[interrupted: 1 of 3 prompts answered, one cut short" in r.output, r.output
    st = json.loads(stats.read_text())
    assert [p["finish_reason"] for p in st["prompts"]] == ["length", "interrupted"], st["prompts"]
    with Session(worded) as s:  # the first answer's sequence and the one cut short
        assert s.load_growth(grow) == 2


def test_a_run_stopped_inside_the_decoding_records_the_answer_interrupted(worded, tmp_path, monkeypatch):
    """A Ctrl-C landing inside the decoding (in ONNX Runtime, where a run spends its time: the
    KeyboardInterrupt leaves the generator ended with no finish of its own) after the first
    piece: the answer so far is recorded with finish_reason "interrupted" (mutant m71b-30:
    "error", as an engine failure's)."""
    from specrt.runtime.generate import Generator

    full, calls = Generator._full, []

    def stopping(self):  # (asked as each round's chunk is yielded: the third, inside the decoding)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return full(self)

    monkeypatch.setattr(Generator, "_full", stopping)
    stats = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1 w4", "--max-new-tokens", "20",
                                  "--governor", "fixed:1", "--stats", str(stats)])
    monkeypatch.undo()
    assert r.exit_code == 1 and len(calls) == 3, r.output
    assert "[interrupted: 0 of 1 prompts answered, one cut short" in r.output, r.output
    st = json.loads(stats.read_text())
    assert st["interrupted"] is True and [p["finish_reason"] for p in st["prompts"]] == ["interrupted"], st["prompts"]
    assert 0 < len(st["prompts"][0]["output_token_ids"]) < 20


def test_run_chat_wraps_each_text_prompt_of_a_prompts_file_as_it_wraps_prompt(worded, tmp_path):
    """`run --prompts FILE --chat`: each text line goes through the chat template, as --prompt
    TEXT --chat's does (the lines are checked and encoded before decoding, and those ids are
    what is decoded: mutant m71b-107, the lines encoded without the template, decoded them bare)."""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "w3 w1 w4"}) + "\n")

    def first(*args):
        stats = tmp_path / "s.json"
        r = CliRunner().invoke(main, ["run", str(worded), *args, "--max-new-tokens", "4", "--governor", "off",
                                      "--quiet", "--stats", str(stats)])
        assert r.exit_code == 0, r.output
        return json.loads(stats.read_text())["prompts"][0]

    chat, bare = first("--prompt", "w3 w1 w4", "--chat"), first("--prompt", "w3 w1 w4")
    assert chat["prompt_tokens"] > bare["prompt_tokens"]  # (the template's turn around the text)
    got = first("--prompts", str(f), "--chat")
    assert (got["prompt_tokens"], got["output_token_ids"]) == (chat["prompt_tokens"], chat["output_token_ids"])


def test_a_conversation_goes_through_the_chat_template(worded, tmp_path):
    """A prompt file's ``messages`` (a system prompt, earlier turns) are rendered with the
    exported chat template, with or without --chat; a conversation that goes on from the
    one before reuses its rows; a malformed one is refused naming the line."""
    from specrt.runtime.text import Text

    text = Text(worded / "export")
    conv = [{"role": "system", "content": "w5"}, {"role": "user", "content": "w6 w7"}]
    assert text.encode(conv, chat=False) == [3, 5, 1, 6, 7, 2]
    assert text.encode("w6 w7", chat=True) == [1, 6, 7, 2] and text.encode("w6 w7", chat=False) == [6, 7]
    more = conv + [{"role": "assistant", "content": "w8 w9"}, {"role": "user", "content": "w10"}]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(o) + "\n" for o in ({"messages": conv}, {"messages": more}, {"prompt": "w4"})))
    s = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "4", "--quiet",
                                  "--governor", "fixed:1", "--stats", str(s)])
    assert r.exit_code == 0, r.output
    st = json.loads(s.read_text())["prompts"]
    assert [p["prompt_ids"] for p in st] == [[3, 5, 1, 6, 7, 2], [3, 5, 1, 6, 7, 2, 8, 9, 1, 10, 2], [4]]
    assert st[0]["prompt"] == conv and st[1]["prefix_reused"] == 6
    for bad, said in (([], "a conversation must be a non-empty list"), ("w1", "a conversation must be"),
                      ([{"role": "user"}], "messages[0]: expected an object with a string 'role' and a string"),
                      ([{"role": "user", "content": "w1"}, {"role": 1, "content": "w1"}], "messages[1]: expected")):
        f.write_text(json.dumps({"prompt": "w1"}) + "\n" + json.dumps({"messages": bad}) + "\n")
        r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--quiet"])
        assert r.exit_code == 1 and f"{f}:2: 'messages': {said}" in r.output, (bad, r.output)
        assert "Traceback" not in r.output


def test_prompt_files_take_ids_then_messages_then_text(tmp_path):
    from specrt.errors import UserError
    from specrt.prompt_files import prompts_of, read_prompt_file

    conv = [{"role": "user", "content": "hi"}]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps(o) + "\n" for o in (
        {"prompt_ids": [1, 2], "messages": conv, "prompt": "a"}, {"messages": conv, "prompt": "a"}, {"prompt": "a"})))
    assert prompts_of(read_prompt_file(f)) == [[1, 2], conv, "a"]
    f.write_text(json.dumps({"prompt_ids": [1, 2]}) + "\n")
    with pytest.raises(UserError, match=r"p.jsonl:1: expected an object with a string field 'prompt' or a conversation"):
        read_prompt_file(f, allow_ids=False)


def test_prompt_files_split_lines_at_newlines_only(tmp_path):
    """JSON Lines end at "\\n": a prompt holding U+2028, U+2029 or U+0085 unescaped (valid
    JSON, as json.dumps(ensure_ascii=False) writes it) is one line, not two broken ones."""
    from specrt.prompt_files import read_prompt_file

    texts = ["one\u2028two", "three\u2029four", "five\x85six", "plain"]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    assert [o["prompt"] for o in read_prompt_file(f)] == texts
    # a byte-order mark first, as Windows tools save UTF-8, plain or gzipped (it was "not a JSON line")
    import gzip

    body = "".join(json.dumps({"prompt": t}) + "\n" for t in texts)
    f.write_text("\ufeff" + body, encoding="utf-8")
    g = tmp_path / "p.jsonl.gz"
    g.write_bytes(gzip.compress(("\ufeff" + body).encode()))
    assert [o["prompt"] for o in read_prompt_file(f)] == [o["prompt"] for o in read_prompt_file(g)] == texts


def test_a_corrupt_gzip_prompt_file_is_a_user_error(tmp_path):
    """A .gz whose compressed data is damaged (zlib's error, not an OSError) is said, naming
    the file: no traceback."""
    import gzip

    from specrt.errors import UserError
    from specrt.prompt_files import read_prompt_file

    data = "".join(json.dumps({"prompt": f"question {i} " + "x" * (i % 50)}) + "\n" for i in range(2000))
    g = bytearray(gzip.compress(data.encode()))
    for i in range(200, 260):
        g[i] ^= 0x5A
    f = tmp_path / "p.jsonl.gz"
    f.write_bytes(bytes(g))
    with pytest.raises(UserError, match=r"p.jsonl.gz: cannot read the prompts"):
        read_prompt_file(f)


def test_a_json_line_nested_past_the_recursion_limit_is_a_user_error(tmp_path):
    from specrt.errors import UserError
    from specrt.prompt_files import read_prompt_file

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "hi"}) + "\n" + '{"prompt": "hi", "x": ' + "[" * 100000 + "]" * 100000 + "}\n")
    with pytest.raises(UserError, match=r"p.jsonl:2: not a JSON line \(nested too deeply"):
        read_prompt_file(f)
    # a number past Python's digit limit for int (4300): json's ValueError was a traceback
    f.write_text(json.dumps({"prompt": "hi"}) + "\n" + '{"prompt_ids": [' + "9" * 5000 + "]}\n")
    with pytest.raises(UserError, match=r"p.jsonl:2: not a JSON line \(a number of 5000 digits, past the 4300 Python reads\)$"):
        read_prompt_file(f)


def test_the_digit_limit_is_said_in_words_in_either_pythons_wording():
    """h79f: Python 3.10 says "Exceeds the limit (4300) ...", 3.11 on "the limit (4300 digits)";
    json_problem read only the latter, so on 3.10 the user got Python's advice to call
    sys.set_int_max_str_digits(). Both messages as the interpreters word them (the one this
    interpreter gives is the real json.loads error, the other its text)."""
    from specrt.errors import json_problem

    with pytest.raises(ValueError) as real:
        json.loads("[" + "9" * 5000 + "]")
    tail = " for integer string conversion: value has 5000 digits; use sys.set_int_max_str_digits() to increase the limit"
    for e in (real.value, ValueError("Exceeds the limit (4300)" + tail),
              ValueError("Exceeds the limit (4300 digits)" + tail)):
        assert json_problem(e) == "a number of 5000 digits, past the 4300 Python reads", str(e)


def test_chat_keeps_the_conversation_and_reuses_it(worded):
    """`specrt chat`: each input line is a user turn after the system prompt and the turns
    before (their answers included), which the next turn's prompt reuses; the answers are
    what `specrt run` gives for the same conversations; an empty line ends it."""
    from specrt.runtime.session import Session

    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "w5", "--max-new-tokens", "3", "--governor",
                                  "fixed:1"], input="w6 w7\nw8\n\nw9\n")
    assert r.exit_code == 0, r.output
    turns = [ln for ln in r.output.splitlines() if ln.startswith("[")]
    assert len(turns) == 2 and "0 of 6 prompt tokens reused" in turns[0], r.output
    assert "of " in turns[1] and not turns[1].split("; ")[1].startswith("0 of"), turns
    answers = [ln.removeprefix("> ") for ln in r.output.splitlines() if not ln.startswith(("[", "note: ")) and ln.strip("> ")]
    conv = [{"role": "system", "content": "w5"}, {"role": "user", "content": "w6 w7"}]
    with Session(worded, governor="fixed:1") as s:
        first = "".join(s.stream(conv, max_new_tokens=3))
        conv += [{"role": "assistant", "content": first}, {"role": "user", "content": "w8"}]
        second = "".join(s.stream(conv, max_new_tokens=3))
    assert answers == [first, second], (answers, r.output)


def _ctrl_c_before_answer(monkeypatch, turn: int) -> list[list[dict]]:
    """Session.stream raising KeyboardInterrupt where the ``turn``-th (from 1) answer's first
    token would be read; returns the conversations streamed, filled as they come. (Chat streams
    the ids of the conversation it measured last, r74: that conversation is recorded, its ids
    checked to be those streamed.)"""
    from specrt.runtime import session

    real, convs, text, measured = session.Session.stream, [], session.Session.prompt_text, []

    def prompt_text(self, prompt, *a, **k):
        measured[:] = [prompt]
        return text(self, prompt, *a, **k)

    def stream(self, prompt, *a, **k):
        conversation = measured[0]
        assert self.encode(conversation, True) == list(prompt)
        convs.append([dict(m) for m in conversation])
        it = real(self, prompt, *a, **k)
        if len(convs) != turn:
            return it

        def cut():
            it.close()
            raise KeyboardInterrupt
            yield  # (a generator, as Session.stream's)
        return cut()

    monkeypatch.setattr(session.Session, "stream", stream)
    monkeypatch.setattr(session.Session, "prompt_text", prompt_text)
    return convs


def test_chat_stopped_before_the_first_token_drops_the_turn(worded, monkeypatch):
    """Ctrl-C in `specrt chat` before an answer's first token printed a line of zeros and
    kept the turn with an empty answer in the conversation. The turn is dropped, as if not
    asked, and the chat goes on. (The Ctrl-C is raised where the first token would be read:
    a signal's timing cannot place it there.)"""
    convs = _ctrl_c_before_answer(monkeypatch, 1)
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "w5", "--max-new-tokens", "3", "--governor",
                                  "fixed:1"], input="w6 w7\nw8\n\n")
    assert r.exit_code == 0, r.output
    # (no turns were dropped for it: none said to be back)
    assert ("[stopped before the answer began: the turn is dropped; an empty line or the end of input ends the "
            "conversation]") in r.output, r.output
    assert "[0 tokens" not in r.output and len([ln for ln in r.output.splitlines() if ln.startswith("[3 tokens")]) == 1
    assert convs[1] == [{"role": "system", "content": "w5"}, {"role": "user", "content": "w8"}]


def test_chat_stopped_before_the_first_token_gives_back_the_turns_dropped_for_it(worded, monkeypatch):
    """A turn that pushed the oldest out of the context (128 tokens here) and was stopped
    before its answer began is not taken: the turn it pushed out is back in the conversation
    (the message said they "stay", read as staying dropped: a review)."""
    convs = _ctrl_c_before_answer(monkeypatch, 3)
    long = " ".join(["w4"] * 50)
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "w5", "--max-new-tokens", "4", "--governor",
                                  "fixed:1"], input=f"{long}\n{long} w6\n{long} w7\nw8\n\n")
    assert r.exit_code == 0, r.output
    # (both older turns: once dropping, a quarter of the context is freed besides)
    assert "[dropped the oldest 2 turn(s) to fit the context of 128 tokens]" in r.output, r.output
    assert "the turn is dropped (the 2 older turn(s) dropped to fit it are back)" in r.output, r.output
    assert [m["content"] for m in convs[2] if m["role"] == "user"] == [f"{long} w7"]
    assert [m["content"] for m in convs[3] if m["role"] == "user"] == [long, f"{long} w6", "w8"]


def test_chat_stopped_mid_answer_keeps_what_was_printed_and_goes_on(worded, monkeypatch):
    """Ctrl-C in `specrt chat` after an answer's first piece was printed (here: as its second
    is printed) stops that answer, not the chat: its line ends on stdout, with the answer's
    text, the note goes to stderr, and the next turn's conversation holds the answer so far
    as the assistant's (mutation round: the path had no test)."""
    import click

    convs = _ctrl_c_before_answer(monkeypatch, 0)  # (turn 0: records every conversation, stops none)
    echo, pieces = click.echo, []

    def echo_stopping_the_first_answer(message=None, file=None, nl=True, err=False, color=None):
        if message and not nl and not err:  # a piece of an answer
            pieces.append(message)
            if len(pieces) == 2:
                raise KeyboardInterrupt
        return echo(message, file, nl, err, color)

    monkeypatch.setattr(click, "echo", echo_stopping_the_first_answer)
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "w5", "--max-new-tokens", "4", "--governor",
                                  "off"], input="w6 w7\nw8\n\n")
    monkeypatch.undo()
    assert r.exit_code == 0 and len(pieces) >= 3, r.output
    assert "[stopped: the answer so far stays in the conversation" in r.stderr, r.stderr
    assert r.stdout.splitlines() == [pieces[0], "".join(pieces[2:])], (r.stdout, pieces)
    assert convs[1] == [{"role": "system", "content": "w5"}, {"role": "user", "content": "w6 w7"},
                        {"role": "assistant", "content": pieces[0]}, {"role": "user", "content": "w8"}], convs
    # the stopped answer's stats line, then the next one's (its 4 tokens)
    stats = [ln for ln in r.stderr.splitlines() if re.match(r"\[\d+ tokens, ", ln)]
    assert len(stats) == 2 and stats[1].startswith("[4 tokens"), r.stderr


def test_chat_refuses_before_its_first_prompt_what_no_turn_could_get_past(worded, tmp_path,  # noqa: F811
                                                                         monkeypatch):
    """A system prompt that leaves no room for a turn and its answer skipped every turn, one
    by one, exit 0; engines without a tokenizer showed "> " and failed on the first line (a
    user walk). Both refused before the prompt is shown (to someone typing: the marker's
    test says so, CliRunner's stdin is no terminal)."""
    import specrt.cli as cli
    from specrt.engines.build import build_engines
    from specrt.export.export import export

    monkeypatch.setattr(cli, "_prompting", lambda: True)

    long = " ".join(["w4"] * 126)  # 128 tokens of context
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", long, "--governor", "fixed:1"], input="w6\n\n")
    assert r.exit_code == 1 and "> " not in r.output, r.output
    assert "error: --system: with an empty turn the system prompt makes a prompt of " in r.output
    assert "the engines' context of 128 tokens leaves no room for a turn and its answer" in r.output
    # at the edge: 124 words make a prompt of 127 tokens with an empty turn, room for its first token
    # but not a round after it (a mutant allowing one fewer survived, session 54)
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", " ".join(["w4"] * 124), "--governor", "fixed:1"],
                           input="w6\n\n")
    assert r.exit_code == 1 and "makes a prompt of 127 tokens" in " ".join(r.output.split()), r.output
    # one that leaves a turn room is taken, its answer cut at the context (a review: 100 words were refused
    # for want of room for a whole --max-new-tokens answer, which the turns never needed)
    for words in (60, 100):
        r = CliRunner().invoke(main, ["chat", str(worded), "--system", " ".join(["w4"] * words), "--governor",
                                      "fixed:1", "--max-new-tokens", "32"], input="w6\n\n")
        assert r.exit_code == 0 and "tok/s" in r.output and "skipped" not in r.output, r.output
    ref = Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny"
    export(ref / "verifier", ref / "draft", tmp_path / "x")
    build_engines(tmp_path / "x", "onnxruntime", (1,), tmp_path / "e", profile_repeats=1, log=lambda s: None)
    r = CliRunner().invoke(main, ["chat", str(tmp_path / "e"), "--governor", "fixed:1"], input="w6\n\n")
    assert r.exit_code == 1 and "> " not in r.output and "no tokenizer.json" in r.output, r.output


def test_run_names_the_prompt_files_line_of_an_error_raised_while_it_decodes(tmp_path):
    """An error raised while a `--prompts` line decodes (here an engine's non-finite logits: a
    target whose lm_head row for w5 is +-3e38, finite, so the export takes it, overflowing in
    every call) names the file and the line the prompt stands on, not its index among the
    prompts: blank lines are passed over (mutation round of session 59). The prefill's row is
    checked too: its argmax (w5, +inf) was printed as the first token before the next step's
    check raised."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    def poisoned(t):
        _words(t)
        w = load_file(str(t / "model.safetensors"))
        row = np.full(w["lm_head.weight"].shape[1], 3e38, np.float32)
        row[1::2] *= -1
        w["lm_head.weight"][5] = row
        w["model.norm.weight"] = w["model.norm.weight"] * 10
        save_file(w, str(t / "model.safetensors"), metadata={"format": "pt"})

    eng = _tiny_text_pair(tmp_path, 16, 12, poisoned)
    f = tmp_path / "p.jsonl"
    f.write_text("\n" + json.dumps({"prompt": "w3 w1 w4"}) + "\n")
    r = CliRunner().invoke(main, ["run", str(eng), "--prompts", str(f), "--governor", "off", "--max-new-tokens", "4"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert re.fullmatch(rf"error: {re.escape(str(f))}:2: target engine produced (NaN|\+inf) logits in row 0 of its "
                        r"call, 0 token\(s\) into the answer \(float32 engines: weights whose sums overflow "
                        r"float32, or engines changed since their build\? "
                        rf"`specrt compare {re.escape(str(eng))}` checks them against the export\)",
                        " ".join(r.output.split())), r.output


def _overflowing_head(t) -> None:
    """``_words``, and a target whose lm_head row for w5 is +3e38 everywhere (finite, so the
    export takes it) with a final norm 10x: w5's logit overflows to +inf wherever the normed
    hidden state's sum is positive, and is a huge negative (never picked) elsewhere, so the
    engines fail at some step of an answer and not before it."""
    from safetensors.numpy import load_file, save_file

    _words(t)
    w = load_file(str(t / "model.safetensors"))
    w["lm_head.weight"][5] = np.float32(3e38)
    w["model.norm.weight"] = w["model.norm.weight"] * 10
    save_file(w, str(t / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory):
    """(engines, prompts) on the tiny pair of ``_overflowing_head``: a real engine failure
    mid-answer. ``prompts[chat, mid]``: a raw prompt (chat False) or a user turn whose answer
    fails after a piece or more (mid True) or at its prefill (mid False)."""
    from specrt.errors import EngineFailure
    from specrt.runtime.session import Session

    eng = _tiny_text_pair(tmp_path_factory.mktemp("overflowing"), 16, 12, _overflowing_head)
    found: dict[tuple[bool, bool], str] = {}
    with Session(eng, governor="off") as s:
        for p in [f"w{a} w{b}" for a in range(16) for b in range(16) if 5 not in (a, b)]:
            for chat in (False, True):
                pieces = []
                with pytest.raises(EngineFailure, match=r"target engine produced \+inf logits"):
                    for piece in s.stream([{"role": "user", "content": p}] if chat else p, max_new_tokens=20):
                        pieces.append(piece)
                found.setdefault((chat, bool(pieces)), p)
            if len(found) == 4:
                return eng, found
    pytest.fail(f"not every kind of prompt found: {found}")


def test_run_keeps_what_was_decoded_before_an_engine_failure(overflowing, tmp_path):
    """An engine failure in `specrt run --prompts` keeps the answers before it in --stats, as a
    Ctrl-C does (they were lost: a failure at prompt 60 of 80 wrote nothing): ``failed`` holds
    the error, a prompt cut short has finish_reason "error"; exit 1 with the error said last.
    A run that decoded nothing writes nothing."""
    eng, prompts = overflowing
    f, stats = tmp_path / "p.jsonl", tmp_path / "st.json"
    mid, first = prompts[False, True], prompts[False, False]

    def run(lines: list[str], n: int):
        f.write_text("".join(json.dumps({"prompt": x}) + "\n" for x in lines))
        r = CliRunner().invoke(main, ["run", str(eng), "--prompts", str(f), "--governor", "off", "--max-new-tokens",
                                      str(n), "--stats", str(stats)])
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        assert r.output.splitlines()[-1].startswith(f"error: {f}:{len(lines)}: target engine produced +inf"), r.output
        # no line of its own ended where no answer began (a blank line between answers only)
        assert not r.output.startswith("\n") and "\n\n\n" not in r.output, r.output
        return r.output

    out = run([mid, first], 1)  # the first answered in full (one token), the second failing at its prefill
    st = json.loads(stats.read_text())
    assert st["failed"].startswith(f"{f}:2: target engine produced +inf") and st["interrupted"] is False, st
    assert [(p["prompt"], p["finish_reason"], len(p["output_token_ids"])) for p in st["prompts"]] == [(mid, "length", 1)]
    assert st["new_tokens"] == 1 and f"[failed: 1 of 2 prompts answered; --stats {stats} holds what was decoded]" in out
    out = run([mid], 20)  # cut short after a token or more
    st = json.loads(stats.read_text())
    (p,) = st["prompts"]
    assert p["finish_reason"] == "error" and len(p["output_token_ids"]) == st["new_tokens"] >= 1, st
    assert p["prompt"] == mid, p  # (the prompt as the file gives it, not the ids it was checked as)
    assert "[failed: 0 of 1 prompts answered, one cut short;" in out and st["failed"].startswith(f"{f}:1: "), out
    stats.unlink()
    run([first], 20)  # nothing decoded: nothing written
    assert not stats.exists()


def test_a_stop_in_an_engine_failures_summary_keeps_the_failure(overflowing, tmp_path, monkeypatch):
    """Ctrl-C landing in the closing lines of a run an engine failure ended: the files are
    written once, saying the failure (the stop's own summary wrote them again over it, as
    interrupted with no error), then "Aborted!"."""
    import specrt.cli as cli

    eng, prompts = overflowing
    f, stats = tmp_path / "p.jsonl", tmp_path / "st.json"
    f.write_text("".join(json.dumps({"prompt": x}) + "\n" for x in (prompts[False, True], prompts[False, False])))
    calls: list[int] = []
    monkeypatch.setattr(cli, "_run_closing_lines", _raising_once(cli._run_closing_lines, KeyboardInterrupt, calls))
    r = CliRunner().invoke(main, ["run", str(eng), "--prompts", str(f), "--governor", "off", "--max-new-tokens", "1",
                                  "--stats", str(stats)])
    assert r.exit_code == 1 and "Aborted!" in r.output and len(calls) == 1, r.output
    st = json.loads(stats.read_text())
    assert st["failed"].startswith(f"{f}:2: target engine produced +inf") and st["interrupted"] is False, st
    assert [p["finish_reason"] for p in st["prompts"]] == ["length"], st["prompts"]


@pytest.mark.parametrize("kind, confidence_head", [("peagle", False), ("peagle", True), ("eagle3", False)])
def test_a_draft_giving_inf_logits_fails_under_every_governor(tmp_path, kind, confidence_head):
    """A draft whose logits overflow (its lm_head +3e38 everywhere: finite, so the export takes
    it) is an EngineFailure naming the draft under every drafting governor, greedy or sampled,
    with or without a confidence head, P-EAGLE or EAGLE-3 (its steps take the maxima apart).
    Greedy decoding at a fixed depth went on with the garbage drafts (tau 1, numpy's
    RuntimeWarning printed) where DSpark and sampling raised; decoding without speculation
    never runs the draft, and is unchanged."""
    import warnings

    from safetensors.numpy import load_file, save_file

    from specrt.engines import build_engines
    from specrt.errors import EngineFailure
    from specrt.export.export import export
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import Session
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    _words(t)
    d = write_tiny_draft(tmp_path / "d", t, kind=kind, num_layers=1, draft_vocab=12, mask_token_id=15,
                         confidence_head=confidence_head)
    w = load_file(str(d / "model.safetensors"))
    w["lm_head.weight"] = np.full_like(w["lm_head.weight"], 3e38)
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    export(t, d, tmp_path / "exp")
    build_engines(tmp_path / "exp", "onnxruntime", (1, 3), tmp_path / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=128)
    with Session(tmp_path / "eng", governor="off") as s:
        assert sum(len(c) for c in s.stream_ids([3, 1, 4], 6)) == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no RuntimeWarning on the way)
        for governor, sampling in (("fixed:3", None), ("dspark", None), ("fixed:3:tree=3", None),
                                   ("fixed:3", SamplingParams(temperature=0.8, seed=1))):
            with Session(tmp_path / "eng", governor=governor, **({"sampling": sampling} if sampling else {})) as s:
                with pytest.raises(EngineFailure, match=r"^draft engine produced \+inf logits in row 0 of its call, "
                                                        r"1 token\(s\) into the answer"):
                    list(s.stream_ids([3, 1, 4], 6))


def test_chat_drops_a_turn_the_engines_failed_and_goes_on(failing_verify, monkeypatch):
    """An engine failure in `specrt chat` (here ONNX Runtime's own error at a prefill of 4 new
    rows, which runs on verify.3: the second turn's, the first turn's 5 rows reused) is said, the turn is dropped (the conversation as
    before it, the older turns dropped to fit it back), and the conversation goes on; the
    chat exits 1 at its end, saying how many turns failed. It ended the chat, losing the
    conversation, where the next turn may well be answered."""
    convs = _ctrl_c_before_answer(monkeypatch, 0)  # (turn 0: records every conversation, stops none)
    r = CliRunner().invoke(main, ["chat", str(failing_verify), "--governor", "off", "--max-new-tokens", "3"],
                           input="w4\nw7\nw8 w9\n\n")  # (the third turn: 5 new rows, the prefill engine's)
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    lines = r.output.splitlines()
    assert re.fullmatch(r"( w\d+){3}", lines[0]) and lines[1].startswith("[3 tokens, "), r.output
    assert lines[2].startswith("error: engine 'verify.3' (target.onnx) failed in ONNX Runtime: ") and \
        "0 token(s) into the answer" in lines[2], r.output
    assert lines[3] == "[the turn is dropped; the conversation goes on, and the chat exits 1 at its end]", r.output
    assert re.fullmatch(r"( w\d+){3}", lines[4]) and lines[5].startswith("[3 tokens, "), r.output
    assert lines[6:] == ["error: the engines failed 1 of 3 turn(s) (each one's error above)"], r.output
    first = [{"role": "user", "content": "w4"}, {"role": "assistant", "content": lines[0]}]
    assert convs[1] == first + [{"role": "user", "content": "w7"}], convs
    assert convs[2] == first + [{"role": "user", "content": "w8 w9"}], convs  # (no trace of the failed turn)


def _fails_in_onnx_runtime(eng: Path, rows: int) -> None:
    """Edit ``eng``'s target graph as a hand (or a tool) might after the build, its hash in
    engines.json recorded anew as a build records it: the logits get + table[1 - min(|r -
    rows|, 1)], r the number of logits rows the call computes and ``table`` one number, 0.
    A call computing ``rows`` rows fails inside ONNX Runtime (the Gather's index out of
    range), every other call runs as before. r comes from the call's ``logits_from``, so
    neither the graph's declared outputs nor ONNX Runtime's constant folding can tell it:
    loading takes the graph."""
    import onnx
    from onnx import helper, numpy_helper

    from specrt import contracts as C
    from specrt.manifest import file_record

    m = json.loads((eng / "engines.json").read_text())
    model = onnx.load(str(eng / "target.onnx"))
    g = model.graph
    at, node = next((i, n) for i, n in enumerate(g.node) if n.output[0] == C.LOGITS)
    node.output[0] = "t_logits"
    g.initializer.extend([numpy_helper.from_array(np.array([0.0], np.float32), "t_table"),
                          numpy_helper.from_array(np.array([1], np.int64), "t_one"),
                          numpy_helper.from_array(np.array([rows], np.int64), "t_fail")])
    made = [helper.make_node("Shape", ["t_logits"], ["t_rows"], start=1, end=2),  # [1]
            helper.make_node("Sub", ["t_rows", "t_fail"], ["t_off"]),
            helper.make_node("Abs", ["t_off"], ["t_far"]),
            helper.make_node("Min", ["t_far", "t_one"], ["t_other"]),  # 1, or 0 at ``rows`` rows
            helper.make_node("Sub", ["t_one", "t_other"], ["t_index"]),
            helper.make_node("Gather", ["t_table", "t_index"], ["t_zero"]),  # [0.0], or ONNX Runtime's error
            helper.make_node("Add", ["t_logits", "t_zero"], [C.LOGITS])]
    for k, n in enumerate(made):
        g.node.insert(at + 1 + k, n)
    onnx.checker.check_model(model)
    onnx.save(model, str(eng / "target.onnx"))
    m["files"] = [file_record(eng, r["file"]) if r["file"] == "target.onnx" else r for r in m["files"]]
    (eng / "engines.json").write_text(json.dumps(m, indent=1))


@pytest.fixture(scope="module")
def failing_verify(tmp_path_factory):
    """The worded pair (``_words``) whose target fails inside ONNX Runtime at a call of 4 rows
    of logits, verify.3's (``_fails_in_onnx_runtime``): a backend's own error at a real call."""
    eng = _tiny_text_pair(tmp_path_factory.mktemp("failing_verify"), 16, 12, _words)
    _fails_in_onnx_runtime(eng, 4)
    return eng


def test_an_onnx_runtime_error_at_a_call_is_an_engine_failure(failing_verify):
    """ONNX Runtime's own exception while an engine runs (here a Gather the edited graph's
    verify.3 calls fail; an allocation it could not make is another) is an EngineFailure naming
    the engine, its graph, ONNX Runtime's reason and how far into the answer it came, with
    the commands that check engines: `specrt run` and `chat` exit 1 without a traceback (it
    was ONNX Runtime's traceback). The same engines decode without speculation, so nothing
    failed before the call."""
    from specrt.errors import EngineFailure
    from specrt.runtime.session import Session

    with Session(failing_verify, governor="off") as s:
        assert len("".join(s.stream("w4 w6 w7", max_new_tokens=8)).split()) == 8
    with Session(failing_verify, governor="fixed:3") as s:
        with pytest.raises(EngineFailure) as e:
            "".join(s.stream("w4 w6 w7", max_new_tokens=8))
    msg = str(e.value)
    assert msg.startswith("engine 'verify.3' (target.onnx) failed in ONNX Runtime: "), msg
    assert "Gather" in msg and "1 token(s) into the answer (short of memory, or engines changed" in msg, msg
    assert f"`specrt compare {failing_verify}`" in msg and "\n" not in msg, msg
    for cmd, extra in ((["run", str(failing_verify), "--prompt", "w4 w6 w7"], {}),
                       (["chat", str(failing_verify)], {"input": "w4 w6 w7\n\n"})):
        r = CliRunner().invoke(main, cmd + ["--governor", "fixed:3", "--max-new-tokens", "8"], **extra)
        assert r.exit_code == 1 and "Traceback" not in r.output and "onnxruntime" not in r.output, (cmd, r.output)
        lines = [x for x in r.output.splitlines() if not x.startswith("note: ")]  # (no receipt: built without one)
        if cmd[0] == "chat":  # (the turn dropped, the chat going on to its end)
            assert lines[-1] == "error: the engines failed 1 of 1 turn(s) (each one's error above)", r.output
            lines = lines[:-2]
        assert re.fullmatch(r" w\d+", lines[0]), (cmd, r.output)  # (the prefill's token, then the error's line)
        assert lines[-1].startswith("error: engine 'verify.3' (target.onnx) failed in ONNX Runtime: "), r.output
        assert "1 token(s) into the answer" in lines[-1], r.output
    # ONNX Runtime's own log of the failure (on the process's stderr, past click's) is not said besides
    r = subprocess.run([sys.executable, "-m", "specrt.cli", "run", str(failing_verify), "--prompt", "w4 w6 w7",
                        "--governor", "fixed:3", "--max-new-tokens", "8"], capture_output=True, text=True,
                       env={**os.environ, "SPECRT_THP": "0"}, timeout=120)
    assert r.returncode == 1 and "error: engine 'verify.3'" in r.stderr, r.stderr
    assert "onnxruntime" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_run_and_chat_end_the_answers_line_before_an_engine_failure_mid_answer(overflowing):
    """An engine's +inf logits after part of an answer was printed: the error stands on a line of
    its own, after the text (it ran on after it, "w11error: ..."), exit 1, no traceback; in
    `specrt chat` as in `specrt run` (session 59 left chat unchecked)."""
    eng, prompts = overflowing
    for cmd, extra in ((["run", str(eng), "--prompt", prompts[False, True]], {}),
                       (["chat", str(eng)], {"input": prompts[True, True] + "\n\n"})):
        r = CliRunner().invoke(main, cmd + ["--governor", "off", "--max-new-tokens", "20"], **extra)
        assert r.exit_code == 1 and "Traceback" not in r.output, (cmd, r.output)
        lines = r.output.splitlines()  # (run: its closing lines between, "[failed: ...]" and its counts)
        if cmd[0] == "chat":  # (the turn dropped, the chat going on to its end, which says the failure again)
            assert lines[2:] == ["[the turn is dropped; the conversation goes on, and the chat exits 1 at its end]",
                                 "error: the engines failed 1 of 1 turn(s) (each one's error above)"], r.output
            lines = lines[:2]
        assert re.fullmatch(r"( w\d+)+", lines[0]) and all(x.startswith("[") for x in lines[1:-1]), (cmd, r.output)
        assert len(lines) == (4 if cmd[0] == "run" else 2), (cmd, r.output)
        n = len(lines[0].split())  # (where it failed: after the tokens printed)
        assert lines[-1].startswith(f"error: target engine produced +inf logits in row 0 of its call, {n} token(s) "
                                   "into the answer (float32 engines: "), (cmd, r.output)
    # failing before any of the answer was printed: the error alone, no empty line before it
    for cmd, extra in ((["run", str(eng), "--prompt", prompts[False, False]], {}),
                       (["chat", str(eng)], {"input": prompts[True, False] + "\n\n"})):
        r = CliRunner().invoke(main, cmd + ["--governor", "off", "--max-new-tokens", "20"], **extra)
        assert r.exit_code == 1 and r.output.startswith("error: target engine produced +inf"), (cmd, r.output)


def test_chat_keeps_an_empty_system_prompt_when_it_drops_turns(worded, monkeypatch):
    """`--system ""` is a system message (empty, in place of the template's default one), and
    dropping the oldest turns to fit the context keeps it, as it keeps any other: only user
    turns and their answers go, so the conversation still starts with the system message and
    alternates user / assistant after it (mutation round of session 59: a rule keyed on the
    prompt's truth rather than its presence dropped it with the first turn)."""
    convs = _ctrl_c_before_answer(monkeypatch, 0)  # (turn 0: records every conversation, stops none)
    long = " ".join(["w4"] * 50)
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "", "--max-new-tokens", "4", "--governor",
                                  "fixed:1"], input=f"{long}\n{long} w6\n{long} w7\n\n")
    assert r.exit_code == 0 and "[dropped the oldest 2 turn(s)" in r.output, r.output
    assert len(convs) == 3 and convs[0] == [{"role": "system", "content": ""}, {"role": "user", "content": long}]
    assert convs[2] == [{"role": "system", "content": ""}, {"role": "user", "content": f"{long} w7"}]


def test_chat_drops_its_oldest_turns_to_fit_the_context(worded):
    """The worded engines hold 128 tokens: turns of 54 tokens (system, 50 words, 4 of
    answer) fit two at a time, so the third pushes the oldest out (the system prompt
    stays), with a quarter of the context freed besides: both older turns, so that the
    fourth fits beside the third and reuses its rows (one exchange dropped a turn moved the
    conversation's start every turn, and nothing past the template's preamble was reused:
    session 55's soak), and the chat goes on; one turn longer than the context is said and
    skipped, and the conversation goes on (it ended it, losing the conversation)."""
    long = " ".join(["w4"] * 50)
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "w5", "--max-new-tokens", "4", "--governor",
                                  "fixed:1"], input=f"{long}\n{long}\n{long}\n{long}\n\n")
    assert r.exit_code == 0, r.output
    assert r.output.count("[dropped the oldest") == 1, r.output
    assert "[dropped the oldest 2 turn(s) to fit the context of 128 tokens]" in r.output, r.output
    done = [ln for ln in r.output.splitlines() if ln.startswith("[4 tokens")]
    assert len(done) == 4, r.output
    reused, total = (int(x) for x in done[3].split("; ")[1].split(" prompt")[0].split(" of "))
    assert total > 100 and reused >= total - 55, done[3]  # the fourth turn reuses the third's rows
    third = int(done[2].split("; ")[1].split(" prompt")[0].split(" of ")[1])
    assert third + 4 <= 128 - 128 // 4, done[2]  # (its prompt and room: a quarter of the context free)
    # turns of 43 words: the second and third (96 tokens and room 4) fit the context but not
    # three quarters of it, so both older turns go (a fifth freed would have kept the second)
    mid = " ".join(["w4"] * 43)
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "w5", "--max-new-tokens", "4", "--governor",
                                  "fixed:1"], input=f"{mid}\n{mid}\n{mid}\n\n")
    assert r.exit_code == 0 and "[dropped the oldest 2 turn(s) to fit the context of 128 tokens]" in r.output, r.output
    # one turn dropped is said as well: a long turn, a short one, a long one (the first gone, 74 tokens of 96)
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "w5", "--max-new-tokens", "4", "--governor",
                                  "fixed:1"], input=f"{long}\n" + " ".join(["w4"] * 10) + f"\n{long}\n\n")
    assert r.exit_code == 0 and "[dropped the oldest 1 turn(s) to fit the context of 128 tokens]" in r.output, r.output
    r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "4"],
                           input=" ".join(["w4"] * 200) + "\nw3 w1\n\n")
    assert r.exit_code == 0 and "the engines' context limit is 128: skipped" in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("[4 tokens")]) == 1, r.output  # the next turn
    # a skipped turn leaves the conversation as it was (the oldest turns were dropped for it,
    # and the next turn went on with the system prompt alone): the third turn reuses the rows
    # of the two before it, all of them
    short = " ".join(["w4"] * 10)
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "w5", "--max-new-tokens", "4", "--governor",
                                  "off"], input=f"{short}\n{short}\n" + " ".join(["w4"] * 200) + f"\n{short}\n\n")
    assert r.exit_code == 0 and "skipped" in r.output and "dropped" not in r.output, r.output
    done = [ln for ln in r.output.splitlines() if ln.startswith("[4 tokens")]
    assert len(done) == 3, r.output
    reused, total = (int(x) for x in done[2].split("; ")[1].split(" prompt")[0].split(" of "))
    assert total > 3 * 10 and reused >= total - 15, done[2]  # the first two turns are still there


def test_run_logprobs_go_into_the_stats_and_need_them(worded, tmp_path):
    """`specrt run --logprobs N --stats S`: per prompt, each output token's entry (id, token,
    bytes, logprob, N alternatives) as the Session gives them; without --stats an error
    before the engines load."""
    import json

    from specrt.runtime.session import Session

    stats = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1 w4", "--max-new-tokens", "6", "--quiet",
                                  "--governor", "fixed:3", "--logprobs", "2", "--stats", str(stats)])
    assert r.exit_code == 0, r.output
    p = json.loads(stats.read_text())["prompts"][0]
    got = p["output_logprobs"]
    assert [e["id"] for e in got] == p["output_token_ids"] and len(got) == 6
    assert [e["token"] for e in got] == [f"w{i}" for i in p["output_token_ids"]]
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["id"] == e["id"] for e in got)
    with Session(worded, governor="off") as s:
        "".join(s.stream("w3 w1 w4", max_new_tokens=6, logprobs=2))
        want = s.stats()["output_logprobs"]
        "".join(s.stream("w3 w1 w4", max_new_tokens=6, logprobs=0))  # (each token's own logprob, no alternatives)
        zero = s.stats()["output_logprobs"]
        "".join(s.stream("w3 w1 w4", max_new_tokens=2, prompt_logprobs=1))
        st = s.stats()
    # every prompt token an entry, the first one's without a logprob
    assert [e["id"] for e in st["prompt_logprobs"]] == st["prompt_ids"] and len(st["prompt_ids"]) >= 3
    assert st["prompt_logprobs"][0]["logprob"] is None and None not in [e["logprob"] for e in st["prompt_logprobs"][1:]]
    assert st["prompt_logprobs"][0]["top_logprobs"] is None  # (none, not the [] of logprobs=0: mutation round, S31)
    assert [e["logprob"] for e in got] == pytest.approx([e["logprob"] for e in want], abs=1e-4)
    assert [(e["id"], e["logprob"], e["top_logprobs"]) for e in zero] == [(e["id"], e["logprob"], []) for e in want]
    for n in ("2", "0"):  # (0: each token's own logprob, which goes into --stats as well)
        r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1 w4", "--logprobs", n])
        assert r.exit_code == 1 and "--logprobs N" in r.output and "--stats FILE" in r.output, (n, r.output)
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1 w4", "--logprobs", "21", "--stats",
                                  str(stats)])
    assert r.exit_code == 1 and "--logprobs" in r.output and "0<=x<=20" in r.output, r.output


def test_token_bytes_of_a_byte_level_tokenizer_spell_the_text(tmp_path):
    """A byte-level BPE (as SmolLM2's, Llama 3's, Qwen3's): the tokens' bytes joined are the
    text's UTF-8 bytes, pieces that are part of a character included (token_text then
    says ``bytes:\\xNN``); added tokens give their content; a word-level tokenizer falls
    back to each token's decoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from specrt.runtime.text import Text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world", "héllo wörld", "the cat sat"] * 20, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    text = Text(tmp_path)
    s = "héllo wörld, 中文 🙂 the<|end|>"
    ids = tok.encode(s).ids
    assert b"".join(text.token_bytes(i) for i in ids) == s.encode()
    parts = [text.token_text(i) for i in ids]
    assert "<|end|>" in parts and any(p.startswith("bytes:\\x") for p in parts)  # 中 is three byte tokens here
    partial = next(i for i, p in zip(ids, parts) if p.startswith("bytes:"))
    assert text.token_text(partial) == "bytes:" + "".join(f"\\x{b:02x}" for b in text.token_bytes(partial))
    with pytest.raises(UserError, match="token id 99999"):
        text.token_bytes(99999)
    words = Tokenizer(models.WordLevel({"w0": 0, "w1": 1}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "w").mkdir()
    words.save(str(tmp_path / "w" / "tokenizer.json"))
    assert Text(tmp_path / "w").token_bytes(1) == b"w1"


TEMPLATES = {
    # Llama 3.1's way of dating its system prompt, and its tools check
    "dated": ("{{- bos_token }}{%- if not date_string is defined %}{%- if strftime_now is defined %}"
              "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '26 Jul 2024' %}"
              "{%- endif %}{%- endif %}{%- if tools is not none %}TOOLS {{ tools | tojson }}{%- endif %}\n"
              "Today Date: {{ date_string }}\n{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n"
              "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"),
    # Qwen3's switch of its thinking block
    "thinking": ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
                 "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- if enable_thinking is defined and "
                 "enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}"),
    # loop controls, a {% generation %} block, a namespace, tojson of text with < and é, special tokens
    "controls": ("{%- set ns = namespace(n=0) %}{%- for m in messages %}{%- if m.role == 'system' %}{% continue %}"
                 "{%- endif %}{%- set ns.n = ns.n + 1 %}{%- if m.role == 'assistant' %}{% generation %}A: "
                 "{{ m.content }}{% endgeneration %}{%- else %}U: {{ m.content | tojson }}{%- endif %}"
                 "{%- if ns.n >= 3 %}{% break %}{%- endif %}{%- endfor %} n={{ ns.n }} pad={{ pad_token }} "
                 "unk={{ unk_token }}{{ extra | default('') }}"),
}


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_chat_templates_render_as_transformers_renders_them(tmp_path, name):
    """The exported template rendered here as transformers' apply_chat_template renders it
    (its Jinja environment and variables), with and without template variables."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specrt.runtime.text import Text

    tok = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "<pad>": 2, "<unk>": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": TEMPLATES[name], "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "unk_token": "<unk>", "tokenizer_class": "PreTrainedTokenizerFast"}))
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = Text(tmp_path)
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a <b> & é?"},
            {"role": "assistant", "content": "yes"}, {"role": "user", "content": "more"},
            {"role": "user", "content": "last"}]
    for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True, "extra": " X", "date_string": "1 Jan"}):
        want = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, **kwargs)
        assert text.render_chat(conv, kwargs) == want, kwargs
    assert text.render_chat(conv, {"enable_thinking": False}) != text.render_chat(conv) or name != "thinking"


def test_template_variables_reach_the_prompt_from_run_and_are_checked(worded, tmp_path):
    """``--chat-template-kwargs``: the template's variables in `specrt run` (the prompt's ids
    show them), Session defaults under a stream's own; bad values named, exit 1."""
    from specrt.runtime.session import Session

    s = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w6", "--chat", "--max-new-tokens", "2", "--quiet",
                                  "--governor", "fixed:1", "--stats", str(s), "--chat-template-kwargs",
                                  '{"cue": "w9"}'])
    assert r.exit_code == 0, r.output
    assert json.loads(s.read_text())["prompts"][0]["prompt_ids"] == [1, 6, 2, 9]
    # and in `specrt chat`: the turn's prompt is w1 w6 w2 w9, 4 tokens (3 without the cue)
    r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "2", "--governor", "fixed:1",
                                  "--chat-template-kwargs", '{"cue": "w9"}'], input="w6\n")
    assert r.exit_code == 0 and "; 0 of 4 prompt tokens reused]" in r.output, r.output
    given = {"cue": "w9"}
    with Session(worded, governor="fixed:1", chat_template_kwargs=given) as sess:
        given["cue"] = "w7"  # (m71a-80: the caller's dict changed later is not the session's defaults)
        assert sess.encode("w6", True) == [1, 6, 2, 9] and sess.encode("w6", True, {"cue": "w4"}) == [1, 6, 2, 4]
        "".join(sess.stream("w6", chat=True, max_new_tokens=2, chat_template_kwargs={"cue": "w5"}))
        assert sess.last_prompt_ids == [1, 6, 2, 5]
    for bad, message in (("{nope", "--chat-template-kwargs: not valid JSON"),
                         ("[1]", "--chat-template-kwargs: expected a JSON object of template variable names"),
                         # ("null" was taken as no variables where "[]" was refused: a walk's L9)
                         ("null", "--chat-template-kwargs: expected a JSON object of template variable names to "
                                  "values, found null"),
                         ('{"messages": 1}', "'messages' is set by specrt")):
        r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w6", "--chat", "--chat-template-kwargs", bad])
        assert r.exit_code == 1 and message in r.output and "Traceback" not in r.output, (bad, r.output)



# mutant M67 m16 (cmd_calibrate.py): --chat-template-kwargs not passed on by `specrt calibrate`
def test_calibrate_renders_its_prompts_with_the_template_variables(worded, tmp_path):
    """calibrate's prompts go through the template with --chat-template-kwargs' variables: a cue
    of 200 words makes the prompt too long for these engines (128 tokens), refused by its line."""
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "w6"}\n')
    r = CliRunner().invoke(main, ["calibrate", str(worded), "--prompts", str(f), "--chat", "--holdout", "0",
                                  "--max-new-tokens", "3", "--chat-template-kwargs", json.dumps({"cue": "w9 " * 200})])
    assert r.exit_code == 1 and f"{f}:1: the prompt has 203 tokens; the engines' context limit is 128" in r.output, \
        r.output


def test_calibrate_says_chat_options_no_prompt_uses_as_run_does(worded, tmp_path):
    """--chat and --chat-template-kwargs over token ids only were taken without a word by
    calibrate where `specrt run` notes each (the CLI walk's L5). (The second prompt is too long
    for these engines: refused after the notes, so nothing is written into the shared engines.)"""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt_ids": [3, 1, 4]}) + "\n" + json.dumps({"prompt_ids": [5] * 200}) + "\n")
    r = CliRunner().invoke(main, ["calibrate", str(worded), "--prompts", str(f), "--chat", "--holdout", "0",
                                  "--max-new-tokens", "3", "--chat-template-kwargs", '{"x": 1}'])
    assert r.exit_code == 1 and f"{f}:2: the prompt has 200 tokens" in r.output, r.output
    # (on stderr, as calibrate's other lines: mutant m71c-86 printed them on stdout)
    assert "note: --chat: 2 of the 2 prompts are token ids ('prompt_ids'), used as given" in r.stderr, r.output
    assert "note: --chat-template-kwargs: no prompt goes through the chat template" in r.stderr, r.output
    assert "note:" not in r.stdout, r.stdout
    r = CliRunner().invoke(main, ["calibrate", str(worded), "--prompts", str(f), "--holdout", "0",
                                  "--max-new-tokens", "3"])
    assert r.exit_code == 1 and "note:" not in r.output, r.output
    # the held-out prompts counted too (mutant m71c-46 counted --prompts' only)
    g, h = tmp_path / "text.jsonl", tmp_path / "held.jsonl"
    g.write_text(json.dumps({"prompt": "w3 w1"}) + "\n")
    h.write_text(json.dumps({"prompt_ids": [5] * 200}) + "\n")
    r = CliRunner().invoke(main, ["calibrate", str(worded), "--prompts", str(g), "--holdout-prompts", str(h), "--chat",
                                  "--max-new-tokens", "3"])
    assert r.exit_code == 1 and f"{h}:1: the prompt has 200 tokens" in r.output, r.output
    assert "note: --chat: 1 of the 2 prompts are token ids ('prompt_ids'), used as given" in r.output, r.output


def test_a_streams_template_variables_for_a_prompt_no_template_renders_are_refused(worded):
    """A user walk's finding: ``stream(text, chat_template_kwargs=...)`` without chat=True, or
    with token ids, dropped the variables without a word (the prompt decoded raw). The
    session's own still go to chat prompts only, unsaid (`specrt serve` answers raw completions
    with them set)."""
    from specrt.runtime.session import Session

    with Session(worded, governor="off", chat_template_kwargs={"cue": "w9"}) as s:
        assert s.encode("w6") == [6] and s.check_prompt([6, 7]) == [6, 7]  # the session's: chat prompts only
        for prompt, what in (("w6", "a text prompt without chat=True"), ([6, 7], "a prompt of token ids")):
            with pytest.raises(UserError, match=rf"^chat_template_kwargs={{'cue': 'w5'}}: {what} goes through no "):
                s.stream(prompt, max_new_tokens=2, chat_template_kwargs={"cue": "w5"})
            with pytest.raises(UserError, match=rf": {what} goes through no chat template"):
                s.check_prompt(prompt, chat_template_kwargs='{"cue": "w5"}')
        assert "".join(s.stream("w6", max_new_tokens=2, chat_template_kwargs={})) and s.stats()["prompt_ids"] == [6]
        "".join(s.stream([{"role": "user", "content": "w6"}], max_new_tokens=2, chat_template_kwargs={"cue": "w5"}))
        assert s.stats()["prompt_ids"] == [1, 6, 2, 5]


def test_a_prompt_that_is_not_utf8_is_refused(worded):
    """Bytes that are not UTF-8 (a shell argument, a pipe: Python's surrogate escapes) are
    named, exit 1, in `run --prompt`; in `chat` the turn is named and skipped and the
    conversation goes on (through a real pipe, as a user's terminal gives them)."""
    import os
    import subprocess
    import sys

    bad = "w6 \udcff\udcfe"  # b"w6 \xff\xfe" as sys.argv and sys.stdin give it
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", bad, "--max-new-tokens", "2"])
    assert r.exit_code == 1 and "the prompt is not valid UTF-8 text (byte 0xff after 'w6 '; or a JSON \\udcff escape" \
        in r.output, r.output  # (serve's JSON may escape one)
    p = subprocess.run([sys.executable, "-c", "from specrt.cli import entry; entry()", "chat", str(worded)],
                       input=b"w6 \xff\xfe\nw3 w1\n", capture_output=True, timeout=120,
                       env={**os.environ, "SPECRT_THP": "0"})
    err = p.stderr.decode()
    assert p.returncode == 0 and "[a turn that is not UTF-8 text (invalid start byte at byte 3): skipped]" in err, err
    assert "Traceback" not in err and err.count("tokens, ") == 1, err  # the next turn was answered


def test_run_says_when_the_context_limit_ends_an_answer(worded):
    """An answer cut by the engines' context (128 here), not by EOS or max_new_tokens, is
    said on the console (the stats already had finish_reason 'context')."""
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", " ".join(["w6"] * 120), "--max-new-tokens", "40",
                                  "--governor", "fixed:1", "--quiet"])
    assert r.exit_code == 0, r.output
    assert "stopped at the engines' context limit of 128 tokens after 8 new tokens (120 in the prompt)" in r.output
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w6", "--max-new-tokens", "4", "--quiet"])
    assert r.exit_code == 0 and "context limit" not in r.output, r.output


def test_the_context_limits_line_counts_one_new_token_as_one(worded):
    """NOTES s70 (the context walk's F3): a prompt one short of the context (127 of 128) gets
    one new token, said "after 1 new token", not "after 1 new tokens"; run's and chat's closing
    lines count one token so too ("[1 tokens in ...", "[1 tokens, ...")."""
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", " ".join(["w6"] * 127), "--max-new-tokens", "40",
                                  "--governor", "off", "--quiet"])
    assert r.exit_code == 0, r.output
    assert "context limit of 128 tokens after 1 new token (127 in the prompt)" in r.output, r.output
    assert "[1 token in " in r.output, r.output
    r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "1"], input="w1 w2\n\n")
    assert r.exit_code == 0 and "[1 token, " in r.output, r.output


def test_run_names_the_prompt_of_a_file_that_the_context_limit_cut(worded, tmp_path):
    """With --prompts the context line names which prompt was cut, counted from 1 as a
    person counts them (the second of two here: the first ends at --max-new-tokens)."""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "w6"}) + "\n" + json.dumps({"prompt": " ".join(["w6"] * 120)}) + "\n")
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--max-new-tokens", "40",
                                  "--governor", "fixed:1", "--quiet"])
    assert r.exit_code == 0, r.output
    assert ("[prompt 2: stopped at the engines' context limit of 128 tokens after 8 new tokens (120 in the prompt)"
            in r.output and "prompt 1:" not in r.output), r.output


def _byte_bpe(folder):
    """A byte-level BPE of 300 tokens (as SmolLM2's, Llama 3's, Qwen3's, smaller): most
    multi-byte characters take several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world", "héllo wörld", "the cat sat"] * 20, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return tok


def test_the_detokenizer_holds_back_only_an_unfinished_character(tmp_path):
    """Pushed in any chunks, the pieces and the flush spell the full decoding; a chunk that
    ends inside a character gives the text before it at once (the text was held back
    whole, and lost when the stream ended there)."""
    from specrt.runtime.text import Detokenizer, Text

    tok = _byte_bpe(tmp_path)
    text = Text(tmp_path)
    ids = tok.encode("ab 🙂 中文 é!").ids
    cut = next(k for k in range(1, len(ids)) if text.decode(ids[:k]).endswith("\ufffd"))
    d = Detokenizer(text)
    assert d.push(ids[:cut]) == text.decode(ids[:cut]).rstrip("\ufffd") != ""
    for n in (1, 2, 3, 5):
        for end in range(1, len(ids) + 1):  # every place the stream may end, a character cut or not
            d = Detokenizer(text)
            pieces = [d.push(ids[i:min(i + n, end)]) for i in range(0, end, n)]
            assert "".join(pieces) + d.flush() == text.decode(ids[:end]), (n, end)
            assert all("\ufffd" not in p for p in pieces) or "\ufffd" in text.decode(ids[:end]).rstrip("\ufffd")


@pytest.fixture(scope="module")
def bytewise(tmp_path_factory):
    """A tiny random Llama over that 300-token byte-level vocabulary and a random P-EAGLE
    draft: its answers are random bytes, characters cut at every turn."""
    return _tiny_text_pair(tmp_path_factory.mktemp("bytewise"), 300, 300, _byte_bpe)


def test_streamed_text_is_the_decoding_of_the_tokens_however_rounds_cut_characters(bytewise):
    """Random bytes from the model: the streamed pieces join to the decoding of the output
    tokens under every governor (rounds of 1 to 4 tokens end inside characters), and a stop
    string that a multi-byte character completes is found, the text ending before it."""
    from specrt.runtime.session import Session

    seen_cut = False
    for gov in ("off", "fixed:1", "fixed:3"):
        with Session(bytewise, governor=gov) as s:
            for prompt in ([5, 9, 200], [44, 45, 46, 47], [120]):
                streamed = "".join(s.stream(prompt, max_new_tokens=40))
                full = s.text.decode(s.last_output_ids)
                assert streamed == full, (gov, prompt)
                seen_cut |= any(s.text.decode(s.last_output_ids[:k]).endswith("\ufffd")
                                for k in range(1, len(s.last_output_ids)))
    assert seen_cut  # the outputs did cut characters
    with Session(bytewise, governor="fixed:3") as s:
        for prompt in ([120], [7], [5, 9, 200], [44, 45, 46, 47]):  # (most random bytes decode to U+FFFD)
            full = "".join(s.stream(prompt, max_new_tokens=40))
            i = next((i for i, ch in enumerate(full) if ord(ch) > 127 and ch != "\ufffd" and i > 0), None)
            if i is not None:
                break
        stop = full[i - 1:i + 1]  # ends in a multi-byte character
        text = "".join(s.stream(prompt, max_new_tokens=40, stop=(stop,)))
        assert text == full[:full.index(stop)] and s.stats()["finish_reason"] == "stop", (stop, full)


def test_run_reproducible_samples_the_target_only_text_of_its_seed(worded, tmp_path):
    """`specrt run --reproducible --seed S`: every governor writes the tokens `--governor off`
    samples with that seed (several prompts in one run: reuse and lookup in between)."""
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("w6 w7", "w6 w7 w8", "w3")))
    got = {}
    for gov in ("off", "fixed:3", "auto"):
        s = tmp_path / f"{gov.replace(':', '_')}.json"
        r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(f), "--chat", "--max-new-tokens", "24",
                                      "--temperature", "1.0", "--seed", "5", "--reproducible", "--quiet",
                                      "--governor", gov, "--stats", str(s)])
        assert r.exit_code == 0, r.output
        got[gov] = [p["output_token_ids"] for p in json.loads(s.read_text())["prompts"]]
    assert got["fixed:3"] == got["off"] == got["auto"]
    # and chat's --reproducible: a turn's answer under fixed:3 is off's
    said = {gov: CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "24", "--temperature", "1.0",
                                           "--seed", "5", "--reproducible", "--governor", gov], input="w6 w7\n")
            for gov in ("off", "fixed:3")}
    assert all(r.exit_code == 0 for r in said.values()), said
    assert said["off"].stdout == said["fixed:3"].stdout and said["off"].stdout.strip(), said["off"].output


def test_chat_samples_each_turn_with_a_seed_of_its_own(worded):
    """`specrt chat --seed S`: turn k samples with S + k, so that under --reproducible it is the
    text `--governor off` samples for that conversation with S + k. Every turn drew the seed's
    same numbers (the same noise under --reproducible): a second turn's first token was the
    first's 164 times in 300 against 23 drawn apart, the turns not sampled as the target
    samples a conversation (walk w73c)."""
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import Session

    r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "12", "--temperature", "1.0", "--seed", "5",
                                  "--reproducible", "--governor", "fixed:3"], input="w6 w7\nw6 w7\nw3\n")
    assert r.exit_code == 0, r.output
    answers = r.stdout.split("\n")[:3]
    conversation = []
    for k, (turn, answer) in enumerate(zip(("w6 w7", "w6 w7", "w3"), answers)):
        conversation.append({"role": "user", "content": turn})
        with Session(worded, governor="off", sampling=SamplingParams(temperature=1.0, seed=5 + k, coupled=True)) as s:
            assert "".join(s.stream(conversation, chat=True, max_new_tokens=12)) == answer, (k, r.output)
        conversation.append({"role": "assistant", "content": answer})


def test_reproducible_without_a_seed_is_said_to_repeat_nothing(worded):
    """`specrt run --temperature 1 --reproducible` without --seed drew a fresh seed each run and
    sampled another text each time, without a word (walk w73c); run and chat say so, and say
    nothing with a seed or at temperature 0 (where the option's own note says it changes nothing)."""
    said = "note: --reproducible without --seed draws a fresh seed each run"
    for cmd, args, says in ((["run", "--prompt", "w1 w2"], ["--temperature", "1"], True),
                            (["run", "--prompt", "w1 w2"], ["--temperature", "1", "--seed", "-1"], True),
                            (["run", "--prompt", "w1 w2"], ["--temperature", "1", "--seed", "3"], False),
                            (["run", "--prompt", "w1 w2"], [], False), (["chat"], ["--temperature", "1"], True),
                            (["chat"], ["--temperature", "1", "--seed", "3"], False)):
        r = CliRunner().invoke(main, [cmd[0], str(worded), *cmd[1:], "--max-new-tokens", "2", "--reproducible", *args],
                               input="w1 w2\n")
        assert r.exit_code == 0 and (said in r.output) == says, (cmd, args, r.output)


def test_the_coupled_sampling_experiment_runs_and_checks_its_promise(worded, tmp_path, capsys):
    from tests.real_model import tool

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("w6 w7", "w3 w4 w5")))
    assert tool("exp_coupled_sampling").main([str(worded), "--prompts", str(f), "--n", "2", "--seeds", "1",
                                              "--max-new-tokens", "8", "--governors", "fixed:3",
                                              "--temperature", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "fixed:3: coupled / rejection tokens/s, median of paired ratios" in out
    assert "coupled outputs = target-only decoding's with the same seed: 2/2" in out


def test_a_corrupt_calibration_stops_only_the_governors_that_read_it(worded, tmp_path):
    """calibration.json that cannot be read: DSpark (and auto, which is DSpark) refuses
    naming the file; off / fixed / adaptive, which never read it, decode and say why it
    was ignored."""
    import shutil

    from specrt.errors import UserError
    from specrt.runtime.session import Session

    eng = tmp_path / "eng"
    shutil.copytree(worded, eng)
    (eng / "calibration.json").write_text("{ not json")
    for gov in ("fixed:1", "off", "adaptive"):
        with Session(eng, governor=gov) as s:
            assert s.calibration is None and s.calibration_note.startswith("calibration ignored"), gov
            "".join(s.stream("w6", chat=True, max_new_tokens=3))
            assert s.stats()["new_tokens"] >= 1, gov
    for gov in ("dspark", "auto"):
        with pytest.raises(UserError, match="calibration.json: not valid JSON"):
            Session(eng, governor=gov)


def test_one_stop_string_is_one_stop_not_its_letters():
    """Session.stream(stop="END") passed a str: it was iterated into the stops 'E', 'N', 'D'."""
    from specrt.runtime.text import StopScanner

    sc = StopScanner("END")
    assert sc.stops == ("END",)
    assert sc.push("Dear friend, the END") == "Dear friend, the " and sc.hit


def test_stats_describe_the_last_stream_of_token_ids_too(worded):
    """Session.stream_ids left stats() with the previous text stream's prompt and output ids."""
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3") as s:
        "".join(s.stream("w1 w2", max_new_tokens=3))
        got = [t for chunk in s.stream_ids([5, 6, 7], 4) for t in chunk]
        st = s.stats()
        assert st["prompt_ids"] == [5, 6, 7] and st["output_token_ids"] == got and len(got) >= 1


def test_chat_skips_a_turn_that_is_not_utf8_and_goes_on(worded):
    """A line of bytes that are not UTF-8 ended the conversation with an error."""
    r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "4"], input=b"\xff\xfe w1\nw3 w1\n\n")
    assert r.exit_code == 0 and "not UTF-8 text" in r.output and "skipped" in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("[4 tokens")]) == 1, r.output


def test_session_streams_time_the_runtime_not_their_caller(worded):
    """Session.stream's and stream_ids' telemetry seconds leave out the time their caller
    held them between pieces (detokenizing and stop strings stay the runtime's)."""
    import time

    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3") as s:
        for stream in (lambda: s.stream("w3 w1 w4", max_new_tokens=8),
                       lambda: s.stream_ids([3, 1, 4], 8)):
            pieces, t0 = 0, time.perf_counter()
            for _ in stream():
                pieces += 1
                time.sleep(0.05)
            wall = time.perf_counter() - t0
            st = s.stats()
            assert st["new_tokens"] == 8 and pieces >= 2
            assert st["seconds"] < wall - 0.05 * pieces + 2e-3, (st["seconds"], wall, pieces)


def test_a_lone_surrogate_is_named_in_the_api_and_run(worded):
    """A UTF-16 half without its pair ("\\ud800" in JSON) is not text: a UserError naming it
    (it was a UnicodeEncodeError traceback), in Session.stream and `specrt run --prompts`."""
    from specrt.runtime.session import Session

    with Session(worded, governor="off") as s:
        with pytest.raises(UserError, match="lone surrogate U\\+D800"):
            "".join(s.stream("w1 \ud800", max_new_tokens=2))
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w1 \udbff x", "--max-new-tokens", "2"])
    assert r.exit_code == 1 and "lone surrogate U+DBFF" in r.output and "Traceback" not in r.output, r.output


def _words_and_controls(t) -> None:
    """``_words``' template over words w0 .. w13 (spaces between them), an ANSI escape
    sequence (id 14, a word a model may write) and "\\r" (id 15, a token of its own)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    _words(t)
    tok = Tokenizer(models.WordLevel({**{f"w{i}": i for i in range(14)}, "\x1b[1m": 14, "\r": 15}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(" ", "removed"),
                                                 pre_tokenizers.Split("\r", "isolated")])
    tok.save(str(t / "tokenizer.json"))


@pytest.fixture(scope="module")
def controls(tmp_path_factory):
    return _tiny_text_pair(tmp_path_factory.mktemp("controls"), 16, 12, _words_and_controls)


def test_chat_takes_a_crlf_line_as_the_same_turn(controls):
    """A turn read from a file with Windows line ends ("\\r\\n") is the same turn: its "\\r"
    went into the prompt (a token more, here "\\r"'s own)."""
    out = {}
    for end in ("\n", "\r\n"):
        r = CliRunner().invoke(main, ["chat", str(controls), "--max-new-tokens", "3", "--governor", "off"],
                               input=f"w6 w7{end}w8{end}{end}")
        assert r.exit_code == 0, r.output
        assert " tok/s, no draft rounds; 0 of 4 prompt tokens reused]" in r.output, r.output  # (off: no tau)
        # the answers, and each turn's prompt tokens (not its timing)
        out[end] = [ln.split("; ")[-1] if ln.startswith("[") else ln for ln in r.output.splitlines()
                    if not ln.startswith("note: ")]
    assert "0 of 4 prompt tokens reused]" in out["\n"], out["\n"]
    assert out["\r\n"] == out["\n"]


def test_run_prints_the_text_of_the_tokens_into_a_pipe_too(controls, tmp_path):
    """What `specrt run` prints into a file or a pipe is the decoding of the output tokens,
    escape sequences included (click.echo took out those that came in one piece when its
    output was not a terminal: a stop string's hold-back gave the whole tail in one)."""
    from specrt.runtime.text import Text

    stats = tmp_path / "s.json"
    r = CliRunner().invoke(main, [
        "run", str(controls), "--prompt", "w9 w9 w2", "--max-new-tokens", "40", "--governor", "off", "--stats",
        str(stats), "--stop", "no such words in the answer"])
    assert r.exit_code == 0, r.output
    ids = json.loads(stats.read_text())["prompts"][0]["output_token_ids"]
    assert 14 in ids  # the model wrote the escape sequence
    assert r.stdout == " " + Text(controls / "export").decode(ids) + "\n"  # (the text after the prompt's)


# chat's line at the context (128 here), with run's hint since NOTES s70 (the context walk's F3:
# chat's line said the limit only)
CHAT_AT_CONTEXT = ("[the answer stopped at the engines' context limit of 128 tokens; `specrt build --max-context` "
                   "sets the limit]")


def test_chat_says_when_an_answer_stops_at_the_context_limit(worded):
    r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "200", "--governor", "off"],
                           input="w1 w2\n\n")
    assert r.exit_code == 0 and CHAT_AT_CONTEXT in r.output, r.output


def test_chat_says_nothing_of_the_context_when_an_answer_ends_at_eos(tmp_path):
    """Mutant C22 (session 67): an answer that ends at the target's EOS (as a real model's
    chat answers do) was not told from one cut at the context: the tiny engines never emit
    their EOS, w2. The same weights with w8 as EOS (a special token, as real EOS tokens are),
    which the answer to "w1 w2" reaches after 7 tokens (it runs to the context otherwise):
    the answer ends there, EOS unprinted, no context line, and the conversation goes on."""
    eng = _tiny_text_pair(tmp_path, 16, 12, lambda t: _words(t, special=("w8",)), eos_token_id=8)
    r = CliRunner().invoke(main, ["chat", str(eng), "--max-new-tokens", "200", "--governor", "off"],
                           input="w1 w2\nw4\n\n")
    assert r.exit_code == 0 and r.stdout.startswith(" w7 w7 w7 w7 w7 w7 w0\n"), r.output
    assert "context limit" not in r.output and len(r.stdout.splitlines()) == 2, r.output


def test_an_eos_the_tokenizer_does_not_mark_special_ends_the_answer_unprinted(tmp_path):
    """Sessions 68-73's leftover (h74c): an EOS id the tokenizer does not mark special (w8 here,
    a plain word of the vocabulary) was printed at the answer's end, " ... w0 w8", by run, chat
    and serve's text (transformers' decode prints it, vLLM's does not). The EOS ends the answer
    and writes none of its text; the stats' output ids (and so serve's logprobs) still end with
    it, and the finish is the EOS's."""
    from specrt.runtime.session import Session

    eng = _tiny_text_pair(tmp_path, 16, 12, _words, eos_token_id=8)  # (no special tokens at all)
    for gov in ("off", "fixed:3"):
        with Session(eng, governor=gov) as s:
            text = "".join(s.stream("w1 w1 w2 w2", max_new_tokens=200))
            st = s.stats()
        assert text == " w7 w7 w7 w7 w7 w7 w0", (gov, text)
        assert st["output_token_ids"] == [7] * 6 + [0, 8] and st["finish_reason"] == "eos", (gov, st)
    r = CliRunner().invoke(main, ["run", str(eng), "--prompt", "w1 w1 w2 w2", "--max-new-tokens", "200"])
    assert r.exit_code == 0 and r.stdout == " w7 w7 w7 w7 w7 w7 w0\n", r.output
    r = CliRunner().invoke(main, ["chat", str(eng), "--max-new-tokens", "200", "--governor", "off"],
                           input="w1 w2\n\n")  # (rendered: "w1 w1 w2 w2")
    assert r.exit_code == 0 and r.stdout == " w7 w7 w7 w7 w7 w7 w0\n", r.output


def test_chat_keeps_a_quarter_of_the_context_for_an_answer_not_max_new_tokens(worded):
    """The room chat keeps for the next answer is --max-new-tokens or a quarter of the context,
    whichever is less: a --max-new-tokens past the quarter (60 of 128 here) does not drop the
    earlier turn that still fits beside a quarter; the answer is cut at the context instead."""
    r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "60", "--governor", "off"],
                           input="w1 w2\nw3 w3 w3 w3 w3\n\n")  # (the second turn's prompt: 71 tokens)
    assert r.exit_code == 0 and "dropped" not in r.output, r.output
    assert CHAT_AT_CONTEXT in r.output, r.output
    # the second turn's prompt at 91 tokens: a quarter (32) still fits beside it, a third (42) would not
    # (mutant m71b-83: room a third of the context dropped the first turn)
    r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "60", "--governor", "off"],
                           input="w1 w2\n" + " ".join(["w3"] * 25) + "\n\n")
    assert r.exit_code == 0 and "dropped" not in r.output, r.output
    assert CHAT_AT_CONTEXT in r.output, r.output
    assert "91 prompt tokens reused]" in r.output, r.output


def test_chat_keeps_an_earlier_turn_that_leaves_the_room_exactly(worded):
    """Mutant m74b-61 (a turn dropped where its prompt and the room just fill the context): the
    second turn's prompt at 96 tokens (66 + 30 words) leaves the room for an answer, a quarter of
    the context (32), to the context's last token, so the first turn is kept; at 97 it is dropped.
    (h74c's measured count, taken once before the drops.)"""
    for words, dropped, said in ((30, False, "96 prompt tokens reused]"),
                                 (31, True, "[dropped the oldest 1 turn(s) to fit the context of 128 tokens]")):
        r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "60", "--governor", "off"],
                               input="w1 w2\n" + " ".join(["w3"] * words) + "\n\n")
        assert r.exit_code == 0 and ("dropped" in r.output) == dropped and said in r.output, (words, r.output)


def test_chat_skips_a_turn_that_fills_the_context_to_its_last_token(worded):
    """A turn whose prompt is exactly the context (128 tokens: no room for one token of
    answer) is skipped and said, the conversation going on; one token shorter is answered."""
    system = " ".join(["w4"] * 123)  # 126 tokens with an empty turn
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", system, "--governor", "fixed:1"],
                           input="w6 w6\nw6\n\n")
    assert r.exit_code == 0, r.output
    assert ("[this turn makes a prompt of 128 tokens; the engines' context limit is 128: skipped, the conversation "
            "goes on]") in r.output, r.output
    assert r.output.count(CHAT_AT_CONTEXT) == 1, r.output


def test_api_misuse_is_a_user_error(worded):
    """Template variables that are not an object, a message whose content is neither a string
    nor text parts, and a stream on a closed Session: UserErrors naming what was expected
    (TypeError, a Jinja TypeError and an InternalError before)."""
    from specrt.runtime.session import Session

    with pytest.raises(UserError, match="chat_template_kwargs: "):
        Session(worded, governor="off", chat_template_kwargs="x")
    s = Session(worded, governor="off")
    with pytest.raises(UserError, match="chat_template_kwargs: "):
        "".join(s.stream("w1", chat=True, max_new_tokens=2, chat_template_kwargs="x"))
    with pytest.raises(UserError, match=r"^a conversation's messages\[0\]: expected an object with a string 'role' "
                       r"and a string \(or text parts\) 'content'; got \{'role': 'user', 'content': 3\}$"):
        "".join(s.stream([{"role": "user", "content": 3}], max_new_tokens=2))
    s.close()
    before = s.stats()
    with pytest.raises(UserError, match="this Session is closed"):  # when called, as stream's (mutation round, S10)
        s.stream_ids([1, 2, 3], 2)
    assert s.stats() == before  # (stats() still describes the last stream, not the refused one)


def test_a_conversations_text_parts_are_its_content_and_a_bad_message_is_named(worded, tmp_path):
    """OpenAI's content parts (``[{"type": "text", "text": ...}]``), which serve took and the
    Python API and prompt files refused ("a conversation must be ..."), give the text joined
    as the content; a part that is not text, or a message that is no message, is named by its
    index in the API's, a prompt file's and serve's words (the API named no message: a long
    conversation's bad one was hard to find)."""
    from specrt.prompt_files import read_prompt_file
    from specrt.runtime.session import Session

    plain = [{"role": "system", "content": "w2 w3"}, {"role": "user", "content": "w1 w4"}]
    parts = [{"role": "system", "content": [{"type": "text", "text": "w2 w3"}]},
             {"role": "user", "content": [{"type": "text", "text": "w1"}, {"type": "text", "text": " w4"}]}]
    with Session(worded, governor="off") as s:
        assert s.encode(parts) == s.encode(plain)
        assert "".join(s.stream(parts, max_new_tokens=4)) == "".join(s.stream(plain, max_new_tokens=4))
        image = [plain[0], {"role": "user", "content": [{"type": "text", "text": "w1"}, {"type": "image_url"}]}]
        with pytest.raises(UserError, match=r"^a conversation's messages\[1\]\.content: only text parts \("
                           r"\{'type': 'text', 'text': \.\.\.\}\) are supported; got \{'type': 'image_url'\}$"):
            s.encode(image)
        for bad, i in (([plain[0], plain[1], {"role": 1, "content": "x"}], 2), ([plain[0], "w1"], 1),
                       ([plain[0], {"content": "x"}], 1)):
            with pytest.raises(UserError, match=rf"^a conversation's messages\[{i}\]: expected an object"):
                s.encode(bad)
        with pytest.raises(UserError, match=r"^a conversation must be a non-empty list of messages.*; got \['w1'\]"):
            s.encode(["w1"])
    from specrt.runtime.calibrate import calibrate

    with pytest.raises(UserError, match=r"^prompt 2: a conversation's messages\[1\]\.content: only text parts"):
        calibrate(worded, [parts, image], max_new_tokens=3, holdout=0, write=False)  # (it said "expected text or
        # a list of token ids", naming no message)
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": parts}) + "\n")
    assert read_prompt_file(f)[0]["messages"] == parts
    f.write_text(json.dumps({"messages": plain}) + "\n" + json.dumps({"messages": image}) + "\n")
    with pytest.raises(UserError, match=r"p\.jsonl:2: 'messages': messages\[1\]\.content: only text parts"):
        read_prompt_file(f)
    f.write_text(json.dumps({"messages": []}) + "\n")
    with pytest.raises(UserError, match=r"p\.jsonl:1: 'messages': a conversation must be a non-empty list"):
        read_prompt_file(f)


def test_a_refused_session_stream_leaves_the_running_ones_stats(worded):
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3") as s:
        want = [t for chunk in s.stream_ids([3, 1, 4], 8) for t in chunk]
        a = s.stream_ids([3, 1, 4], 8)
        got = next(a)
        with pytest.raises(UserError, match="the prompt is empty"):
            s.stream_ids([], 4, logprobs=2)
        got += [t for chunk in a for t in chunk]
        st = s.stats()
        assert got == want and st["output_token_ids"] == want and st["prompt_ids"] == [3, 1, 4]
        assert "output_logprobs" not in st


def _chat_folder(folder: Path, config: dict, special_tokens_map: dict | None = None) -> Path:
    """A word-level tokenizer with a chat template's special tokens, and ``config`` as its
    tokenizer_config.json (``special_tokens_map`` as special_tokens_map.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir()
    tok = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config}))
    if special_tokens_map is not None:
        (folder / "special_tokens_map.json").write_text(json.dumps(special_tokens_map))
    return folder


CHAT = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}" \
       "{% if add_generation_prompt %}assistant:{% endif %}"


def test_named_chat_templates_render_the_default_one_as_transformers_does(tmp_path):
    """tokenizer_config.json's chat_template as a list of named templates (transformers'
    format for several, e.g. "default" and "tool_use"): the default one renders, as in
    apply_chat_template without tools."""
    import transformers

    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "named", {"bos_token": "<s>", "eos_token": "</s>", "chat_template": [
        {"name": "tool_use", "template": "TOOLS " + CHAT}, {"name": "default", "template": CHAT}]})
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(conv, tokenize=False,
                                                                              add_generation_prompt=True)
    assert Text(f).render_chat(conv) == want == "<s>system: be brief</s>user: hi</s>assistant:"


def test_special_tokens_of_special_tokens_map_json_reach_the_template_as_in_transformers(tmp_path):
    """A tokenizer saved before transformers 4.34 (no added_tokens_decoder) may name its
    special tokens in special_tokens_map.json only, or there over tokenizer_config.json:
    the template gets them as transformers gives them."""
    import transformers

    from specrt.runtime.text import Text

    conv = [{"role": "user", "content": "hi"}]
    for name, config, named in (
            ("only", {"chat_template": CHAT}, {"bos_token": {"content": "<s>", "lstrip": False, "normalized": False,
                                                             "rstrip": False, "single_word": False},
                                               "eos_token": "</s>"}),
            ("over", {"chat_template": CHAT, "bos_token": "<unk>", "eos_token": "</s>"}, {"bos_token": "<s>"})):
        f = _chat_folder(tmp_path / name, config, named)
        want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(conv, tokenize=False,
                                                                                  add_generation_prompt=True)
        assert Text(f).render_chat(conv) == want == "<s>user: hi</s>assistant:", name


def _byte_fallback(folder):
    """A SentencePiece-style tokenizer with ByteFallback (as Llama 2's, Mistral's): a few
    letters, and anything else as its UTF-8 bytes' tokens <0xNN>."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for c in "▁Helowrd":
        vocab[c] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(folder / "tokenizer.json"))
    return tok


def test_the_tokens_through_a_stop_string_are_the_fewest_with_byte_fallback(tmp_path):
    """The tokens kept at a stop string (Session.stream's output_token_ids) are the fewest
    whose text holds it, also where a run of byte tokens goes on past the character that
    completed it (a cut later in the run decodes to U+FFFDs: a bisection over every cut
    kept two emoji too many)."""
    from specrt.runtime.text import Text, tokens_through

    tok = _byte_fallback(tmp_path)
    text = Text(tmp_path)
    for s in ("He🙂🙂🙂 world", "Hé中🙂 ol🙂é", "🙂"):
        ids = tok.encode(s, add_special_tokens=False).ids
        full = text.decode(ids)
        assert full == s
        for end in range(len(full) + 1):
            fewest = next(k for k in range(len(ids) + 1) if text.decode(ids[:k]).startswith(full[:end]))
            assert tokens_through(text, ids, end) == fewest, (s, end)
    ids = tok.encode("🙂🙂", add_special_tokens=False).ids[1:]  # an output that starts with a byte token
    assert text.decode(ids) == "🙂🙂" and ids[0] in text.byte_fallback_ids
    assert [tokens_through(text, ids, end) for end in (0, 1, 2)] == [0, 4, 8]


def test_a_byte_fallback_stream_spells_the_decoding_when_bytes_are_not_utf8(tmp_path):
    """SentencePiece-style ByteFallback (Llama 2, Mistral) decodes a run of byte tokens
    together, one U+FFFD per token when the run is not UTF-8: a newline's byte token then
    a cut emoji decode to U+FFFDs, so the newline is not final when it comes. Pushed in any
    chunks, the stream spells the decoding of the tokens."""
    from specrt.runtime.text import Detokenizer, Text

    tok = _byte_fallback(tmp_path)
    text = Text(tmp_path)
    ids = tok.encode("Hello\n", add_special_tokens=False).ids + [3 + 0xF0, 3 + 0x9F, 1, 3 + 0x98] \
        + tok.encode(" world", add_special_tokens=False).ids
    assert text.decode(ids[:7]) == "Hello\n" and "\n" not in text.decode(ids)  # the newline's text is not final
    assert ids[6] == 3 + 0x0A
    assert Detokenizer(text).push(ids[:7]) == "Hello"  # only the trailing run of byte tokens is held back
    for ids in (ids, ids[6:]):  # (a stream whose tokens are all byte tokens so far, too)
        for n in (1, 2, 3):
            for end in range(1, len(ids) + 1):
                d = Detokenizer(text)
                pieces = "".join(d.push(ids[i:min(i + n, end)]) for i in range(0, end, n))
                assert pieces + d.flush() == text.decode(ids[:end]), (n, end)


def test_a_completion_is_decoded_after_the_prompts_last_whole_characters_with_byte_fallback(tmp_path):
    """The prompt's tokens a completion is decoded after (context_of), with SentencePiece-style
    ByteFallback, whose decoder drops the space before a text's first word: a trailing run
    of byte tokens is left out (a completion's byte tokens would decode in one run with
    them), and a prompt whose every tail holds a byte that is not UTF-8 gives none. After
    that context the Detokenizer holds back only a trailing run of byte tokens, and flushes
    it as the text after the context; a context whose text the completion rewrites where
    they meet gives the completion's own decoding."""
    from specrt.runtime.text import Detokenizer, Text, completion_text, context_of

    tok = _byte_fallback(tmp_path)
    text = Text(tmp_path)
    prompt = tok.encode("Hello 🙂", add_special_tokens=False).ids  # (ends with the emoji's 4 byte tokens)
    context = context_of(text, prompt)
    assert context == prompt[-8:-4] and text.decode(context) == "llo ", context
    out = tok.encode("world", add_special_tokens=False).ids + [3 + 0xF0]  # a word, then a cut character's byte
    assert text.decode(out) == "world\ufffd"  # (alone: no space before it)
    d = Detokenizer(text, context)
    assert d.push(out) == " world"  # all but the byte token
    assert d.flush() == "\ufffd" and d.full == " world\ufffd"
    # the prompt's own byte run as the context: joined with the cut character's byte, all U+FFFDs
    assert completion_text(text, [3 + 0xF0], prompt) == "\ufffd"
    bad = tok.encode("He", add_special_tokens=False).ids
    assert context_of(text, bad + [3 + 0xF0] + bad[1:]) == []


def test_a_message_field_that_is_null_is_left_out_as_transformers_leaves_it_out(tmp_path):
    """An OpenAI-style message with ``"tool_calls": null`` (as an SDK's messages dump): the
    template does not see the key (Llama 3.1's tests ``'tool_calls' in message``), as in
    transformers' apply_chat_template; the assistant's turn is not lost."""
    import transformers

    from specrt.runtime.text import Text

    template = ("{% for m in messages %}{% if 'tool_calls' in m %}[call]{% else %}{{ m.role }}: {{ m.content }}"
                "{% endif %}{{ '(' + m.name + ')' if m.name is defined }};{% endfor %}")
    f = _chat_folder(tmp_path / "nulls", {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template})
    conv = [{"role": "user", "content": "hi", "name": None}, {"role": "assistant", "content": "hello",
                                                             "tool_calls": None}, {"role": "user", "content": "more"}]
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(conv, tokenize=False,
                                                                              add_generation_prompt=True)
    assert Text(f).render_chat(conv) == want == "user: hi;assistant: hello;user: more;"
    assert conv[1]["tool_calls"] is None  # the caller's messages are left as they were


def test_a_messages_reasoning_reaches_the_template_under_each_name_as_in_transformers(tmp_path):
    """An assistant's reasoning sent as "reasoning" (vLLM's responses name it so), "thinking"
    (gpt-oss's template reads that) or "reasoning_content" (Qwen3's): the template sees it
    under the names transformers' apply_chat_template gives it (it was dropped from a Qwen3
    prompt unless sent as reasoning_content)."""
    import transformers

    from specrt.runtime.text import Text

    template = ("{% for m in messages %}{{ m.role }}: {{ m.content }}{% if m.reasoning_content is defined %}"
                " R={{ m.reasoning_content }}{% endif %}{% if m.thinking is defined %} T={{ m.thinking }}{% endif %};"
                "{% endfor %}")
    f = _chat_folder(tmp_path / "reasoning", {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template})
    hf = transformers.AutoTokenizer.from_pretrained(f)
    for fields in ({"reasoning": "r"}, {"thinking": "t"}, {"reasoning_content": "c"},
                   {"reasoning": "r", "thinking": "t"}, {"reasoning_content": "c", "reasoning": "r"},
                   {"reasoning": None, "thinking": "t"},
                   {"reasoning_content": "c", "thinking": "t"},  # (m71a-36: its own thinking kept)
                   {"reasoning": ""}):  # (m71a-137: an empty one is one too)
        conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", **fields},
                {"role": "user", "content": "more"}]
        want = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert Text(f).render_chat(conv) == want, fields
    assert Text(f).render_chat(conv[:1] + [{"role": "assistant", "content": "a", "reasoning": "r"}]) == \
        "user: q;assistant: a R=r T=r;"


def test_split_special_tokens_encodes_a_special_tokens_text_as_text_as_transformers_does(tmp_path):
    """tokenizer_config.json's split_special_tokens: true: "<|im_end|>" typed in a prompt is
    text (here the unknown word), not the special token, as transformers encodes it (it was
    the special token); without it, the special token."""
    import transformers
    from tokenizers import AddedToken

    from specrt.runtime.text import Text

    for split in (True, False):
        f = _chat_folder(tmp_path / f"split-{split}", {"split_special_tokens": split, "chat_template": CHAT,
                                                        "bos_token": "<s>", "eos_token": "</s>"})
        tok = transformers.AutoTokenizer.from_pretrained(f).backend_tokenizer
        tok.add_special_tokens([AddedToken("<|im_end|>", special=True)])
        tok.save(str(f / "tokenizer.json"))
        hf = transformers.AutoTokenizer.from_pretrained(f)
        want = hf("<s> <|im_end|> </s>", add_special_tokens=False)["input_ids"]
        got = Text(f).encode("<s> <|im_end|> </s>", chat=False)
        assert got == want == ([0, 2, 1] if split else [0, 3, 1]), (split, got, want)


@pytest.mark.parametrize("gov", ["off", "fixed:3"])
def test_streams_of_one_session_from_two_threads_take_turns(worded, gov, monkeypatch):
    """A stream started from another thread while one is inside a round: the newer stream's
    tokens are the target's (the older round's rows were committed into its caches: other
    tokens under ``off``, an InternalError with a draft), the older one is superseded or
    finishes first. Thread A is held just after an engine call of its second round."""
    from specrt.runtime.session import Session
    from tests.runtime.test_generate import two_threads

    with Session(worded, governor=gov) as s:
        want_a, want_b = (list(t for c in s.stream_ids(p, 24) for t in c) for p in ([3, 1, 4], [5, 9, 2, 6, 5]))
        got = two_threads(monkeypatch, lambda: [t for c in s.stream_ids([3, 1, 4], 24) for t in c],
                          lambda: s.stream_ids([5, 9, 2, 6, 5], 24))
    assert got["b"] == want_b, got
    assert got["a"] == want_a or "superseded" in got["a"], got


def test_stats_of_a_session_streamed_from_two_threads_describe_one_stream(worded, monkeypatch):
    """stats() asked while another thread starts a stream, held just after the generator's
    telemetry and finish were reset for it: they describe that stream whole (its prompt, no
    output yet, no finish; stats() waits for the start), not the new stream's telemetry
    with the older stream's prompt and output ids (set after the lock was let go)."""
    import threading

    from specrt.runtime.session import Session

    held, go, got = threading.Event(), threading.Event(), {}
    with Session(worded, governor="fixed:3") as s:
        older = list(s.stream_ids([3, 1, 4], 8))
        assert older and s.stats()["prompt_ids"] == [3, 1, 4]
        reset = s.generator.telemetry

        class Prompt(list):  # B's prompt: read once its stream has reset the telemetry, B is held
            def __iter__(self):
                if threading.current_thread().name == "B" and s.generator.telemetry is not reset \
                        and not held.is_set():
                    held.set()
                    go.wait(10)
                return super().__iter__()

        def b():
            got["stream"] = s.stream_ids(Prompt([5, 9, 2, 6, 5]), 8)

        def ask():
            got["stats"] = s.stats()

        tb = threading.Thread(target=b, name="B")
        tb.start()
        assert held.wait(10)
        asker = threading.Thread(target=ask)
        asker.start()
        asker.join(1)  # (it waits for B's start: the stats would be B's either way)
        go.set()
        tb.join(10)
        asker.join(10)
        st = got["stats"]
        assert (st["prompt_ids"], st["output_token_ids"], st["finish_reason"], st["prompt_tokens"]) == \
            ([5, 9, 2, 6, 5], [], None, 0), st
        newer = [t for c in got["stream"] for t in c]
        st = s.stats()
        assert (st["prompt_ids"], st["output_token_ids"], st["prompt_tokens"]) == ([5, 9, 2, 6, 5], newer, 5), st


def _a_held_while_b_starts(a, b, held, go) -> None:
    """Thread A runs ``a`` until it sets ``held`` (and waits for ``go``); thread B then runs
    ``b`` for up to a second before A goes on; both are joined."""
    import threading

    ta, tb = threading.Thread(target=a, name="A"), threading.Thread(target=b, name="B")
    ta.start()
    assert held.wait(10)
    tb.start()
    tb.join(1)
    go.set()
    ta.join(10)
    tb.join(10)


@pytest.mark.parametrize("at", ["found", "close", "finish"])
def test_a_stop_string_leaves_a_stream_started_since_in_another_thread_its_own_finish(worded, monkeypatch, at):
    """Thread A's text stream reaches its stop string; thread B starts a stream just as A
    has found it, as A closes its decoding, or as A makes its finish once it found its
    stream the latest (A held there): B's stream shows no finish until it has one (A's
    "stop" was set on the generator after B's start, and B's stats() said "stop")."""
    import threading

    from specrt.runtime import generate as G
    from specrt.runtime import session as S
    from specrt.runtime.session import Session

    close, finished, held, go, got = G.Stream.close, S.Finished, threading.Event(), threading.Event(), {}

    def hold_a():
        if threading.current_thread().name == "A" and not held.is_set():
            held.set()
            go.wait(10)

    def close_holding_a(self):
        close(self)
        hold_a()  # A's stop string: its decoding closed

    class Scanner(S.StopScanner):
        def push(self, text):
            piece = super().push(text)
            if self.hit:  # A's stop string found, its decoding not yet closed
                hold_a()
            return piece

    def finish_holding_a(reason):
        if reason == "stop":  # A's stream the latest, its finish not yet set
            hold_a()
        return finished(reason)

    with Session(worded, governor="fixed:3") as s:
        full = "".join(s.stream("w3 w1 w4", max_new_tokens=24))
        stop = " ".join(full.split(" ")[8:10])
        want = "".join(s.stream("w3 w1 w4", max_new_tokens=24, stop=stop))
        assert len(want) < len(full)
        if at == "found":
            monkeypatch.setattr(S, "StopScanner", Scanner)
        elif at == "close":
            monkeypatch.setattr(G.Stream, "close", close_holding_a)
        else:
            monkeypatch.setattr(S, "Finished", finish_holding_a)

        def a():
            got["a"] = "".join(s.stream("w3 w1 w4", max_new_tokens=24, stop=stop))

        def b():
            got["b"] = s.stream_ids([5, 9, 2, 6, 5], 8)

        _a_held_while_b_starts(a, b, held, go)  # (B waits for A's stop: its finish would be its own either way)
        assert got["a"] == want
        st = s.stats()
        assert (st["prompt_ids"], st["finish_reason"]) == ([5, 9, 2, 6, 5], None), st
        list(got["b"])
        assert s.stats()["finish_reason"] in ("length", "eos")


def test_a_stop_string_leaves_the_finish_of_a_like_stream_started_since(worded, monkeypatch):
    """Thread A's text stream has found its stop string; before A goes on, another stream of
    the same prompt starts and runs to A's tokens so far and its own finish: A keeps its
    "stop" to itself because the latest stream's output list is not its own list, though
    the two hold the same tokens (a finish set on equal tokens was set on the other stream)."""
    import threading

    from specrt.runtime import session as S
    from specrt.runtime.session import Session

    held, go, got = threading.Event(), threading.Event(), {}

    class Scanner(S.StopScanner):
        def push(self, text):
            piece = super().push(text)
            if self.hit and threading.current_thread().name == "A" and not held.is_set():
                held.set()  # A's stop string found, the generator's lock not held
                go.wait(10)
            return piece

    with Session(worded, governor="fixed:3") as s:
        full = "".join(s.stream("w3 w1 w4", max_new_tokens=24))
        stop = " ".join(full.split(" ")[8:10])
        want = "".join(s.stream("w3 w1 w4", max_new_tokens=24, stop=stop))
        monkeypatch.setattr(S, "StopScanner", Scanner)

        def a():
            got["a"] = "".join(s.stream("w3 w1 w4", max_new_tokens=24, stop=stop))

        ta = threading.Thread(target=a, name="A")
        ta.start()
        try:
            assert held.wait(10)
            ids, made = list(s.last_prompt_ids), list(s.last_output_ids)  # A's, where it was held
            assert [t for c in s.stream_ids(ids, len(made)) for t in c] == made
            own = s.stats()
            assert own["output_token_ids"] == made and own["finish_reason"] in ("length", "eos"), own
        finally:
            go.set()
            ta.join(10)
        assert got["a"] == want
        st = s.stats()
        assert (st["prompt_ids"], st["output_token_ids"], st["finish_reason"]) == (ids, made, own["finish_reason"]), st


@pytest.mark.parametrize("text", [False, True])
def test_stats_as_a_round_lets_the_lock_go_hold_its_tokens(worded, text):
    """stats() asked as soon as a round of a stream of ids or of text lets the generator's
    lock go (here in the stream's thread, where another thread's stats() would get the lock):
    the output ids hold the round's tokens, as the telemetry counts the round (they were
    added after the lock was let go: one round behind it)."""
    from specrt.runtime.session import Session

    class Probe:  # the generator's lock, stats() taken each time it is let go whole
        def __init__(self, lock):
            self.lock, self.depth, self.seen, self.asking = lock, 0, [], False

        def __enter__(self):
            self.lock.acquire()
            self.depth += 1

        def __exit__(self, *exc):
            self.depth -= 1
            self.lock.release()
            if self.depth == 0 and not self.asking:
                self.asking = True  # (stats()'s own use of the lock is not probed)
                st = s.stats()
                # tokens made: the prefill's, then each round's one and its accepted drafts
                made = 1 + st["rounds"] + st["accepted"] if st["prompt_tokens"] else 0
                self.seen.append((len(st["output_token_ids"]), made))
                self.asking = False

    with Session(worded, governor="fixed:3") as s:
        s.generator.lock = probe = Probe(s.generator.lock)
        if text:
            "".join(s.stream([3, 1, 4], max_new_tokens=24))
            got = s.stats()["output_token_ids"]
        else:
            got = [t for c in s.stream_ids([3, 1, 4], 24) for t in c]
    assert len(got) == 24 and len(set(probe.seen)) > 4 and probe.seen[-1] == (24, 24), probe.seen
    assert all(n == made for n, made in probe.seen), probe.seen


def test_stats_after_a_text_stream_and_one_another_thread_starts_describe_the_later(worded, monkeypatch):
    """Thread A starts a text stream (Session.stream) and is held just after its decoding
    started, before it took its ids and context; thread B streams a text then: B's start
    waits for A's, and stats() describe B's stream, its prompt, output and telemetry, the
    context (serve's text offsets count from it) B's (A named its prompt and detokenizer's
    ids after B had started: B's telemetry with A's ids; A's stop string could have set B's
    finish)."""
    import threading

    from specrt.runtime.session import Session
    from specrt.runtime.text import completion_text, context_of

    held, go, got = threading.Event(), threading.Event(), {}
    with Session(worded, governor="fixed:3") as s:
        stream_ids = s.stream_ids

        def holding_a(*a, **k):  # A's decoding started, its ids not yet named
            gen = stream_ids(*a, **k)
            if threading.current_thread().name == "A" and not held.is_set():
                held.set()
                go.wait(10)
            return gen

        monkeypatch.setattr(s, "stream_ids", holding_a)

        def a():
            try:
                "".join(s.stream("w3 w1 w4", max_new_tokens=8))
            except UserError as e:  # (B's start superseded it, before or after its first piece)
                got["a"] = str(e)

        def b():
            got["b"] = "".join(s.stream([5, 9, 2, 6, 5], max_new_tokens=8))

        _a_held_while_b_starts(a, b, held, go)  # (B waits for A's start: its ids would be named last either way)
        st, context = s.stats(), context_of(s.text, [5, 9, 2, 6, 5])
        assert s.last_context == context != context_of(s.text, [3, 1, 4])
        assert (st["prompt_ids"], st["prompt_tokens"], st["new_tokens"]) == ([5, 9, 2, 6, 5], 5,
                                                                             len(st["output_token_ids"])), st
        assert got["b"] == completion_text(s.text, st["output_token_ids"], context) != "", (got, st)


def test_a_stream_of_a_session_closed_since_is_a_user_error(worded):
    """A stream read after its Session was closed (left its ``with`` block), before its
    first piece or between pieces: a UserError saying so (an InternalError from the
    released engines before)."""
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3") as s:
        text, ids = s.stream("w3 w1 w4", max_new_tokens=8), s.stream_ids([3, 1, 4], 8)
        next(text)
    for stream in (text, ids):
        with pytest.raises(UserError, match="this Session is closed"):
            list(stream)


def test_a_closed_sessions_governor_and_growth_calls_are_user_errors(worded, tmp_path):
    """new_governor, save_growth and load_growth after close(): "this Session is closed", as
    a stream says (they made a governor, loaded sequences or wrote a file for a Session that
    runs nothing more); a growth file saved before close() is left as it was."""
    from specrt.runtime.session import Session

    grow = tmp_path / "g.npz"
    with Session(worded, governor="fixed:1:ngram:grow") as s:
        "".join(s.stream("w3 w1 w4 w3 w1", max_new_tokens=6))
        s.save_growth(grow)
    saved = grow.read_bytes()
    for call in (s.new_governor, lambda: s.save_growth(grow), lambda: s.load_growth(grow),
                 lambda: s.save_growth(tmp_path / "new.npz")):
        with pytest.raises(UserError, match="^this Session is closed"):
            call()
    assert grow.read_bytes() == saved and not (tmp_path / "new.npz").exists()


def test_a_session_whose_engines_are_rebuilt_while_it_opens_says_so_and_lets_them_go(worded, tmp_path, monkeypatch):
    """`specrt build --force` renaming a new folder into place after the engines were activated,
    while the session made its generator (the corpus, read last): said as the rebuild, naming
    the folder (mutation round m70a-24: the session's own check dropped, the session opened on a
    mix of two builds' files), and the engines' sessions are let go (m70a-25: kept active)."""
    import shutil

    from specrt.runtime.generate import Generator
    from specrt.runtime.session import Session

    eng = tmp_path / "engines"
    shutil.copytree(worded, eng)
    made, resolve = [], Generator.resolve_tree_width

    def then_rebuilt(self):
        made.append(self.e)
        shutil.copytree(eng, tmp_path / "new")
        eng.rename(tmp_path / "old")
        (tmp_path / "new").rename(eng)
        return resolve(self)

    monkeypatch.setattr(Generator, "resolve_tree_width", then_rebuilt)
    with pytest.raises(UserError, match=f"^{re.escape(str(eng))}: replaced while its engines were being loaded"):
        Session(eng)
    assert made and not made[0].is_active and not any(r.is_active for r in made[0].runners.values())


def test_api_arguments_of_other_types_are_user_errors_or_taken(worded):
    """Session's ``sampling`` not a SamplingParams, SamplingParams' temperature / top_p not
    numbers, ``prefix_snapshots`` not an integer >= 0, ``stop`` neither strings nor None:
    UserErrors naming the argument (AttributeError / TypeError / ValueError deep inside
    before, a negative ``prefix_snapshots`` taken as 0). ``stop=None`` is no stop string and
    token ids as a tuple or a numpy array are token ids (TypeError, ValueError before)."""
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import Session

    for kw, name in (({"sampling": {"temperature": 0.7}}, "sampling="), ({"prefix_snapshots": "4"}, "prefix_snapshots="),
                     ({"prefix_snapshots": -1}, "prefix_snapshots="),
                     ({"prefix_snapshots": True}, r"^prefix_snapshots=True: expected an integer")):  # (S04)
        with pytest.raises(UserError, match=name):
            Session(worded, governor="off", **kw)
    for kw, name in (({"temperature": "0.7"}, "temperature="), ({"temperature": None}, "temperature="),
                     ({"top_p": "0.9"}, "top_p=")):
        with pytest.raises(UserError, match=name):
            SamplingParams(**kw)
    with Session(worded, governor="fixed:3") as s:
        want = "".join(s.stream([3, 1, 4], max_new_tokens=8))
        with pytest.raises(UserError, match="stop=3: expected a string or a list of strings"):
            "".join(s.stream([3, 1, 4], max_new_tokens=8, stop=3))
        assert "".join(s.stream([3, 1, 4], max_new_tokens=8, stop=None)) == want
        assert "".join(s.stream((3, 1, 4), max_new_tokens=8)) == want
        assert "".join(s.stream(np.array([3, 1, 4]), max_new_tokens=8)) == want


def test_an_interrupt_while_a_snapshot_is_swapped_in_leaves_no_rows_to_reuse(worded, monkeypatch):
    """Ctrl-C (a KeyboardInterrupt, as a notebook's interrupt raises it) just after a
    prefix snapshot's target rows are loaded, before its draft rows and tokens are: the
    next stream reuses nothing of the half-swapped caches, and its tokens are the target's
    (the live conversation's tokens were kept against the snapshot's rows before)."""
    from specrt.runtime.kvcache import KVCache
    from specrt.runtime.session import Session

    a, b = [3, 1, 4, 1, 5, 9, 2, 6] * 5, [7, 2, 8, 1, 8, 2, 8] * 5
    with Session(worded, governor="off", reuse_prefix=False) as ref:
        want = [t for c in ref.stream_ids(b + [5], 16) for t in c]
    load = KVCache.load_rows

    def load_interrupted(self, rows):
        load(self, rows)
        raise KeyboardInterrupt

    with Session(worded, governor="fixed:3", prefix_snapshots=2) as s:
        for p in (a, b):  # b sets a aside
            list(s.stream_ids(p, 4))
        monkeypatch.setattr(KVCache, "load_rows", load_interrupted)
        with pytest.raises(KeyboardInterrupt):
            list(s.stream_ids(a + [5], 4))  # swaps a in
        monkeypatch.setattr(KVCache, "load_rows", load)
        assert [t for c in s.stream_ids(b + [5], 16) for t in c] == want


def test_a_session_closed_from_another_thread_ends_its_stream_between_rounds(worded, monkeypatch):
    """close() from another thread while a stream is inside a round (held just after its
    second draft call): the round finishes on the engines, then the stream raises the
    closed Session's UserError (the round's verify call ran on released engines before: an
    InternalError)."""
    import threading

    from specrt.runtime import generate as G
    from specrt.runtime.session import Session

    run, held, go, calls = G.Generator._run, threading.Event(), threading.Event(), {"draft": 0}

    def run_holding(self, runner, feeds, what):
        out = run(self, runner, feeds, what)
        if threading.current_thread().name == "A" and what == "draft":
            calls["draft"] += 1
            if calls["draft"] == 2:
                held.set()
                go.wait(10)
        return out

    monkeypatch.setattr(G.Generator, "_run", run_holding)
    s, got = Session(worded, governor="fixed:3"), {}

    def a():
        try:
            got["a"] = [t for c in s.stream_ids([3, 1, 4], 30) for t in c]
        except Exception as e:  # noqa: BLE001 (the test reports it)
            got["a"] = e

    ta = threading.Thread(target=a, name="A")
    ta.start()
    assert held.wait(10)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(0.5)  # (it waits for the round)
    go.set()
    ta.join(10)
    closer.join(10)
    assert isinstance(got["a"], UserError) and "this Session is closed" in str(got["a"]), got


def _metaspace(folder):
    """A SentencePiece-style (Unigram, Metaspace) tokenizer as Llama 2's, T5's: words ▁w1 ..
    ▁w13, whose "▁" is the space before them, and "s" and "!" that go on a word; the
    decoder drops the space before a text's first word."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pieces = [("<unk>", 0.0), *((f"\u2581w{i}", -1.0) for i in range(1, 14)), ("s", -2.0), ("!", -2.0)]
    tok = Tokenizer(models.Unigram(pieces, unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.save(str(folder / "tokenizer.json"))
    return tok


@pytest.fixture(scope="module")
def metaspace(tmp_path_factory):
    return _tiny_text_pair(tmp_path_factory.mktemp("metaspace"), 16, 12, _metaspace)


def test_a_completion_is_the_text_it_adds_after_the_prompt_with_a_sentencepiece_tokenizer(metaspace, tmp_path):
    """A completion's text (Session.stream: run, chat, serve) is what its tokens add after
    the prompt's text, as vLLM gives it: with a Metaspace decoder the space before its first
    word too, which decoding it alone drops (transformers' ``decode(out[len(prompt):])``);
    the same through `specrt run`."""
    from specrt.runtime.session import Session

    spaced = 0
    for gov in ("off", "fixed:3"):
        with Session(metaspace, governor=gov) as s:
            for prompt in ("w1 w2 w3", "w9s!", "w4"):
                got = "".join(s.stream(prompt, max_new_tokens=12))
                ids, out = s.last_prompt_ids, s.stats()["output_token_ids"]
                before, whole = s.text.decode(ids), s.text.decode(ids + out)
                assert before == prompt and whole.startswith(before), (gov, prompt)
                assert got == whole[len(before):], (gov, prompt, got, whole)
                if s.text.tokenizer.id_to_token(out[0]).startswith("\u2581"):
                    assert got[0] == " " and got == " " + s.text.decode(out), (gov, prompt)
                    spaced += 1
    assert spaced  # (a completion began with a word)
    stats = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["run", str(metaspace), "--prompt", "w1 w2 w3", "--max-new-tokens", "12",
                                  "--governor", "off", "--stats", str(stats)])
    assert r.exit_code == 0, r.output
    from specrt.runtime.text import Text

    text, st = Text(metaspace / "export"), json.loads(stats.read_text())["prompts"][0]
    assert r.stdout == text.decode(st["prompt_ids"] + st["output_token_ids"])[len("w1 w2 w3"):] + "\n"


@pytest.mark.parametrize("make", [_byte_bpe, _byte_fallback, _metaspace])
def test_the_detokenizer_decodes_the_prompts_context_once(make, tmp_path):
    """The Detokenizer decodes the prompt's context (context_of, up to 24 tokens) once, not
    at each of a push's one or two decodings of the text after it (two with a trailing run
    of ByteFallback byte tokens): random prompts and outputs over byte-level BPE, ByteFallback
    and Metaspace vocabularies, pushed in random chunks, give the pieces of one that decodes
    the context every time, with that many fewer decodings; tokens_through (which keeps the
    context's text too, decoding the context alone once more at most, for its empty cut) the
    fewest tokens that write a text's prefix."""
    import random

    from specrt.runtime.text import Detokenizer, Text, completion_text, context_of, tokens_through

    make(tmp_path)
    text = Text(tmp_path)
    vocab, rng, calls, seen = text.tokenizer.get_vocab_size(), random.Random(0), [0], []
    decode = text.decode
    text.decode = lambda ids: calls.append(calls.pop() + 1) or seen.append(list(ids)) or decode(ids)

    def decodings(call, *args):
        n = calls[0]
        return call(*args), calls[0] - n

    for _ in range(60):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        context = context_of(text, prompt)
        d, ref = Detokenizer(text, context), Detokenizer(text, context)
        ref.before = None  # (the context decoded at every push)
        pieces, at = [], 0
        while at < len(ids):
            n = rng.randrange(1, 5)
            (piece, ours), (want, theirs) = decodings(d.push, ids[at:at + n]), decodings(ref.push, ids[at:at + n])
            run = bool(d.ids) and d.ids[-1] in text.byte_fallback_ids
            assert piece == want and theirs - ours == (1 + run if context else 0), (prompt, ids)
            pieces.append(piece)
            at += n
        (piece, ours), (want, theirs) = decodings(d.flush), decodings(ref.flush)
        assert piece == want and theirs - ours == (1 if context else 0)
        whole = completion_text(text, ids, context)
        assert "".join(pieces) + piece == whole
        for end in sorted({0, len(whole) // 2, len(whole)}):
            seen.clear()
            k = tokens_through(text, ids, end, context)
            assert not context or seen.count(context) <= 2, (prompt, ids, end)
            assert completion_text(text, ids[:k], context).startswith(whole[:end])
            assert k == 0 or not completion_text(text, ids[:k - 1], context).startswith(whole[:end])


def test_a_missing_chat_template_is_named_as_the_caller_asked_for_it(metaspace, tmp_path):
    """Engines whose tokenizer has no chat template: the Python API's error names its
    argument (chat=True, or the conversation given as the prompt), not the CLI's --chat;
    `specrt run`, `specrt calibrate` and `specrt bench` name their --chat."""
    from specrt.runtime.session import Session

    with Session(metaspace, governor="off") as s:
        for call in (lambda: list(s.stream("w1 w2", chat=True)), lambda: s.encode("w1 w2", chat=True)):
            with pytest.raises(UserError) as e:
                call()
            assert str(e.value).startswith("chat=True: the exported tokenizer has no chat template"), str(e.value)
        with pytest.raises(UserError) as e:
            list(s.stream([{"role": "user", "content": "w1"}]))
        assert str(e.value).startswith("a conversation (a list of messages): the exported tokenizer has no chat "
                                       "template"), str(e.value)
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "w1 w2"}\n{"prompt": "w3"}\n')
    for args in (["run", str(metaspace), "--prompt", "w1 w2", "--chat"],
                 ["calibrate", str(metaspace), "--prompts", str(f), "--chat", "--max-new-tokens", "4"],
                 ["bench", str(metaspace), "--prompts", str(f), "--chat", "-o", str(tmp_path / "r"), "--peers", "none",
                  "--governors", "off", "--no-profile", "--quiet"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and "--chat: the exported tokenizer has no chat template" in r.output, r.output
        assert "chat=True" not in r.output and "Traceback" not in r.output, r.output


def test_a_stats_file_replaced_keeps_its_mode(worded, tmp_path):
    """`run --stats` over an existing file (written whole: a temporary file renamed over it)
    keeps the file's mode, as `sed -i` and editors do: one made private stays private (it
    took the umask's); a new file still gets the umask's."""
    import os
    import stat

    from specrt.paths import write_atomic

    stats = tmp_path / "s.json"
    stats.write_text("{}")
    stats.chmod(0o600)
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w3 w1", "--max-new-tokens", "4", "--quiet",
                                  "--stats", str(stats)])
    assert r.exit_code == 0, r.output
    assert json.loads(stats.read_text())["new_tokens"] == 4 and stat.S_IMODE(stats.stat().st_mode) == 0o600
    other = tmp_path / "o.json"
    other.write_text("{}")
    other.chmod(0o640)
    write_atomic(other, {"a": 1})
    assert stat.S_IMODE(other.stat().st_mode) == 0o640 and json.loads(other.read_text()) == {"a": 1}
    umask = os.umask(0o027)  # (not the usual 022, whose 0644 a fixed mode would give too)
    try:
        write_atomic(tmp_path / "new.json", {})
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_replaced_file_keeps_its_owner_and_group_where_the_process_may(tmp_path):
    """As root, a file replaced whole (write_atomic: a temporary file renamed over it) keeps
    its owner and group as it keeps its mode (as GNU sed -i does: root's edit of another
    user's file left it root's, 0 / 0). A user who may not give a file away (here nobody,
    replacing root's file in a folder open to all) still replaces it, silently, the file
    then theirs, in the file's group where they are in it."""
    import stat
    import subprocess
    import sys
    import tempfile

    from specrt.paths import write_atomic

    # (another's file in root's group: its owner given all the same; set-user and set-group-ID
    # bits kept: a chown clears them, the mode is given after it)
    for uid, gid, mode in ((12345, 23456, 0o640), (12345, 0, 0o644), (12345, 23456, 0o6755)):
        f = tmp_path / f"s{gid}.{mode:o}.json"
        f.write_text("{}")
        os.chown(f, uid, gid)
        f.chmod(mode)
        write_atomic(f, {"a": 1})
        st = f.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (uid, gid, mode)
        assert json.loads(f.read_text()) == {"a": 1}
    code = ("import os, sys; from pathlib import Path; from specrt.paths import write_atomic; "
            "os.setgroups([int(g) for g in sys.argv[2:]]); os.setgid(65534); os.setuid(65534); "
            "write_atomic(Path(sys.argv[1]), {'b': 2})")
    for groups, group in (([], 65534), ([23456], 23456)):  # (not in the file's group; in it)
        with tempfile.TemporaryDirectory() as d:  # (tmp_path's folders are root's alone)
            os.chmod(d, 0o777)
            f = Path(d) / "s.json"
            f.write_text("{}")
            os.chown(f, 0, 23456)
            f.chmod(0o666)
            r = subprocess.run([sys.executable, "-c", code, str(f), *map(str, groups)], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0 and r.stdout == r.stderr == "", r
            st = f.stat()
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, group, 0o666), groups
            assert json.loads(f.read_text()) == {"b": 2}


def test_a_reader_that_leaves_ends_run_and_chat_as_sigpipe_ends_unix_tools(worded, tmp_path):
    """`specrt run ... | head -1` through a real pipe: once the reader has gone, the next
    write stops the decoding, and the command ends as `yes | head -1` ends `yes`, killed by
    SIGPIPE (a shell's status 141), saying nothing (click exited 1, specrt's code for bad
    input, without a word). The same for `chat`'s answers. 5000 prompts of 100 tokens would
    take minutes: it ends in seconds."""
    import os
    import signal
    import subprocess
    import sys

    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "w3 w1"}\n' * 5000)
    cli = [sys.executable, "-c", "from specrt.cli import entry; entry()"]
    for args, feed in ((["run", str(worded), "--prompts", str(f), "--max-new-tokens", "100", "--governor", "off"],
                        b""),
                       (["chat", str(worded), "--max-new-tokens", "100", "--governor", "off"], b"w3 w1\n" * 5000)):
        p = subprocess.Popen(cli + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, "SPECRT_THP": "0"})
        p.stdin.write(feed)
        p.stdin.close()
        assert p.stdout.readline().strip()  # an answer
        p.stdout.close()  # the reader leaves
        try:
            code = p.wait(timeout=60)  # (what it wrote to stderr by then fits the pipe)
        finally:
            p.kill()
        err = p.stderr.read().decode()
        assert code == -signal.SIGPIPE, (args[0], code, err)
        assert "Traceback" not in err and "error" not in err and "tokens in" not in err, err


@pytest.mark.parametrize("make", [_byte_bpe, _metaspace])
def test_completion_logprobs_decode_the_prompts_context_once(make, tmp_path):
    """serve's completions logprobs (text_offset) decode the prompt's context once, not at
    each token's decoding of the text after it: the same entries as one that decodes the
    context every time, with one decoding fewer a token."""
    import random

    from specrt.cmd_serve import _CompletionLogprobs
    from specrt.runtime.text import Text, context_of

    make(tmp_path)
    text = Text(tmp_path)
    vocab, rng, calls = text.tokenizer.get_vocab_size(), random.Random(1), [0]
    decode = text.decode
    text.decode = lambda ids: calls.append(calls.pop() + 1) or decode(ids)
    contexts = 0
    for _ in range(20):
        context = context_of(text, [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))])
        contexts += bool(context)
        ours, ref = _CompletionLogprobs(text, context), _CompletionLogprobs(text, context)
        ref.before = None  # (the context decoded at every token)
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
        entries = [{"id": i, "token": text.tokenizer.id_to_token(i), "logprob": -1.0, "top_logprobs": None}
                   for i in ids]
        n = calls[0]
        got = ours(entries)
        mine, n = calls[0] - n, calls[0]
        assert got == ref(entries) and calls[0] - n - mine == (len(ids) if context else 0), (context, ids)
    assert contexts


def test_text_names_a_tokenizer_file_it_cannot_read(tmp_path):
    """An export made before `specrt export` checked its tokenizer files: the tokenizers
    library's bare Exception (or json's error) was a traceback at `specrt run`."""
    from specrt.errors import UserError
    from specrt.runtime.text import Text

    _words(tmp_path)
    good = (tmp_path / "tokenizer.json").read_text()
    for name, text, message in (("tokenizer.json", "{}", "not a tokenizer the tokenizers library reads"),
                                ("tokenizer_config.json", "{", "not valid JSON"),
                                ("special_tokens_map.json", "[1]", "expected a JSON object at top level")):
        (tmp_path / "tokenizer.json").write_text(good)
        (tmp_path / name).write_text(text)
        with pytest.raises(UserError, match=f"{tmp_path / name}: {message}"):
            Text(tmp_path)
        if name == "tokenizer_config.json":
            (tmp_path / name).write_text("{}")


def test_a_folder_named_tokenizer_json_is_no_tokenizer(tmp_path):
    """Text wants tokenizer.json to be a file: a folder of that name (a damaged export) is
    said as "no tokenizer.json", not an IsADirectoryError traceback from reading it."""
    from specrt.runtime.text import Text

    (tmp_path / "tokenizer.json").mkdir()
    with pytest.raises(UserError, match="no tokenizer.json"):
        Text(tmp_path)


def test_sampling_options_at_their_edges_from_the_command_line(worded):
    """--top-k -1 is "off" as 0 is (taken), an infinite --temperature is refused naming the
    option as typed, exit 1, before anything decodes."""
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w1 w2", "--max-new-tokens", "2", "--temperature",
                                  "1", "--top-k", "-1", "--seed", "3", "--quiet"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w1 w2", "--temperature", "inf"])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert r.output == "error: --temperature inf: expected a finite number >= 0 (0 = greedy)\n", r.output


def test_sampling_options_at_temperature_0_are_said_to_change_nothing(worded):  # noqa: F811
    """`--top-p 0.5` (or --top-k, --seed, --reproducible) with greedy decoding changed nothing
    without a word: run and chat (and calibrate and bench: the same decorator) say so, naming
    the options given; sampling, or none given, says nothing."""
    said = "no effect at --temperature 0 (greedy decoding)"
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w1 w2", "--max-new-tokens", "3", "--top-p", "0.5",
                                  "--seed", "3"])
    assert r.exit_code == 0 and f"note: --top-p, --seed have {said}" in r.output, r.output
    greedy = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w1 w2", "--max-new-tokens", "3"])
    assert greedy.exit_code == 0 and said not in greedy.output
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w1 w2", "--max-new-tokens", "3", "--temperature",
                                  "0.5", "--top-p", "0.5", "--seed", "3"])
    assert r.exit_code == 0 and said not in r.output, r.output
    r = CliRunner().invoke(main, ["chat", str(worded), "--top-k", "5", "--reproducible"], input="w1\n")
    assert r.exit_code == 0 and f"note: --top-k, --reproducible have {said}" in r.output, r.output


def test_stats_in_mid_stream_count_the_tokens_so_far_and_a_closed_stream_says_interrupted(worded):
    """stats() between a stream's pieces said new_tokens 0 beside the ids so far (the count
    was set when the stream ended), and a stream its caller closed early had finish_reason
    None; a stream ended by a stop string still says "stop"."""
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3") as s:
        it = s.stream([3, 1, 4], max_new_tokens=12)
        next(it)
        mid = s.stats()
        assert mid["new_tokens"] == len(mid["output_token_ids"]) >= 1 and mid["seconds"] > 0
        assert mid["tokens_per_s"] > 0 and mid["finish_reason"] is None
        next(it)
        assert s.stats()["new_tokens"] == len(s.stats()["output_token_ids"]) > mid["new_tokens"]
        assert len(mid["output_token_ids"]) == mid["new_tokens"]  # (stats() gave a copy: S49, mutation round)
        it.close()
        st = s.stats()
        assert st["finish_reason"] == "interrupted" and st["new_tokens"] == len(st["output_token_ids"]) < 12
        whole = "".join(s.stream([3, 1, 4], max_new_tokens=12))
        assert s.stats()["finish_reason"] in ("eos", "length")
        # the answer's end could begin a stop string that never comes: held back, then given (mutation round, S27)
        assert "".join(s.stream([3, 1, 4], max_new_tokens=12, stop=[whole[-2:] + "~"])) == whole
        stop = whole.split()[1]
        assert stop not in "".join(s.stream([3, 1, 4], max_new_tokens=12, stop=[stop]))  # (the answer ends before it)
        assert s.stats()["finish_reason"] == "stop"


def test_run_says_when_a_seed_may_not_repeat_and_when_chat_templates_nothing(worded, tmp_path):  # noqa: F811
    """A user walk: `--temperature 1 --seed 7` under auto sampled another text each run (its
    rounds follow measured times: documented in --help only), and --chat beside prompt_ids
    lines templated nothing without a word."""
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt_ids": [3, 1, 4]}) + "\n" + json.dumps({"prompt": "w5 w6"}) + "\n")
    base = ["run", str(worded), "--prompts", str(p), "--max-new-tokens", "3"]
    seeded = ["--temperature", "1", "--seed", "7"]
    # ("1:tree=2" is fixed:1 with a tree: the tree's option is not read as the governor's name)
    for gov, said in (("fixed:3", False), ("off", False), ("3", False), ("1:tree=2", False), ("fixed:3:ngram", True),
                      ("adaptive", True)):
        r = CliRunner().invoke(main, [*base, *seeded, "--governor", gov])
        assert r.exit_code == 0 and ("note: --seed 7: under" in r.output) == said, (gov, r.output)
    # greedy decoding samples nothing: its own note says the seed has no effect, not that it may not repeat
    r = CliRunner().invoke(main, [*base, "--temperature", "0", "--seed", "7", "--governor", "adaptive"])
    assert r.exit_code == 0 and "note: --seed 7: under" not in r.output and "no effect" in r.output, r.output
    r = CliRunner().invoke(main, [*base, "--temperature", "1", "--seed", "-1", "--governor", "adaptive"])
    assert r.exit_code == 0 and "note: --seed" not in r.output, r.output  # (-1: no seed)
    r = CliRunner().invoke(main, [*base, *seeded, "--governor", "adaptive", "--reproducible"])
    assert r.exit_code == 0 and "note: --seed" not in r.output, r.output
    r = CliRunner().invoke(main, [*base, "--chat", "--governor", "fixed:3"])
    assert r.exit_code == 0 and "note: --chat: 1 of the 2 prompts are token ids ('prompt_ids'), used as given" \
        in r.output, r.output
    r = CliRunner().invoke(main, [*base, "--governor", "fixed:3"])
    assert r.exit_code == 0 and "note: --chat" not in r.output, r.output
    # --chat beside text prompts alone templates every one: nothing to say
    p.write_text(json.dumps({"prompt": "w5 w6"}) + "\n")
    r = CliRunner().invoke(main, [*base, "--chat", "--governor", "fixed:3"])
    assert r.exit_code == 0 and "note: --chat" not in r.output, r.output
    # and `specrt chat` says it too (a walk, w72c: the same --seed under auto gave other answers each chat, unsaid)
    for gov, more, said in (("adaptive", [], True), ("fixed:3", [], False), ("adaptive", ["--reproducible"], False)):
        r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "3", *seeded, "--governor", gov, *more],
                               input="w5 w6\n")
        assert r.exit_code == 0 and ("note: --seed 7: under" in r.output) == said, (gov, more, r.output)
    # --chat-template-kwargs where no prompt goes through the template (a README walk: taken without a word)
    kw = ["--chat-template-kwargs", '{"x": 1}', "--governor", "fixed:3"]
    said = "note: --chat-template-kwargs: no prompt"
    one = ["run", str(worded), "--prompt", "w5", "--max-new-tokens", "2"]
    for args, says in (([*base], True), ([*base, "--chat"], False), (one, True), ([*one, "--chat"], False)):
        r = CliRunner().invoke(main, [*args, *kw])
        assert r.exit_code == 0 and (said in r.output) == says, (args, r.output)
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "w5"}]}) + "\n")  # (always templated)
    r = CliRunner().invoke(main, [*base, *kw])
    assert r.exit_code == 0 and said not in r.output, r.output
    # token ids beside a text prompt that --chat templates: one prompt uses the variables, nothing to say
    p.write_text(json.dumps({"prompt_ids": [3, 1, 4]}) + "\n" + json.dumps({"prompt": "w5 w6"}) + "\n")
    r = CliRunner().invoke(main, [*base, "--chat", *kw])
    assert r.exit_code == 0 and said not in r.output and "note: --chat: 1 of the 2" in r.output, r.output


def test_a_prefill_cut_short_keeps_the_rows_it_reused(worded, monkeypatch):
    """Ctrl-C during a turn's prefill (before its first token): the rows it reused from the
    conversation so far are still in the caches, and the next turn reuses them (it reused
    nothing: `specrt chat`'s "0 of 78 prompt tokens reused", a walk, session 56), its
    tokens the target's."""
    from specrt.runtime import generate as G
    from specrt.runtime.session import Session

    a = [3, 1, 4, 1, 5, 9, 2, 6] * 4
    with Session(worded, governor="off", reuse_prefix=False) as ref:
        want = [t for c in ref.stream_ids(a + [7, 7, 2], 12) for t in c]
    target = G.Generator._target

    def cut(self, ids, at, **k):  # the cut turn's prefill, past the reused rows
        if at > 0 and len(ids) > 1 and k.get("exact"):
            raise KeyboardInterrupt
        return target(self, ids, at, **k)

    with Session(worded, governor="fixed:3") as s:
        list(s.stream_ids(a, 4))
        monkeypatch.setattr(G.Generator, "_target", cut)
        with pytest.raises(KeyboardInterrupt):
            list(s.stream_ids(a + [7, 7], 4))
        monkeypatch.setattr(G.Generator, "_target", target)
        assert [t for c in s.stream_ids(a + [7, 7, 2], 12) for t in c] == want
        assert s.stats()["prefix_reused"] >= len(a) - 1, s.stats()["prefix_reused"]


def test_chat_stopped_while_its_turn_is_tokenized_goes_on(worded, monkeypatch):
    """Ctrl-C while a turn is tokenized (before the stream exists: each turn dropped for the
    context encodes the conversation again, a long paste takes seconds) ended the whole chat
    ("Aborted!", the conversation lost): the turn is dropped as before its first token, no
    empty line is left among the answers, and the chat goes on (a walk, session 56)."""
    from specrt.runtime import session

    real, calls = session.Session.prompt_text, []

    def prompt_text(self, prompt, *a, **k):  # (what chat measures a turn with: h74c)
        calls.append(prompt)
        if isinstance(prompt, list) and prompt and prompt[-1].get("content") == "w8":
            raise KeyboardInterrupt  # the second turn's tokenizing
        return real(self, prompt, *a, **k)

    monkeypatch.setattr(session.Session, "prompt_text", prompt_text)
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "w5", "--max-new-tokens", "3", "--governor",
                                  "fixed:1"], input="w6 w7\nw8\nw9\n\n")
    assert r.exit_code == 0, r.output
    assert "[stopped before the answer began: the turn is dropped" in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("[3 tokens")]) == 2, r.output
    assert "\n\n" not in r.stdout, repr(r.stdout)  # (the dropped turn printed an empty line)


def test_a_system_prompt_that_is_not_utf8_is_named_as_the_system_prompt(worded):
    """`chat --system $'\\xe9'` (a byte that was not UTF-8, Python's lone surrogate for it) was
    refused as "the prompt is not valid UTF-8 text (byte 0xe9 after '<|im_start|>system\\n')", the
    template's text, not the option (the CLI walk's L8, session 70)."""
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "caf\udce9 au lait"], input="hi\n")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "error: --system is not valid UTF-8 text (byte 0xe9 after 'caf'; or a JSON \\udce9 escape, a UTF-16 " \
        "half)\n" in r.output, r.output


def test_chat_with_stdin_or_stdout_closed_and_an_empty_system_prompt(worded, tmp_path):
    """`specrt chat ... <&-` (stdin closed: sys.stdin None) was an AttributeError traceback,
    and so was every command with stdout closed (`>&-`) where it restarted for huge pages;
    `--system ""` gave the template's default system prompt instead of an empty one (a walk,
    session 56)."""
    import subprocess
    import sys

    from specrt.runtime.session import Session

    cmd = [sys.executable, "-c", "from specrt.cli import entry; entry()", "chat", str(worded), "--max-new-tokens", "2"]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                       preexec_fn=lambda: os.close(0))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", "from specrt.cli import entry; entry()", "--version"],
                       capture_output=False, stderr=subprocess.PIPE, text=True, timeout=300,
                       preexec_fn=lambda: os.close(1), env={**os.environ, "SPECRT_THP": "1"})
    assert "Traceback" not in r.stderr, r.stderr
    r = CliRunner().invoke(main, ["chat", str(worded), "--system", "", "--max-new-tokens", "3", "--governor",
                                  "fixed:1"], input="w6 w7\n\n")
    assert r.exit_code == 0, r.output
    with Session(worded, governor="fixed:1") as s:
        want = "".join(s.stream([{"role": "system", "content": ""}, {"role": "user", "content": "w6 w7"}],
                                max_new_tokens=3))
        n = len(s.encode([{"role": "system", "content": ""}, {"role": "user", "content": "w6 w7"}], True))
    assert f"of {n} prompt tokens reused" in r.output and want in r.output, (r.output, n, want)


def test_chat_shows_its_marker_to_someone_typing_only(worded, tmp_path):
    """`specrt chat` showed its "> " marker (on stderr) before every line of a file or pipe
    too (session 56's chat walk): only where stdin is a terminal now, as python's and
    sqlite3's prompts. A pseudo-terminal stands for the user's."""
    import pty
    import subprocess
    import sys

    cmd = [sys.executable, "-c", "from specrt.cli import entry; entry()", "chat", str(worded), "--max-new-tokens", "2",
           "--governor", "fixed:1"]
    env = {**os.environ, "SPECRT_THP": "0"}
    turns = tmp_path / "turns.txt"
    turns.write_text("w6 w7\n\n")
    with turns.open() as f:
        r = subprocess.run(cmd, stdin=f, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "tok/s" in r.stderr and "> " not in r.stderr, r.stderr
    master, slave = pty.openpty()
    try:
        os.write(master, b"w6 w7\n\n")
        r = subprocess.run(cmd, stdin=slave, capture_output=True, text=True, timeout=300, env=env)
    finally:
        os.close(slave)
        os.close(master)
    assert r.returncode == 0 and "tok/s" in r.stderr, r.stderr
    assert r.stderr.count("> ") == 2, r.stderr  # before the turn and before the empty line that ends it


def test_a_tokenizer_json_that_is_not_json_is_named_in_jsons_words(tmp_path):
    """Mutant t01 (load_tokenizer's json_object check dropped): tokenizer.json that is not
    JSON, or not an object, is said as read_json_object says it, not in tokenizers' words."""
    import pytest

    from specrt.errors import UserError
    from specrt.runtime.text import Text

    _words(tmp_path)
    for text, message in (("{", "not valid JSON"), ("[1]", "expected a JSON object at top level")):
        (tmp_path / "tokenizer.json").write_text(text)
        with pytest.raises(UserError, match=f"{tmp_path / 'tokenizer.json'}: {message}"):
            Text(tmp_path)


def test_special_tokens_map_json_is_not_laid_over_a_tokenizer_saved_by_transformers_4_34_on(tmp_path):
    """Mutant t03 (special_tokens_map.json laid over tokenizer_config.json even when it has
    added_tokens_decoder): transformers reads special_tokens_map.json for legacy tokenizers only."""
    import json

    import transformers

    from specrt.runtime.text import Text

    spec = {"special": True, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False}
    f = _chat_folder(tmp_path / "new", {"chat_template": CHAT, "bos_token": "<s>", "eos_token": "</s>",
                                        "added_tokens_decoder": {"0": {"content": "<s>", **spec},
                                                                 "1": {"content": "</s>", **spec}}},
                     {"bos_token": "<unk>"})
    conv = [{"role": "user", "content": "hi"}]
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(conv, tokenize=False,
                                                                              add_generation_prompt=True)
    assert Text(f).render_chat(conv) == want == "<s>user: hi</s>assistant:"
    assert json.loads((f / "special_tokens_map.json").read_text()) == {"bos_token": "<unk>"}


def test_additional_special_tokens_reach_the_template_as_transformers_4_gives_them(tmp_path):
    """Mutants t04 (special_tokens_map.json's additional_special_tokens not taken) and t16
    (additional_special_tokens given as AddedToken objects passed as objects): specrt renders
    as transformers 4.x (README: transformers 5 gives templates none), their contents as strings."""
    from specrt.runtime.text import Text

    tpl = "{{ additional_special_tokens | join(',') }}|{{ bos_token }}"
    legacy = _chat_folder(tmp_path / "legacy", {"chat_template": tpl, "bos_token": "<s>"},
                          {"additional_special_tokens": ["<unk>", "</s>"]})
    assert Text(legacy).render_chat("hi") == "<unk>,</s>|<s>"
    objects = _chat_folder(tmp_path / "objects", {"chat_template": tpl, "bos_token": "<s>", "additional_special_tokens": [
        {"content": "<unk>", "special": True, "lstrip": False, "rstrip": False, "normalized": False,
         "single_word": False}, "</s>"]})
    assert Text(objects).render_chat("hi") == "<unk>,</s>|<s>"


def test_chat_template_jinja_wins_over_tokenizer_config_and_its_errors_name_it(tmp_path):
    """Mutants t06 (tokenizer_config.json's chat_template preferred to chat_template.jinja) and
    t07 (errors always naming tokenizer_config.json): the .jinja file is the template, as in
    transformers, and a broken one is named."""
    import pytest
    import transformers

    from specrt.errors import UserError
    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "j", {"chat_template": "CONFIG " + CHAT, "bos_token": "<s>", "eos_token": "</s>"})
    (f / "chat_template.jinja").write_text("JINJA " + CHAT)
    conv = [{"role": "user", "content": "hi"}]
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(conv, tokenize=False,
                                                                              add_generation_prompt=True)
    assert Text(f).render_chat(conv) == want == "JINJA <s>user: hi</s>assistant:"
    (f / "chat_template.jinja").write_text("{{ raise_exception('no system role') }}")
    with pytest.raises(UserError, match=f"^{f / 'chat_template.jinja'}: chat template: no system role$"):
        Text(f).render_chat(conv)
    (f / "chat_template.jinja").write_text("{{ messages[0].content | dictsort }}")  # an error inside the template
    with pytest.raises(UserError, match=f"^{f / 'chat_template.jinja'}: chat template: AttributeError"):
        Text(f).render_chat(conv)


def test_a_template_failing_on_a_message_of_another_type_is_a_user_error(tmp_path):
    """Mutant t13 (AttributeError not caught): a template applying a filter the message's
    content does not take (dictsort over a string) is a UserError naming the file."""
    import pytest

    from specrt.errors import UserError
    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "d", {"chat_template": "{% for m in messages %}{{ m.content | dictsort }}{% endfor %}"})
    with pytest.raises(UserError, match=f"{f / 'tokenizer_config.json'}: chat template: AttributeError: 'str' object"):
        Text(f).render_chat([{"role": "user", "content": "hi"}])


def test_byte_0x80_that_is_not_utf8_is_named_as_a_byte(tmp_path):
    """Mutant t19 (0xDC80 left out of the surrogate-escape range): byte 0x80, the first a
    surrogate escape carries, is named as a byte, not as a lone surrogate."""
    import pytest

    from specrt.errors import UserError
    from specrt.runtime.text import Text

    _words(tmp_path)
    with pytest.raises(UserError, match=r"^the prompt is not valid UTF-8 text \(byte 0x80 after 'w6 '; "
                                        r"or a JSON \\udc80 escape, a UTF-16 half\)$"):
        Text(tmp_path).encode("w6 \udc80", False)
    # (the code point below it is no surrogate escape, a lone surrogate: a JSON "\udc7f")
    with pytest.raises(UserError, match=r"^the prompt holds a lone surrogate U\+DC7F \(after 'w6 '\)"):
        Text(tmp_path).encode("w6 \udc7f", False)


def test_a_rendered_chat_template_gets_no_second_bos(tmp_path):
    """Mutant t21 (special tokens added to a rendered template too): a tokenizer whose
    post-processor adds BOS gets it once through a chat template that writes it, as
    transformers' apply_chat_template; a plain text still gets it."""
    import transformers
    from tokenizers import Tokenizer, processors

    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "bos", {"chat_template": CHAT, "bos_token": "<s>", "eos_token": "</s>"})
    tok = Tokenizer.from_file(str(f / "tokenizer.json"))
    tok.add_special_tokens(["<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(f / "tokenizer.json"))
    text = Text(f)
    conv = [{"role": "user", "content": "hi"}]
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(conv, tokenize=True,
                                                                              add_generation_prompt=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    got = text.encode(conv, chat=True)
    assert got == list(want) and got.count(0) == 1
    assert text.encode("hi", chat=False)[0] == 0
    # (mutant B17, session 65) a conversation goes through the template with chat=False too, BOS once
    assert text.encode(conv, chat=False) == got


def test_decoded_text_leaves_special_tokens_out(tmp_path):
    """Mutant t22 (decode keeping special tokens): special tokens are left out of the text,
    as transformers' decode(skip_special_tokens=True) leaves them out."""
    from specrt.runtime.text import Detokenizer, Text

    tok = _byte_fallback(tmp_path)
    text = Text(tmp_path)
    ids = tok.encode("Hello", add_special_tokens=False).ids
    assert text.decode([1, *ids, 2]) == "Hello"
    d = Detokenizer(text)
    assert d.push([1, *ids, 2]) + d.flush() == "Hello"


def test_token_bytes_of_an_added_token_are_its_content_in_utf8(tmp_path):
    """Mutant t23 (added tokens read through the byte-level table): an added token whose
    characters all lie in GPT-2's byte alphabet (é is its byte 0xE9) is its content's UTF-8."""
    from tokenizers import Tokenizer

    from specrt.runtime.text import Text

    _byte_bpe(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    tok.add_special_tokens(["<|é|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    text = Text(tmp_path)
    i = tok.token_to_id("<|é|>")
    assert text.token_bytes(i) == "<|é|>".encode() and text.token_text(i) == "<|é|>"


def test_token_bytes_of_a_sentencepiece_piece_spell_its_space(tmp_path):
    """Mutant t27 (Metaspace's ▁ kept): a SentencePiece piece's ▁ is the space before it."""
    from specrt.runtime.text import Text

    tok = _metaspace(tmp_path)
    text = Text(tmp_path)
    ids = tok.encode("w1 w2s!").ids
    assert b"".join(text.token_bytes(i) for i in ids) == b" w1 w2s!"
    assert text.token_text(tok.token_to_id("\u2581w2")) == " w2"


def test_token_bytes_of_a_sentencepiece_piece_like_a_byte_token_are_its_own(tmp_path):
    """Mutation round (the length of a byte token <0xNN> left unchecked): a SentencePiece
    piece that begins "<0x" and ends ">" but is longer is its own text, not the byte its
    first two digits name."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from specrt.runtime.text import Text

    tok = Tokenizer(models.Unigram([("<unk>", 0.0), ("<0x41>", -1.0), ("<0x41x>", -1.0)], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.save(str(tmp_path / "tokenizer.json"))
    text = Text(tmp_path)
    assert text.token_bytes(tok.token_to_id("<0x41x>")) == b"<0x41x>"
    assert text.token_bytes(tok.token_to_id("<0x41>")) == b"A"  # (a byte token's byte)


def test_a_special_token_inside_a_run_of_byte_tokens_holds_the_run_back(tmp_path):
    """Mutant t28 (special tokens not in byte_fallback_ids): ByteFallback decodes a run of
    byte tokens together with the special tokens between them left out, so a byte token then
    a special token is not final: a later byte can turn the run into U+FFFDs."""
    from specrt.runtime.text import Detokenizer, Text

    _byte_fallback(tmp_path)
    text = Text(tmp_path)
    ids = [3 + 0x41, 1, 3 + 0x80]  # "A", <s>, a byte that is no UTF-8 after it
    assert text.decode(ids[:2]) == "A" and text.decode(ids) == "\ufffd\ufffd"
    d = Detokenizer(text)
    assert d.push(ids[:2]) == ""
    assert d.push(ids[2:]) + d.flush() == text.decode(ids)


def test_template_variables_must_be_names_and_not_the_ones_specrt_sets(tmp_path):
    """Mutants t30 (variable names not checked as identifiers) and t31 (add_generation_prompt
    let through, to fail later as a TypeError): both refused, naming where they came from."""
    import pytest

    from specrt.errors import UserError
    from specrt.runtime.text import Text, template_kwargs_of

    with pytest.raises(UserError, match="X: expected a JSON object of template variable names"):
        template_kwargs_of('{"a-b": 1}', "X")
    # (m71a-151: a list of two-letter names is no object: it was read as {"a": "b"})
    with pytest.raises(UserError, match=r"^X: expected a JSON object of template variable names .*\['ab'\]$"):
        template_kwargs_of('["ab"]', "X")
    # (mutant B22, session 65: a key that is no string, as the Python API may pass, an AttributeError)
    with pytest.raises(UserError, match=r"X: expected a JSON object of template variable names .*\{1: True\}"):
        template_kwargs_of({1: True}, "X")
    with pytest.raises(UserError, match="X: 'add_generation_prompt' is set by specrt, not a template variable"):
        template_kwargs_of({"add_generation_prompt": False}, "X")
    _words(tmp_path)
    with pytest.raises(UserError, match="'add_generation_prompt' is set by specrt"):
        Text(tmp_path).render_chat("w6", {"add_generation_prompt": False})


def test_template_variables_python_cannot_read_are_said_not_a_traceback():
    """m71a-39 and the bug it found: --chat-template-kwargs' JSON is said in json's words
    without its position; a number past Python's digit limit for int (ValueError, not a
    JSONDecodeError) and arrays nested past the recursion limit were tracebacks, now said as
    serve says them of a request's body and as the tokenizer files' reader says the nesting."""
    import sys

    from specrt.runtime.text import template_kwargs_of

    with pytest.raises(UserError, match=r"^X: not valid JSON \(Expecting value\); expected an object such as "
                                        r"'\{\"enable_thinking\": false\}'$"):
        template_kwargs_of('{"a": }', "X")
    with pytest.raises(UserError, match=r"^X: not valid JSON \(nested too deeply to read\)$"):
        template_kwargs_of("[" * 100_000 + "]" * 100_000, "X")
    if limit := sys.get_int_max_str_digits():  # (0: no limit in this interpreter)
        with pytest.raises(UserError, match=rf"^X: not valid JSON \(a number of {limit + 1} digits, past the {limit} "
                                            r"Python reads\)$"):
            template_kwargs_of('{"a": ' + "1" * (limit + 1) + "}", "X")


def test_no_tokenizer_json_names_the_folder_looked_in(tmp_path):
    # mut6 M03: line 43 f"{folder}: no tokenizer.json" -> "no tokenizer.json" (the folder not named)
    from specrt.runtime.text import Text

    with pytest.raises(UserError, match=f"^{re.escape(str(tmp_path))}: no tokenizer.json "):
        Text(tmp_path)


def test_a_chat_template_that_is_not_text_is_no_chat_template(tmp_path):
    # mut6 M12: line 61 isinstance(template, str) -> template or None (an object taken as the template)
    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "obj", {"chat_template": {"template": CHAT}})
    with pytest.raises(UserError, match="^chat=True: the exported tokenizer has no chat template"):
        Text(f).render_chat("hi")


def test_template_variables_win_over_the_special_tokens_as_in_transformers(tmp_path):
    # mut6 M16: line 89 the special tokens laid over the template variables (a variable bos_token lost)
    import transformers

    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "over", {"chat_template": CHAT, "bos_token": "<s>", "eos_token": "</s>"})
    conv = [{"role": "user", "content": "hi"}]
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(conv, tokenize=False,
                                                                              add_generation_prompt=True, bos_token="B")
    assert Text(f).render_chat(conv, {"bos_token": "B"}) == want == "Buser: hi</s>assistant:"


def test_a_template_raising_a_type_error_on_a_message_is_a_user_error(tmp_path):
    # mut6 M19: line 101 TypeError left out of the errors caught (a traceback)
    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "t", {"chat_template": "{% for m in messages %}{{ m.content + 1 }}{% endfor %}"})
    with pytest.raises(UserError, match=f"^{re.escape(str(f / 'tokenizer_config.json'))}: chat template: TypeError"):
        Text(f).render_chat("hi")


def test_special_tokens_the_tokenizer_lacks_are_undefined_in_the_template(tmp_path):
    # mut6 M23: line 113 every special token given, "" when absent. transformers' special_tokens_map
    # (4.57 and 5) names only the tokens that are set, bos and eos too (bos and eos were "" here)
    import transformers

    from specrt.runtime.text import Text

    tpl = "{{ bos_token is defined }} {{ eos_token is defined }} {{ pad_token is defined }} {{ unk_token is defined }}"
    f = _chat_folder(tmp_path / "u", {"chat_template": tpl, "unk_token": "<unk>"})
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template([{"role": "user", "content": "hi"}],
                                                                              tokenize=False)
    assert Text(f).render_chat("hi") == want == "False False False True"


def test_an_empty_prompt_is_refused_before_a_chat_template_renders_it(tmp_path):
    # mut6 M25: line 125 the empty-prompt check removed (the template rendered around an empty message).
    # With chat an empty text is a user turn with no text, rendered as that conversation is (h74b: L7)
    from specrt.runtime.text import Text

    _words(tmp_path)
    with pytest.raises(UserError, match="^the prompt is empty$"):
        Text(tmp_path).encode("", False)
    assert Text(tmp_path).encode("", True) == Text(tmp_path).encode([{"role": "user", "content": ""}], True) != []


def test_token_bytes_of_a_byte_level_piece_outside_gpt2s_alphabet_are_its_decoding(tmp_path):
    # mut6 M34: line 162 every byte-level piece read through GPT-2's table (a KeyError for one that is not in it)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from specrt.runtime.text import Text

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "ab": 1, "\u4e2d": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.ByteLevel()
    tok.save(str(tmp_path / "tokenizer.json"))
    text = Text(tmp_path)
    assert text.token_bytes(1) == b"ab" and text.token_bytes(2) == "\u4e2d".encode()


def test_byte_like_pieces_without_a_byte_fallback_decoder_are_not_held_back(tmp_path):
    # mut6 M39: line 182 the <0xNN> pieces taken whatever the decoder (their text held back as if a byte might follow)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from specrt.runtime.text import Detokenizer, Text

    tok = Tokenizer(models.Unigram([("<unk>", 0.0), ("\u2581w", -1.0), ("<0x41>", -1.0)], unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.save(str(tmp_path / "tokenizer.json"))
    text = Text(tmp_path)
    assert text.byte_fallback_ids == frozenset()
    d = Detokenizer(text)
    assert d.push([tok.token_to_id("\u2581w"), tok.token_to_id("<0x41>")]) == "w<0x41>"


def test_without_byte_fallback_no_token_is_held_back_and_the_context_keeps_a_last_special_token(tmp_path):
    # mut6 M41: line 185 the special tokens in byte_fallback_ids without ByteFallback (left out of the context)
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specrt.runtime.text import Text, context_of

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(8)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["</s>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    text = Text(tmp_path)
    end = tok.token_to_id("</s>")
    assert text.byte_fallback_ids == frozenset()
    assert context_of(text, [1, 2, 3, 4, 5, end]) == [3, 4, 5, end]


def test_an_added_token_that_is_not_special_ends_a_run_of_byte_tokens(tmp_path):
    # mut6 M42: line 184 every added token in byte_fallback_ids, special or not (its text held back)
    from specrt.runtime.text import Detokenizer, Text

    tok = _byte_fallback(tmp_path)
    tok.add_tokens(["xyz"])
    tok.save(str(tmp_path / "tokenizer.json"))
    text = Text(tmp_path)
    xyz = tok.token_to_id("xyz")
    assert xyz not in text.byte_fallback_ids and 1 in text.byte_fallback_ids
    d = Detokenizer(text)
    assert d.push([3 + 0x41, xyz]) == text.decode([3 + 0x41, xyz]) != ""


def test_token_text_of_bytes_that_are_not_utf8_gives_two_hex_digits_a_byte(tmp_path):
    # mut6 M43: line 195 f"\\x{x:02x}" -> f"\\x{x:x}" (a byte below 0x10 written with one digit)
    from tokenizers import Tokenizer, decoders, models

    from specrt.runtime.text import Text

    # GPT-2's byte-level characters: U+010A is byte 0x0A, U+00E4 byte 0xE4 (a lead byte with nothing after it)
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "\u010a\u00e4": 1}, unk_token="<unk>"))
    tok.decoder = decoders.ByteLevel()
    tok.save(str(tmp_path / "tokenizer.json"))
    assert Text(tmp_path).token_text(1) == "bytes:\\x0a\\xe4"


def test_a_template_indented_for_reading_renders_as_transformers_renders_it(tmp_path):
    # mut6 M48: line 251 lstrip_blocks=True -> False (the spaces before a block tag kept)
    import transformers

    from specrt.runtime.text import Text

    tpl = "{% for m in messages %}\n    {% if m.role == 'user' %}\n{{ m.content }}|\n    {% endif %}\n{% endfor %}"
    f = _chat_folder(tmp_path / "i", {"chat_template": tpl})
    conv = [{"role": "user", "content": "hi"}]
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(conv, tokenize=False,
                                                                              add_generation_prompt=True)
    assert Text(f).render_chat(conv) == want == "hi|\n"


def test_a_template_that_is_not_valid_jinja_is_named_with_its_line(tmp_path):
    # mut6 M53: line 258 "(line {e.lineno}: {e.message})" -> "({e.message})" (where in the template not said)
    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "s", {"chat_template": "{{ bos_token }}\n{% if %}x{% endif %}"})
    with pytest.raises(UserError, match=f"^{re.escape(str(f / 'tokenizer_config.json'))}: chat template: not valid "
                                        r"Jinja \(line 2: "):
        Text(f).render_chat("hi")


def test_token_bytes_of_a_byte_fallback_tokenizer_without_metaspace_are_its_bytes(tmp_path):
    # mut6 M55: line 281 a ByteFallback decoder without Metaspace (Llama 2's) read as "other" (a byte token's
    # text, U+FFFD, for its byte)
    from specrt.runtime.text import Text

    tok = _byte_fallback(tmp_path)
    text = Text(tmp_path)
    assert text.token_bytes(3 + 0xE4) == b"\xe4" and text.token_text(3 + 0xE4) == "bytes:\\xe4"
    assert text.token_bytes(tok.token_to_id("\u2581")) == b" "


def test_a_mapping_of_stop_strings_is_refused_not_taken_as_its_keys():
    # mut6 M75: line 413 dict left out of the types refused (a dict taken as its keys)
    for bad in ({"c": 1}, b"c"):
        with pytest.raises(UserError, match="expected a string or a list of strings"):
            StopScanner(bad)


def test_chat_template_jinja_is_read_as_utf8(tmp_path):
    # mut6 M86: line 60 chat_template.jinja read as Latin-1 (its non-ASCII text mangled)
    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "u", {})
    (f / "chat_template.jinja").write_text("\u00e9\u4e2d {{ messages[0].content }}", encoding="utf-8")
    assert Text(f).render_chat("hi") == "\u00e9\u4e2d hi"


def test_a_chat_template_jinja_that_is_not_utf8_is_named_not_a_traceback(tmp_path):
    """A walk's (w72c) hand-edited template saved in Latin-1: every command that loaded the
    tokenizer ended in a UnicodeDecodeError's traceback; now a UserError naming the file."""
    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "u", {})
    (f / "chat_template.jinja").write_bytes(b"caf\xe9 {{ messages[0].content }}")
    with pytest.raises(UserError, match=f"^{re.escape(str(f / 'chat_template.jinja'))}: not valid UTF-8 text "
                                        r"\(invalid continuation byte at byte 3\)"):
        Text(f)


@pytest.mark.parametrize("tpl, error", [("{{ 1 / 0 }}", "ZeroDivisionError"),
                                        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
                                        ("{% for i in range(1000000) %}{% endfor %}", "OverflowError: Range too big"),
                                        ("{{ 10.0 ** 1000 }}", "OverflowError"),
                                        ("{{ '%(a)s' % {} }}", "KeyError: 'a'")])
def test_a_template_failing_in_its_own_sums_or_recursion_is_a_user_error(tmp_path, tpl, error):
    """A walk's (w72c) hand-written templates: a division by zero, a macro calling itself and
    the sandbox's range limit were tracebacks (and at export, which renders the template
    once); now a UserError naming the template's file, as its other errors are; a key a
    format string lacks (a KeyError: LookupError, which mutant m73x-05 left out) too."""
    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "a", {"chat_template": tpl})
    with pytest.raises(UserError, match=f"^{re.escape(str(f / 'tokenizer_config.json'))}: chat template: "
                                        f"{re.escape(error)}"):
        Text(f).render_chat("hi")


def test_a_template_rendering_no_tokens_is_named_not_said_as_an_empty_prompt(tmp_path):
    """A walk's (w72c): a hand-written template that renders a conversation as nothing (here
    where a variable asks it to) was said as "the prompt is empty" by run, chat and serve, of
    a conversation that was not, naming no template; now each names the template's file, exit
    1 (serve: 400, the file left out), no traceback."""
    from specrt.cmd_serve import Server, make_server
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.text import Text
    from tests.cli.test_serve import _post

    templated_engines(tmp_path, "{% if not blank %}", "{% endif %}")
    cfg = tmp_path / "t" / "tokenizer_config.json"
    assert Text(tmp_path / "t").encode("w4", True) == [1, 4, 2]
    with pytest.raises(UserError, match=f"^{re.escape(str(cfg))}: chat template: rendered the conversation as an "
                                        "empty prompt$"):
        Text(tmp_path / "t").encode([{"role": "user", "content": "w4"}], True, {"blank": True})
    said = f"{tmp_path / 'e' / 'export' / 'tokenizer_config.json'}: chat template: rendered the conversation as an " \
           "empty prompt"
    blank = ["--chat-template-kwargs", '{"blank": true}']
    for args, given in ((["run", "--prompt", "w4", "--chat"], None), (["chat"], "w4\n")):
        r = CliRunner().invoke(main, [args[0], str(tmp_path / "e"), *args[1:], "--governor", "off", *blank],
                               input=given)
        assert r.exit_code == 1 and said in r.output and "Traceback" not in r.output, (args, r.output)
    app = Server(tmp_path / "e", "off", SamplingParams(), 4, "tiny", log=lambda s: None)
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        code, body = _post(f"http://127.0.0.1:{httpd.server_address[1]}", "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "w4"}], "chat_template_kwargs": {"blank": True}})
        assert code == 400 and body["error"]["message"] == "chat template: rendered the conversation as an empty " \
                                                           "prompt", body
    finally:
        httpd.shutdown()
        httpd.server_close()
        app.close()


def test_a_tokenizer_json_tokenizers_refuses_is_said_with_tokenizers_reason(tmp_path):
    # mut6 M88: line 34 "({why})" dropped (what tokenizers found wrong not said)
    from specrt.runtime.text import Text

    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "NoSuchModel"}}')
    with pytest.raises(UserError, match=r"tokenizer.json: not a tokenizer the tokenizers library reads \(.+\)$"):
        Text(tmp_path)


def test_tojson_keeps_key_order_and_takes_an_indent_as_transformers_does(tmp_path):
    # mut6 M97: line 249 sort_keys=True always (keys reordered); M98: line 249 indent ignored
    import transformers

    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "j", {"chat_template": "{{ {'b': 1, 'a': [2]} | tojson(indent=2) }}"})
    conv = [{"role": "user", "content": "hi"}]
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(conv, tokenize=False,
                                                                              add_generation_prompt=True)
    assert Text(f).render_chat(conv) == want == '{\n  "b": 1,\n  "a": [\n    2\n  ]\n}'
    # m71a-125: and its separators (compact JSON), as transformers' tojson takes them
    f = _chat_folder(tmp_path / "s", {"chat_template": "{{ {'b': 1, 'a': [2]} | tojson(separators=(',', ':')) }}"})
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(conv, tokenize=False,
                                                                              add_generation_prompt=True)
    assert Text(f).render_chat(conv) == want == '{"b":1,"a":[2]}'


def test_a_chat_template_is_rendered_in_the_immutable_sandbox(tmp_path):
    """m71a-128 (a plain jinja2 Environment) and m71a-129 (the mutable sandbox): a chat
    template is data from the checkpoint, never run as Python: it reaches no Python internals
    and changes none of the values it is given (the messages), a UserError naming its file."""
    from specrt.runtime.text import Text

    for i, (body, attr, kind) in enumerate((("{{ ''.__class__.__mro__ }}", "__class__", "str"),
                                            ("{{ messages.pop() }}", "pop", "list"))):
        f = _chat_folder(tmp_path / str(i), {"chat_template": body})
        where = re.escape(str(f / "tokenizer_config.json"))
        with pytest.raises(UserError, match=rf"^{where}: chat template: SecurityError: access to attribute "
                                            rf"'{attr}' of '{kind}' object is unsafe"):
            Text(f).render_chat("hi")


def test_a_folder_named_tokenizer_config_json_is_no_config(tmp_path):
    # mut6 M87: line 46 cfg_path.is_file() -> cfg_path.exists() (a folder of that name read: an IsADirectoryError)
    from specrt.runtime.text import Text

    _words(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "tokenizer_config.json").mkdir()
    text = Text(tmp_path)
    assert text.config == {} and text.chat_template is None


def test_a_named_template_list_with_an_entry_that_is_no_object_takes_its_default_one(tmp_path):
    # mut6 M101: line 56 isinstance(t, dict) dropped (an AttributeError traceback at loading)
    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "n", {"bos_token": "<s>", "eos_token": "</s>",
                                      "chat_template": ["junk", {"name": "default", "template": CHAT}]})
    assert Text(f).render_chat("hi") == "<s>user: hi</s>assistant:"


def test_a_template_raising_a_value_error_on_a_message_is_a_user_error(tmp_path):
    """Mutant X07 (session 65: ValueError left out of the errors caught, a traceback): a
    template formatting a message's content as a number fails on text with a ValueError, a
    UserError naming the file."""
    from specrt.runtime.text import Text

    tpl = "{% for m in messages %}{{ '{:d}'.format(m.content) }}{% endfor %}"
    f = _chat_folder(tmp_path / "v", {"chat_template": tpl})
    with pytest.raises(UserError, match=f"^{re.escape(str(f / 'tokenizer_config.json'))}: chat template: ValueError: "
                                        "Unknown format code 'd'"):
        Text(f).render_chat("hi")


def test_additional_special_tokens_that_are_no_list_are_not_given_as_their_letters(tmp_path):
    """Mutant X09 (session 65: any additional_special_tokens taken as a list): a hand-edited
    tokenizer_config.json naming one token as a string gives the template none, not a list of
    the string's letters."""
    from specrt.runtime.text import Text

    tpl = "{{ additional_special_tokens is defined }}|{{ bos_token }}"
    f = _chat_folder(tmp_path / "s", {"chat_template": tpl, "bos_token": "<s>", "additional_special_tokens": "</s>"})
    assert Text(f).render_chat("hi") == "False|<s>"


def test_a_byte_that_is_not_utf8_is_named_after_the_20_characters_before_it(tmp_path):
    """Mutant X11 (session 65: fewer characters of the prompt named before the bad byte): the
    error quotes the 20 characters before it, enough to find it in a long prompt."""
    from specrt.runtime.text import Text

    _words(tmp_path)
    with pytest.raises(UserError,
                       match=r"\(byte 0xff after '1 w2 w3 w4 w5 w6 w7 '; or a JSON \\udcff escape, a UTF-16 half\)$"):
        Text(tmp_path).encode("w0 w1 w2 w3 w4 w5 w6 w7 \udcff", False)
    # m71a-31: a bad byte among a long prompt's first 20 characters is named after all that comes before it (a
    # window starting before the text's start quoted nothing, '')
    for bad, before in (("\udcff", "w6 "), ("\ud800", "w6 ")):
        with pytest.raises(UserError, match=rf"after '{before}'[;)]"):
            Text(tmp_path).encode(f"w6 {bad}" + " w1" * 10, False)


def test_a_prompt_that_is_no_conversation_is_quoted_short(tmp_path):
    """m71a-83: a list that is no conversation (Session.encode given 10 000 token ids) is
    refused quoting its first 80 characters, not all of it."""
    from specrt.runtime.text import Text

    _words(tmp_path)
    ids = list(range(10_000))
    with pytest.raises(UserError, match=r"'content'; got \[0, 1, 2, [0-9, ]*$") as e:
        Text(tmp_path).encode(ids, True)
    assert len(str(e.value).split("; got ")[1]) == 80, str(e.value)


def test_an_empty_text_or_conversation_is_an_empty_prompt(tmp_path):
    """m71a-32: Text.encode (Session.encode's) says "the prompt is empty" of an empty
    conversation as of an empty text, as Session.stream says it of [], not that a
    conversation must be a list of messages. (An empty text with chat is a user turn with no
    text: test_an_empty_prompt_is_refused_before_a_chat_template_renders_it.)"""
    from specrt.runtime.text import Text

    _words(tmp_path)
    for empty, chat in (("", False), ([], True), ([], False)):
        with pytest.raises(UserError, match="^the prompt is empty$"):
            Text(tmp_path).encode(empty, chat)


def test_a_short_prompt_whose_only_whole_tail_is_all_of_it_is_the_context(tmp_path):
    """Mutant X23 (session 65: context_of trying tails one token shorter than the prompt at
    most): an emoji's four byte tokens then a letter decode whole only all five together, so
    the context is the whole prompt, not none."""
    from specrt.runtime.text import Text, context_of

    tok = _byte_bpe(tmp_path)
    ids = tok.encode("🙂a").ids
    assert len(ids) == 5 and context_of(Text(tmp_path), ids) == ids


def test_a_detokenizer_flushed_has_nothing_left_to_give(tmp_path):
    """Mutant X31 (session 65: flush leaving what it gave as still to give): the text held
    back at a cut character is given once, by the first flush; a second gives nothing."""
    from specrt.runtime.text import Detokenizer, Text

    tok = _byte_bpe(tmp_path)
    ids = tok.encode("ab 🙂").ids
    d = Detokenizer(Text(tmp_path))
    assert d.push(ids[:-1]) == "ab " and d.flush() == "\ufffd" and d.flush() == ""


def test_a_special_token_that_is_no_text_is_not_given_to_the_template(tmp_path):
    """Mutant D13 (session 65: a special token's value given as it is, whatever its type): a
    hand-edited tokenizer_config.json whose unk_token is a list gives the template none (bos
    and eos, always given, as ""), not the list."""
    from specrt.runtime.text import Text

    tpl = "{{ unk_token is defined }}|{{ bos_token }}|"
    f = _chat_folder(tmp_path / "u", {"chat_template": tpl, "unk_token": ["<unk>"], "bos_token": 7})
    assert Text(f).render_chat("hi") == "False||"


def test_a_prompt_files_null_ids_or_messages_and_a_long_bad_value_are_said_as_they_should(tmp_path):
    """Mutants P32, P45, P48, P49 (session 67, prompt_files.py): a null 'prompt_ids' beside a
    prompt is no ids (the text is the prompt, not None); a null 'messages' is no conversation
    (refused, not read as the prompt None); a bad value is quoted cut to its first 60
    characters, however long."""
    from specrt.prompt_files import CONVERSATION, prompts_of, read_prompt_file

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "a", "prompt_ids": None}) + "\n")
    assert prompts_of(read_prompt_file(f)) == ["a"]
    f.write_text(json.dumps({"prompt": "a", "messages": None}) + "\n")
    with pytest.raises(UserError) as e:
        read_prompt_file(f)
    assert str(e.value) == f"{f}:1: 'messages': {CONVERSATION}"
    ids = ["x"] * 100
    f.write_text(json.dumps({"prompt_ids": ids}) + "\n")
    with pytest.raises(UserError) as e:
        read_prompt_file(f)
    assert str(e.value) == f"{f}:1: 'prompt_ids' must be a non-empty list of integer token ids; got {repr(ids)[:60]}"
    bad = {"role": "user", "content": 7, "note": "y" * 100}
    f.write_text(json.dumps({"messages": [bad]}) + "\n")
    with pytest.raises(UserError) as e:
        read_prompt_file(f)
    assert str(e.value).endswith(f"'content'; got {repr(bad)[:60]}"), str(e.value)


def test_a_conversations_text_parts_are_joined_by_newlines_keeping_its_other_fields():
    """Mutants P30, P31 (session 67): joined puts a message's text parts together and keeps the
    message's other fields (a name, as serve and `specrt run --prompts` pass every field to the
    template). NOTES s75: text parts: a newline between two parts, as vLLM joins them for a
    template that reads its content as a string (they were joined with nothing between)."""
    from specrt.prompt_files import joined

    parts = [{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}]
    msgs = [{"role": "user", "name": "ann", "content": parts}, {"role": "assistant", "content": "d"}]
    assert joined(msgs) == [{"role": "user", "name": "ann", "content": "a b\nc"}, {"role": "assistant", "content": "d"}]


def test_the_sampling_options_say_their_note_on_stderr_and_their_edges_in_their_own_words(worded):
    """Mutants S20, S22, S25, S33, S36, S37 (session 67, sampling_options.py): one sampling
    option at --temperature 0 "has" no effect, said on stderr (stdout is the answers); --top-k
    -2 and --seed -2 are refused by the options themselves, in their words, before anything
    loads."""
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w1 w2", "--max-new-tokens", "2", "--seed", "3"])
    said = "note: --seed has no effect at --temperature 0 (greedy decoding); give --temperature T > 0 to sample\n"
    assert r.exit_code == 0 and r.stderr.startswith(said), r.stderr
    assert "note:" not in r.stdout, r.stdout
    for option, said in (("--top-k", "an integer >= -1 (0 or -1: off)"),
                         ("--seed", "a non-negative integer (-1: none)")):
        r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w1 w2", "--temperature", "1", option, "-2"])
        assert r.exit_code == 1 and r.output == f"error: {option} -2: expected {said}\n", r.output


def test_the_sampling_options_are_listed_in_order_with_their_defaults():
    """Mutants S23, S40, S44 (session 67): `specrt run --help` and `specrt calibrate --help`
    list --temperature, --top-p, --top-k, --seed, --reproducible in that order, with the
    defaults the options take (calibrate's seed 0; run's seed none, not shown)."""
    for command, seed in (("run", None), ("calibrate", 0)):
        r = CliRunner().invoke(main, [command, "--help"], terminal_width=200)
        assert r.exit_code == 0, r.output
        text = " ".join(r.output.split())
        where = [text.index(o + " ") for o in ("--temperature", "--top-p", "--top-k", "--seed", "--reproducible")]
        assert where == sorted(where), (command, text)
        assert "--top-p FLOAT 1 = off. [default: 1.0]" in text, (command, text)
        assert "--top-k INTEGER 0 (or -1) = off. [default: 0]" in text, (command, text)
        assert "[default: 0.0]" in text[where[0]:text.index("--top-p FLOAT")], (command, text)  # m71a-45
        seed_help = text[where[3]:where[4]]
        assert ("[default: 0]" in seed_help) == (seed == 0), (command, seed_help)


def test_a_prompt_file_not_in_utf8_or_a_gzip_cut_short_is_a_user_error(tmp_path):
    """Mutants P05, P06 (session 67): a prompts file in another encoding (Latin-1's é) and a
    .gz cut short (gzip's EOFError) are said naming the file, not a traceback."""
    import gzip

    from specrt.prompt_files import read_prompt_file

    f = tmp_path / "p.jsonl"
    f.write_bytes('{"prompt": "café"}\n'.encode("latin-1"))
    g = tmp_path / "p.jsonl.gz"
    g.write_bytes(gzip.compress(b'{"prompt": "hi"}\n' * 100)[:-20])
    for path, line in ((f, ":1"), (g, "")):
        with pytest.raises(UserError, match=rf"^{re.escape(str(path))}{line}: cannot read the prompts \("):
            read_prompt_file(path)


def test_a_byte_that_is_not_utf8_deep_in_a_prompts_file_is_named_by_its_line(tmp_path):
    """A byte that is not UTF-8 on line 4000 of 5000 was said as "cannot read the prompts
    ('utf-8' codec can't decode byte 0xff in position 224607: ...)": the file's byte offset,
    which no editor goes to. Its line is named, as a JSON error's is, counted as an editor
    counts it in a file with a BOM and CRLF line ends, plain or gzipped."""
    import gzip

    from specrt.prompt_files import read_prompt_file

    lines = [json.dumps({"prompt_ids": [3 + i % 90, 4]}).encode() for i in range(5000)]
    lines[3999] = b'{"prompt_ids": [5, 6], "kind": "x\xff"}'
    data = b"\xef\xbb\xbf" + b"\r\n".join(lines) + b"\r\n"
    f, g = tmp_path / "p.jsonl", tmp_path / "p.jsonl.gz"
    f.write_bytes(data)
    g.write_bytes(gzip.compress(data))
    for path in (f, g):
        with pytest.raises(UserError, match=rf"^{re.escape(str(path))}:4000: cannot read the prompts \(not UTF-8 "
                                            r"text: invalid start byte at byte 34 of the line\)$"):
            read_prompt_file(path)
    lines[3999] = b'{"prompt_ids": [5, 6], "kind": "x"}'  # the same file whole: every line read
    f.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines))
    assert len(read_prompt_file(f)) == 5000


def test_a_prompts_file_with_old_mac_line_ends_reads_as_before(tmp_path):
    """Lines ended by "\r" alone (classic Mac OS, some exporters) were read line by line, as
    read_text and gzip's text mode read them (universal newlines); when the file came to be
    decoded from its bytes (to name a byte not UTF-8 by its line) the whole file became one
    line: "p.jsonl:1: not a JSON line (Extra data ...)". Its lines, and a bad byte's line, are
    counted as before, plain or gzipped."""
    import gzip

    from specrt.prompt_files import read_prompt_file

    lines = [json.dumps({"prompt_ids": [3 + i, 4]}).encode() for i in range(3)]
    f, g = tmp_path / "p.jsonl", tmp_path / "p.jsonl.gz"
    for end in (b"\r", b"\r\n", b"\n"):
        data = b"\xef\xbb\xbf" + end.join(lines) + end
        f.write_bytes(data)
        g.write_bytes(gzip.compress(data))
        for path in (f, g):
            assert [o["prompt_ids"] for o in read_prompt_file(path)] == [[3, 4], [4, 4], [5, 4]], (end, path)
    f.write_bytes(b"\r".join([*lines[:2], b'{"prompt": "x\xff"}']))
    with pytest.raises(UserError, match=rf"^{re.escape(str(f))}:3: cannot read the prompts \(not UTF-8 text: "
                                        r"invalid start byte at byte 14 of the line\)$"):
        read_prompt_file(f)
    f.write_bytes(b"\n".join([lines[0], b'\xff{"prompt": "x"}']))  # (bytes counted from 1, as JSON's columns)
    with pytest.raises(UserError, match=r":2: cannot read the prompts \(not UTF-8 text: invalid start byte at byte 1 "
                                        r"of the line\)$"):
        read_prompt_file(f)


def test_a_prompt_files_bad_line_is_said_in_full_and_only_text_parts_of_text_are_taken(tmp_path):
    """Mutants P21, P22, P23, P34, P36, P42, P53, P54 (session 67): a line with no prompt is said
    in full, naming token ids only where they are taken; a 'prompt' that is no string is no
    prompt; ids are not looked at where they are not taken; a part is text only as an object
    with type "text" and a string text (a bare string part was an AttributeError); a
    conversation that is none is said in full."""
    from specrt.prompt_files import read_prompt_file

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": 3}) + "\n")
    said = f"{f}:1: expected an object with a string field 'prompt' or a conversation 'messages'"
    for allow_ids, tail in ((True, " (or a non-empty list of token ids 'prompt_ids')"), (False, "")):
        with pytest.raises(UserError) as e:
            read_prompt_file(f, allow_ids=allow_ids)
        assert str(e.value) == said + tail
    f.write_text(json.dumps({"prompt": "a", "prompt_ids": []}) + "\n")
    assert read_prompt_file(f, allow_ids=False) == [{"prompt": "a", "prompt_ids": []}]
    for part in ({"type": "image_url", "text": "x"}, {"type": "text", "text": 3}, {"type": "text"}, "x"):
        f.write_text(json.dumps({"messages": [{"role": "user", "content": [part]}]}) + "\n")
        with pytest.raises(UserError, match=r":1: 'messages': messages\[0\]\.content: only text parts"):
            read_prompt_file(f)
    f.write_text(json.dumps({"messages": []}) + "\n")
    with pytest.raises(UserError) as e:
        read_prompt_file(f)
    assert str(e.value) == (f"{f}:1: 'messages': a conversation must be a non-empty list of messages, objects with "
                            "a string 'role' and a string (or text parts) 'content'")


def on_tokenizing(monkeypatch, seen) -> None:
    """``seen(text)`` called for each text the tokenizer is asked for, through ``encode`` or
    ``encode_batch`` (Text.ids_of's since e8be517: the guards and counts that patched ``encode``
    alone saw none of its texts, three failing and the rest unable to fail: r75l)."""
    from tokenizers import Tokenizer

    encode, batch = Tokenizer.encode, Tokenizer.encode_batch

    def one(self, text, *a, **k):
        seen(text)
        return encode(self, text, *a, **k)

    def many(self, texts, *a, **k):
        for text in texts:
            seen(text)
        return batch(self, texts, *a, **k)

    monkeypatch.setattr(Tokenizer, "encode", one)
    monkeypatch.setattr(Tokenizer, "encode_batch", many)


def tokenize_small_texts_only(monkeypatch, what: str = "prompt") -> None:
    """The tokenizer made to fail a test that tokenizes a text of 10 000 characters or more (a
    huge ``what``, which a lower bound on its tokens must refuse first); shorter texts as before."""
    def small(text) -> None:
        assert len(text) < 10_000, f"a huge {what} was tokenized"

    on_tokenizing(monkeypatch, small)


def _bytewise(t) -> None:
    """A byte-level BPE (as SmolLM2's) whose longest token is " xylophone" (10 bytes; the
    added <s> and </s> shorter), with a chat template in ChatML's manner."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the xylophone quartz", "hello world"] * 50, trainer)
    tok.save(str(t / "tokenizer.json"))
    (t / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": (
        "{% for m in messages %}<s>{{ m.role }}\n{{ m.content }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}")}))


@pytest.fixture(scope="module")
def bytewise(tmp_path_factory):
    """A tiny Llama (288 tokens) with ``_bytewise``'s tokenizer and a random P-EAGLE draft,
    built for depths 1 and 3 (context 128)."""
    return _tiny_text_pair(tmp_path_factory.mktemp("bytewise"), 288, 200, _bytewise)


def test_a_text_prompt_surely_past_the_context_is_refused_before_it_is_tokenized(bytewise, monkeypatch):
    """A text prompt is refused for the context with a lower bound on its tokens (its bytes over
    the longest token's, 10 here) where that is past the context, before the tokenizer sees it
    (a 5 MB line took a minute and 1.5 GB to be tokenized, then refused; session 71's F4); the
    bound never refuses a prompt that fits: 127 of the longest token (127 tokens, the most a
    context of 128 takes) is answered, 128 of them refused, at least 128."""
    from specrt.runtime.session import Session

    longest = " xylophone"
    with Session(bytewise, governor="fixed:3") as s:
        assert len(s.check_prompt(longest * 127, max_new_tokens=4)) == 127
        assert "".join(s.stream(longest * 127, max_new_tokens=4)) is not None and s.stats()["prompt_tokens"] == 127
        with pytest.raises(UserError, match=r"^the prompt has at least 128 tokens; the engines' context limit is 128 "
                                             r"\(a prompt of at most 127, leaving room for a new token\)$"):
            s.check_prompt(longest * 128)
        huge = "hello world " * 100_000  # 1.2 MB
        with monkeypatch.context() as m:
            on_tokenizing(m, lambda text: pytest.fail("tokenized"))
            for call in (lambda: s.check_prompt(huge), lambda: s.stream(huge, max_new_tokens=1),
                         lambda: s.stream([{"role": "user", "content": huge}], max_new_tokens=1),
                         lambda: s.stream(huge, max_new_tokens=0, prompt_logprobs=0)):
                with pytest.raises(UserError, match=r"^the prompt has at least 1200\d\d tokens; the engines' "
                                                     r"context limit is 128"):
                    call()
    f = Path(str(bytewise) + "-prompts.jsonl")
    f.write_text(json.dumps({"prompt": "hello"}) + "\n" + json.dumps({"prompt": huge}) + "\n")
    for cmd in (["run", str(bytewise), "--prompts", str(f)], ["run", str(bytewise), "--prompts", str(f), "--chat"],
                ["calibrate", str(bytewise), "--prompts", str(f), "--holdout", "0"]):
        r = CliRunner().invoke(main, cmd + ["--max-new-tokens", "4"])
        assert r.exit_code == 1 and f"{f}:2: the prompt has at least 1200" in r.output, r.output
        assert "Traceback" not in r.output and "context limit is 128" in r.output, r.output


def test_least_tokens_bounds_the_count_and_is_none_where_text_can_shorten(bytewise, tmp_path):
    """``Text.least_tokens`` is at most the tokenizer's count for any text (the longest token's
    runs, the added tokens, characters of every width, through the chat template), and 0 (no
    bound) for a tokenizer that could shorten the text: a normalizer (NFC makes 3 bytes 2), a
    Split that removes what it matches, an added token taking the spaces beside it, a word-level
    model; bytes no token holds are dropped by BPE, so not counted."""
    import random

    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

    from specrt.runtime.text import Text

    text = Text(bytewise.parent / "exp")
    rng = random.Random(0)
    pieces = [" xylophone", "<s>", "</s>", "é", "中", "🙂", "\n", " ", "quartz", "\x00"]
    for _ in range(300):
        s = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
        for chat in (False, True):
            t = text.prompt_text(s, chat)
            assert text.least_tokens(t) <= len(text.tokenizer.encode(t, add_special_tokens=not chat).ids), s
    assert text.least_tokens(" xylophone" * 50) == 50

    def saved(tok, name):
        (tmp_path / name).mkdir()
        tok.save(str(tmp_path / name / "tokenizer.json"))
        return Text(tmp_path / name)

    spec = json.loads(text.tokenizer.to_str())
    for name, change in (("nfc", lambda t: setattr(t, "normalizer", normalizers.NFC())),
                         ("removed", lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Sequence(
                             [pre_tokenizers.Split(Regex(" +"), "removed"), pre_tokenizers.ByteLevel()]))),
                         ("lstrip", lambda t: t.add_special_tokens([AddedToken("<x>", lstrip=True)]))):
        tok = Tokenizer.from_str(json.dumps(spec))
        change(tok)
        assert saved(tok, name).least_tokens(" xylophone" * 50) == 0, name
    words = Tokenizer(models.WordLevel({"w0": 0, "w1": 1}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    assert saved(words, "words").least_tokens("w1 " * 50) == 0
    # a byte-level BPE holding only the bytes it was trained on: a control character it lacks is dropped
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["hello world"] * 10)
    narrow = saved(tok, "narrow")
    assert tok.encode("\x04" * 100 + "hello").ids and narrow.least_tokens("\x04" * 100 + "hello") <= 5
    assert len(tok.encode("\x04" * 100).ids) == narrow.least_tokens("\x04" * 100) == 0


def test_chat_skips_a_turn_surely_past_the_context_before_it_is_tokenized(bytewise, monkeypatch):
    """A chat turn past the context even with every earlier turn dropped is skipped on a lower
    bound of its tokens, never tokenized (a 1 MB line was tokenized again for each earlier turn
    dropped for it); the earlier turns stay, the next turn goes on with them."""
    tokenize_small_texts_only(monkeypatch, "turn")
    huge = "hello world " * 100_000
    r = CliRunner().invoke(main, ["chat", str(bytewise), "--governor", "off", "--max-new-tokens", "3"],
                           input=f"hello\n{huge}\nquartz\n\n")
    assert r.exit_code == 0, r.output
    assert re.search(r"\[this turn makes a prompt of at least 1200\d\d tokens; the engines' context limit is 128: "
                     r"skipped, the conversation goes on\]", r.output), r.output
    assert "dropped" not in r.output and r.output.count(" prompt tokens reused]") == 2, r.output


def test_chat_skips_a_turn_whose_bound_is_the_context_untokenized(bytewise):
    """Mutants m74b-42 (chat's turn tokenized unless its lower bound passed the context) and
    m74b-60 (the bound said one more than it is): a turn
    whose bound is the context itself (125 " xylophone" rendered: at least 128 tokens, 144 in
    fact) already leaves no room for the answer's first token, so it is skipped on the bound, "at
    least 128", as a prompt is refused on it (Session's check_length); the mutants tokenized it
    and said 144, or said at least 129."""
    r = CliRunner().invoke(main, ["chat", str(bytewise), "--governor", "off", "--max-new-tokens", "3"],
                           input=" xylophone" * 125 + "\n\n")
    assert r.exit_code == 0 and "[this turn makes a prompt of at least 128 tokens; the engines' context limit is " \
        "128: skipped" in r.output, r.output


def test_chat_renders_and_tokenizes_each_conversation_it_measures_once(bytewise, monkeypatch):
    """Session 73's leftover (h74c): chat rendered the chat template for a turn's token bound, again
    to tokenize it, and both again for the same turn once the drops were done, before the stream
    rendered and tokenized it: 5 renders and 3 tokenizings a turn (10 and 6 for 2 turns). Now each
    conversation measured is rendered and tokenized once, and the stream takes the ids measured
    (it tokenized the turn again, h74e, then rendered it once more, r74: 4 renders for 2 turns,
    5 for a turn that drops the earlier one): 2 turns, 2 renders and 2 tokenizings; a turn that
    drops the earlier one measures 2 conversations, 3 and 3. The answers and the counts said are
    those of before."""
    import jinja2

    calls = {"render": 0, "encode": 0}

    def counted(name, real):
        def call(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        return call

    monkeypatch.setattr(jinja2.Template, "render", counted("render", jinja2.Template.render))
    on_tokenizing(monkeypatch, lambda text: calls.update(encode=calls["encode"] + 1))
    chat = ["chat", str(bytewise), "--governor", "off", "--max-new-tokens", "3"]
    r = CliRunner().invoke(main, chat, input="hello\nquartz\n\n")
    assert r.exit_code == 0 and r.output.count(" prompt tokens reused]") == 2, r.output
    assert calls == {"render": 2, "encode": 2}, calls
    calls.update(render=0, encode=0)
    r = CliRunner().invoke(main, chat, input=" xylophone" * 100 + "\nhello\n\n")
    assert r.exit_code == 0 and "[dropped the oldest 1 turn(s) to fit the context of 128 tokens]" in r.output, \
        r.output
    assert re.search(r"\[3 tokens, .* 6 of 20 prompt tokens reused\]\n$", r.output), r.output
    assert calls == {"render": 3, "encode": 3}, calls


def test_the_last_texts_ids_are_kept_packed_and_only_up_to_keep_ids(bytewise, monkeypatch):
    """The session review (r74): Text.ids_of kept its last text's ids as a tuple of Python ints,
    so a 2M-token prompt serve refused held 79.5 MB until the next request. Now they are kept
    packed and only up to KEEP_IDS; a kept text's ids come back equal and as a list of the
    caller's own (changing it changes nothing kept)."""
    from specrt.runtime import text as T

    calls = []
    on_tokenizing(monkeypatch, calls.append)
    monkeypatch.setattr(T, "KEEP_IDS", 12)
    tx = T.Text(bytewise / "export")
    short, long = " xylophone" * 3, " xylophone" * 20
    first = tx.ids_of(short, True)
    first.append(-1)  # the caller's own list
    again = tx.ids_of(short, True)
    assert len(calls) == 1 and again == first[:-1] and len(again) <= 12, (calls, again)
    assert tx.ids_of(short, False) and len(calls) == 2  # (another raw: tokenized)
    assert len(tx.ids_of(long, True)) > 12 and len(tx.ids_of(long, True)) > 12 and len(calls) == 4  # (not kept)
    assert tx._last_ids is None


def test_a_prompt_refused_past_the_context_is_not_kept(worded):
    """Session 74's leftover (r74): with a tokenizer that has no token bound (word-level here,
    as r74's), a prompt past the context is tokenized whole before it is refused, and Text kept
    its text and ids until the next prompt (serve held a refused prompt's 13 MB of text). A
    Session's Text keeps none past the engines' context (no stream follows its refusal); a
    prompt within it is still kept for the stream that follows its measuring."""
    from specrt.runtime.session import Session

    with Session(worded, governor="off") as s:
        assert s.text.least_tokens("w1 " * 500) == 0  # (no bound: it is tokenized)
        with pytest.raises(UserError, match="context"):
            s.stream("w1 " * 500, max_new_tokens=3)
        assert s.text._last_ids is None, len(s.text._last_ids[1])
        with pytest.raises(UserError, match="context"):
            s.check_prompt("w1 " * 128, max_new_tokens=1)  # (the whole context: no room for a token)
        assert s.text._last_ids is None
        s.check_prompt("w1 w2", max_new_tokens=3)
        assert s.text._last_ids[1] == "w1 w2"  # (within the context: kept)


def test_the_kept_ids_are_a_text_s_own_and_kept_up_to_keep_ids_itself(bytewise, monkeypatch):
    """Mutants m74d-15 (the kept ids taken for another text of the same length: its tokens
    streamed in place of the prompt's, losslessness gone) and m74d-16 (a text of KEEP_IDS ids
    exactly not kept: "only up to KEEP_IDS" keeps it, as the note's "past 131072: none" says)."""
    from specrt.runtime import text as T

    calls = []
    on_tokenizing(monkeypatch, calls.append)
    tx = T.Text(bytewise / "export")
    one, other = " xylophone quartz", " quartz xylophone"  # (as long, tokenized otherwise)
    first, second = tx.ids_of(one, True), tx.ids_of(other, True)
    assert len(calls) == 2 and second == tx.tokenizer.encode(other, add_special_tokens=True).ids != first, \
        (first, second)
    monkeypatch.setattr(T, "KEEP_IDS", len(first))
    calls.clear()
    assert tx.ids_of(one, True) == first and tx.ids_of(one, True) == first and len(calls) == 1, calls


def test_the_kept_ids_hold_a_large_vocabulary_s_ids(tmp_path):
    """Mutant m74d-67 (kept as 16-bit, "H"): a vocabulary past 65535 ids (Llama 3's 128256) made
    ids_of's keeping raise OverflowError, a traceback for every prompt holding such a token;
    the ids come back whole, kept or tokenized again."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specrt.runtime.text import Text

    words = Tokenizer(models.WordLevel({"w0": 0, "far": 128255}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.save(str(tmp_path / "tokenizer.json"))
    tx = Text(tmp_path)
    assert tx.ids_of("far w0 far", True) == [128255, 0, 128255] == tx.ids_of("far w0 far", True)


def test_token_ids_past_the_context_are_refused_by_their_count_first(worded):
    """Token ids past the context are refused by their count before a pass over each id (1.2M
    ids took 46 s of checks, then the context's refusal): an id outside the vocabulary at the
    end of them is not what is said."""
    from specrt.runtime.calibrate import _encode
    from specrt.runtime.session import Session

    ids = [1] * 100_000 + [10**9]
    want = r"^the prompt has 100001 tokens; the engines' context limit is 128 \(a prompt of at most 127"
    with Session(worded, governor="fixed:3") as s:
        for call in (lambda: s.check_prompt(ids), lambda: s.stream(ids, max_new_tokens=1),
                     lambda: s.stream_ids(ids, 1), lambda: s.stream_ids(np.array(ids), 1),
                     lambda: _encode(s, ids, False, 4)):
            with pytest.raises(UserError, match=want):
                call()
        with pytest.raises(UserError, match=r"^prompt token id 1000000000 is outside the vocabulary"):
            s.check_prompt(ids[-100:])  # (fewer than the context: each id checked as before)
        with pytest.raises(UserError, match=r"^prompt token id 'x' \(at 0\): expected an integer"):
            s.stream_ids(["x"] * 200, 1)  # (not ids: said as before)


def test_a_tokenizer_saved_with_truncation_or_padding_on_encodes_prompts_whole(tmp_path):
    """A tokenizer.json saved with truncation or padding on (as a tokenizer used with
    ``truncation=True, max_length=16`` and then saved writes it) cut every prompt to 16 tokens,
    or padded it to 64, without a word; transformers encodes a prompt without either unless a
    call asks, and so does specrt now (a prompt past the context is then refused, not cut)."""
    from tokenizers import Tokenizer

    from specrt.runtime.text import Text

    _bytewise(tmp_path)
    whole = Text(tmp_path).encode("hello world " * 20, False)
    assert len(whole) == 60
    for on in ("truncation", "padding"):
        tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        if on == "truncation":
            tok.enable_truncation(16)
        else:
            tok.enable_padding(length=64, pad_id=1, pad_token="</s>")
        tok.save(str(tmp_path / "tokenizer.json"))
        cut = len(tok.encode("hello world " * 20).ids) == 16
        assert cut if on == "truncation" else len(tok.encode("hello").ids) == 64
        assert Text(tmp_path).encode("hello world " * 20, False) == whole, on
        assert Text(tmp_path).encode("hello", False) == whole[:1], on


def test_a_template_variable_the_chat_template_never_reads_is_said(worded):
    """--chat-template-kwargs with a variable the chat template reads nowhere (a misspelt
    enable_thinking: the thinking block stayed, unsaid; a walk, w73d) gets a note naming it, the
    template's file and the variables of its own the template does read; one it reads gets none."""
    for kwargs, said in (('{"cuee": "w5"}', "'cuee': the chat template"), ('{"cue": "w5"}', None),
                         ('{"a": 1, "cue": "w5", "b": 2}', "'a', 'b': the chat template")):
        r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w6", "--chat", "--chat-template-kwargs", kwargs,
                                      "--max-new-tokens", "2", "--governor", "off"])
        assert r.exit_code == 0, r.output
        notes = [line for line in r.output.splitlines() if line.startswith("note: --chat-template-kwargs")]
        if said is None:
            assert notes == [], r.output
        else:
            assert notes == [f"note: --chat-template-kwargs {said} ({worded / 'export' / 'tokenizer_config.json'}) "
                             f"reads no such variable, so {'it changes' if ',' not in said else 'they change'} "
                             "nothing (the variables of its own it reads: cue)"], r.output


def test_the_unread_note_leaves_out_the_template_s_own_functions_and_says_none(tmp_path):
    """Mutants m73x-12 and m73x-07: a template reading no variable of its own says "none", not
    an empty list, and ``eos_token`` is None where tokenizer_config.json names none; the
    functions its environment gives it (raise_exception, strftime_now) are no variable of its
    own (jinja2.meta leaves them out already: m73x-11 is equivalent)."""
    from specrt.runtime.text import Text

    f = _chat_folder(tmp_path / "a", {"chat_template": "{{ raise_exception('no') if strict }}{{ bos_token }}"
                                                       "{{ messages[0].content }}{{ strftime_now('%Y') if dated }}"})
    assert Text(f).unread_note({"zz": 1}) == (f"'zz': the chat template ({f / 'tokenizer_config.json'}) reads no such "
                                              "variable, so it changes nothing (the variables of its own it reads: "
                                              "dated, strict)")
    g = _chat_folder(tmp_path / "b", {"chat_template": "{{ messages[0].content }}"})
    assert Text(g).unread_note({"zz": 1, "yy": 2}).endswith("so they change nothing (the variables of its own it "
                                                            "reads: none)")
    assert Text(g).eos_token is None


def test_template_reads_is_what_both_notes_ask_and_a_broken_template_is_named_by_its_file(tmp_path):
    """NOTES s75: tools_unread and unread_note each compiled a template and asked jinja2 which
    variables it reads; Text.template_reads answers both: the names a template reads and does not
    set itself (a ``set`` one, a loop's, is none), of the template it is given (the "tool_use" one
    reads ``tools`` here, the default none). A template that is not valid Jinja is refused naming
    its file, where unread_note's said "chat template: not valid Jinja" alone."""
    from specrt.runtime.text import Text
    from specrt.tool_calls import tools_unread

    named = [{"name": "default", "template": "{% set n = 1 %}{% for m in messages %}{{ m.content }}{% endfor %}"
                                             "{{ cue if n }}"},
             {"name": "tool_use", "template": "{{ tools | tojson }}{{ messages[0].content }}"}]
    t = Text(_chat_folder(tmp_path / "a", {"chat_template": named}))
    assert t.template_reads(t.chat_template) == {"messages", "cue"}
    assert t.template_reads(t.tool_template) == {"messages", "tools"}
    assert tools_unread(t) is None and t.unread_note({"cue": 1}) is None
    assert t.unread_note({"tools": 1}).startswith("'tools': the chat template")
    f = _chat_folder(tmp_path / "b", {"chat_template": "{{ messages[0].content }"})
    with pytest.raises(UserError) as e:
        Text(f).unread_note({"zz": 1})
    assert str(e.value).startswith(f"{f / 'tokenizer_config.json'}: chat template: not valid Jinja (line 1: "), e.value


def test_the_unread_note_names_no_variable_the_template_sets_itself_before_reading(tmp_path):
    """w76c: a misspelt variable on Llama 3.1's real template was told "the variables of its
    own it reads: builtin_tools, custom_tools, date_string, first_user_message, system_message,
    tool_call, tools_in_user_message", and on Qwen3's "content, enable_thinking,
    reasoning_content" (jinja2.meta finds a variable set in a branch "undeclared"): the
    template's own {% set %} variables are none to pass, unless it tests them ``is defined``
    (date_string) or gives them a ``default``. Excerpts of Llama 3.1's template."""
    from specrt.runtime.text import Text

    llama = ("{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
             "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
             "{%- else %}{%- set system_message = '' %}{%- endif %}{{ 'Today Date: ' + date_string }}"
             "{{ system_message }}{% set tag = tag | default('x') %}{{ tag }}{{ plain }}")
    f = _chat_folder(tmp_path / "a", {"chat_template": llama})
    assert Text(f).unread_note({"zz": 1}).endswith("(the variables of its own it reads: date_string, plain, tag)")
    assert Text(f).unread_note({"system_message": 1}) is None  # (read before it is set where no branch set it)


def test_least_tokens_rounds_up_and_knows_no_bound_past_byte_level_bpe(bytewise, tmp_path):
    """Mutants m73x-18, 23, 24, 25, 26, 27, 28 and 29 (``_token_bound``, ``least_tokens``): the
    bound is the bytes over the longest token's rounded up (501 bytes of 10-byte tokens: 51, a
    prompt refused before it is tokenized, not after); an added token longer than every
    vocabulary token counts its UTF-8 bytes (a longer bound refused prompts that fit); and there
    is no bound (0) where a token may stand for more of the text than its length says: a BPE
    whose pre-tokenizer is no byte-level one (a character no token holds is dropped), a
    word-level model under a byte-level pre-tokenizer (one unknown token for a whole word), a
    post-processor that leaves the text out, an added token taking the spaces after it."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, processors

    from specrt.runtime.text import Text

    text = Text(bytewise.parent / "exp")
    assert text.least_tokens(" xylophone" * 50 + "q") == 51 == len(text.tokenizer.encode(" xylophone" * 50 + "q").ids)

    def saved(tok, name):
        (tmp_path / name).mkdir()
        tok.save(str(tmp_path / name / "tokenizer.json"))
        return Text(tmp_path / name)

    spec, long = json.loads(text.tokenizer.to_str()), "<|é" + "x" * 20 + "|>"  # (26 bytes, 25 characters)
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_tokens([long])
    assert saved(tok, "long").least_tokens(long * 5) == len(tok.encode(long * 5).ids) == 5
    first = text.tokenizer.token_to_id("<s>")
    for name, change, said in (
            ("split", lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Split(Regex(" "), "isolated")), "é" * 50),
            ("drop", lambda t: setattr(t, "post_processor", processors.TemplateProcessing(
                single="<s>", special_tokens=[("<s>", first)])), " xylophone" * 50),
            ("rstrip", lambda t: t.add_special_tokens([AddedToken("<x>", rstrip=True)]), " xylophone" * 50)):
        tok = Tokenizer.from_str(json.dumps(spec))
        change(tok)
        assert saved(tok, name).least_tokens(said) == 0, name
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", first)])
    assert saved(tok, "kept").least_tokens(" xylophone" * 50) == 50  # (a post-processor that only adds: bound kept)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # (every byte held: none dropped)
    words = Tokenizer(models.WordLevel({"w0": 0, **{c: i + 1 for i, c in enumerate(alphabet)}}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    said = "xylophones " * 50  # (one unknown token a word: 51 tokens of 550 bytes)
    assert len(words.encode(said).ids) == 51 and saved(words, "words").least_tokens(said) == 0
    empty = Tokenizer(models.BPE())  # (mutant m73x-32: a vocabulary of nothing has no longest token)
    empty.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert saved(empty, "empty").least_tokens("hello") == 0


def test_a_text_prompt_filling_the_context_is_scored_past_the_bound(bytewise):
    """Mutant m73x-40: the bound before tokenizing is checked for the call's own
    max_new_tokens and prompt_logprobs: a text of exactly the context's tokens (128 of the
    longest token) is scored with 0 new tokens, as token ids are; with a new token it is
    refused, at least 128."""
    from specrt.runtime.session import Session

    with Session(bytewise, governor="fixed:3") as s:
        assert list(s.stream(" xylophone" * 128, max_new_tokens=0, prompt_logprobs=0)) == []
        assert s.stats()["prompt_tokens"] == 128
        with pytest.raises(UserError, match=r"^the prompt has at least 128 tokens; the engines' context limit is 128"):
            s.stream(" xylophone" * 128, max_new_tokens=1, prompt_logprobs=0)


def test_check_each_names_three_more_without_an_ellipsis():
    """Mutant m73x-45: three more refused prompts are all named, with no ", ..." (that says
    some were left out)."""
    from specrt.prompt_files import check_each

    def bad(p):
        raise UserError(f"{p} is bad")

    with pytest.raises(UserError, match=r"^a: 0 is bad; 3 more are refused too \(b, c, d\); no prompt was decoded$"):
        check_each([0, 0, 0, 0], bad, list("abcd"))


def test_a_conversation_of_as_many_messages_as_the_context_is_rendered_before_it_is_counted(tmp_path):
    """Mutant m73x-49 (the count check of token ids, Generator.check_count, without its guard
    that the first item is an id): a conversation of 64 messages, in a context of 64, was
    refused as "the prompt has 64 tokens" unrendered; a template keeping the last message only
    (here) renders it as 3 tokens, answered."""
    from specrt.runtime.session import Session

    eng = templated_engines(tmp_path, "{% set messages = messages[-1:] %}")
    turn = [{"role": "user", "content": "w4"}, {"role": "assistant", "content": "w5"}]
    conversation = turn * 31 + [turn[0], {"role": "user", "content": "w6"}]  # (64 messages, the last w1 w6)
    with Session(eng, governor="off") as s:
        assert len(list(s.stream(conversation, max_new_tokens=2))) >= 1
        assert s.stats()["prompt_tokens"] == 3


def test_run_chat_takes_an_empty_prompt_as_an_empty_user_turn(worded, tmp_path):
    """Session 70's CLI walk, L7: `run --chat --prompt ''` (and a --prompts line {"prompt": ""}
    under --chat) was refused as "the prompt is empty", where a conversation holding one empty
    user message (serve's /v1/chat/completions, a 'messages' line) is rendered and answered, as
    transformers' apply_chat_template and vLLM render it (SmolLM2's template makes
    "<|im_start|>user\n<|im_end|>" of it). Each is now that conversation's answer (h74b);
    without --chat an empty prompt is still refused."""
    (tmp_path / "e.jsonl").write_text('{"prompt": ""}\n')
    (tmp_path / "m.jsonl").write_text('{"messages": [{"role": "user", "content": ""}]}\n')
    args = [str(worded), "--max-new-tokens", "4", "--governor", "fixed:1"]
    said = [CliRunner().invoke(main, ["run", *args, *extra]) for extra in (
        ["--prompts", str(tmp_path / "m.jsonl")], ["--chat", "--prompt", ""],
        ["--chat", "--prompts", str(tmp_path / "e.jsonl")])]
    assert all(r.exit_code == 0 for r in said) and said[0].stdout.strip(), [r.output for r in said]
    assert said[1].stdout == said[2].stdout == said[0].stdout, [r.output for r in said]  # (the answers)
    r = CliRunner().invoke(main, ["run", *args, "--prompt", ""])
    assert r.exit_code == 1 and r.output.endswith("\nerror: the prompt is empty\n"), r.output


def test_no_prefix_reuse_on_one_prompt_is_noted(worded, tmp_path):
    """Session 70's CLI walk, L5: `run --prompt X --no-prefix-reuse` was taken without a word,
    where one prompt has no earlier one whose KV rows it could reuse (h74b): a note, as run's
    others; a --prompts file of two prompts gets none."""
    (tmp_path / "two.jsonl").write_text('{"prompt": "w1 w2"}\n{"prompt": "w1 w2 w3"}\n')
    note = "note: --no-prefix-reuse has no effect on one prompt: only a later prompt of --prompts reuses"
    for extra, noted in ((["--prompt", "w1 w2"], True), (["--prompts", str(tmp_path / "two.jsonl")], False)):
        r = CliRunner().invoke(main, ["run", str(worded), *extra, "--no-prefix-reuse", "--max-new-tokens", "2",
                                      "--quiet"])
        assert r.exit_code == 0 and (note in r.output) == noted, (extra, r.output)


def test_one_prompt_without_no_prefix_reuse_gets_no_note(worded):
    """Mutant m74b-38 (the note said of every run of one prompt): `run --prompt X` without
    --no-prefix-reuse says nothing of it (h74b's note is for the option given to no effect)."""
    r = CliRunner().invoke(main, ["run", str(worded), "--prompt", "w1 w2", "--max-new-tokens", "2", "--quiet"])
    assert r.exit_code == 0 and "prefix-reuse" not in r.output, r.output


def test_a_text_that_tokenizes_to_nothing_is_an_empty_prompt_not_a_templates(worded):
    """Mutant m74b-48 (Text.ids_of's template error for any prompt of no tokens): `run --prompt ' '`
    without --chat, a text the tokenizer makes no token of, is "the prompt is empty", as before
    h74c split encode; no chat template rendered it, and none is named."""
    for blank in (" ", "\t"):
        r = CliRunner().invoke(main, ["run", str(worded), "--prompt", blank, "--max-new-tokens", "2"])
        assert r.exit_code == 1 and r.output.endswith("\nerror: the prompt is empty\n"), (blank, r.output)


def test_an_answer_ended_by_any_of_the_eos_ids_leaves_it_out_of_the_text(tmp_path):
    """Mutant m74b-52 (only the first of the target's EOS ids left out of the text): a target with
    two EOS ids, neither special (w9 and w8), whose answer ends at the second (w8) writes none of
    it, as test_an_eos_the_tokenizer_does_not_mark_special_ends_the_answer_unprinted's single EOS
    (h74c); its output ids still end with it."""
    from specrt.runtime.session import Session

    eng = _tiny_text_pair(tmp_path, 16, 12, _words, eos_token_id=[9, 8])
    with Session(eng, governor="fixed:3") as s:
        assert s.eos == (9, 8)
        text = "".join(s.stream("w1 w1 w2 w2", max_new_tokens=200))
        st = s.stats()
    assert text == " w7 w7 w7 w7 w7 w7 w0", text
    assert st["output_token_ids"] == [7] * 6 + [0, 8] and st["finish_reason"] == "eos", st


def test_chat_counts_a_turn_with_its_template_variables(worded):
    """Mutant m74b-53 (Session.prompt_text rendered without the session's template variables):
    chat measures a turn by the text its stream tokenizes, --chat-template-kwargs' variables
    rendered in (``cue`` w9 after the assistant's w2 here): a turn of 130 words is 133 tokens,
    said so where it is skipped (132 without the cue, a prompt the engines never get)."""
    r = CliRunner().invoke(main, ["chat", str(worded), "--max-new-tokens", "2", "--governor", "off",
                                  "--chat-template-kwargs", '{"cue": "w9"}'], input="w5 " * 130 + "\n\n")
    assert r.exit_code == 0 and "[this turn makes a prompt of 133 tokens; the engines' context limit is 128: " \
        "skipped" in r.output, r.output


def test_the_no_prefix_reuse_note_goes_to_standard_error(worded):
    """Mutant m74b-67 (the note echoed to standard output): run's note of --no-prefix-reuse on one
    prompt (h74b) is said on standard error, as its others; standard output is the answer alone."""
    args = ["run", str(worded), "--prompt", "w1 w2", "--max-new-tokens", "2", "--quiet", "--governor", "off"]
    want = CliRunner().invoke(main, args)
    r = CliRunner().invoke(main, [*args, "--no-prefix-reuse"])
    assert r.exit_code == want.exit_code == 0 and r.stdout == want.stdout, (r.stdout, want.stdout)
    assert r.stderr.startswith("note: --no-prefix-reuse has no effect on one prompt"), r.stderr


def _words_with_bos(t) -> None:
    """``_words``' tokenizer whose post-processor puts w14 (special) before a text, as Llama's
    adds its BOS; its chat template writes none."""
    from tokenizers import Tokenizer, processors

    _words(t, ("w14",))
    tok = Tokenizer.from_file(str(t / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="w14 $A", special_tokens=[("w14", 14)])
    tok.save(str(t / "tokenizer.json"))


def test_chat_counts_a_turn_as_its_prompt_is_tokenized(tmp_path):
    """Mutant m74b-43 (chat's count of a turn tokenized with the tokenizer's special tokens): a
    rendered template is tokenized without them (Text.ids_of), so a tokenizer whose post-processor
    adds a BOS (w14 here, as Llama's) does not add it to chat's prompt, nor to its count: a turn
    of 130 words renders as 132 tokens ("w1 ... w2"), said so where it is skipped; the count said
    133, one the prompt does not hold (and so dropped turns for a conversation that fit)."""
    eng = _tiny_text_pair(tmp_path, 16, 12, _words_with_bos)
    r = CliRunner().invoke(main, ["chat", str(eng), "--max-new-tokens", "2", "--governor", "off"],
                           input="w5 " * 130 + "\n\n")
    assert r.exit_code == 0 and "[this turn makes a prompt of 132 tokens; the engines' context limit is 128: " \
        "skipped" in r.output, r.output

"""tools/gen_chat_data.py: prompt shards and merging generator folders (no model needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.real_model import tool as _tool



def test_shards_split_the_prompts_without_overlap():
    g, prompts = _tool("gen_chat_data"), _tool("prompts")
    assert g.parse_shard(None) == (0, 1) and g.parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "1", "a/b", "0/0"):
        with pytest.raises(SystemExit, match="--shard"):
            g.parse_shard(bad)
    todo = prompts.answerable_train_prompts(200)
    assert g.shard_prompts(200, (0, 1)) == todo
    parts = [g.shard_prompts(200, (i, 3)) for i in range(3)]
    assert [len(p) for p in parts] == [67, 67, 66]
    assert sorted(i for part in parts for i, _ in part) == sorted(i for i, _ in todo)  # each once
    assert g.shard_prompts(None, (1, 2)) == prompts.answerable_train_prompts(None)[1::2]


def test_merge_appends_each_answer_with_its_feature_rows_once(tmp_path):
    g = _tool("gen_chat_data")
    W = len(g.FEATURE_LAYERS) * g.HIDDEN
    rng = np.random.default_rng(0)
    made = {}
    for folder, idxs in (("a", [4, 0]), ("b", [1, 4])):  # prompt 4 answered by both
        d = tmp_path / folder
        d.mkdir()
        store = g.FeatureStore(d)
        for idx in idxs:
            n = 3 + idx
            aux, fin = rng.standard_normal((n, W)).astype(np.float16), rng.standard_normal((n, g.HIDDEN))
            store.add(idx, aux, fin)
            made.setdefault(idx, (aux, fin.astype(np.float16)))
            with open(d / "chat.jsonl", "a") as f:
                f.write(json.dumps({"idx": idx, "prompt_ids": [1] * 2, "answer_ids": [2] * (n - 1)}) + "\n")
    (tmp_path / "c").mkdir()  # an --engine hf folder: answers without features
    (tmp_path / "c" / "chat.jsonl").write_text(json.dumps({"idx": 9, "prompt_ids": [1], "answer_ids": [2]}) + "\n")
    out = tmp_path / "merged" / "chat.jsonl"
    assert g.merge([tmp_path / "a", tmp_path / "b" / "chat.jsonl", tmp_path / "c"], out) == (4, 1)
    assert [d["idx"] for d in g.read_jsonl(out)] == [4, 0, 1, 9]
    entries, aux, fin = g.load_features(out.parent)
    assert set(entries) == {4, 0, 1}  # the trainer computes prompt 9's features itself
    for idx, (a, f) in made.items():
        e = entries[idx]
        assert np.array_equal(aux[e["row"]:e["row"] + e["n"]], a) and np.array_equal(fin[e["row"]:e["row"] + e["n"]], f)
    assert g.merge([tmp_path / "a", tmp_path / "b", tmp_path / "c"], out) == (0, 5)  # again: nothing added


def test_a_line_cut_by_a_killed_write_does_not_swallow_the_next(tmp_path):
    """Answers and feature index lines are appended as they come: after a kill mid-line,
    the next entry goes on a line of its own instead of being glued to the cut one (which
    lost it, and the generator then redid that prompt on every resume)."""
    g = _tool("gen_chat_data")
    W = len(g.FEATURE_LAYERS) * g.HIDDEN
    store = g.FeatureStore(tmp_path)
    store.add(0, np.ones((3, W), np.float16), np.ones((3, g.HIDDEN)))
    with open(store.index, "a") as f:
        f.write('{"idx": 1, "ro')  # killed after the rows' write began: no rows of idx 1 in full
    store = g.FeatureStore(tmp_path)
    assert set(store.entries) == {0} and store.rows == 3
    store.add(2, np.full((2, W), 2, np.float16), np.full((2, g.HIDDEN), 2.0))
    entries, aux, _ = g.load_features(tmp_path)
    assert set(entries) == {0, 2} and entries[2]["row"] == 3 and (aux[3:5] == 2).all()
    with g.open_append(tmp_path / "empty.jsonl") as f:  # a new file gets no blank first line
        f.write("{}\n")
    assert (tmp_path / "empty.jsonl").read_text() == "{}\n"


def test_merge_knows_a_prompt_by_its_text_and_refuses_another_list(tmp_path):
    g = _tool("gen_chat_data")

    def folder(name, rows):
        (tmp_path / name).mkdir()
        (tmp_path / name / "chat.jsonl").write_text(
            "".join(json.dumps({"idx": i, "prompt": t, "prompt_ids": [1], "answer_ids": [2]}) + "\n" for i, t in rows))
        return tmp_path / name

    out = tmp_path / "merged" / "chat.jsonl"
    assert g.merge([folder("a", [(0, "alpha"), (1, "beta")])], out) == (2, 0)
    # the same text under another index (a generator run over another list) is already answered
    assert g.merge([folder("b", [(5, "beta"), (2, "gamma")])], out) == (1, 1)
    before = out.read_text()
    # index 2 holds "gamma": a folder that gives it to "delta" comes from another list
    with pytest.raises(SystemExit, match=r"c/chat.jsonl: prompt index 2 is 'delta' there but 'gamma'"):
        g.merge([folder("d", [(3, "epsilon")]), folder("c", [(2, "delta")])], out)
    assert out.read_text() == before  # nothing of either folder was written
    assert [d["prompt"] for d in g.read_jsonl(out)] == ["alpha", "beta", "gamma"]


def test_device_applies_to_the_hf_engine_only(tmp_path):
    g = _tool("gen_chat_data")
    with pytest.raises(SystemExit, match="--device applies to --engine hf only"):
        g.main(["--engine", "ort", "--device", "cuda", "--out", str(tmp_path / "chat.jsonl")])


def test_skip_answered_leaves_out_prompts_another_folder_answers(tmp_path):
    g, prompts = _tool("gen_chat_data"), _tool("prompts")
    todo = prompts.answerable_train_prompts(6)
    (i0, p0), (i1, p1), (i2, p2) = todo[:3]
    out, other = tmp_path / "new" / "chat.jsonl", tmp_path / "old" / "chat.jsonl"
    other.parent.mkdir()
    other.write_text(json.dumps({"idx": i0, "prompt": p0["prompt"]}) + "\n"
                     + json.dumps({"idx": 99999, "prompt": p2["prompt"]}) + "\n")  # another list's index
    assert g.answered_prompts(todo, g.read_jsonl(out)) == set()
    assert g.answered_prompts(todo, g.read_jsonl(out), [other]) == {i0, i2}
    out.parent.mkdir()
    out.write_text(json.dumps({"idx": i1, "prompt": p1["prompt"]}) + "\n")
    assert g.answered_prompts(todo, g.read_jsonl(out), [other]) == {i0, i1, i2}
    with pytest.raises(SystemExit, match="--skip-answered: .*nowhere.*chat.jsonl"):
        g.answered_prompts(todo, g.read_jsonl(out), [tmp_path / "nowhere" / "chat.jsonl"])
    with pytest.raises(SystemExit, match="--skip-answered: .*nowhere"):  # checked before any model loads
        g.main(["--skip-answered", str(tmp_path / "nowhere" / "chat.jsonl"), "--out", str(out)])


def test_an_answer_the_ort_engine_ended_short_gets_its_eos_back():
    """onnxruntime-genai drops the EOS that ends a whole batch from the sequence: answers
    shorter than the limit without it lost the row that teaches the draft to stop."""
    g = _tool("gen_chat_data")
    assert g.with_final_eos([5, 6, 7], 256) == [5, 6, 7, g.EOS]
    assert g.with_final_eos([5, 6, g.EOS], 256) == [5, 6, g.EOS]
    assert g.with_final_eos(list(range(3, 259)), 256) == list(range(3, 259))  # stopped by the limit

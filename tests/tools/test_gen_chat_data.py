"""tools/gen_chat_data.py: prompt shards and merging generator folders (no model needed)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from tests.real_model import ROOT, smollm2_folder
from tests.real_model import tool as _tool
from tests.runtime.test_verify import chi2_pvalue



def test_shards_split_the_prompts_without_overlap():
    g, prompts = _tool("gen_chat_data"), _tool("prompts")
    assert g.parse_shard(None) == (0, 1) == g.parse_shard("0/1") and g.parse_shard("1/3") == (1, 3)
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


def test_merge_writes_into_the_cache_that_cache_names(tmp_path, monkeypatch):
    """--merge without --out: the answers go to --cache's peagle-data, as a generator run's
    do (it wrote into $SPECRT_CACHE's, whatever --cache said)."""
    g = _tool("gen_chat_data")
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "env"))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "chat.jsonl").write_text(json.dumps({"idx": 0, "prompt": "p", "answer_ids": [2]}) + "\n")
    assert g.main(["--cache", str(tmp_path / "c"), "--merge", str(tmp_path / "a")]) == 0
    assert [d["prompt"] for d in g.read_jsonl(tmp_path / "c" / "peagle-data" / "chat.jsonl")] == ["p"]
    assert not (tmp_path / "env").exists()


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
    (tmp_path / "touched.jsonl").touch()  # nor does an empty one (a kill before the first write)
    with g.open_append(tmp_path / "touched.jsonl") as f:
        f.write("{}\n")
    assert (tmp_path / "touched.jsonl").read_text() == "{}\n"


def test_features_past_the_fp16_range_are_kept_at_its_limit(tmp_path):
    """The target's hidden states reach 2.5e4 and the store is fp16: a value past 65504 is
    stored as +-65504, not inf (an inf feature row would poison the trainer's loss)."""
    g = _tool("gen_chat_data")
    W = len(g.FEATURE_LAYERS) * g.HIDDEN
    g.FeatureStore(tmp_path).add(0, np.full((2, W), 1e5, np.float32), np.full((2, g.HIDDEN), -1e6))
    _, aux, fin = g.load_features(tmp_path)
    assert (aux == g.FP16_MAX).all() and (fin == -g.FP16_MAX).all()


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
    # two folders that give one new index two texts are refused too
    with pytest.raises(SystemExit, match=r"f/chat.jsonl: prompt index 7 is 'eta' there but 'zeta' in .* or an earlier"):
        g.merge([folder("e", [(7, "zeta")]), folder("f", [(7, "eta")])], out)
    assert out.read_text() == before


def test_device_applies_to_the_hf_engine_only(tmp_path):
    g = _tool("gen_chat_data")
    for device in ("cuda", "cuda:0"):
        with pytest.raises(SystemExit, match="--device applies to --engine hf only"):
            g.main(["--engine", "ort", "--device", device, "--limit", "1", "--out", str(tmp_path / "chat.jsonl")])


def test_answers_on_cuda_are_made_in_fp32_not_tf32():
    """--device cuda: TF32 matmuls would give other answers and features than the CPU's fp32."""
    torch = pytest.importorskip("torch")
    was = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        _tool("gen_chat_data").exact_fp32(torch)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = was


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
    with pytest.raises(SystemExit, match=r"--skip-answered: .*old is not a file \(expected a generator's chat.jsonl"):
        g.answered_prompts(todo, g.read_jsonl(out), [other.parent])  # the folder, not its file
    # an answer whose index this list gives another prompt does not answer that prompt
    assert g.answered_prompts(todo, [{"idx": i0, "prompt": "another list's prompt"}]) == set()
    with pytest.raises(SystemExit, match="--skip-answered: .*nowhere"):  # checked before any model loads
        g.main(["--skip-answered", str(tmp_path / "nowhere" / "chat.jsonl"), "--out", str(out)])


def test_an_answer_the_ort_engine_ended_short_gets_its_eos_back():
    """onnxruntime-genai drops the EOS that ends a whole batch from the sequence: answers
    shorter than the limit without it lost the row that teaches the draft to stop."""
    g = _tool("gen_chat_data")
    assert g.with_final_eos([5, 6, 7], 256) == [5, 6, 7, g.EOS]
    assert g.with_final_eos([5, 6, g.EOS], 256) == [5, 6, g.EOS]
    assert g.with_final_eos(list(range(3, 259)), 256) == list(range(3, 259))  # stopped by the limit


def test_sampling_options_are_checked_before_anything_loads(tmp_path):
    g = _tool("gen_chat_data")
    assert g.sampling_mode(0, 1, 5) is None
    assert g.sampling_mode(0.7, 0.9, 5) == {"temperature": 0.7, "top_p": 0.9, "seed": 5}
    for t, p, what in ((-0.1, 1, "--temperature -0.1"), (float("nan"), 1, "--temperature nan"),
                       (float("inf"), 1, "--temperature inf"), (1, 0, "--top-p 0"), (1, 1.5, "--top-p 1.5"),
                       (0, 0.9, "--top-p applies to sampled answers only")):
        with pytest.raises(SystemExit, match=what):
            g.sampling_mode(t, p, 0)
    with pytest.raises(SystemExit, match="--temperature applies to --engine hf only"):
        g.main(["--engine", "ort", "--temperature", "0.7", "--limit", "1", "--out", str(tmp_path / "chat.jsonl")])
    assert not (tmp_path / "chat.jsonl").exists()


def test_a_folder_holds_answers_of_one_mode(tmp_path):
    """Sampled answers go to a folder of their own: the generator knows finished prompts by
    their text, and a greedy folder's feature store is keyed by prompt index."""
    g, prompts = _tool("gen_chat_data"), _tool("prompts")
    out = tmp_path / "chat.jsonl"
    mode = g.sampling_mode(0.7, 1, 1)
    g.check_mode(out, [], mode)  # a new folder takes either
    g.check_mode(out, [], None)
    greedy = [{"idx": 0, "prompt": "a"}]
    sampled = [{"idx": 0, "prompt": "a", "sampling": mode}]
    g.check_mode(out, greedy, None)
    g.check_mode(out, sampled, dict(mode))
    with pytest.raises(SystemExit, match=r"chat.jsonl: its answers were made greedy, this run's would be \{"):
        g.check_mode(out, greedy, mode)
    with pytest.raises(SystemExit, match=r"made \{.*\"seed\": 1.*, this run's would be greedy"):
        g.check_mode(out, sampled, None)
    with pytest.raises(SystemExit, match=r"\"seed\": 2"):
        g.check_mode(out, sampled, g.sampling_mode(0.7, 1, 2))
    with pytest.raises(SystemExit, match=r"made \{.*\"seed\": 1.*, this run's would be greedy"):
        g.check_mode(out, greedy + sampled, None)  # every answer counts, not the first
    (i0, p0), = prompts.answerable_train_prompts(1)
    out.write_text(json.dumps({"idx": i0, "prompt": p0["prompt"], "prompt_ids": [1], "answer_ids": [2]}) + "\n")
    with pytest.raises(SystemExit, match="write them to a folder of their own"):  # before the model loads
        g.main(["--engine", "hf", "--temperature", "0.7", "--limit", "1", "--out", str(out)])


def test_merge_keeps_sampled_answers_beside_the_greedy_ones_without_features(tmp_path):
    g = _tool("gen_chat_data")
    W = len(g.FEATURE_LAYERS) * g.HIDDEN
    a = tmp_path / "a"
    a.mkdir()
    g.FeatureStore(a).add(3, np.ones((2, W), np.float16), np.ones((2, g.HIDDEN)))
    mode = {"temperature": 0.7, "top_p": 1.0, "seed": 1}
    rows = [{"idx": 3, "prompt": "p", "prompt_ids": [1], "answer_ids": [2, 2]},
            {"idx": 3, "prompt": "p", "prompt_ids": [1], "answer_ids": [5, 2], "sampling": mode}]
    (a / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    b = tmp_path / "b"
    b.mkdir()
    (b / "chat.jsonl").write_text(json.dumps({**rows[1], "answer_ids": [6, 2], "sampling": {**mode, "seed": 2}}) + "\n")
    out = tmp_path / "m" / "chat.jsonl"
    assert g.merge([a, b], out) == (3, 0)
    merged = g.read_jsonl(out)
    assert [d["answer_ids"] for d in merged] == [[2, 2], [5, 2], [6, 2]]
    entries, _, _ = g.load_features(out.parent)
    assert entries == {3: {"idx": 3, "row": 0, "n": 2}}  # the greedy answer's rows, once
    assert g.merge([a, b], out) == (0, 3)
    c = tmp_path / "c"  # another list's text for index 3, sampled or not, is refused
    c.mkdir()
    (c / "chat.jsonl").write_text(json.dumps({**rows[1], "prompt": "q"}) + "\n")
    with pytest.raises(SystemExit, match="prompt index 3 is 'q' there but 'p'"):
        g.merge([c], out)


def test_sampled_answers_draw_from_the_whole_distribution_reproducibly():
    """HfEngine's sampling: the first token of 3000 answers to one prompt is distributed as
    softmax(logits / T) over the whole vocabulary (no top-k of the generation defaults),
    each batch's draws come from its seed, and greedy stays greedy."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    g = _tool("gen_chat_data")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, eos_token_id=2, pad_token_id=2)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8)  # a peaked distribution (top token ~0.13) whose tail past a top-50 still weighs
    prompt = [5, 9, 7]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].double()
    T = 0.8
    p = torch.softmax(logits / T, -1).numpy()
    tail = np.sort(p)[::-1][50:].sum()
    assert 0.05 < tail < 0.5
    mode = {"temperature": T, "top_p": 1.0, "seed": 4}
    eng = g.HfEngine(model=model, max_new=1, sampling=mode)
    n = 3000
    first = np.asarray([r[0] for r in eng.generate([prompt] * n, list(range(n)))])
    counts = np.bincount(first, minlength=len(p))
    assert chi2_pvalue(counts, p * n) > 1e-3  # (cells expected < 5 times pooled)
    assert abs((~np.isin(first, np.argsort(-p)[:50])).mean() - tail) < 0.03  # the tail is drawn
    again = np.asarray([r[0] for r in eng.generate([prompt] * n, list(range(n)))])
    assert np.array_equal(first, again)  # the same batch, the same seed: the same draws
    other = np.asarray([r[0] for r in eng.generate([prompt] * n, list(range(1, n + 1)))])
    assert not np.array_equal(first, other)
    assert g.batch_seed(4, [0, 1]) != g.batch_seed(5, [0, 1]) != g.batch_seed(4, [1, 0])
    greedy = g.HfEngine(model=model, max_new=1).generate([prompt] * 3)
    assert [r[0] for r in greedy] == [int(logits.argmax())] * 3


def test_the_hf_generator_answers_what_is_left_as_greedy_decoding_does(tmp_path, capsys):
    """main --engine hf on the real target: the prompts the output file answers are skipped, the
    rest go in batches of --batch (prompts of two lengths left-padded into one) and the leftover
    at the end; each answer is cut after its first EOS and equals the committed greedy answer
    (fixtures/peagle-data, the ORT engine's). --max-seconds 0 starts no batch. Three TRAIN
    prompts with answers of 9 and 20 tokens keep it to seconds."""
    pytest.importorskip("transformers")
    smollm2_folder()
    g, prompts = _tool("gen_chat_data"), _tool("prompts")
    with gzip.open(ROOT / "fixtures" / "peagle-data" / "chat.jsonl.gz", "rt") as f:
        committed = {d["idx"]: d for d in map(json.loads, f) if d["idx"] in (29, 390, 638) and "sampling" not in d}
    todo = prompts.answerable_train_prompts(640)
    assert set(committed) < {i for i, _ in todo}

    def folder(name: str, mode: dict | None):  # every other prompt already answered
        out = tmp_path / name / "chat.jsonl"
        out.parent.mkdir()
        out.write_text("".join(json.dumps({"idx": i, "prompt": d["prompt"], "sampling": mode}) + "\n"
                               for i, d in todo if i not in committed))
        return out

    args = ["--engine", "hf", "--limit", "640", "--batch", "2"]
    out = folder("greedy", None)
    assert g.main([*args, "--out", str(out), "--max-seconds", "0"]) == 0
    assert len(g.read_jsonl(out)) == len(todo) - 3 and "--max-seconds 0 spent" in capsys.readouterr().err
    assert g.main([*args, "--out", str(out), "--max-seconds", "90"]) == 0  # (a regression stops, not hangs)
    err = capsys.readouterr().err
    assert f"{len(todo) - 3} of {len(todo)} prompts already done" in err
    assert "+2 rows (len 38), session 2 rows 29 tokens" in err and "+1 rows (len 38), session 3 rows 38 tokens" in err
    new = g.read_jsonl(out)[len(todo) - 3:]
    assert [d["idx"] for d in new] == [29, 390, 638]
    for d in new:
        c = committed[d["idx"]]
        assert {**d, "engine": "ort"} == c and d["engine"] == "hf"  # no "sampling"
    # sampled at a temperature this low, the first two answers are the greedy ones (prompt 638's
    # greedy EOS is a near tie), each line with its mode; a --device other than the CPU's
    # batches the prompts by length (the shorter first) and names itself in "engine"
    mode = g.sampling_mode(0.01, 1, 3)
    out = folder("sampled", mode)
    assert g.main([*args, "--out", str(out), "--temperature", "0.01", "--seed", "3", "--limit", "600",
                   "--device", "cpu:0"]) == 0
    new = g.read_jsonl(out)[len(todo) - 3:]
    assert [(d["idx"], d["answer_ids"], d["sampling"], d["engine"]) for d in new] == [
        (i, committed[i]["answer_ids"], mode, "hf-cpu:0") for i in (390, 29)]


def test_a_sampled_answer_is_drawn_from_its_prompts_own_seed(tmp_path):
    """main --engine hf --temperature: each batch samples from the seed of the run's --seed and
    its prompts' indices (batch_seed), so two batches of one size draw different streams and a
    prompt's answer does not depend on which prompts came before it (session 65's G61: main
    passed no indices, every batch of one size drew from one seed). One prompt, sampled at
    temperature 1 (where seeds part at once), against HfEngine keyed with its index and with 0."""
    pytest.importorskip("transformers")
    hf_dir = smollm2_folder()
    g, prompts = _tool("gen_chat_data"), _tool("prompts")
    todo = prompts.answerable_train_prompts(40)
    idx = 29
    assert idx in {i for i, _ in todo}
    out = tmp_path / "c" / "chat.jsonl"
    out.parent.mkdir()
    mode = g.sampling_mode(1.0, 1, 3)
    out.write_text("".join(json.dumps({"idx": i, "prompt": d["prompt"], "sampling": mode}) + "\n"
                           for i, d in todo if i != idx))
    torch = pytest.importorskip("torch")
    was = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        assert g.main(["--engine", "hf", "--limit", "40", "--batch", "1", "--temperature", "1", "--seed", "3",
                       "--out", str(out)]) == 0
        # fp32 matmuls, not TF32, whatever the --device (session 65's X09: "cuda:0" was left TF32)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = was
    (new,) = g.read_jsonl(out)[len(todo) - 1:]
    assert new["idx"] == idx and new["sampling"] == mode
    from transformers import AutoTokenizer

    ids = g.chat_ids(AutoTokenizer.from_pretrained(hf_dir), dict(todo)[idx]["prompt"])
    engine = g.HfEngine(hf_dir, sampling=mode, max_new=len(new["answer_ids"]))
    keyed = engine.generate([ids], [idx])[0]
    assert new["answer_ids"] == g.cut_at_eos(keyed)[:len(new["answer_ids"])]
    assert g.cut_at_eos(engine.generate([ids], [0])[0]) != new["answer_ids"]  # (the seed of another index)

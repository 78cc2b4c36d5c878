"""The real pair: SmolLM2-135M-Instruct with the committed P-EAGLE draft (slow).

Greedy speculative output equals target-only output and transformers' generate, token for
token, on 30 held-out chat prompts at every depth 1..8, with token trees and with prompt lookup.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NEW_TOKENS = 24
N_PROMPTS = 30
DEPTHS = (1, 2, 3, 4, 5, 6, 7, 8)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.real_model import committed_draft, smollm2_folder

    draft = committed_draft()
    assert (draft / "model.safetensors").is_file(), "the committed trained draft is missing from this checkout"
    target = smollm2_folder()
    root = tmp_path_factory.mktemp("real")
    export(target, draft, root / "exp")
    build_engines(root / "exp", "onnxruntime", DEPTHS, root / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(64,), max_context=512)
    return target, root / "eng"


def test_greedy_identity_30_prompts_every_depth(real):
    import torch
    import transformers

    from specrt.runtime.session import Session

    target, eng = real
    lines = (ROOT / "tools" / "data" / "heldout_prompts.jsonl").read_text().splitlines()
    prompts = [json.loads(x)["prompt"] for x in lines][:: max(1, len(lines) // N_PROMPTS)][:N_PROMPTS]
    assert len(prompts) == N_PROMPTS
    outputs: dict[str, list[list[int]]] = {}
    accepted = 0
    for gov in ["off", *(f"fixed:{d}" for d in DEPTHS), "adaptive", "dspark", "fixed:2:tree=3", "dspark:tree=2",
                "dspark:tree=3:ngram", "off:ngram"]:
        with Session(eng, governor=gov) as s:
            ids = [s.text.encode(p, chat=True) for p in prompts]
            outputs[gov] = [s.generator.generate(x, NEW_TOKENS, s.eos) for x in ids]
            accepted += s.generator.telemetry.accepted
    hf = transformers.AutoModelForCausalLM.from_pretrained(target).eval()
    with torch.no_grad():
        want = [hf.generate(torch.tensor([x]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(x):].tolist()
                for x in ids]
    for gov, outs in outputs.items():
        for i, (got, ref) in enumerate(zip(outs, outputs["off"])):
            assert got == ref, f"{gov}: prompt {i} differs from target-only decoding"
    for i, (got, ref) in enumerate(zip(outputs["off"], want)):
        n = len(got)
        assert got == ref[:n], f"prompt {i}: engines differ from transformers' generate"
    assert accepted > 0


def test_ctrl_c_in_chat_stops_the_answer_and_the_conversation_goes_on(real):
    """Ctrl-C during an answer of `specrt chat` ended the whole conversation ("Aborted!",
    exit 1). It stops that answer: the text printed so far stays in the conversation, whose
    KV rows the next turn reuses past the first prompt (the rows the interrupted answer
    committed are consistent), and the next turn answers."""
    import os
    import signal
    import subprocess
    import sys
    import time

    _, eng = real
    p = subprocess.Popen([sys.executable, "-c", "from specrt.cli import entry; entry()", "chat", str(eng),
                          "--max-new-tokens", "400", "--governor", "auto"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "SPECRT_THP": "0"},
                         # Ctrl-C as a terminal gives it, whatever this process inherited (a
                         # shell's background job ignores SIGINT, and so would the chat)
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        p.stdin.write(b"Write a long story about a dragon who learns to paint.\n")
        p.stdin.flush()
        first = p.stdout.read(40)  # the answer is streaming
        assert len(first) == 40
        os.kill(p.pid, signal.SIGINT)
        time.sleep(0.5)
        out, err = p.communicate(b"Give the dragon a name.\n\n", timeout=300)
    finally:
        p.kill()
    err = err.decode()
    assert p.returncode == 0, err
    assert "[stopped: the answer so far stays in the conversation" in err and "Aborted" not in err, err
    stats = [ln for ln in err.splitlines() if "prompt tokens reused]" in ln]
    assert len(stats) == 2, err
    n1 = int(stats[0].rsplit(" of ", 1)[1].split()[0])  # the first turn's prompt tokens
    reused, n2 = (int(x) for x in stats[1].rsplit("; ", 1)[1].split()[0:3:2])
    assert reused > n1 and n2 > reused, err  # the prompt and the stopped answer's rows
    assert len((first + out).decode().strip().splitlines()) >= 2

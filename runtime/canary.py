"""The acceptance canary: a short greedy run that catches a mis-bound pair (issue 4).

A weight bound to the wrong slot can leave training accuracy looking fine while
acceptance collapses (a speculators loader once bound ``norm.weight`` by suffix: ~63%
training accuracy, ~10% acceptance). Right after building, specrt decodes a few prompts
at depth 1 and compares the measured depth-1 acceptance with what the draft's training
receipt promises:

    expected = receipt["heldout"]["loop"]["1"]["acceptance_at_pos"][0]   (a fixed:1 loop on unseen prompts)
             | receipt["heldout"]["acceptance_at_pos"][0]                  (every anchor of them)
             | receipt["training_last_window"]["depth_1"]["accuracy"]
    trusted  = measured >= UNTRUSTED_RATIO * expected

The held-out estimates are preferred because a small draft's training accuracy overstates
what it does on new text (DESIGN.md §10: 0.75 on training prompts, 0.24 unseen), which
would make an honest pair look broken; of them the fixed:1 loop's (tools/train_peagle.py
writes it since session 49) is what the canary's own depth-1 run measures: its rounds start
one past the last accepted token, more often just after a miss than anchors do (stage 8:
0.585 against 0.614 over every anchor, ``results/loop_weight``). The receipt ``ENGINES/acceptance_receipt.json``
names the binding receipt and the target tensors the draft relies on, so it is tied to
exactly these weights; ``specrt run`` prints a loud warning when it says untrusted.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from specrt.errors import UserError
from specrt.paths import read_json_object, write_atomic

from .generate import Generator
from .governor import FixedGovernor
from .session import ACCEPTANCE_FILE, engine_files, read_d2t
from .text import Text

UNTRUSTED_RATIO = 0.5
# Without a training receipt (speculators writes none: only config.json and the weights) there
# is nothing to compare with, so a mis-bound pair would pass unseen. A trained draft of the
# supported kinds accepts well above this at depth 1 (the committed SmolLM2 draft, a weak one,
# 0.39 here); the same draft with its aux layer ids changed measured 0.09. Below it the canary
# says so (the receipt stays trusted: nothing proves a binding error without a receipt).
LOW_WITHOUT_RECEIPT = 0.2
LOW_MIN_DRAFTS = 50
# Fewer drafts than this prove nothing either way: the verdict is "inconclusive" (a context too
# small for the prompts to draft gave 0.00 over 0 drafts, "trusted" without a receipt, and
# UNTRUSTED beside one: a false alarm of a mis-bound weight)
MIN_DRAFTS = 10
PROMPTS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a binary search does.",
    "List three fruits that are red.",
    "How many days are in a leap year?",
    "Give me a tip for learning to cook.",
)


# where a training receipt may say its depth-1 acceptance, the preferred first (the module's
# docstring); None: a list whose first entry (position 1's) is the figure
EXPECTED_FIELDS = (("heldout", "loop", "1", "acceptance_at_pos", None), ("heldout", "acceptance_at_pos", None),
                   ("training_last_window", "depth_1", "accuracy"))


def expected_depth1(receipt: dict, where: str = "the training receipt") -> tuple[float | None, str]:
    """The depth-1 acceptance ``receipt`` (a draft's training_receipt.json, read from
    ``where``) promises and the field it came from, the first of EXPECTED_FIELDS it has;
    (None, "none") when it has none. A field there that is not what the canary can compare
    with (an object on the way, a list of rates in [0, 1] at the end) is a UserError naming
    ``where`` and the field: `specrt export` checks it before anything is written."""
    for path in EXPECTED_FIELDS:
        node, name = receipt, ""
        for key in path:
            if key is None:  # the list of rates by position: position 1's
                if not (isinstance(node, list) and node):
                    raise UserError(f"{where}: {name} must be a list of acceptance rates by draft position, position "
                                    f"1's first; found {_short(node)}")
                node, name = node[0], f"{name}[0]"
                break
            if not isinstance(node, dict):
                raise UserError(f"{where}: {name or 'the receipt'} must be a JSON object; found {_short(node)}")
            if node.get(key) is None:
                node = None
                break
            node, name = node[key], f"{name}.{key}" if name else key
        if node is None:
            continue
        if isinstance(node, bool) or not isinstance(node, (int, float)) or not 0 <= node <= 1:
            raise UserError(f"{where}: {name} must be an acceptance rate from 0 to 1 (what the acceptance canary "
                            f"compares its measured depth-1 acceptance with); found {_short(node)}")
        return float(node), name
    return None, "none"


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def draft_verifier(export: dict) -> str | None:
    """The model the export's draft names as the one it was trained against (its
    speculators_config.verifier.name_or_path, in the binding receipt), or None."""
    return export["binding_receipt"]["draft"]["config"].get("verifier_name")


def lora_cause(export: dict) -> str | None:
    """Why acceptance may fall with no weight mis-bound: the target merges a LoRA adapter
    (`specrt export --lora`) that the draft, trained on the base model, never saw (None: it
    merges none). Decoding stays lossless; only acceptance drops."""
    lora = export["binding_receipt"]["target"].get("lora")
    if not lora:
        return None
    return (f"the target merges the LoRA adapter {lora['folder']} (export --lora), which the draft's training did not "
            "see: a draft trained on the base model accepts less on the fine-tuned one (the output is the target's "
            "either way); train the draft on the merged target to win it back")


def low_note(measured: float, verifier: str | None = None) -> str:
    """What a low depth-1 acceptance with no training receipt means and what to check;
    ``verifier``: the model the draft names as the one it was trained against."""
    named = f", which names '{verifier}'" if verifier else ""
    return (f"depth-1 acceptance {measured:.2f} is below {LOW_WITHOUT_RECEIPT} that a trained draft reaches: check "
            f"that the draft was trained for this target (its speculators_config.verifier{named}) and its "
            "eagle_aux_hidden_state_layer_ids, or put the acceptance the draft reached in training beside it "
            "(DRAFT/training_receipt.json, {\"heldout\": {\"acceptance_at_pos\": [p1, ...]}}) and export again "
            "so that the canary can compare")


def inconclusive_note(drafts: int, context: int, cramped: bool) -> str:
    """Why the canary proved nothing: too few drafts, the engines' context too small for its
    prompts (``cramped``: a prompt left out, or an answer cut at the context) or the target's
    answers ending at once."""
    why = (f"the engines' context of {context} tokens leaving the canary's prompts too little room to draft"
           if cramped else "the target's answers ending (EOS) before the draft could run")
    return (f"inconclusive: {drafts} drafts (at least {MIN_DRAFTS} decide), {why}; "
            "nothing has checked the draft's binding")


def prompt_ids(export_dir: Path, vocab_size: int, prompts=PROMPTS) -> list[list[int]]:
    """``prompts`` as token ids through the export's tokenizer (and chat template, when it
    has one); tokenizer-less test models get fixed pseudo-random prompts instead."""
    if (Path(export_dir) / "tokenizer.json").is_file():
        text = Text(export_dir)
        chat = text.chat_template is not None
        return [text.encode(p, chat) for p in prompts]
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab_size, 12).tolist() for _ in prompts]


def run_canary(engines, max_new_tokens: int = 48, prompts=PROMPTS) -> dict:
    """Measure depth-1 greedy acceptance on ``engines`` (an active EngineSet) and write the receipt."""
    exp, export_dir = engines.export, Path(engines.export_dir)
    draft = exp.get("draft")
    if draft is None:
        return {}
    # those with room for their first token and a round of `depth` drafts after it (a build with a tiny
    # --max-context failed in the canary with the context error of a prompt the user never wrote); the
    # prompt and the answer together hold at most max_context tokens (generate.py's room), and that round
    # adds depth + 1 to the first: len + 2 kept prompts that could only decode, counted as measured (h74d)
    depth = 1 if 1 in engines.depths else engines.depths[0]  # position 1 is measured at any depth
    every = prompt_ids(export_dir, exp["target"]["vocab_size"], prompts)
    token_prompts = [p for p in every if len(p) + depth + 2 <= engines.max_context]
    cramped = len(token_prompts) < len(every)
    gen = Generator(engines, FixedGovernor(engines.depths, depth), d2t=read_d2t(export_dir, exp))
    drafted = accepted = 0
    for ids in token_prompts:
        gen.generate(ids, max_new_tokens, exp["target"]["eos_token_ids"])
        cramped = cramped or gen.finished.reason == "context"
        t = gen.telemetry
        drafted += t.offered_at[0] if t.offered_at else 0
        accepted += t.accepted_at[0] if t.accepted_at else 0
    measured = accepted / drafted if drafted else 0.0
    training = None
    if draft.get("training_receipt"):
        path = export_dir / draft["training_receipt"]["file"]
        training = read_json_object(path)
    expected, source = expected_depth1(training, str(path)) if training else (None, "none")
    inconclusive = drafted < MIN_DRAFTS
    trusted = True if expected is None or inconclusive else measured >= UNTRUSTED_RATIO * expected
    low = expected is None and drafted >= LOW_MIN_DRAFTS and measured < LOW_WITHOUT_RECEIPT
    if inconclusive:
        note = inconclusive_note(drafted, engines.max_context, cramped)
    elif expected is not None:
        note = None if trusted else lora_cause(exp)
    else:
        note = "no training receipt: nothing to compare with" + (
            f"; {low_note(measured, draft_verifier(exp))}" if low else "")
        if low and lora_cause(exp):
            note += f"; or {lora_cause(exp)}"
    rec = exp["binding_receipt"]
    result = {
        "format": "specrt-acceptance-receipt/1",
        "binding_receipt_id": rec["receipt_id"],
        "draft_relies_on_target": rec["draft"]["relies_on_target"],
        "draft_slot_hashes": {s: v["sha256"] for s, v in rec["draft"]["slots"].items()},
        # the engine files measured (engines.json's hashes): a receipt copied beside another build of
        # the export (other --draft-weights) vouched for a draft graph it never ran (session.py checks)
        "engine_files": engine_files(engines.manifest),
        "measured_depth1": measured,
        "drafts": drafted,
        "prompts": len(token_prompts),
        "max_new_tokens": max_new_tokens,
        "training_depth1": expected,
        "training_source": source,
        "untrusted_ratio": UNTRUSTED_RATIO,
        "trusted": bool(trusted),
        "low_without_receipt": bool(low),
        "inconclusive": inconclusive,
        "note": note,
    }
    engines.check_still_here(ACCEPTANCE_FILE)
    # whole or absent, a temporary of its own (two canaries at once share none); a failed write
    # is atomic_file's UserError naming the file
    write_atomic(Path(engines.folder) / ACCEPTANCE_FILE, result, indent=2)
    return result

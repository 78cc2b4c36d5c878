"""Append decoder layers to a saved P-EAGLE draft, each starting as the identity (or grow its vocabulary).

The grown draft drafts exactly what the original does (train_peagle.grow_layers: the new
layers' o_proj and down_proj are zero, their other weights random), so exporting and
building it measures what the extra layers cost in the engines at equal acceptance, and
``train_peagle.py --init GROWN`` (or ``--init ORIGINAL --layers N``, the same start) trains
them. The folder is written as train_peagle writes its drafts (config.json with
``num_hidden_layers`` N, fp16 model.safetensors, training_receipt.json: the original's with a
``grown`` record), atomically.

    python tools/grow_draft.py fixtures/peagle-smollm2 --layers 3 -o out/peagle-3-layers   # (2 layers since session 58)

``--vocab N --vocab-answers FILE...`` grows the draft vocabulary instead (or as well) to N
tokens: its own and the most frequent others of those answers, their head rows from the
target's through the map its own rows follow (train_peagle.grow_vocab, which needs the
SmolLM2 target of tools/smollm2.py). Such a draft drafts nearly what the original does (its
new rows' logits come out low), so building it measures what the wider head costs.

    python tools/grow_draft.py fixtures/peagle-smollm2 --vocab 16384 \
        --vocab-answers fixtures/peagle-data/chat*.jsonl.gz -o out/peagle-16k
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_peagle as tp  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("draft", type=Path, help="a P-EAGLE draft folder train_peagle saved")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers in all (more than the draft's)")
    ap.add_argument("--vocab", type=int, default=None, help="draft vocabulary size in all (more than the draft's)")
    ap.add_argument("--vocab-answers", type=Path, nargs="+", default=None, metavar="FILE",
                    help="with --vocab: generator answer files (.jsonl, .jsonl.gz) whose tokens choose the new ones")
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0, help="for the new layers' random weights")
    args = ap.parse_args(argv)
    cfg = tp.saved_draft_config(args.draft, str(args.draft))
    c = cfg["transformer_layer_config"]
    where = args.draft / "config.json"
    if args.layers is None and args.vocab is None:
        raise SystemExit("expected --layers N and/or --vocab N (what to grow)")
    if args.layers is not None and args.layers <= c["num_hidden_layers"]:
        raise SystemExit(f"--layers {args.layers}: expected more than the draft's {c['num_hidden_layers']} ({where})")
    if args.vocab is not None:
        if not cfg["draft_vocab_size"] < args.vocab <= c["vocab_size"]:
            raise SystemExit(f"--vocab {args.vocab}: expected more than the draft's {cfg['draft_vocab_size']} "
                             f"({where}) and at most the target's {c['vocab_size']}")
        if not args.vocab_answers:
            raise SystemExit("--vocab needs --vocab-answers (the answers whose tokens choose the new ones)")
        tp.require_answer_files("--vocab-answers", args.vocab_answers)
    elif args.vocab_answers:
        raise SystemExit("--vocab-answers without --vocab: nothing would read them")
    torch.manual_seed(args.seed)
    if args.vocab is None:  # the verifier's embeddings are not part of the saved draft: zeros stand in for them
        embed = torch.zeros(c["vocab_size"], c["hidden_size"])
    else:  # the new head rows start from the target's
        embed = tp.smollm2_target(tp.default_cache())[3].model.embed_tokens.weight.detach().clone()
    model = tp.load_draft(args.draft, embed)
    grown, record, what = model, {}, []
    if args.layers is not None:
        grown = tp.grow_layers(grown, args.layers)
        record.update(layers=[c["num_hidden_layers"], args.layers], seed=args.seed)
        what.append(f"{args.layers} layers (o_proj and down_proj of the new ones zero: the identity)")
    if args.vocab is not None:
        answers = [q for path in args.vocab_answers for q in tp.load_answers(path, keyed=False)]
        ids = tp.select_draft_vocab(answers, c["vocab_size"], args.vocab, keep=model.target_ids)
        grown = tp.grow_vocab(grown, ids)
        record.update(vocab=[cfg["draft_vocab_size"], args.vocab], vocab_answers=[str(x) for x in args.vocab_answers])
        what.append(f"a draft vocabulary of {args.vocab} (train_peagle.grow_vocab)")
    layers = args.layers or c["num_hidden_layers"]
    config = dict(cfg, transformer_layer_config=dict(c, num_hidden_layers=layers),
                  draft_vocab_size=args.vocab or cfg["draft_vocab_size"])
    receipt_path = args.draft / "training_receipt.json"
    receipt = json.loads(receipt_path.read_text()) if receipt_path.is_file() else {}
    receipt["grown"] = {"from": str(args.draft), "model_sha256": tp.sha256_file(args.draft / "model.safetensors"),
                        **record, "how": "tools/grow_draft.py: " + "; ".join(what)}
    tp.save_draft(args.out, grown, config, receipt)
    print(f"{args.out}: " + ", ".join(what) + (f", drafting what {args.draft} drafts" if args.vocab is None
                                                else f", drafting nearly what {args.draft} drafts"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

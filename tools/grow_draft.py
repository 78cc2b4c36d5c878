"""Append decoder layers to a saved P-EAGLE draft, each starting as the identity.

The grown draft drafts exactly what the original does (train_peagle.grow_layers: the new
layers' o_proj and down_proj are zero, their other weights random), so exporting and
building it measures what the extra layers cost in the engines at equal acceptance, and
``train_peagle.py --init GROWN`` (or ``--init ORIGINAL --layers N``, the same start) trains
them. The folder is written as train_peagle writes its drafts (config.json with
``num_hidden_layers`` N, fp16 model.safetensors, training_receipt.json: the original's with a
``grown`` record), atomically.

    python tools/grow_draft.py fixtures/peagle-smollm2 --layers 2 -o out/peagle-2-layers
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
    ap.add_argument("--layers", type=int, required=True, help="decoder layers in all (more than the draft's)")
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0, help="for the new layers' random weights")
    args = ap.parse_args(argv)
    cfg = tp.saved_draft_config(args.draft, str(args.draft))
    c = cfg["transformer_layer_config"]
    if args.layers <= c["num_hidden_layers"]:
        raise SystemExit(f"--layers {args.layers}: expected more than the draft's {c['num_hidden_layers']} "
                         f"({args.draft / 'config.json'})")
    torch.manual_seed(args.seed)
    # the verifier's embeddings are not part of the saved draft: zeros stand in for them
    model = tp.load_draft(args.draft, torch.zeros(c["vocab_size"], c["hidden_size"]))
    grown = tp.grow_layers(model, args.layers)
    config = dict(cfg, transformer_layer_config=dict(c, num_hidden_layers=args.layers))
    receipt_path = args.draft / "training_receipt.json"
    receipt = json.loads(receipt_path.read_text()) if receipt_path.is_file() else {}
    receipt["grown"] = {"from": str(args.draft), "model_sha256": tp.sha256_file(args.draft / "model.safetensors"),
                        "layers": [c["num_hidden_layers"], args.layers], "seed": args.seed,
                        "how": "tools/grow_draft.py: layers appended with o_proj and down_proj zero (the identity)"}
    tp.save_draft(args.out, grown, config, receipt)
    print(f"{args.out}: {args.layers} layers, drafting what {args.draft} drafts")
    return 0


if __name__ == "__main__":
    sys.exit(main())

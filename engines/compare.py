"""``specrt compare``: every engine role against a reference on the same realistic inputs,
through polygraphy's Comparator (DESIGN.md §7).

    report = compare_engines("ENGINES", reference="onnxruntime")   # or "torch"
    report["passed"], report["roles"]["verify.4"]["outputs"]["logits"]["max_abs"]

For each role (prefill, decode, verify.{d}, draft) the engine and the reference run as
polygraphy runners, ``Comparator.run([engine, reference], data_loader=feeds)``, then
``Comparator.compare_accuracy(results, compare_func=[simple, tokens])``.

Runners (polygraphy's ``BaseRunner``: ``activate / infer / deactivate`` + ``*_impl``):

* ``EngineRunner``: one specrt engine role (any backend) behind polygraphy's interface.
* reference ``onnxruntime``: polygraphy's ``OnnxrtRunner(SessionFromOnnx(graph))`` on the
  export's graph files. For TensorRT engines this is the TensorRT-vs-ONNX-Runtime check.
  For ONNX Runtime engines the engine *is* that graph file, so it checks what the engines
  add to it (session settings, prepacking, per-depth sessions, I/O binding, the graph file a
  role points at), not the export itself: use ``torch`` for that.
* reference ``torch``: the target checkpoint in transformers (eager attention, fp32),
  ``TorchTargetRunner``. Target roles only: transformers has no P-EAGLE/EAGLE-3 draft.

Inputs (``RoleInputs``): real token ids (the export's tokenizer on a fixed text, else a
fixed pseudo-random sequence in the vocabulary), consecutive positions, and a KV cache from
a real prefill of the prompt by the engines' own prefill: its new_key/new_value are the
past of decode and verify, its aux_hidden the draft's aux input. Both runners of a role get
the identical feeds, so a fault in the prefill engine cannot hide a fault elsewhere; it
shows in the prefill row itself.

Tolerances (``TOLERANCES``): polygraphy's elemwise check, per output: an element passes if
``|a - b| <= atol`` OR ``|a - b| <= rtol * |b|`` (b = reference). fp32 engines' logits and
hidden states against ONNX Runtime are compared in units of each reference row's scale
(``scale_rows``: both sides divided by max(1, its robust spread)), rounding growing with
the values a row holds. ``draft_token_ids`` must
match exactly, except at rows where the two sides' draft logits agree within tolerance and
the reference's top two are within that tolerance of each other (a tie either side may
break); the report then gives the agreement rate.
"""

from __future__ import annotations

import hashlib
import math
import os

import shlex
import tempfile
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from specrt import contracts as C
from specrt.engines.base import Runner, np_dtype
from specrt.engines.engine_set import EngineSet, load_engines
from specrt.engines.plan import DECODE, DRAFT, PREFILL, role_depth
from specrt.engines.quantize import check_int8_weights
from specrt.errors import EngineFailure, InternalError, UserError
from specrt.paths import atomic_file, check_path_args, check_temp_folder, write_atomic

REFERENCES = ("onnxruntime", "torch")
KINDS = (C.LOGITS, C.AUX_HIDDEN, C.NEW_KEY, C.NEW_VALUE, C.DRAFT_LOGITS, C.DRAFT_HIDDEN_OUT, C.DRAFT_CONFIDENCE)

# (atol, rtol) per output kind, by engine precision and reference.
# fp32 vs ONNX Runtime: the same maths with other kernels or reduction orders, ~1e-6
#   relative after 30 layers; 1e-4 leaves 100x margin and still catches one changed weight.
# fp32 vs torch: eager attention (softmax over the full row, then matmul) against the
#   graph's two-block attention and fused kernels: ~1e-5 relative; hidden states of real
#   models reach |h| ~ 1e2 (massive activations), where rtol 1e-3 is what bounds them.
# fp16 (unit roundoff 2^-11 = 4.9e-4) and bf16 (2^-8 = 3.9e-3): errors grow ~ sqrt(L)
#   times the roundoff through the residual stream; these bounds are ~20x the roundoff,
#   not yet measured on a GPU build (no TensorRT here).
_F32 = {k: (1e-4, 1e-4) for k in KINDS}
_F32_TORCH = {k: (1e-3, 1e-3) for k in KINDS}
_F16 = {C.LOGITS: (5e-2, 1e-2), C.AUX_HIDDEN: (5e-2, 1e-2), C.NEW_KEY: (2e-2, 1e-2), C.NEW_VALUE: (2e-2, 1e-2),
        C.DRAFT_LOGITS: (5e-2, 1e-2), C.DRAFT_HIDDEN_OUT: (5e-2, 1e-2),
        C.DRAFT_CONFIDENCE: (1e-2, 1e-2)}  # (a probability: the sigmoid damps its logit's error)
_BF16 = {k: (a * 8, r * 8) for k, (a, r) in _F16.items()}
# A draft built with int8 weights (--draft-weights int8, quantize.py) against the export's
#   float draft. Two checks. The weights, exactly (quantize.check_int8_weights): every block's
#   step is its largest |weight| / 128 and every weight within half a step (one where clipped),
#   so a wrong scale or a stale weight fails by a whole multiple. The outputs, statistically:
#   the weights' rounding and the kernel's int8 activations (accuracy_level 4) move the
#   logits by an rms of 3-9% of a row's std, and the worst of a compare's 2 x 8 x 8192
#   logits by 0.21 / 0.29 / 0.38 of the largest row std for the stage-3 / 4 / 5 SmolLM2
#   drafts (0.51 / 0.70 / 0.84 absolute; rising as training went on while the logits'
#   spread fell). A bound from the largest |logit| (5% of it, used until 2026-11-30) failed
#   the stage-5 draft; the logits bound is now ``INT8_DRAFT_ROW_STD`` x the reference's
#   largest per-row std (over the vocabulary), never below 0.5: ~2.6x the worst seen. A
#   wrong head scale moves the logits it touches by their own size, several row stds
#   (tested: doubling a quarter of the head's scales fails both checks). The KV (rows of 64
#   per head) moved by 0.36 / 0.41 / 0.36 for the same drafts, 0.054-0.060 of its largest
#   row std (|KV| up to ~23); its bound, 0.2 x that std (never below 0.5), is ~3.3x the
#   worst. Greedy tokens must agree except at near-ties within the logits bound (implied
#   by the elementwise bound: a flipped argmax needs a gap <= 2 atol). The dynamic form
#   (quantize.py: per-column codes on gate/up/head, activations quantized per call) moved the
#   stage-6 draft's logits by at most 1.05 against its bound of 2.14 (0.49 of it), its KV
#   not at all (k and v stay float); 14 of 16 tokens equal, 2 ties (2026-12-02).
INT8_DRAFT = {C.DRAFT_LOGITS: (0.5, 0.05), C.DRAFT_HIDDEN_OUT: (0.5, 0.05), C.NEW_KEY: (0.5, 0.05),
              C.NEW_VALUE: (0.5, 0.05), C.DRAFT_CONFIDENCE: (0.1, 0.0)}  # a confidence head's (its dot product,
# a Mul and a ReduceMean, stays float; the hidden state it reads moves with the int8 weights)
# atol >= this multiple of the reference's largest std along the last axis (by name or kind)
INT8_DRAFT_ROW_STD = {C.DRAFT_LOGITS: 1.0, C.NEW_KEY: 0.2, C.NEW_VALUE: 0.2}
INT8_WEIGHTS = "int8_weights"  # the draft role's weight check (quantize.check_int8_weights), a report entry
TOLERANCES = {("fp32", "onnxruntime"): _F32, ("fp32", "torch"): _F32_TORCH,
              ("fp16", "onnxruntime"): _F16, ("fp16", "torch"): _F16,
              ("bf16", "onnxruntime"): _BF16, ("bf16", "torch"): _BF16}

SAMPLE_TEXT = ("The quick brown fox jumps over the lazy dog. Speculative decoding lets a small draft model "
               "propose several tokens that the target model then verifies in a single forward pass, so the "
               "output is exactly what the target alone would have produced, only faster. ")


def kind_of(output: str) -> str:
    """``new_key.3`` -> ``new_key``; other names are their own kind."""
    return output.split(".", 1)[0]


# ---- tolerances -------------------------------------------------------------------------


def resolve_tolerances(outputs, precision: str, reference: str, atol=None, rtol=None,
                       int8_draft: bool = False) -> dict[str, tuple[float, float]]:
    """Output name -> (atol, rtol). ``atol``/``rtol``: None, a float (every output), or a dict
    whose keys are output names, kinds (``new_key``) or "" (every other output).
    int8_draft: the outputs are a draft's built with int8 weights (``INT8_DRAFT`` defaults)."""
    table = INT8_DRAFT if int8_draft else TOLERANCES[(precision, reference)]
    names = [o for o in outputs if o != C.DRAFT_TOKENS]

    def pick(over, name: str, i: int) -> float:
        if isinstance(over, Mapping):
            over = next((over[k] for k in (name, kind_of(name), "") if k in over), None)
        if over is None:
            return table[kind_of(name)][i]
        v = float(over)
        if not math.isfinite(v) or v < 0:  # a NaN tolerance made every comparison pass
            raise UserError(f"{('atol', 'rtol')[i]} {v} for {name}: expected a finite tolerance >= 0")
        return v

    return {n: (pick(atol, n, 0), pick(rtol, n, 1)) for n in names}


def check_tolerance_keys(over, known: set[str], option: str = "tolerance") -> None:
    if isinstance(over, Mapping):
        if C.DRAFT_TOKENS in over:  # (taken without a word and never used: TokenCompare has no tolerance)
            raise UserError(f"{option} {C.DRAFT_TOKENS}:{over[C.DRAFT_TOKENS]:g}: token ids take no tolerance (they "
                            f"must be equal, or a tie within {C.DRAFT_LOGITS}' tolerance): give {C.DRAFT_LOGITS}'s")
        # a name of a known kind is not enough: new_key.99 of a 4-layer target, or logits.x, names
        # no output, and its tolerance was never used (a mutation round, session 57)
        bad = sorted(k for k in over if k and k not in known)
        if bad:
            raise UserError(f"tolerance for unknown output(s) {bad}: expected one of {', '.join(sorted(KINDS))}, "
                            "an output name such as new_key.3, or a bare value for every output")


# ---- runners ----------------------------------------------------------------------------


def _metadata(specs):
    from polygraphy.common import TensorMetadata

    meta = TensorMetadata()
    for t in specs:
        meta.add(t.name, np_dtype(t.dtype), [d if isinstance(d, int) else None for d in t.shape])
    return meta


def _base_runner():
    try:
        from polygraphy.backend.base import BaseRunner
    except ImportError:
        raise UserError("specrt compare needs polygraphy (pip install polygraphy)") from None
    return BaseRunner


def _import_torch_first() -> None:
    """torch imported (where installed) before polygraphy's first array check, which imports it
    inside a bare ``except:`` (util/array.py's ``torch.is_importable()``, mod/importer.py): a
    Ctrl-C or SIGTERM landing in that import (seconds) was swallowed, the comparison went on
    and crashed (SIGSEGV) on the half-imported torch (session 55's interruption walk). Here an
    interrupt stops compare as anywhere else; polygraphy then finds torch imported."""
    try:
        import torch  # noqa: F401
    except Exception:  # not installed, or broken (a CUDA wheel missing its libraries): polygraphy's
        pass  # check then finds it not importable, as before; the onnxruntime reference needs none


def engine_runner(inner: Runner, name: str):
    """A specrt engine role as a polygraphy runner. It activates the role only if the caller
    has not (an active EngineSet shares one session per graph across roles)."""
    BaseRunner = _base_runner()

    class EngineRunner(BaseRunner):
        def __init__(self):
            super().__init__(name=name, prefix="specrt")
            self.inner, self._owned = inner, False

        def activate_impl(self):
            self._owned = not self.inner.is_active
            if self._owned:
                self.inner.activate()

        def get_input_metadata_impl(self):
            return _metadata(self.inner.get_input_metadata())

        def infer_impl(self, feed_dict):
            out = self.inner.infer(dict(feed_dict))
            self.inference_time = self.inner.last_inference_time
            # the engine's fixed-shape outputs are overwritten by its next call: copy
            return OrderedDict((k, np.array(v, copy=True)) for k, v in out.items())

        def deactivate_impl(self):
            if self._owned:
                self.inner.deactivate()
            self._owned = False

    return EngineRunner()


def torch_target_runner(model, inputs, aux_layer_ids, name: str):
    """The target in transformers behind polygraphy's runner interface: the target graph's
    feeds (contracts.target_io) in, its outputs out. Past KV [1, P, KVH, D] becomes a
    DynamicCache [1, KVH, P, D]; aux_hidden concatenates the residual stream entering layer
    i (output_hidden_states[i]; i = L: the last layer's output before the final norm,
    which output_hidden_states does not give, so a hook takes it)."""
    import inspect

    import torch
    from transformers import DynamicCache

    BaseRunner = _base_runner()
    cfg = model.config
    L = int(cfg.num_hidden_layers)
    layers = model.get_decoder().layers
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.2 renamed it

    def bhsd(a: np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(a.astype(np.float32).transpose(0, 2, 1, 3)))

    def layer_kv(cache, i: int):
        if hasattr(cache, "layers"):
            return cache.layers[i].keys, cache.layers[i].values
        return cache.key_cache[i], cache.value_cache[i]  # pragma: no cover - transformers < 4.56

    class TorchTargetRunner(BaseRunner):
        def __init__(self):
            super().__init__(name=name, prefix="torch")

        def get_input_metadata_impl(self):
            return _metadata(inputs)

        def infer_impl(self, feed_dict):
            t0 = time.perf_counter()
            ids, pos = feed_dict[C.INPUT_IDS], feed_dict[C.POSITION_IDS]
            s, p = ids.shape[1], feed_dict[C.past_key(0)].shape[1]
            if not np.array_equal(pos[0], np.arange(p, p + s)):
                raise UserError(f"{name}: the torch reference needs consecutive positions {p}..{p + s - 1} after "
                                f"{p} past tokens, got {pos[0].tolist()}")
            cache = DynamicCache(config=cfg)
            for i in range(L):
                if p:
                    cache.update(bhsd(feed_dict[C.past_key(i)]), bhsd(feed_dict[C.past_value(i)]), i)
            taps = {}
            hook = layers[L - 1].register_forward_hook(
                lambda mod, args, out: taps.__setitem__(L, out[0] if isinstance(out, tuple) else out))
            try:
                with torch.inference_mode():
                    out = model(input_ids=torch.from_numpy(ids), position_ids=torch.from_numpy(pos), use_cache=True,
                                output_hidden_states=True, **{cache_kw: cache})
            finally:
                hook.remove()
            hs = out.hidden_states
            aux = torch.cat([taps[i] if i == L else hs[i] for i in aux_layer_ids], dim=-1)
            res = OrderedDict([(C.LOGITS, out.logits.float().numpy()), (C.AUX_HIDDEN, aux.float().numpy())])
            for i in range(L):
                k, v = layer_kv(cache, i)
                res[C.new_key(i)] = k[:, :, p:].permute(0, 2, 1, 3).contiguous().numpy()
                res[C.new_value(i)] = v[:, :, p:].permute(0, 2, 1, 3).contiguous().numpy()
            self.inference_time = time.perf_counter() - t0
            return res

    return TorchTargetRunner()


def check_same_target(folder: Path, exp: dict[str, Any]):
    """UserError unless ``folder`` binds to the tensors the export's binding receipt records
    (slot by slot, by sha256): a torch reference from another checkpoint fails every
    comparison, or crashes on its shapes, and says nothing of the engines. Returns the target
    bound (its tensors hashed once: _merge_lora binds no second time), or None where unchecked."""
    from specrt.export.binding import bind_target

    want = exp.get("binding_receipt", {}).get("target", {}).get("slots")
    if not want or not any(folder.glob("*.safetensors")):
        return None  # (an export without a receipt, or from pickles, which only transformers loads here: unchecked)
    try:
        bound = bind_target(folder)
        have = bound.table()
    except UserError as e:
        raise UserError(f"{folder}: not the checkpoint these engines were exported from ({e})") from None
    changed = sorted(s for s in set(want) & set(have) if want[s].get("sha256") != have[s].get("sha256"))
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))  # (another family's slots)
    if changed or missing or extra:
        how = [f"{len(changed)} of the {len(want)} target slots hold other tensors than the export's binding receipt "
               f"records" + (f" (first: '{changed[0]}')" if changed else "")]
        how += [f"{len(missing)} of them are missing (first: '{missing[0]}')"] if missing else []
        how += [f"{len(extra)} slots are not the export's (first: '{extra[0]}')"] if extra else []
        raise UserError(f"{folder}: not the checkpoint these engines were exported from: {'; '.join(how)}; pass the "
                        "exported target with --target")
    return bound


def load_torch_target(folder: Path, exp: dict[str, Any]):
    """The target checkpoint in transformers: eager attention, fp32, eval mode."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise UserError("--reference torch needs torch and transformers (pip install 'specrt[export]')") from None
    folder = Path(folder)
    if not folder.is_dir():  # (it was said as "no config.json")
        raise UserError(f"{folder}: no such folder (the target folder recorded in the export's binding receipt, moved "
                        "or removed since? --target DIR gives the checkpoint)")
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder}: no config.json, not a transformers checkpoint (the torch reference loads the "
                        "target folder recorded in the export's binding receipt; --target DIR overrides it)")
    bound = check_same_target(folder, exp)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()
    if int(model.config.num_hidden_layers) != int(exp["target"]["num_layers"]):
        raise UserError(f"{folder}: {model.config.num_hidden_layers} layers, but the export has "
                        f"{exp['target']['num_layers']}: not the checkpoint these engines were exported from")
    _merge_lora(model, folder, exp, bound)
    return model


def _merge_lora(model, folder: Path, exp: dict[str, Any], target=None) -> None:
    """The LoRA adapter the export merged (its binding receipt's target.lora) merged into the
    torch reference too, as export merged it (lora.py; W + scale * B @ A): without it the
    reference was the base model, and every comparison of a fine-tuned export failed.
    ``target``: ``folder`` bound already (check_same_target's), else bound here."""
    want = exp.get("binding_receipt", {}).get("target", {}).get("lora")
    if not want:
        return
    import torch

    from specrt.export.binding import bind_target
    from specrt.export.lora import ADAPTER_PICKLE, bind_lora

    # (pickles as the export read them: the target's, which transformers has just loaded, and the
    # adapter's adapter_model.bin the receipt names, read at export with --allow-lora-pickle; both
    # torch.load weights_only. compare has neither flag: it told the user to pass one, r77i)
    pickled = ADAPTER_PICKLE in [*(m["lora_A"]["file"] for m in want["modules"].values()),
                                 *(t["file"] for t in want.get("modules_to_save", {}).values()),
                                 *(t["file"] for t in want.get("trainable_tokens", {}).values())]
    try:
        target = target if target is not None else bind_target(folder, allow_pickle=True)
        lora = bind_lora(Path(want["folder"]), target, allow_pickle=pickled)
    except UserError as e:
        raise UserError(f"{want['folder']}: the LoRA adapter the export merged cannot be merged into the torch "
                        f"reference ({e})") from None
    if lora.to_json() != want:
        raise UserError(f"{want['folder']}: not the LoRA adapter the export merged (it differs from the binding "
                        "receipt's target.lora: changed since the export?)")
    params = dict(model.named_parameters())
    # each merged slot's delta added, modules_to_save's copies taken, trainable tokens' rows replaced (None; a tied
    # head follows its embeddings')
    with torch.no_grad():
        for slot, replaces in [*((s, False) for s in lora.modules), *((s, True) for s in lora.replaced),
                               *((s, None) for s in lora.tokens)]:
            name = target.slots[slot].entry.name
            if name not in params:
                raise UserError(f"{folder}: transformers names no parameter '{name}' (the slot {slot} the adapter "
                                f"{'replaces' if replaces else 'changes'}), so the torch reference cannot merge it")
            if replaces is None:
                ids, rows = lora.token_rows(slot)
                params[name][ids] = torch.from_numpy(rows).to(params[name].dtype)
            elif replaces:
                params[name].copy_(torch.from_numpy(lora.replacement(slot)))
            else:
                params[name].add_(torch.from_numpy(lora.delta(slot)))
    lora.reader.close()
    target.reader.close()


# ---- inputs -----------------------------------------------------------------------------


def token_ids(export_dir: Path, vocab: int, n: int, seed: int = 0) -> tuple[np.ndarray, str]:
    """``n`` real token ids: the exported tokenizer on SAMPLE_TEXT (repeated if short), else a
    fixed pseudo-random sequence in [0, vocab)."""
    tok = Path(export_dir) / "tokenizer.json"
    if tok.is_file():
        from tokenizers import Tokenizer

        ids = [i for i in Tokenizer.from_file(str(tok)).encode(SAMPLE_TEXT).ids if 0 <= i < vocab]
        if ids:
            return np.resize(np.asarray(ids, np.int64), n), "tokenizer.json on a fixed English text"
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, n, dtype=np.int64), f"pseudo-random ids in [0, {vocab}) (seed {seed})"


class RoleInputs:
    """Feeds for every role from one prompt of ``n`` tokens (then its continuation).

    prefill    [ids[:n] at 0.. over no past], [ids[h:n] at h.. over the prefill KV [:h]]  (h = n/2)
    decode     [ids[n] at n over the prefill KV]
    verify.d   [ids[n:n+d+1] at n.. over the prefill KV]
    draft      P-EAGLE: the first pass after prefill (A = n real slots + K-1 mask slots, no past),
               then a later round (A = 2 over the draft's own KV of the first n-2 slots);
               EAGLE-3: A = n slots, then one step on its own token and hidden_out (A = 0, B = 1).
    """

    def __init__(self, engines: EngineSet, n: int, seed: int = 0):
        self.e, self.exp, self.n = engines, engines.export, int(n)
        t = self.exp["target"]
        self.dtype = np_dtype(self.exp["dtype"])
        k = max(engines.depths) + 1
        self.ids, self.source = token_ids(engines.export_dir, int(t["vocab_size"]), self.n + k + 1, seed)
        out = self._run(PREFILL, self._target_feeds(self.ids[: self.n], 0, None))
        self.kv = {n: v for n, v in out.items() if n.startswith(C.NEW_KV_PREFIXES)}
        self.aux = out[C.AUX_HIDDEN]  # [1, n, 3H]

    def _run(self, role: str, feeds: dict) -> dict[str, np.ndarray]:
        return {k: np.array(v, copy=True) for k, v in self.e.portable(role).infer(feeds).items()}

    def _past(self, part: str, kv: dict | None, rows: int) -> dict[str, np.ndarray]:
        g = self.exp[part]
        shape = (1, 0, int(g["num_kv_heads"]), int(g["head_dim"]))
        feeds = {}
        for i in range(int(g["num_layers"])):
            for past, new in ((C.past_key(i), C.new_key(i)), (C.past_value(i), C.new_value(i))):
                feeds[past] = np.ascontiguousarray(kv[new][:, :rows]) if kv else np.zeros(shape, self.dtype)
        return feeds

    def _target_feeds(self, ids, start: int, kv: dict | None) -> dict[str, np.ndarray]:
        return {C.INPUT_IDS: np.asarray(ids, np.int64)[None],
                C.POSITION_IDS: np.arange(start, start + len(ids), dtype=np.int64)[None],
                **self._past("target", kv, start)}

    def feeds(self, role: str) -> list[dict[str, np.ndarray]]:
        n, ids = self.n, self.ids
        if role == PREFILL:
            h = n // 2
            return [self._target_feeds(ids[:n], 0, None), self._target_feeds(ids[h:n], h, self.kv)]
        d = role_depth(role)
        if d is not None:
            return [self._target_feeds(ids[n : n + d + 1], n, self.kv)]
        if role == DRAFT:
            return self._peagle() if self.exp["draft"]["kind"] == "peagle" else self._eagle3()
        raise UserError(f"no inputs for engine role '{role}'")

    def _draft_feeds(self, tokens, start: int, aux, kv: dict | None, prev=None) -> dict[str, np.ndarray]:
        f = {C.INPUT_IDS: np.asarray(tokens, np.int64)[None],
             C.POSITION_IDS: np.arange(start, start + len(tokens), dtype=np.int64)[None],
             C.DRAFT_AUX_IN: np.ascontiguousarray(aux, dtype=self.dtype)}
        if prev is not None:
            f[C.DRAFT_PREV_HIDDEN] = np.ascontiguousarray(prev, dtype=self.dtype)
        return {**f, **self._past("draft", kv, start)}

    def _peagle(self) -> list[dict[str, np.ndarray]]:
        # real slot t carries token x[t+1] and the target's aux h_t (runtime/generate.py)
        n, x, masks = self.n, self.ids, [int(self.exp["draft"]["mask_token_id"])] * (max(self.e.depths) - 1)
        first = self._draft_feeds([*x[1 : n + 1], *masks], 0, self.aux, None)
        a = 2
        earlier = self._run(DRAFT, self._draft_feeds([*x[1 : n - a + 1], *masks], 0, self.aux[:, : n - a], None))
        later = self._draft_feeds([*x[n - a + 1 : n + 1], *masks], n - a, self.aux[:, n - a : n], earlier)
        return [first, later]

    def _eagle3(self) -> list[dict[str, np.ndarray]]:
        n, x, hidden = self.n, self.ids, int(self.exp["draft"]["hidden_size"])
        first = self._draft_feeds(x[1 : n + 1], 0, self.aux, None, np.zeros((1, 0, hidden), self.dtype))
        out = self._run(DRAFT, first)
        step = self._draft_feeds(out[C.DRAFT_TOKENS][0, -1:], n, np.zeros((1, 0, self.aux.shape[-1]), self.dtype),
                                 out, out[C.DRAFT_HIDDEN_OUT][:, -1:])
        return [first, step]


# ---- comparison -------------------------------------------------------------------------


class TokenMatch:
    """The verdict on ``draft_token_ids`` of one iteration (truthy when it passes)."""

    def __init__(self, rows: int, agree: int, ties: int):
        self.rows, self.agree, self.ties = rows, agree, ties

    def __bool__(self) -> bool:
        return self.agree + self.ties == self.rows


class TokenCompare:
    """compare_func for ``draft_token_ids``: exact, except at rows where a near-tie in the draft
    logits explains the difference: the two sides' argmaxes differ, their logits agree within
    (atol, rtol) elementwise, and the reference's logits at the two argmaxes are within
    atol + rtol * |max| of each other."""

    def __init__(self, tol: tuple[float, float]):
        self.atol, self.rtol = tol

    def __call__(self, r0, r1) -> OrderedDict:
        if C.DRAFT_TOKENS not in r0 or C.DRAFT_TOKENS not in r1:  # (no match: the role's tokens row fails)
            return OrderedDict()
        a, b = np.asarray(r0[C.DRAFT_TOKENS]).reshape(-1), np.asarray(r1[C.DRAFT_TOKENS]).reshape(-1)
        if a.shape != b.shape:
            return OrderedDict([(C.DRAFT_TOKENS, TokenMatch(max(len(a), len(b)), 0, 0))])
        if C.DRAFT_LOGITS not in r0 or C.DRAFT_LOGITS not in r1:  # no logits to tell a tie by: exact only
            return OrderedDict([(C.DRAFT_TOKENS, TokenMatch(len(a), int((a == b).sum()), 0))])
        la = np.asarray(r0[C.DRAFT_LOGITS], np.float64).reshape(len(a), -1)
        lb = np.asarray(r1[C.DRAFT_LOGITS], np.float64).reshape(len(b), -1)
        ties = 0
        for row in np.flatnonzero(a != b):
            ia, ib = int(la[row].argmax()), int(lb[row].argmax())
            close = np.all(np.abs(la[row] - lb[row]) <= self.atol + self.rtol * np.abs(lb[row]))
            gap = abs(lb[row, ib] - lb[row, ia])
            # same argmax but other ids: the id output itself is wrong (e.g. the d2t map), no tie
            ties += bool(ia != ib and close and gap <= self.atol + self.rtol * abs(lb[row, ib]))
        return OrderedDict([(C.DRAFT_TOKENS, TokenMatch(len(a), int((a == b).sum()), ties))])


def tolerance_ratio(a, b, atol: float, rtol: float) -> float:
    """max over elements of min(|a-b| / atol, |a-b| / (rtol |b|)): the elemwise check passes
    iff this is <= 1, and it says how close to failing the worst element is."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.abs(a - b)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.minimum(d / atol, d / (rtol * np.abs(b)))
    r[d == 0] = 0.0
    r[np.isnan(r)] = np.inf
    return float(r.max()) if r.size else 0.0


def shared_nonfinite(a, b) -> np.ndarray:
    """Where ``a`` and ``b`` (float arrays of one shape) hold the same non-finite value: both
    NaN, both +inf or both -inf. A model whose weights overflow gives them in its reference
    too, which is no difference between the two (inf - inf is NaN: each such element failed,
    and compare named the engines where the model itself overflowed)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.kind != "f" or b.dtype.kind != "f":
        return np.zeros(np.shape(a), bool)
    return (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))


def _set_aside_nonfinite(results, engine: str, reference: str, names) -> tuple[Any, dict[str, int]]:
    """``results`` with the elements where both runners hold the same non-finite value
    (``shared_nonfinite``) made 0 on both sides, and how many there were per output name
    (those with any). Elements non-finite on one side only stay, and fail."""
    from polygraphy.comparator.struct import IterationResult, RunResults

    counts: dict[str, int] = {}
    masks = []
    for i0, i1 in zip(results[engine], results[reference]):
        m = {n: shared_nonfinite(i0[n], i1[n]) for n in names if n in i0 and n in i1}
        m = {n: x for n, x in m.items() if x.any()}
        for n, x in m.items():
            counts[n] = counts.get(n, 0) + int(x.sum())
        masks.append(m)
    if not counts:
        return results, counts
    out = []
    for runner, iters in results.items():
        kept = [IterationResult(outputs={k: (np.where(ms[k], 0.0, v).astype(np.asarray(v).dtype) if k in ms else v)
                                         for k, v in it.items()}, runtime=it.runtime, runner_name=it.runner_name)
                for it, ms in zip(iters, masks)]
        out.append((runner, kept))
    return RunResults(out), counts


def _simple_compare(tol: dict[str, tuple[float, float]]):
    from polygraphy import comparator

    atol = {n: v[0] for n, v in tol.items()}
    rtol = {n: v[1] for n, v in tol.items()}
    # token ids are TokenCompare's; everything else is compared by name
    find = lambda name, index, other: [] if name == C.DRAFT_TOKENS else [name]  # noqa: E731
    make = getattr(comparator, "SimpleCompareFunc", None)  # polygraphy >= 0.53 deprecates CompareFunc.simple
    if make is None:  # pragma: no cover - older polygraphy
        make = comparator.CompareFunc.simple
    return make(atol=atol, rtol=rtol, check_error_stat="elemwise", find_output_func=find)


def user_covers(over, name: str) -> bool:
    """Whether a user's --atol / --rtol (None, a float, or a dict of names, kinds and "")
    sets ``name``'s tolerance."""
    if over is None:
        return False
    if not isinstance(over, Mapping):
        return True
    return any(k in over for k in (name, kind_of(name), ""))


def row_scale(ref) -> np.ndarray:
    """Each row's scale along the last axis, at least 1: 1.4826 x the median |value| (the
    standard deviation of a normal row, robust to the few huge values of real hidden states,
    one past 22,000 in a row of SmolLM2's, which an RMS would let loosen the whole row)."""
    a = np.abs(np.asarray(ref, np.float64))
    return np.maximum(1.0, 1.4826 * np.median(a, axis=-1, keepdims=True))


def scale_rows(results, reference: str, names: Mapping[str, bool]):
    """``results`` with each named output of both runners divided, row by row along its last
    axis, by the reference row's scale (``row_scale``): an atol on them is an atol of that
    many units of the row's own spread. fp32 rounding grows with the values a row holds
    (SmolLM2's prefill at 400 tokens: logits rows of RMS ~7 and hidden-state rows of 13-15
    differ by 1.2e-4 / 4e-4 from the reference in their small elements), which one absolute
    atol cannot follow."""
    from polygraphy.comparator.struct import IterationResult, RunResults

    scales = [{n: row_scale(it[n]) for n in names if n in it} for it in results[reference]]
    out = []
    for runner, iters in results.items():
        scaled = []
        for it, sc in zip(iters, scales):
            outs = {k: (np.asarray(v, np.float64) / sc[k] if k in sc else v) for k, v in it.items()}
            scaled.append(IterationResult(outputs=outs, runtime=it.runtime, runner_name=it.runner_name))
        out.append((runner, scaled))
    return RunResults(out)


def compare_role(role: str, engine, reference, feeds: list[dict], tol: dict[str, tuple[float, float]],
                 outputs: list[str], row_std_atol: Mapping[str, float] | None = None,
                 keep: list | None = None, row_scaled: Mapping[str, bool] | None = None) -> dict[str, Any]:
    """Run both runners on ``feeds`` and compare every output; returns the role's report.
    ``row_std_atol``: output name or kind -> multiple m; that output's atol becomes at least m x the
    reference's largest standard deviation along its last axis over the iterations (the
    report gives the atol used and that std). ``row_scaled``: output names compared in units
    of each reference row's scale (``scale_rows``; the report says so)."""
    from polygraphy.comparator import Comparator

    if engine.name == reference.name:
        raise InternalError(f"runner names must differ (results are looked up by name): {engine.name}")
    t0 = time.perf_counter()
    results = Comparator.run([engine, reference], data_loader=feeds)
    if keep is not None:  # the engine's own results, for the by-hand command (compare_engines)
        from polygraphy.comparator import RunResults

        keep.append(RunResults([(engine.name, results[engine.name])]))
    # before the tolerances read the reference's spread (an inf there made a row-std atol inf)
    results, nonfinite = _set_aside_nonfinite(results, engine.name, reference.name, tol)
    tol = dict(tol)
    by = row_std_atol or {}
    row_std: dict[str, float] = {}
    multiple: dict[str, float] = {}
    for name in tol:
        m = by.get(name, by.get(kind_of(name)))
        if m is not None:
            multiple[name] = m
            row_std[name] = max(float(np.asarray(it[name], dtype=np.float64).std(-1).max())
                                for it in results[reference.name])
            tol[name] = (max(tol[name][0], m * row_std[name]), tol[name][1])
    token_tol = tol.get(C.DRAFT_LOGITS, (0.0, 0.0))
    scaled = [n for n in (row_scaled or {}) if n in tol]
    widest = {n: max(float(row_scale(it[n]).max()) for it in results[reference.name]) for n in scaled}
    if scaled:
        results = scale_rows(results, reference.name, dict.fromkeys(scaled, True))
    acc = Comparator.compare_accuracy(results, compare_func=[_simple_compare(tol), TokenCompare(token_tol)])
    pair = (engine.name, reference.name)
    per_iter_simple, per_iter_tokens = acc[0][pair], acc[1][pair]
    out: dict[str, Any] = {}
    for name in outputs:
        if name == C.DRAFT_TOKENS:
            ms = [it[name] for it in per_iter_tokens if name in it]
            rows, agree, ties = (sum(getattr(m, f) for m in ms) for f in ("rows", "agree", "ties"))
            out[name] = {"kind": "tokens", "rows": rows, "agree": agree, "ties": ties,
                         "agreement": agree / rows if rows else None, "passed": bool(ms) and all(ms)}
            continue
        rs = [it.get(name) for it in per_iter_simple]
        if any(r is None for r in rs):
            out[name] = {"passed": False, "error": "missing from the engine's or the reference's outputs"}
            continue
        if any(isinstance(r, bool) for r in rs):  # polygraphy returns a bare False on a shape mismatch
            out[name] = {"passed": False, "error": "shapes differ"}
            continue
        ratio = max(tolerance_ratio(i0[name], i1[name], *tol[name])
                    for i0, i1 in zip(results[engine.name], results[reference.name]))
        out[name] = {"max_abs": max(r.max_absdiff for r in rs), "max_rel": max(r.max_reldiff for r in rs),
                     "mean_abs": max(r.mean_absdiff for r in rs), "atol": tol[name][0], "rtol": tol[name][1],
                     "tol_ratio": ratio, "passed": all(bool(r) for r in rs)}
        if name in row_std:
            out[name].update(atol_row_std=multiple[name], reference_row_std=row_std[name])
        if name in nonfinite:  # (the same NaN / inf in both: not compared)
            out[name]["shared_nonfinite"] = nonfinite[name]
        if name in scaled:  # (max_abs etc. of the scaled values; the atol in the outputs' own units,
            # for the widest row: polygraphy's one absolute atol, the by-hand command's, is that)
            out[name].update(in_units_of_row_scale=True, atol_widest_row=tol[name][0] * widest[name])
    info = {}
    for key in (C.LOGITS, C.DRAFT_LOGITS):  # greedy agreement: informational, not a verdict
        eng, ref = results[engine.name], results[reference.name]
        # (only where both gave it every iteration: one missing is that output's failed row above,
        # it was a KeyError traceback here)
        if key in outputs and all(key in i0 and key in i1 for i0, i1 in zip(eng, ref)):
            same = [np.asarray(i0[key]).argmax(-1) == np.asarray(i1[key]).argmax(-1) for i0, i1 in zip(eng, ref)]
            info[f"{key}_argmax_agreement"] = float(np.mean(np.concatenate([s.reshape(-1) for s in same])))
    shapes = [{k: list(v.shape) for k, v in f.items() if k in (C.INPUT_IDS, C.past_key(0), C.DRAFT_AUX_IN)}
              for f in feeds]
    return {"iterations": len(feeds), "input_shapes": shapes, "outputs": out, **info,
            "passed": all(o["passed"] for o in out.values()), "seconds": round(time.perf_counter() - t0, 3)}


# ---- report -----------------------------------------------------------------------------


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2e}"


LAST_ROW = "logits[logits_from=S-1]"  # the prefill's last row only, as the runtime asks for it
SCREENED = "screened argmax"  # target roles of a screened head: the greedy path's tokens vs the reference's argmax
TREE = "token tree vs its chains"  # verify roles of tree-verifying engines: one call against each chain
ENGINE_CALL = "the engine's call"  # a role whose engine failed a call (EngineFailure): no output compared


def _against(got: np.ndarray, want: np.ndarray, atol: float, rtol: float, scaled: bool) -> dict[str, Any]:
    """``got`` against ``want`` element by element (in units of ``want``'s row scale when
    ``scaled``, as ``scale_rows`` compares): max_abs, max_rel, mean_abs, tol_ratio, finite."""
    same = shared_nonfinite(got, want)  # (set aside, as compare_role sets them aside)
    if same.any():
        got, want = np.where(same, 0.0, got), np.where(same, 0.0, want)
    if scaled:
        s = row_scale(want)
        got, want = got / s, want / s
    d = np.abs(got - want)
    return {"max_abs": float(d.max()), "max_rel": float((d / np.maximum(np.abs(want), 1e-30)).max()),
            "mean_abs": float(d.mean()), "tol_ratio": tolerance_ratio(got, want, atol, rtol),
            "finite": bool(np.isfinite(got).all()), "shared_nonfinite": int(same.sum())}


def last_row_check(engine, reference, feeds: dict, tol: tuple[float, float], scaled: bool = False) -> dict[str, Any]:
    """The engine's logits with ``logits_from`` = S - 1 (one row) against the reference's last
    row of the same call, elementwise within ``tol`` (the logits' atol, rtol); ``scaled``: in
    units of the row's scale, as the logits output itself (``scale_rows``)."""
    s = feeds[C.INPUT_IDS].shape[1]
    # the view's own contract has no logits_from: its call passes it on to the in-place engine,
    # whose runner checks it against its inputs
    got = np.asarray(engine.infer_impl({**feeds, C.LOGITS_FROM: np.array(s - 1, np.int64)})[C.LOGITS], np.float64)
    with reference as ref:
        want = np.asarray(ref.infer(feeds)[C.LOGITS], np.float64)[:, -1:]
    if got.shape != want.shape:
        return {"passed": False, "error": f"shape {list(got.shape)}, expected {list(want.shape)}"}
    st = _against(got, want, *tol, scaled)
    return {"max_abs": st["max_abs"], "max_rel": st["max_rel"], "mean_abs": st["mean_abs"], "atol": tol[0],
            "rtol": tol[1], "tol_ratio": st["tol_ratio"], "passed": st["finite"] and st["tol_ratio"] <= 1.0,
            **({"in_units_of_row_scale": True} if scaled else {}),
            **({"shared_nonfinite": st["shared_nonfinite"]} if st["shared_nonfinite"] else {})}


def tree_check(engine, reference, feeds: dict, tol: dict[str, tuple[float, float]], scaled=()) -> dict[str, Any]:
    """A token tree (contracts.py "Token trees"; what `auto`'s dspark:tree=3 verifies every
    round) in one engine call: the chain x, a1 .. ad and two siblings of a1 at a1's position,
    over the role's S = d + 3 rows. Each row's logits, hidden states and K/V must be what the
    reference gives for its own chain (x a1 .. ad; x s1; x s2) over the same past, within the
    outputs' tolerances (``scaled``: in units of the row's spread, as those outputs are)."""
    ids, pos = np.asarray(feeds[C.INPUT_IDS])[0], np.asarray(feeds[C.POSITION_IDS])[0]
    d = len(ids) - 3
    tree_pos = np.concatenate([pos[:d + 1], pos[1:2], pos[1:2]])
    got = {k: np.asarray(v, np.float64).copy()
           for k, v in engine.infer_impl({**feeds, C.POSITION_IDS: tree_pos[None]}).items()}
    chains = [(list(range(d + 1)), list(range(d + 1)))] + [([0, d + 1 + k], [0, 1]) for k in range(2)]
    worst, worst_name, max_abs, max_rel, passed, nonfinite = 0.0, None, 0.0, 0.0, True, 0
    with reference as ref:
        for rows, at in chains:
            # each chain is shorter than the role's rows: a reference whose metadata are the
            # role's fixed shapes (transformers') would refuse it
            want = ref.infer({**feeds, C.INPUT_IDS: ids[rows][None], C.POSITION_IDS: pos[at][None]},
                             check_inputs=False)
            for name, (atol, rtol) in tol.items():
                if name not in want or name not in got:
                    continue
                st = _against(got[name][:, rows], np.asarray(want[name], np.float64), atol, rtol, name in scaled)
                max_abs, max_rel = max(max_abs, st["max_abs"]), max(max_rel, st["max_rel"])
                passed = passed and st["finite"] and st["tol_ratio"] <= 1.0
                nonfinite += st["shared_nonfinite"]
                if st["tol_ratio"] >= worst:
                    worst, worst_name = st["tol_ratio"], name
    atol, rtol = tol.get(worst_name, (0.0, 0.0))
    return {"max_abs": max_abs, "max_rel": max_rel, "atol": atol, "rtol": rtol, "tol_ratio": worst,
            "worst_output": worst_name, "passed": passed, "rows": len(ids), "drafts": d, "siblings": 2,
            **({"shared_nonfinite": nonfinite} if nonfinite else {})}


TARGET_WEIGHTS = "target_weights"  # the first target role's: the engine's target weights against the export's
DRAFT_WEIGHTS = "draft_weights"  # the float draft's, where the build rewrote its graph (weights in a file of their own)
WEIGHT_CHECKS = {"target": TARGET_WEIGHTS, "draft": DRAFT_WEIGHTS}  # graph -> its check (check_target_weights)


def check_target_weights(export_graph: Path, engine_graph: Path, kind: str = TARGET_WEIGHTS) -> dict[str, Any]:
    """Every weight of the target engine's graph against the export's, exactly: by its name,
    or, where the build re-lowered the graph (in-place KV), as export.onnx_ops.fusing_get makes
    it (``<slot>.T`` transposed, ``layers.{i}.qkv`` concatenated), cast to the engine's dtype;
    and every export weight read by one of them. The outputs' tolerances let a small change to
    one weight pass or name only the outputs it moved: this names the weight (issue 8: a
    corrupted engine "caught and named"). Graph constants (``const_N``, numbered per graph) are
    not weights and not checked. The float draft's engine graph, the export's with its weights
    moved to a file of their own, is checked the same way (``kind`` DRAFT_WEIGHTS). Returns
    {"kind": kind, "weights", "bad": [{"weight", "problem"}], "engine_only" (initializers no
    export weight makes), "passed"}."""
    import re

    from specrt.engines.base import initializer_reader
    from specrt.export.onnx_ops import fusing_get

    const = re.compile(r"const_\d+")
    # one tensor in memory at a time (both graphs whole beside the loaded sessions: ~3x the weights)
    xinits, xread = initializer_reader(export_graph)
    enames, eread = initializer_reader(engine_graph)
    xweights = {n for n in xinits if not const.fullmatch(n)}
    read: set[str] = set()

    def get(slot: str) -> np.ndarray:
        if slot not in xweights:
            raise KeyError(slot)
        read.add(slot)
        return xread(slot)

    make = fusing_get(get)
    bad: list[dict[str, Any]] = []
    engine_only: list[str] = []
    checked = 0
    for name in enames:
        if const.fullmatch(name):
            continue
        try:
            want = np.asarray(make(name))
        except KeyError:
            engine_only.append(name)
            continue
        have = eread(name)
        checked += 1
        if have.shape != want.shape:
            bad.append({"weight": name, "problem": f"shape {list(have.shape)}, the export's makes {list(want.shape)}"})
            continue
        want = want.astype(have.dtype, copy=False)
        if not np.array_equal(have, want):
            i = int(np.flatnonzero(have.reshape(-1) != want.reshape(-1))[0])
            bad.append({"weight": name, "problem": f"element {i} is {_num(have.reshape(-1)[i])}, the export's "
                                                   f"{_num(want.reshape(-1)[i])} ({export_graph.name})"})
        del have, want
    for name in sorted(xweights - read):
        bad.append({"weight": name, "problem": f"the export's weight is in no weight of {engine_graph.name}"})
    return {"kind": kind, "weights": checked, "bad": bad, "engine_only": engine_only, "passed": not bad}


def _num(x) -> str:
    """A weight element as its value (not numpy's repr, np.float32(...))."""
    dt = np.asarray(x).dtype  # (bfloat16, ml_dtypes', is no np.floating: "float" in its name)
    return f"{float(x):.9g}" if dt.kind == "f" or "float" in dt.name else str(int(x))


CHECKS = (LAST_ROW, SCREENED, TREE, INT8_WEIGHTS, TARGET_WEIGHTS, DRAFT_WEIGHTS)  # a role's checks beside its outputs


def what_failed(fails: list[dict[str, Any]], reference: str) -> str:
    """The verdict of ``failures``, said once: "the engines differ from the onnxruntime
    reference in N output(s) and M check(s)" (outputs beyond tolerance, and the checks beside
    them, CHECKS, which a count of "outputs" miscounted), "engine 'verify.3' failed its call"
    (ENGINE_CALL: nothing of that role's compared, so no output of its "differs"), or both
    joined by "; "."""
    calls = [f"'{f['role']}'" for f in fails if f["output"] == ENGINE_CALL]
    compared = [f for f in fails if f["output"] != ENGINE_CALL]
    checks = sum(f["output"] in CHECKS for f in compared)
    differ = " and ".join(f"{n} {what}" for n, what in ((len(compared) - checks, "output(s)"), (checks, "check(s)"))
                          if n)
    said = [f"the engines differ from the {reference} reference in {differ}"] if differ else []
    if calls:
        said.append(f"engine {calls[0]} failed its call" if len(calls) == 1 else
                    f"engines {', '.join(calls)} failed their calls")
    return "; ".join(said)


def _add_check(role_out: dict[str, Any], name: str, result: dict[str, Any]) -> None:
    """One more check of a role (the int8 weights, the last row, the screened argmax, a token
    tree): its report entry, and the role passes only if it does."""
    role_out["outputs"][name] = result
    role_out["passed"] = role_out["passed"] and result["passed"]


ENGINES_RECORD = "compared.json"  # in each temporary folder: {"engines": the engines folder its runs compared}


def _own_temp_folder(key: str, engines_folder: Path | None = None) -> Path:
    """``specrt-compare-<uid>-<key>`` in the temporary directory, made 0700 by this user, or
    reused only when it is a real folder (not a link) this user owns that no one else can
    write; else a fresh mkdtemp folder. The name is predictable: another user could plant a
    link or a folder of theirs there and read or swap the by-hand command's inputs and outputs.
    With ``engines_folder``, the folder records it, and this user's folders recording an
    engines folder that is gone are removed (one a compared engines folder: they piled up)."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    p = _private_folder(Path(tempfile.gettempdir()) / f"specrt-compare-{0 if uid is None else uid}-{key}", uid)
    if engines_folder is not None:
        try:
            if _recorded_engines(p) != str(engines_folder):
                write_atomic(p / ENGINES_RECORD, {"engines": str(engines_folder)})
            _remove_orphans(p, uid)
        except (OSError, UserError):  # (the by-hand files matter more than the tidying; write_atomic
            pass  # says an OSError as a UserError)
    return p


def _recorded_engines(folder: Path) -> str | None:
    """The engines folder a temporary folder's record names (a plain file), or None."""
    import json
    import stat

    f = folder / ENGINES_RECORD
    try:
        if not stat.S_ISREG(os.lstat(f).st_mode):
            return None
        rec = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # (UnicodeDecodeError is a ValueError)
        return None
    return rec.get("engines") if isinstance(rec, dict) and isinstance(rec.get("engines"), str) else None


def _remove_orphans(keep: Path, uid: int | None) -> None:
    """Removes this user's other ``specrt-compare-<uid>-*`` folders (real folders of theirs,
    not links) whose recorded engines folder holds no engines.json any more; those without a
    record are left."""
    import shutil
    import stat

    for q in keep.parent.glob(f"specrt-compare-{0 if uid is None else uid}-*"):
        try:
            st = os.lstat(q)
        except OSError:
            continue
        if q == keep or not stat.S_ISDIR(st.st_mode) or (uid is not None and st.st_uid != uid):
            continue
        rec = _recorded_engines(q)
        if rec and not (Path(rec) / "engines.json").exists():
            shutil.rmtree(q, ignore_errors=True)


def _private_folder(p: Path, uid: int | None) -> Path:
    """``p`` made 0700 by this user, or ``p`` if it is this user's real folder that no one
    else can write; else a fresh mkdtemp folder (_own_temp_folder)."""
    import stat

    try:
        os.mkdir(p, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return Path(tempfile.mkdtemp(prefix="specrt-compare-"))
    st = os.lstat(p)
    # uid None: Windows (no getuid), where every folder reads 0o777 and no owner: a fresh folder each
    # run piled up in %TEMP%, which is the user's own there
    if not stat.S_ISDIR(st.st_mode) or uid is not None and (st.st_uid != uid or st.st_mode & 0o022):
        return Path(tempfile.mkdtemp(prefix="specrt-compare-"))
    return p


KEEP_RUNS = 4  # by-hand file pairs kept in a temporary folder (3.6 MB a pair on SmolLM2)


def _own_inputs_file(folder: Path) -> Path:
    """A new ``inputs.<random>.json`` in ``folder`` for this run alone (mkstemp: no two runs get
    one name), its outputs beside it (``outputs_file_for``). The pairs of earlier runs past the
    newest ``KEEP_RUNS - 1`` are removed, oldest first: a run's own names would pile up."""
    pairs = []
    for f in folder.glob("inputs.*.json"):
        try:
            if not f.name.endswith(".outputs.json"):
                pairs.append((f.stat().st_mtime, f))
        except FileNotFoundError:  # removed by another run meanwhile
            pass
    for _, f in sorted(pairs)[: max(0, len(pairs) - (KEEP_RUNS - 1))]:
        outputs_file_for(f).unlink(missing_ok=True)
        f.unlink(missing_ok=True)
    fd, name = tempfile.mkstemp(prefix="inputs.", suffix=".json", dir=folder)
    os.close(fd)
    return Path(name)


def screen_check(view, screen, reference, feeds: list[dict], tol: tuple[float, float],
                 scaled: bool = False) -> dict[str, Any]:
    """The greedy path of a screened head (``head_exact`` false: int8 logits, the screen of
    specrt/head.py rescoring its candidates from the fp32 rows) on ``feeds``, against the
    argmax of the reference's logits: exact, or a near-tie where the reference's logits at
    the two tokens are within ``tol`` (atol + rtol x |top|) of each other. The rest of the
    role's comparison runs the fp32 branch, which sampling and the prefill take. ``scaled``:
    atol is in units of each reference row's scale (``row_scale``), as the logits' check."""
    rows = agree = ties = 0
    screen_rows, screen_cands = screen.rows, screen.candidates
    with reference as ref:
        for f in feeds:
            view.screened = True
            try:
                out = view.infer_impl(f)
            finally:
                view.screened = False
            got = screen.argmax(out[C.LOGITS][0], out[C.HEAD_HIDDEN][0], out[C.HEAD_NORMS][0])
            want = np.asarray(ref.infer(f, check_inputs=False)[C.LOGITS], np.float64)[0]
            top = want.argmax(-1)
            unit = row_scale(want).reshape(-1) if scaled else np.ones(len(want))
            for i, (g, w) in enumerate(zip(got.tolist(), top.tolist())):
                rows += 1
                if g == w:
                    agree += 1
                else:
                    ties += bool(want[i, w] - want[i, g] <= tol[0] * unit[i] + tol[1] * abs(want[i, w]))
    return {"kind": "tokens", "rows": rows, "agree": agree, "ties": ties,
            "agreement": agree / rows if rows else None, "passed": rows > 0 and agree + ties == rows,
            "candidates_per_row": (screen.candidates - screen_cands) / max(1, screen.rows - screen_rows)}


def role_table(role: str, r: dict[str, Any]) -> list[str]:
    """Rows of one role; the per-layer KV outputs fold into one row per kind (worst layer)."""
    d = role_depth(role)
    title = f"{role}" + (f" (depth {d})" if d else "") + f": {r['iterations']} iteration(s), {r['seconds']:.2f} s"
    if f"{C.LOGITS}_argmax_agreement" in r:
        title += f", argmax agreement {r[f'{C.LOGITS}_argmax_agreement']:.0%}"
    # worst/tol: the worst element's error over its tolerance (the elemwise check passes iff <= 1)
    lines = [title, f"  {'output':26s} {'max abs':>9s} {'max rel':>9s} {'atol':>9s} {'rtol':>9s} {'worst/tol':>9s}"
                    "  result"]
    groups: dict[str, list[str]] = {}
    for name in r["outputs"]:
        groups.setdefault(kind_of(name) if name.startswith(C.NEW_KV_PREFIXES) else name, []).append(name)
    for label, names in groups.items():
        rows = [r["outputs"][n] for n in names]
        verdict = "pass" if all(x["passed"] for x in rows) else "FAIL"
        if rows[0].get("kind") == "weights":
            x = rows[0]
            note = (f"{x['matmuls']} {x.get('op', 'MatMulNBits')}, {x['blocks']} {x.get('unit', 'blocks')}: worst "
                    f"{x['max_error_steps']:.3g} step off ({x['max_clipped_error_steps']:.3g} where clipped), steps "
                    f"off by {x['max_step_error']:.1e}")
            lines.append(f"  {label:26s} {note:>49s}  {verdict}")
            lines += [f"    {_matmul_name(b)}: {b['problem']}" for b in x["bad"][:4]]
            continue
        if rows[0].get("kind") in (TARGET_WEIGHTS, DRAFT_WEIGHTS):
            x = rows[0]
            note = f"{x['weights']} weights, exactly the export's" if x["passed"] else \
                f"{len(x['bad'])} of {x['weights']} weights not the export's"
            lines.append(f"  {label:26s} {note:>49s}  {verdict}")
            lines += [f"    '{b['weight']}': {b['problem']}" for b in x["bad"][:4]]
            continue
        if rows[0].get("kind") == "tokens":
            x = rows[0]
            note = f"exact {x['agree']}/{x['rows']}" + (f", {x['ties']} tie(s)" if x["ties"] else "")
            lines.append(f"  {label:26s} {note:>49s}  {verdict}")
            continue
        if any("error" in x for x in rows):
            bad = next(n for n, x in zip(names, rows) if "error" in x)
            named = "" if bad == label else f"{bad}: "  # (the engine's call: its label says it)
            lines.append(f"  {label:26s} {named}{r['outputs'][bad]['error']}  FAIL")
            continue
        worst = max(range(len(rows)), key=lambda i: (not rows[i]["passed"], rows[i]["tol_ratio"]))
        w = rows[worst]
        shown = label if len(names) == 1 else f"{label}.* ({len(names)}, worst {names[worst].split('.')[-1]})"
        if w.get("in_units_of_row_scale"):
            shown += " /row"  # errors and tolerances in units of each reference row's scale (scale_rows)
        lines.append(f"  {shown:26s} {_fmt(w['max_abs']):>9s} {_fmt(w['max_rel']):>9s} {_fmt(w['atol']):>9s} "
                     f"{_fmt(w['rtol']):>9s} {w['tol_ratio']:>9.3g}  {verdict}")
        same = sum(x.get("shared_nonfinite", 0) for x in rows)
        if same:  # the model's own overflow, where the reference has it too
            lines.append(f"    {same} element(s) NaN or inf in both, the same: set aside (the model overflows there)")
    return lines


def _matmul_name(bad: dict[str, Any]) -> str:
    """A quantized matmul check's entry by its node output and, where known, its float weight."""
    return bad["matmul"] + (f" (weight '{bad['weight']}')" if bad.get("weight") else "")


def failures(roles: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for role, r in roles.items():
        for name, o in r["outputs"].items():
            if not o["passed"]:
                out.append({"role": role, "output": name, **{k: v for k, v in o.items() if k != "passed"}})
    return out


def summary(fails: list[dict[str, Any]], reference: str) -> str:
    def one(f):
        if "error" in f:
            return f"{f['role']} {f['output']} ({f['error']})"
        if f.get("kind") == "weights":
            return (f"{f['role']} {f['output']} ({len(f['bad'])} of {f['matmuls']} {f.get('op', 'MatMulNBits')} off their float "
                    f"weights: " + "; ".join(f"{_matmul_name(b)}: {b['problem']}" for b in f["bad"][:2]) + ")")
        if f.get("kind") == "tokens":
            return f"{f['role']} {f['output']} ({f['agree']}/{f['rows']} equal, {f['ties']} explained by ties)"
        if f.get("kind") in (TARGET_WEIGHTS, DRAFT_WEIGHTS):
            graph = "draft" if f["kind"] == DRAFT_WEIGHTS else "target"
            return (f"{f['role']} {f['output']} ({len(f['bad'])} of the {graph} engine's weights differ from the "
                    "export's: " + "; ".join(f"'{b['weight']}' {b['problem']}" for b in f["bad"][:2]) + ")")
        return (f"{f['role']} {f['output']} (max abs {f['max_abs']:.3g} > atol {f['atol']:g}, "
                f"max rel {f['max_rel']:.3g})")

    # a weight named first: the cause of the outputs it moved (the 8 shown were those outputs)
    fails = sorted(fails, key=lambda f: f.get("kind") not in ("weights", TARGET_WEIGHTS, DRAFT_WEIGHTS))
    shown = "; ".join(one(f) for f in fails[:8]) + (f"; and {len(fails) - 8} more" if len(fails) > 8 else "")
    return f"{what_failed(fails, reference)}: {shown}"


def _tol_args(values: dict[str, float]) -> list[str]:
    """polygraphy's ``--atol``/``--rtol`` form: the most common value bare, the others name:value."""
    default = Counter(values.values()).most_common(1)[0][0]
    return [f"{default:g}", *(f"{n}:{v:g}" for n, v in values.items() if v != default)]


def outputs_file_for(inputs_file: Path) -> Path:
    """Where the engine's outputs for the by-hand command go, beside its inputs:
    r.inputs.json -> r.outputs.json; in.json -> in.outputs.json."""
    name = inputs_file.name
    stem = name[: -len(".inputs.json")] if name.endswith(".inputs.json") else Path(name).stem
    return inputs_file.with_name(stem + ".outputs.json")


def polygraphy_command(graph: Path, tol: dict[str, tuple[float, float]], inputs_file: Path,
                       outputs_file: Path) -> str:
    """The ``polygraphy run`` line that repeats one comparison by hand, on any machine: the
    export's graph in ONNX Runtime on the saved inputs, checked against the engine's saved
    outputs (whichever backend made them) with the same tolerances."""
    argv = [_polygraphy_exe(), "run", str(graph), "--onnxrt", "--load-inputs", str(inputs_file),
            "--load-outputs", str(outputs_file),
            "--atol", *_tol_args({n: v[0] for n, v in tol.items()}),
            "--rtol", *_tol_args({n: v[1] for n, v in tol.items()}), "--check-error-stat", "elemwise"]
    return shlex.join(argv)


def _polygraphy_exe() -> str:
    """``polygraphy`` where the shell finds it; else the one installed beside this Python (a
    virtual environment not activated: the bare name was "command not found" when pasted)."""
    import shutil
    import sys

    beside = Path(sys.executable).parent / "polygraphy"
    return str(beside) if shutil.which("polygraphy") is None and beside.is_file() else "polygraphy"


def polygraphy_trt_command(plan: Path, profile: int, inputs_file: Path, outputs_file: Path) -> str:
    """The ``polygraphy run`` line that runs a TensorRT plan itself (its profile) on the saved
    inputs and saves its outputs, for ``polygraphy_command`` to check (needs TensorRT)."""
    return shlex.join([_polygraphy_exe(), "run", str(plan), "--model-type", "engine", "--trt", "--optimization-profile",
                       str(profile), "--load-inputs", str(inputs_file), "--save-outputs", str(outputs_file)])


# ---- entry point ------------------------------------------------------------------------


def _graph_file(engines: EngineSet, graph: str) -> Path:
    files = [r["file"] for r in engines.export["graphs"][graph]["files"] if r["file"].endswith(".onnx")]
    return engines.export_dir / files[0]


def _rewritten(engines: EngineSet, role: str) -> Path | None:
    """The ONNX file ``role``'s engine runs where it is not the export's graph file (the build's
    in-place target, int8 draft, or a graph written with its weights in a file of their own),
    else None (a TensorRT plan, or the export's own file)."""
    onnx_file = engines.manifest["roles"][role]["engine"].get("onnx")
    if not onnx_file:
        return None
    f = engines.folder / onnx_file
    return None if f.resolve() == _graph_file(engines, engines.roles[role].graph).resolve() else f


def compare_engines(engines_dir: Path, reference: str = "onnxruntime", report: Path | None = None, atol=None,
                    rtol=None, log: Callable[[str], None] = print, *, verify: bool = True,
                    target_folder: Path | None = None, inputs_file: Path | None = None,
                    prompt_tokens: int | None = None) -> dict[str, Any]:
    """Compare every role of ``engines_dir`` with ``reference``; print a table per role, write
    the JSON report (``report``) and the inputs of one comparison (``inputs_file``, default
    beside the report), and return the report (``passed``, ``failures``, ``summary``).

    atol/rtol: None (defaults for the engines' precision), a float for every output, or a
    dict keyed by output kind, output name or "" (see ``resolve_tolerances``).
    target_folder: the transformers checkpoint for ``torch`` (default: the binding receipt's).
    prompt_tokens: the test prompt's length (default: 32, or the most the context leaves).
    """
    check_path_args("a folder", engines_dir=engines_dir, target_folder=target_folder,  # Path('') is the working folder
                    optional=("target_folder",))
    check_path_args("a file", report=report, inputs_file=inputs_file, optional=("report", "inputs_file"))
    if reference not in REFERENCES:
        raise UserError(f"--reference '{reference}' is not one of {', '.join(REFERENCES)}")
    if target_folder is not None and reference != "torch":  # (it was ignored without a word)
        raise UserError(f"--target {target_folder}: the checkpoint of the torch reference; give --reference torch "
                        "with it")
    if report is None and inputs_file is None:  # (the by-hand command's files go to a temporary folder then)
        check_temp_folder("compare without --report or --save-inputs")
    _base_runner()
    _import_torch_first()
    from polygraphy.exception import PolygraphyException
    from polygraphy.json import to_json
    from polygraphy.logger import G_LOGGER

    t_start = time.perf_counter()
    engines = load_engines(engines_dir, verify=verify)
    exp = engines.export
    # verify.K scores K + 1 tokens over the n of the prompt: n + K + 1 <= C (its plan's past C - K - 1)
    most = engines.max_context - max(engines.depths) - 1
    if most < 2:  # (it said "--prompt-tokens 32: expected 2..1", of an option not given)
        raise UserError(f"{engines_dir}: its context limit of {engines.max_context} tokens leaves verify."
                        f"{max(engines.depths)} no room for a prompt of 2 tokens: compare needs engines built with "
                        f"--max-context {max(engines.depths) + 3} or more")
    # the default fits the engines' context (32 refused engines built with --max-context 32)
    n = min(32, most) if prompt_tokens is None else int(prompt_tokens)
    if not 2 <= n <= most:
        raise UserError(f"--prompt-tokens {n}: expected 2..{most} for a context limit of {engines.max_context}")
    known = set(KINDS) | {o["name"] for g in exp["graphs"].values() for o in g["io"]["outputs"]}
    check_tolerance_keys(atol, known, "--atol")
    check_tolerance_keys(rtol, known, "--rtol")

    notes, skipped = [], {}
    if reference == "torch":
        folder = Path(target_folder or exp["binding_receipt"]["target"]["folder"])
        model = load_torch_target(folder, exp)
        ref_detail = f"transformers {__import__('transformers').__version__} eager attention, fp32, from {folder}"
        if DRAFT in engines.runners:
            skipped[DRAFT] = "the torch reference covers the target roles only (transformers has no draft model)"
    else:
        model, sessions = None, {}
        ref_detail = f"polygraphy OnnxrtRunner(SessionFromOnnx) on {engines.export_dir}, CPU"
        # (the build rewrites an export's draft whose graph holds its weights, _external_weights: the note said
        # "the same graph file" of that copy too)
        draft_note = ("; the draft runs the export's draft graph, its weights moved to a file of their own (checked "
                      "against the export's, weight by weight)" if DRAFT in engines.runners and
                      _rewritten(engines, DRAFT) else "; the draft runs the same graph file as this reference")
        if engines.backend == "onnxruntime" and engines.kv_layout("target") == "inplace":
            notes.append("the target engine is the export's target re-lowered with in-place KV (ONNX Runtime "
                         "GroupQueryAttention, contracts.py); it is compared through the portable past/new contract "
                         "with the export's own graph" + ("" if engines.draft_weights == "int8" or DRAFT not in
                                                          engines.runners else draft_note))
        elif engines.backend == "onnxruntime" and engines.draft_weights == "int8":
            notes.append("the target engines run the same graph file as this reference: this checks their session "
                         "settings and bindings, not the export (use --reference torch for that)")
        elif engines.backend == "onnxruntime":
            notes.append("ONNX Runtime engines run the same graph files as this reference: this checks the engines' "
                         "session settings and bindings, not the export (use --reference torch for that)")

    if engines.head is not None:
        notes.append("the target head is screened (built with --target-head screened): the logits compared here are "
                     "its fp32 branch's (head_exact = true, what sampling and the prefill use); greedy steps take "
                     "int8 logits that only screen the argmax, exact by an error bound (specrt/head.py): the "
                     f"'{SCREENED}' row of each decode / verify role runs that path and checks its tokens against "
                     "the reference's argmax (exact, or a tie within the logits' tolerance)")
    if DRAFT in engines.runners and DRAFT not in skipped and engines.draft_weights == "int8":
        notes.append("the draft engine has int8 weights (built with --draft-weights int8): it is compared with the "
                     "export's float draft within the int8 bounds (compare.py INT8_DRAFT), tokens exact or tie, "
                     "and its weights with the float weights block by block or column by column, as its form has them "
                     "(quantize.check_int8_weights)")

    def reference_runner(role: str):
        graph = engines.roles[role].graph
        name = f"reference-{reference}[{role}]"
        if model is not None:
            return torch_target_runner(model, engines.portable(role).get_input_metadata(),
                                       tuple(exp["target"]["aux_layer_ids"]), name)
        from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

        if graph not in sessions:  # one session per graph, shared by its roles
            sessions[graph] = SessionFromOnnx(str(_graph_file(engines, graph)), providers=["cpu"])()
        return OnnxrtRunner(sessions[graph], name=name)

    roles_out: dict[str, Any] = {}
    tolerances: dict[str, Any] = {}
    weights_checked: set[str] = set()  # graphs whose weights were checked (check_target_weights), on their first role
    order = [r for r in (PREFILL, DECODE) if r in engines.runners]
    order += sorted((r for r in engines.runners if r.startswith("verify.")), key=role_depth)
    order += [DRAFT] if DRAFT in engines.runners else []
    # the role the printed `polygraphy run` line repeats: the first that failed, else the deepest
    # verify (it repeated that one whatever failed, and passed when pasted)
    deepest, show_role, saved_feeds, saved_outputs = f"verify.{max(engines.depths)}", None, None, []
    last_run = None  # (role, feeds, outputs) of the last role whose engine ran its calls
    log(f"compare {engines.folder} ({engines.backend}, {engines.precision}) against {reference}: {ref_detail}")
    try:
        # (an engine's NaN / inf outputs fail their rows; numpy's RuntimeWarnings on them, from the
        # statistics, were printed among the tables)
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL), engines, np.errstate(invalid="ignore", over="ignore"):
            try:
                inputs = RoleInputs(engines, n)
            except EngineFailure as e:  # (every role's inputs start from that prefill: nothing to compare)
                raise EngineFailure(f"the engines' prefill of {n} prompt tokens, where every role's inputs start, "
                                    f"failed: {e}") from None
            log(f"inputs: {n} prompt tokens, {inputs.source}; past KV from the engines' prefill")
            for note in notes:
                log(f"note: {note}")
            for role in order:
                if role in skipped:
                    log(f"{role}: skipped: {skipped[role]}")
                    continue
                outputs = [t.name for t in engines.portable(role).get_output_metadata()]
                int8 = role == DRAFT and engines.draft_weights == "int8"
                tol = resolve_tolerances(outputs, engines.precision, reference, atol, rtol, int8_draft=int8)
                tolerances[role] = {k: list(v) for k, v in tol.items()}
                feeds = inputs.feeds(role)
                t0 = time.perf_counter()
                kept: list = []  # its engine outputs, kept for the command where it is the one shown
                try:
                    eng = engine_runner(engines.portable(role), f"engine-{engines.backend}[{role}]")
                    # the int8 draft's bounds scale with its rows' spread, unless the user set that output's atol
                    # (by output name: one layer's atol left the kind's other layers at the bare bound)
                    row_std = {o: m for o in outputs for k, m in INT8_DRAFT_ROW_STD.items()
                               if int8 and (o == k or kind_of(o) == k) and not user_covers(atol, o)}
                    # fp32 against ONNX Runtime: the target's logits and hidden states in units of their rows'
                    # scale (scale_rows), unless the user set their atol
                    row_scaled = {o: True for o in outputs
                                  if engines.precision == "fp32" and reference == "onnxruntime"
                                  and kind_of(o) in (C.LOGITS, C.AUX_HIDDEN) and not user_covers(atol, o)}
                    roles_out[role] = compare_role(role, eng, reference_runner(role), feeds, tol, outputs,
                                                   row_std or None, keep=kept, row_scaled=row_scaled)
                    # the tolerances used (an int8 draft's widened by its rows' spread)
                    tolerances[role] = {**tolerances[role], **{
                        k: [o["atol"], o["rtol"]] for k, o in roles_out[role]["outputs"].items() if "atol" in o}}
                    if int8:  # the weights themselves, exactly (quantize.check_int8_weights)
                        w = check_int8_weights(_graph_file(engines, engines.roles[role].graph),
                                               engines.folder / engines.manifest["roles"][role]["engine"]["onnx"])
                        _add_check(roles_out[role], INT8_WEIGHTS, {"kind": "weights", **w})
                    graph, onnx_file = engines.roles[role].graph, _rewritten(engines, role)
                    if onnx_file is not None and not int8 and graph not in weights_checked:
                        # the engine's weights against the export's, exactly, once a graph (its roles share one):
                        # the target's, and the float draft's (a weight no test input reads passed: an embedding row)
                        weights_checked.add(graph)
                        _add_check(roles_out[role], WEIGHT_CHECKS[graph], check_target_weights(
                            _graph_file(engines, graph), onnx_file, WEIGHT_CHECKS[graph]))
                    if role == PREFILL and any(t.name == C.LOGITS_FROM for t in engines.runner(role).inputs):
                        # the runtime's prefill asks for its last row's logits only (contracts.py):
                        # that slicing is an engine path of its own, checked against the reference's last row
                        _add_check(roles_out[role], LAST_ROW, last_row_check(
                            engines.portable(role), reference_runner(role), feeds[0], tol[C.LOGITS],
                            scaled=C.LOGITS in row_scaled))
                    if engines.head is not None and role != PREFILL and engines.roles[role].graph == "target":
                        # the greedy path: int8 logits screened to the exact argmax (specrt/head.py)
                        _add_check(roles_out[role], SCREENED, screen_check(
                            engines.portable(role), engines.head, reference_runner(role), feeds, tol[C.LOGITS],
                            scaled=C.LOGITS in row_scaled))
                    if role.startswith("verify.") and role_depth(role) >= 3 and engines.verifies_trees():
                        # a token tree in one call against each of its chains (tree_check)
                        _add_check(roles_out[role], TREE, tree_check(
                            engines.portable(role), reference_runner(role), feeds[0],
                            {k: v for k, v in tol.items() if k != C.DRAFT_TOKENS}, scaled=row_scaled))
                except EngineFailure as e:  # the engine failed a call (its backend's own error): that
                    # role fails, named, and the others are compared (it ended compare at that role)
                    roles_out[role] = {"iterations": len(feeds), "input_shapes": [], "outputs": {
                        ENGINE_CALL: {"passed": False, "error": str(e)}}, "passed": False,
                        "seconds": round(time.perf_counter() - t0, 3)}
                for line in role_table(role, roles_out[role]):
                    log(line)
                failed = bool(failures({role: roles_out[role]}))
                if ENGINE_CALL in roles_out[role]["outputs"]:
                    continue  # (no outputs of its own to give the by-hand command)
                if (failed and not (show_role and failures({show_role: roles_out[show_role]}))) or \
                        (role == deepest and show_role is None):
                    show_role, saved_feeds, saved_outputs = role, feeds, kept
                last_run = (role, feeds, kept)
            if show_role is None and last_run is not None:  # (the deepest verify's engine failed its call)
                show_role, saved_feeds, saved_outputs = last_run
    except PolygraphyException as e:
        raise UserError(f"polygraphy: {e}") from None

    fails = failures(roles_out)
    result: dict[str, Any] = {
        "format": "specrt-compare/1", "engines": str(engines.folder), "backend": engines.backend,
        "precision": engines.precision, "reference": reference, "reference_detail": ref_detail,
        "check": "polygraphy elemwise: |a-b| <= atol or |a-b| <= rtol*|reference|, outputs marked in_units_of_row_scale "
                 "divided first by each reference row's scale (max(1, 1.4826 median |row|)); draft_token_ids "
                 "exact or tie",
        "inputs": {"prompt_tokens": n, "source": inputs.source}, "notes": notes, "skipped": skipped,
        "tolerances": tolerances, "roles": roles_out, "failures": fails, "passed": not fails,
        "summary": (summary(fails, reference) if fails
                    else f"all {len(roles_out)} roles match the {reference} reference"),
    }
    if saved_feeds is not None:
        if inputs_file is None:
            # else one temporary folder per engines folder and user, each run's files its own there
            # (two runs at once wrote one inputs.json: a command printed by one ran the other's files)
            where = hashlib.sha256(str(Path(engines.folder).resolve()).encode()).hexdigest()[:12]
            inputs_file = (Path(report).with_suffix(".inputs.json") if report is not None
                           else _own_inputs_file(_own_temp_folder(where, Path(engines.folder).resolve())))
        Path(inputs_file).parent.mkdir(parents=True, exist_ok=True)
        outputs_file = outputs_file_for(Path(inputs_file))
        # each whole or as before (paths.atomic_file: beside itself, then renamed; links and
        # devices written through, a file's mode kept): an interrupt mid-write left a 0-byte
        # outputs file the report names. Both written before either is renamed: a disk full at
        # the second left this run's outputs beside the last run's inputs. (An interrupt between
        # the two renames still can: the report, written after, is the last's.)
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
            texts = (to_json(saved_outputs[0]), to_json(saved_feeds))  # (what .save / save_json write)
        with atomic_file(outputs_file) as fo, atomic_file(Path(inputs_file)) as fi:
            for f, text in ((fo, texts[0]), (fi, texts[1])):
                f.write(text.encode("utf-8"))
                f.flush()  # (the disk's error here, before the inner file's rename)
        # the command checks against ONNX Runtime whatever this run's reference was
        int8 = show_role == DRAFT and engines.draft_weights == "int8"
        tol = resolve_tolerances([t.name for t in engines.portable(show_role, activate=False).get_output_metadata()],
                                 engines.precision, "onnxruntime", atol, rtol, int8_draft=int8)
        if int8:  # its bounds as the check widened them by its rows' spread (the float's bounds failed the line)
            tol = {n: tuple(tolerances[show_role].get(n, v)) for n, v in tol.items()}
        # outputs compared per row scale: polygraphy's one atol is that of the widest row (looser
        # than specrt's check on the other rows)
        shown = roles_out.get(show_role, {}).get("outputs", {})
        tol = {n: (shown.get(n, {}).get("atol_widest_row", v[0]), v[1]) for n, v in tol.items()}
        cmd = polygraphy_command(_graph_file(engines, engines.roles[show_role].graph), tol, Path(inputs_file),
                                 outputs_file)
        result.update(inputs_file=str(inputs_file), outputs_file=str(outputs_file), polygraphy_role=show_role,
                      polygraphy_command=cmd)
        log(f"reproduce {show_role} by hand: the export's graph in ONNX Runtime against the engine's saved outputs"
            + (" (at ONNX Runtime's tolerances; this run compared with transformers at its own):"
               if reference != "onnxruntime" else ":"))
        log(f"  {cmd}")
        checks = sorted({f["output"] for f in fails if f["role"] == show_role})
        if checks and set(checks) <= set(CHECKS):  # (the line then passes)
            log(f"  ({show_role} failed only its {', '.join(checks)} check, which this line does not repeat)")
        same = sum(o.get("shared_nonfinite", 0) for n, o in shown.items() if n not in CHECKS)
        if same:  # (polygraphy takes inf - inf for a difference)
            log(f"  (polygraphy counts the {same} element(s) NaN or inf in both, which this run set aside, as "
                "differences: this line fails on them)")
        if engines.backend == "tensorrt":
            e = engines.manifest["roles"][show_role]["engine"]
            trt = polygraphy_trt_command(engines.folder / e["file"], int(e["profile"]), Path(inputs_file),
                                         outputs_file)
            result["polygraphy_trt_command"] = trt
            log("  (the engine's outputs again, from its plan, needs TensorRT:")
            log(f"   {trt})")
    result["seconds"] = round(time.perf_counter() - t_start, 2)
    log(("PASSED: " if not fails else "FAILED: ") + result["summary"] + f" ({result['seconds']:.1f} s)")
    if report is not None:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(report), result, indent=2)  # whole or absent, also on Ctrl-C
        log(f"report: {report}")
    return result

"""The screened target head (``specrt build --target-head screened``): exact greedy argmax
from an int8 head plus an error bound.

Greedy decoding needs each row's argmax, not its logits. The head's weights W [V, H]
(SmolLM2: 49152 x 576, 113 MB in fp32, ~20% of a decode step on a 2-core AVX2 host) are
split by hidden channel: k outlier channels O (the largest |h_i| on a few calibration
prompts at build: SmolLM2's final hidden states reach |h_i| ~18 where their rms is ~1.9)
stay in fp32, and the other channels R are quantized per token to w'_j = s_j q_j with
q_j in [-63, 63] (7 bits: ONNX Runtime's u8s8 kernel on AVX2 without VNNI adds pairs of
u8 x s8 products in int16 with saturation, and 2 * 255 * 63 < 32768 keeps that exact).
The graph quantizes each row's h_R symmetrically, h'_R = t round(h_R / t) with
t = max|h_R| / 127 (uint8 with zero point 128), and computes

    a_j = h_O . w_Oj  (fp32)  +  t s_j (round(h_R / t) . q_j)  (MatMulInteger, exact int32)

and, per row, ``head_norms`` = (||h_R||, ||h_R - h'_R||). By Cauchy-Schwarz

    |h . w_j - a_j| <= ||w_Rj - w'_Rj|| ||h_R|| + ||w'_Rj|| ||h_R - h'_R|| (+ float rounding)

Every token whose a_j + b_j reaches max_i (a_i - b_i) is a candidate, the exact argmax is
among them, and their exact logits (float64, from the fp32 weights kept beside the
engines, ``head_weight.npy``, read row by row) decide it; ties go to the smallest id, as
numpy's argmax. On SmolLM2's greedy answers a row leaves 8-12 candidates with 48 outlier
channels (results/README.md, "A screened head"). The exact logits are the real-number ones:
a full fp32 head may order two tokens within its own rounding (~1e-6) differently.
Sampling needs every probability: the graph's ``head_exact`` input switches it (an If) to
the fp32 head's logits, the weights the graph holds anyway (tied models: the embedding);
the prefill takes that branch too, with zero norms, so the screen there only rescores the
tokens within float rounding of the top.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from specrt.errors import InternalError, NonFiniteOutput

QMAX = 63  # 7-bit weights (module doc)
HMAX = 127  # h_R per row to [-127, 127], stored as uint8 + 128
OUTLIERS = 48  # fp32 channels (at most H // 8)
WEIGHT_FILE = "head_weight.npy"  # [V, H] float32: the exact head
BOUNDS_FILE = "head_bounds.npy"  # [3, V] float64: ||w_Rj - w'_Rj||, ||w'_Rj||, ||w_j||
# float rounding of the scales and the fp32 outlier product, relative to |logit| and
# ||h|| max ||w_j||: a float32 dot of n terms errs by at most n ulps (6e-8 each) of
# sum |h_i w_ij| <= ||h|| ||w_j||, so 2 H ulps, and a margin for the rest
REL_EPS = 1e-5
ULP = 2.0 ** -24
NORM_SLACK = 1e-4  # the graph's fp32 norms (sums of ~500 squares), relative


def n_outliers(hidden: int) -> int:
    return min(OUTLIERS, hidden // 8)


def choose_outliers(states: np.ndarray, k: int) -> np.ndarray:
    """states [N, H] (the head's inputs on calibration tokens) -> the k channels of largest
    max |h_i|, ascending. Only speed depends on this choice, never the argmax."""
    states = np.asarray(states, np.float64).reshape(-1, np.shape(states)[-1])
    if not np.isfinite(states).all():
        raise InternalError("the head's calibration hidden states hold NaN or inf")
    return np.sort(np.argsort(-np.abs(states).max(0), kind="stable")[:k]).astype(np.int64)


def rest_channels(hidden: int, outliers: np.ndarray) -> np.ndarray:
    keep = np.ones(hidden, bool)
    keep[outliers] = False
    return np.flatnonzero(keep).astype(np.int64)


def quantize_head(w: np.ndarray, outliers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W [V, H] float, the outlier channels -> (q int8 [V, |R|] in [-QMAX, QMAX] over the
    rest channels, scales float32 [V], bounds float64 [3, V]: ||w_Rj - w'_Rj||, ||w'_Rj||,
    ||w_j||)."""
    w = np.asarray(w, np.float32)
    wr = w[:, rest_channels(w.shape[1], np.asarray(outliers, np.int64))]
    s = (np.abs(wr).max(1) / QMAX).astype(np.float32)
    s[s == 0] = 1.0  # an all-zero row: q = 0, exact
    q = np.clip(np.rint(wr / s[:, None]), -QMAX, QMAX).astype(np.int8)
    deq = q.astype(np.float64) * s[:, None].astype(np.float64)
    bounds = np.stack([np.linalg.norm(wr.astype(np.float64) - deq, axis=1), np.linalg.norm(deq, axis=1),
                       np.linalg.norm(w.astype(np.float64), axis=1)])
    return q, s, bounds


class HeadScreen:
    """The exact head beside a screened engine: argmax per row from approximate logits and
    the hidden states and norms that produced them."""

    def __init__(self, weight: np.ndarray, bounds: np.ndarray):
        if weight.ndim != 2 or bounds.shape != (3, weight.shape[0]):
            raise InternalError(f"head weight {weight.shape} / bounds {bounds.shape}: expected [V, H] / [3, V]")
        self.weight, self.residual, self.norm = weight, bounds[0], bounds[1]
        self.rmax, self.nmax, self.wmax = float(bounds[0].max()), float(bounds[1].max()), float(bounds[2].max())
        self.rel_eps = REL_EPS + 2 * weight.shape[1] * ULP
        self.candidates = 0  # rows screened and candidates rescored (telemetry for benchmarks)
        self.rows = 0

    @classmethod
    def load(cls, folder: Path) -> "HeadScreen":
        """From an engines folder (files checked against the manifest's hashes by the caller).
        The fp32 head stays on disk: the screen reads its candidates' rows with pread (a
        memory map would keep every row it ever touched resident, ~70 MB after 10 answers
        on SmolLM2)."""
        return cls(_Rows(Path(folder) / WEIGHT_FILE), np.load(Path(folder) / BOUNDS_FILE, allow_pickle=False))

    def close(self) -> None:
        """Release the fp32 rows' file (reopened by the next screen)."""
        if isinstance(self.weight, _Rows):
            self.weight.close()

    def argmax(self, approx: np.ndarray, h: np.ndarray, norms: np.ndarray, rows=None,
               nonfinite_ok: bool = False) -> np.ndarray:
        """approx [S, V] (the graph's screened logits), h [S, H] (its hidden states, the
        final norm applied), norms [S, 2] (``head_norms``) -> int64: the exact argmax of
        each of ``rows`` (default all; a range or a list of row indices). A row with NaN or
        inf raises NonFiniteOutput, or with ``nonfinite_ok`` is -1 (a verify call's rows:
        the caller looks at the rows it uses only, runtime/verify.py). All rows at once,
        the per-row scalars in Python floats: a step's numpy work is a few passes over its
        rows' logits (0.37 ms a decode step in the generator here, tools/exp_screen_cost.py;
        numpy calls cost ~5 us each)."""
        if rows is None:
            rows = range(len(h))
        if isinstance(rows, range) and rows.step == 1:
            sel = slice(rows.start, rows.stop)  # views, no copy of the logits
        else:
            sel = np.asarray(list(rows), np.int64)
        a, hm = approx[sel], np.asarray(h[sel], np.float64)
        m, V = a.shape
        t = a.argmax(1)
        tops = a.ravel()[t + V * np.arange(m)].tolist()
        hns = np.sqrt(np.einsum("ij,ij->i", hm, hm)).tolist()
        nms = np.asarray(norms[sel], np.float64).tolist()
        rt, nt = self.residual[t].tolist(), self.norm[t].tolist()
        floors, pres, rns, ens, epss = [], [], [], [], []
        for i in range(m):
            (r_n, e_n), a_top, hn = nms[i], tops[i], hns[i]
            if not all(math.isfinite(x) for x in (r_n, e_n, a_top, hn)):
                if not nonfinite_ok:
                    raise nonfinite_row(list(rows)[i])
                floors.append(math.nan)  # (no candidate: every comparison with NaN is false; the row stays -1)
                pres.append(math.nan)
                rns.append(0.0)
                ens.append(0.0)
                epss.append(0.0)
                continue
            rn = r_n * (1 + NORM_SLACK) + 1e-30  # the graph's fp32 norms, widened for their own rounding
            en = (e_n + 1e-6 * rn) * (1 + NORM_SLACK)
            b_max = self.rmax * rn + self.nmax * en
            eps = self.rel_eps * (abs(a_top) + 2 * b_max + hn * self.wmax + 1.0)  # every j near the top
            floor = a_top - (rt[i] * rn + nt[i] * en + eps)  # <= max_j (a_j - b_j)
            pre = floor - b_max - eps
            floors.append(floor)
            pres.append(pre - 1e-6 * abs(pre) - 1e-30)  # still below after rounding to float32
            rns.append(rn)
            ens.append(en)
            epss.append(eps)
        flat = np.flatnonzero(a >= np.array(pres, np.float32)[:, None])  # row-major: ids ascend in a row
        r, j = np.divmod(flat, V)  # (2-D nonzero is ~8x slower than flatnonzero)
        if m == 1:
            b = self.residual[j] * rns[0] + self.norm[j] * ens[0] + epss[0]
            keep = a[0, j] + b >= floors[0]
        else:
            b = self.residual[j] * np.array(rns)[r] + self.norm[j] * np.array(ens)[r] + np.array(epss)[r]
            keep = a[r, j] + b >= np.array(floors)[r]
        r, j = r[keep], j[keep]
        # each candidate's own dot product, all by one reduction: a matrix product sums its
        # leftover rows with other kernels in another order, so identical head rows came out
        # an ulp apart by their position and the call's shape, and a tie went to a later id
        exact = np.einsum("ij,ij->i", np.asarray(self.weight[j], np.float64), hm[r]).tolist()
        out, best = [-1] * m, [-math.inf] * m
        for ri, ji, x in zip(r.tolist(), j.tolist(), exact):  # ids ascend: ties go to the smallest
            if x > best[ri]:
                out[ri], best[ri] = ji, x
        self.rows += m
        self.candidates += len(j)
        return np.array(out, np.int64)


def nonfinite_row(row: int) -> NonFiniteOutput:
    """The error for row ``row`` of a screened call holding NaN or inf: HeadScreen.argmax's, and
    verify_greedy's for a row the screen gave -1 (``nonfinite_ok``)."""
    return NonFiniteOutput(f"target engine produced NaN or inf hidden states or logits in row {row} of its call")


class _Rows:
    """A [V, H] float32 .npy file's rows, read on demand: ``rows[ids]`` -> [len(ids), H]."""

    def __init__(self, path: Path):
        m = np.load(path, mmap_mode="r", allow_pickle=False)  # the header only: shape, dtype, offset
        if m.ndim != 2 or m.dtype != np.float32 or not m.flags.c_contiguous:
            raise InternalError(f"{path}: expected a C-ordered float32 [V, H] array, found {m.dtype} {m.shape}")
        self.shape, self.ndim, self._offset = m.shape, 2, int(m.offset)
        self._row = m.shape[1] * 4
        del m
        self._path, self._file = path, None  # opened at the first read, closed by close()

    def close(self) -> None:
        """Close the file (the engine set's deactivate); a later read opens it again."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __getitem__(self, ids) -> np.ndarray:
        if self._file is None:
            self._file = open(self._path, "rb", buffering=0)  # noqa: SIM115 (closed by close())
        fd, row, off = self._file.fileno(), self._row, self._offset
        data = b"".join(os.pread(fd, row, off + i * row) for i in np.asarray(ids, np.int64).tolist())
        return np.frombuffer(data, np.float32).reshape(-1, self.shape[1])

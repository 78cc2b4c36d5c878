"""Corpus lookup (``--governor SPEC:corpus``): the target's own earlier answers as proposals.

Prompt lookup (ngram.py) proposes what followed an earlier occurrence of the context's last
n-gram in the context itself. A corpus extends the search to a token corpus stored with the
engines (``ENGINES/corpus.npz``, made by ``specrt corpus ENGINES FILE...`` from the target's
answers to prompts like the deployment's, e.g. the draft's training data): per n-gram
(n = NMIN..NMAX) of the corpus, the token that most often followed it, its count and the
n-gram's total count. A proposal chains greedily: the longest n-gram of the context that the
corpus holds gives the next token, which joins the context for the next step (the idea of
REST and SuffixDecoding, on hashed n-gram tables: numpy only, one searchsorted a step).

Rounds are sized as prompt lookup's (ngram.NgramPolicy): per-position conditional acceptance
rates per bin of the first step's evidence (the top token's share of the n-gram's
continuations, or seen once; with the "fine" binning also the match's length and count:
FINE_BINS), learnt online from priors that
``specrt corpus`` measures on a held-back twentieth of the corpus (never on the prompts a
benchmark uses). Lossless as any proposal: greedy verification emits the target's argmax;
under sampling each proposed token is a one-hot proposal chosen before the round's
randomness is drawn.

Measured before this module existed (tools/exp_corpus.py, results/corpus): a corpus of the
draft's 12,554 training answers (3.0M tokens with their prompts) matched 68.5% of the
held-out answers' positions; where the first step's share was >= 0.95 (21% of positions) the
chain's conditional acceptance was 0.80, 0.63, 0.72, 0.77 at positions 1-4, against the
draft's teacher-forced 0.56, 0.39, 0.41, 0.44.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from specrt.errors import UserError
from specrt.paths import atomic_file
from specrt.prompt_files import json_lines

from .ngram import tally

FILE = "corpus.npz"
FORMAT = 1
NMIN, NMAX = 3, 8
_P = 1_000_003
_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
# the first step's evidence -> the key its rounds are learnt under (telemetry's lookup
# "match length": prompt lookup's n is 2..4, a corpus bin 11 and up). SHARES: the top next
# token's share of the n-gram's continuations (an n-gram seen once apart). Binning "share":
# those four (keys 11-14); "fine" (the default): each also split by the match's length
# (n >= 6) and, seen more than once, by its count (total >= 5) (keys 20-35).
SHARES = ("share>=0.95", "share 0.5-0.95", "share<0.5", "seen once")
BINNINGS = ("fine", "share")
BINS = {name: 11 + i for i, name in enumerate(SHARES)}
FINE_BINS = {f"{name}, n{'>=6' if long else '<6'}" + ("" if i == 3 else f", seen{'>=5' if many else '<5'}"):
             20 + 4 * i + 2 * long + many
             for i, name in enumerate(SHARES) for long in (0, 1) for many in ((0,) if i == 3 else (0, 1))}
PRIOR_HOLDOUT = 20  # every 20th sequence measures the priors
# a bin's prior where the held-back answers gave it fewer than 8 first-step tries (as low
# as the weakest bin measured, share<0.5: 0.19, 0.49 on SmolLM2's answers)
DEFAULT_PRIOR = (0.2, 0.5)
PRIOR_POSITIONS = 8
PRIOR_MAX_NEW = 128


def match_name(key: int) -> str:
    """A lookup round's key in words: prompt lookup's match length n, or a corpus bin."""
    names = {v: k for k, v in {**BINS, **FINE_BINS}.items()}
    return f"corpus {names[key]}" if key in names else f"{key}-gram"


def bin_of(top: int, total: int, n: int = 0, binning: str = "share") -> int:
    i = 3 if total < 2 else 0 if top / total >= 0.95 else 1 if top / total >= 0.5 else 2
    if binning == "share":
        return 11 + i
    return 20 + 4 * i + 2 * (n >= 6) + (i != 3 and total >= 5)


def bins_of(binning: str) -> dict[str, int]:
    return BINS if binning == "share" else FINE_BINS


def _tables(seqs: Sequence[Sequence[int]], nmin: int, nmax: int):
    """Sorted keys (hash of the n-gram, n mixed in) and, per key, the most frequent next
    token, its count and the key's total, over every n-gram followed by a token inside one
    sequence."""
    lens = [len(s) for s in seqs]
    toks = np.full(sum(lens) + len(seqs), -1, dtype=np.int64)  # -1 after each sequence
    at = 0
    for s, n in zip(seqs, lens):
        toks[at: at + n] = s
        at += n + 1
    nxt = np.full_like(toks, -1)
    nxt[:-1] = toks[1:]
    boundary = np.cumsum(toks < 0)  # a sequence's id; changes after each separator
    h = np.zeros(len(toks), dtype=np.uint64)
    keys, nexts = [], []
    with np.errstate(over="ignore"):
        for n in range(1, nmax + 1):
            back = np.full(len(toks), -1, dtype=np.int64)  # token n - 1 places back
            back[n - 1:] = toks[: len(toks) - n + 1]
            h = h * np.uint64(_P) + (back + 2).astype(np.uint64)
            if n < nmin:
                continue
            same = np.zeros(len(toks), dtype=bool)
            same[n - 1:] = boundary[n - 1:] == boundary[: len(toks) - n + 1]
            ok = same & (back >= 0) & (toks >= 0) & (nxt >= 0)
            keys.append(h[ok] * np.uint64(_MIX) + np.uint64(n))
            nexts.append(nxt[ok])
    k = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
    x = np.concatenate(nexts) if nexts else np.zeros(0, np.int64)
    order = np.lexsort((x, k))
    k, x = k[order], x[order]
    if not len(k):
        z = np.zeros(0, np.int64)
        return np.zeros(0, np.uint64), z.astype(np.int32), z.astype(np.int32), z.astype(np.int32)
    run = np.ones(len(k), dtype=bool)
    run[1:] = (k[1:] != k[:-1]) | (x[1:] != x[:-1])
    starts = np.flatnonzero(run)
    count = np.diff(np.append(starts, len(k)))
    rk, rx = k[starts], x[starts]
    first = np.ones(len(rk), dtype=bool)
    first[1:] = rk[1:] != rk[:-1]
    kstarts = np.flatnonzero(first)
    total = np.add.reduceat(count, kstarts)
    top = np.maximum.reduceat(count, kstarts)
    group = np.cumsum(first) - 1
    winners = np.flatnonzero(count == top[group])  # ties: the smallest token id (sorted first)
    pick = np.full(len(kstarts), -1, dtype=np.int64)
    pick[group[winners[::-1]]] = winners[::-1]
    return rk[kstarts], rx[pick].astype(np.int32), top.astype(np.int32), total.astype(np.int32)


class Corpus:
    def __init__(self, keys: np.ndarray, tokens: np.ndarray, top: np.ndarray, total: np.ndarray,
                 nmin: int = NMIN, nmax: int = NMAX, priors: dict[int, list[float]] | None = None,
                 info: dict | None = None, binning: str = "fine"):
        if binning not in BINNINGS:
            raise UserError(f"corpus binning {binning!r}: expected one of {', '.join(BINNINGS)}")
        self.keys, self.tokens, self.top, self.total = keys, tokens, top, total
        self.nmin, self.nmax, self.binning = nmin, nmax, binning
        self.ns = np.arange(nmax, nmin - 1, -1)  # longest first
        self.priors = priors or {}
        self.info = info or {}

    @classmethod
    def build(cls, seqs: Sequence[Sequence[int]], nmin: int = NMIN, nmax: int = NMAX, info: dict | None = None,
              binning: str = "fine"):
        return cls(*_tables(seqs, nmin, nmax), nmin=nmin, nmax=nmax, info=info, binning=binning)

    def __len__(self) -> int:
        return len(self.keys)

    # ---- lookup ---------------------------------------------------------------------

    def _keys(self, ctx: Sequence[int]) -> np.ndarray:
        """The mixed keys of the context's last n tokens, n = nmax .. nmin (longest first);
        0 where the context is shorter than n (no key is 0 but by chance)."""
        out, h = [0] * (self.nmax - self.nmin + 1), 0
        for j in range(min(self.nmax, len(ctx))):
            h = (h * _P + int(ctx[-1 - j]) + 2) & _MASK
            n = j + 1
            if n >= self.nmin:
                out[self.nmax - n] = (h * _MIX + n) & _MASK
        return np.array(out, dtype=np.uint64)

    def next(self, ctx: Sequence[int]) -> tuple[int, int, int, int] | None:
        """(token, its count, the n-gram's total, n) of the longest matching n-gram, or None."""
        if len(self.keys) == 0 or len(ctx) < self.nmin:
            return None
        q = self._keys(ctx)
        j = np.searchsorted(self.keys, q)
        j[j >= len(self.keys)] = 0
        hit = np.flatnonzero(self.keys[j] == q)
        if not len(hit):
            return None
        i, n = int(j[hit[0]]), int(self.ns[hit[0]])
        return int(self.tokens[i]), int(self.top[i]), int(self.total[i]), n

    def source_priors(self) -> dict[int, list[float]]:
        """Every bin's per-position prior rates (DEFAULT_PRIOR where none was measured)."""
        return {b: list(self.priors.get(b, DEFAULT_PRIOR)) for b in bins_of(self.binning).values()}

    def propose(self, ctx: Sequence[int], limit: int) -> tuple[list[int], int]:
        """(up to ``limit`` chained tokens, the first step's bin key), or ([], 0)."""
        if limit < 1:
            return [], 0
        tail = list(ctx[-self.nmax:])
        first = self.next(tail)
        if first is None:
            return [], 0
        out = [first[0]]
        while len(out) < limit:
            tail = tail[1:] + [out[-1]] if len(tail) >= self.nmax else tail + [out[-1]]
            got = self.next(tail)
            if got is None:
                break
            out.append(got[0])
        return out, bin_of(first[1], first[2], first[3], self.binning)

    # ---- priors ---------------------------------------------------------------------

    @staticmethod
    def measure(corpus: "Corpus", pairs: Iterable[tuple[Sequence[int], Sequence[int]]],
                positions: int = PRIOR_POSITIONS, max_new: int = PRIOR_MAX_NEW) -> dict[int, tuple[list, list]]:
        """Per bin, tries and wins per chain position of ``corpus``'s proposals at every
        position of each (context, answer) pair's answer (its first ``max_new`` tokens):
        wins = the k-th token matched given tokens 1..k-1 did (greedy acceptance)."""
        stats: dict[int, tuple[list, list]] = {}
        for ctx, answer in pairs:
            answer = list(answer[:max_new])
            ctx = list(ctx)
            for i in range(len(answer)):
                prop, b = corpus.propose(ctx, min(positions, len(answer) - i))
                if prop:
                    tally(prop, answer[i:], *stats.setdefault(b, ([0] * positions, [0] * positions)))
                ctx.append(answer[i])
        return stats

    # ---- files ----------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Atomically (specrt.paths.atomic_file): whole or absent."""
        meta = {"format": FORMAT, "nmin": self.nmin, "nmax": self.nmax, "binning": self.binning,
                "priors": {str(k): v for k, v in self.priors.items()}, **self.info}
        with atomic_file(path) as f:
            np.savez(f, keys=self.keys, tokens=self.tokens, top=self.top, total=self.total,
                     meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: Path, vocab_size: int | None = None, export_digest: str | None = None) -> "Corpus":
        """Never unpickles (allow_pickle=False). Refuses a corpus made for another export
        (its digest) or with token ids outside the vocabulary, naming the file."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                keys, tokens, top, total = (z[k] for k in ("keys", "tokens", "top", "total"))
                meta = json.loads(bytes(z["meta"]).decode())
        except (OSError, ValueError, KeyError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: not a corpus file ({e}); make it with `specrt corpus`") from None
        if meta.get("format") != FORMAT:
            raise UserError(f"{path}: corpus format {meta.get('format')!r}, expected {FORMAT}; make it again "
                            "with `specrt corpus`")
        if not (keys.dtype == np.uint64 and len(keys) == len(tokens) == len(top) == len(total)):
            raise UserError(f"{path}: inconsistent corpus arrays; make it again with `specrt corpus`")
        if export_digest is not None and meta.get("export_digest") not in (None, export_digest):
            raise UserError(f"{path}: made for another export (digest {str(meta.get('export_digest'))[:12]}, "
                            f"these engines' {export_digest[:12]}); make it again with `specrt corpus`")
        if vocab_size is not None and len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
            raise UserError(f"{path}: token ids outside the vocabulary [0, {vocab_size})")
        priors = {int(k): [float(x) for x in v] for k, v in meta.get("priors", {}).items()}
        info = {k: v for k, v in meta.items() if k not in ("format", "nmin", "nmax", "priors", "binning")}
        return cls(keys, tokens, top, total, int(meta["nmin"]), int(meta["nmax"]), priors, info,
                   str(meta.get("binning", "share")))


def read_sequences(paths: Sequence[Path], encode=None) -> list[tuple[list[int], list[int]]]:
    """(context, answer) token lists from JSON lines (.gz too): ``prompt_ids`` + ``answer_ids``
    (tools/gen_chat_data.py's format), or ``text`` (tokenized by ``encode``; the context
    empty). A line with neither is an error naming the file and line."""
    out = []
    for p in paths:
        for no, r in json_lines(Path(p), "the answers"):
            if isinstance(r, dict) and isinstance(r.get("answer_ids"), list):
                ids = r.get("prompt_ids", [])
                if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids + r["answer_ids"]):
                    raise UserError(f"{p}:{no}: prompt_ids / answer_ids must be lists of token ids")
                out.append((ids, r["answer_ids"]))
            elif isinstance(r, dict) and isinstance(r.get("text"), str) and encode is not None:
                out.append(([], encode(r["text"])))
            else:
                raise UserError(f"{p}:{no}: expected an object with answer_ids (and prompt_ids) or text")
    return out


def build_with_priors(pairs: Sequence[tuple[list[int], list[int]]], nmin: int = NMIN, nmax: int = NMAX,
                      info: dict | None = None, binning: str = "fine") -> tuple[Corpus, dict]:
    """The corpus of every pair (context + answer), with priors measured by a corpus of the
    pairs but every PRIOR_HOLDOUT-th on those held back. Returns it and the tries per bin."""
    held = [p for i, p in enumerate(pairs) if i % PRIOR_HOLDOUT == PRIOR_HOLDOUT - 1]
    rest = [p for i, p in enumerate(pairs) if i % PRIOR_HOLDOUT != PRIOR_HOLDOUT - 1]
    priors, tries = {}, {}
    if held and rest:
        part = Corpus.build([c + a for c, a in rest], nmin, nmax, binning=binning)
        for b, (t, w) in Corpus.measure(part, held).items():
            # the rates per position while there are tries; later positions keep the last
            rates, last = [], None
            for tk, wk in zip(t, w):
                last = wk / tk if tk >= 8 else last
                if last is not None:
                    rates.append(round(last, 4))
            if rates:
                priors[b], tries[b] = rates, t
    corpus = Corpus.build([c + a for c, a in pairs], nmin, nmax, info, binning)
    corpus.priors = priors
    return corpus, tries

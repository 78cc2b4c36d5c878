"""Corpus lookup (``--governor SPEC:corpus``): the target's own earlier answers as proposals.

Prompt lookup (ngram.py) proposes what followed an earlier occurrence of the context's last
n-gram in the context itself. A corpus extends the search to a token corpus stored with the
engines (``ENGINES/corpus.npz``, made by ``specrt corpus ENGINES FILE...`` from the target's
answers to prompts like the deployment's, e.g. the draft's training data): per n-gram
(n = NMIN..NMAX) of the corpus, the token that most often followed it and a code of the
evidence (its share of the n-gram's continuations, the n-gram's count), the n-grams that a
shorter suffix answers alike pruned (_tables). A proposal chains greedily: the longest
n-gram of the context that the corpus holds gives the next token, which joins the context
for the next step (the idea of REST and SuffixDecoding, on hashed n-gram tables: numpy
only, one searchsorted a step).

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

``:grow`` (Growth) makes the session's own finished sequences (prompt and output) a
proposal source too, SuffixDecoding's idea: the n-grams of its latest sequences, up to
GROW_TOKENS tokens (a Generator's governor: a ``--prompts`` file, a bench configuration, a Python
session) are counted as a corpus's, chained the same way, and binned the same way under
keys of their own (GROW_OFFSET above the corpus's), so that their rates are learnt apart:
traffic that repeats itself (the same questions, agent loops, templated answers) is
proposed from its own history, and a history unlike the traffic costs little.
"""

from __future__ import annotations

import json
import zipfile
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from specrt.contracts import CORPUS_FILE as FILE
from specrt.errors import UserError, json_problem
from specrt.limits import digits
from specrt.paths import atomic_file
from specrt.prompt_files import is_token_ids, json_lines

from .ngram import tally

GROW_FORMAT = 1  # a growth file (Growth.save): its sequences, not its tables
FORMAT = 2  # 2: pruned, an evidence code per n-gram instead of its counts (1: counts, unpruned)
NMIN, NMAX = 3, 8
# the longest n-gram a corpus may match (``specrt corpus --nmax``; a file's nmax): a lookup step
# hashes and searches nmax - nmin + 1 keys, so a damaged file's nmax of 10**7 took 7 s a
# proposal (10**9: an 8 GB array at load)
NMAX_LIMIT = 64
_P = 1_000_003
_MIX = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
# the first step's evidence -> the key its rounds are learnt under (telemetry's lookup
# "match length": prompt lookup's n is 2..4, a corpus bin 11 and up). SHARES: the top next
# token's share of the n-gram's continuations (an n-gram seen once apart). Binning "share":
# those four (keys 11-14); "fine" (the default): each also split by the match's length
# (n >= LONG) and, seen more than once, by its count (total >= MANY) (keys 20-35). What a
# table keeps per n-gram is its next token and the evidence code of its counts (evidence():
# 2 * share class + many), all a bin needs besides n.
SHARES = ("share>=0.95", "share 0.5-0.95", "share<0.5", "seen once")
BINNINGS = ("fine", "share")
BINS = {name: 11 + i for i, name in enumerate(SHARES)}
FINE_BINS = {f"{name}, n{'>=6' if long else '<6'}" + ("" if i == 3 else f", seen{'>=5' if many else '<5'}"):
             20 + 4 * i + 2 * long + many
             for i, name in enumerate(SHARES) for long in (0, 1) for many in ((0,) if i == 3 else (0, 1))}
LONG, MANY = 6, 5
PRIOR_HOLDOUT = 20  # every 20th sequence measures the priors
# a bin's prior where the held-back answers gave it fewer than 8 first-step tries (as low
# as the weakest bin measured, share<0.5: 0.19, 0.49 on SmolLM2's answers)
DEFAULT_PRIOR = (0.2, 0.5)
PRIOR_POSITIONS = 8
PRIOR_MAX_NEW = 128
# ':grow' keeps the n-grams of the session's latest finished sequences, up to 32,768 tokens
# in all (':grow=N' sets another cap). Measured at the cap, TRAIN chats added in turn: 132
# sequences, 109k n-grams, 18.6 MiB allocated (29 MiB at the peak of a table resize), the
# process's RSS 26 MiB more; at 65,536 tokens: 219k n-grams, 37 MiB, RSS 65 MiB more
GROW_TOKENS = 32768
GROW_OFFSET = 20  # a grown chain's key: its fine bin's + 20 (keys 40-55)
RATE_TRIES = 256.0  # a growth file keeps each position's learnt rate with at most this many tries
# per-key prior rates of ':grow': each held-out answer (of the 80,
# results/corpus/heldout_off.json) measured against a Growth of the answers before it
# (tools/exp_grow.py, results/corpus/grow_priors.json; positions with >= 20 tries, later
# ones take the last); keys with fewer than 40 first-step tries take DEFAULT_PRIOR
GROW_PRIORS: dict[int, tuple[float, ...]] = {
    40: (0.568, 0.337, 0.613),
    42: (0.961, 0.813, 0.818, 0.787, 0.758, 0.783),
    44: (0.1,),
    46: (0.255,),
    48: (0.02,),
    49: (0.154, 0.208),
    51: (0.145,),
    52: (0.393, 0.478, 0.663, 0.655, 0.778, 0.786),
    54: (0.723, 0.792, 0.832, 0.862, 0.864, 0.881),
}


def _savez(f, **arrays: np.ndarray) -> None:
    """np.savez(f, **arrays), its zip closed on an error too: numpy before 2.2 left it to the
    garbage collector, whose close printed a traceback after specrt's one-line error (a full disk)."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, a in arrays.items():
            with z.open(name + ".npy", "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asanyarray(a), allow_pickle=False)


def match_name(key: int) -> str:
    """A lookup round's key in words: prompt lookup's match length n, a corpus bin, or a
    grown one (``:grow``)."""
    names = {v: f"corpus {k}" for k, v in {**BINS, **FINE_BINS}.items()}
    names.update({v + GROW_OFFSET: f"grown {k}" for k, v in FINE_BINS.items()})
    return names.get(key, f"{key}-gram")


def evidence(top: int, total: int) -> int:
    """An n-gram's counts (its top next token's and its total) as the code a bin needs:
    2 * share class (SHARES' order) + 1 where seen more than once and >= MANY times."""
    i = 3 if total < 2 else 0 if top / total >= 0.95 else 1 if top / total >= 0.5 else 2
    return 2 * i + (i != 3 and total >= MANY)


def bin_of(ev: int, n: int = 0, binning: str = "share") -> int:
    """The bin of a first step's evidence code (evidence()) and match length n."""
    i = ev >> 1
    if binning == "share":
        return 11 + i
    return 20 + 4 * i + 2 * (n >= LONG) + (ev & 1)


def bins_of(binning: str) -> dict[str, int]:
    return BINS if binning == "share" else FINE_BINS


def _tables(seqs: Sequence[Sequence[int]], nmin: int, nmax: int, prune: bool = True):
    """Sorted keys (hash of the n-gram, n mixed in) and, per key, the most frequent next
    token (ties: the smallest id) and the evidence code of its counts, over every n-gram
    followed by a token inside one sequence. ``prune`` drops each n-gram (n > nmin) whose
    (n-1)-token suffix has the same next token and code and falls on the same side of
    LONG: a longest-first lookup then finds that suffix (or, pruned in turn, a shorter one
    equal to it), so every chain and first-step bin stays what the full table gives (on
    SmolLM2's 3.0M-token corpus 57% of 6.6M n-grams go). One n at a time, so that the
    temporaries stay a few arrays of the corpus's length (~0.5 GB a 3M-token corpus)."""
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
    parts, prev = [], None  # prev: the n - 1 table, unpruned
    with np.errstate(over="ignore"):
        for n in range(1, nmax + 1):
            m = max(0, len(toks) - n + 1)  # positions with n - 1 tokens before them
            back = np.full(len(toks), -1, dtype=np.int64)  # token n - 1 places back
            back[len(toks) - m:] = toks[:m]
            suffix = h  # the hash of the last n - 1 tokens
            h = h * np.uint64(_P) + (back + 2).astype(np.uint64)
            if n < nmin:
                continue
            same = np.zeros(len(toks), dtype=bool)
            same[len(toks) - m:] = boundary[len(toks) - m:] == boundary[:m]
            ok = same & (back >= 0) & (toks >= 0) & (nxt >= 0)
            key, tok, ev, row = _aggregate(h[ok] * np.uint64(_MIX) + np.uint64(n), nxt[ok])
            table = (key, tok, ev)
            if prune and prev is not None and len(key) and len(prev[0]) and (n >= LONG) == (n - 1 >= LONG):
                suf = suffix[ok][row] * np.uint64(_MIX) + np.uint64(n - 1)
                pk, pt, pe = prev
                j = np.minimum(np.searchsorted(pk, suf), len(pk) - 1)
                keep = ~((pk[j] == suf) & (pt[j] == tok) & (pe[j] == ev))
                key, tok, ev = key[keep], tok[keep], ev[keep]
            parts.append((key, tok, ev))
            prev = table
    key = np.concatenate([q[0] for q in parts]) if parts else np.zeros(0, np.uint64)
    tok = np.concatenate([q[1] for q in parts]) if parts else np.zeros(0, np.int64)
    ev = np.concatenate([q[2] for q in parts]) if parts else np.zeros(0, np.uint8)
    order = np.argsort(key, kind="stable")
    small = not len(tok) or tok.max() < 1 << 16
    return key[order], tok[order].astype(np.uint16 if small else np.int32), ev[order]


def _aggregate(k: np.ndarray, x: np.ndarray):
    """Per distinct key of k (keys, next tokens x): (sorted keys, the most frequent next
    token, ties to the smallest id, the evidence code of its counts, an index into k of
    one occurrence)."""
    if not len(k):
        z = np.zeros(0, np.int64)
        return np.zeros(0, np.uint64), z, np.zeros(0, np.uint8), z
    order = np.lexsort((x, k))
    k, x = k[order], x[order]
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
    share = top / total
    i = np.where(total < 2, 3, np.where(share >= 0.95, 0, np.where(share >= 0.5, 1, 2)))
    ev = (2 * i + ((i != 3) & (total >= MANY))).astype(np.uint8)  # evidence(top, total)
    return rk[kstarts], rx[pick], ev, order[starts[kstarts]]


def _key_list(ctx: Sequence[int], nmin: int, nmax: int) -> list[int]:
    """The mixed keys of the context's last n tokens, n = nmax .. nmin (longest first); 0
    where the context is shorter than n (no key is 0 but by chance). _tables's hash."""
    out, h = [0] * (nmax - nmin + 1), 0
    for j in range(min(nmax, len(ctx))):
        h = (h * _P + int(ctx[-1 - j]) + 2) & _MASK
        n = j + 1
        if n >= nmin:
            out[nmax - n] = (h * _MIX + n) & _MASK
    return out


_LOW = (1 << 32) - 1


# what np.load (allow_pickle=False) and reading the archive's members raise for a file that is
# not ours: empty (EOFError), truncated (BadZipFile), object arrays (ValueError), bad meta
NPZ_ERRORS = (OSError, ValueError, KeyError, UnicodeDecodeError, EOFError, zipfile.BadZipFile)


def _npz_why(e: Exception) -> str:
    """Why a file is not an .npz of ours, in words: numpy's own would advise unpickling it,
    and an empty file's EOFError has none (click took it for an abort)."""
    return "not an .npz archive" if "pickle" in str(e) else str(e) or type(e).__name__


def _npz(path: Path):
    """np.load of an .npz archive, never unpickling; ValueError for a .npy file, whose
    array np.load returns instead (no context manager: a TypeError traceback)."""
    z = np.load(path, allow_pickle=False)
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError("a .npy array, not an .npz archive")
    return z


def _meta(z) -> dict:
    """The JSON object an .npz of this module keeps as its ``meta`` bytes (ValueError else)."""
    meta = json.loads(bytes(z["meta"]).decode())
    if not isinstance(meta, dict):
        raise ValueError("its meta is not a JSON object")
    return meta


def _refuse_other_export(path: Path, meta: dict, export_digest: str | None, made: str, remedy: str) -> None:
    """UserError naming ``path`` when its meta's export digest is another export's."""
    if export_digest is not None and meta.get("export_digest") not in (None, export_digest):
        raise UserError(f"{path}: {made} for another export (digest {str(meta.get('export_digest'))[:12]}, "
                        f"these engines' {export_digest[:12]}); {remedy}")


def _refuse_ids_outside(path: Path, tokens: np.ndarray, vocab_size: int | None) -> None:
    """UserError naming ``path`` when a token id falls outside [0, vocab_size)."""
    if vocab_size is not None and len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise UserError(f"{path}: token ids outside the vocabulary [0, {vocab_size})")


class Growth:
    """``:grow``: per n-gram (n = nmin..nmax) of the latest sequences added (up to
    ``max_tokens`` in all; the newest always), what followed it and how often, under the
    corpus's keys. A key maps to an int packing
    (token << 32 | count) while one token followed it, else to a dict token -> count."""

    def __init__(self, nmin: int = NMIN, nmax: int = NMAX, max_tokens: int = GROW_TOKENS):
        if max_tokens < 1:
            raise UserError(f"growth cap of {max_tokens} tokens: expected >= 1")
        self.nmin, self.nmax, self.max_tokens = nmin, nmax, max_tokens
        self.tokens = 0  # in the sequences held
        self.table: dict[int, int | dict[int, int]] = {}
        self.seqs: deque[list[int]] = deque()
        self.rates: dict[int, tuple[list[float], list[float]]] = {}  # learnt rates a growth file held
        self.added = 0  # sequences added since it was made, loaded or saved (own())

    def __len__(self) -> int:
        return len(self.table)

    def _pairs(self, seq: list[int]):
        """(key, next token) for every n-gram of ``seq`` followed by a token in it."""
        nmin, nmax = self.nmin, self.nmax
        for i in range(nmin - 1, len(seq) - 1):
            h, nxt = 0, seq[i + 1]
            for j in range(min(nmax, i + 1)):
                h = (h * _P + seq[i - j] + 2) & _MASK
                if j + 1 >= nmin:
                    yield (h * _MIX + j + 1) & _MASK, nxt

    def add(self, seq: Sequence[int]) -> None:
        """Count ``seq``'s n-grams; past ``max_tokens`` the oldest sequences' counts go."""
        seq = [int(t) for t in seq]
        if not seq:  # nothing to count, and an empty sequence would never be evicted (tokens 0)
            return
        table = self.table
        for key, nxt in self._pairs(seq):
            v = table.get(key)
            if v is None:
                table[key] = nxt << 32 | 1
            elif isinstance(v, int):
                table[key] = v + 1 if v >> 32 == nxt else {v >> 32: v & _LOW, nxt: 1}
            else:
                v[nxt] = v.get(nxt, 0) + 1
        self.seqs.append(seq)
        self.added += 1
        self.tokens += len(seq)
        while self.tokens > self.max_tokens and len(self.seqs) > 1:
            old = self.seqs.popleft()
            self.tokens -= len(old)
            self._remove(old)

    def own(self) -> list[list[int]]:
        """The sequences added since it was made, loaded or saved that it still holds, oldest first."""
        return list(self.seqs)[len(self.seqs) - min(self.added, len(self.seqs)):]

    def _remove(self, seq: list[int]) -> None:
        table = self.table
        for key, nxt in self._pairs(seq):
            v = table[key]
            if isinstance(v, int):
                if v & _LOW > 1:
                    table[key] = v - 1
                else:
                    del table[key]
            else:
                if v[nxt] > 1:
                    v[nxt] -= 1
                else:
                    del v[nxt]
                if len(v) == 1:
                    (t, c), = v.items()
                    table[key] = t << 32 | c

    def next(self, ctx: Sequence[int]) -> tuple[int, int, int] | None:
        """(token, evidence code, n) of the longest n-gram of ``ctx`` held, or None; as an
        unpruned Corpus.next (ties: the smallest id)."""
        if len(ctx) < self.nmin or not self.table:
            return None
        for n, key in zip(range(self.nmax, self.nmin - 1, -1), _key_list(ctx, self.nmin, self.nmax)):
            v = self.table.get(key) if key else None
            if v is None:
                continue
            if isinstance(v, int):
                return v >> 32, evidence(v & _LOW, v & _LOW), n
            tok = min(v, key=lambda t: (-v[t], t))
            return tok, evidence(v[tok], sum(v.values())), n
        return None

    def propose(self, ctx: Sequence[int], limit: int) -> tuple[list[int], int]:
        """(up to ``limit`` chained tokens, the first step's key: its fine bin + GROW_OFFSET),
        or ([], 0)."""
        out, b = _chain(self.next, ctx, limit, self.nmax)
        return out, (bin_of(*b, binning="fine") + GROW_OFFSET if out else 0)

    def save(self, path: Path, export_digest: str | None = None,
             rates: Mapping[int, tuple[Sequence[float], Sequence[float]]] | None = None) -> None:
        """The sequences held, oldest first (token ids, int32, and their lengths), to an
        .npz file atomically (whole or absent); Growth.load adds them again. ``rates``: the
        lookup policy's learnt (wins, tries) per position of the grown keys, kept beside
        them (each position's tries cut to RATE_TRIES, its rate unchanged) so that the next
        run starts from what this one learnt."""
        seqs = list(self.seqs)
        kept = {}
        for key, (w, t) in (rates or {}).items():
            cut = [min(1.0, RATE_TRIES / tk) if tk > 0 else 1.0 for tk in t]
            kept[str(int(key))] = [[float(wk) * c for wk, c in zip(w, cut)], [float(tk) * c for tk, c in zip(t, cut)]]
        meta = {"format": GROW_FORMAT, "kind": "specrt growth", "nmin": self.nmin, "nmax": self.nmax,
                "export_digest": export_digest, "rates": kept}
        with atomic_file(path) as f:
            _savez(f, tokens=np.array([t for q in seqs for t in q], dtype=np.int32),
                   lengths=np.array([len(q) for q in seqs], dtype=np.int64),
                   meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: Path, vocab_size: int, export_digest: str | None = None,
             max_tokens: int = GROW_TOKENS) -> "Growth":
        """A Growth holding a growth file's sequences (the newest within ``max_tokens``).
        Never unpickles; refuses a file written for another export or with token ids outside
        the vocabulary, naming the file."""
        path = Path(path)
        try:
            with _npz(path) as z:
                meta = _meta(z)
                tokens, lengths = z["tokens"], z["lengths"]
            if meta.get("kind") != "specrt growth":
                raise ValueError("its meta does not say 'specrt growth'")
        except NPZ_ERRORS as e:
            raise UserError(f"{path}: not a growth file ({_npz_why(e)}); `specrt run --grow-file` and Session.save_growth "
                            "write them") from None
        if meta.get("format") != GROW_FORMAT:
            raise UserError(f"{path}: growth file format {meta.get('format')!r}, expected {GROW_FORMAT}")
        _refuse_other_export(path, meta, export_digest, "written", "remove it or give another file")
        if not (tokens.ndim == lengths.ndim == 1 and tokens.dtype.kind in "iu" and lengths.dtype.kind in "iu"
                and (lengths >= 0).all() and int(lengths.sum()) == len(tokens)):
            raise UserError(f"{path}: inconsistent growth arrays (lengths do not add up to the tokens)")
        _refuse_ids_outside(path, tokens, vocab_size)
        nmin, nmax = meta.get("nmin", NMIN), meta.get("nmax", NMAX)
        if not (type(nmin) is type(nmax) is int and 1 <= nmin <= nmax <= NMAX_LIMIT):
            raise UserError(f"{path}: n-gram lengths nmin {nmin!r} / nmax {nmax!r}: expected integers, "
                            f"1 <= nmin <= nmax <= {NMAX_LIMIT}")
        # the tables are made again from the sequences, as add() makes them, with the file's n-gram lengths
        g = cls(nmin, nmax, max_tokens=max_tokens)
        for q in np.split(tokens, np.cumsum(lengths)[:-1]) if len(lengths) else []:
            g.add(q.tolist())  # oldest first: past the cap the oldest go again
        g.rates, grown, rates = {}, set(g.source_priors()), meta.get("rates") or {}
        if not isinstance(rates, dict):
            raise UserError(f"{path}: learnt rates: expected an object of grown key -> [wins, tries]")
        for key, wt in rates.items():
            ok = (isinstance(wt, list) and len(wt) == 2 and all(isinstance(v, list) for v in wt)
                  and len(wt[0]) == len(wt[1]) > 0 and all(isinstance(x, (int, float)) for x in wt[0] + wt[1]))
            if not (ok and digits(str(key)) and int(key) in grown
                    and all(0 <= w <= t for w, t in zip(*wt)) and all(t > 0 for t in wt[1])):
                raise UserError(f"{path}: learnt rates of key {key!r}: expected [wins, tries] per position, "
                                "0 <= wins <= tries, of a grown key")
            g.rates[int(key)] = ([float(x) for x in wt[0]], [float(x) for x in wt[1]])
        g.added = 0  # (the file's own)
        return g

    @staticmethod
    def source_priors() -> dict[int, list[float]]:
        """Every grown key's per-position prior rates (GROW_PRIORS, else DEFAULT_PRIOR)."""
        return {b + GROW_OFFSET: list(GROW_PRIORS.get(b + GROW_OFFSET, DEFAULT_PRIOR)) for b in FINE_BINS.values()}


def _chain(step, ctx: Sequence[int], limit: int, nmax: int) -> tuple[list[int], tuple]:
    """Up to ``limit`` tokens chained greedily by ``step`` (a table's ``next``) from the
    context's end, and the first step's (evidence code, n); ([], ()) when none."""
    if limit < 1:
        return [], ()
    tail = list(ctx[-nmax:])
    first = step(tail)
    if first is None:
        return [], ()
    out = [first[0]]
    while len(out) < limit:
        tail = tail[1:] + [out[-1]] if len(tail) >= nmax else tail + [out[-1]]
        got = step(tail)
        if got is None:
            break
        out.append(got[0])
    return out, first[1:]


class Corpus:
    def __init__(self, keys: np.ndarray, tokens: np.ndarray, ev: np.ndarray, nmin: int = NMIN, nmax: int = NMAX,
                 priors: dict[int, list[float]] | None = None, info: dict | None = None, binning: str = "fine"):
        if binning not in BINNINGS:
            raise UserError(f"corpus binning {binning!r}: expected one of {', '.join(BINNINGS)}")
        self.keys, self.tokens, self.ev = keys, tokens, ev
        self.nmin, self.nmax, self.binning = nmin, nmax, binning
        self.ns = np.arange(nmax, nmin - 1, -1)  # longest first
        self.priors = priors or {}
        self.info = info or {}

    @classmethod
    def build(cls, seqs: Sequence[Sequence[int]], nmin: int = NMIN, nmax: int = NMAX, info: dict | None = None,
              binning: str = "fine", prune: bool = True):
        return cls(*_tables(seqs, nmin, nmax, prune), nmin=nmin, nmax=nmax, info=info, binning=binning)

    def __len__(self) -> int:
        return len(self.keys)

    # ---- lookup ---------------------------------------------------------------------

    def next(self, ctx: Sequence[int]) -> tuple[int, int, int] | None:
        """(token, evidence code, n) of the longest matching n-gram held, or None (pruned:
        an n-gram that was dropped answers through its suffix, same token and bin)."""
        if len(self.keys) == 0 or len(ctx) < self.nmin:
            return None
        q = np.array(_key_list(ctx, self.nmin, self.nmax), dtype=np.uint64)
        j = np.searchsorted(self.keys, q)
        j[j >= len(self.keys)] = 0
        hit = np.flatnonzero(self.keys[j] == q)
        if not len(hit):
            return None
        i, n = int(j[hit[0]]), int(self.ns[hit[0]])
        return int(self.tokens[i]), int(self.ev[i]), n

    def source_priors(self) -> dict[int, list[float]]:
        """Every bin's per-position prior rates (DEFAULT_PRIOR where none was measured)."""
        return {b: list(self.priors.get(b, DEFAULT_PRIOR)) for b in bins_of(self.binning).values()}

    def propose(self, ctx: Sequence[int], limit: int) -> tuple[list[int], int]:
        """(up to ``limit`` chained tokens, the first step's bin key), or ([], 0)."""
        out, b = _chain(self.next, ctx, limit, self.nmax)
        return out, (bin_of(*b, binning=self.binning) if out else 0)

    # ---- priors ---------------------------------------------------------------------

    @staticmethod
    def measure(corpus: "Corpus | Growth", pairs: Iterable[tuple[Sequence[int], Sequence[int]]],
                positions: int = PRIOR_POSITIONS, max_new: int = PRIOR_MAX_NEW) -> dict[int, tuple[list, list]]:
        """Per bin, tries and wins per chain position of ``corpus``'s proposals at every
        position of each (context, answer) pair's answer (its first ``max_new`` tokens):
        wins = the k-th token matched given tokens 1..k-1 did (greedy acceptance). A
        Growth proposes as ``:grow`` does: each pair joins it once measured."""
        stats: dict[int, tuple[list, list]] = {}
        for ctx, answer in pairs:
            answer = list(answer[:max_new])
            ctx = list(ctx)
            for i in range(len(answer)):
                prop, b = corpus.propose(ctx, min(positions, len(answer) - i))
                if prop:
                    tally(prop, answer[i:], *stats.setdefault(b, ([0] * positions, [0] * positions)))
                ctx.append(answer[i])
            if isinstance(corpus, Growth):
                corpus.add(ctx)
        return stats

    # ---- files ----------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Atomically (specrt.paths.atomic_file): whole or absent."""
        meta = {"format": FORMAT, "nmin": self.nmin, "nmax": self.nmax, "binning": self.binning,
                "priors": {str(k): v for k, v in self.priors.items()}, **self.info}
        with atomic_file(path) as f:
            _savez(f, keys=self.keys, tokens=self.tokens, ev=self.ev,
                   meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: Path, vocab_size: int | None = None, export_digest: str | None = None) -> "Corpus":
        """Never unpickles (allow_pickle=False). Refuses a corpus made for another export
        (its digest) or with token ids outside the vocabulary, naming the file."""
        path = Path(path)
        try:
            with _npz(path) as z:
                meta = _meta(z)
                if meta.get("format") == FORMAT:
                    keys, tokens, ev = (z[k] for k in ("keys", "tokens", "ev"))
        except NPZ_ERRORS as e:
            raise UserError(f"{path}: not a corpus file ({_npz_why(e)}); make it with `specrt corpus`") from None
        if meta.get("format") != FORMAT:
            raise UserError(f"{path}: corpus format {meta.get('format')!r}, expected {FORMAT}; make it again "
                            "with `specrt corpus`")
        if not (keys.dtype == np.uint64 and tokens.dtype in (np.uint16, np.int32) and ev.dtype == np.uint8
                and keys.ndim == tokens.ndim == ev.ndim == 1
                and len(keys) == len(tokens) == len(ev) and (not len(ev) or ev.max() <= 6)):
            raise UserError(f"{path}: inconsistent corpus arrays; make it again with `specrt corpus`")
        _refuse_other_export(path, meta, export_digest, "made", "make it again with `specrt corpus`")
        _refuse_ids_outside(path, tokens, vocab_size)
        try:
            priors = {int(k): [float(x) for x in v] for k, v in meta.get("priors", {}).items()}
            nmin, nmax = int(meta["nmin"]), int(meta["nmax"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise UserError(f"{path}: corpus metadata malformed ({type(e).__name__}: {e}); make it again with "
                            "`specrt corpus`") from None
        if not all(v and all(0.0 <= x <= 1.0 for x in v) for v in priors.values()):
            # a bin's rates are read per position (an empty list: IndexError in the first round)
            raise UserError(f"{path}: corpus priors malformed (each bin's a non-empty list of rates in [0, 1]); "
                            "make it again with `specrt corpus`")
        if not 1 <= nmin <= nmax <= NMAX_LIMIT or bool((keys[1:] < keys[:-1]).any()):
            # lookups binary-search the keys: unsorted ones would silently find nothing
            raise UserError(f"{path}: nmin {nmin} / nmax {nmax} or key order inconsistent (1 <= nmin <= nmax <= "
                            f"{NMAX_LIMIT}, keys sorted); make it again with `specrt corpus`")
        info = {k: v for k, v in meta.items() if k not in ("format", "nmin", "nmax", "priors", "binning")}
        return cls(keys, tokens, ev, nmin, nmax, priors, info, str(meta.get("binning", "share")))


def _run_stats(path: Path, export_digest: str | None = None,
               vocab_size: int | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, output_token_ids) of each prompt of a ``specrt run --stats`` file; refused
    when it names another export's digest than ``export_digest`` (other engines' token ids)."""
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # (ValueError: not UTF-8, not JSON, past the digit limit)
        raise UserError(f"{path}: cannot read `specrt run --stats` JSON ({json_problem(e)})") from None
    if not isinstance(stats, dict) or not isinstance(stats.get("prompts"), list):
        raise UserError(f"{path}: expected `specrt run --stats` JSON (an object with a 'prompts' list)")
    _refuse_other_export(path, stats, export_digest, "written by engines", "make the stats with these engines")
    out = []
    for i, r in enumerate(stats["prompts"]):
        ids = r.get("prompt_ids") if isinstance(r, dict) else None
        if not (isinstance(r, dict) and is_token_ids(ids) and is_token_ids(r.get("output_token_ids"))):
            raise UserError(f"{path}: prompts[{i}]: expected prompt_ids and output_token_ids, lists of token ids "
                            "(stats of `specrt run` since session growth; older ones lack prompt_ids)")
        out.append(_in_vocabulary((ids, r["output_token_ids"]), vocab_size, f"{path}: prompts[{i}]"))
    return out


def _in_vocabulary(pair: tuple[list[int], list[int]], vocab_size: int | None,
                   where: str) -> tuple[list[int], list[int]]:
    """``pair``, or a UserError naming ``where`` (its file and line) for a token id outside
    [0, ``vocab_size``) (the corpus of `specrt corpus` named "answer 61 of A, B": neither
    the file nor its line)."""
    bad = next((t for t in pair[0] + pair[1] if not 0 <= t < vocab_size), None) if vocab_size is not None else None
    if bad is not None:
        raise UserError(f"{where}: token id {bad} is outside the vocabulary [0, {vocab_size})")
    return pair


def read_sequences(paths: Sequence[Path], encode=None, export_digest: str | None = None,
                   vocab_size: int | None = None) -> list[tuple[list[int], list[int]]]:
    """(context, answer) token lists from JSON lines (.gz too): ``prompt_ids`` + ``answer_ids``
    (tools/gen_chat_data.py's format), or ``text`` (tokenized by ``encode``; the context
    empty); or from a ``.json`` file that ``specrt run --stats`` wrote (each prompt's
    ``prompt_ids`` and ``output_token_ids``: a deployment's own traffic; refused when written
    by engines of another export than ``export_digest``). Anything else, and a token id
    outside [0, ``vocab_size``), is an error naming the file (and line)."""
    out = []
    for p in paths:
        if Path(p).suffix == ".json":
            out += _run_stats(Path(p), export_digest, vocab_size)
            continue
        for no, r in json_lines(Path(p), "the answers"):
            if isinstance(r, dict) and isinstance(r.get("answer_ids"), list):
                ids = r.get("prompt_ids", [])
                if not (is_token_ids(ids) and is_token_ids(r["answer_ids"])):
                    raise UserError(f"{p}:{no}: prompt_ids / answer_ids must be lists of token ids")
                out.append(_in_vocabulary((ids, r["answer_ids"]), vocab_size, f"{p}:{no}"))
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

"""A predicted output (OpenAI's ``prediction``) as a proposal source for one stream.

A client that expects the answer to repeat a known text (a file being edited) passes that
text; its tokens are proposed beside the draft, prompt lookup and the corpus (ngram.py,
corpus.py), chosen per round by the same lookup policy (ngram.NgramPolicy.choose_rate) under
keys of their own, so their rates are learnt apart from the other sources'. The answer stays
the target's own: each proposed token is a one-hot proposal, chosen from the tokens emitted
so far before the round's randomness is drawn, as a prompt lookup's (lossless under greedy
and sampled verification: verify.py).

Where the proposals come from: the stream's output is followed along the prediction. It
starts aligned with the prediction's start; while the emitted tokens go on matching it, the
next proposal is what follows in the prediction (key IN_STEP). At the first token that
differs the alignment is lost (an edit), and each later round looks the output's last n
tokens (n = NMAX .. NMIN, output only) up in the prediction: the first occurrence at or
after where the alignment was lost (the answer goes through the prediction in order), else
the latest one before it; what follows that occurrence is proposed (key RESYNC_LONG for a
match of LONG tokens or more, RESYNC_SHORT below), and the alignment holds from there while
the emitted tokens match.

Priors: IN_STEP's are high, as a client sends a prediction expecting the answer to repeat
it (a prediction unlike the answer teaches its key low rates within a few rounds: rates
are learnt in hindsight, ngram.NgramPolicy.note); a resync's as prompt lookup's matches of
that length (ngram.PRIORS).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from .ngram import PRIORS

NMAX, NMIN = 6, 2
LONG = 4
# the keys of a prediction's rounds in the lookup policy and the telemetry (prompt lookup's
# are 2..4, a corpus's 11..35, a grown one's 40..55)
IN_STEP, RESYNC_LONG, RESYNC_SHORT = 60, 61, 62
KEYS = (IN_STEP, RESYNC_LONG, RESYNC_SHORT)
SOURCE_PRIORS = {IN_STEP: (0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.97, 0.97),
                 RESYNC_LONG: PRIORS[4], RESYNC_SHORT: PRIORS[2]}


class Prediction:
    """The predicted tokens of one stream whose output starts at ``start`` in the sequence
    ``propose`` is given (the prompt's length)."""

    def __init__(self, tokens: Sequence[int], start: int):
        self.tokens = [int(t) for t in tokens]
        self.start = start
        self.at: int | None = 0  # the prediction's index the output's end is aligned with (None: lost)
        self.lost = 0  # where the alignment was last lost (a resync looks from there on)
        self.seen = start  # the sequence's length at the last update
        self.key = IN_STEP
        # per n: the n-gram -> the positions just after its occurrences, in order
        self._after: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in range(NMIN, NMAX + 1)}
        p = self.tokens
        for n in self._after:
            for i in range(n, len(p) + 1):
                self._after[n].setdefault(tuple(p[i - n : i]), []).append(i)

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def source_priors() -> dict[int, list[float]]:
        return {k: list(v) for k, v in SOURCE_PRIORS.items()}

    def _follow(self, x: Sequence[int]) -> None:
        """The alignment after the tokens ``x`` gained since the last call."""
        p = self.tokens
        for t in x[self.seen:]:
            if self.at is not None and self.at < len(p) and p[self.at] == t:
                self.at += 1
                self.key = IN_STEP  # (a resync's occurrence confirmed)
            elif self.at is not None:
                self.lost, self.at = self.at, None
        self.seen = len(x)

    def _resync(self, x: Sequence[int]) -> None:
        """Align with the occurrence of the output's longest matching tail (module doc)."""
        out = len(x) - self.start
        for n in range(min(NMAX, out), NMIN - 1, -1):
            ends = self._after[n].get(tuple(x[len(x) - n :]))
            if ends:
                j = bisect_left(ends, self.lost)
                self.at = ends[j] if j < len(ends) else ends[-1]
                self.key = RESYNC_LONG if n >= LONG else RESYNC_SHORT
                return

    def propose(self, x: Sequence[int], limit: int) -> tuple[list[int], int]:
        """(up to ``limit`` predicted tokens to follow ``x``, their key), or ([], 0)."""
        self._follow(x)
        if self.at is None:
            self._resync(x)
        if self.at is None or limit < 1 or self.at >= len(self.tokens):
            return [], 0
        return self.tokens[self.at : self.at + limit], self.key


def usage(by_match: dict) -> dict[str, int]:
    """OpenAI's usage counts of a stream's prediction from its telemetry's lookup rounds
    (Telemetry.to_json()["lookup"]["by_match"]): ``accepted_prediction_tokens``, the predicted
    tokens verified and accepted into the answer; ``rejected_prediction_tokens``, those verified
    and not (the target refused one, and the verified ones after it went with it). Predicted
    tokens never verified (a round the draft or another source took; the prediction's part
    past where the answer ended) count in neither: accepted + rejected = the tokens verified."""
    rounds = verified = accepted = 0
    for key in KEYS:
        c = by_match.get(str(key))
        if c:
            rounds, verified, accepted = rounds + c["rounds"], verified + c["verified"], accepted + c["accepted"]
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": verified - accepted,
            "prediction_rounds": rounds}

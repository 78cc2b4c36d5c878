"""Per-run counters (DESIGN.md §6, speculators' perf_utils definitions).

A "draft round" is a round that put d >= 1 draft tokens to the target; a plain decode
step (d = 0) is a round too but drafts nothing. With a rounds' accepted counts a_r and
verified depths d_r over the R draft rounds:

    tau                        = 1 + sum(a_r) / R        mean tokens per draft round (bonus counted)
    acceptance_by_position[i]  = #{a_r >= i} / R                            unconditional (§6), i = 1..
    acceptance_by_verified_position[i] = #{a_r >= i} / #{d_r >= i}          among the rounds verifying i
    acceptance_conditional[i]  = #{a_r >= i} / #{a_r >= i-1 and d_r >= i}   P(accept i | reached i);
                                 None (JSON null) where no round reached position i

so tau = 1 + sum_i acceptance_by_position[i]. At a fixed depth the three agree with §6
(the conditional = pos_i / pos_{i-1}); with a varying depth (adaptive governors, DSpark)
§6's unconditional counts a position a round did not verify as not accepted, and the
per-verified-position figure counts only the rounds that verified it (those a governor
chose to verify deep, so it need not fall with i). With DSpark the block is drafted in full
but only d tokens are verified: "drafted" here means verified. A round a token tree's
runner-up won accepted position 1 (the runner-up) and reached no further: its chain's
later drafts continued the rejected first draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrt.errors import InternalError


@dataclass(frozen=True)
class RoundResult:
    """What one round did; the scheduler builds it, Telemetry and governors consume it."""

    depth: int  # d: draft tokens verified (0 = plain decode step)
    accepted: int  # a, 0 <= a <= d; the round emitted a + 1 tokens
    t_draft: float = 0.0  # seconds in the draft engine this round
    t_verify: float = 0.0  # seconds in the target engine this round
    t_round: float | None = None  # wall seconds of the whole round (engines + Python); None: not measured
    confidences: np.ndarray | None = None  # [K >= d] per position the max of the draft's softmax (governor.py)
    # a token tree: the draft's runners-up for position 1 verified beside the chain, and the
    # one that won position 1 (-1: none; accepted == 1 then, the chain's first draft rejected)
    siblings: int = 0
    sibling: int = -1
    # prompt lookup (ngram.py): the length n of the context's n-gram whose earlier
    # continuation was verified instead of drafts (0: the governor's round)
    lookup: int = 0
    # the draft pass also took in rows of steps it did not draft for (the prompt after
    # prefill, lookup rounds, plain decode steps): a catch-up pass, whose time grows with
    # those rows (SmolLM2's draft: ~0.45 ms a row; the prompt's pass 10-40 ms) and says
    # nothing about what a normal pass costs
    catch_up: bool = False
    # the round's first rejected position went to a token outside the draft's vocabulary (a
    # reduced one, d2t): a token the draft can never propose
    outside_vocab: bool = False
    # the round's tokens were cut at an EOS before its last accepted draft, or at the accepted
    # draft that completed a grammar (structured output; accepted counts what was emitted, the
    # draft ending the answer its + 1): it ended there, not at a rejection
    cut_at_eos: bool = False

    def __post_init__(self):
        if not 0 <= self.accepted <= self.depth:
            raise InternalError(f"round accepted {self.accepted} of {self.depth} drafts")
        if self.siblings < 0 or (self.siblings and not self.depth) or not -1 <= self.sibling < self.siblings:
            raise InternalError(f"round of depth {self.depth} with runner-up {self.sibling} of {self.siblings}")
        if self.lookup and (self.siblings or not self.depth or self.confidences is not None):
            raise InternalError(f"a lookup round of depth {self.depth} with a draft or runners-up")
        if self.sibling >= 0 and self.accepted != 1:
            raise InternalError(f"a runner-up's round accepted {self.accepted}, not 1")
        if self.outside_vocab and not self.rejected:
            raise InternalError(f"a round of depth {self.depth} accepting {self.accepted} with no draft rejected "
                                "marked outside the draft vocabulary")

    @property
    def rejected(self) -> bool:
        """A draft round (not prompt lookup's) that ended at a rejected draft, not on a
        runner-up's win: its next token is the target's correction."""
        return self.accepted < self.depth and not self.lookup and self.sibling < 0 and not self.cut_at_eos

    @property
    def target_depth(self) -> int:
        """The target call's depth: its rows - 1 (drafts and runners-up; 0: a plain decode step)."""
        return self.depth + self.siblings

    @property
    def emitted(self) -> int:
        return self.accepted + 1


class Telemetry:
    def __init__(self):
        self.rounds = 0  # all rounds, plain decode steps included
        self.draft_rounds = 0  # R
        self.drafted = 0  # sum d_r
        self.accepted = 0  # sum a_r
        self.accepted_at: list[int] = []  # [i-1] = #{a_r >= i}
        self.offered_at: list[int] = []  # [i-1] = #{d_r >= i}
        self.reached_at: list[int] = []  # [i-1] = #{a_r >= i-1 and d_r >= i}
        self.depths: dict[int, int] = {}  # d -> rounds
        # drafted block -> rounds (a governor may verify fewer drafts than it drafted: DSpark)
        self.blocks: dict[int, int] = {}
        self.unverified = 0  # sum over drafting rounds of block - d: drafts paid for, never verified
        self.engine_s: dict[str, float] = {"draft": 0.0, "verify": 0.0}
        # seconds summed per verified depth (target engine; whole round, engines + Python) and
        # per drafted block (draft engine): what each depth costs in this run, beside the table
        self.verify_s_by_depth: dict[int, float] = {}
        self.round_s_by_depth: dict[int, float] = {}
        self.draft_s_by_block: dict[int, float] = {}  # catch-up passes left out (RoundResult.catch_up)
        self.timed_blocks: dict[int, int] = {}  # block -> drafting rounds in draft_s_by_block
        self.timed_rounds: dict[int, int] = {}  # d -> rounds that carried a wall time
        self.new_tokens = 0
        self.seconds = 0.0
        # token trees (generate.py tree_width): rounds that verified the draft's runners-up
        # beside the chain, and rounds whose first position a runner-up won
        self.tree_rounds = 0
        self.sibling_accepts = 0
        self.runners_up = 0  # runners-up verified, over all rounds
        self.wins_by_rank: list[int] = []  # [j]: rounds the runner-up of rank j + 2 won
        # the target call's depth (drafts + runners-up; 0: decode) -> rounds: what each
        # round cost, where a governor sizes the tree per round (DSpark)
        self.target_depths: dict[int, int] = {}
        # prompt lookup (ngram.py): its rounds are counted here, not as draft rounds (tau and
        # the acceptance by position stay the draft's); per match length n: rounds, looked-up
        # tokens verified, accepted
        self.lookup_rounds: dict[int, list[int]] = {}
        self.lookup_s = 0.0  # wall seconds of lookup rounds
        self.prompt_tokens = 0
        self.streams = 0  # prompts decoded (1 for one run; merge adds them up)
        self.first_token_s = 0.0  # seconds from a stream's start to its first token, summed over streams
        self.prefix_reused = 0  # prompt rows whose target KV came from the previous prompt (Generator)
        self.lookup_depths: dict[int, int] = {}  # tokens verified -> lookup rounds
        # draft rounds that ended at a rejected draft (RoundResult.rejected), and those of them
        # whose correction lies outside a reduced draft vocabulary (RoundResult.outside_vocab)
        self.rejections = 0
        self.rejections_outside_vocab = 0

    def record(self, r: RoundResult) -> None:
        self.rounds += 1
        if r.lookup:
            c = self.lookup_rounds.setdefault(r.lookup, [0, 0, 0])
            c[0] += 1
            c[1] += r.depth
            c[2] += r.accepted
            self.lookup_depths[r.depth] = self.lookup_depths.get(r.depth, 0) + 1
            self.engine_s["verify"] += r.t_verify
            self.lookup_s += r.t_round or 0.0
            return
        self.depths[r.depth] = self.depths.get(r.depth, 0) + 1
        self.target_depths[r.target_depth] = self.target_depths.get(r.target_depth, 0) + 1
        if r.siblings:
            self.tree_rounds += 1
            self.runners_up += r.siblings
        if r.sibling >= 0:
            self.sibling_accepts += 1
            self.wins_by_rank.extend([0] * (r.sibling + 1 - len(self.wins_by_rank)))
            self.wins_by_rank[r.sibling] += 1
        self.engine_s["draft"] += r.t_draft
        self.engine_s["verify"] += r.t_verify
        self.verify_s_by_depth[r.depth] = self.verify_s_by_depth.get(r.depth, 0.0) + r.t_verify
        if r.t_round is not None:  # (the generator times every round; a caller may not)
            self.round_s_by_depth[r.depth] = self.round_s_by_depth.get(r.depth, 0.0) + r.t_round
            self.timed_rounds[r.depth] = self.timed_rounds.get(r.depth, 0) + 1
        if r.confidences is not None:  # the round ran the draft: its block is what it drafted
            block = len(r.confidences)
            self.blocks[block] = self.blocks.get(block, 0) + 1
            if not r.catch_up:  # a catch-up pass also took in earlier steps' rows: not a block's cost
                self.draft_s_by_block[block] = self.draft_s_by_block.get(block, 0.0) + r.t_draft
                self.timed_blocks[block] = self.timed_blocks.get(block, 0) + 1
            self.unverified += block - r.depth
        if r.depth == 0:
            return
        self.draft_rounds += 1
        self.drafted += r.depth
        self.accepted += r.accepted
        self.rejections += r.rejected
        self.rejections_outside_vocab += r.outside_vocab
        for lst in (self.accepted_at, self.offered_at, self.reached_at):
            lst.extend([0] * (r.depth - len(lst)))
        reach = 1 if r.sibling >= 0 else r.accepted + 1  # a runner-up's win: position 2 was never judged
        for i in range(r.depth):  # position i + 1
            self.offered_at[i] += 1
            self.accepted_at[i] += i < r.accepted
            self.reached_at[i] += i < reach

    def engine_time(self, engine: str, seconds: float) -> None:
        """Time spent outside rounds in an engine, e.g. "prefill"."""
        self.engine_s[engine] = self.engine_s.get(engine, 0.0) + seconds

    def finish(self, new_tokens: int, seconds: float) -> None:
        """Close the run: tokens handed to the caller and wall seconds of the whole generation."""
        self.new_tokens, self.seconds = new_tokens, seconds

    def merge(self, other: "Telemetry") -> None:
        """Add another run's counts (several prompts in one report)."""
        for name in ("rounds", "draft_rounds", "drafted", "accepted", "new_tokens", "seconds", "unverified",
                     "tree_rounds", "sibling_accepts", "runners_up", "prompt_tokens", "prefix_reused", "streams",
                     "first_token_s", "rejections", "rejections_outside_vocab"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.accepted_at, other.accepted_at), (self.offered_at, other.offered_at),
                             (self.reached_at, other.reached_at), (self.wins_by_rank, other.wins_by_rank)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, v in enumerate(theirs):
                mine[i] += v
        for n, c in other.lookup_rounds.items():
            mine = self.lookup_rounds.setdefault(n, [0, 0, 0])
            for i in range(3):
                mine[i] += c[i]
        self.lookup_s += other.lookup_s
        for name in ("depths", "blocks", "engine_s", "verify_s_by_depth", "round_s_by_depth", "draft_s_by_block",
                     "timed_rounds", "timed_blocks", "target_depths", "lookup_depths"):  # keyed counts and sums
            mine = getattr(self, name)
            for k, v in getattr(other, name).items():
                mine[k] = mine.get(k, 0) + v

    @property
    def tau(self) -> float:
        return 1.0 + self.accepted / self.draft_rounds if self.draft_rounds else 1.0

    @property
    def tokens_per_call(self) -> float:
        """Tokens a target call emitted after the prefill, over every round: draft rounds
        (tau's), prompt lookup's and plain decode steps. Where lookup takes the rounds, tau
        (the draft's) says little of the speed and this says it."""
        looked = sum(c[2] for c in self.lookup_rounds.values())
        return (self.rounds + self.accepted + looked) / self.rounds if self.rounds else 0.0

    @property
    def lookup_tokens_per_round(self) -> float:
        r = sum(c[0] for c in self.lookup_rounds.values())
        return 1.0 + sum(c[2] for c in self.lookup_rounds.values()) / r if r else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """DESIGN.md §6: draft rounds whose first i drafts were all accepted / draft rounds."""
        return [a / self.draft_rounds for a in self.accepted_at] if self.draft_rounds else []

    @property
    def acceptance_by_verified_position(self) -> list[float]:
        return [a / o for a, o in zip(self.accepted_at, self.offered_at)]

    @property
    def acceptance_conditional(self) -> list[float | None]:
        return [a / r if r else None for a, r in zip(self.accepted_at, self.reached_at)]

    def time_split(self) -> dict[str, float]:
        """Seconds per engine, plus "python" = wall - engines (scheduling, sampling, copies)."""
        split = dict(self.engine_s)
        split["python"] = max(self.seconds - sum(self.engine_s.values()), 0.0)
        return split

    def mean_seconds(self) -> dict[str, dict[str, float]]:
        """Mean seconds per round by verified depth (target engine; whole round) and per
        drafting round by drafted block (draft engine; catch-up passes left out)."""
        return {"verify_by_depth": {str(d): t / self.depths[d] for d, t in sorted(self.verify_s_by_depth.items())
                                    if self.depths.get(d)},
                "round_by_depth": {str(d): t / self.timed_rounds[d] for d, t in sorted(self.round_s_by_depth.items())
                                   if self.timed_rounds.get(d)},
                "draft_by_block": {str(b): t / self.timed_blocks[b] for b, t in sorted(self.draft_s_by_block.items())
                                   if self.timed_blocks.get(b)}}

    def to_json(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.new_tokens / self.seconds if self.seconds > 0 else 0.0,
            "tau": self.tau,
            "tokens_per_call": self.tokens_per_call,
            "acceptance_by_position": self.acceptance_by_position,
            "acceptance_by_verified_position": self.acceptance_by_verified_position,
            "acceptance_conditional": self.acceptance_conditional,
            "rounds": self.rounds,
            "draft_rounds": self.draft_rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "depth_histogram": {str(d): n for d, n in sorted(self.depths.items())},
            "draft_block_histogram": {str(b): n for b, n in sorted(self.blocks.items())},
            "drafted_unverified": self.unverified,
            # draft rounds ended by a rejected draft, and those whose correction the draft could
            # never have proposed (outside its reduced vocabulary: a draft trained on other text
            # than this run's shows it here)
            "rejections": {"rounds": self.rejections, "outside_draft_vocab": self.rejections_outside_vocab,
                           "outside_share": self.rejections_outside_vocab / self.rejections if self.rejections
                           else 0.0},
            # prompt tokens, and those of them whose target KV a previous prompt's prefill
            # left (Generator.reuse_prefix): not computed again
            "prompt_tokens": self.prompt_tokens,
            "prefix_reused": self.prefix_reused,
            # time to the first token (the prefill and its pick), the mean over the prompts
            "first_token_s": self.first_token_s / self.streams if self.streams else 0.0,
            "prompt_count": self.streams,
            # token trees: rounds with runners-up, their wins (by rank: 2nd, 3rd, ... choice), how
            # many were verified, and each round's target depth (drafts + runners-up)
            "tree": {"rounds": self.tree_rounds, "sibling_accepts": self.sibling_accepts,
                     "runners_up": self.runners_up, "wins_by_rank": list(self.wins_by_rank),
                     "target_depth_histogram": {str(d): n for d, n in sorted(self.target_depths.items())}},
            # prompt lookup: per match length n, rounds / tokens verified / accepted, and the
            # tokens per round of all lookup rounds (the bonus token counted)
            "lookup": {"rounds": sum(c[0] for c in self.lookup_rounds.values()),
                       "tokens_per_round": self.lookup_tokens_per_round, "seconds": self.lookup_s,
                       "depth_histogram": {str(d): n for d, n in sorted(self.lookup_depths.items())},
                       "by_match": {str(n): {"rounds": c[0], "verified": c[1], "accepted": c[2]}
                                    for n, c in sorted(self.lookup_rounds.items())}},
            "time_split": self.time_split(),
            "mean_seconds": self.mean_seconds(),
            # the raw counts behind the ratios above, so that runs can be merged after the fact
            # (Telemetry.from_json); acceptance_by_position[i] = accepted_at[i] / draft_rounds,
            # acceptance_by_verified_position[i] = accepted_at[i] / offered_at[i]
            "counts": {"accepted_at": list(self.accepted_at), "offered_at": list(self.offered_at),
                       "reached_at": list(self.reached_at), "engine_s": dict(self.engine_s),
                       "verify_s_by_depth": {str(k): v for k, v in self.verify_s_by_depth.items()},
                       "round_s_by_depth": {str(k): v for k, v in self.round_s_by_depth.items()},
                       "draft_s_by_block": {str(k): v for k, v in self.draft_s_by_block.items()},
                       "timed_rounds": {str(k): v for k, v in self.timed_rounds.items()},
                       "timed_blocks": {str(k): v for k, v in self.timed_blocks.items()}},
        }

    @classmethod
    def from_json(cls, d: dict) -> "Telemetry":
        """The Telemetry whose ``to_json`` gave ``d`` (which must carry its ``counts``)."""
        t = cls()
        for name in ("rounds", "draft_rounds", "drafted", "accepted", "new_tokens"):
            setattr(t, name, int(d[name]))
        t.seconds = float(d["seconds"])
        c = d["counts"]
        t.accepted_at, t.offered_at, t.reached_at = (list(map(int, c[k])) for k in
                                                     ("accepted_at", "offered_at", "reached_at"))
        t.engine_s = {k: float(v) for k, v in c["engine_s"].items()}
        t.depths = {int(k): int(v) for k, v in d["depth_histogram"].items()}
        # absent from reports written before these were recorded
        t.blocks = {int(k): int(v) for k, v in d.get("draft_block_histogram", {}).items()}
        t.unverified = int(d.get("drafted_unverified", 0))
        rej = d.get("rejections", {})
        t.rejections, t.rejections_outside_vocab = int(rej.get("rounds", 0)), int(rej.get("outside_draft_vocab", 0))
        t.prompt_tokens, t.prefix_reused = int(d.get("prompt_tokens", 0)), int(d.get("prefix_reused", 0))
        t.streams = int(d.get("prompt_count", 0))
        t.first_token_s = float(d.get("first_token_s", 0.0)) * t.streams
        tree = d.get("tree", {})
        t.tree_rounds, t.sibling_accepts = int(tree.get("rounds", 0)), int(tree.get("sibling_accepts", 0))
        t.runners_up, t.wins_by_rank = int(tree.get("runners_up", 0)), list(map(int, tree.get("wins_by_rank", [])))
        t.target_depths = {int(k): int(v) for k, v in tree.get("target_depth_histogram", {}).items()}
        for name in ("verify_s_by_depth", "round_s_by_depth", "draft_s_by_block"):
            setattr(t, name, {int(k): float(v) for k, v in c.get(name, {}).items()})
        t.timed_rounds = {int(k): int(v) for k, v in c.get("timed_rounds", {}).items()}
        # reports written before catch-up passes were left out timed every drafting round
        t.timed_blocks = {int(k): int(v) for k, v in c.get("timed_blocks", d.get("draft_block_histogram", {})).items()}
        lk = d.get("lookup", {})
        t.lookup_rounds = {int(n): [int(c["rounds"]), int(c["verified"]), int(c["accepted"])]
                           for n, c in lk.get("by_match", {}).items()}
        t.lookup_s = float(lk.get("seconds", 0.0))
        t.lookup_depths = {int(k): int(v) for k, v in lk.get("depth_histogram", {}).items()}
        return t

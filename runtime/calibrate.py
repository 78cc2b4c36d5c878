"""``specrt calibrate``: fit the DSpark governor's confidence -> acceptance map (DESIGN.md §5).

    report = calibrate("ENGINES", prompts, chat=True, max_new_tokens=128, holdout=0.25)

1. Every prompt is decoded (greedily, or sampled with the given ``SamplingParams``: one
   calibration per decoding mode) with the full block drafted *and verified* each round
   (FixedGovernor at the largest built depth K, capped near the token budget as usual), so
   each round shows the draft's confidence at every position 1..d and how many of the
   drafts the target accepted (a).
2. Samples for the conditional map: positions k = 1..min(a+1, d) were *reached*; the first
   a of them were accepted (the (a+1)-th was rejected unless a = d).
3. The prompts are split (deterministically) into a training and a held-out part;
   ``Calibration.fit`` (histogram, isotonic or temperature scaling, chosen by 2-fold ECE with each prompt's
   rounds in one fold) runs on the training rounds. On the held-out rounds the report
   gives, per position k, the expected calibration error (runtime.governor.ece, 10 bins) of
       conditional acceptance  c_k = map_k(conf_k)      vs accepted | reached k
       survival                S_k = prod_{j<=k} c_j     vs the first k drafts all accepted
   before (identity map: the raw draft confidence) and after calibration, and the AUC of
   each (runtime.governor.auc): how well it ranks rounds by outcome. ECE can be small while
   AUC is near 0.5 (right on average, no help choosing a depth round by round).
   On engines that verify token trees every round also verifies the draft's first
   RUNNER_UPS runners-up for position 1 (``:tree=RUNNER_UPS + 1``): how often each rank
   wins a round whose first draft was rejected, in this decoding mode, is stored with the
   calibration (``Calibration.runner_ups``; DSpark's starting rates for ``:tree=W``). A
   round a runner-up won counts as the first draft rejected in the samples above.
4. ``ENGINES/calibration.json`` is written atomically (temp file + os.replace) holding,
   under the decoding mode's key, the calibration fitted on the training prompts (the one
   the held-out numbers describe), next to the other modes' calibrations for the same
   engines, and the engines' export digest, which ``session.load_calibration`` checks.

Online refinement happens at run time (DSparkGovernor.observe -> Calibration.update).
No torch, no transformers: engines and numpy only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from specrt.errors import UserError
from specrt.paths import check_path_args, folder_lock as _folder_lock, write_atomic
from specrt.prompt_files import CONVERSATION, check_each, conversation_problem

from .governor import Calibration, FixedGovernor, auc, ece
from .sampling import SamplingParams
from .session import CALIBRATION_FILE, Session, UnreadableFile, prior_from, read_calibration_file
from .telemetry import RoundResult, Telemetry

FILE_FORMAT = "specrt.calibration-file/2"  # {"export_digest", "modes": {SamplingParams.mode: entry}}
SPLIT_SEED = 0
ECE_BINS = 10

Round = tuple[np.ndarray, int, int]  # (confidences [K], verified depth d, accepted a)


RUNNER_UPS = 3  # runners-up per round when the engines verify token trees (ranks 2..4)


class RecordingGovernor(FixedGovernor):
    """FixedGovernor at depth k that keeps every verified round's (confidences, d, a), a the
    drafts the chain accepted (0 when a runner-up won), and with a token tree (``tree_width``
    W > 1) per runner-up rank the (wins, tries) of rounds whose first draft was rejected."""

    def __init__(self, depths: Sequence[int], k: int, tree_width: int = 1):
        super().__init__(depths, k)
        self.tree_width = tree_width
        self.rounds: list[Round] = []
        self.wins, self.tries = [0] * (tree_width - 1), [0] * (tree_width - 1)

    def observe(self, r: RoundResult) -> None:
        if r.depth > 0 and r.confidences is not None:
            a = 0 if r.sibling >= 0 else int(r.accepted)
            self.rounds.append((np.asarray(r.confidences, np.float64).copy(), int(r.depth), a))
            if a == 0:
                for j in range(r.siblings):
                    self.tries[j] += 1
                    self.wins[j] += r.sibling == j


def conditional_samples(rounds: Sequence[Round]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(confidence, 0-based position, accepted) for every reached position of every round."""
    conf, pos, acc = [], [], []
    for c, d, a in rounds:
        reach = min(a + 1, d)
        conf.extend(c[:reach].tolist())
        pos.extend(range(reach))
        acc.extend(k < a for k in range(reach))
    return np.asarray(conf, np.float64), np.asarray(pos, np.int64), np.asarray(acc, np.float64)


def _per_position(pred: list[list[float]], obs: list[list[float]]) -> dict:
    """ECE and AUC per position (None where no sample, or for AUC one class only), pooled ECE,
    counts, mean predicted / observed."""
    out = {"ece": [], "auc": [], "n": [], "predicted": [], "observed": []}
    for p, o in zip(pred, obs):
        n = len(p)
        out["n"].append(n)
        out["ece"].append(ece(np.asarray(p), np.asarray(o), ECE_BINS) if n else None)
        out["auc"].append(auc(np.asarray(p), np.asarray(o)) if n else None)
        out["predicted"].append(float(np.mean(p)) if n else None)
        out["observed"].append(float(np.mean(o)) if n else None)
    allp = np.concatenate([np.asarray(p, float) for p in pred]) if pred else np.zeros(0)
    allo = np.concatenate([np.asarray(o, float) for o in obs]) if obs else np.zeros(0)
    out["ece_all"] = ece(allp, allo, ECE_BINS)
    return out


def evaluate(rounds: Sequence[Round], cmap: Callable[[np.ndarray], Sequence[float]], depth: int) -> dict:
    """Per-position calibration of ``cmap`` (confidences [d] -> conditional acceptance [d]) on
    ``rounds``: conditional acceptance on reached positions, survival on every verified one."""
    cp, co = [[] for _ in range(depth)], [[] for _ in range(depth)]
    sp, so = [[] for _ in range(depth)], [[] for _ in range(depth)]
    for c, d, a in rounds:
        cond = np.clip(np.asarray(cmap(c[:d]), np.float64), 0.0, 1.0)
        surv = np.cumprod(cond)
        for k in range(min(d, depth)):
            if k <= a:  # reached position k + 1
                cp[k].append(cond[k])
                co[k].append(float(k < a))
            sp[k].append(surv[k])
            so[k].append(float(a > k))
    return {"conditional": _per_position(cp, co), "survival": _per_position(sp, so)}


def chain_acceptance(rounds: Sequence[Round]) -> dict:
    """tau (1 + mean accepted), and acceptance per position, unconditional (a >= k among
    all rounds: DESIGN.md §6's, `--stats`' acceptance_by_position for chains, so tau - 1 is
    their sum; a token tree's runner-up win counts 0 accepted here, the chain's first draft
    rejected, where `--stats` counts its token;
    it was among the rounds verifying k, which the last rounds of an answer, cut short,
    made another figure under the same name: a review, session 56) and conditional (among
    those reaching k), of recorded rounds."""
    K = max((d for _, d, _ in rounds), default=0)
    acc, reach = np.zeros(K), np.zeros(K)
    for _, d, a in rounds:
        acc[:a] += 1
        reach[: min(a + 1, d)] += 1
    return {"tau": 1.0 + (sum(a for _, _, a in rounds) / len(rounds) if rounds else 0.0),
            "acceptance_by_position": (acc / max(len(rounds), 1)).tolist(),
            "acceptance_conditional": (acc / np.maximum(reach, 1)).tolist()}


def split_prompts(n: int, holdout: float, holdout_text: str | None = None) -> tuple[list[int], list[int]]:
    """(train, held-out) prompt indices: a fixed-seed shuffle, so prompt files grouped by
    kind still give a mixed held-out part. holdout = 0: everything trains. ``holdout_text``:
    how an error names ``holdout`` (`specrt calibrate`'s --holdout as typed)."""
    said = holdout if holdout_text is None else holdout_text
    if not 0.0 <= holdout < 1.0:
        raise UserError(f"--holdout {said}: expected a fraction in [0, 1)")
    if holdout == 0.0:
        return list(range(n)), []
    if n < 2:
        raise UserError(f"--holdout {said} needs at least 2 prompts (got {n}); or pass --holdout 0")
    k = min(max(int(round(holdout * n)), 1), n - 1)
    perm = np.random.default_rng(SPLIT_SEED).permutation(n)
    return sorted(perm[k:].tolist()), sorted(perm[:k].tolist())


def _encode(session: Session, prompt, chat: bool, max_new_tokens: int) -> list[int]:
    """A prompt's token ids, refused as a stream would refuse them (empty, past the context,
    an id outside the vocabulary), before anything decodes."""
    # (a conversation with a bad message too: encode names it, where this said "expected text or ids")
    if isinstance(prompt, str) or conversation_problem(prompt) != CONVERSATION:
        if session.text is None:
            raise UserError(f"{session.engines.export_dir}: no tokenizer.json; give token ids ('prompt_ids') instead of text")
        ids = session.encode(prompt, chat, check_length=lambda n, least: session.generator.check_length(
            n, max_new_tokens, None, least))  # (surely past the context: refused before it is tokenized)
    else:
        ids = prompt  # (checked as a stream checks them: int() took 1.7 as 1, "12" as 12 and True as 1)
    return session.generator.check_args(ids, max_new_tokens, session.eos, None, None)[0]


def calibrate(engines_dir: str | Path, prompts: Sequence[str | Sequence[int]], chat: bool = False,
              max_new_tokens: int = 128, holdout: float = 0.25, log: Callable[[str], None] = lambda s: None,
              *, write: bool = True, holdout_prompts: Sequence[str | Sequence[int]] | None = None,
              sampling: SamplingParams = SamplingParams(), chat_template_kwargs: dict | None = None,
              labels: Sequence[str] | None = None, holdout_text: str | None = None) -> dict:
    """Collect rounds, fit on the training prompts, evaluate on the held-out ones, store.

    ``sampling``: the decoding mode to calibrate for (greedy by default; a temperature > 0
    decodes by rejection sampling, where acceptance is lower and the map differs). The
    file keeps one calibration per mode (``SamplingParams.mode``): writing one mode keeps
    the others fitted for the same engines.

    ``prompts``: texts (tokenised with the export's tokenizer, chat template when ``chat``)
    or token-id lists (``chat_template_kwargs``: the template's variables). ``holdout_prompts``: a separate held-out set (then every prompt of
    ``prompts`` trains and ``holdout`` is ignored); otherwise a ``holdout`` fraction of
    ``prompts`` is held out. Every prompt is checked before any decodes, an error naming it
    by ``labels`` (one per prompt of ``prompts``, then of ``holdout_prompts``: `specrt
    calibrate`'s FILE:LINE), else "prompt N" / "held-out prompt N"; ``holdout_text``: how they name
    ``holdout`` (the CLI's --holdout as typed). Returns the report (see the module docstring);
    ``report["file"]`` is the calibration written (``write=False``: nothing written)."""
    check_path_args("a folder", engines_dir=engines_dir)  # Path('') is the working folder
    engines_dir = Path(engines_dir)
    prompts = list(prompts)
    if not prompts:
        raise UserError("no prompts to calibrate on")
    if max_new_tokens < 3:
        raise UserError(f"--max-new-tokens {max_new_tokens}: expected >= 3 (the prefill makes the first token, and "
                        "a draft round needs the next two)")
    names = [f"prompt {i + 1}" for i in range(len(prompts))]
    split_problem: UserError | None = None
    if holdout_prompts is not None:
        extra = list(holdout_prompts)
        if not extra:
            raise UserError("the held-out prompt set is empty")
        train_idx, hold_idx = list(range(len(prompts))), list(range(len(prompts), len(prompts) + len(extra)))
        prompts += extra
        names += [f"held-out prompt {j + 1}" for j in range(len(extra))]
    else:
        try:
            train_idx, hold_idx = split_prompts(len(prompts), holdout, holdout_text)
        except UserError as e:  # one prompt under a --holdout: said once the prompts are checked, with their own
            if len(prompts) > 1 or not 0.0 <= holdout < 1.0:  # problems (a prompt past the context was said only on
                raise  # the next try, after --holdout 0: session 71's calibrate walk, 7)
            split_problem, train_idx, hold_idx = e, [0], []
    if labels is not None:
        names = [str(x) for x in labels]
        if len(names) != len(prompts):
            raise UserError(f"labels: {len(names)} given for {len(prompts)} prompts")

    with Session(engines_dir, governor="off", sampling=sampling, chat_template_kwargs=chat_template_kwargs) as s:
        if s.engines.export.get("draft") is None:
            raise UserError(f"{engines_dir}: the engines have no draft; there is nothing to calibrate")
        depths = s.engines.depths
        K = depths[-1]
        digest = s.engines.manifest["export"]["digest"]
        engines = s.engines
        s.chat_option = "--chat"  # (said in `specrt calibrate`'s terms, as its other errors)
        try:  # every one before the first decodes (a bad line 9 cost 8 prompts' work)
            ids = check_each(prompts, lambda p: _encode(s, p, chat, max_new_tokens), names)
        except UserError as e:
            if split_problem is None:
                raise
            raise UserError(f"{e}. Also: {split_problem}") from None
        if split_problem is not None:
            raise split_problem
        if sampling.greedy:  # (a walk, session 71: 6 identical prompts, "held-out" ECE 0.025 on the training rounds)
            seen = {tuple(ids[j]) for j in train_idx}
            same = [names[i] for i in hold_idx if tuple(ids[i]) in seen]
            if same:  # (all of them were said as "2 of the 2 ... measured in part on the training rounds": h73a)
                k, h = len(same), len(hold_idx)
                who = (f"{k} of the {h} held-out prompts {'repeats' if k == 1 else 'repeat'}" if k < h
                       else "the held-out prompt repeats" if h == 1 else f"all {h} held-out prompts repeat")
                log(f"note: {who} a training prompt (" + ", ".join(same[:3]) + (", ..." if k > 3 else "")
                    + "): greedy decoding repeats its rounds, so the held-out ECE is measured "
                    + ("in part " if k < h else "") + "on the training rounds")
        per_prompt: list[list[Round]] = []
        per_prompt_ranks: list[tuple[list[int], list[int]]] = []
        endings: list[str | None] = []  # how each answer ended (Finished.reason)
        width = RUNNER_UPS + 1 if s.engines.verifies_trees() else 1
        total = Telemetry()
        t0 = time.perf_counter()
        held = set(hold_idx)
        for i, p in enumerate(ids):
            gov = RecordingGovernor(depths, K, width)
            s.generator.governor = gov
            for _ in s.stream_ids(p, max_new_tokens):
                pass
            tel = s.generator.telemetry
            total.merge(tel)
            per_prompt.append(gov.rounds)
            per_prompt_ranks.append((gov.wins, gov.tries))
            endings.append(s.generator.finished.reason if s.generator.finished else None)
            # (as run's closing line: "tau 1.00" where no round ran read as a draft accepting nothing)
            r = len(gov.rounds)
            rounds = f"{r} round{'s' * (r != 1)}, tau {tel.tau:.2f}" if tel.draft_rounds else "no draft rounds"
            cut = "; the answer reached the engines' context" if endings[-1] == "context" else ""  # (not said)
            # which prompt (`specrt calibrate`'s FILE:LINE) and whether held out: "prompt 5/6" alone named
            # neither (h73a)
            which = ([names[i]] if labels is not None else []) + (["held out"] if i in held else [])
            which_said = f" ({', '.join(which)})" if which else ""
            log(f"prompt {i + 1}/{len(ids)}{which_said}: {tel.new_tokens} token{'s' * (tel.new_tokens != 1)}, "
                f"{rounds}{cut}")
        seconds = time.perf_counter() - t0

    train = [r for i in train_idx for r in per_prompt[i]]
    hold = [r for i in hold_idx for r in per_prompt[i]]
    if not train:
        raise no_rounds("training", endings, train_idx, "give longer generations (--max-new-tokens) or more prompts")
    # samples per training prompt, and the prompt each came from: cross-validation folds
    # keep a prompt's rounds together (train is non-empty, so train_idx is too)
    per = [conditional_samples(per_prompt[i]) for i in train_idx]
    conf, pos, acc = (np.concatenate([p[j] for p in per]) for j in range(3))
    groups = np.concatenate([np.full(p[0].size, j, np.int64) for j, p in enumerate(per)])
    cal = Calibration.fit(conf, pos, acc, positions=K, groups=groups)
    runner_ups = None
    if width > 1:  # the training prompts' runner-up counts, per rank
        w, t = (np.sum([per_prompt_ranks[i][j] for i in train_idx], axis=0).tolist() for j in (0, 1))
        cal.runner_ups = runner_ups = ([float(x) for x in w], [float(x) for x in t])
    # (held-out prompts that ran no round are an error, not a silent fall back to the training rounds)
    eval_rounds, evaluated_on = (hold, "holdout") if hold_idx else (train, "train")
    if not eval_rounds:
        raise no_rounds("held-out", endings, hold_idx, "give other held-out prompts or longer generations"
                        if holdout_prompts is not None else "use a smaller --holdout or longer generations")
    before = evaluate(eval_rounds, lambda c: c, K)
    after = evaluate(eval_rounds, cal, K)
    # what a run in this mode would start from without this fit: another mode's calibration
    # of these engines, as a prior (session.load_calibration)
    path = engines_dir / CALIBRATION_FILE
    modes: dict[str, dict] = {}
    replacing = False  # said unusable here: replaced when written, even if unreadable then
    if path.is_file():
        try:
            modes = read_calibration_file(path, digest) or {}
        except UserError as e:
            log(f"{path.name} is not usable ({e}); it will be replaced")
            replacing = True
    others = {m: e for m, e in modes.items() if m != sampling.mode}
    other_mode = None
    if others:
        near, prior = prior_from(others, sampling)
        o = evaluate(eval_rounds, prior, K)
        other_mode = {"mode": near, **{which: {"ece": o[which]["ece"], "ece_all": o[which]["ece_all"],
                                               "predicted": o[which]["predicted"]} for which in o}}
    ece_rep = {which: {"before": before[which]["ece"], "after": after[which]["ece"],
                       "before_all": before[which]["ece_all"], "after_all": after[which]["ece_all"],
                       "auc_before": before[which]["auc"], "auc_after": after[which]["auc"],
                       "n": before[which]["n"], "observed": before[which]["observed"],
                       "predicted_before": before[which]["predicted"], "predicted_after": after[which]["predicted"]}
               for which in ("conditional", "survival")}
    n_hold_samples = int(sum(min(a + 1, d) for _, d, a in hold))
    report = {
        "engines": str(engines_dir),
        "export_digest": digest,
        "mode": sampling.mode,
        "sampling": None if sampling.greedy else sampling.as_dict(),
        "depth": K,
        "depths": list(depths),
        "kind": cal.kind,
        "cv_ece": {k: float(v) for k, v in cal.cv_ece.items()},
        "cv_by_position": cal.cv_by_position,
        "temperatures": cal.temperatures,  # per position, when the kind is "temperature"
        "prompts": {"train": len(train_idx), "holdout": len(hold_idx),
                    "holdout_source": "separate set" if holdout_prompts is not None else f"{holdout:g} of the prompts"},
        "rounds": {"train": len(train), "holdout": len(hold)},
        "samples": {"train": int(conf.size), "holdout": n_hold_samples},
        "evaluated_on": evaluated_on,
        "ece": ece_rep,
        "ece_bins": ECE_BINS,
        "max_new_tokens": max_new_tokens,
        "chat": bool(chat),
        "new_tokens": total.new_tokens,
        "seconds": seconds,
        # the chain's (a runner-up's win counts as the first draft rejected), every prompt
        **chain_acceptance([r for rs in per_prompt for r in rs]),
        "runner_ups": None if runner_ups is None else {
            "ranks": list(range(2, width + 1)), "wins": runner_ups[0], "tries": runner_ups[1],
            "rates": [wi / ti if ti else None for wi, ti in zip(*runner_ups)]},
        "other_mode": other_mode,
        "file": None,
    }
    note = worse_fit_note(ece_rep["survival"], evaluated_on, len(train))
    if note:
        log(note)
    if write:
        entry = {"sampling": report["sampling"], "rounds": len(train), "depth": K, "draft_weights": engines.draft_weights,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "prompts": len(train_idx), "max_new_tokens": max_new_tokens, "chat": bool(chat),
                 "calibration": cal.to_dict(),
                 "heldout_ece": {w: {"before_all": ece_rep[w]["before_all"], "after_all": ece_rep[w]["after_all"]}
                                 for w in ece_rep}, "evaluated_on": evaluated_on}
        try:
            # read again and written under a lock on the folder: another calibrate (another
            # mode) may have written since this one read the file, its mode then lost
            with _folder_lock(engines_dir):
                try:  # (removed since the read above: none kept)
                    modes = (read_calibration_file(path, digest) or {}) if path.is_file() else {}
                except UnreadableFile as e:  # (what it holds unknown: other modes, lost if replaced unseen)
                    if not replacing:
                        raise UserError(f"{e} when read again to write it; not written") from None
                    modes = {}
                except UserError:
                    modes = {}  # (said when read above, or broken since: replaced)
                others = {m: e for m, e in modes.items() if m != sampling.mode}
                kept = sorted(others)  # the other modes' calibrations of these engines stay
                kept_entries = {m: {**e, "calibration": e["calibration"].to_dict()} for m, e in others.items()}
                engines.check_still_here(path.name)
                write_atomic(path, {"format": FILE_FORMAT, "export_digest": digest,
                                    "modes": {**kept_entries, sampling.mode: entry}})
        except OSError as e:
            raise UserError(f"{path}: cannot write the calibration ({e.strerror or e})") from None
        report["file"] = str(path)
        was = modes.get(sampling.mode)  # (replaced without a word: a fit of 8 rounds over one of 51)
        log(f"wrote {path} ({sampling.mode}: {KIND_WORDS[cal.kind]}, {len(train)} round{'s' * (len(train) != 1)}"
            + (f"; kept {', '.join(kept)}" if kept else "")
            + (f"; it replaces the {sampling.mode} calibration of {was.get('rounds', '?')} rounds made "
               f"{was.get('created', 'earlier')}" if was else "") + ")")
    return report


def no_rounds(which: str, endings: Sequence[str | None], idx: Sequence[int], hint: str) -> UserError:
    """The error for prompts ``idx`` that ran no draft round, saying how many answers ended at
    EOS or the context, where more --max-new-tokens changes nothing (that was its only advice
    for answers whose first token was EOS; and --holdout's, ignored beside --holdout-prompts)."""
    said = {"eos": "the end-of-sequence token", "context": "the engines' context"}
    parts = [f"{n} at {said[why]}" for why in said if (n := sum(endings[i] == why for i in idx))]
    if all(endings[i] in said for i in idx):
        hint = "give prompts whose answers go on (more --max-new-tokens does not change where these end)"
    each = f"each of {len(idx)} answers" if len(idx) > 1 else "its answer"
    return UserError(f"no draft rounds in the {which} prompts ({each} ended before a round could run"
                     + (f", {', '.join(parts)}" if parts else "") + f"): {hint}")


def worse_fit_note(survival: dict, evaluated_on: str, rounds: int) -> str | None:
    """A note when the fit's survival ECE (``survival``: the report's entry) is worse than the
    draft's own confidences' on the rounds it was measured on (it was stored without a word:
    0.172 -> 0.204 on two training prompts)."""
    before, after = survival.get("before_all"), survival.get("after_all")
    # (compared as said, to 3 places: "(0.000) is worse than ... (0.000)" on engines that accept everything)
    if before is None or after is None or round(after, 3) <= round(before, 3):
        return None
    return (f"note: fitted on {rounds} rounds, the calibration's survival ECE on the {evaluated_on} rounds "
            f"({after:.3f}) is worse than the draft's own confidences' ({before:.3f}): calibrate on more prompts or "
            "longer answers")


# Calibration.KINDS in words, as the report and the log say them
KIND_WORDS = {"histogram": "histogram binning", "isotonic": "isotonic regression", "temperature": "temperature scaling"}


def format_report(r: dict) -> str:
    """A per-position table of the report, for the command line."""
    def f(v):
        return "   -  " if v is None else f"{v:6.3f}"

    def n(k, noun):
        return f"{k} {noun}{'s' * (k != 1)}"

    c, s = r["ece"]["conditional"], r["ece"]["survival"]
    ev = r["evaluated_on"]  # "holdout" or "train": the counts of the rounds the ECE is measured on
    every = r["prompts"]["train"] + r["prompts"]["holdout"]
    # (it said "calibration (temperature, greedy)", the kind read as a sampling temperature; "evaluated on train"
    # without a word that the fit's own rounds measure it; "1 prompts": a walk, h73a)
    lines = [f"calibration by {KIND_WORDS.get(r['kind'], r['kind'])} for {r.get('mode', 'greedy')} decoding, fitted on "
             f"{n(r['prompts']['train'], 'prompt')} / {n(r['rounds']['train'], 'round')}; evaluated on "
             + ("the held-out prompts" if ev == "holdout" else "the training prompts, in-sample")
             + f" ({n(r['prompts'][ev], 'prompt')}, {n(r['rounds'][ev], 'round')}); depth {r['depth']}, chain tau "
             f"{r['tau']:.2f} over {'all ' * (every != 1)}{n(every, 'prompt')} (a token tree's runner-up wins not "
             "counted)",
             "  pos |  n reach  accept  ECE c before  after  AUC c | n verif  surviv  ECE S before  after  AUC S"]
    for k in range(r["depth"]):
        lines.append(f"  {k + 1:3d} | {c['n'][k]:7d}  {f(c['observed'][k])}        {f(c['before'][k])} {f(c['after'][k])}"
                     f" {f(c['auc_before'][k])} | {s['n'][k]:7d}  {f(s['observed'][k])}        {f(s['before'][k])}"
                     f" {f(s['after'][k])} {f(s['auc_after'][k])}")
    lines.append(f"  all |                        {f(c['before_all'])} {f(c['after_all'])}        |"
                 f"                        {f(s['before_all'])} {f(s['after_all'])}")
    if r.get("cv_ece"):
        temps = r.get("temperatures")
        lines.append("  kind chosen by 2-fold held-out ECE: " + ", ".join(f"{k} {v:.4f}" for k, v in r["cv_ece"].items())
                     + ("" if not temps else "; temperature by position " + " ".join(f"{t:.2f}" for t in temps[:r["depth"]])))
    om = r.get("other_mode")
    if om:
        lines.append(f"  without this fit a run in this mode starts from the {om['mode']} calibration (as a prior): "
                     f"ECE c {f(om['conditional']['ece_all']).strip()}, S {f(om['survival']['ece_all']).strip()} "
                     f"on the same rounds; by position c " + " ".join(f(v).strip() for v in om["conditional"]["ece"]))
    ru = r.get("runner_ups")
    if ru:
        lines.append("  token trees: when the first draft is rejected, the runner-up of rank "
                     + ", ".join(f"{k} wins {f(v).strip()} ({int(t)} rounds)" for k, v, t in
                                 zip(ru["ranks"], ru["rates"], ru["tries"])))
    lines.append("  (AUC c: the raw confidence ranking reached positions by acceptance; AUC S: the calibrated "
                 "survival ranking verified rounds by reaching past the position; 0.5 = no better than chance)")
    return "\n".join(lines)

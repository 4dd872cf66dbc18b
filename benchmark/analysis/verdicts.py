"""Reproduction verdicts: did we reproduce the published score of the same algorithm on the task?

For each configuration (algorithm, environment, hyperparameters, budget) with finished seeds,
the algorithm's own published score is chosen from ``results/reference/scores.csv``: a
comparable one first (below), then one measured over several seeds (a final evaluation or
training returns over >= 3 seeds before a single trained agent: the tiers that choose the
normalization reference), then like protocol (a final evaluation, as ours; then training
returns; then values read off plots; the maximum over training last), then the closest budget,
then the same env version, then more seeds. The verdict:

- **reproduced**: the published mean is consistent with our seeds at level ``ALPHA``:
  - the source gives a spread over seeds (n >= 2): Welch's t-test from both means, standard
    deviations and seed counts, two-sided;
  - the source is one trained agent, or a mean over k seeds without a spread: the 95%
    prediction interval for the mean of k new runs drawn like ours,
    ``mean ± t(0.975, n-1) · s · sqrt(1/n + 1/k)``, holds the published value;
- **above** / **below**: the test rejects, and our mean is above / below the published one;
- **not comparable**: the budget differs more than ``BUDGET_RATIO`` times (or the source does
  not state it), the source reports
  the maximum over training (optimistic by construction), the env version changed the reward
  (Ant and Humanoid: contact costs; CartPole: the episode cap), or we have fewer than 2 seeds:
  the reason is said;
- **no published score**: no source has this algorithm on this task.

Like is compared with like: against a source that reports returns of training episodes, our
score is the mean return of the training episodes of the last evaluation interval of each seed
(when the runs recorded them), not the final deterministic evaluation.

A verdict of "reproduced" means "not distinguishable at this number of seeds": with 3-5 seeds
only large differences are detectable, which is why the test and both seed counts are shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmark.analysis import reference
from benchmark.analysis.records import RunRecord
from benchmark.analysis.reference import ReferenceScore

ALPHA = 0.05
BUDGET_RATIO = 2.0
"""A published budget more than this many times ours (or less than 1/this) is not comparable."""
PROTOCOL_ORDER = ("final_eval", "training_return", "approx_plot", "max_eval")
SAME_REWARD_ACROSS_VERSIONS = frozenset(
    {"HalfCheetah", "Hopper", "Walker2d", "Swimmer", "InvertedPendulum", "Reacher", "Pendulum", "Acrobot", "MountainCar", "MountainCarContinuous"}
)
"""Tasks whose reward and episode length are the same in every version the sources ran (gym
v1-v4) and the one we run; for others (Ant, Humanoid: contact costs changed in v4/v5; CartPole:
200 steps in v0, 500 in v1) a different version is not comparable."""
VERDICTS = ("reproduced", "above", "below", "not comparable", "no published score")


@dataclass(frozen=True)
class Ours:
    mean: float
    std: float
    """Sample standard deviation over seeds (ddof=1; 0 for one seed)."""
    n: int


@dataclass(frozen=True)
class Verdict:
    label: str
    """The configuration (algorithm, and what sets it apart)."""
    algo: str
    env_id: str
    budget_steps: int
    verdict: str
    ours: Ours | None
    published: ReferenceScore | None
    test: str = ""
    """The test made and its outcome, e.g. 'Welch t-test p = 0.41' or '95% PI of 3 runs [a, b]'."""
    reason: str = ""
    """Why not comparable, or what to bear in mind (env version, protocol, approximate value)."""


def _spread_over_seeds(score: ReferenceScore) -> float | None:
    """The published standard deviation over seeds (ddof=1), when the source gives one."""
    if score.spread is None or score.n_seeds is None or score.n_seeds < 2:
        return None
    text = score.spread_kind.lower()
    if "episode" in text or "ci" in text.split() or "[low, high]" in text:
        return None
    if "ddof=0" in text:
        return score.spread * math.sqrt(score.n_seeds / (score.n_seeds - 1))
    return score.spread


def choose_published(algo: str, env_id: str, budget_steps: int, scores: tuple[ReferenceScore, ...]) -> ReferenceScore | None:
    """The algorithm's published score most comparable with ours (see the module docstring)."""
    family, version = reference.env_family(env_id), reference.env_version(env_id)
    candidates = [s for s in scores if s.env == family and s.algorithm == algo and s.protocol in PROTOCOL_ORDER]
    if not candidates:
        return None

    def rank(score: ReferenceScore) -> tuple:
        budget_gap = abs(math.log(score.budget_steps / budget_steps)) if score.budget_steps else math.inf
        measured = score.protocol in ("final_eval", "training_return")
        tier = (0 if score.multi_seed else 1) if measured else 2
        return (
            bool(not_comparable_reason(budget_steps, env_id, score)),
            tier,
            PROTOCOL_ORDER.index(score.protocol),
            budget_gap,
            score.env_version != version,
            -(score.n_seeds or 0),
            score.approximate,
        )

    return min(candidates, key=rank)


def not_comparable_reason(ours_budget: int, env_id: str, published: ReferenceScore) -> str:
    """Why ours and ``published`` cannot be compared ('' when they can)."""
    reasons = []
    if published.protocol == "max_eval":
        reasons.append("the source reports the maximum over training, optimistic by construction")
    if not published.budget_steps:
        reasons.append("budget: the source does not state it")
    else:
        ratio = published.budget_steps / ours_budget
        if ratio > BUDGET_RATIO or ratio < 1 / BUDGET_RATIO:
            reasons.append(f"budget: {ours_budget:,} steps here, {published.budget_steps:,} in the source")
    family, version = reference.env_family(env_id), reference.env_version(env_id)
    if published.env_version and version and published.env_version != version and family not in SAME_REWARD_ACROSS_VERSIONS:
        reasons.append(f"env version: {family}-{version} here, {family}-{published.env_version} in the source (the reward or episode cap differ)")
    return "; ".join(reasons)


def judge(
    scores: np.ndarray,
    budget_steps: int,
    env_id: str,
    published: ReferenceScore | None,
    label: str = "",
    algo: str = "",
    measure: str = "",
    env_changed: str = "",
) -> Verdict:
    """The verdict for our scores (one per seed) against one published score; ``measure`` says
    what our scores are when they are not the final evaluation; ``env_changed`` describes the
    env where a suite made it with env_kwargs or wrappers (then no source ran the same task)."""
    scores = np.asarray(scores, dtype=float)
    ours = Ours(float(np.mean(scores)), float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0, len(scores)) if len(scores) else None
    base: dict[str, Any] = dict(label=label or algo, algo=algo, env_id=env_id, budget_steps=budget_steps, ours=ours, published=published)
    if published is None:
        return Verdict(verdict="no published score", reason="no source in results/reference/scores.csv has this algorithm on this task", **base)
    reason = not_comparable_reason(budget_steps, env_id, published)
    if env_changed:
        reason = "; ".join(filter(None, [f"env: {env_changed} here, made as registered in the source", reason]))
    if ours is None or ours.n < 2:
        reason = "; ".join(filter(None, [reason, f"{ours.n if ours else 0} finished seed(s) here: at least 2 are needed"]))
    if reason:
        return Verdict(verdict="not comparable", reason=reason, **base)
    assert ours is not None  # no seeds set a reason above
    notes = [measure] if measure else []
    if published.env_version and published.env_version != reference.env_version(env_id):
        notes.append(f"source ran {reference.env_family(env_id)}-{published.env_version}")
    if published.protocol == "training_return" and not measure:
        notes.append("source: returns of training episodes; ours: final evaluation (no training returns recorded)")
    elif published.protocol == "approx_plot":
        notes.append("source: read off a plot")
    if published.approximate and published.protocol != "approx_plot":
        notes.append("source value approximate")
    from scipy import stats as scipy_stats  # 2 s of imports, wanted only once a score is comparable

    spread = _spread_over_seeds(published)
    if spread is not None:
        test_name = "Welch t-test"
        if ours.std == 0 and spread == 0:
            p_value = 1.0 if ours.mean == published.mean else 0.0
        else:
            p_value = float(scipy_stats.ttest_ind_from_stats(ours.mean, ours.std, ours.n, published.mean, spread, published.n_seeds, equal_var=False).pvalue)
        consistent = p_value >= ALPHA
        test = f"{test_name}, p = {p_value:.2g} (ours {ours.n} seeds, source {published.n_seeds} seeds ± {spread:.1f})"
    else:
        k = published.n_seeds or 1
        half = float(scipy_stats.t.ppf(1 - ALPHA / 2, ours.n - 1)) * ours.std * math.sqrt(1 / ours.n + 1 / k)
        low, high = ours.mean - half, ours.mean + half
        consistent = low <= published.mean <= high
        test = (
            f"{100 * (1 - ALPHA):.0f}% prediction interval of {'one run' if k == 1 else f'the mean of {k} runs'} from {ours.n} seeds: [{low:.1f}, {high:.1f}]"
        )
    verdict = "reproduced" if consistent else ("above" if ours.mean > published.mean else "below")
    return Verdict(verdict=verdict, test=test, reason="; ".join(notes), **base)


def suite_verdicts(groups: list, scores_table: tuple[ReferenceScore, ...] | None = None) -> list[Verdict]:
    """One verdict per configuration group (``benchmark.analysis.report.Group``)."""
    scores_table = reference.load_scores() if scores_table is None else scores_table
    verdicts = []
    for group in groups:
        records: list[RunRecord] = group.records
        finished = [r for r in records if r.finished]
        verdicts.append(
            verdict_for(
                group.algo,
                group.env_id,
                records[0].spec.budget.total_steps,
                [r.final_return for r in finished if r.final_return is not None],  # all of them: finished runs have one
                [r.final_train_return for r in finished],
                group.label,
                scores_table,
                "" if records[0].spec.env.plain else records[0].spec.env.describe(),
            )
        )
    return verdicts


def verdict_for(
    algo: str,
    env_id: str,
    budget_steps: int,
    finals: list[float],
    trains: list[float | None],
    label: str = "",
    scores_table: tuple[ReferenceScore, ...] | None = None,
    env_changed: str = "",
) -> Verdict:
    """The verdict of one configuration from its seeds' final evaluations and training returns
    (of the last evaluation interval; None where a run did not record them); ``env_changed`` as
    for ``judge``."""
    scores_table = reference.load_scores() if scores_table is None else scores_table
    published = choose_published(algo, env_id, budget_steps, scores_table)
    scores, measure = np.array(finals, dtype=float), ""
    if published is not None and published.protocol == "training_return" and trains and None not in trains:
        scores, measure = np.array(trains, dtype=float), "ours: training episodes of the last evaluation interval, as the source"
    return judge(scores, budget_steps, env_id, published, label or algo, algo, measure, env_changed)


def ours_text(verdict: Verdict) -> str:
    ours = verdict.ours
    return "—" if ours is None else f"{ours.mean:.1f} ± {ours.std:.1f} ({ours.n} seeds)"


def published_text(verdict: Verdict) -> str:
    return verdict.published.citation if verdict.published else "—"

"""The verdict rule: one comparison of our seeds against a reference, decided by a margin stated
before looking and by a difference test corrected across the table it belongs to.

Every table that judges (``verdicts``, the report, ``record``, ``compare``, ``parity``,
``regress``) goes through ``decide``. For each row, d = mean(ours) - mean(reference) with
Welch's standard error and degrees of freedom (Welch-Satterthwaite), and a margin ``m`` fixed in
advance (``Margin``: by default 0.2 in normalized units, random = 0 and the task's normalizer
reference = 1):

- **reproduced**: the 90% interval of d lies inside (-m, m) (both one-sided tests of Schuirmann's
  TOST reject at 5%) and no difference is shown.
- **above** / **below**: Welch's two-sided test rejects at ``ALPHA`` after Holm's correction over
  every tested row of the table; ``margin_position`` says where the 90% interval lies: wholly
  past the margin ("beyond"), wholly inside it ("within": equivalent at that margin, yet
  different) or across it ("perhaps within").
- **inconclusive**: neither. ``seeds_needed`` is the seed count per side (ours only, where the
  reference is a published source that cannot grow) at which, with the observed spreads and the
  observed difference taken as true, one of the two decisions has 80% power (Colas et al.,
  2018): equivalence when |d| < m, else the difference at Holm's first level (alpha / rows).
- A reference that is **one trained agent** (or a mean over k runs with no spread) has no
  spread of its own: ours stands for both (the prediction interval of k new runs,
  ``mean ± t · s · sqrt(1/n + 1/k)``). Against one agent the row can never be "reproduced",
  whatever our seed count: it is "consistent with one agent" or "outside one agent's interval"
  (Holm-corrected like the rest; the interval shown is the 95% one the test uses).
- **Success rates** (tasks whose return is capped: CartPole, InvertedPendulum): when both sides
  are seeds marked as successes or not, d is the difference of success rates, its 90% interval
  Newcombe's hybrid score interval, the test Fisher's exact test, and the margin an absolute
  difference of rates (default 0.2).

"Not comparable" (budget, env version, protocol, too few seeds) is decided by the caller before
a row reaches the rule; such rows carry no evidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from benchmark.analysis import power, stats
from benchmark.tables import plural

ALPHA = 0.05
"""Level of the difference test (after Holm) and of each one-sided test of TOST (a 90% interval)."""
POWER = 0.8
DEFAULT_MARGIN = 0.2
"""In normalized units (random 0, the task's normalizer reference 1), or a difference of success rates."""
MAX_SEEDS = 1_000
"""Seeds-needed searches stop here: beyond it a row is 'inconclusive (needs more than 1,000)'."""

REPRODUCED = "reproduced"
ABOVE = "above"
BELOW = "below"
INCONCLUSIVE = "inconclusive"
NOT_COMPARABLE = "not comparable"
NO_REFERENCE = "no published score"
ONE_AGENT_CONSISTENT = "consistent with one agent"
ONE_AGENT_OUTSIDE = "outside one agent's interval"
LABELS = (REPRODUCED, ABOVE, BELOW, INCONCLUSIVE, ONE_AGENT_CONSISTENT, ONE_AGENT_OUTSIDE, NOT_COMPARABLE, NO_REFERENCE)


@dataclass(frozen=True)
class Sample:
    """One side's scores: per seed, or what a published source gives instead."""

    mean: float
    sd: float | None
    """Standard deviation over seeds (ddof=1); None when the source gives none."""
    n: int
    """Seeds (a source's runs: 1 for one trained agent)."""
    values: tuple[float, ...] | None = None
    successes: tuple[bool, ...] | None = None
    """Per seed, whether it reached the task's success threshold (capped tasks only)."""

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray, successes: Sequence[bool] | None = None) -> Sample:
        runs = np.asarray(values, dtype=float)
        if runs.ndim != 1 or runs.size == 0 or not np.all(np.isfinite(runs)):
            raise ValueError(f"a sample needs finite per-seed scores, got {runs.tolist()!r}")
        if successes is not None and len(successes) != runs.size:
            raise ValueError(f"successes: {len(successes)} flags for {runs.size} scores")
        sd = float(np.std(runs, ddof=1)) if runs.size > 1 else 0.0
        return cls(float(runs.mean()), sd, int(runs.size), tuple(map(float, runs)), None if successes is None else tuple(map(bool, successes)))

    @classmethod
    def summary(cls, mean: float, sd: float | None, n: int) -> Sample:
        """A source's mean over ``n`` runs, with their standard deviation (ddof=1) when it gives one."""
        if n < 1:
            raise ValueError(f"a summary needs at least one run, got n = {n}")
        return cls(float(mean), None if sd is None or n < 2 else float(sd), int(n))

    @property
    def one_agent(self) -> bool:
        return self.n == 1 and self.values is None

    @property
    def has_spread(self) -> bool:
        return self.sd is not None and self.n >= 2

    @property
    def rate(self) -> float | None:
        return None if self.successes is None else sum(self.successes) / len(self.successes)


@dataclass(frozen=True)
class Margin:
    """The equivalence margin: ``normalized`` units of ``scale`` score units each."""

    normalized: float = DEFAULT_MARGIN
    scale: float = 1.0
    """Score units per normalized unit: the task's reference - random, or what ``basis`` says."""
    basis: str = "normalized units"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.normalized) and self.normalized > 0):
            raise ValueError(f"the margin must be a positive number, got {self.normalized!r}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"the margin's scale must be a positive number, got {self.scale!r}")

    @property
    def absolute(self) -> float:
        return self.normalized * self.scale

    def text(self) -> str:
        """'±0.2 normalized (±674)', '±0.2 of the success rate', or '±20% of the reference's mean (±88)'."""
        if self.basis == "success rate":
            return f"±{self.normalized:g} of the success rate"
        if self.basis == "normalized units":
            return f"±{self.normalized:g} normalized" + ("" if self.scale == 1.0 else f" (±{_number(self.absolute)})")
        return f"±{self.normalized:g} × {self.basis} (±{_number(self.absolute)})"

    @classmethod
    def for_rates(cls, normalized: float = DEFAULT_MARGIN) -> Margin:
        return cls(normalized, 1.0, "success rate")


@dataclass(frozen=True)
class Evidence:
    """One row's comparison before the table's correction."""

    difference: float
    """mean(ours) - mean(reference), in score units (or a difference of success rates)."""
    low: float
    high: float
    """The 90% interval of the difference (the TOST interval); against one agent, the 95%
    prediction interval its test decides with."""
    p_value: float
    """Two-sided: the difference test (or, against one agent, whether it lies outside our prediction interval)."""
    se: float
    df: float
    test: str
    """The tests made, in words: 'Welch's t-test', 'prediction interval of one run', ..."""
    one_agent: bool = False
    rate: bool = False


@dataclass
class Decision:
    """One row's verdict under the rule."""

    label: str
    evidence: Evidence | None
    margin: Margin | None
    significant: bool = False
    """The difference test rejected after Holm's correction over the table."""
    adjusted_p: float | None = None
    """The p-value adjusted by Holm's method over the table (significant: at most alpha)."""
    margin_position: str = ""
    """Above or below: 'beyond' (the 90% interval wholly past the margin), 'within' (wholly inside
    it) or 'perhaps within' (across it)."""
    searched_to: int = 0
    """Inconclusive without a seed count: the largest count tried."""
    seeds_needed: int | None = None
    """Inconclusive: seeds per side (or ours, against a fixed reference) for a decision at 80% power."""
    needed_for: str = ""
    """'equivalence' or 'a difference', or why no seed count would decide."""
    family: int = 0
    """Rows tested in the table (Holm's family)."""
    reference_fixed: bool = True
    """The reference cannot grow (a published source): seeds_needed counts ours only."""
    notes: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The label as tables print it: 'inconclusive (needs 14)', 'below, beyond the margin'."""
        if self.label == INCONCLUSIVE:
            if self.seeds_needed is not None:
                return f"{INCONCLUSIVE} (needs {self.seeds_needed:,})"
            return f"{INCONCLUSIVE} (needs more than {self.searched_to or MAX_SEEDS:,})" if self.needed_for == "" else f"{INCONCLUSIVE} (no seed count decides)"
        if self.label in (ABOVE, BELOW):
            return f"{self.label}, {self.margin_position} the margin"
        return self.label

    @property
    def beyond_margin(self) -> bool:
        return self.margin_position == "beyond"

    def explanation(self) -> str:
        """The tests and their figures in one line (what the row's 'test' column shows)."""
        evidence, margin = self.evidence, self.margin
        if evidence is None or margin is None:
            return "; ".join(self.notes)
        holm = f" (Holm-adjusted {_p(self.adjusted_p, bare=True)} over {self.family} rows)" if self.family > 1 and self.adjusted_p is not None else ""
        interval = "95% PI" if evidence.one_agent else ("90% PI" if evidence.test.startswith("prediction interval") else "90% CI")
        parts = [
            f"{evidence.test}: difference {_signed(evidence.difference, evidence.rate)} [{interval} {_signed(evidence.low, evidence.rate)}, "
            f"{_signed(evidence.high, evidence.rate)}], {_p(evidence.p_value)}{holm}; margin {margin.text()}"
        ]
        if self.label == INCONCLUSIVE:
            if self.seeds_needed is not None:
                whose = "of ours" if self.reference_fixed else "per side"
                parts.append(f"{self.seeds_needed:,} seeds {whose} would show {self.needed_for} with 80% power at the observed spread")
            elif self.needed_for:
                parts.append(self.needed_for)
        return "; ".join(parts + self.notes)


# ------------------------------------------------------------------------------------ evidence


def evidence(ours: Sample, reference: Sample) -> Evidence:
    """The difference, its 90% interval and the two-sided p-value of ``ours`` against ``reference``.

    Ours needs per-seed values (n >= 2). The reference's spread: its own where it has one
    (Welch), else ours stands for it (a mean of k runs, or one agent: the prediction interval)."""
    if ours.n < 2 or ours.sd is None:
        raise ValueError(f"our side needs at least 2 seeds, got {ours.n}")
    if ours.successes is not None and reference.successes is not None:
        return _rate_evidence(ours, reference)
    from scipy import stats as scipy_stats

    difference = ours.mean - reference.mean
    if reference.has_spread:
        assert reference.sd is not None
        a, b = ours.sd**2 / ours.n, reference.sd**2 / reference.n
        se, df = math.sqrt(a + b), welch_df(a, b, ours.n, reference.n)
        test = "Welch's t-test"
    else:
        se = ours.sd * math.sqrt(1 / ours.n + 1 / reference.n)
        df = float(ours.n - 1)
        test = (
            "prediction interval of one run" if reference.n == 1 else f"prediction interval of a mean of {reference.n} runs (the source's spread taken as ours)"
        )
    if se == 0.0:
        p_value = 1.0 if difference == 0 else 0.0
        return Evidence(difference, difference, difference, p_value, 0.0, df, test, one_agent=reference.one_agent)
    level = 1 - ALPHA / 2 if reference.one_agent else 1 - ALPHA  # one agent: the test's own 95% interval
    half = float(scipy_stats.t.ppf(level, df)) * se
    p_value = float(2 * scipy_stats.t.sf(abs(difference) / se, df))
    return Evidence(difference, difference - half, difference + half, p_value, se, df, test, one_agent=reference.one_agent)


def welch_df(a: float, b: float, n_a: int, n_b: int) -> float:
    """Welch-Satterthwaite degrees of freedom of two variances of the mean ``a``, ``b`` (n_a + n_b - 2
    where they vanish)."""
    denominator = a * a / (n_a - 1) + b * b / (n_b - 1)
    return (a + b) ** 2 / denominator if denominator > 0 else float(n_a + n_b - 2)


def _rate_evidence(ours: Sample, reference: Sample) -> Evidence:
    from scipy import stats as scipy_stats

    assert ours.successes is not None and reference.successes is not None
    k1, n1 = sum(ours.successes), len(ours.successes)
    k2, n2 = sum(reference.successes), len(reference.successes)
    low, high = newcombe_interval(k1, n1, k2, n2, 1 - 2 * ALPHA)
    p_value = float(scipy_stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue)
    p1, p2 = k1 / n1, k2 / n2
    se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    return Evidence(p1 - p2, low, high, min(p_value, 1.0), se, math.inf, "success rates: Fisher's exact test, Newcombe's interval", rate=True)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a proportion ``successes / n``."""
    from scipy import stats as scipy_stats

    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    z = float(scipy_stats.norm.ppf(0.5 + confidence / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_interval(k1: int, n1: int, k2: int, n2: int, confidence: float = 0.9) -> tuple[float, float]:
    """Newcombe's hybrid score interval of p1 - p2 (his method 10, from two Wilson intervals)."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, confidence)
    l2, u2 = wilson_interval(k2, n2, confidence)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


# ------------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Row:
    """One row to decide: our sample, the reference's, the margin; ``reason`` set when not comparable."""

    ours: Sample | None
    reference: Sample | None
    margin: Margin | None
    reason: str = ""
    reference_fixed: bool = True
    """The reference cannot gain seeds (a published source); parity and compare grow both sides."""


def decide(rows: Sequence[Row], alpha: float = ALPHA) -> list[Decision]:
    """Every row's decision, Holm's correction made over the rows that were tested."""
    evidences: list[Evidence | None] = []
    for row in rows:
        comparable = not row.reason and row.ours is not None and row.reference is not None and row.margin is not None and row.ours.n >= 2
        evidences.append(evidence(row.ours, row.reference) if comparable else None)  # type: ignore[arg-type]
    tested = [index for index, found in enumerate(evidences) if found is not None]
    adjusted = dict(zip(tested, stats.holm_adjusted([evidences[i].p_value for i in tested]))) if tested else {}  # type: ignore[union-attr]
    decisions = []
    for index, (row, found) in enumerate(zip(rows, evidences)):
        if found is None:
            reason = row.reason
            if not reason and row.reference is not None and (row.ours is None or row.ours.n < 2):
                reason = f"{row.ours.n if row.ours else 0} finished {plural(row.ours.n if row.ours else 0, 'seed')} here: at least 2 are needed"
            label = NO_REFERENCE if row.reference is None and not reason else NOT_COMPARABLE
            decisions.append(Decision(label, None, row.margin, notes=[reason] if reason else []))
            continue
        assert row.margin is not None and row.ours is not None and row.reference is not None
        decision = _decision(row, found, adjusted[index] <= alpha, len(tested), alpha)
        decision.adjusted_p = adjusted[index]
        decisions.append(decision)
    return decisions


def _decision(row: Row, found: Evidence, significant: bool, family: int, alpha: float) -> Decision:
    assert row.margin is not None and row.ours is not None and row.reference is not None
    m = row.margin.absolute
    inside = -m < found.low and found.high < m
    decision = Decision(INCONCLUSIVE, found, row.margin, significant, family=family, reference_fixed=row.reference_fixed)
    if found.one_agent:
        decision.label = ONE_AGENT_OUTSIDE if significant else ONE_AGENT_CONSISTENT
        decision.notes.append("one trained agent: equivalence cannot be shown against it, whatever our seed count")
        return decision
    if significant:
        decision.label = ABOVE if found.difference > 0 else BELOW
        beyond = found.low > m if found.difference > 0 else found.high < -m
        decision.margin_position = "beyond" if beyond else ("within" if inside else "perhaps within")
        return decision
    if inside:
        decision.label = REPRODUCED
        return decision
    decision.seeds_needed, decision.needed_for, decision.searched_to = seeds_needed(row, found, family, alpha)
    return decision


# ------------------------------------------------------------------------------------ planning


def seeds_needed(row: Row, found: Evidence, family: int, alpha: float = ALPHA) -> tuple[int | None, str, int]:
    """The first seed count per side (ours only when the reference is fixed) at which equivalence
    (|d| < m) or the difference (at Holm's first level, alpha / family) would be shown with
    ``POWER``, taking the observed difference and spreads as true; (None, why, the largest count
    tried) when none would ('' for why: none up to that count). The counts are scanned in order:
    against a fixed source the power need not grow with our seeds (Welch's degrees of freedom
    fall towards the source's)."""
    assert row.ours is not None and row.reference is not None and row.margin is not None
    if found.rate:
        return _rate_seeds_needed(row, found, family, alpha)
    m, d = row.margin.absolute, found.difference
    counts = np.arange(row.ours.n + 1, MAX_SEEDS + 1)
    n_reference = np.full(counts.shape, row.reference.n) if row.reference_fixed else np.maximum(counts, row.reference.n)
    se, df = _se(row.ours, row.reference, counts, n_reference)
    equivalence = (abs(d) < m) & (power.tost_power(d, m, se, df, alpha) >= POWER)
    difference = (d != 0) & (power.difference_power(d, se, df, alpha / max(family, 1)) >= POWER)
    decided = np.flatnonzero(equivalence | difference)
    if decided.size:
        first = decided[0]
        return int(counts[first]), "equivalence" if equivalence[first] else "a difference", int(counts[-1])
    if row.reference_fixed and row.reference.has_spread:
        floor = row.reference.sd / math.sqrt(row.reference.n)  # type: ignore[operator]
        reason = (
            f"no seed count of ours decides: the source's own standard error ({_number(floor)} over its "
            f"{row.reference.n} seeds) is too wide for the margin at this difference"
        )
        return None, reason, int(counts[-1])
    return None, "", int(counts[-1])


MAX_RATE_SEEDS = 300
"""Success rates: the exact search stops here (it enumerates every outcome of both sides)."""


def _rate_seeds_needed(row: Row, found: Evidence, family: int, alpha: float) -> tuple[int | None, str, int]:
    """Success rates, both sides with n seeds: equivalence's power exactly (every pair of outcomes
    weighed by its binomial probability, Newcombe's 90% interval inside the margin); the
    difference's by the normal approximation at Holm's first level."""
    from scipy import stats as scipy_stats

    assert row.ours is not None and row.reference is not None and row.margin is not None
    p1, p2, m = row.ours.rate or 0.0, row.reference.rate or 0.0, row.margin.absolute
    critical = float(scipy_stats.norm.ppf(1 - alpha / max(family, 1) / 2))
    start = max(row.ours.n, row.reference.n) + 1
    for n in range(start, MAX_RATE_SEEDS + 1):
        if abs(p1 - p2) < m and power.rate_equivalence_power(p1, p2, n, m) >= POWER:
            return n, "equivalence", n
        se = math.sqrt((p1 * (1 - p1) + p2 * (1 - p2)) / n)
        if p1 != p2 and se > 0 and float(scipy_stats.norm.sf(critical - abs(p1 - p2) / se)) >= POWER:
            return n, "a difference", n
    return None, "", MAX_RATE_SEEDS


def _se(ours: Sample, reference: Sample, n: np.ndarray, n_reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The standard error of the difference and its degrees of freedom at n seeds of ours
    (arrays: one per count)."""
    assert ours.sd is not None
    if reference.has_spread:
        assert reference.sd is not None
        a, b = ours.sd**2 / n, reference.sd**2 / n_reference
        denominator = a * a / (n - 1) + b * b / (n_reference - 1)
        df = np.where(denominator > 0, (a + b) ** 2 / np.where(denominator > 0, denominator, 1.0), n + n_reference - 2.0)
        return np.sqrt(a + b), df
    return ours.sd * np.sqrt(1 / n + 1 / n_reference), (n - 1).astype(float)


# ------------------------------------------------------------------------------------ text


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


def _signed(value: float, rate: bool = False) -> str:
    return f"{value:+.2f}" if rate else ("+" if value > 0 else "") + _number(value)


def _p(value: float, bare: bool = False) -> str:
    if bare:
        return "< 0.001" if value < 0.001 else f"{value:.2g}"
    return "p < 0.001" if value < 0.001 else f"p = {value:.2g}"

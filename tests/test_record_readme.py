"""The README's compact record: each verdict's mark, one footnote per source numbered in order of
first use, the value the verdict compared, and 'not comparable' said in a word or two."""

from types import SimpleNamespace

from benchmark.analysis import record_readme, scores, verdict_rule
from benchmark.analysis.reference import ReferenceScore


def _published(source: str, seeds: int | None, version: str, budget: int | None = 1_000_000, mean: float = 1000.0) -> ReferenceScore:
    return ReferenceScore(source, "", "ppo", "Hopper-" + version, budget, "mean", mean, 10.0, seeds, "gym", version, "PPO", "final_eval", False)


def _row(verdict: str, published: ReferenceScore | None, score: str = scores.FINAL, reason: str = "", label: str | None = None):
    decision = SimpleNamespace(label=label or verdict, text=label or verdict, seeds_needed=34, needed_for="", searched_to=300, margin_position="within")
    judged = SimpleNamespace(verdict=verdict, decision=decision, text=decision.text, published=published, reference_sample=None, reason=reason, score=score)
    return SimpleNamespace(verdict=judged, steps=1_000_000)


def test_every_verdict_has_its_mark():
    assert record_readme.verdict_text(_row(verdict_rule.REPRODUCED, None)) == "✓ reproduced"
    assert record_readme.verdict_text(_row(verdict_rule.INCONCLUSIVE, None)) == "? needs 34 seeds"
    assert record_readme.verdict_text(_row(verdict_rule.ABOVE, None)) == "↑ above, within margin"
    assert record_readme.verdict_text(_row(verdict_rule.ONE_AGENT_CONSISTENT, None)) == "≈ consistent (1 agent)"
    not_comparable = _row(verdict_rule.NOT_COMPARABLE, None, reason="budget: 3M against 1M; env version: v4 against v5")
    assert record_readme.verdict_text(not_comparable) == "– not comparable"  # why: the source's footnote, record.md
    assert set(record_readme.MARKS) >= {verdict_rule.REPRODUCED, verdict_rule.ABOVE, verdict_rule.BELOW, verdict_rule.INCONCLUSIVE}


def test_a_footnote_says_how_the_source_measured():
    cleanrl = _row(verdict_rule.ABOVE, _published("CleanRL (ppo_continuous_action)", 3, "v4"), scores.TRAIN100)
    assert record_readme.footnote_of(cleanrl) == "CleanRL (3 seeds, v4 tasks): mean of the last 100 training episodes"
    zoo = _row(verdict_rule.ONE_AGENT_CONSISTENT, _published("SB3 RL Zoo benchmark.md", 1, "v3"))
    assert record_readme.footnote_of(zoo) == "SB3 RL Zoo (one trained agent, v3 tasks): final evaluation"
    longer = _row(verdict_rule.NOT_COMPARABLE, _published("Tianshou v2 benchmark", 5, "v4", budget=3_072_000))
    assert record_readme.footnote_of(longer) == "Tianshou v2 benchmark (5 seeds, v4 tasks, 3.072M steps): final evaluation"
    assert record_readme.footnote_of(_row(verdict_rule.NO_REFERENCE, None)) is None


def test_ours_is_the_mean_plus_minus_the_half_width_of_its_t_interval():
    import numpy as np

    from benchmark.analysis import stats

    values = np.array([1000.0, 1200.0, 1700.0])
    interval = stats.t_interval(values)
    assert record_readme.plus_minus(values) == f"1,300 ± {(interval.high - interval.low) / 2:,.0f}"
    assert record_readme.plus_minus(np.array([5.0])) == "5" and record_readme.plus_minus(np.array([])) == "—"

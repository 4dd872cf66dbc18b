"""The power of the verdict rule's tests: the chance that a comparison decides, given the true
difference and the standard error it will be measured with (``verdict_rule.seeds_needed`` scans
seed counts with it; ``aggregate_verdicts`` does the same for aggregates). Element-wise over
arrays of standard errors and degrees of freedom, so a whole range of seed counts is priced in
one call."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

ALPHA = 0.05


def tost_power(difference: float, margin: float, se: ArrayLike, df: ArrayLike, alpha: float = ALPHA) -> np.ndarray:
    """Power of the two one-sided tests at ``margin`` when the true difference is ``difference``:
    P(T1 > t) + P(T2 < -t) - 1 with T1, T2 noncentral t (the usual approximation to the exact
    bivariate probability; it is exact as df grows). Element-wise over ``se`` and ``df``."""
    from scipy import stats as scipy_stats

    se, df = np.broadcast_arrays(np.asarray(se, dtype=float), np.asarray(df, dtype=float))
    safe = np.where(se > 0, se, 1.0)
    critical = scipy_stats.t.ppf(1 - alpha, df)
    upper = noncentral_sf(critical, df, (difference + margin) / safe)
    lower = 1.0 - noncentral_sf(-critical, df, (difference - margin) / safe)
    power = np.maximum(0.0, upper + lower - 1.0)
    return np.where(se > 0, power, 1.0 if abs(difference) < margin else 0.0)


def difference_power(difference: float, se: ArrayLike, df: ArrayLike, alpha: float = ALPHA) -> np.ndarray:
    """Power of the two-sided t-test at level ``alpha`` when the true difference is ``difference``
    (element-wise over ``se`` and ``df``)."""
    from scipy import stats as scipy_stats

    se, df = np.broadcast_arrays(np.asarray(se, dtype=float), np.asarray(df, dtype=float))
    safe = np.where(se > 0, se, 1.0)
    critical = scipy_stats.t.ppf(1 - alpha / 2, df)
    shift = difference / safe
    power = noncentral_sf(critical, df, shift) + 1.0 - noncentral_sf(-critical, df, shift)
    return np.where(se > 0, power, 1.0 if difference != 0 else 0.0)


def noncentral_sf(x: np.ndarray, df: np.ndarray, shift: np.ndarray | float) -> np.ndarray:
    """P(T > x) for T noncentral t (df, shift); the normal where df is infinite or huge."""
    from scipy import stats as scipy_stats

    shift = np.broadcast_to(np.asarray(shift, dtype=float), np.shape(x))
    normal = ~np.isfinite(df) | (df > 1e6)
    out = np.empty(np.shape(x))
    out[normal] = scipy_stats.norm.sf(x[normal] - shift[normal])
    out[~normal] = scipy_stats.nct.sf(x[~normal], df[~normal], shift[~normal])
    return out


def rate_equivalence_power(p1: float, p2: float, n: int, margin: float) -> float:
    """P(Newcombe's 90% interval of the difference lies inside ±margin) with n seeds a side."""
    from scipy import stats as scipy_stats

    k = np.arange(n + 1)
    low, high = wilson_arrays(k, n, 0.9)
    rates = k / n
    d = rates[:, None] - rates[None, :]
    lower = d - np.sqrt((rates[:, None] - low[:, None]) ** 2 + (high[None, :] - rates[None, :]) ** 2)
    upper = d + np.sqrt((high[:, None] - rates[:, None]) ** 2 + (rates[None, :] - low[None, :]) ** 2)
    weight = scipy_stats.binom.pmf(k, n, p1)[:, None] * scipy_stats.binom.pmf(k, n, p2)[None, :]
    return float(np.sum(weight * ((lower > -margin) & (upper < margin))))


def wilson_arrays(successes: np.ndarray, n: int, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    from scipy import stats as scipy_stats

    z = float(scipy_stats.norm.ppf(0.5 + confidence / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return np.maximum(0.0, centre - half), np.minimum(1.0, centre + half)

"""How far apart two samples of step times are: a distribution-free interval for the shift.

The Mann-Whitney rank test inverted (Hodges and Lehmann): the values of ``d`` for which the test
would not reject "candidate = baseline + d" form an interval whose ends are order statistics of
the pairwise differences ``candidate[j] - baseline[i]``. It assumes nothing about the shape of
the step-time distribution (step times are skewed: a step now and then takes twice as long) and
its coverage is exact for any sample size, where a bootstrap of medians is too narrow on a few
steps (on 3 against 3 normal steps its 95% interval excludes a zero shift 12% of the time).
Steps are taken as exchangeable within a run: a run whose speed drifts during the recording (other
load on the machine) is more variable than its steps say, which no test on one recording a side can
see.
"""

from __future__ import annotations

import math

import numpy as np

Z_975 = 1.959963984540054  # the standard normal's 97.5th percentile
EXACT_CELLS = 10**7  # the exact null distribution costs about min(n, m) x n x m operations: beyond this, the normal approximation


def _counts(n: int, m: int) -> np.ndarray:
    """Number of orderings of n baseline and m candidate values with each Mann-Whitney U (0..n*m):
    the coefficients of the Gaussian binomial [n+m choose n](q) (float64: exact enough for ratios)."""
    n, m = min(n, m), max(n, m)
    size = n * m + 1
    p = np.zeros(size + m + n + 1)
    p[0] = 1.0
    for i in range(1, n + 1):
        p[m + i :] -= p[: len(p) - (m + i)].copy()  # times (1 - q^(m+i))
        pad = -len(p) % i  # divided by (1 - q^i): a running sum over every i-th coefficient
        q = np.concatenate([p, np.zeros(pad)]).reshape(-1, i).cumsum(axis=0).ravel()
        p = q[: len(p)]
    return p[:size]


def critical_u(n: int, m: int, confidence: float = 0.95) -> int:
    """The largest u with P(U <= u) <= (1 - confidence) / 2 when the samples are exchangeable; -1
    when no u is that unlikely (too few values: no interval at this confidence)."""
    tail = (1.0 - confidence) / 2
    if min(n, m) * n * m <= EXACT_CELLS:
        c = _counts(n, m)
        cdf = np.cumsum(c) / c.sum()
        return int(np.searchsorted(cdf, tail * (1 + 1e-12), side="right")) - 1
    z = Z_975 if confidence == 0.95 else _z(confidence)
    return math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12) - 0.5)


def _z(confidence: float) -> float:
    """The standard normal quantile at (1 + confidence) / 2, by bisection on erf."""
    lo, hi = 0.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < (1 + confidence) / 2:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _kth_difference(b: np.ndarray, c: np.ndarray, k: int) -> float:
    """The k-th smallest (1-based) of the pairwise differences c[j] - b[i], without forming all
    n*m of them: bisection on the value (counting the differences at or below it), then the
    smallest difference above the lower end."""
    b = np.sort(b)

    def at_most(x: float) -> int:  # differences <= x: per c[j], the b[i] >= c[j] - x
        return int(len(b) * len(c) - np.searchsorted(b, c - x, side="left").sum())

    lo, hi = float(c.min() - b[-1]) - 1.0, float(c.max() - b[0])  # at_most(lo) = 0 < k <= at_most(hi)
    for _ in range(200):
        mid = (lo + hi) / 2
        if not lo < mid < hi:
            break
        if at_most(mid) >= k:
            hi = mid
        else:
            lo = mid
    idx = np.searchsorted(b, c - lo, side="left") - 1  # per c[j], the largest b[i] with c[j] - b[i] > lo
    ok = idx >= 0
    return float((c[ok] - b[idx[ok]]).min())


def shift_interval(baseline: np.ndarray, candidate: np.ndarray, confidence: float = 0.95) -> tuple[float, float] | None:
    """The interval of shifts d (candidate = baseline + d) that the two-sided Mann-Whitney test at
    ``1 - confidence`` does not reject: [D_(w+1), D_(nm-w)] of the n*m pairwise differences D, w the
    critical U (same unit as the inputs). None when the samples are too small for that confidence
    (3 against 3 or 3 against 4 at 95%)."""
    b, c = np.asarray(baseline, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    w = critical_u(len(b), len(c), confidence) if len(b) and len(c) else -1
    if w < 0:
        return None
    nm = len(b) * len(c)
    return _kth_difference(b, c, w + 1), _kth_difference(b, c, nm - w)

"""The interval of the shift between two samples (analysis.shift) against the Mann-Whitney test's
published critical values, scipy's exact test, brute-force order statistics and its coverage on
samples drawn with a known shift."""

from __future__ import annotations

import numpy as np
import pytest

from bottleneck_oracle.analysis.shift import critical_u, shift_interval

# two-sided 5% critical values of U for equal sample sizes (any table of the Mann-Whitney test)
TABLE = {5: 2, 6: 5, 7: 8, 8: 13, 9: 17, 10: 23, 12: 37, 15: 64, 20: 127}


@pytest.mark.parametrize("n", sorted(TABLE))
def test_critical_values_are_the_published_ones(n):
    assert critical_u(n, n) == TABLE[n]


def test_the_normal_approximation_takes_over_where_the_exact_one_would_cost_too_much():
    # 300 x 300: beyond the exact cells; the normal value within 1 of the exact one at 60 x 60
    assert critical_u(60, 60) == 1426
    u = critical_u(300, 300)
    assert abs(u - (300 * 300 / 2 - 1.96 * np.sqrt(300 * 300 * 601 / 12))) <= 1.5


def test_too_few_values_have_no_95_percent_interval():
    x = np.array([1.0, 2.0, 3.0])
    assert shift_interval(x, x + 10) is None  # 3 against 3: the most extreme ordering has p = 0.1
    assert shift_interval(x, np.arange(4.0) + 10) is None
    assert shift_interval(x, np.arange(5.0) + 10) is not None
    assert shift_interval(np.arange(4.0), np.arange(4.0) + 10) is not None


def test_the_ends_are_order_statistics_of_the_pairwise_differences():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n, m = (int(v) for v in rng.integers(3, 30, 2))
        b, c = rng.lognormal(0, 0.4, n), rng.lognormal(0.1, 0.4, m)
        ci = shift_interval(b, c)
        if ci is None:
            continue
        d = np.sort(np.subtract.outer(c, b).ravel())
        w = critical_u(n, m)
        assert ci == (pytest.approx(d[w], abs=1e-9), pytest.approx(d[n * m - w - 1], abs=1e-9))


def test_the_interval_excludes_zero_exactly_when_scipys_exact_test_rejects():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(2)
    for _ in range(200):
        n, m = (int(v) for v in rng.integers(3, 16, 2))
        b, c = rng.lognormal(0, 0.3, n), rng.lognormal(rng.normal(0, 0.3), 0.3, m)
        ci = shift_interval(b, c)
        p = stats.mannwhitneyu(c, b, method="exact").pvalue
        excludes = ci is not None and (ci[0] > 0 or ci[1] < 0)
        assert excludes == (p < 0.05), (n, m, p, ci)


def test_the_interval_covers_a_known_shift_at_least_95_percent_of_the_time():
    """Skewed step times (lognormal, a heavy right tail) shifted by 3 units: the interval holds the
    shift in >= 95% of draws, less the binomial sampling error of 600 draws (0.9%)."""
    rng = np.random.default_rng(3)
    covered = total = 0
    for _ in range(600):
        n, m = (int(v) for v in rng.integers(4, 25, 2))
        b = 20 * rng.lognormal(0, 0.5, n)
        c = 20 * rng.lognormal(0, 0.5, m) + 3.0
        lo, hi = shift_interval(b, c)
        covered += lo <= 3.0 <= hi
        total += 1
    assert covered / total >= 0.95 - 2 * 0.009

"""Across steps and across runs: which steps of a run are unusual and why, and whether a change
made a run faster, with the noise of its own steps as the yardstick.

A run's step times are the measured ones (the slowest rank's ProfilerStep span). With three or
more steps the first one is warm-up and is left out of the statistics. A step is an outlier when
it is further from the run's median than max(3 robust sigmas (1.4826 x MAD), 5% of the median);
its cause is the top culprit of ``analysis.blame`` against the run's typical steps.

Two runs are compared by the difference of their median step times, with a 95% bootstrap
interval (steps resampled with replacement, 2000 times, seeded) and the runs' step-to-step noise
(the pooled standard deviation of their steps). Faster or slower when the interval excludes 0
and the difference is larger than NOISE_FACTOR times that noise, else within noise: two
recordings of one job on a shared machine differ by more than their medians' sampling error
(placement on cores, other load; on this project's 2-core machine two recordings of the bundled
straggler job differ by 16%, 1.3 noise sigmas), so a change that one step's own variation could
explain is not called. What moved on the critical path is the per-step time
of each (what, rank) of the segments (analysis.segments.label): what left it lost the most,
what joined it gained the most.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bottleneck_oracle.analysis.segments import BREAKDOWN_KEYS, label
from bottleneck_oracle.analysis.summary import StepAnalysis

OUTLIER_SIGMAS = 3.0  # robust sigmas from the median
OUTLIER_SHARE = 0.05  # and at least this share of the median
BOOTSTRAP = 2000
NOISE_FACTOR = 2.0  # a change must exceed this many step-to-step standard deviations to be called
ROBUST = 1.4826  # MAD -> sigma of a normal distribution


def _steady(analyses: list[StepAnalysis]) -> list[StepAnalysis]:
    """The steps the statistics use: all but the first (warm-up) when there are three or more."""
    return analyses[1:] if len(analyses) >= 3 and analyses[0].graph.step is not None else analyses


@dataclass(slots=True)
class Cause:
    """An outlier step's top cause: blame's first culprit against the run's typical steps."""

    name: str
    kind: str  # "op" or "gap" (untraced time)
    rank: int
    saving_us: float


@dataclass(slots=True)
class StepRow:
    step: int | None
    measured_us: float
    cpm_us: float
    vs_median: float  # measured / run median - 1
    outlier: bool
    warmup: bool
    untraced_us: float
    top: str  # what the critical path spent most time on (segments.label)
    cause: Cause | None = None  # outliers only


@dataclass(slots=True)
class RunSummary:
    source: str
    median_us: float  # steady-state step time: the median of the non-warm-up steps
    spread_us: float  # 1.4826 x MAD of those steps
    steps: list[StepRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(analyses: list[StepAnalysis], source: str = "") -> RunSummary:
    """Every step against the run's median; outliers with the top cause from blame."""
    from bottleneck_oracle.analysis.blame import blame

    steady = _steady(analyses)
    times = np.array([a.measured for a in steady])
    med = float(np.median(times)) if len(times) else 0.0
    spread = ROBUST * float(np.median(np.abs(times - med))) if len(times) else 0.0
    fence = max(OUTLIER_SIGMAS * spread, OUTLIER_SHARE * med)
    out = RunSummary(source=source, median_us=med, spread_us=spread)
    typical = [a.graph for a in steady if abs(a.measured - med) <= fence]
    for a in analyses:
        warm = a not in steady
        top = a.top_ops(1)
        row = StepRow(
            step=a.graph.step, measured_us=a.measured, cpm_us=a.step_time, vs_median=a.measured / med - 1 if med else 0.0,
            outlier=not warm and len(steady) >= 3 and abs(a.measured - med) > fence, warmup=warm, untraced_us=a.untraced_us,
            top=top[0]["name"] if top else "",
        )  # fmt: skip
        if row.outlier:
            refs = [g for g in typical if g.step != a.graph.step]
            b = blame(a.graph, refs, 3, a.cpm)
            if b.nodes:
                x = b.nodes[0]
                row.cause = Cause(x.name, x.kind, x.rank, x.saving_us)
        out.steps.append(row)
    return out


@dataclass(slots=True)
class Move:
    """What moved on the critical path: the per-step time of one (what, rank) in each run."""

    what: str  # segments.label: an op, a range's framework or untraced time, a wait
    rank: int
    kind: str  # the segment kind
    baseline_us: float
    candidate_us: float
    delta_us: float


@dataclass(slots=True)
class KindChange:
    """The critical path's mean time per step in one breakdown class, in each run."""

    baseline_us: float
    candidate_us: float
    delta_us: float


@dataclass(slots=True)
class RankChange:
    """A rank's median step time in each run (None: the rank is not in that run)."""

    rank: int
    baseline_us: float | None
    candidate_us: float | None
    delta_us: float | None


@dataclass(slots=True)
class Comparison:
    baseline: str
    candidate: str
    baseline_median_us: float
    candidate_median_us: float
    baseline_steps: int
    candidate_steps: int
    baseline_spread_us: float
    candidate_spread_us: float
    delta_us: float  # candidate - baseline median step time
    delta_share: float  # delta / baseline median
    interval_us: tuple[float, float]  # 95% bootstrap interval of delta
    noise_us: float  # the runs' step-to-step noise: pooled standard deviation of their step times
    verdict: str  # "faster", "slower" or "within noise"
    moved: list[Move] = field(default_factory=list)  # largest change first
    by_kind: dict[str, KindChange] = field(default_factory=dict)  # breakdown class -> its change
    by_rank: list[RankChange] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["interval_us"] = list(self.interval_us)
        return d

    @property
    def left(self) -> list[Move]:
        """What left the critical path (or lost most time on it), largest loss first."""
        return [m for m in self.moved if m.delta_us < 0]

    @property
    def joined(self) -> list[Move]:
        return [m for m in self.moved if m.delta_us > 0]


def _per_step(analyses: list[StepAnalysis]) -> dict[tuple[str, int], tuple[float, str]]:
    """(what, rank) -> (its mean time per step on the critical path, its segment kind)."""
    total: dict[tuple[str, int], float] = defaultdict(float)
    kind: dict[tuple[str, int], str] = {}
    for a in analyses:
        for s in a.segments():
            key = (label(s), s.rank)
            total[key] += s.dur
            kind.setdefault(key, s.kind)
    n = max(len(analyses), 1)
    return {k: (v / n, kind[k]) for k, v in total.items()}


def _rank_medians(analyses: list[StepAnalysis]) -> dict[int, float]:
    per: dict[int, list[float]] = defaultdict(list)
    for a in analyses:
        for r, t in a.graph.measured.items():
            per[int(r)].append(t)
    return {r: float(np.median(v)) for r, v in per.items()}


def compare(
    base: list[StepAnalysis], cand: list[StepAnalysis], base_name: str = "", cand_name: str = "", seed: int = 0, top: int = 10
) -> Comparison:
    """Did the candidate run get faster than the baseline, by how much, and what moved."""
    b, c = _steady(base), _steady(cand)
    tb, tc = np.array([a.measured for a in b]), np.array([a.measured for a in c])
    mb, mc = float(np.median(tb)), float(np.median(tc))
    rng = np.random.default_rng(seed)
    boot = np.median(rng.choice(tc, (BOOTSTRAP, len(tc))), axis=1) - np.median(rng.choice(tb, (BOOTSTRAP, len(tb))), axis=1)
    lo, hi = (float(x) for x in np.percentile(boot, [2.5, 97.5]))
    var = [float(np.var(t, ddof=1)) if len(t) > 1 else 0.0 for t in (tb, tc)]
    noise = float(np.sqrt(sum(var) / 2))
    delta = mc - mb
    called = abs(delta) > NOISE_FACTOR * noise
    verdict = "faster" if hi < 0 and called else "slower" if lo > 0 and called else "within noise"
    pb, pc = _per_step(b), _per_step(c)
    moved: list[Move] = []
    for key in set(pb) | set(pc):
        x, y = pb.get(key, (0.0, ""))[0], pc.get(key, (0.0, ""))[0]
        moved.append(
            Move(what=key[0], rank=key[1], kind=(pb[key] if key in pb else pc[key])[1], baseline_us=x, candidate_us=y, delta_us=y - x)
        )
    moved = sorted((m for m in moved if abs(m.delta_us) > 1e-6), key=lambda m: -abs(m.delta_us))
    kinds = {}
    for k in BREAKDOWN_KEYS:
        x = float(np.mean([a.breakdown()[k] for a in b]))
        y = float(np.mean([a.breakdown()[k] for a in c]))
        kinds[k] = KindChange(baseline_us=x, candidate_us=y, delta_us=y - x)
    rb, rc = _rank_medians(b), _rank_medians(c)
    ranks = [RankChange(r, rb.get(r), rc.get(r), (rc[r] - rb[r]) if r in rb and r in rc else None) for r in sorted(set(rb) | set(rc))]
    spread = [ROBUST * float(np.median(np.abs(t - np.median(t)))) for t in (tb, tc)]
    return Comparison(
        baseline=base_name, candidate=cand_name, baseline_median_us=mb, candidate_median_us=mc, baseline_steps=len(tb), candidate_steps=len(tc),
        baseline_spread_us=spread[0], candidate_spread_us=spread[1], delta_us=mc - mb, delta_share=(mc - mb) / mb if mb else 0.0,
        interval_us=(lo, hi), noise_us=noise, verdict=verdict, moved=moved[:top], by_kind=kinds, by_rank=ranks,
    )  # fmt: skip

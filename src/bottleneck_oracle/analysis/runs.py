"""Across the steps of a run: which steps are unusual and why (two runs: analysis.change).

A run's step times are the steps' times as ``analyze`` gives them: each step's period (from the
end of the device work queued before it to the end of its own; the ProfilerStep span when nothing
was queued ahead), so a device-bound run whose host runs ahead is judged by its device, not by host
spans that swing around it. The span (``measured_us``) is kept beside it. With three or
more steps the first one is warm-up and is left out of the statistics; so is any step that spends
a fifth of its time or more in one-time work (the runtime setting itself up, torch.compile
compiling), whatever the number of steps, unless every step does; and a ProfilerStep span that
holds no op (the profiler's stop after the last ``prof.step()``) is no step at all. A step is an outlier when
it is further from the run's median than max(3 robust sigmas (1.4826 x MAD), 5% of the median);
its cause is the top culprit of ``analysis.blame`` against the run's typical steps, where it saves
at least blame's noise floor (1% of the step): otherwise no single op is its cause.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bottleneck_oracle.analysis.answer import (
    NAMED_TOP,
    ROBUST_SIGMA,
    SlowCause,
    StepGroups,
    StepTrend,
    named_cause,
    steady_of,
    step_groups,
    step_trend,
)
from bottleneck_oracle.analysis.blame import CulpritKind
from bottleneck_oracle.analysis.segments import path_by_name
from bottleneck_oracle.analysis.summary import StepAnalysis

OUTLIER_SIGMAS = 3.0  # robust sigmas from the median
OUTLIER_SHARE = 0.05  # and at least this share of the median
ROBUST = ROBUST_SIGMA  # MAD -> sigma of a normal distribution


def steady(analyses: list[StepAnalysis]) -> list[StepAnalysis]:
    """The steps the statistics use (answer.steady_of: not an empty span, not the first of three
    or more, not one of one-time work unless all are)."""
    return steady_of(
        analyses, lambda a: a.graph.step, lambda a: a.is_empty() or bool(a.cut_by_trace_end()) or a.adds_nothing(), StepAnalysis.holds_setup
    )


@dataclass(slots=True)
class Cause:
    """An outlier step's top cause: blame's first culprit against the run's typical steps."""

    name: str
    kind: CulpritKind  # an op, or untraced time
    rank: int
    saving_us: float


@dataclass(slots=True)
class StepRow:
    step: int | None
    measured_us: float  # the ProfilerStep spans (ExecutionGraph.span)
    cpm_us: float  # the step's time: its period, as the graph replays it
    vs_median: float  # step time / run median - 1
    outlier: bool
    warmup: bool  # left out of the run's statistics (why: ``left_out``)
    untraced_us: float
    top: str  # what the critical path spent most time on (segments.label)
    cause: Cause | None = None  # outliers only
    in_it: SlowCause | None = None  # a slow outlier's: its path's excess over the typical steps' (answer.named_cause)
    left_out: str = ""  # why a step is left out: "warm-up", "one-time work", "no op" (the profiler's stop); "" if kept


@dataclass(slots=True)
class RunSummary:
    source: str
    median_us: float  # steady-state step time: the median of the non-warm-up steps
    spread_us: float  # 1.4826 x MAD of those steps
    steps: list[StepRow] = field(default_factory=list)
    trend: StepTrend | None = None  # those steps' time trends (answer.step_trend); None: it does not
    groups: StepGroups | None = None  # they fall in two groups by their time (answer.step_groups); None: they do not


def summarize(analyses: list[StepAnalysis], source: str = "") -> RunSummary:
    """Every step against the run's median; outliers with the top cause from blame."""
    from bottleneck_oracle.analysis.blame import blame, noise_floor

    kept = steady(analyses)
    times = np.array([a.step_time for a in kept])
    med = float(np.median(times)) if len(times) else 0.0
    spread = ROBUST * float(np.median(np.abs(times - med))) if len(times) else 0.0
    fence = max(OUTLIER_SIGMAS * spread, OUTLIER_SHARE * med)
    out = RunSummary(source=source, median_us=med, spread_us=spread)
    out.trend = step_trend([a.graph.step for a in kept], times.tolist())
    out.groups = step_groups(times.tolist()) if out.trend is None else None
    typical_steps = [a for a in kept if abs(a.step_time - med) <= fence]
    typical = [a.graph for a in typical_steps]
    typical_named: list[list[tuple[int, str, int, float]]] = []
    for a in analyses:
        warm = a not in kept
        top = a.top_ops(1)
        row = StepRow(
            step=a.graph.step,
            measured_us=a.measured,
            cpm_us=a.step_time,
            vs_median=a.step_time / med - 1 if med else 0.0,
            outlier=not warm and len(kept) >= 3 and abs(a.step_time - med) > fence,
            warmup=warm,
            left_out=(
                "no op"
                if a.is_empty()
                else "the trace ends inside it"
                if a.cut_by_trace_end()
                else "adds nothing"
                if a.adds_nothing()
                else "one-time work"
                if a.holds_setup()
                else "warm-up"
            )
            if warm
            else "",
            untraced_us=a.untraced_us,
            top=top[0].name if top else "",
        )
        if row.outlier:
            refs = [g for g in typical if g.step != a.graph.step]
            b = blame(a.graph, refs, 3, a.cpm)
            if b.nodes and b.nodes[0].saving_us >= noise_floor(b.makespan):  # below it, no culprit
                x = b.nodes[0]
                row.cause = Cause(x.name, x.kind, x.rank, x.saving_us)
            if a.step_time > med:
                if not typical_named:
                    typical_named = [path_by_name(t.graph, t.segments(), NAMED_TOP) for t in typical_steps]
                mine = path_by_name(a.graph, a.segments(), NAMED_TOP)
                row.in_it = named_cause([mine], [x for t, x in zip(typical_steps, typical_named) if t is not a], a.step_time - med)
        out.steps.append(row)
    return out

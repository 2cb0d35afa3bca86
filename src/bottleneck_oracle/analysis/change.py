"""Did a change make a run faster or slower, by how much, can the two runs be compared, and what
moved on the critical path.

A step's time is its period (``StepAnalysis.period``, graph_pipeline.facts): on a device-bound job
the device's period, on a CPU-bound one the ProfilerStep spans' (graph.span). With three or
more steps a run's first step is warm-up and left out. The change is the difference of the two
runs' median step times.

The verdict comes from the uncertainty of that change and a minimum practical change: **slower**
(or **faster**) when the 95% interval of the shift between the runs' step times excludes zero
(analysis.shift: the Mann-Whitney test inverted, exact at any number of steps, no assumption on the
distribution) and the change is at least ``min_change`` of the baseline (default 1%), else **within
noise**. With fewer than three steady steps a side, or too few for a 95% interval, the verdict is
**too few steps**. Steps are taken as exchangeable within a run: two recordings at different times
on a machine whose speed drifts (other load, clocks) differ by more than their steps say; record
the runs interleaved or back to back, or several times.

Before the numbers, what could make the runs incomparable is checked (``shape_of``): device model,
world size, ranks in the input, backend, the step's structure (its ops by name and count per
step and rank), and the work its matmuls, convolutions and attention are given by their input
sizes (``record_shapes``: as many ops, 1.15 times the FLOPs or more — a batch, sequence or image
size changed). A difference is a warning; runs that share almost no ops are refused.

What moved is read from the critical paths of each run's typical steps (those whose time lies in
the run's interquartile range): the mean time per step of each *what* (``segments.label``: an op
with its own time, a range's framework or untraced time, a wait; a device op by its kernel's name
without template arguments), rows aggregated across ranks
when the ranks run the same program (no send/recv between them: data parallel, not pipeline
stages), per rank otherwise. The rows add up to the typical steps' difference; the residual to the
difference of medians is its own row, so the explanation sums to the change.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from bottleneck_oracle.analysis.answer import UNEVEN_INPUTS, matmul_work, step_trend
from bottleneck_oracle.analysis.runs import ROBUST, steady
from bottleneck_oracle.analysis.segments import BREAKDOWN_KEYS, BreakdownKey, Segment, SegmentKind, label
from bottleneck_oracle.analysis.shift import shift_interval
from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline.events import EventTable
from bottleneck_oracle.graph_pipeline.schema import Category

Verdict = Literal["faster", "slower", "within noise", "too few steps"]
MIN_STEPS = 3  # steady steps a side, at the least, for an interval
MIN_CHANGE = 0.01  # default minimum practical change: a share of the baseline's median step
CONFIDENCE = 0.95
SAME_STRUCTURE = 0.8  # ops matching by name and count per step and rank below this share: a warning
REFUSE_STRUCTURE = 0.1  # below this share: not the same job, refused unless forced
SPEED_CATEGORIES = (Category.CPU_OP, Category.KERNEL, Category.MEMCPY, Category.MEMSET)  # ops whose duration is work, not waiting
UNIFORM_SHARE = 0.5  # ops slower (or faster) by at least this share of the step's change: the machine, likely
STRUCTURE_CATEGORIES = (Category.CPU_OP, Category.RUNTIME, Category.COLLECTIVE, Category.P2P, Category.BLOCKING)
# kernels are left out of the structure: their names change with the device model and library version


@dataclass(slots=True)
class RunShape:
    """What a run is, for telling whether two runs can be compared."""

    devices: list[str]  # device models the traces' deviceProperties name ([]: none named)
    on_device: bool  # the steps have device ops (kernels, copies)
    world_size: int | None  # from distributedInfo
    ranks: list[int]  # ranks in the input
    backend: str | None  # from distributedInfo
    pipeline: bool  # send/recv between ranks: the ranks are pipeline stages, not copies of one program
    ops: dict[str, float] = field(default_factory=dict)  # op name -> mean count per steady step and rank
    matmul_work: float | None = None  # the FLOPs the matmuls' input sizes give, per steady step and rank (facts; None: not recorded)
    matmul_ops: float | None = None  # how many such ops, per steady step and rank
    python_calls: float = 0.0  # the Python tracer's calls (with_stack=True), per steady step and rank


def shape_of(table: EventTable | None, analyses: list[StepAnalysis]) -> RunShape:
    """The shape of a run from its event table (None: Chakra input, no file metadata) and steps."""
    devices = sorted({d for info in (table.inputs.values() if table else ()) for d in info.get("devices", [])})
    metas = [m for m in (table.meta.values() if table else ()) if isinstance(m, dict)]
    sizes = {m["world_size"] for m in metas if isinstance(m.get("world_size"), int)}
    backends = {str(m["backend"]) for m in metas if isinstance(m.get("backend"), str)}
    counts: dict[str, float] = defaultdict(float)
    ranks: set[int] = set()
    on_device = pipeline = False
    steps = steady(analyses)
    work: list[tuple[float, float]] = []  # per step: the ranks' mean matmul FLOPs and ops, by their input sizes
    python = 0.0
    for a in steps:
        shaped = matmul_work(a.graph.info.facts)
        if shaped:
            work.append((float(np.mean([w for _, w, _ in shaped])), float(np.mean([k for _, _, k in shaped]))))
        g = a.graph
        n = g.nodes
        on_device |= bool(n["on_gpu"].any())
        pipeline |= bool((n["category"] == Category.P2P).any())
        ranks.update(g.ranks)
        keep = np.isin(n["category"], STRUCTURE_CATEGORIES) & (n["rank"] >= 0)
        codes, k = np.unique(n["name"][keep], return_counts=True)
        per_rank = max(len(g.ranks), 1)
        for code, c in zip(codes.tolist(), k.tolist()):
            if _PYTHON_CALL.search(g.names[code]):  # (what the profiler was asked to record, not the step's ops)
                python += c / per_rank
            else:
                counts[_normal(g.names[code])] += c / per_rank
        ranged = g.regions["is_range"].astype(bool)
        python += sum(bool(_PYTHON_CALL.search(g.names[int(k)])) for k in g.regions["name"][ranged].tolist()) / per_rank
    return RunShape(
        devices=devices,
        on_device=on_device,
        world_size=max(sizes) if sizes else None,
        ranks=sorted(ranks),
        backend=backends.pop() if len(backends) == 1 else None,
        pipeline=pipeline,
        ops={k: v / max(len(steps), 1) for k, v in counts.items()},
        matmul_work=float(np.median([w for w, _ in work])) if work else None,
        matmul_ops=float(np.median([o for _, o in work])) if work else None,
        python_calls=python / max(len(steps), 1),
    )


def structure_match(a: RunShape, b: RunShape) -> float:
    """Share of the two runs' ops that match by name and count per step and rank (weighted Jaccard:
    sum of the smaller counts over the sum of the larger; 1 for identical steps)."""
    names = set(a.ops) | set(b.ops)
    top = sum(max(a.ops.get(k, 0.0), b.ops.get(k, 0.0)) for k in names)
    return sum(min(a.ops.get(k, 0.0), b.ops.get(k, 0.0)) for k in names) / top if top else 1.0


SAME_COUNT = 0.25
"""An op kind runs about as many times a step in two runs when the counts differ by at most this
share of the larger (op_speed)."""


SPEED_COVER = 0.2
"""...and the kinds compared hold at least this share of the baseline's op time: a few
microsecond ops (``aten::view``, ``aten::empty``) left common to two different attention
implementations say nothing about the machine."""


def op_speed(base: list[StepAnalysis], cand: list[StepAnalysis]) -> tuple[float, int] | None:
    """How much longer the ops themselves ran in ``cand`` than in ``base``: the median, weighted by
    the baseline's time in each, of the ratio of an op kind's median duration (CPU ops and device
    ops, not collectives or waits), over the kinds that ran at least 3 times in each and about as
    many times a step in each (within SAME_COUNT: an op whose count changed does other work under
    the same name, ``aten::add_`` a parameter's update in a looped optimizer and only its step
    counter in a fused one); and how many kinds. None when no kind is common to both, or those
    that are hold under SPEED_COVER of the baseline's op time."""

    def durations(steps: list[StepAnalysis]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = defaultdict(list)
        for a in steps:
            g = a.graph
            keep = np.flatnonzero(np.isin(g.nodes["category"], SPEED_CATEGORIES))
            for code, d in zip(g.nodes["name"][keep].tolist(), g.nodes["mdur"][keep].tolist()):
                out[g.names[code]].append(d)
        return out

    db, dc = durations(base), durations(cand)
    per_b, per_c = max(len(base), 1), max(len(cand), 1)

    def same_count(k: str) -> bool:
        nb, nc = len(db[k]) / per_b, len(dc[k]) / per_c
        return abs(nc - nb) <= SAME_COUNT * max(nb, nc)

    common = [k for k in db if len(db[k]) >= 3 and len(dc.get(k, ())) >= 3 and np.median(db[k]) > 0 and same_count(k)]
    if not common or sum(np.sum(db[k]) for k in common) < SPEED_COVER * sum(np.sum(v) for v in db.values()):
        return None
    ratio = np.array([np.median(dc[k]) / np.median(db[k]) for k in common])
    weight = np.array([np.sum(db[k]) for k in common])
    order = np.argsort(ratio)
    cum = np.cumsum(weight[order])
    return float(ratio[order][np.searchsorted(cum, cum[-1] / 2)]), len(common)


def alike(speed: tuple[float, int] | None, share: float, min_change: float = MIN_CHANGE) -> str | None:
    """A warning when the ops themselves (``op_speed``) changed the same way as the step, by at least
    UNIFORM_SHARE of its change ``share``: what a slower or faster machine does; else None."""
    if speed is None or abs(share) <= min_change or (speed[0] - 1) * share <= 0 or abs(speed[0] - 1) < UNIFORM_SHARE * abs(share):
        return None
    ran = f"{100 * (speed[0] - 1):+.0f}% longer" if speed[0] > 1 else f"{100 * (1 - speed[0]):.0f}% shorter"
    return (
        f"the ops themselves ran {ran} (the time-weighted median over {speed[1]} kinds of op), "
        f"against {100 * share:+.0f}% for the step: a machine that ran slower or faster (other load, clocks, another "
        "device) changes every op alike, a change to the job seldom does"
    )


def comparability(a: RunShape, b: RunShape, force: bool = False) -> list[str]:
    """Why the baseline ``a`` and the candidate ``b`` may not be comparable, one line each; raises
    OracleError when they share almost no ops (not the same job) unless ``force``."""
    out = []
    if a.devices and b.devices and a.devices != b.devices:
        out.append(
            f"the runs ran on different devices (baseline {', '.join(a.devices)}; candidate {', '.join(b.devices)}): "
            "the change includes the hardware's"
        )
    elif a.on_device != b.on_device:
        out.append(
            f"the baseline runs {'on a device' if a.on_device else 'on the CPU only'}, "
            f"the candidate {'on a device' if b.on_device else 'on the CPU only'}"
        )
    if a.world_size and b.world_size and a.world_size != b.world_size:
        out.append(f"the world size differs (baseline {a.world_size} ranks, candidate {b.world_size}): the job was scaled")
    if a.ranks != b.ranks:
        out.append(f"the traces hold different ranks (baseline {_ranks(a)}, candidate {_ranks(b)}): rows are matched by what, across ranks")
    if a.backend and b.backend and a.backend != b.backend:
        out.append(f"the backend differs (baseline {a.backend}, candidate {b.backend})")
    if (
        a.matmul_work
        and b.matmul_work
        and a.matmul_ops
        and b.matmul_ops
        and abs(b.matmul_ops - a.matmul_ops) <= SAME_COUNT * max(a.matmul_ops, b.matmul_ops)
        and max(a.matmul_work, b.matmul_work) >= UNEVEN_INPUTS * min(a.matmul_work, b.matmul_work)
    ):
        out.append(
            f"the matmuls are given different work by their input sizes (record_shapes: the candidate's "
            f"{b.matmul_work / a.matmul_work:.2f}× the baseline's, as many ops): a larger or smaller batch, sequence or "
            "image; the change includes the workload's"
        )
    if (a.python_calls > 0) != (b.python_calls > 0):
        traced, plain = ("baseline", "candidate") if a.python_calls > 0 else ("candidate", "baseline")
        out.append(
            f"the {traced} was profiled with its Python calls recorded (with_stack=True: "
            f"{max(a.python_calls, b.python_calls):.0f} a step and rank), the {plain} without: the profiler's own "
            "time in every Python call differs, and with it the step"
        )
    match = structure_match(a, b)
    if match < SAME_STRUCTURE:
        only_a = sorted((k for k in a.ops if k not in b.ops), key=lambda k: -a.ops[k])[:3]
        only_b = sorted((k for k in b.ops if k not in a.ops), key=lambda k: -b.ops[k])[:3]
        detail = "; ".join(
            f"only in the {side}: {', '.join(f'{k} ({ops[k]:.3g} per step)' for k in keys)}"
            for side, keys, ops in (("baseline", only_a, a.ops), ("candidate", only_b, b.ops))
            if keys
        )
        line = f"the steps differ in structure: {100 * match:.0f}% of their ops match by name and count per step and rank" + (
            f" ({detail})" if detail else ""
        )
        if match < REFUSE_STRUCTURE and not force:
            raise OracleError(
                f"baseline and candidate do not run the same step: {line[len('the steps differ in structure: ') :]}; "
                "pass --force to compare them anyway"
            )
        out.append(line)
    return out


_PYTHON_CALL = re.compile(F.PYTHON_CALL_PATTERN)


def _ranks(s: RunShape) -> str:
    shown = ", ".join(map(str, s.ranks[:8])) + (", ..." if len(s.ranks) > 8 else "")
    return f"rank{'s' if len(s.ranks) != 1 else ''} {shown}" + (f" of {s.world_size}" if s.world_size else "")


@dataclass(slots=True)
class Move:
    """What moved on the critical path: the mean time per typical step of one *what* in each run."""

    what: str  # segments.label: an op, a range's framework or untraced time, a wait
    ranks: list[int]  # where it lay on the path, in either run (one rank: rows per rank)
    kind: SegmentKind
    baseline_us: float
    candidate_us: float
    delta_us: float


@dataclass(slots=True)
class KindChange:
    """The critical path's mean time per typical step in one breakdown class, in each run."""

    baseline_us: float
    candidate_us: float
    delta_us: float


@dataclass(slots=True)
class RankChange:
    """A rank's median step time (its period) in each run (None: the rank is not in that run)."""

    rank: int
    baseline_us: float | None
    candidate_us: float | None
    delta_us: float | None


@dataclass(slots=True)
class Comparison:
    baseline: str
    candidate: str
    baseline_median_us: float  # the median step time (period) of the steady steps
    candidate_median_us: float
    baseline_steps: int  # steady steps
    candidate_steps: int
    baseline_spread_us: float  # 1.4826 x MAD of the steady steps' times
    candidate_spread_us: float
    delta_us: float  # candidate - baseline median step time
    delta_share: float  # delta / baseline median
    interval_us: tuple[float, float] | None  # 95% interval of the shift (None: too few steps)
    op_ratio: float | None  # how much longer the ops themselves ran in the candidate (op_speed; None: no common op)
    min_change: float  # the minimum practical change, a share of the baseline median
    verdict: Verdict
    reason: str  # the verdict's reason in words
    warnings: list[str] = field(default_factory=list)  # why the runs may not be comparable
    moved: list[Move] = field(default_factory=list)  # the largest changes first (the top ones)
    other_us: float = 0.0  # the change of the rows not listed in moved
    residual_us: float = 0.0  # difference of medians minus the typical steps' difference
    by_kind: dict[BreakdownKey, KindChange] = field(default_factory=dict)  # breakdown class -> its change
    by_rank: list[RankChange] = field(default_factory=list)

    @property
    def left(self) -> list[Move]:
        """What left the critical path (or lost most time on it), largest loss first."""
        return [m for m in self.moved if m.delta_us < 0]

    @property
    def joined(self) -> list[Move]:
        return [m for m in self.moved if m.delta_us > 0]


def step_time(a: StepAnalysis) -> float:
    """A step's time for comparing runs (µs): its period, or the measured span without facts."""
    p = a.period
    return p if p is not None else a.measured


def verdict(tb: np.ndarray, tc: np.ndarray, min_change: float = MIN_CHANGE) -> tuple[Verdict, str, tuple[float, float] | None]:
    """(verdict, its reason, the 95% interval of the shift in µs) for baseline and candidate step times (µs)."""
    if min(len(tb), len(tc)) < MIN_STEPS:
        return "too few steps", f"{len(tb)} and {len(tc)} steady steps: at least {MIN_STEPS} a side are needed for an interval", None
    ci = shift_interval(tb, tc, CONFIDENCE)
    if ci is None:
        return (
            "too few steps",
            (
                f"{len(tb)} and {len(tc)} steady steps are too few for a {100 * CONFIDENCE:.0f}% interval: "
                "record at least 4 a side (a run's first step is warm-up)"
            ),
            None,
        )
    mb = float(np.median(tb))
    delta = float(np.median(tc)) - mb
    lo, hi = ci
    floor = min_change * mb
    if lo > 0 and delta >= floor:
        return "slower", "the interval excludes no change", ci
    if hi < 0 and -delta >= floor:
        return "faster", "the interval excludes no change", ci
    if lo > 0 or hi < 0:
        return "within noise", f"a change below the minimum of {100 * min_change:g}% of the baseline", ci
    return "within noise", "the interval includes no change", ci


_STEP_NUMBER = re.compile(r"ProfilerStep#\d+")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_LATE_RANK = re.compile(r"^late step start of rank \d+$")


def _normal(what: str, across_ranks: bool = False) -> str:
    """A row's name as matched across runs: step numbers and addresses left out (and, with rows
    across ranks, the rank of a late start)."""
    what = _ADDRESS.sub("0x…", _STEP_NUMBER.sub("ProfilerStep#*", what))
    return "late step start of a rank" if across_ranks and _LATE_RANK.match(what) else what


_NUMBER = re.compile(r"(?<![\w.])\d+(?:[uU]?[lL]{0,2})(?![\w.])")


def kernel_family(name: str) -> str:
    """A device op's name without its parameters and with the numbers among its template arguments
    as N, e.g. ``void f<float, 5ul>(Accessor<float>)`` -> ``void f<float, N>``: one kernel's
    instantiations for other sizes are one row; other functors stay apart."""
    text = name.replace("(anonymous namespace)", "\0")
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "<"
        depth -= ch == ">" and depth > 0
        if ch == "(" and not depth and i:
            text = text[:i]
            break
    return _NUMBER.sub("N", text).replace("\0", "(anonymous namespace)").strip() or name


def _typical(analyses: list[StepAnalysis], times: np.ndarray) -> list[StepAnalysis]:
    """The steps whose time lies in the run's interquartile range, or where none does (two steps:
    the quartiles lie between them) those nearest the median."""
    if not len(times):
        return []
    q1, q3 = np.percentile(times, [25, 75])
    inside = [a for a, t in zip(analyses, times) if q1 <= t <= q3]
    if inside:
        return inside
    off = np.abs(np.asarray(times, dtype=float) - float(np.median(times)))
    return [a for a, d in zip(analyses, off) if d <= off.min() + 1e-9]


def _rows(analyses: list[StepAnalysis], across_ranks: bool) -> dict[tuple[str, int], tuple[float, SegmentKind, set[int]]]:
    """(what, rank or -1 across ranks) -> (its mean time per step on the critical path, kind, ranks)."""
    total: dict[tuple[str, int], float] = defaultdict(float)
    kind: dict[tuple[str, int], SegmentKind] = {}
    where: dict[tuple[str, int], set[int]] = defaultdict(set)
    for a in analyses:
        for s in a.segments():
            key = _key(s, across_ranks)
            total[key] += s.dur
            kind.setdefault(key, s.kind)
            where[key].add(s.rank)
    n = max(len(analyses), 1)
    return {k: (v / n, kind[k], where[k]) for k, v in total.items()}


def _key(s: Segment, across_ranks: bool) -> tuple[str, int]:
    what = kernel_family(s.name) if s.on_gpu and s.kind == "op" else label(s)
    return _normal(what, across_ranks), -1 if across_ranks else s.rank


def _rank_medians(analyses: list[StepAnalysis]) -> dict[int, float]:
    per: dict[int, list[float]] = defaultdict(list)
    for a in analyses:
        facts = a.graph.info.facts
        periods = {f.rank: f.period_us for f in facts.ranks} if facts is not None else {}
        for r, t in (periods or {int(r): float(t) for r, t in a.graph.measured.items()}).items():
            per[r].append(t)
    return {r: float(np.median(v)) for r, v in per.items()}


def compare(
    base: list[StepAnalysis],
    cand: list[StepAnalysis],
    base_name: str = "",
    cand_name: str = "",
    top: int = 10,
    min_change: float = MIN_CHANGE,
    shapes: tuple[RunShape, RunShape] | None = None,
    force: bool = False,
) -> Comparison:
    """Did the candidate run get faster or slower than the baseline, by how much, and what moved.

    Args:
        base: the analysed steps of the baseline run (api.analyze), in step order.
        cand: the analysed steps of the candidate run.
        base_name: how the baseline is named in the result.
        cand_name: how the candidate is named in the result.
        top: how many rows of what moved to keep (the rest is summed in ``other_us``).
        min_change: the minimum practical change, a share of the baseline's median step (0.01: 1%).
        shapes: the runs' shapes (``shape_of``) for the comparability check; None: read from the
            steps alone (no device names, world size or backend).
        force: compare runs that share almost no ops instead of refusing.

    Returns:
        The Comparison: medians, change and its 95% interval (µs), verdict and reason, warnings,
        what moved on the critical path, per breakdown class and per rank.
    """
    if not 0 <= min_change < 1:
        raise OracleError(f"the minimum change must be a share in [0, 1) (found {min_change:g})")
    b, c = steady(base), steady(cand)
    if not b or not c:
        raise OracleError(f"the {'baseline' if not b else 'candidate'} has no steps to compare")
    sb, sc = shapes if shapes is not None else (shape_of(None, base), shape_of(None, cand))
    warns = comparability(sb, sc, force)
    tb, tc = np.array([step_time(a) for a in b]), np.array([step_time(a) for a in c])
    mb, mc = float(np.median(tb)), float(np.median(tc))
    for side, steps, times in (("baseline", b, tb), ("candidate", c, tc)):
        trend = step_trend([a.graph.step for a in steps], times.tolist())
        if trend is not None:
            warns.append(
                f"the {side}'s step time trends {'up' if trend.slope_us > 0 else 'down'} over its steps "
                f"({trend.first_us / 1000:.1f} to {trend.last_us / 1000:.1f} ms, {trend.slope_us / 1000:+.2f} ms a step): its median "
                "is no steady value, and the change depends on which steps were profiled"
            )
    call, reason, ci = verdict(tb, tc, min_change)
    speed = op_speed(b, c)
    share = (mc - mb) / mb if mb else 0.0
    line = alike(speed, share, min_change)
    if line:
        warns.append(line)
    across = not (sb.pipeline or sc.pipeline)
    kb, kc = _typical(b, tb), _typical(c, tc)
    pb, pc = _rows(kb, across), _rows(kc, across)
    moved = []
    none: tuple[float, SegmentKind | None, set[int]] = (0.0, None, set())
    for key in set(pb) | set(pc):
        (x, kx, wx), (y, ky, wy) = pb.get(key, none), pc.get(key, none)
        what_kind = kx or ky
        assert what_kind is not None  # (the key is in one run at least)
        moved.append(Move(what=key[0], ranks=sorted(wx | wy), kind=what_kind, baseline_us=x, candidate_us=y, delta_us=y - x))
    moved.sort(key=lambda m: (-abs(m.delta_us), m.what))
    explained = sum(m.delta_us for m in moved)
    shown = [m for m in moved[:top] if abs(m.delta_us) > 1e-6]
    kinds = {}
    for k in BREAKDOWN_KEYS:
        x = float(np.mean([a.breakdown()[k] for a in kb]))
        y = float(np.mean([a.breakdown()[k] for a in kc]))
        kinds[k] = KindChange(baseline_us=x, candidate_us=y, delta_us=y - x)
    rb, rc = _rank_medians(b), _rank_medians(c)
    per_rank = [RankChange(r, rb.get(r), rc.get(r), (rc[r] - rb[r]) if r in rb and r in rc else None) for r in sorted(set(rb) | set(rc))]
    spread = [ROBUST * float(np.median(np.abs(t - np.median(t)))) for t in (tb, tc)]
    return Comparison(
        baseline=base_name,
        candidate=cand_name,
        baseline_median_us=mb,
        candidate_median_us=mc,
        baseline_steps=len(tb),
        candidate_steps=len(tc),
        baseline_spread_us=spread[0],
        candidate_spread_us=spread[1],
        delta_us=mc - mb,
        delta_share=share,
        interval_us=ci,
        op_ratio=speed[0] if speed else None,
        min_change=min_change,
        verdict=call,
        reason=reason,
        warnings=warns,
        moved=shown,
        other_us=explained - sum(m.delta_us for m in shown),
        residual_us=(mc - mb) - explained,
        by_kind=kinds,
        by_rank=per_rank,
    )

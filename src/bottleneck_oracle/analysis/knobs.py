"""What-if for configuration changes: a knob of the job changed, the step's graph edited to
match, and replayed (``whatif --set``).

Every op and every stretch of an op's own time is split into a fixed part and work. The fixed
part is the cost of an op that does not grow with its shapes, read from the trace itself: on CPU
``FIXED_FACTOR`` times the median duration of the ops that only make views or empty tensors
(``aten::view``, ``aten::as_strided``, ...), the one number fitted on re-runs; on a device the
shortest kernels. The work is the rest, and it scales with the shapes the
op processes. Untraced time between ops (Python, the autograd engine) is neither: it stays as
it is unless a knob repeats the code that runs it; untraced time right after a send, receive
or collective call is waiting for the peer, and no knob repeats it. What scales, per knob:

- ``batch`` (sequences per rank, or per micro-batch in a pipeline) old -> new: the work of the
  forward and backward passes scales by new/old; communication, the optimizer and the untraced
  time stay.
- ``seq`` (sequence length): the same by new/old, and the work of attention ops (their names
  say attention, sdpa, flash or fmha) by (new/old)^2.
- ``accum`` (gradient accumulation, passes per optimizer step) old -> new: the forward and
  backward passes, their untraced time with them, run new/old times as long; the gradient
  all-reduce and the optimizer once, as before.
- ``checkpoint=on`` (activation checkpointing): the backward pass of each rank also re-runs
  its forward pass (its ops, their own time and its untraced time), so it is stretched by the
  forward's time over its own; ``checkpoint=off`` shortens it by the forward's time (to half
  of it at most).
- ``bucket_mb`` (DDP's gradient bucket) old -> new, or xR (R times as large, R times fewer): the gradients' bytes (the all-reduces'
  message sizes summed) regrouped into new-sized buckets (at most one per parameter); the time
  to move the bytes stays, and each bucket added or removed adds or removes one all-reduce
  latency (a prior for the backend, capped by the fastest all-reduce in the step) and the
  fixed part of the CPU call that issues it.
- ``microbatches`` (a pipeline's micro-batch count at the same global batch) old -> new: each
  micro-batch's work scales by old/new, its fixed part, untraced time and its send and receive
  calls stay per micro-batch, and the pipeline's schedule (1F1B or all forwards then all backwards, read from
  the trace) is replayed op by op with each stage's new forward and backward times
  (``pipeline_makespan``); the difference is added to the replayed step.

Every edit but the micro-batch re-split is a change of durations and latencies in the graph,
so the replay (the critical path method) decides how much of it reaches the step: a longer
backward that hides the all-reduce, a rank that waits for its peer.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bottleneck_oracle.analysis.phases import BACKWARD, DP_SYNC, FORWARD, NONE, OPTIMIZER
from bottleneck_oracle.analysis.whatif import EditedTimes, _program_order_into
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, EdgeKind

KNOBS = ("batch", "seq", "accum", "checkpoint", "bucket_mb", "microbatches")
MAX_RATIO = 1e5
"""A knob changes a size by at most this factor either way: beyond, the answer is not a replay of this job."""
_META = frozenset(
    {
        "aten::view",
        "aten::as_strided",
        "aten::t",
        "aten::transpose",
        "aten::detach",
        "detach",
        "aten::alias",
        "aten::_unsafe_view",
        "aten::expand",
        "aten::permute",
        "aten::reshape",
        "aten::empty",
        "aten::empty_strided",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::slice",
        "aten::select",
        "aten::split",
        "aten::chunk",
        "aten::narrow",
    }
)
_ATTENTION = re.compile(r"attention|sdpa|flash|fmha", re.IGNORECASE)
_COMM = re.compile(
    r"c10d::|gloo:|mpi:|ucc:|nccl:|rccl:|record_param_comms|ProcessGroup|all_reduce|allreduce|broadcast|all_gather|reduce_scatter"
)
_DEFAULT_FIXED_US = 1.0
FIXED_FACTOR = 30.0
"""A CPU op's fixed part, in units of the trace's own metadata-op median: the one number of the
method fitted on recorded re-runs (``benchmarks/knobs.py``: the best of a grid on all changes;
the figures in docs/accuracy/reruns.md are for it chosen on one model size and scored on the
other, and on one layout and scored on the other). It stands for what a larger shape costs
less than its share: allocation, dispatch and a kernel's start, and the better use of the cores
a larger matrix gets."""
GLOO_LATENCY_US = 50.0
"""The latency a bucket added or removed costs or saves over gloo (TCP): a prior, capped by the step's fastest all-reduce."""
DEVICE_LATENCY_US = 15.0
"""The same on NCCL/RCCL within a host."""
MIB = 1024.0 * 1024.0


@dataclass(frozen=True, slots=True)
class Knob:
    """A configuration change: ``name`` from ``old`` (None: read from the trace, or 1 for
    ``accum``) to ``new``. ``checkpoint`` is 0 (off) or 1 (on)."""

    name: str
    new: float
    old: float | None = None
    relative: bool = False
    """Given as a ratio (``batch=x2``): ``old`` is 1 and ``new`` the ratio."""

    def __post_init__(self) -> None:
        if self.name not in KNOBS:
            raise ValueError(f"unknown knob {self.name!r} (one of {', '.join(KNOBS)})")
        values = [v for v in (self.old, self.new) if v is not None]
        if self.name == "checkpoint":
            if any(v not in (0, 1) for v in values):
                raise ValueError("checkpoint is on or off")
        elif any(not (0 < v < float("inf")) for v in values):
            raise ValueError("values must be numbers > 0")
        if self.name in ("accum", "microbatches") and any(v != int(v) for v in values):
            raise ValueError(f"{self.name} is a whole number")
        if self.old is not None and self.name != "checkpoint" and not 1 / MAX_RATIO <= self.new / self.old <= MAX_RATIO:
            raise ValueError(f"a change by at most {MAX_RATIO:g}x either way")

    @classmethod
    def parse(cls, text: str) -> Knob:
        """``batch=4:8`` (from 4 to 8), ``batch=x2`` (doubled), ``seq=512:1024``, ``accum=4``,
        ``microbatches=8``, ``checkpoint=on``, ``bucket_mb=25:1``. Values are data: nothing is evaluated."""
        m = re.fullmatch(r"\s*([a-z_]+)\s*=\s*(\S+)\s*", text)
        if not m:
            raise OracleError(f"--set {text!r}: not knob=value (knobs: {', '.join(KNOBS)})")
        name, value = m.groups()
        if name not in KNOBS:
            raise OracleError(f"--set {text!r}: unknown knob {name!r} (one of {', '.join(KNOBS)})")
        try:
            if name == "checkpoint":
                on = {"on": 1.0, "1": 1.0, "true": 1.0, "off": 0.0, "0": 0.0, "false": 0.0}
                if value.lower() not in on:
                    raise ValueError(value)
                return cls(name, on[value.lower()], 1.0 - on[value.lower()])
            if value.lower().startswith("x"):
                return cls(name, float(value[1:]), 1.0, relative=True)
            if ":" in value:
                a, b = value.split(":", 1)
                return cls(name, float(b), float(a))
            if name in ("batch", "seq", "bucket_mb"):
                raise OracleError(
                    f"--set {text!r}: give {name} as old:new (e.g. {name}=4:8) or a ratio (e.g. {name}=x2): the trace does not say its value"
                )
            return cls(name, float(value))
        except ValueError as exc:
            raise OracleError(f"--set {text!r}: {exc}") from None

    def describe(self) -> str:
        if self.name == "checkpoint":
            return f"activation checkpointing {'on' if self.new else 'off'}"
        what = {
            "batch": "batch",
            "seq": "sequence length",
            "accum": "gradient accumulation",
            "bucket_mb": "DDP bucket (MB)",
            "microbatches": "micro-batches",
        }[self.name]
        if self.relative:
            return f"{what} x{self.new:g}"
        return f"{what} {self.old:g} -> {self.new:g}" if self.old is not None else f"{what} -> {self.new:g}"


@dataclass(frozen=True, slots=True)
class Pieces:
    """The step's time split for scaling: every node, and every stretch of time before a node on its
    thread (an op's own time, or untraced), with its phase, micro-batch and fixed part (µs)."""

    node_phase: np.ndarray
    node_mb: np.ndarray
    node_work: np.ndarray  # bool: the node's duration is work that scales with shapes
    node_comm: np.ndarray  # bool: a collective, send/recv or the CPU call that issues one
    node_attention: np.ndarray
    gap_len: np.ndarray
    gap_node: np.ndarray
    gap_work: np.ndarray  # bool: an op's own time (work); False: untraced
    gap_comm: np.ndarray  # bool: own time of a communication call
    gap_wait: np.ndarray  # bool: untraced time right after a communication call on its thread: waiting for the peer
    gap_attention: np.ndarray
    into: np.ndarray  # int64 per node: the program-order edge into it (-1: its thread's first)
    fixed_cpu_us: float
    fixed_device_us: float

    @property
    def gap_phase(self) -> np.ndarray:
        """The phase of each stretch: its node's."""
        out: np.ndarray = self.node_phase[self.gap_node]
        return out

    @property
    def gap_pass(self) -> np.ndarray:
        """The stretches that are the pass's own time: neither a communication call's nor waiting for a peer."""
        out: np.ndarray = ~self.gap_comm & ~self.gap_wait
        return out


def fixed_costs(g: ExecutionGraph) -> tuple[float, float]:
    """(CPU, device) fixed cost of an op (µs), from the step: ``FIXED_FACTOR`` times the median CPU
    op that only makes a view or an empty tensor; the 5th percentile of device ops' durations (at
    most 5 µs)."""
    n = g.nodes
    meta = np.array([s in _META for s in g.names], dtype=bool)[n["name"]] & ~n["on_gpu"]
    cpu = (float(np.median(n["mdur"][meta])) if meta.any() else _DEFAULT_FIXED_US) * FIXED_FACTOR
    dev = n["on_gpu"] & np.isin(n["category"], (Category.KERNEL, Category.MEMCPY, Category.MEMSET))
    device = min(float(np.percentile(n["mdur"][dev], 5)), 5.0) if dev.any() else _DEFAULT_FIXED_US
    return max(cpu, 0.0), max(device, 0.0)


def launched_phases(g: ExecutionGraph, phase: np.ndarray, mb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The phase and micro-batch of every node, a device op taking its launching call's (phase
    ranges are CPU ranges: a kernel runs on a stream, outside them)."""
    e = g.edges
    phase, mb = phase.copy(), mb.copy()
    launch = np.flatnonzero((e["kind"] == EdgeKind.LAUNCH) & g.nodes["on_gpu"][e["dst"]])
    src, dst = e["src"][launch], e["dst"][launch]
    take = phase[dst] == NONE
    phase[dst[take]] = phase[src[take]]
    mb[dst[take]] = mb[src[take]]
    return phase, mb


def has_passes(phase: np.ndarray) -> bool:
    """Does the step have forward or backward ranges?"""
    return bool(np.isin(phase, (FORWARD, BACKWARD)).any())


def pieces(g: ExecutionGraph, phase: np.ndarray, mb: np.ndarray) -> Pieces:
    """The step split for scaling (``phase``, ``mb``: ``node_phases``; device ops take their launch's)."""
    phase, mb = launched_phases(g, phase, mb)
    n, gp = g.nodes, g.gaps
    comm_name = np.array([bool(_COMM.search(s)) for s in g.names], dtype=bool)
    attention = np.array([bool(_ATTENTION.search(s)) for s in g.names], dtype=bool)
    device_ranks = np.unique(n["rank"][n["on_gpu"]])
    cpu_only = ~np.isin(n["rank"], device_ranks)
    cat = n["category"]
    comm = np.isin(cat, (Category.COLLECTIVE, Category.P2P)) | comm_name[n["name"]]
    waits = np.isin(cat, (Category.BLOCKING, Category.BARRIER, Category.RUNTIME))
    on_device = n["on_gpu"] & np.isin(cat, (Category.KERNEL, Category.MEMCPY, Category.MEMSET))
    work = ~comm & ~waits & (on_device | ((cat == Category.CPU_OP) & cpu_only))
    gnode = gp["node"].astype(np.int64)
    owner = gp["owner"].astype(np.int64)
    owned = gp["owner_op"].astype(bool) & (owner >= 0)
    safe = np.where(owned, owner, 0)
    gcomm = owned & comm_name[safe]
    gwork = owned & ~gcomm & cpu_only[gnode]
    # untraced time right after a send, receive or collective call on its thread is the wait for
    # the peer (a blocking receive returns from its traced call, then waits): not the pass's work
    into = _program_order_into(g)
    edge = into[gnode]
    has = edge >= 0  # a stretch before its thread's first op has no op before it (and a step may have no edges at all)
    gwait = np.zeros(len(gnode), dtype=bool)
    gwait[has] = ~owned[has] & comm[g.edges["src"][edge[has]]]
    fixed_cpu, fixed_dev = fixed_costs(g)
    return Pieces(
        node_phase=phase,
        node_mb=mb,
        node_work=work,
        node_comm=comm,
        node_attention=attention[n["name"]],
        gap_len=(gp["end"] - gp["start"]).astype(np.float64),
        gap_node=gnode,
        gap_work=gwork,
        gap_comm=gcomm,
        gap_wait=gwait,
        gap_attention=owned & attention[safe],
        into=into,
        fixed_cpu_us=fixed_cpu,
        fixed_device_us=fixed_dev,
    )


def _scaled(d: np.ndarray, fixed: np.ndarray | float, s: np.ndarray | float) -> np.ndarray:
    """Durations whose work (above the fixed part) is scaled by ``s``."""
    f = np.minimum(d, fixed)
    out: np.ndarray = f + (d - f) * s
    return out


def _times(g: ExecutionGraph, p: Pieces, dur: np.ndarray, gap_new: np.ndarray) -> EditedTimes:
    """EditedTimes with node durations ``dur`` and the stretches before nodes at ``gap_new``:
    each program-order latency (or a thread's release) changes by its stretches' change."""
    weight = g.edges["weight"].astype(np.float64).copy()
    release = g.release.astype(np.float64).copy()
    change = np.bincount(p.gap_node, weights=gap_new - p.gap_len, minlength=g.n_nodes)
    has = np.flatnonzero(np.abs(change) > 1e-9)
    edges = p.into[has]
    e_ok = edges >= 0
    np.add.at(weight, edges[e_ok], change[has[e_ok]])
    weight[edges[e_ok]] = np.maximum(weight[edges[e_ok]], 0.0)
    first = has[~e_ok]
    first = first[np.isfinite(release[first])]
    if len(first):
        start = np.array([g.rank_start(int(r)) for r in g.nodes["rank"][first]])
        release[first] = np.maximum(release[first] + change[first], np.minimum(start, release[first]))
    nodes = np.flatnonzero(np.abs(dur - g.nodes["mdur"]) > 1e-9)
    return EditedTimes(g, dur, weight, release, np.union1d(nodes, first), np.unique(edges[e_ok]))


def _fixed_of(g: ExecutionGraph, p: Pieces) -> np.ndarray:
    return np.where(g.nodes["on_gpu"], p.fixed_device_us, p.fixed_cpu_us)


def knob_times(g: ExecutionGraph, p: Pieces, knob: Knob, times: EditedTimes | None = None) -> EditedTimes:
    """The step's times with ``knob`` applied (every knob but ``microbatches``), on top of
    ``times`` (other edits) when given."""
    base_dur = (times.dur if times is not None else g.nodes["mdur"]).astype(np.float64)
    dur = base_dur.copy()
    gap = p.gap_len.copy()
    passes = np.isin(p.node_phase, (FORWARD, BACKWARD))
    gpass = np.isin(p.gap_phase, (FORWARD, BACKWARD))
    if not passes.any():  # no forward/backward ranges: the step's work outside an optimizer range is the passes'
        if knob.name in ("accum", "checkpoint"):
            raise OracleError(
                f"{knob.name}: the step has no forward and backward ranges to repeat or re-run (record with them, see docs/profiling.md)"
            )
        passes = ~np.isin(p.node_phase, (OPTIMIZER, DP_SYNC))
        gpass = ~np.isin(p.gap_phase, (OPTIMIZER, DP_SYNC))
    fixed = _fixed_of(g, p)
    if knob.name in ("batch", "seq"):
        r = knob.new / (knob.old or 1.0)
        s_node = np.where(p.node_attention & (knob.name == "seq"), r * r, r)
        s_gap = np.where(p.gap_attention & (knob.name == "seq"), r * r, r)
        sel = passes & p.node_work
        dur[sel] = _scaled(base_dur[sel], fixed[sel], s_node[sel])
        gsel = gpass & p.gap_work
        gap[gsel] = _scaled(p.gap_len[gsel], p.fixed_cpu_us, s_gap[gsel])
    elif knob.name == "accum":
        k = knob.new / (knob.old or 1.0)
        sel = passes & ~p.node_comm
        dur[sel] = base_dur[sel] * k
        gsel = gpass & p.gap_pass
        gap[gsel] = p.gap_len[gsel] * k
    elif knob.name == "checkpoint":
        on = 1.0 if knob.new else -1.0
        rank = g.nodes["rank"]
        for r in g.ranks:
            mine = rank == r
            gmine = rank[p.gap_node] == r
            fwd = float(base_dur[mine & (p.node_phase == FORWARD) & ~p.node_comm].sum()) + float(
                p.gap_len[gmine & (p.gap_phase == FORWARD) & p.gap_pass].sum()
            )
            bsel = mine & (p.node_phase == BACKWARD) & ~p.node_comm
            gbsel = gmine & (p.gap_phase == BACKWARD) & p.gap_pass
            bwd = float(base_dur[bsel].sum()) + float(p.gap_len[gbsel].sum())
            if bwd <= 0:
                continue
            # on: the backward re-runs the forward; off: it stops re-running it (at most half of it)
            s = (bwd + fwd) / bwd if on > 0 else max(bwd - fwd, bwd / 2) / bwd
            dur[bsel] = base_dur[bsel] * s
            gap[gbsel] = p.gap_len[gbsel] * s
    elif knob.name == "bucket_mb":
        dur, gap = _rebucket(g, p, knob, base_dur, gap)
    else:
        raise OracleError(f"knob {knob.name} is not a change of durations (it restructures the step)")
    return _times(g, p, dur, gap)


@dataclass(frozen=True, slots=True)
class Buckets:
    """DDP's gradient all-reduces before and after a bucket change, on the rank that sends the most."""

    grad_mb: float
    before: int
    after: int
    latency_us: float


def _allreduces(g: ExecutionGraph, p: Pieces) -> np.ndarray:
    """The gradient all-reduces of the step: all-reduce collectives in the backward pass (or DP
    sync); in a step without forward/backward ranges, every one outside an optimizer range."""
    n = g.nodes
    names = np.array(["reduce" in s.lower() for s in g.names], dtype=bool)[n["name"]]
    where = ~np.isin(p.node_phase, (NONE, FORWARD)) if has_passes(p.node_phase) else p.node_phase != OPTIMIZER
    return np.flatnonzero((n["category"] == Category.COLLECTIVE) & names & where)


def buckets(g: ExecutionGraph, knob: Knob, base_dur: np.ndarray, ar: np.ndarray) -> Buckets:
    """The same gradient bytes in buckets of the new size. An all-reduce's duration in a trace is
    mostly waiting for the last rank to arrive, so no bandwidth is fitted: the bytes, and the
    time to move them, stay; each bucket added or removed adds or removes one latency, the
    backend's (``GLOO_LATENCY_US``, ``DEVICE_LATENCY_US``) or the fastest all-reduce's if that is
    shorter. ``ar``: the step's gradient all-reduces (``_allreduces``)."""
    n = g.nodes
    if not len(ar):
        raise OracleError("bucket_mb: the step has no gradient all-reduce (is this a DDP job?)")
    rank = n["rank"][ar]
    big = max(g.ranks, key=lambda r: (int((rank == r).sum()), float(np.nansum(n["msg_bytes"][ar][rank == r]))))
    mine = ar[rank == big]
    total = float(np.nansum(n["msg_bytes"][mine])) / MIB
    names = {g.names[int(i)].lower() for i in n["name"][mine]}
    prior = GLOO_LATENCY_US if any("gloo" in s for s in names) else DEVICE_LATENCY_US
    if knob.relative or not np.isfinite(n["msg_bytes"][mine]).all():
        # buckets new/old times as large, new/old times fewer of them (the only rule where the trace gives no sizes)
        after = max(1, int(np.ceil(len(mine) * (knob.old or 1.0) / knob.new - 1e-9)))
    else:
        after = max(1, int(np.ceil(total / knob.new - 1e-9)))
    params = _accumulate_grads(g, big)  # a bucket holds whole gradients: at most one per parameter
    if params:
        after = min(after, params)
    return Buckets(grad_mb=total, before=len(mine), after=after, latency_us=min(prior, float(base_dur[ar].min())))


def _accumulate_grads(g: ExecutionGraph, rank: int) -> int:
    """How many gradients a rank accumulates in the step (AccumulateGrad ops: one per parameter): at most that many buckets."""
    gp, n = g.gaps, g.nodes
    owned = gp["owner_op"].astype(bool) & (gp["owner"] >= 0)
    acc = np.array(["AccumulateGrad" in s and "evaluate_function" not in s for s in g.names], dtype=bool)
    sel = owned & (n["rank"][gp["node"].astype(np.int64)] == rank)
    sel[sel] &= acc[gp["owner"][sel].astype(np.int64)]
    return len(np.unique(gp["owner_start"][sel]))


def _rebucket(g: ExecutionGraph, p: Pieces, knob: Knob, base_dur: np.ndarray, gap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ar = _allreduces(g, p)
    b = buckets(g, knob, base_dur, ar)
    n = g.nodes
    dur = base_dur.copy()
    added = b.after - b.before
    for r in g.ranks:
        mine = ar[n["rank"][ar] == r]
        if len(mine):  # one latency per bucket added (or removed), spread over the all-reduces there are
            dur[mine] = np.maximum(base_dur[mine] + added * b.latency_us / len(mine), 0.0)
    # the CPU calls that issue them (c10d::allreduce_ and its like): their fixed part repeats per
    # bucket, the rest (copying gradients into the bucket) follows the bytes, the same in all
    issue = np.flatnonzero(p.node_comm & ~np.isin(n["category"], (Category.COLLECTIVE, Category.P2P)) & (p.node_phase == BACKWARD))
    gsel = np.flatnonzero(p.gap_comm & (p.gap_phase == BACKWARD))
    gap = gap.copy()
    total = float(base_dur[issue].sum()) + float(gap[gsel].sum())
    if total > 0:
        f = max(total + added * p.fixed_cpu_us * len(g.ranks), 0.0) / total
        dur[issue] = base_dur[issue] * f
        gap[gsel] = gap[gsel] * f
    return dur, gap


def pipeline_makespan(fwd: Sequence[float], bwd: Sequence[float], m: int, schedule: str = "1f1b") -> float:
    """The step of a pipeline of ``len(fwd)`` stages over ``m`` micro-batches, each stage's
    forward and backward of one micro-batch taking ``fwd[s]`` and ``bwd[s]``, replayed op by op:
    a forward waits for the previous stage's forward of its micro-batch, a backward for the next
    stage's backward of it (the last stage's for its own forward), and each stage runs its ops in
    the schedule's order. ``1f1b``: stage ``s`` runs ``p - s - 1`` warm-up forwards, then a
    forward and a backward in turn, then the remaining backwards; ``afab``: every forward, then
    every backward."""
    p = len(fwd)
    order: list[list[tuple[int, int]]] = []  # (0 forward | 1 backward, micro-batch) per stage
    for st in range(p):
        if schedule == "afab":
            order.append([(0, i) for i in range(m)] + [(1, i) for i in range(m)])
            continue
        warm = min(p - st - 1, m)
        ops = [(0, i) for i in range(warm)]
        for i in range(m - warm):
            ops += [(0, i + warm), (1, i)]
        order.append(ops + [(1, i) for i in range(m - warm, m)])
    done = np.full((2, p, m), np.nan)
    free = [0.0] * p
    pos = [0] * p
    left = 2 * p * m
    while left:
        moved = False
        for st in range(p):
            while pos[st] < len(order[st]):
                kind, i = order[st][pos[st]]
                if kind == 0:
                    dep = done[0, st - 1, i] if st else 0.0
                else:
                    dep = done[1, st + 1, i] if st < p - 1 else done[0, st, i]
                if np.isnan(dep):
                    break
                free[st] = done[kind, st, i] = max(free[st], dep) + (bwd[st] if kind else fwd[st])
                pos[st] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError("the schedule waits on itself")
    return max(free)


@dataclass(frozen=True, slots=True)
class MicrobatchParts:
    """Each stage's forward and backward time per micro-batch, split into fixed (dispatch and
    untraced time, per micro-batch) and work (scales with the micro-batch's size), in µs; per
    pipeline (data-parallel replicas are pipelines of their own), its ranks in stage order."""

    microbatches: int
    schedule: str  # "1f1b" or "afab"
    pipelines: tuple[tuple[int, ...], ...]  # ranks, stage order
    fixed_fwd: dict[int, float]
    work_fwd: dict[int, float]
    fixed_bwd: dict[int, float]
    work_bwd: dict[int, float]

    @property
    def stages(self) -> int:
        return max(len(ranks) for ranks in self.pipelines)

    def step(self, m: int) -> float:
        """The passes' time for the same global batch in ``m`` micro-batches: each pipeline's
        schedule replayed with per-micro-batch times ``fixed + work x old / m``, the slowest."""
        k = self.microbatches / m
        return max(
            pipeline_makespan(
                [self.fixed_fwd[r] + self.work_fwd[r] * k for r in ranks],
                [self.fixed_bwd[r] + self.work_bwd[r] * k for r in ranks],
                m,
                self.schedule,
            )
            for ranks in self.pipelines
        )


def _pipelines(g: ExecutionGraph, first_forward: dict[int, float]) -> tuple[tuple[int, ...], ...]:
    """The ranks of each pipeline (joined by send/recv pairs), in stage order: the order of
    ``first_forward``, when each rank ran the first micro-batch's forward."""
    e = g.edges
    parent = {r: r for r in g.ranks}

    def root(r: int) -> int:
        while parent[r] != r:
            r = parent[r]
        return r

    pair = np.flatnonzero(e["kind"] == EdgeKind.SEND_RECV)
    if len(pair):  # each barrier's lowest and highest rank (a send/recv pair's two), joined; each rank pair once
        src, dst = e["src"][pair], g.nodes["rank"][e["dst"][pair]].astype(np.int64)
        order = np.lexsort((dst, src))
        s, d = src[order], dst[order]
        cut = s[1:] != s[:-1]
        first, last = np.concatenate([[True], cut]), np.concatenate([cut, [True]])
        for a, b in np.unique(np.stack([d[first], d[last]], axis=1), axis=0).tolist():
            parent[root(int(b))] = root(int(a))
    groups: dict[int, list[int]] = {}
    for r in g.ranks:
        if r in first_forward:
            groups.setdefault(root(r), []).append(r)
    return tuple(tuple(sorted(v, key=lambda r: first_forward[r])) for v in groups.values())


def microbatch_parts(g: ExecutionGraph, p: Pieces, dur: np.ndarray) -> MicrobatchParts:
    n = g.nodes
    m = int(p.node_mb.max()) + 1 if len(p.node_mb) and p.node_mb.max() >= 0 else 0
    if m < 1:
        raise OracleError("microbatches: the step has no per-micro-batch phase ranges (forward.mb0, ...)")
    fixed_node = np.minimum(dur, _fixed_of(g, p))
    parts: dict[str, dict[int, float]] = {"fixed_fwd": {}, "work_fwd": {}, "fixed_bwd": {}, "work_bwd": {}}
    first_forward: dict[int, float] = {}
    interleaved = False
    gap_rank = n["rank"][p.gap_node]
    transfer = np.isin(n["category"], (Category.COLLECTIVE, Category.P2P))
    for r in g.ranks:
        in_mb = (n["rank"] == r) & (p.node_mb >= 0) & ~n["on_gpu"]
        fwd_nodes = in_mb & (p.node_phase == FORWARD)
        if not fwd_nodes.any():
            continue
        # stage order: a later stage's forward of the first micro-batch waits for the earlier's
        # activations; the middle of its work (the buffer for them may be made before either starts)
        work = fwd_nodes & (p.node_mb == 0) & p.node_work
        first_forward[r] = float(np.median(n["start"][work if work.any() else fwd_nodes]))
        last_forward = float(n["start"][fwd_nodes & (p.node_mb == m - 1)].min(initial=np.inf))
        interleaved |= bool((n["start"][in_mb & (p.node_phase == BACKWARD)] < last_forward).any())
        for code, tag in ((FORWARD, "fwd"), (BACKWARD, "bwd")):
            mine = (n["rank"] == r) & (p.node_phase == code) & (p.node_mb >= 0) & ~p.node_comm
            gm = (gap_rank == r) & (p.gap_phase == code) & (p.node_mb[p.gap_node] >= 0) & p.gap_pass
            work_nodes = mine & p.node_work
            work = float((dur[work_nodes] - fixed_node[work_nodes]).sum())
            fixed = float(fixed_node[work_nodes].sum()) + float(dur[mine & ~p.node_work].sum())
            gw = gm & p.gap_work
            gfix = np.minimum(p.gap_len[gw], p.fixed_cpu_us)
            work += float((p.gap_len[gw] - gfix).sum())
            fixed += float(gfix.sum()) + float(p.gap_len[gm & ~p.gap_work].sum())
            # the calls that send and receive a micro-batch's activations and gradients repeat per
            # micro-batch: their own time is fixed (the wait for the peer after them is not: the
            # schedule's replay has it; nor is the transfer's backend op, which holds that wait)
            calls = (n["rank"] == r) & (p.node_phase == code) & (p.node_mb >= 0) & p.node_comm & ~n["on_gpu"] & ~transfer
            gc = (gap_rank == r) & (p.gap_phase == code) & (p.node_mb[p.gap_node] >= 0) & p.gap_comm
            fixed += float(dur[calls].sum()) + float(p.gap_len[gc].sum())
            parts[f"fixed_{tag}"][r] = fixed / m
            parts[f"work_{tag}"][r] = work / m
    if not first_forward:
        raise OracleError("microbatches: the step's micro-batch ranges hold no forward work")
    return MicrobatchParts(
        microbatches=m,
        schedule="1f1b" if interleaved or m == 1 else "afab",
        pipelines=_pipelines(g, first_forward),
        **parts,
    )


def interval(g: ExecutionGraph, step_us: float) -> tuple[float, float] | None:
    """The 90% interval of a ``--set`` prediction of step ``g``: ``step_us`` times the 5th and 95th
    percentiles of measured / predicted over the recorded knob changes (``knob_errors.json``,
    written by ``benchmarks/knobs.py --write-interval``). None on a step with device work (the
    re-runs were CPU runs), or if the package has none."""
    q = _spread()
    if q is None or g.nodes["on_gpu"].any():
        return None
    return step_us * q[0], step_us * q[1]


@functools.cache
def _spread() -> tuple[float, float] | None:
    """(low, high) of knob_errors.json, read once."""
    import json
    from importlib import resources

    try:
        q = json.loads((resources.files("bottleneck_oracle.analysis") / "knob_errors.json").read_text())
        return float(q["low"]), float(q["high"])
    except (OSError, ValueError, KeyError, TypeError):
        return None

"""Facts about a step read straight from its events, independently of the graph.

The graph is a model of the step; these are what the trace says without any model: when each
rank's device finished the work of the step before and of this one, how busy the device was in
between, how far ahead of the device the CPU ran, how long the host sat in calls that block on
the device, which host threads slept through the step, how many device events there are, and of
the run: the ranks present against the job's world size and whether events were left out of the
trace (sampled or removed). ``analysis.checks`` ties the analysis of a step to these facts with
invariants; a contradiction becomes a warning for the user.

One definition is shared with the graph on purpose: the step's **period** on a rank runs from its
*origin*, the later of its CPU step start and the end of the device work launched before it
(work queued by earlier steps), to the later of its CPU step end and the end of the device work
the step launched. In a device-bound steady state that is the device's period (the ProfilerStep
span, once the CPU is as far ahead as it gets); on a CPU-bound step it is the ProfilerStep span.
The graph measures its step time from the same origin (``Window.origins``), and the self-check
compares the two ends.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np

from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline.arrays import isin_small, isin_sorted
from bottleneck_oracle.graph_pipeline.events import DEVICE_WAIT_NAME, PRECISION_OP_NAME, EvClass, EventTable, Step, device_label

DEVICE_CLASSES = (EvClass.KERNEL, EvClass.MEMCPY, EvClass.MEMSET)
# runtime calls that return only when device work has completed (or may: a copy to pageable host
# memory). The graph decides call by call from the timing; the facts go by name
BLOCKING_NAME = re.compile(
    r"synchroni[sz]e|memcpy(?!.*async)|memcpyasync|eventquery|streamquery|" + F.HOST_WAIT_PATTERN,
    re.IGNORECASE,
)
HOST_BLOCKED_NAME = re.compile(F.HOST_BLOCKED_PATTERN)
COLLECTIVE_WAIT_NAME = re.compile(F.COLLECTIVE_WAIT_PATTERN)
C10D_CALL_NAME = re.compile(F.C10D_CALL_PATTERN, re.IGNORECASE)
WAITING_NAME = re.compile(F.HOST_BLOCKED_PATTERN + "|" + F.COLLECTIVE_WAIT_PATTERN + "|" + F.C10D_CALL_PATTERN)
"""The host calls that block their thread without computing: the Python calls of HOST_BLOCKED_PATTERN,
a functional collective's wait (COLLECTIVE_WAIT_PATTERN) and a collective's own call (C10D_CALL_PATTERN)."""
PAST_END_US = 1000.0  # µs: a span running on this far past its rank's last event may be one the trace ends inside (held_share)
BLOCKING_FACT_US = 1000.0  # µs: a named blocking call this long is counted as time blocked on the device
LAUNCH_TOLERANCE_US = 5.0  # µs of host/device clock disagreement a device op may start before its launch call (the builder's default too)
ASLEEP_SHARE = 0.9  # a host thread with one op covering this share of the step, and few ops, slept through it
ASLEEP_MAX_OPS = 200
_COMM_PREFIXES = (*F.CPU_BACKEND_PREFIXES, "nccl:", "c10d::", "record_param_comms")


@dataclass(slots=True)
class RankFacts:
    """One rank's facts for one step (µs from the table's time zero, like the events)."""

    rank: int
    cpu_start: float  # the ProfilerStep span (or the rank's first event without one)
    cpu_end: float
    device_ops: int  # device events the step launched (any category read as a device op)
    device_end: float | None  # end of the device work the step launched (None: none)
    prev_device_end: float | None  # end of the device work launched before the step
    origin: float  # max(cpu_start, prev_device_end)
    step_end: float  # max(cpu_end, device_end)
    device_busy_us: float  # device busy time (any step's work) between origin and step_end
    lead_us: float | None  # median launch-call start to device-op start over the step's ops
    blocking_us: float  # host time in calls named as blocking (synchronize, copies, queries) of >= 1 ms
    asleep: list[dict] = field(default_factory=list)  # host threads that slept through the step
    launched: int = 0  # of device_ops, those tied to the runtime call that launched them (correlation)
    early_launches: int = 0  # of those, the ones starting more than LAUNCH_TOLERANCE_US before their call began
    runtime_calls: int = 0  # runtime calls (launches, copies, syncs) of the rank's host in the step
    host_blocked_us: float = (
        0.0  # time of the step's own thread in calls that block it (sleep, lock, select, a collective's wait; each >= 1 ms)
    )
    setup_us: float = 0.0  # one-time work in the step: runtime setup calls with the device idle, torch.compile compiling (setup_calls)
    launch_calls: int = 0  # calls of the rank's host in the step that launch device work (LAUNCH_NAME), on a rank with device events
    lost_launches: int = 0  # of those, the ones no device op in the trace is tied to
    unrun_launches: int = 0  # of those, the ones after the rank's last launch that has a device op (the trace ends before they ran)
    queued_before_trace_us: float = 0.0  # how long the rank's first device op waited after its launch for work queued before the trace
    first_op_held_us: float = 0.0  # as long, where that wait is no work of the loop's (QUEUED_OF_SPAN): an untraced wait
    past_end_us: float = 0.0  # how far the step's span runs past the start of the rank's last event (the trace ends inside it)
    held_share: float = 1.0  # where that is over PAST_END_US: the step's host events against the median of its rank's other steps'
    hidden: bool = False  # its host ended before the device work queued before it did, and none of its own ended later: origin = cpu_start
    devices: int = 0  # devices the step's device ops ran on (their processes)
    kernel_us: float = 0.0  # time of the kernels the step launched, collectives' kernels left out
    device_comm_only_us: float = 0.0  # of device_busy_us, the time the device ran collectives' kernels and nothing else
    low_precision_us: float = 0.0  # of it, kernels that run in 16 or 8 bits (kernel_precision)
    conv_kernel_us: float = 0.0  # of it, kernels a convolution op launched
    nhwc_kernel_us: float = 0.0  # of those, kernels whose names say NHWC (channels last) and no layout conversion
    host_matmul_us: float = 0.0  # host time inside matmul, convolution and attention ops (the union of their spans)
    host_low_precision_us: float = 0.0  # of it, inside those whose input is 16 or 8 bits ("Input type", record_shapes)
    host_matmul_flops: float = 0.0  # the FLOPs their input sizes give (events.shape_flops; record_shapes; 0: not recorded), summed
    host_matmul_ops: int = 0  # those ops whose FLOPs are known
    loader_waits: list[list[float]] = field(
        default_factory=list
    )  # the step's thread waiting for a DataLoader's workers ([start, end], each >= 1 ms)
    device_busy_each: list[list] = field(
        default_factory=list
    )  # a process that drives several devices: [device's process, its busy µs, its label ("GPU 1")] each, between origin and step_end

    @property
    def loader_wait_us(self) -> float:
        """Time of the step's thread waiting for a multi-process DataLoader's workers (loader_waits)."""
        return float(sum(b - a for a, b in self.loader_waits))

    @property
    def measured(self) -> float:
        return self.cpu_end - self.cpu_start

    @property
    def period(self) -> float:
        return self.step_end - self.origin

    @property
    def device_busy(self) -> float:
        """Share of the period the device was busy (0 without device work)."""
        return self.device_busy_us / self.period if self.period > 0 else 0.0

    def to_dict(self, offset: float = 0.0) -> dict:
        """As JSON, times in µs from ``offset`` (a window's start; durations unchanged)."""
        d = {f: getattr(self, f) for f in _RANK_FACT_FIELDS}  # (dataclasses.asdict deep-copies: 4% of a long trace's analysis)
        d["asleep"] = [dict(x) for x in self.asleep]
        d["device_busy_each"] = [list(x) for x in self.device_busy_each]
        d["loader_waits"] = [[a - offset, b - offset] for a, b in self.loader_waits]
        for k in ("cpu_start", "cpu_end", "device_end", "prev_device_end", "origin", "step_end"):
            if d[k] is not None:
                d[k] -= offset
        d.update(measured_us=self.measured, period_us=self.period, device_busy=self.device_busy)
        return d


_RANK_FACT_FIELDS = tuple(f.name for f in fields(RankFacts))


def _union(lo: np.ndarray, hi: np.ndarray, a: float, b: float) -> float:
    """Length of the union of the intervals [lo, hi) clipped to [a, b)."""
    lo, hi = np.clip(lo, a, b), np.clip(hi, a, b)
    keep = hi > lo
    if not keep.any():
        return 0.0
    lo, hi = lo[keep], hi[keep]
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    starts_new = np.ones(len(lo), dtype=bool)
    starts_new[1:] = lo[1:] > hi[:-1]
    group = np.cumsum(starts_new) - 1
    first = np.flatnonzero(starts_new)
    ends = np.maximum.reduceat(hi, first)
    return float((ends - lo[first]).sum()) if len(group) else 0.0


def _device_index(table: EventTable) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, np.ndarray, np.ndarray]]:
    """Per rank, its device ops: (anchors sorted, running max of their ends in that order, starts
    sorted, ends in start order, the longest op's duration, per op in start order whether it is a
    collective's kernel, and its device's process), computed once per table."""
    cache = table.facts_cache = table.facts_cache or {}
    if "device" in cache:
        return cache["device"]
    c = table.cols
    order, rank_s, anchor_s = table.index()
    out: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, np.ndarray, np.ndarray]] = {}
    dev_sorted = np.isin(c["cls"][order], DEVICE_CLASSES)
    comm_name = np.zeros(len(table.names), dtype=bool)
    dev_codes = np.unique(c["name"][order[dev_sorted]])
    comm_name[dev_codes] = [bool(_COMM_KERNEL.search(table.names[k])) for k in dev_codes.tolist()]
    busy_sorted = dev_sorted & ~_device_waits(table)[c["name"][order]]  # (a queue waiting is not busy)
    for r in table.ranks:
        lo = int(np.searchsorted(rank_s, rank_s.dtype.type(r), side="left"))
        hi = int(np.searchsorted(rank_s, rank_s.dtype.type(r), side="right"))
        rows = order[lo:hi][dev_sorted[lo:hi]]
        if not len(rows):
            continue
        ends = c["ts"][rows] + c["dur"][rows]
        busy = order[lo:hi][busy_sorted[lo:hi]]
        by_start = busy[np.argsort(c["ts"][busy], kind="stable")]
        out[r] = (
            anchor_s[lo:hi][dev_sorted[lo:hi]],
            np.maximum.accumulate(ends),
            c["ts"][by_start],
            c["ts"][by_start] + c["dur"][by_start],
            float(c["dur"][busy].max()) if len(busy) else 0.0,
            comm_name[c["name"][by_start]],
            c["pid"][by_start],
        )
    cache["device"] = out
    return out


def _device_label(table: EventTable, rank: int, pid: int) -> str:
    """events.device_label of a rank's device process, from the names the table kept ("python / GPU 1")."""
    return device_label(str(table.inputs.get(rank, {}).get("process_names", {}).get(str(pid), "")).split(" / "), pid)


def _device_waits(table: EventTable) -> np.ndarray:
    """Per name code: is it a device op that is its queue waiting (fields.DEVICE_WAIT_PATTERN)?"""
    return np.array([bool(DEVICE_WAIT_NAME.match(n)) for n in table.names], dtype=bool)


LONG_HOST_US = 1000.0  # µs: host ops this long are indexed for the asleep test (a tenth of any step worth looking at)


def _long_host_ops(table: EventTable) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per rank: its host ops of at least LONG_HOST_US, (rows sorted by start, the longest one's
    duration), computed once per table."""
    cache = table.facts_cache = table.facts_cache or {}
    if "long_host" not in cache:
        c = table.cols
        rows = np.flatnonzero(np.isin(c["cls"], (EvClass.CPU, EvClass.RUNTIME)) & (c["dur"] >= LONG_HOST_US))
        rows = rows[np.lexsort((c["ts"][rows], c["rank"][rows]))]
        out = {}
        for r in np.unique(c["rank"][rows]).tolist():
            mine = rows[c["rank"][rows] == r]
            out[int(r)] = (mine, float(c["dur"][mine].max()))
        cache["long_host"] = out
    return cache["long_host"]


LAUNCH_NAME = re.compile(r"launch(?!hostfunc)", re.IGNORECASE)
"""A runtime call that launches device work: ``cudaLaunchKernel``, ``cuLaunchKernelEx``,
``hipLaunchKernel``, ``hipExtLaunchKernel``, ``cudaGraphLaunch`` (not ``cudaLaunchHostFunc``,
which runs a host function)."""


def _launch_rows(table: EventTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows of the launch calls of ranks that have device events, sorted; of those, the ones no
    device op is tied to; of those, the ones after their rank's last launch that has a device op),
    computed once per table. A rank without any device event is a job profiled on its host only
    (facts.unprofiled): its launches are not lost, they were not asked for. Launches lost after
    the last one that is not are the trace ending before their work ran (a trace cut at a time, a
    profiler stopped with work still queued); lost among found ones, they were not run or not
    recorded (captured into a CUDA graph, a full activity buffer)."""
    cache = table.facts_cache = table.facts_cache or {}
    if "launch" not in cache:
        c = table.cols
        rt = np.flatnonzero(c["cls"] == EvClass.RUNTIME)
        codes = np.unique(c["name"][rt])
        is_launch = np.zeros(len(table.names), dtype=bool)
        is_launch[codes] = [bool(LAUNCH_NAME.search(table.names[k])) for k in codes.tolist()]
        with_device = np.array(sorted(_device_index(table)), dtype=c["rank"].dtype)
        launcher = table.launchers()
        # a launch without a correlation id on a rank whose device ops are tied to their launches another
        # way is not a lost one: Ascend's CANN layer writes its ``Node@launch`` calls so, the tasks tied to
        # the torch ops by flows (events._link_by_flows); on a rank none of whose device ops is tied (a
        # trace whose args were stripped) such launches are lost, and said
        tied_ranks = np.unique(c["rank"][launcher[launcher >= 0]])
        calls = rt[
            is_launch[c["name"][rt]]
            & isin_small(c["rank"][rt], with_device)
            & ((c["correlation"][rt] >= 0) | ~np.isin(c["rank"][rt], tied_ranks))
        ]
        tied = np.unique(launcher[launcher >= 0])
        found = np.isin(calls, tied)
        lost = calls[~found]
        seen = _max_by_rank(c["rank"][calls[found]], c["ts"][calls[found]], int(c["rank"].max()) if len(c["rank"]) else 0)
        seen[~np.isfinite(seen)] = np.inf  # (a rank none of whose launches has a device op: none counts as after)
        cache["launch"] = (calls, lost, lost[c["ts"][lost] > seen[c["rank"][lost]]])
    return cache["launch"]


QUEUED_LAG_MIN_US = 1000.0
"""µs: the rank's first device op in the trace starting this long after its launch call returned,
with the device busy from then on, waited for work queued before the trace began (in every
recorded trace the first op whose launch is traced starts within 10 µs of it)."""
QUEUED_BUSY = 0.95
"""...busy at least this share of the time from that op's start to the end of the step's device work."""
QUEUED_OF_SPAN = 0.5
"""...and the step measured from there (that op's start to the step's end) at least this share of
its host's span. Work the loop queued in earlier steps holds the device while the host runs
ahead, so the two keep one pace: a step's period is about its host's span (train_1rank_5steps,
split a step a file: 95.7 ms from the op's start, a 95.7 ms span). Measured from there, a step
whose host ran on far longer (an excerpt of 7 events: 18.1 ms of a 413.5 ms span, a 45 µs
kernel 64 ms after its launch) would not be the loop's period: what held that op is no work of
this loop (events left out of the trace, another process on the device), an untraced wait."""


def _queued_before_trace(
    table: EventTable, own: np.ndarray, starts: np.ndarray, ends: np.ndarray, device_end: float, host: tuple[float, float]
) -> tuple[float, float, bool] | None:
    """Where the step holds its rank's first device op and that op started QUEUED_LAG_MIN_US or
    more after its launch call returned, the device busy (QUEUED_BUSY) from then to the end of
    the step's device work: the device was running work queued before the trace began (a trace
    trimmed or split at this step: TraceLens' per-iteration files keep a step's launches and the
    ops they launched, not the work queued before it). (the end of that work: the op's start, the
    wait, whether the step measured from there is its loop's: QUEUED_OF_SPAN of its host's span,
    ``host``, the step's start and end) or None. A device that idled, then woke slowly (ms after a
    long idle) is not busy after."""
    c = table.cols
    if not len(own) or not len(starts):
        return None
    first = own[np.argmin(c["ts"][own])]
    if c["ts"][first] > starts[0]:
        return None  # (the rank's device ran something earlier in the trace)
    call = int(table.launchers()[first])
    if call < 0:
        return None  # (launched before the trace began: its own work is traced)
    start = float(c["ts"][first])
    lag = start - float(c["ts"][call] + c["dur"][call])
    if lag < QUEUED_LAG_MIN_US or device_end <= start:
        return None
    a = int(np.searchsorted(starts, start, side="left"))
    b = int(np.searchsorted(starts, device_end, side="left"))
    if _union(starts[a:b], ends[a:b], start, device_end) < QUEUED_BUSY * (device_end - start):
        return None
    return start, lag, max(host[1], device_end) - start >= QUEUED_OF_SPAN * (host[1] - host[0])


def _held_share(table: EventTable, step: Step | None, rows: np.ndarray) -> float:
    """The step's host events (CPU ops, annotations, runtime calls) against the median of its
    rank's other steps' (1.0 without other steps): a step the trace ends inside lacks the ops
    after the cut; one whose span ends with untraced work (a checkpoint written at the end of the
    last step) holds them all."""
    if step is None:
        return 1.0
    cache = table.facts_cache = table.facts_cache or {}
    counts: dict[tuple[int, int], int] | None = cache.get("host_events")
    if counts is None:  # (once per table, and only where a span runs on past its rank's last event)
        counts = cache["host_events"] = {}
        cls = table.cols["cls"]
        for st in table.steps:
            mine = table.rows_between(st.rank, st.start, st.end)
            counts[st.rank, st.number] = int(isin_small(cls[mine], (EvClass.CPU, EvClass.RUNTIME)).sum())
    others = [n for (r, k), n in counts.items() if r == step.rank and k != step.number]
    if not others:
        return 1.0
    return counts.get((step.rank, step.number), 0) / max(float(np.median(others)), 1.0)


def _rank_last_event(table: EventTable) -> dict[int, float]:
    """Per rank, the start of its last event of any kind (µs): where its trace stops."""
    cache = table.facts_cache = table.facts_cache or {}
    if "last_event" not in cache:
        rank = table.cols["rank"]
        top = _max_by_rank(rank, table.cols["ts"], int(rank.max()) if len(rank) else 0)
        cache["last_event"] = {int(r): float(top[r]) for r in np.flatnonzero(np.isfinite(top)).tolist()}
    return cache["last_event"]


def _max_by_rank(rank: np.ndarray, value: np.ndarray, last_rank: int) -> np.ndarray:
    """Per rank 0 … ``last_rank``, the largest of its values (-inf: none). Ranks are small
    non-negative numbers: an array indexed by them, no sort."""
    top = np.full(last_rank + 1, -np.inf)
    np.maximum.at(top, rank.astype(np.int64), value)
    return top


_LOW_KERNEL = re.compile(F.LOW_PRECISION_KERNEL_PATTERN, re.IGNORECASE)
_FULL_KERNEL = re.compile(F.FULL_PRECISION_KERNEL_PATTERN, re.IGNORECASE)
_COMM_KERNEL = re.compile(r"nccl|rccl|" + F.DEVICE_COLLECTIVE_PATTERN, re.IGNORECASE)  # (NCCL/RCCL and collectives in kernels of their own)
_CONV_OP = re.compile(r"conv")
_NHWC_KERNEL = re.compile(r"nhwc", re.IGNORECASE)
_NCHW_KERNEL = re.compile(r"nchw|transpose", re.IGNORECASE)


def kernel_precision(table: EventTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the rows of the compute kernels, collectives' kernels left out, sorted; per kernel 1 where
    it runs in 16 or 8 bits, 0 in 32 or 64, -1 where the trace does not say; per kernel 1 where a
    convolution op launched it, 2 where it did and the kernel's name says NHWC and neither NCHW
    nor a transpose — a channels-last convolution's, not a layout conversion's — 0 otherwise),
    computed once per table. The launching op is the innermost matmul, convolution or attention
    op (fields.PRECISION_OP_PATTERN) open around the kernel's launch call on its thread. A kernel whose launching op has an "Input type"
    (``record_shapes=True``) runs in the precision of that op's first floating-point input; any
    other is read from its name (fields.LOW_/FULL_PRECISION_KERNEL_PATTERN)."""
    cache = table.facts_cache = table.facts_cache or {}
    if "precision" in cache:
        return cache["precision"]
    c = table.cols
    kern = np.flatnonzero(c["cls"] == EvClass.KERNEL)
    codes = np.unique(c["name"][kern])
    by_name = np.full(len(table.names), -1, dtype=np.int8)
    comm = np.zeros(len(table.names), dtype=bool)
    for k in codes.tolist():
        name = table.names[k]
        comm[k] = bool(_COMM_KERNEL.search(name))
        by_name[k] = 1 if _LOW_KERNEL.search(name) else 0 if _FULL_KERNEL.search(name) else -1
    kern = kern[~comm[c["name"][kern]]]
    prec = by_name[c["name"][kern]]
    op_of = np.full(len(kern), -1, dtype=np.int64)
    cpu = np.flatnonzero(c["cls"] == EvClass.CPU)
    ops = cpu[_typed_names(table)[c["name"][cpu]]]
    launcher = table.launchers()[kern] if len(kern) else np.zeros(0, dtype=np.int64)
    has = np.flatnonzero(launcher >= 0)
    if len(ops) and len(has):
        calls = launcher[has]
        # the innermost typed op of the launch call's thread open around the call: the one that
        # started last at or before it, if it ends at or after the call's end
        both = np.concatenate([ops, calls])
        th = np.zeros(len(both), dtype=np.int64)
        for col in ("rank", "pid", "tid"):  # one exact key per (rank, pid, tid): each column made dense
            values, dense = np.unique(c[col][both], return_inverse=True)
            th = th * len(values) + dense.reshape(-1)
        th_ops, th_calls = th[: len(ops)], th[len(ops) :]
        t_lo = float(min(c["ts"][ops].min(), c["ts"][calls].min()))
        width = float(max((c["ts"][ops] + c["dur"][ops]).max(), (c["ts"][calls] + c["dur"][calls]).max()) - t_lo) + 1.0
        order = np.lexsort((c["ts"][ops], th_ops))
        key_ops = th_ops[order] * width + (c["ts"][ops][order] - t_lo)
        key_calls = th_calls * width + (c["ts"][calls] - t_lo)
        at = np.searchsorted(key_ops, key_calls, side="right") - 1
        ok = at >= 0
        cand = ops[order][np.maximum(at, 0)]
        ok &= th_ops[order][np.maximum(at, 0)] == th_calls
        ok &= c["ts"][cand] + c["dur"][cand] >= c["ts"][calls] + c["dur"][calls]
        op_of[has[ok]] = cand[ok]
        typed_ok = ok & np.isfinite(c["elem_bytes"][cand])
        prec[has[typed_ok]] = np.where(c["elem_bytes"][cand[typed_ok]] <= 2, 1, 0).astype(np.int8)
    # per kernel: launched by a convolution (1), and of those named channels last (2); else 0
    conv_op = np.zeros(len(table.names), dtype=bool)
    op_codes = np.unique(c["name"][op_of[op_of >= 0]])
    conv_op[op_codes] = [bool(_CONV_OP.search(table.names[k])) for k in op_codes.tolist()]
    nhwc = np.zeros(len(table.names), dtype=bool)
    nhwc[codes] = [bool(_NHWC_KERNEL.search(table.names[k])) and not _NCHW_KERNEL.search(table.names[k]) for k in codes.tolist()]
    conv = (op_of >= 0) & conv_op[c["name"][np.maximum(op_of, 0)]]
    layout = np.where(conv, np.where(nhwc[c["name"][kern]], 2, 1), 0).astype(np.int8)
    cache["precision"] = (kern, prec, layout)
    return cache["precision"]


def _names_where(table: EventTable, key: str, test: Callable[[str], bool]) -> np.ndarray:
    """Per name code of ``table``: does its name pass ``test``? Once per table, kept as ``key``."""
    cache = table.facts_cache = table.facts_cache or {}
    if key not in cache:
        cache[key] = np.array([test(n) for n in table.names], dtype=bool)
    out: np.ndarray = cache[key]
    return out


def _typed_names(table: EventTable) -> np.ndarray:
    """Per name code: a matmul, convolution or attention op (fields.PRECISION_OP_PATTERN), whose
    input types give its kernels' precision."""
    return _names_where(table, "typed_names", lambda n: bool(PRECISION_OP_NAME.match(n)))


def _loader_names(table: EventTable) -> np.ndarray:
    """Per name code: the range a multi-process DataLoader records around handing the loop its
    next batch (``fields.LOADER_WAIT_RANGE``)."""
    return _names_where(table, "loader_names", lambda n: n.startswith(F.LOADER_WAIT_RANGE))


def _loader_waits(table: EventTable, rows: np.ndarray, step: Step | None) -> list[list[float]]:
    """The stretches (``[start, end]``, µs) in which the step's own thread (every host thread
    without a step marker) sat inside a multi-process DataLoader's ``__next__`` with no other event
    of its thread open, each ``BLOCKING_FACT_US`` or longer: the loop waiting for the loader's
    workers to hand it a batch (between the batch's arrival and the range's end the thread rebuilds
    its tensors: the ops inside)."""
    c = table.cols
    host = rows[isin_small(c["cls"][rows], (EvClass.CPU, EvClass.RUNTIME))]
    ranges = host[_loader_names(table)[c["name"][host]]]
    if not len(ranges):
        return []
    key = (c["pid"][host].astype(np.int64) << 32) + (c["tid"][host].astype(np.int64) & 0xFFFFFFFF)
    out = []
    for r in ranges.tolist():
        k = (int(c["pid"][r]) << 32) + (int(c["tid"][r]) & 0xFFFFFFFF)
        if step is not None and k != (int(step.pid) << 32) + (int(step.tid) & 0xFFFFFFFF):
            continue
        lo, hi = float(c["ts"][r]), float(c["ts"][r] + c["dur"][r])
        mine = host[(key == k) & (c["ts"][host] >= lo) & (c["ts"][host] < hi)]
        mine = mine[mine != r]
        order = np.argsort(c["ts"][mine], kind="stable")
        starts = c["ts"][mine][order].astype(np.float64)
        ends = np.maximum.accumulate((c["ts"][mine] + c["dur"][mine])[order].astype(np.float64)) if len(mine) else starts
        cursor = lo
        for a, b in zip(np.r_[starts, hi].tolist(), np.r_[ends, hi].tolist()):
            if a - cursor >= BLOCKING_FACT_US:
                out.append([cursor, a])
            cursor = max(cursor, b)
    return out


def _host_matmuls(table: EventTable, rows: np.ndarray, lo: float, hi: float) -> tuple[float, float, float, int]:
    """Of the step's host rows, the matmul, convolution and attention ops: (the time inside them,
    the union of their spans between ``lo`` and ``hi``; of it, inside those whose first
    floating-point input is 16 or 8 bits: what a CPU step's matmuls run in; of those starting
    between ``lo`` and ``hi`` whose inputs' sizes the trace holds, ``record_shapes``: the FLOPs
    those sizes give, events.shape_flops, summed, and how many)."""
    c = table.cols
    ops = rows[(c["cls"][rows] == EvClass.CPU) & _typed_names(table)[c["name"][rows]]]
    if not len(ops):
        return 0.0, 0.0, 0.0, 0
    start = c["ts"][ops].astype(np.float64)
    end = start + c["dur"][ops]
    low = c["elem_bytes"][ops] <= 2  # (NaN: not known, not low)
    flops = c["shape_flops"][ops]
    known = np.isfinite(flops) & (start >= lo) & (start < hi)
    return (
        _union(start, end, lo, hi),
        _union(start[low], end[low], lo, hi) if low.any() else 0.0,
        float(flops[known].sum()),
        int(known.sum()),
    )


def _precision_us(table: EventTable, own: np.ndarray) -> tuple[float, float, float, float]:
    """Of the device rows ``own``: (time of the compute kernels, of it the 16- or 8-bit kernels',
    the time of the kernels a convolution op launched, of it the kernels whose names say NHWC
    and neither NCHW nor a transpose: a channels-last convolution's, not a layout conversion's)."""
    kern, prec, layout = kernel_precision(table)
    if not len(kern) or not len(own):
        return 0.0, 0.0, 0.0, 0.0
    at = np.minimum(np.searchsorted(kern, own), len(kern) - 1)
    at = at[kern[at] == own]
    dur = table.cols["dur"][kern[at]]
    return float(dur.sum()), float(dur[prec[at] == 1].sum()), float(dur[layout[at] > 0].sum()), float(dur[layout[at] == 2].sum())


def index_facts(table: EventTable) -> None:
    """Compute the per-table indexes the facts read (before the table is shared with workers)."""
    _device_index(table)
    _long_host_ops(table)
    _launch_rows(table)
    _rank_last_event(table)
    _compile_codes(table)
    kernel_precision(table)
    _loader_names(table)


def rank_facts(table: EventTable, rank: int, step: Step | None) -> RankFacts:
    """The facts of ``rank`` in ``step`` (None: the whole trace)."""
    c = table.cols
    cls = c["cls"]
    if step is not None:
        cpu_start, cpu_end = step.start, step.end
        rows = table.rows_between(rank, cpu_start, cpu_end)
    else:
        rows = np.flatnonzero(c["rank"] == rank)  # the whole trace: from the rank's first event of any kind
        host = rows[~np.isin(cls[rows], (*DEVICE_CLASSES, EvClass.GPU_SYNC))]
        cpu_start = float(c["ts"][rows].min())
        span = host if len(host) else rows
        cpu_end = float((c["ts"][span] + c["dur"][span]).max())
    own = rows[isin_small(cls[rows], DEVICE_CLASSES)]
    device_end = float((c["ts"][own] + c["dur"][own]).max()) if len(own) else None
    prev_end = None
    untraced_queue = held_apart = 0.0
    busy = comm_only = 0.0
    each: list[list] = []
    dev = _device_index(table).get(rank)
    if dev is not None:
        anchors, running_end, starts, ends, longest, comm, device = dev
        if step is not None:
            k = int(np.searchsorted(anchors, cpu_start, side="left"))  # device ops launched before the step
            prev_end = float(running_end[k - 1]) if k > 0 else None
        if prev_end is None and device_end is not None:  # (the whole trace too: a window without steps starts there)
            queued_before = _queued_before_trace(table, own, starts, ends, device_end, (cpu_start, cpu_end))
            if queued_before is not None and queued_before[2]:
                prev_end, untraced_queue = queued_before[0], queued_before[1]
            elif queued_before is not None:
                held_apart = queued_before[1]
    origin = max(cpu_start, prev_end) if prev_end is not None else cpu_start
    step_end = max(cpu_end, device_end) if device_end is not None else cpu_end
    hidden = origin > step_end  # (a step that adds nothing past earlier steps' work: its period would be negative)
    if hidden:  # its time is its host's span; it adds nothing to the loop's (StepAnalysis.adds_nothing)
        origin = cpu_start
    if dev is not None:
        a = int(np.searchsorted(starts, origin - longest, side="left"))
        b = int(np.searchsorted(starts, step_end, side="left"))
        busy = _union(starts[a:b], ends[a:b], origin, step_end)
        if comm[a:b].any():
            work = ~comm[a:b]
            comm_only = busy - _union(starts[a:b][work], ends[a:b][work], origin, step_end)
        on = device[a:b]
        if len(on) and (on != on[0]).any():  # a process that drives several devices: each one's busy time
            each = [
                [int(p), _union(starts[a:b][on == p], ends[a:b][on == p], origin, step_end), _device_label(table, rank, int(p))]
                for p in np.unique(on).tolist()
            ]
    launcher = table.launchers()
    launched = own[launcher[own] >= 0]
    lag = c["ts"][launched] - c["ts"][launcher[launched]]
    lead = float(np.median(lag)) if len(launched) else None
    runtime = cls[rows] == EvClass.RUNTIME
    rt = rows[runtime & (c["dur"][rows] >= BLOCKING_FACT_US)]
    blocking = float(sum(c["dur"][i] for i in rt.tolist() if BLOCKING_NAME.search(table.names[c["name"][i]])))
    kernel_us, low_us, conv_us, nhwc_us = _precision_us(table, own)
    host_mm_us, host_low_us, mm_flops, mm_shaped = _host_matmuls(table, rows, cpu_start, cpu_end)
    past_end = max(0.0, cpu_end - _rank_last_event(table).get(rank, cpu_end)) if step is not None else 0.0
    return RankFacts(
        rank=rank,
        cpu_start=cpu_start,
        cpu_end=cpu_end,
        device_ops=int(len(own)),
        device_end=device_end,
        prev_device_end=prev_end,
        origin=origin,
        step_end=step_end,
        hidden=hidden,
        devices=int(len(np.unique(c["pid"][own]))),
        device_busy_us=busy,
        device_comm_only_us=comm_only,
        device_busy_each=each,
        lead_us=lead,
        blocking_us=blocking,
        asleep=_asleep(table, rank, rows, cpu_start, cpu_end, step),
        launched=int(len(launched)),
        runtime_calls=int(runtime.sum()),
        early_launches=int((lag < -LAUNCH_TOLERANCE_US).sum()),
        host_blocked_us=_host_blocked(table, rows, step),
        loader_waits=_loader_waits(table, rows, step),
        setup_us=_step_setup(table, rank, rows, cpu_start, step_end),
        launch_calls=int(isin_sorted(rows, _launch_rows(table)[0]).sum()),
        lost_launches=int(isin_sorted(rows, _launch_rows(table)[1]).sum()),
        unrun_launches=int(isin_sorted(rows, _launch_rows(table)[2]).sum()),
        queued_before_trace_us=untraced_queue,
        first_op_held_us=held_apart,
        past_end_us=past_end,
        held_share=_held_share(table, step, rows) if past_end > PAST_END_US else 1.0,
        kernel_us=kernel_us,
        low_precision_us=low_us,
        conv_kernel_us=conv_us,
        nhwc_kernel_us=nhwc_us,
        host_matmul_us=host_mm_us,
        host_low_precision_us=host_low_us,
        host_matmul_flops=mm_flops,
        host_matmul_ops=mm_shaped,
    )


def _host_blocked(table: EventTable, rows: np.ndarray, step: Step | None) -> float:
    """Time of the step's own thread (every host thread without a step marker) in Python calls
    that block it without computing (``fields.HOST_BLOCKED_PATTERN``) and in functional collectives'
    waits (``fields.COLLECTIVE_WAIT_PATTERN``), each ``BLOCKING_FACT_US`` or longer and with no event
    of its thread starting inside it, their union."""
    c = table.cols
    host = rows[isin_small(c["cls"][rows], (EvClass.CPU, EvClass.RUNTIME))]
    if step is not None:
        tid = c["tid"][host].astype(np.int64) & 0xFFFFFFFF
        host = host[(c["pid"][host] == step.pid) & (tid == (int(step.tid) & 0xFFFFFFFF))]
    long = host[c["dur"][host] >= BLOCKING_FACT_US]
    hit = [i for i in long.tolist() if WAITING_NAME.search(table.names[c["name"][i]])]
    if hit:  # a call inside which its thread starts other events ran them (run_backward on a CPU job runs the backward)
        key = (c["pid"][host].astype(np.int64) << 32) + (c["tid"][host].astype(np.int64) & 0xFFFFFFFF)
        kept = []
        for i in hit:  # (few: with_stack traces' blocked calls of 1 ms or more)
            k = (int(c["pid"][i]) << 32) + (int(c["tid"][i]) & 0xFFFFFFFF)
            starts = c["ts"][host[key == k]]
            if not ((starts > c["ts"][i]) & (starts < c["ts"][i] + c["dur"][i])).any():
                kept.append(i)
        hit = kept
    if not hit:
        return 0.0
    lo = c["ts"][hit].astype(np.float64)
    return _union(lo, lo + c["dur"][hit], float(lo.min()), float((lo + c["dur"][hit]).max()))


def _asleep(table: EventTable, rank: int, rows: np.ndarray, lo: float, hi: float, step: Step | None) -> list[dict]:
    """Host threads that slept through the step: not the step's own thread, no runtime call (they
    drive no device), few ops overlapping the step, and at least ASLEEP_SHARE of it covered by
    ops each a tenth of the step or longer (a wait, a sleep, a lock: a progress-bar monitor, a
    watchdog, a stats reporter). Ops that began before the step count: a wait rarely starts with it."""
    c = table.cols
    long_ops = _long_host_ops(table).get(rank)
    if hi <= lo or long_ops is None:
        return []
    longs, longest_dur = long_ops
    a = int(np.searchsorted(c["ts"][longs], lo - longest_dur, side="left"))
    b = int(np.searchsorted(c["ts"][longs], hi, side="left"))
    longs = longs[a:b]
    longs = longs[(c["ts"][longs] + c["dur"][longs] > lo) & (c["dur"][longs] >= 0.1 * (hi - lo))]
    if not len(longs):
        return []
    host = rows[isin_small(c["cls"][rows], (EvClass.CPU, EvClass.RUNTIME))]
    mine = np.unique(np.concatenate([host, longs]))  # the step's host events and the long ones reaching into it
    key = c["pid"][mine].astype(np.int64) * (1 << 32) + (c["tid"][mine].astype(np.int64) & 0xFFFFFFFF)
    threads = np.unique(key)
    if step is None:  # no step marker: the thread that drives the device (or does the most) is the step's own
        runtime = [int((c["cls"][mine[key == k]] == EvClass.RUNTIME).sum()) for k in threads.tolist()]
        count = [int((key == k).sum()) for k in threads.tolist()]
        own = int(threads[max(range(len(threads)), key=lambda i: (runtime[i], count[i]))])
    else:
        own = int(step.pid) * (1 << 32) + (int(step.tid) & 0xFFFFFFFF)
    out = []
    for k in threads.tolist():
        ops = mine[key == k]
        if k == own or len(ops) > ASLEEP_MAX_OPS or (c["cls"][ops] == EvClass.RUNTIME).any():
            continue
        long = ops[(c["dur"][ops] >= 0.1 * (hi - lo)) & (c["ts"][ops] < hi) & (c["ts"][ops] + c["dur"][ops] > lo)]
        covered, stretch = _quiet(c["ts"][long], c["ts"][long] + c["dur"][long], np.sort(c["ts"][ops]), lo, hi)
        comm = any(table.names[n].lower().startswith(_COMM_PREFIXES) for n in c["name"][long].tolist())
        if covered >= ASLEEP_SHARE * (hi - lo) and not comm:  # a backend thread waiting in a collective is working
            pid, tid = int(c["pid"][ops[0]]), int(c["tid"][ops[0]])
            longest = long[np.lexsort((c["dur"][long], -np.round(stretch, 3)))[0]]  # the innermost op of the longest quiet stretch
            out.append(
                {
                    "pid": pid,
                    "tid": tid,
                    "thread": table.thread_names.get((rank, pid, tid), f"thread {tid}"),
                    "op": table.names[c["name"][longest]][:120],
                    "ops": int(len(ops)),
                }
            )
    return out


def _quiet(lo_: np.ndarray, hi_: np.ndarray, starts: np.ndarray, lo: float, hi: float) -> tuple[float, np.ndarray]:
    """How much of [lo, hi) the long ops [lo_, hi_) cover in stretches of at least a tenth of it
    in which their thread started nothing (``starts``, sorted): a range inside which the thread
    keeps starting events was running, not asleep (with the Python tracer every thread's outer
    frames, ``threading.py: _bootstrap``, span it all; a wait's own frame holds its wake-up).
    Also, per op, its longest such stretch."""
    keep_lo, keep_hi = [], []
    longest = np.zeros(len(lo_))
    for i, (a, b) in enumerate(zip(np.maximum(lo_, lo).tolist(), np.minimum(hi_, hi).tolist())):
        inner = starts[np.searchsorted(starts, a, side="right") : np.searchsorted(starts, b, side="left")]
        cuts = np.concatenate([[a], inner, [b]])
        gaps = np.diff(cuts)
        long = gaps >= 0.1 * (hi - lo)
        keep_lo.append(cuts[:-1][long])
        keep_hi.append(cuts[1:][long])
        longest[i] = float(gaps.max(initial=0.0))
    if not keep_lo:
        return 0.0, longest
    return _union(np.concatenate(keep_lo), np.concatenate(keep_hi), lo, hi), longest


@dataclass(slots=True)
class StepFacts:
    """The facts of one step on every rank that has it."""

    step: int | None
    ranks: list[RankFacts]
    follows: bool = False  # every rank's trace holds a step before this one

    def of(self, rank: int) -> RankFacts | None:
        return next((f for f in self.ranks if f.rank == rank), None)

    @property
    def origin(self) -> float | None:
        """Where the step's period starts (table µs): for a numbered step of several ranks that
        follows a step of theirs in the trace, the latest of its ranks' origins, i.e. when the last
        of them finished the step before (a rank that began this step earlier ran its work while
        another was still in the previous one: that overlap is the previous step's time, and the
        previous step counts it). None otherwise, each rank's own origin: a window of one rank, no
        step, or the trace's first step, where a rank's late start is all the trace shows of what
        held it (it is counted in this step, as the others' wait for it)."""
        if self.step is None or len(self.ranks) < 2 or not self.follows:
            return None
        return max(f.origin for f in self.ranks)

    @property
    def period(self) -> float:
        """The step's period (µs): from its origin to the end of the last rank's step; without one
        (see origin), the longest of its ranks'. Over consecutive steps the periods add up to the
        job's time: a rank's stall at the end of one step, which the others wait for at the next
        step's first collective, counts once."""
        origin = self.origin
        if origin is None:
            return max((f.period for f in self.ranks), default=0.0)
        return max(f.step_end for f in self.ranks) - origin

    def to_dict(self, offset: float = 0.0) -> dict:
        origin = self.origin
        return {
            "step": self.step,
            "period_us": self.period,
            "origin": origin - offset if origin is not None else None,
            "ranks": [f.to_dict(offset) for f in self.ranks],
        }


def step_facts(table: EventTable, step: int | None) -> StepFacts:
    steps = table.steps_of(step) if step is not None else []
    if step is not None:
        first = table.lookups.get("first_step")
        if first is None:  # each rank's first step number (cached: asked once per step)
            first = table.lookups["first_step"] = {}
            for s in table.steps:
                first[s.rank] = min(first.get(s.rank, s.number), s.number)
        follows = all(first.get(s.rank, step) < step for s in steps)
        return StepFacts(step, [rank_facts(table, s.rank, s) for s in sorted(steps, key=lambda s: s.rank)], follows)
    return StepFacts(None, [rank_facts(table, r, None) for r in table.ranks])


@dataclass(slots=True)
class RunFacts:
    """What the input says of the whole job."""

    ranks: list[int]
    world_size: int | None  # from distributedInfo (the largest any rank states)
    numbered: dict[int, dict]  # rank -> events held / numbered by the exporter (Ev Idx), summed over its files
    unknown_device_events: int
    step_offsets: dict[int, int] = field(default_factory=dict)  # rank -> how far its step numbers run from the first rank's (step_offsets)
    unprofiled: dict[int, dict] = field(default_factory=dict)  # rank -> the side of the job its profiler did not record (unprofiled)
    synchronous: dict[int, dict] = field(default_factory=dict)  # rank -> its launches that waited for their own work (synchronous_launches)
    setup: dict[int, dict] = field(default_factory=dict)  # rank -> one-time runtime setup inside its analysed window (setup_calls)
    steps_from: dict[int, dict[str, str]] = field(default_factory=dict)  # rank -> what cut its steps where not ProfilerStep markers

    @property
    def missing_ranks(self) -> int:
        return max(self.world_size - len(self.ranks), 0) if self.world_size else 0

    def sampled(self, threshold: float = 0.9) -> dict[int, float]:
        """Ranks whose files hold less than ``threshold`` of the events their exporter numbered."""
        return {r: n["held"] / n["numbered"] for r, n in self.numbered.items() if n["numbered"] and n["held"] < threshold * n["numbered"]}

    def to_dict(self) -> dict:
        return {
            "ranks": self.ranks,
            "world_size": self.world_size,
            "missing_ranks": self.missing_ranks,
            "numbered": {str(r): n for r, n in self.numbered.items()},
            "sampled": {str(r): v for r, v in self.sampled().items()},
            "unknown_device_events": self.unknown_device_events,
            "step_offsets": {str(r): k for r, k in self.step_offsets.items()},
            "unprofiled": {str(r): v for r, v in self.unprofiled.items()},
            "synchronous": {str(r): v for r, v in self.synchronous.items()},
            "setup": {str(r): v for r, v in self.setup.items()},
            "steps_from": {str(r): v for r, v in self.steps_from.items()},
        }


def run_facts(table: EventTable) -> RunFacts:
    sizes = [m.get("world_size") for m in table.meta.values() if isinstance(m, dict)]
    sizes_ok: list[int] = [int(s) for s in sizes if isinstance(s, int) and not isinstance(s, bool) and 0 < s < 2**31]
    numbered = {}
    for r, info in table.inputs.items():
        files = info.get("numbered") or []
        if files:
            numbered[r] = {"held": sum(f["events"] for f in files), "numbered": sum(f["last"] - f["first"] + 1 for f in files)}
    unknown = sum(int(info.get("unknown_device_events", 0)) for info in table.inputs.values())
    return RunFacts(
        ranks=table.ranks,
        world_size=max(sizes_ok) if sizes_ok else None,
        numbered=numbered,
        unknown_device_events=unknown,
        step_offsets=step_offsets(table),
        unprofiled=unprofiled(table),
        synchronous=synchronous_launches(table),
        setup=setup_calls(table),
        steps_from={r: dict(info["steps_from"]) for r, info in table.inputs.items() if info.get("steps_from")},
    )


SETUP_CALL_US = 1000.0  # µs: a runtime call this long while its device is idle is setup, not a launch (those take µs)
SETUP_IDLE_SHARE = 0.1  # ... idle: the device busy for less than this share of the call
SETUP_SHARE = 0.05  # said where such calls hold this share of the window analysed, or more
_WAIT_CALL = re.compile(r"synchron|mem(cpy|set)|query|wait|finish", re.IGNORECASE)
COMPILE_SUFFIX = " (dynamo_timed)"
"""The ranges torch.compile times its compiling with (``dynamo_timed``: tracing, graph passes,
code generation, compiling and loading kernels), as the profiler records them."""
_SETUP_RUNTIME = re.compile(r"^(cuda|cu[A-Z]|hip|hsa)")
"""The runtimes whose calls are known to set themselves up lazily (CUDA's runtime and driver, HIP,
HSA): another accelerator's runtime calls (an MTIA executor's ``predictor_executor::run``) may be
its work running, whatever the device events show."""


def setup_calls(table: EventTable) -> dict[int, dict]:
    """Ranks whose analysed window (its ProfilerStep spans; the whole trace where it has none)
    holds one-time runtime setup: rank -> ``{"us": t, "window_us": w, "calls": n, "top": [[name,
    us], ...]}`` where ``n`` CUDA or HIP runtime calls (_SETUP_RUNTIME) that neither wait for the
    device nor copy (by name),
    each SETUP_CALL_US or longer, ran while the rank's device was idle (busy under
    SETUP_IDLE_SHARE of the call) and hold ``t`` >= SETUP_SHARE of ``w``. Such calls are the
    runtime setting itself up: creating its context (inside the first call that needs one,
    whichever it is), loading a kernel's module at its first launch (lazy loading), the first
    allocations, instantiating a graph. A launch that is long because the device's queue is full
    runs while the device is busy: not counted. torch.compile compiling in the window (its
    ``dynamo_timed`` ranges, COMPILE_SUFFIX: ``compile_us``, the longest in ``compile_top``) is
    counted with them: one-time work too. In a window that starts with the process, this is the
    answer's largest part and none of the loop's."""
    cached = table.lookups.get("setup")
    if cached is not None:
        return dict(cached)
    c = table.cols
    out: dict[int, dict] = {}
    rt = _setup_named(table, np.flatnonzero((c["cls"] == EvClass.RUNTIME) & (c["dur"] >= SETUP_CALL_US)))
    compiling = np.zeros(0, dtype=np.int64)
    compile_names = _compile_codes(table)  # (names, not events: most traces have none)
    if len(compile_names):
        compiling = np.flatnonzero((c["cls"] == EvClass.CPU) & isin_sorted(c["name"], compile_names))
    steps: dict[int, list[Step]] = {}
    for st in table.steps:
        steps.setdefault(st.rank, []).append(st)
    wanted = np.union1d(np.unique(c["rank"][rt]), np.unique(c["rank"][compiling]))
    for r in wanted.tolist():
        calls = rt[c["rank"][rt] == r]
        a = c["ts"][calls]
        if steps.get(r):
            spans = sorted((st.start, st.end) for st in steps[r])
        else:  # a trace without steps: the rank's whole trace (a pass over it, for this rare case only)
            mine = c["rank"] == r
            spans = [(float(c["ts"][mine].min()), float((c["ts"][mine] + c["dur"][mine]).max()))]
        s0, s1 = np.array([x for x, _ in spans]), np.array([y for _, y in spans])
        k = np.searchsorted(s0, a, side="right") - 1
        inside = (k >= 0) & (a < s1[k.clip(0)])
        window = float((s1 - s0).sum())
        pick = inside & _device_idle(table, r, calls)
        runtime = float(c["dur"][calls][pick].sum())
        # torch.compile compiling: the union of its timed ranges, inside the window
        comp = compiling[c["rank"][compiling] == r]
        compiled = float(_busy_between(c["ts"][comp], c["ts"][comp] + c["dur"][comp], s0, s1).sum())
        if window > 0 and runtime + compiled >= SETUP_SHARE * window:
            by: dict[str, float] = {}
            for i in calls[pick].tolist():
                key = table.names[int(c["name"][i])]
                by[key] = by.get(key, 0.0) + float(c["dur"][i])
            longest: dict[str, float] = {}
            for i in comp.tolist():
                key = table.names[int(c["name"][i])]
                longest[key] = max(longest.get(key, 0.0), float(c["dur"][i]))
            out[int(r)] = {
                "us": runtime + compiled,
                "window_us": window,
                "calls": int(pick.sum()),
                "top": [[n, us] for n, us in sorted(by.items(), key=lambda kv: -kv[1])[:4]],
                "compile_us": compiled,
                "compile_top": [[n, us] for n, us in sorted(longest.items(), key=lambda kv: -kv[1])[:3]],
            }
    table.lookups["setup"] = out
    return dict(out)


def _step_setup(table: EventTable, rank: int, rows: np.ndarray, lo: float, hi: float) -> float:
    """One-time work in one step of one rank (``rows``, between ``lo`` and ``hi``), by
    ``setup_calls``'s rules: CUDA/HIP runtime calls of SETUP_CALL_US or more, neither waits nor
    copies, made while the device was idle; and the union of torch.compile's timed ranges."""
    c = table.cols
    long = _setup_named(table, rows[(c["dur"][rows] >= SETUP_CALL_US) & (c["cls"][rows] == EvClass.RUNTIME)])
    runtime = float(c["dur"][long][_device_idle(table, rank, long)].sum())
    codes = _compile_codes(table)
    compiled = 0.0
    if len(codes):
        comp = rows[(c["cls"][rows] == EvClass.CPU) & isin_sorted(c["name"][rows], codes)]
        if len(comp):
            compiled = _union(c["ts"][comp], c["ts"][comp] + c["dur"][comp], lo, hi)
    return runtime + compiled


def _setup_named(table: EventTable, calls: np.ndarray) -> np.ndarray:
    """Of the runtime ``calls``, those of a runtime known to set itself up lazily (_SETUP_RUNTIME)
    that neither wait nor copy, by name."""
    if not len(calls):
        return calls
    codes, at = np.unique(table.cols["name"][calls], return_inverse=True)
    known = [bool(_SETUP_RUNTIME.match(table.names[i])) and not _WAIT_CALL.search(table.names[i]) for i in codes.tolist()]
    out: np.ndarray = calls[np.array(known, dtype=bool)[at.reshape(-1)]]
    return out


def _device_idle(table: EventTable, rank: int, calls: np.ndarray) -> np.ndarray:
    """Per call of ``rank``: was its device busy for under SETUP_IDLE_SHARE of it?"""
    c = table.cols
    none = np.zeros(0)
    _, _, dev_start, dev_end, longest, _, _ = _device_index(table).get(rank, (none, none, none, none, 0.0, none, none))
    a, b = c["ts"][calls], c["ts"][calls] + c["dur"][calls]
    if len(calls):  # only the device ops that can overlap the calls (a step's, not the whole trace's: once per step)
        lo = int(np.searchsorted(dev_start, float(a.min()) - longest, side="left"))
        hi = int(np.searchsorted(dev_start, float(b.max()), side="right"))
        dev_start, dev_end = dev_start[lo:hi], dev_end[lo:hi]
    out: np.ndarray = _busy_between(dev_start, dev_end, a, b) < SETUP_IDLE_SHARE * c["dur"][calls]
    return out


def _compile_codes(table: EventTable) -> np.ndarray:
    """The name codes of torch.compile's timed ranges (COMPILE_SUFFIX), sorted; once per table."""
    cache = table.facts_cache = table.facts_cache or {}
    if "compile" not in cache:
        cache["compile"] = np.array([i for i, n in enumerate(table.names) if n.endswith(COMPILE_SUFFIX)], dtype=np.int64)
    out: np.ndarray = cache["compile"]
    return out


def _busy_between(start: np.ndarray, end: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The time some interval [start, end) covers inside each [a, b) (the union's, not the sum)."""
    if not len(start) or not len(a):
        return np.zeros(len(a))
    order = np.argsort(start, kind="stable")
    s, e = start[order].astype(np.float64), np.maximum.accumulate(end[order].astype(np.float64))
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]  # a merged interval starts where the previous ones ended before it
    us, ue = s[new], np.maximum.reduceat(e, np.flatnonzero(new))
    cum = np.concatenate([[0.0], np.cumsum(ue - us)])

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(us, t, side="right") - 1
        ok = i >= 0
        j = i.clip(0)
        out: np.ndarray = np.where(ok, cum[j] + np.clip(t - us[j], 0.0, ue[j] - us[j]), 0.0)
        return out

    got: np.ndarray = covered(b.astype(np.float64)) - covered(a.astype(np.float64))
    return got


SYNC_LAUNCH_MIN = 20  # launches of long device work (SYNC_LAUNCH_OP_US) a rank makes, at least, to be judged ...
SYNC_LAUNCH_SHARE = 0.9  # ... synchronous when this share of them returned only after their device work ended
SYNC_LAUNCH_OP_US = 50.0  # µs: device work this long outlasts an asynchronous launch call (a short op on an idle device may not)
_COPY_CALL = re.compile(F.COPY_CALL_PATTERN, re.IGNORECASE)


def synchronous_launches(table: EventTable) -> dict[int, dict]:
    """Ranks whose launches return only after the device work they launched has ended: rank ->
    ``{"launches": n, "waited": k}``, where k of its n launch calls of device work lasting
    SYNC_LAUNCH_OP_US or more (any runtime call the trace ties to device ops, copies and sets
    aside: those may wait by themselves) returned at or after the end of every op they launched
    (within LAUNCH_TOLERANCE_US), k at least SYNC_LAUNCH_SHARE of n and n at least SYNC_LAUNCH_MIN.
    An asynchronous launch returns before its work is done but for a short op on an idle device:
    of the launches of every trace here 0-1.4% do, of those of 50 µs of work or more 0-0.7% (short
    kernels are no evidence: a launch call slowed by the profiler may outlast one). With
    ``CUDA_LAUNCH_BLOCKING=1``, a sanitizer or a debugger, every launch waits for its own work,
    and each is a wait on the device (window: the call waits for its op, as a blocking copy does,
    short ones too)."""
    cached = table.lookups.get("synchronous")
    if cached is not None:
        return dict(cached)
    c = table.cols
    out: dict[int, dict] = {}
    launcher = table.launchers()
    ops = np.flatnonzero((launcher >= 0) & isin_small(c["cls"], DEVICE_CLASSES))
    if len(ops):
        calls = launcher[ops]
        codes, at = np.unique(c["name"][calls], return_inverse=True)  # (the calls' few names, not every name of the trace)
        keep = ~np.array([bool(_COPY_CALL.search(table.names[i])) for i in codes.tolist()], dtype=bool)[at.reshape(-1)]
        ops, calls = ops[keep], calls[keep]
        late = (
            c["ts"][ops] + c["dur"][ops] > c["ts"][calls] + c["dur"][calls] + LAUNCH_TOLERANCE_US
        )  # the op ran on after its call returned
        uniq, inv = np.unique(calls, return_inverse=True)
        ran_on = np.bincount(inv, weights=late, minlength=len(uniq)) > 0
        long = np.bincount(inv, weights=c["dur"][ops], minlength=len(uniq)) >= SYNC_LAUNCH_OP_US
        uniq, ran_on = uniq[long], ran_on[long]
        ranks, r_inv = np.unique(c["rank"][uniq], return_inverse=True)
        n = np.bincount(r_inv, minlength=len(ranks))
        k = np.bincount(r_inv, weights=~ran_on, minlength=len(ranks))
        for i in np.flatnonzero((n >= SYNC_LAUNCH_MIN) & (k >= SYNC_LAUNCH_SHARE * n)).tolist():
            out[int(ranks[i])] = {"launches": int(n[i]), "waited": int(k[i])}
    table.lookups["synchronous"] = out
    return dict(out)


DEVICE_LIBRARY = re.compile(
    r"cudnn|miopen|^nccl:|rccl|cublas|hipblas|efficient_attention|flash_attention(?!.*cpu)|^triton_|record_stream|pin_memory",
    re.IGNORECASE,
)
"""Host ops that run only where an accelerator does: its vendor's libraries (cuDNN, MIOpen, NCCL,
RCCL, cuBLAS), attention kernels without a CPU version, Inductor's Triton kernels, a tensor
recorded on a device stream or pinned for copies to a device. ``torch.cuda`` Python frames are
not counted: a CPU job asks ``torch.cuda.is_available()`` too."""


def unprofiled(table: EventTable) -> dict[int, dict]:
    """Ranks whose profiler recorded one side of a job that ran on both (the activities it was
    given left the other out): rank -> ``{"missing": "device", "ops": n, "examples": [...],
    "devices": [...]}`` where the trace holds host events and no device event, yet ``n`` host ops
    (not Python frames nor annotations) name a device library (DEVICE_LIBRARY) or the file's ``deviceProperties`` lists a device the
    process saw (``n`` may be 0 then: a CPU job on a machine with a GPU reads the same); or
    ``{"missing": "host"}`` where it holds device events and no host op nor runtime call;
    ``{"missing": "host ops", "runtime_calls": n}`` where it holds device events and the runtime's
    calls (the device activity records them) and no host op (ProfilerActivity.CPU off). Either
    way the trace cannot show what the other side did: time the host spent waiting on its device
    reads as host work; the device's gaps read as idle; the host's own work between its runtime
    calls, as untraced."""
    cached = table.lookups.get("unprofiled")
    if cached is not None:
        return dict(cached)
    c = table.cols
    cls, name = c["cls"], c["name"]
    out: dict[int, dict] = {}
    ranks, inv = np.unique(c["rank"], return_inverse=True)
    inv = inv.reshape(-1)

    def per_rank(mask: np.ndarray) -> np.ndarray:
        return np.bincount(inv[mask], minlength=len(ranks))

    device = per_rank(isin_small(cls, (*DEVICE_CLASSES, EvClass.GPU_SYNC)))
    host = per_rank(cls == EvClass.CPU)
    runtime = per_rank(cls == EvClass.RUNTIME)
    no_device = (device == 0) & (host > 0)
    if no_device.any():
        # ops, not Python frames nor annotations (a CPU job reads cudnn.enabled too), of the ranks in question
        cand = np.flatnonzero((cls == EvClass.CPU) & ~c["is_range"] & no_device[inv])
        codes, at = np.unique(name[cand], return_inverse=True)
        named = cand[np.array([bool(DEVICE_LIBRARY.search(table.names[i])) for i in codes.tolist()], dtype=bool)[at.reshape(-1)]]
        hits = np.bincount(inv[named], minlength=len(ranks))
        for i in np.flatnonzero(no_device).tolist():
            r = int(ranks[i])
            devices = [str(d) for d in (table.inputs.get(r, {}).get("devices") or [])]
            if hits[i] or devices:
                mine = np.unique(name[named[inv[named] == i]])
                seen = sorted((table.names[j] for j in mine.tolist()), key=lambda n: (len(n), n))  # the plainest names
                out[r] = {"missing": "device", "ops": int(hits[i]), "examples": seen[:3], "devices": devices}
    for i in np.flatnonzero((device > 0) & (host == 0) & (runtime == 0)).tolist():
        skipped = str(table.inputs.get(int(ranks[i]), {}).get("skipped", ""))  # (host events the tool does not read: another profiler's)
        out[int(ranks[i])] = {"missing": "host", "device_events": int(device[i]), **({"skipped": skipped} if skipped else {})}
    for i in np.flatnonzero((device > 0) & (host == 0) & (runtime > 0)).tolist():
        out[int(ranks[i])] = {"missing": "host ops", "device_events": int(device[i]), "runtime_calls": int(runtime[i])}
    table.lookups["unprofiled"] = out
    return dict(out)


STEP_OFFSET_SHARE = 0.8  # a rank whose steps run beside another number of the first rank's in this share of them (two at least)


def align_cut_steps(table: EventTable) -> list[str]:
    """Steps this tool cut itself (no ProfilerStep markers: at the optimizer's steps or at
    ``--steps-at``'s ops, numbered from 1 on each rank) are numbered alike across ranks by when
    they ran: a rank whose trace starts an iteration later than the first rank's would pair each
    of its iterations with the first rank's one before (``step_offsets``). Such a rank's steps are
    renumbered to the first rank's (and every cut rank's numbers then start at 1 or more); the
    look-ups of the table are dropped. Returns what was renumbered, in words (the markers of a
    profiler are its own numbers: left as they are, and ``step_offsets`` says so)."""
    cut = {r for r, info in table.inputs.items() if info.get("steps_from")}
    offsets = {r: k for r, k in step_offsets(table).items() if r in cut}
    if not offsets:
        return []
    for st in table.steps:
        if st.rank in offsets:
            st.number -= offsets[st.rank]
    if all(st.rank in cut for st in table.steps):
        low = min(st.number for st in table.steps)
        if low < 1:
            for st in table.steps:
                st.number += 1 - low
    table.drop_caches()
    return [
        f"rank {r}'s steps (cut without ProfilerStep markers) renumbered by {-k:+d} to run beside rank {min(table.ranks)}'s "
        "of the same number: its trace starts at another iteration"
        for r, k in sorted(offsets.items())
    ]


def step_offsets(table: EventTable) -> dict[int, int]:
    """Ranks whose ProfilerStep numbers run apart from the first rank's: rank -> k where its step
    N overlaps the first rank's step N - k in time (most of the shorter one) in at least
    STEP_OFFSET_SHARE of its steps that overlap one (their profilers counted steps differently:
    steps are matched by number, so each step would pair different iterations). Computed once
    per table."""
    cached = table.lookups.get("step_offsets")
    if cached is not None:
        return dict(cached)
    by_rank: dict[int, list[Step]] = {}
    for st in table.steps:
        by_rank.setdefault(st.rank, []).append(st)
    out: dict[int, int] = {}
    if len(by_rank) > 1:
        first = sorted(by_rank)[0]
        ref = sorted(by_rank[first], key=lambda st: st.start)
        starts = np.array([st.start for st in ref])
        for rank, mine in by_rank.items():
            if rank == first:
                continue
            ks = []
            for st in mine:
                i = int(np.searchsorted(starts, st.start, side="right"))
                best, k = 0.0, None
                for c in ref[max(i - 2, 0) : i + 2]:  # the first rank's steps around its start
                    overlap = min(c.end, st.end) - max(c.start, st.start)
                    if overlap > best and overlap > 0.5 * min(c.end - c.start, st.end - st.start):
                        best, k = overlap, st.number - c.number
                if k is not None:
                    ks.append(k)
            if len(ks) >= 2:
                ((k, n),) = Counter(ks).most_common(1)
                if k != 0 and n >= STEP_OFFSET_SHARE * len(ks):
                    out[rank] = k
    table.lookups["step_offsets"] = out
    return dict(out)

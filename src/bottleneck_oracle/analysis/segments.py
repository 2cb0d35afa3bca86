"""The critical path explained, segment by segment.

The critical path is a chain of nodes; between two of them lies the latency of the edge that
decided the second one's start. Every microsecond of the step is one of:

- ``op``: an op running (its modelled duration), or the own time of an op that encloses the
  gap between two of its children (``aten::addmm``'s compute, ``aten::_foreach_mul_``'s loop);
- ``device``: the device's own gap between two ops of a stream when the second was already
  queued (compute: the device was busy with the step's work, not waiting for the host);
- ``launch``: kernel launch latency (a runtime call's end to its GPU op's start) and the part of
  a gap on a stream before the next op was launched: the device starved for work;
- ``wait``: the latency after what an op waited for — another thread's hand-over, a GPU op at
  a sync, another stream, a collective, a peer rank's late step start, the GPU still running an
  earlier step's work (``cause``: the node waited for, where it is one);
- ``framework``: time between ops on a thread inside no op (Python, the dispatcher), each
  stretch at most ``untraced_gap_us``;
- ``untraced``: longer such stretches: the trace shows no cause (sleeps, untraced Python, a lock);
  inside a multi-process DataLoader's ``__next__`` such time (50 µs or more) is the loop waiting
  for the loader's workers, a ``wait`` (``fields.LOADER_WAIT_RANGE``).

Segments tile the step: from the step start of the rank whose span is the step time to the end
of the last op, in time order, never overlapping, so they add up to the makespan and no part is
negative. Where an op overlaps the one after it (a kernel starts before its launch call returns)
the earlier segment is cut where the later one starts.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from bottleneck_oracle.analysis.cpm import CPMResult
from bottleneck_oracle.analysis.kernels import interval_union, overlap_length
from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline.arrays import isin_small, isin_sorted
from bottleneck_oracle.graph_pipeline.events import DEVICE_WAIT_NAME
from bottleneck_oracle.graph_pipeline.facts import C10D_CALL_NAME, COLLECTIVE_WAIT_NAME, HOST_BLOCKED_NAME
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import GPU_CATEGORIES, Category, EdgeKind, NodeType

DEVICE_COLLECTIVE_NAME = re.compile(F.DEVICE_COLLECTIVE_PATTERN, re.IGNORECASE)

SegmentKind = Literal["op", "device", "launch", "wait", "framework", "untraced"]
SEGMENT_KINDS: tuple[SegmentKind, ...] = get_args(SegmentKind)
BreakdownKey = Literal["compute", "communication", "cpu_overhead", "idle", "untraced"]
BREAKDOWN_KEYS: tuple[BreakdownKey, ...] = get_args(BreakdownKey)
COMPUTE, COMM, CPU, IDLE, UNTRACED = range(5)

UNTRACED_GAP_US = 1000.0  # µs: a stretch between ops with nothing open, or inside a range, longer than this is untraced
LOADER_WAIT = "waiting for the DataLoader's workers"

_WAIT_LABEL = {
    EdgeKind.THREAD: "wake-up after another thread's hand-over",
    EdgeKind.FEEDS: "wake-up after a collective completed",
    EdgeKind.COLLECTIVE_SYNC: "collective: waiting for the last rank",
    EdgeKind.SEND_RECV: "send/recv: waiting for the peer",
    EdgeKind.BACKEND: "backend queue latency",
    EdgeKind.FWD_BWD: "forward -> backward latency",
    EdgeKind.DATA: "tensor dependency latency",
}


@dataclass(slots=True)
class Segment:
    kind: SegmentKind
    klass: int  # index into BREAKDOWN_KEYS
    rank: int
    tid: int  # CPU thread or GPU stream id (-1: none)
    on_gpu: bool
    name: str  # the op, the op or range whose own time it is, or what was waited for
    start: float  # µs from the window start
    dur: float  # µs
    node: int = -1  # the node it belongs to (an op's, or the one whose start it delays)
    cause: int = -1  # the node waited for (kind "wait"), -1 if none

    @property
    def end(self) -> float:
        return self.start + self.dur


def node_class(g: ExecutionGraph) -> np.ndarray:
    """Breakdown class per node: COMPUTE (GPU ops; CPU ops of CPU-only ranks), COMM (collectives,
    send/recv, and a collective's call with nothing of its thread inside it: the thread handing a
    collective to a host backend, or held in the call, fields.C10D_CALL_PATTERN), CPU (runtime calls,
    CPU ops of ranks with a GPU)."""
    n = g.nodes
    cat = n["category"]
    cpu_is_overhead = isin_sorted(n["rank"], np.unique(n["rank"][n["on_gpu"]]))
    out = np.full(len(cat), CPU, dtype=np.int8)
    out[isin_small(cat, GPU_CATEGORIES)] = COMPUTE
    out[(cat == Category.CPU_OP) & ~cpu_is_overhead] = COMPUTE
    kernels = np.flatnonzero(cat == Category.KERNEL)
    if len(kernels):  # a collective that is no NCCL kernel (a custom all-reduce, symmetric memory): communication
        out[kernels[_names_matching(g, n["name"][kernels], lambda name: bool(DEVICE_COLLECTIVE_NAME.search(name)))]] = COMM
    out[n["node_type"] == NodeType.NETWORK] = COMM
    ops = np.flatnonzero(cat == Category.CPU_OP)
    out[ops[_names_matching(g, n["name"][ops], lambda name: bool(C10D_CALL_NAME.match(name)))]] = COMM
    return out


def _builtin(name: str) -> str:
    """``<built-in method acquire of _thread.lock object at 0x7f...>`` -> ``acquire of _thread.lock``."""
    m = re.match(r"<built-in (?:function|method) (.*?)(?: object)?(?: at 0x[0-9a-fA-F]+)?>$", name)
    if COLLECTIVE_WAIT_NAME.match(name):
        return f"{name} (a collective's wait)"
    return m.group(1) if m else name


def host_blocked_names(g: ExecutionGraph, codes: np.ndarray) -> np.ndarray:
    """Per name code in ``codes``: is it a call that blocks its thread without computing
    (``fields.HOST_BLOCKED_PATTERN``: a sleep, a lock's acquire, a select, a pipe's read; a
    functional collective's wait, ``fields.COLLECTIVE_WAIT_PATTERN``)? (Read
    for the codes asked for only: with the Python tracer a trace has a name per object address.)"""
    return _names_matching(
        g,
        codes,
        lambda name: (name.startswith("<built-in") and bool(HOST_BLOCKED_NAME.search(name))) or bool(COLLECTIVE_WAIT_NAME.match(name)),
    )


def _names_matching(g: ExecutionGraph, codes: np.ndarray, test: Callable[[str], bool]) -> np.ndarray:
    """Per name code in ``codes``: does its name pass ``test``? (Each distinct name tested once.)"""
    used, at = np.unique(codes, return_inverse=True)
    hit = np.array([test(g.names[k]) for k in used.tolist()], dtype=bool)
    out: np.ndarray = hit[at.reshape(-1)] if len(used) else np.zeros(len(codes), dtype=bool)
    return out


class _Pieces:
    """The gap pieces (graph.gaps) of each node, in time order (Python lists: the path walk reads
    them one at a time); with ``nodes`` (a mask over the nodes) only theirs, the rest read as none:
    the walk needs those of the path's nodes, a small part of a large step's."""

    def __init__(self, g: ExecutionGraph, nodes: np.ndarray | None = None) -> None:
        gp = g.gaps
        rows = np.flatnonzero(nodes[gp["node"]]) if nodes is not None else np.arange(len(gp["node"]))
        order = rows[np.lexsort((gp["start"][rows], gp["node"][rows]))]
        node = gp["node"][order]
        self.lo, self.hi = gp["start"][order].astype(float).tolist(), gp["end"][order].astype(float).tolist()
        self.owner, self.owner_op = gp["owner"][order].astype(int).tolist(), gp["owner_op"][order].astype(bool).tolist()
        self._node = node.tolist()

    def of(self, v: int) -> range:
        return range(bisect.bisect_left(self._node, v), bisect.bisect_right(self._node, v))


def explain(g: ExecutionGraph, r: CPMResult, untraced_gap_us: float = UNTRACED_GAP_US) -> list[Segment]:
    """The segments of the critical path of ``g`` (CPM result ``r``), in time order."""
    n, e = g.nodes, g.edges
    barrier = n["category"] == Category.BARRIER
    sync = isin_small(e["kind"], (EdgeKind.COLLECTIVE_SYNC, EdgeKind.SEND_RECV)) & barrier[e["src"]]
    walked = np.zeros(g.n_nodes, dtype=bool)  # whose thread time the walk splits: the path's nodes and their barriers' members
    walked[r.path] = True
    walked[e["dst"][sync & walked[e["src"]]]] = True
    pieces = _Pieces(g, walked)
    # what the walk reads of a node, as plain ints and floats of the walked nodes only (the path of a
    # long step has thousands of nodes, read one at a time; a large step's graph has millions)
    on = np.flatnonzero(walked)
    on_list = on.tolist()

    def of(a: np.ndarray) -> dict[int, Any]:
        return dict(zip(on_list, a[on].tolist()))

    loader_waits: dict[int, bool] = {}
    c10d_calls: dict[int, bool] = {}

    def loader_wait(owner: int) -> bool:
        if owner not in loader_waits:
            loader_waits[owner] = g.names[owner].startswith(F.LOADER_WAIT_RANGE)
        return loader_waits[owner]

    def c10d_call(owner: int) -> bool:
        if owner not in c10d_calls:
            c10d_calls[owner] = bool(C10D_CALL_NAME.match(g.names[owner]))
        return c10d_calls[owner]

    cpu_only = of(~isin_sorted(n["rank"], np.unique(n["rank"][n["on_gpu"]])))
    rank_of, tid_of, gpu_of = of(n["rank"].astype(int)), of(n["tid"].astype(int)), of(n["on_gpu"].astype(bool))
    out: list[Segment] = []

    def add(kind: SegmentKind, k: int, v: int, name: str, lo: float, hi: float, cause: int = -1) -> None:
        if hi - lo <= 1e-9:
            return
        out.append(Segment(kind, k, rank_of[v], tid_of[v], gpu_of[v], name, lo, hi - lo, v, cause))

    def stretch(v: int, lo: float, hi: float, owner: int = -1, owner_op: bool = False) -> None:
        """Time on v's thread between ops: own time of an enclosing op, framework or untraced, or
        the DataLoader's main thread waiting for its workers."""
        if owner_op:  # (a collective's call on a host backend's rank: its thread in communication)
            add("op", (COMM if c10d_call(owner) else COMPUTE) if cpu_only[v] else CPU, v, g.names[owner], lo, hi)
        elif owner >= 0 and hi - lo >= F.HOST_BLOCKED_MIN_US and loader_wait(owner):
            add("wait", IDLE, v, LOADER_WAIT, lo, hi)
        elif hi - lo <= untraced_gap_us:
            add("framework", CPU, v, g.names[owner] if owner >= 0 else "between ops", lo, hi)
        else:
            add("untraced", UNTRACED, v, g.names[owner] if owner >= 0 else "no op open", lo, hi)

    def thread_time(v: int, lo: float, hi: float, cause: int = -1, wait_name: str = "") -> None:
        """[lo, hi) before CPU leaf v, split by its gap pieces. With a cause, the thread waited
        until the first piece boundary after ``lo`` (it was seen running from there on)."""
        cursor = lo
        woke = cause < 0
        plo, phi = pieces.lo, pieces.hi
        for q in pieces.of(v):
            a, b = max(plo[q], cursor), min(phi[q], hi)
            if b <= a:
                continue
            if a > cursor:  # a stretch no piece covers (modelled ends differ from recorded ones)
                if woke:
                    stretch(v, cursor, a)
                else:
                    add("wait", IDLE, v, wait_name, cursor, a, cause)
            if not woke:
                add("wait", IDLE, v, wait_name, a, b, cause)
                woke = True
            else:
                stretch(v, a, b, pieces.owner[q], pieces.owner_op[q])
            cursor = b
        if hi > cursor:
            if woke:
                stretch(v, cursor, hi)
            else:
                add("wait", IDLE, v, wait_name, cursor, hi, cause)

    def member_on_thread(b: int, src: int) -> int:
        """The participant of barrier ``b`` on the thread of ``src`` (the barrier holds copies of
        its participants' in-edges: the time before it is that participant's), else ``b``."""
        members = e["dst"][sync & (e["src"] == b)]
        rank = members[n["rank"][members] == n["rank"][src]]
        thread = rank[n["tid"][rank] == n["tid"][src]]
        return int(thread[0]) if len(thread) else int(rank[0]) if len(rank) else b

    path = r.path.tolist()
    edge_kind, edge_src = e["kind"][r.path_edges].tolist(), e["src"][r.path_edges].tolist()  # of each path edge, in path order
    est_of, eft_of = of(r.est), of(r.eft)
    is_barrier, klass_of = of(barrier), of(node_class(g))
    names, code_of = g.names, of(n["name"])
    blocking = of(n["category"] == Category.BLOCKING)
    blocked = np.zeros(g.n_nodes, dtype=bool)
    blocked[on] = host_blocked_names(g, n["name"][on]) & ~n["on_gpu"][on] & (n["dur"][on] >= F.HOST_BLOCKED_MIN_US)
    host_blocked = of(blocked)
    waits = np.zeros(g.n_nodes, dtype=bool)
    waits[on] = _names_matching(g, n["name"][on], lambda name: bool(DEVICE_WAIT_NAME.match(name))) & n["on_gpu"][on]
    device_wait = of(waits)
    program_order, launch, gpu_sync = int(EdgeKind.PROGRAM_ORDER), int(EdgeKind.LAUNCH), int(EdgeKind.SYNC)
    # when each device op's launch call ended (-inf: not launched in the window)
    is_launch = e["kind"] == EdgeKind.LAUNCH
    launched_at = np.full(g.n_nodes, -np.inf)
    np.maximum.at(launched_at, e["dst"][is_launch], (n["start"] + n["dur"])[e["src"][is_launch]])
    launched_by = of(launched_at)
    wait_label = {int(k): v for k, v in _WAIT_LABEL.items()}
    # a host collective's recorded end: its span on its rank can outlast the instance's modelled end
    # (the first participant's, collectives.modelled_ends); the rest of it is that rank's
    # communication, not time with no op open
    network = isin_small(n["category"], (Category.COLLECTIVE, Category.P2P)) & ~n["on_gpu"]
    net_end = of(np.where(network, n["start"] + n["dur"], -np.inf))
    cursor = r.path_origin
    for j, v in enumerate(path):
        est = est_of[v]
        if est < cursor:  # the op started before the previous one ended: cut that one back
            _cut(out, est)
            cursor = est
        if j == 0:
            _lead_in(g, r, v, cursor, est, add, thread_time)
        elif est > cursor:
            kind, src = edge_kind[j - 1], edge_src[j - 1]
            at = member_on_thread(v, src) if is_barrier[v] else v  # whose time the gap before v is
            gpu_v = gpu_of[at]
            if kind == program_order and not gpu_v:
                tail = min(net_end.get(src, -np.inf), est)
                if tail > cursor and not is_barrier[at]:  # (the op before it, still open on its thread)
                    add("op", COMM, at, names[code_of[src]], cursor, tail)
                    cursor = tail
                thread_time(at, cursor, est)
            elif kind == launch:  # the device had nothing to run until the launch: starved by its host
                if est - cursor <= untraced_gap_us:
                    add("launch", CPU, at, "kernel launch latency", cursor, est)
                else:
                    add("untraced", UNTRACED, at, "device idle after the launch, no traced cause", cursor, est)
            elif kind == program_order:
                launched = launched_by[at]
                if launched > cursor + 1e-6:  # launched after the op before it ended: the device was starved
                    add("launch", CPU, at, "device waiting for the launch", cursor, min(launched, est))
                    cursor = min(launched, est)
                if est - cursor <= untraced_gap_us:  # queued already: the device's own gap between ops
                    add("device", COMPUTE, at, "device gap between queued ops", cursor, est)
                else:
                    add("untraced", UNTRACED, at, "device idle with work queued, no traced cause", cursor, est)
            else:
                if kind == gpu_sync:
                    label = "stream wait" if gpu_of[src] and gpu_v else "wake-up after a GPU sync"
                else:
                    label = wait_label.get(kind, "dependency latency")
                if not gpu_v and not is_barrier[at]:
                    thread_time(at, cursor, est, src, label)
                else:
                    add("wait", IDLE, at, label, cursor, est, src)
        d = eft_of[v] - est
        if d > 0 and not is_barrier[v]:
            # a call still blocked this long after what it waited for (or with nothing traced to wait
            # for) waits on device work the trace does not show; a short remainder is its return
            if blocking[v] and d > untraced_gap_us:
                add("untraced", UNTRACED, v, f"untraced wait on the device in {names[code_of[v]]}", est, est + d)
            elif host_blocked[v]:  # a sleep, a lock, a select: the thread waited, it did no work
                add("wait", IDLE, v, f"host blocked in {_builtin(names[code_of[v]])}", est, est + d)
            elif device_wait[v]:  # the device's queue waiting for an event: what it waits for is not tied to it
                add("untraced", UNTRACED, v, f"untraced wait on the device in {names[code_of[v]]}", est, est + d)
            else:
                add("op", klass_of[v], v, names[code_of[v]], est, est + d)
        if est + d > cursor:
            cursor = est + d
    return _clip(out, r.path_origin)


def _lead_in(
    g: ExecutionGraph, r: CPMResult, v: int, lo: float, est: float, add: Callable[..., None], thread_time: Callable[..., None]
) -> None:
    """From the step start of the rank whose span is the step time to the path's first op."""
    n = g.nodes
    if est <= lo:
        return
    rank = int(n["rank"][v])
    if rank >= 0:
        start = g.rank_origin(rank)
        if start > lo:  # another rank entered the step later: its late start held everyone up
            add("wait", IDLE, v, f"late step start of rank {rank}", lo, min(start, est))
            lo = min(start, est)
    if n["on_gpu"][v]:  # the device had finished all earlier work by the origin: it waited for something untraced
        add("untraced", UNTRACED, v, "device idle, waiting with no traced cause", lo, est)
    elif n["category"][v] == Category.BARRIER:
        add("wait", IDLE, v, "collective: waiting for the last rank", lo, est)
    else:
        thread_time(v, lo, est)


def _cut(out: list[Segment], t: float) -> None:
    """Shorten the segments so that none runs past ``t`` (an op overlapped by its successor)."""
    while out and out[-1].start >= t:
        out.pop()
    if out and out[-1].end > t:
        out[-1].dur = t - out[-1].start


def _clip(out: list[Segment], origin: float) -> list[Segment]:
    """Drop what lies before the path's origin (a path can start on a rank that began earlier),
    and what is left of no length."""
    kept = []
    for s in out:
        start = s.start
        if start < origin:
            if start + s.dur <= origin:
                continue
            s.dur -= origin - start
            s.start = origin
        if s.dur > 1e-9:
            kept.append(s)
    return kept


def breakdown(segments: list[Segment]) -> dict[str, float]:
    """Critical-path time per class (µs), from the segments: every part >= 0, summing to the makespan."""
    parts = [0.0] * len(BREAKDOWN_KEYS)
    for s in segments:
        parts[s.klass] += s.dur
    return dict(zip(BREAKDOWN_KEYS, parts))


DATA_LOADER_PREFIX = "enumerate(DataLoader)#"
"""The range PyTorch's DataLoader iterator records around each ``__next__``
(``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``, ``..._MultiProcessingDataLoaderIter...``)."""


def input_pipeline(g: ExecutionGraph, segments: list[Segment]) -> float:
    """Critical-path time (µs) on host threads inside the DataLoader's ``__next__`` ranges: the
    training loop getting its next batch, loading it on its own thread (one-process loader) or
    waiting for the loader's workers. Each segment counts for the part of it that lies inside
    such a range on its own rank and thread (ranges a region of the graph or an op node)."""
    r, n = g.regions, g.nodes
    used = np.unique(np.concatenate([r["name"], n["name"]])).tolist()  # (the names a step uses: a few hundred of the trace's thousands)
    is_loader = np.zeros(len(g.names), dtype=bool)
    is_loader[[k for k in used if g.names[k].startswith(DATA_LOADER_PREFIX)]] = True
    if not is_loader.any():
        return 0.0
    ranges = np.flatnonzero(is_loader[r["name"]])
    ops = np.flatnonzero(is_loader[n["name"]] & ~n["on_gpu"])
    rank, tid = np.r_[r["rank"][ranges], n["rank"][ops]], np.r_[r["tid"][ranges], n["tid"][ops]]
    lo, hi = np.r_[r["start"][ranges], n["start"][ops]], np.r_[r["end"][ranges], n["start"][ops] + n["dur"][ops]]
    path: dict[tuple[int, int], list[Segment]] = {}
    for seg in segments:
        if not seg.on_gpu:
            path.setdefault((seg.rank, seg.tid), []).append(seg)
    total = 0.0
    for key in sorted(set(zip(rank.tolist(), tid.tolist()))):
        segs = path.get(key)
        if not segs:
            continue
        mine = (rank == key[0]) & (tid == key[1])  # nested or repeated ranges counted once (their union)
        seen = interval_union(np.array([s_.start for s_ in segs]), np.array([s_.end for s_ in segs]))  # (disjoint already)
        total += overlap_length(interval_union(lo[mine], hi[mine]), seen)
    return total


PYTHON_FRAME = re.compile(r"\.pyx?\(\d+\): ")
"""A Python frame as the profiler's Python tracer names it (``train.py(88): save``)."""
NAMED_RANGE, NAMED_FRAME, NAMED_OP, NAMED_UNTRACED = 0, 1, 2, 3
"""What a name of path_by_name is: a range the program marked (``record_function``, a module's,
the optimizer's), a Python frame, a leaf op, or a host thread's untraced time (UNTRACED_NAME)."""
UNTRACED_NAME = "untraced time"
"""path_by_name's name for the untraced time on a rank's host threads, all of it: work the profiler
records no op for (a checkpoint's pickling and file write, logging, Python without ops)."""


def path_by_name(g: ExecutionGraph, segments: list[Segment], top: int = 12) -> list[tuple[int, str, int, float]]:
    """The ``top`` names the critical path spends most time in, each as (rank, name, what it is:
    NAMED_RANGE / NAMED_FRAME / NAMED_OP / NAMED_UNTRACED, µs): for a leaf op, its segments' time;
    for a rank's untraced host time (UNTRACED_NAME), its untraced segments'; for a range of
    host code (a ``record_function``, a module, a Python frame: the graph's regions), the path's
    time on its thread inside it (a range nested in one of the same name counted once). The
    ProfilerStep range itself, which holds everything, is no name."""
    out: dict[tuple[int, str, int], float] = {}
    ranged_leaf = {g.names[k] for k in g.meta.get("range_leaves", ())}  # (a record_function with no op inside is a leaf node)
    for s in segments:
        if s.kind == "op":
            key = (s.rank, s.name, NAMED_RANGE if s.name in ranged_leaf and not s.on_gpu else NAMED_OP)
            out[key] = out.get(key, 0.0) + s.dur
        elif s.kind == "untraced" and not s.on_gpu:
            key = (s.rank, UNTRACED_NAME, NAMED_UNTRACED)
            out[key] = out.get(key, 0.0) + s.dur
    r = g.regions
    ranged = np.flatnonzero(r["is_range"])
    host = [s for s in segments if not s.on_gpu]
    if len(ranged) and host:
        starts = np.array([s.start for s in host])
        ends = np.array([s.end for s in host])
        owner = np.array([s.rank for s in host], dtype=np.int64) * (1 << 32) + (
            np.array([s.tid for s in host], dtype=np.int64) & 0xFFFFFFFF
        )
        thread = r["rank"][ranged].astype(np.int64) * (1 << 32) + (r["tid"][ranged].astype(np.int64) & 0xFFFFFFFF)
        inside = np.zeros(len(ranged))
        for key in np.unique(thread).tolist():
            mine = np.flatnonzero(owner == key)
            if not len(mine):
                continue
            o = mine[np.argsort(starts[mine], kind="stable")]
            cum = np.r_[0.0, np.cumsum(ends[o] - starts[o])]  # the path's time on the thread before each segment
            xs = np.ravel(np.column_stack([starts[o], ends[o]]))
            ys = np.ravel(np.column_stack([cum[:-1], cum[1:]]))
            here = np.flatnonzero(thread == key)
            inside[here] = np.interp(r["end"][ranged[here]], xs, ys) - np.interp(r["start"][ranged[here]], xs, ys)
        name, rank = r["name"][ranged], r["rank"][ranged]
        order = np.lexsort((r["start"][ranged], name, thread))
        last_end = -np.inf
        prev: tuple[int, int] | None = None
        for i in order.tolist():
            if inside[i] <= 0.0:
                continue
            k = (int(thread[i]), int(name[i]))
            if k == prev and r["start"][ranged[i]] < last_end:  # nested in (or overlapping) one of its name
                last_end = max(last_end, float(r["end"][ranged[i]]))
                continue
            prev, last_end = k, float(r["end"][ranged[i]])
            text = g.names[int(name[i])]
            if text.startswith("ProfilerStep#"):
                continue
            key3 = (int(rank[i]), text, NAMED_FRAME if PYTHON_FRAME.search(text) else NAMED_RANGE)
            out[key3] = out.get(key3, 0.0) + float(inside[i])
    best = sorted(out.items(), key=lambda kv: -kv[1])[:top]
    return [(rank_, name_, what, us) for (rank_, name_, what), us in best]


def label(s: Segment) -> str:
    """What a segment's time is credited to in the top-ops table: the op (its own time included),
    the range whose framework time it is, or what kind of waiting or untraced time it is."""
    if s.kind == "op":
        return s.name
    if s.kind == "framework":
        return s.name if s.name != "between ops" else "framework time between ops"
    if s.kind == "untraced":
        return f"untraced time in {s.name}" if s.name != "no op open" else "untraced time"
    return s.name

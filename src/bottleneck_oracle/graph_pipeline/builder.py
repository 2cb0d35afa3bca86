"""EventTable -> ExecutionGraph per step: nodes (window.py), edge rules (edges.py),
cross-rank barriers (collectives.py), then edge weights.

Weights. Every node has a modelled start: its measured start, or for a blocking
op (a sync call, a collective) the moment what it waits for was ready. Of a
node's in-edges the one whose source ended last is binding and gets weight =
start - source end (launch latency, framework gap); the others get
min(gap, 0). So the longest path reproduces every measured start exactly, and
the slack of the non-binding paths is what the trace shows could be absorbed.

Reproducing the measured starts is therefore no evidence that the graph is right: it holds
by construction. What makes a binding edge right is that it names what the op waited for,
so the wait rules (another thread, the GPU, a stream, a peer rank) run before the weights,
and no edge may run back in time: an edge whose source started after its destination, or a
wait on an op that ended after the waiter returned, is dropped (counted in
``meta["dropped_edges"]``). What is left unexplained shows as a long gap on a thread and is
reported as untraced by the analysis (analysis.segments).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numba
import numpy as np

from bottleneck_oracle.errors import GraphError, OracleWarning
from bottleneck_oracle.graph_pipeline import edges as rules
from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline.arrays import isin_small, kahn
from bottleneck_oracle.graph_pipeline.collectives import barrier_labels, match_instances, match_report, modelled_ends
from bottleneck_oracle.graph_pipeline.engine import Engine, LocalEngine
from bottleneck_oracle.graph_pipeline.events import EvClass, EventTable
from bottleneck_oracle.graph_pipeline.facts import LAUNCH_TOLERANCE_US, StepFacts, index_facts, run_facts, step_facts
from bottleneck_oracle.graph_pipeline.gaps import empty_gaps, gap_pieces
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.regions import empty_regions, window_regions
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind, NodeType
from bottleneck_oracle.graph_pipeline.window import GPU_CLASSES, P2P_KINDS, Window, launching_op_values, make_window, table_lookups


@dataclass(kw_only=True, slots=True)
class BuildOptions:
    feeds_resume_us: float = 5000.0
    """µs: a thread idle when a collective completes and resuming within this after it waited for it."""
    blocking_sync_calls: tuple[str, ...] = (
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
    )
    """Runtime calls that block until the GPU drains (used when a trace has no cuda_sync events)."""
    idle_gap_us: float = 50.0
    """µs: a thread with nothing opening or closing for this long was idle (waiting for a hand-over)."""
    stream_wait_us: float = 50.0
    """µs: a GPU op starting this much later than its launch and its stream allow waited for another
    stream; an op there that ended at most this long before released it (traces without cuda_sync)."""
    clock_tolerance_us: float = LAUNCH_TOLERANCE_US
    """µs: CPU and GPU clocks of one rank disagree by up to this much (causality checks allow it)."""

    def __post_init__(self) -> None:
        for name in ("feeds_resume_us", "idle_gap_us", "stream_wait_us", "clock_tolerance_us"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0 (found {value})")


def _weights(src, dst, is_wait, start, mstart, end, carry) -> np.ndarray:
    """Binding local in-edge of each node: weight = start - source end; other local edges:
    min(gap, 0); edges a blocking node waits on: min(modelled start - source end, 0). A node
    whose ``carry`` (earlier steps' work on its stream) ended after every local source has no
    binding edge: its release starts it."""
    weight = np.empty(len(src))
    gap = start[dst] - end[src]
    loc = np.flatnonzero(~is_wait)
    loc = loc[np.lexsort((end[src[loc]], dst[loc]))]
    binding = np.ones(len(loc), dtype=bool)
    binding[:-1] = dst[loc[1:]] != dst[loc[:-1]]
    binding &= carry[dst[loc]] <= end[src[loc]]
    weight[loc] = np.minimum(gap[loc], 0.0)
    weight[loc[binding]] = gap[loc[binding]]
    wt = np.flatnonzero(is_wait)
    weight[wt] = np.minimum(mstart[dst[wt]] - end[src[wt]], 0.0)
    return weight


@dataclass(slots=True)
class RawGraph:
    """Nodes (measured times) and local edges of one window, before barriers and weights.

    Both ingestion paths (Kineto events, Chakra ET nodes) produce one; ``finalize`` adds the
    barriers, the modelled starts and the edge weights the same way for both."""

    names: list[str]
    nodes: dict[str, np.ndarray]  # the NODE_COLUMNS except mstart / mdur, one row per op
    end: np.ndarray  # µs, modelled end of each op (see collectives.modelled_ends)
    inst: np.ndarray  # cross-rank instance of each op (-1: none)
    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray
    is_wait: np.ndarray  # edges a blocking op waits on (its modelled start follows them)
    window_start: float
    step: int | None
    measured: dict[int, float]
    meta: dict
    carry: np.ndarray | None = None  # µs per op: earliest start from work an earlier step queued (-inf: none)
    gaps: dict[str, np.ndarray] | None = None  # the pieces of time between a thread's ops (gaps.py)
    regions: dict[str, np.ndarray] | None = None  # the events enclosing leaf ops (regions.py)
    seq: np.ndarray | None = None  # a collective's sequence number in its group (-1: none); None: no matching report
    aligned: int = 0  # collectives some ranks of their group lack (collectives.match_instances' stats)


def finalize(raw: RawGraph) -> ExecutionGraph:
    """Barriers at the last arrival of each cross-rank instance, modelled starts of blocking
    ops, edge weights (module docstring), releases; then the validated ExecutionGraph."""
    crossed, barriers = _uncross(raw)
    if raw.seq is not None:
        raw.meta["collectives"] = {
            **match_report(raw.nodes["coll_kind"], raw.inst, raw.seq),
            "aligned": raw.aligned,
            "in_a_cycle": crossed,
        }
    nd, inst, src, dst, kind, is_wait = raw.nodes, raw.inst, raw.src, raw.dst, raw.kind, raw.is_wait
    n = len(nd["start"])
    n_bar = int(inst.max()) + 1 if n and inst.max() >= 0 else 0
    member, arrival, sends, waiting, late = barriers[0] if barriers else _participants(raw, n_bar)
    raw.meta["late_peers"] = late
    start = np.concatenate([nd["start"], arrival])
    end = np.concatenate([raw.end, arrival])
    mstart = start.copy()
    mstart[waiting] = np.clip(arrival[inst[waiting]], start[waiting], end[waiting])
    ws, wd = src[is_wait], dst[is_wait]
    if len(ws):
        ready = np.full(n + n_bar, -np.inf)
        np.maximum.at(ready, wd, end[ws])
        s = np.unique(wd)
        mstart[s] = np.clip(ready[s], start[s], end[s])

    carry = np.full(n + n_bar, -np.inf)  # a GPU op queued behind an earlier step's work on its stream
    if raw.carry is not None:
        carry[:n] = np.minimum(raw.carry, mstart[:n])
    weight = _weights(src, dst, is_wait, start, mstart, end, carry)
    latest = np.full(n + n_bar, -np.inf)
    np.maximum.at(latest, dst[~is_wait], end[src[~is_wait]])
    # earliest start of nodes nobody waits for, and of those the earlier steps' work held up
    release = np.where((latest > -np.inf) & (carry <= latest), -np.inf, mstart)

    ckind = nd["coll_kind"]
    if n_bar:
        src, dst, origin = barriers[1] if barriers else _barrier_edges(n, inst, src, dst, is_wait, sends, waiting)
        local = origin[origin >= 0]
        p2p = isin_small(ckind[waiting], P2P_KINDS)
        kind = np.concatenate([kind[local], np.where(p2p, EdgeKind.SEND_RECV, EdgeKind.COLLECTIVE_SYNC).astype(np.int8)])
        weight = np.concatenate([weight[local], np.minimum(mstart[waiting] - arrival[inst[waiting]], 0.0)])
        bar_release = np.full(n_bar, -np.inf)
        lone = member[latest[member] == -np.inf]
        np.maximum.at(bar_release, inst[lone], start[lone])
        np.maximum.at(bar_release, inst[member], carry[member])  # a participant queued behind earlier steps' work
        release[waiting] = -np.inf
        release[n:] = bar_release

    names = list(raw.names)
    bar_name = np.arange(len(names), len(names) + n_bar, dtype=np.int32)
    names.extend(barrier_labels(ckind, inst, n_bar))
    group = nd["group_size"].astype(np.int32).copy()
    bar_group = np.bincount(inst[member], minlength=n_bar).astype(np.int32) if n_bar else np.zeros(0, np.int32)
    group[member] = np.where(group[member] < 0, bar_group[inst[member]], group[member])
    bar_msg = np.full(n_bar, np.nan)
    if n_bar:
        np.fmax.at(bar_msg, inst[member], nd["msg_bytes"][member])
    bar_kind = np.full(n_bar, -1, dtype=np.int8)
    bar_kind[inst[member]] = ckind[member]

    def cat(a: np.ndarray, fill, dtype) -> np.ndarray:
        return np.concatenate([np.asarray(a), np.full(n_bar, fill)]).astype(dtype)

    nodes = {
        "rank": cat(nd["rank"], -1, np.int32),
        "tid": cat(nd["tid"], -1, np.int64),
        "on_gpu": cat(nd["on_gpu"], False, bool),
        "name": np.concatenate([nd["name"], bar_name]).astype(np.int32),
        "node_type": cat(nd["node_type"], NodeType.NETWORK, np.int8),
        "category": cat(nd["category"], Category.BARRIER, np.int8),
        "start": start,
        "dur": cat(nd["dur"], 0.0, np.float64),
        "mstart": mstart,
        "mdur": end - mstart,
        "event": cat(nd["event"], -1, np.int64),
        "msg_bytes": np.concatenate([nd["msg_bytes"], bar_msg]),
        "group_size": np.concatenate([group, bar_group]).astype(np.int32),
        "coll_kind": np.concatenate([ckind, bar_kind]).astype(np.int8),
    }
    g = ExecutionGraph(
        names=names,
        nodes=nodes,
        edges={"src": src, "dst": dst, "kind": kind, "weight": weight},
        release=release,
        window_start=raw.window_start,
        step=raw.step,
        measured=raw.measured,
        meta=raw.meta,
        gaps=raw.gaps if raw.gaps is not None else empty_gaps(),
        regions=raw.regions if raw.regions is not None else empty_regions(),
    )
    g.validate()
    return g


def _participants(raw: RawGraph, n_bar: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The members of the window's cross-rank instances; each instance's arrival (its last
    participant's start); of the members, the buffered sends and those that wait at the barrier;
    and how many late peers (below).

    A send that ended before its receiver arrived was buffered: it did not wait for it; one
    still running when the receive was posted (gloo's rendezvous waits for the receiver's
    buffer; large NCCL messages too) waited like every other participant. A receive that ended
    before its send was seen to start waited all along: the send's span was recorded after the
    transfer (a descheduled backend thread), or the pair is matched by size and order only (a
    sampled trace); it keeps the barrier edge, the one edge allowed to run back in time, and is
    counted in meta["late_peers"]."""
    inst = raw.inst
    member = np.flatnonzero(inst >= 0)
    arrival = np.full(n_bar, -np.inf)
    np.maximum.at(arrival, inst[member], raw.nodes["start"][member])
    early = raw.end[member] < arrival[inst[member]]
    buffered = (raw.nodes["coll_kind"][member] == CollectiveKind.SEND) & early
    return member, arrival, member[buffered], member[~buffered], int((early & ~buffered).sum())


def _barrier_edges(n: int, inst: np.ndarray, src: np.ndarray, dst: np.ndarray, is_wait: np.ndarray, sends: np.ndarray, waiting: np.ndarray):
    """The edges with a barrier node per instance (node ``n + instance``): a participant's own
    dependencies decide when it arrives, so they now lead to its barrier (a buffered send's are
    copied there, the send itself still starts when they allow), and the barrier leads to every
    participant that waits at it. Returns (src, dst, origin): ``origin`` the index of the local
    edge each edge comes from, -1 for the barrier's edges to its participants (last)."""
    n_bar = int(inst.max()) + 1
    inst_all = np.concatenate([inst, np.full(n_bar, -1)])
    is_send = np.zeros(n + n_bar, dtype=bool)
    is_send[sends] = True
    into = (inst_all[dst] >= 0) & ~is_wait
    copy = np.flatnonzero(into & is_send[dst])
    origin = np.concatenate([np.arange(len(src)), copy, np.full(len(waiting), -1)])
    src = np.concatenate([src, src[copy], n + inst[waiting]])
    dst = np.concatenate([np.where(into & ~is_send[dst], n + inst_all[dst], dst), n + inst_all[dst[copy]], waiting])
    return src, dst, origin


Barriers = tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""The window's participants (_participants) and its edges with barriers (_barrier_edges)."""


def _uncross(raw: RawGraph) -> tuple[int, Barriers | None]:
    """Leave unmatched the cross-rank instances whose barriers close a dependency cycle; return
    how many, and the participants and barrier edges of the instances left (None where there are
    none, or cycles are left after MAX_CYCLE_PASSES: finalize builds them). Ranks run a process group's collectives in one order, so matched rightly
    no two instances cross; two that do (X before Y on one rank, Y before X on another: each
    barrier waits for the other) were matched wrongly — a rank's trace lacks a send or a
    collective that order alone cannot place — and the step's graph would have no order at all.
    Each cycle found gives up one of its instances (its ops stay, as ops seen on one rank)."""
    nd = raw.nodes
    n = len(nd["start"])
    crossed = 0
    for _ in range(MAX_CYCLE_PASSES):
        if not n or raw.inst.max() < 0:
            return crossed, None
        n_bar = int(raw.inst.max()) + 1
        parts = _participants(raw, n_bar)
        edges = _barrier_edges(n, raw.inst, raw.src, raw.dst, raw.is_wait, parts[2], parts[3])
        src, dst, origin = edges
        give_up = np.where(origin < 0, len(_GIVE_UP), _GIVE_UP[raw.kind[np.maximum(origin, 0)]])
        drop = _cycle_breaks(n + n_bar, src.astype(np.int64), dst.astype(np.int64), give_up.astype(np.int64))
        bad = np.unique(src[drop & (origin < 0)] - n)
        if not len(bad):
            return crossed, (parts, edges)
        gone = np.isin(raw.inst, bad)
        raw.end[gone] = (nd["start"] + nd["dur"])[gone]  # a lone op ends when it was recorded to
        kept = np.unique(raw.inst[(raw.inst >= 0) & ~gone])
        raw.inst = np.where(gone | (raw.inst < 0), -1, np.searchsorted(kept, raw.inst))
        crossed += len(bad)
    return crossed, None


def build_graph(table: EventTable, step: int | None, options: BuildOptions | None = None, span: int = 1) -> ExecutionGraph:
    """The ExecutionGraph of one step (``None``: the whole trace), all ranks merged.

    Each rank's step is measured from its origin (facts.py): the later of its step start and the
    end of the device work queued before it, so that a device-bound step's time is its period,
    not the CPU's lead plus the period. Host threads with no dependency into the step's work
    (a progress-bar monitor, a watchdog: ``bystanders``) are left out, and listed in the meta.

    ``span`` > 1: a window over that step and the ones after it (see window.select_window): its
    step time runs from the first step's origin to the last step's end; a change that shortens
    a step moves the next one's start (the steady state of a pipeline, a device-bound loop)."""
    opt = options or BuildOptions()
    facts = step_facts(table, step)
    # (the whole trace: from each rank's first event, or where work queued before the trace ended)
    origins = {f.rank: f.origin for f in facts.ranks if step is not None or f.queued_before_trace_us > 0} or None
    if facts.origin is not None:  # (several ranks: the step starts when the last of them finished the one before)
        origins = {f.rank: facts.origin for f in facts.ranks}
    built = list(_window_edges(table, step, opt, frozenset(), origins, span))
    away = _bystanders(built[0], built[1])
    tails = _tails(built[0], built[1], away)
    if away or tails:
        built = list(_window_edges(table, step, opt, frozenset(away), origins, span, tails))
    return _finish(table, step, opt, built, facts, away)  # (it empties ``built``: the window is freed before finalize)


def _window_edges(
    table: EventTable,
    step: int | None,
    opt: BuildOptions,
    exclude: frozenset,
    origins: dict[int, float] | None,
    span: int = 1,
    tails: dict[tuple[int, int, int], float] | None = None,
):
    """The window of ``step`` without the ``exclude`` threads (nor the ``tails`` of others), and
    the edges of every local rule."""
    w = make_window(table, step, exclude, origins, opt.clock_tolerance_us, span, tails)
    pieces = gap_pieces(w, w.lead_from)
    E = rules.EdgeSet()
    rules.program_order(w, E)
    launcher, self_released = rules.launches(w, E)
    rules.forward_backward(table, w, E)
    rules.data_dependencies(table, w, E)
    rules.cuda_syncs(w, E, opt.blocking_sync_calls, opt.clock_tolerance_us, opt.stream_wait_us)
    rules.device_waits(w, E, opt.clock_tolerance_us)
    rules.blocking_copies(w, E)
    rules.stream_waits(w, E, launcher, opt.stream_wait_us, opt.clock_tolerance_us)
    rules.thread_handoffs(w, E, pieces, opt.idle_gap_us, opt.feeds_resume_us, launcher)
    rules.blocked_handoffs(w, E, opt.idle_gap_us, opt.feeds_resume_us)
    return w, E, pieces, self_released


def _bystanders(w: Window, E: rules.EdgeSet) -> dict[tuple[int, int, int], dict]:
    """Host threads with no dependency into the step's work: no chain of edges leads from any of
    their ops to a lane of the step's own (the thread of the ProfilerStep span, every device stream
    and every backend thread: collectives). A thread the step's work only leads to (a monitor
    that queries the device's events, a thread woken by the step that hands nothing back) cannot
    hold the step up, so it cannot carry its path either. Without a ProfilerStep and without device
    or backend work, the step's own is the thread that runs the most op time (ranges and Python
    frames are no ops): a thread sleeping through a CPU profile in one Python frame (a progress
    bar's monitor) carried its whole path.
    Returns (rank, pid, tid) -> what is reported of it: its name, ops and its longest op."""
    if not w.n_leaf:
        return {}
    c = w.c
    n_thread = int(w.leaf_thread.max()) + 1
    n_gpu = len(w.gpu_rows)
    lane = np.concatenate(
        [w.leaf_thread, n_thread + w.gpu_stream, n_thread + (int(w.gpu_stream.max()) + 1 if n_gpu else 0) + w.backend_lane]
    )
    step_threads = {(s.rank, s.pid, s.tid) for s in w.steps}
    key_of = _thread_keys(w)
    # (a backend's thread is one of its own: the copies gloo runs around an exchange, the division
    # after a reduce-scatter, are leaves of the thread whose backend ops are the step's collectives)
    back = w.backend_rows
    backend_threads = set(zip(c["rank"][back].tolist(), c["pid"][back].tolist(), c["tid"][back].tolist()))
    anchors = [t for t in range(n_thread) if key_of[t] in step_threads or key_of[t] in backend_threads]
    anchors += list(range(n_thread, int(lane.max()) + 1))  # device streams and backend threads
    if len(anchors) == 0:  # no step marker, no device, no backend: the thread that runs the most op time
        ev = w.leaf_rows
        work = np.bincount(w.leaf_thread, weights=np.where(c["is_range"][ev], 0.0, w.end[ev] - w.ts[ev]), minlength=n_thread)
        if not (work > 0).any():
            return {}
        anchors = [int(np.argmax(work))]
    lanes = int(lane.max()) + 1
    pairs = E.lanes_joined(lane)  # each pair of lanes an edge leads from, to, once
    into: list[list[int]] = [[] for _ in range(lanes)]  # lane -> the lanes with an edge into it
    for x, y in zip((pairs // lanes).tolist(), (pairs % lanes).tolist()):
        into[y].append(x)
    polls = rules.queries_only(w)  # (a bystander launches nothing: a launch is an edge into a device stream)
    kept = np.zeros(lanes, dtype=bool)  # the lanes from which a chain of edges reaches the step's own
    todo = list(anchors)
    kept[todo] = True
    while todo:
        for x in into[todo.pop()]:
            if not kept[x]:
                kept[x] = True
                todo.append(x)
    out = {}
    for t in range(n_thread):
        if kept[t]:
            continue
        mine = np.flatnonzero(w.leaf_thread == t)
        ev = w.leaf_rows[mine]
        longest = ev[np.argmax(w.end[ev] - w.ts[ev])]
        out[key_of[t]] = {
            "ops": int(len(mine)),
            "longest_op": w.names[c["name"][longest]][:120],
            "ends_us": float(w.end[ev].max()),
            "polls": bool(polls[t]),
        }
    return out


def _thread_keys(w: Window) -> list[tuple[int, int, int]]:
    """(rank, pid, tid) of each dense host thread of the window's leaves (w.leaf_thread)."""
    c = w.c
    first_leaf = np.searchsorted(w.leaf_thread, np.arange(int(w.leaf_thread.max()) + 1), side="left")
    leaf_ev = w.leaf_rows[np.minimum(first_leaf, w.n_leaf - 1)]
    return list(zip(c["rank"][leaf_ev].tolist(), c["pid"][leaf_ev].tolist(), c["tid"][leaf_ev].tolist()))


def _tails(w: Window, E: rules.EdgeSet, away: dict[tuple[int, int, int], dict]) -> dict[tuple[int, int, int], float]:
    """Of the host threads that are neither the step's own nor bystanders: where each one's last
    dependency into the step's work ends, if it has ops starting after that (table-relative µs).
    What such a thread does after its last op that another lane waits for (a helper that put its
    result and blocked for the next job, a worker preparing the next batch) cannot hold this step
    up, so it cannot carry its path or end it: ``make_window`` leaves it out, where it runs past
    the end of its rank's step (else it could not end the step anyway). Empty without a
    ProfilerStep."""
    if not w.n_leaf or not w.steps:
        return {}
    n_thread = int(w.leaf_thread.max()) + 1
    last_leaf = np.searchsorted(w.leaf_thread, np.arange(n_thread), side="right") - 1
    key_of = _thread_keys(w)
    step_threads = {(s.rank, s.pid, s.tid) for s in w.steps}
    helper = np.array([k not in step_threads and k not in away for k in key_of], dtype=bool)
    if not helper.any():
        return {}
    lane = np.full(w.n_nodes, -1, dtype=np.int64)
    lane[: w.n_leaf] = w.leaf_thread
    last_out = np.full(n_thread, -1, dtype=np.int64)  # per thread: its last leaf with an edge to another lane
    for src, dst in zip(E.src, E.dst):
        leafy = src < w.n_leaf
        s_, d_ = src[leafy], dst[leafy]
        out = lane[s_] != lane[d_]
        np.maximum.at(last_out, lane[s_[out]], s_[out])
    step_end: dict[int, float] = {}
    for st in w.steps:
        step_end[st.rank] = max(step_end.get(st.rank, -np.inf), st.end)
    out_tails = {}
    for t in np.flatnonzero(helper & (last_out >= 0) & (last_out < last_leaf)).tolist():
        # only a tail that runs past its rank's step could end the step: one inside it is harmless,
        # and may be work the step waited for through a hand-over the rules did not see
        if float(w.end[w.leaf_rows[last_leaf[t]]]) + w.w0 > step_end.get(key_of[t][0], np.inf):
            out_tails[key_of[t]] = float(w.end[w.leaf_rows[last_out[t]]]) + w.w0
    return out_tails


def _finish(
    table: EventTable,
    step: int | None,
    opt: BuildOptions,
    built: list,
    facts: StepFacts,
    away: dict[tuple[int, int, int], dict],
) -> ExecutionGraph:
    """The graph of the window, its edges and gap pieces (``built``, emptied here: no reference to
    the window is left in the caller when it is let go)."""
    w, E, pieces, self_released = built
    built.clear()
    regions = window_regions(w)  # (first: its look-ups are the largest passing allocation, made before the graph's columns exist)
    c, rows = w.c, w.node_rows
    start = w.ts[rows]
    pairs = rules.backends(w, E)
    peer = np.full(len(rows), -1, dtype=np.int64)  # a backend send/recv's peer is its c10d call's
    dur = c["dur"][rows]
    for call, work in pairs:
        peer[work] = c["peer"][call]
        if int(w.ckind[work]) in P2P_KINDS and w.ts[call] < start[work]:  # (posted in the call: rules.backends)
            start[work] = w.ts[rows[work]] = w.ts[call]  # (the window's too: the rules after this one read it)
            dur[work] = w.end[rows[work]] - start[work]
    # an NCCL send's or receive's kernel: the peer it names, else the one its record_param_comms
    # names (recent PyTorch) or takes from its c10d call (groups.nested_peers)
    device_p2p = np.flatnonzero(isin_small(w.ckind, P2P_KINDS) & (peer < 0) & (c["cls"][rows] != EvClass.CPU))
    if len(device_p2p):
        own = c["peer"][rows[device_p2p]].astype(np.int64)
        lacking = own < 0
        own[lacking] = launching_op_values(c, rows[device_p2p[lacking]], "peer")
        peer[device_p2p] = own
    seq = _sequence_numbers(w, pairs)
    match_stats: dict[str, int] = {}
    inst = match_instances(
        c["rank"][rows],
        start,
        w.ckind,
        c["pg"][rows],
        c["msg_nelems"][rows],
        peer,
        seq,
        match_stats,
        w.end[rows],
        isin_small(c["cls"][rows], GPU_CLASSES),
    )
    end = modelled_ends(start, w.end[rows], w.ckind, inst)
    rules.p2p_completions(w, pairs, inst, end, opt.idle_gap_us)
    waited = rules.collective_waits(w, E, pairs)  # (asynchronous calls their thread waits for later: no resume after them)
    rules.completions(w, E, [p for p in pairs if p[0] not in waited], inst, end, opt.feeds_resume_us, opt.idle_gap_us, pieces)
    rank_starts, polling_loops, w_end = _rank_starts(w, table), int((w.polls > 0).sum()), w.end[rows]
    queued = rows[w.queued[rows]]  # launches that waited for room in the device's queue
    q_rank, q_dur = c["rank"][queued], c["dur"][queued]
    queue_waits = {str(r): float(q_dur[q_rank == r].sum()) for r in np.unique(q_rank).tolist()}
    w.let_go()  # the rules are done: their per-event look-ups go before the graph's columns are made
    src, dst, kind, is_wait = E.arrays(release=True)
    src, dst, kind, is_wait, dropped = _causal(src, dst, kind, is_wait, start, w_end, opt.clock_tolerance_us)
    src, dst, kind, is_wait, given = _acyclic(len(rows), src, dst, kind, is_wait)
    dropped.update(given)
    del w_end
    nodes = {
        "rank": c["rank"][rows],
        "tid": c["tid"][rows],
        "on_gpu": isin_small(c["cls"][rows], GPU_CLASSES),
        "name": c["name"][rows],
        "node_type": w.node_type(),
        "category": w.node_category(),
        "start": start,
        "dur": dur,
        "event": w.rows[rows],
        "msg_bytes": w.msg_bytes(),
        "group_size": np.where(w.is_net, c["group_size"][rows], -1),
        "coll_kind": w.ckind,
    }
    raw = RawGraph(
        names=w.names,
        nodes=nodes,
        end=end,
        inst=inst,
        src=src,
        dst=dst,
        kind=kind,
        is_wait=is_wait,
        window_start=table.t0 + w.w0,
        step=step,
        measured=w.measured,
        meta={
            "files": {str(k): v for k, v in table.files.items()},
            "rank_start_us": rank_starts,
            "fields_version": F.FIELDS_VERSION,
            "dropped_edges": dropped,
            "collectives": {},  # (finalize: once crossing instances are left unmatched)
            "step_end_us": {str(s.rank): s.end - w.w0 for s in w.steps},
            "rank_origin_us": {str(r): t for r, t in w.origins.items()},
            "facts": facts.to_dict(offset=w.w0),
            "run_facts": run_facts(table).to_dict(),
            "bystanders": [
                {"rank": r, "pid": p, "tid": t, "thread": table.thread_names.get((r, p, t), f"thread {t}"), **info}
                for (r, p, t), info in sorted(away.items())
            ],
            "polling_loops": polling_loops,
            "launches_waited_at_start": self_released,
            "queue_wait_us": queue_waits,
            # leaf nodes that are ranges of program code with no op inside (a record_function around a sleep)
            "range_leaves": sorted(set(nodes["name"][~nodes["on_gpu"] & c["is_range"][rows]].tolist())),
            **_thread_names(table, nodes),
        },
        carry=w.carry,
        gaps=pieces,
        regions=regions,
        seq=seq,
        aligned=match_stats.get("aligned", 0),
    )
    del w, c, E  # the window's columns are the largest thing held: gone before finalize allocates
    return finalize(raw)


def _sequence_numbers(w: Window, pairs: list[tuple[int, int]]) -> np.ndarray:
    """Per node, the collective's sequence number in its process group (-1 unknown). A GPU
    collective without one takes it from the CPU op of its rank with the same External id (the
    record_param_comms that launched it); a backend op from its c10d call."""
    c, rows = w.c, w.node_rows
    seq = c["seq"][rows].copy()
    lacking = np.flatnonzero(w.is_net & (seq < 0))
    seq[lacking] = launching_op_values(c, rows[lacking], "seq")
    for call, work in pairs:
        if seq[work] < 0:
            seq[work] = c["seq"][call]
    return seq


def _thread_names(table: EventTable, nodes: dict[str, np.ndarray]) -> dict[str, dict[str, str]]:
    """The trace's names of the window's CPU threads and GPU streams, keyed "rank:tid"."""
    out: dict[str, dict[str, str]] = {"thread_names": {}, "stream_names": {}}
    if not table.thread_names:
        return out
    seen = np.unique(np.stack([nodes["rank"], nodes["tid"], nodes["on_gpu"]], axis=1), axis=0)
    by_rank_tid = {(r, t): name for (r, _, t), name in table.thread_names.items()}
    for r, t, gpu in seen.tolist():
        name = by_rank_tid.get((r, t))
        if name:
            out["stream_names" if gpu else "thread_names"][f"{r}:{t}"] = name
    return out


def _causal(src, dst, kind, is_wait, start, end, tol: float):
    """Drop the edges that run back in time: a source that started after its destination, or a
    wait on an op that ended after the waiter returned (beyond ``tol`` µs of clock disagreement).
    Returns the kept edges and the number dropped per edge kind name."""
    bad = np.where(is_wait, end[src] > end[dst] + tol, start[src] > start[dst] + tol)
    dropped = {EdgeKind(k).name.lower(): int(v) for k, v in zip(*np.unique(kind[bad], return_counts=True))}
    keep = ~bad
    return src[keep], dst[keep], kind[keep], is_wait[keep], dropped


# the order in which an edge of each kind is given up to break a cycle, the least certain first:
# a hand-over between threads and a wait read from timing before a launch, a peer or program order
_GIVE_UP = np.zeros(max(EdgeKind) + 1, dtype=np.int64)
for _rank, _k in enumerate(
    (
        EdgeKind.PROGRAM_ORDER,
        EdgeKind.COLLECTIVE_SYNC,
        EdgeKind.SEND_RECV,
        EdgeKind.LAUNCH,
        EdgeKind.BACKEND,
        EdgeKind.FWD_BWD,
        EdgeKind.DATA,
        EdgeKind.FEEDS,
        EdgeKind.SYNC,
        EdgeKind.THREAD,
    )
):
    _GIVE_UP[_k] = _rank
MAX_CYCLE_PASSES = 64


@numba.njit(cache=True)
def _cycle_breaks(n: int, src: np.ndarray, dst: np.ndarray, give_up: np.ndarray) -> np.ndarray:
    """Edges to drop so that fewer cycles remain: a depth-first walk over the nodes no topological
    order reaches; for each cycle it closes, the edge of the cycle most readily given up (the
    last such one on a tie). Empty when the edges form no cycle."""
    m = len(src)
    topo, ptr, order = kahn(n, src, dst)
    drop = np.zeros(m, dtype=np.bool_)
    if len(topo) == n:
        return drop
    stuck = np.ones(n, dtype=np.bool_)
    stuck[topo] = False
    color = np.zeros(n, dtype=np.int8)  # 0 unseen, 1 on the walk's path, 2 done
    depth_of = np.full(n, -1, dtype=np.int64)
    path_node = np.empty(n, dtype=np.int64)
    path_edge = np.empty(n, dtype=np.int64)  # the edge that led to path_node[i] (i >= 1)
    next_j = np.empty(n, dtype=np.int64)
    for root in range(n):
        if not stuck[root] or color[root] != 0:
            continue
        top = 0
        path_node[0] = root
        next_j[0] = ptr[root]
        color[root] = 1
        depth_of[root] = 0
        while top >= 0:
            v = path_node[top]
            if next_j[top] >= ptr[v + 1]:
                color[v] = 2
                depth_of[v] = -1
                top -= 1
                continue
            e = order[next_j[top]]
            next_j[top] += 1
            d = dst[e]
            if not stuck[d] or drop[e]:
                continue
            if color[d] == 1:  # a cycle: path from d to v, then e
                best, best_rank = e, give_up[e]
                for i in range(depth_of[d] + 1, top + 1):
                    f = path_edge[i]
                    if give_up[f] > best_rank:
                        best, best_rank = f, give_up[f]
                drop[best] = True
            elif color[d] == 0:
                top += 1
                path_node[top] = d
                path_edge[top] = e
                next_j[top] = ptr[d]
                color[d] = 1
                depth_of[d] = top
    return drop


def _acyclic(n: int, src, dst, kind, is_wait):
    """The edges with every cycle broken, and how many of each kind were given up. Edges that each
    hold in time can still close a cycle where the trace's times tie (two threads that resume at
    one whole-µs instant, each after the other's zero-length op; a call nested in another by
    rounding): such a cycle gives up its least certain edge (``_GIVE_UP``) rather than the step."""
    given: dict[str, int] = {}
    keep = np.ones(len(src), dtype=bool)
    for _ in range(MAX_CYCLE_PASSES):
        idx = np.flatnonzero(keep)
        drop = _cycle_breaks(n, src[idx].astype(np.int64), dst[idx].astype(np.int64), _GIVE_UP[kind[idx]])
        if not drop.any():
            break
        for k, v in zip(*np.unique(kind[idx[drop]], return_counts=True)):
            name = EdgeKind(int(k)).name.lower() + "_in_a_cycle"
            given[name] = given.get(name, 0) + int(v)
        keep[idx[drop]] = False
    return src[keep], dst[keep], kind[keep], is_wait[keep], given


def _rank_starts(w, table: EventTable) -> dict[str, float]:
    """Each rank's step start, µs from the window start (ranks start a step at different times);
    in a window of several steps, its first step's start (the window's; ``step_end_us`` is its last
    step's end)."""
    if w.steps:
        starts: dict[str, float] = {}
        for s in w.steps:  # (in step order)
            starts.setdefault(str(s.rank), s.start - w.w0)
        return starts
    return {str(r): float(w.ts[w.c["rank"] == r].min()) for r in table.ranks}


def build_graphs(
    table: EventTable, steps: list[int] | None = None, options: BuildOptions | None = None, engine: Engine | None = None
) -> list[ExecutionGraph]:
    """One graph per ProfilerStep present on any rank (or one for the whole trace, with a
    warning). Steps are independent: large tables are built one process per core, or on
    ``engine`` (graph_pipeline.engine), which receives the table once per worker."""
    return list(iter_graphs(table, steps, options, engine))


def iter_graphs(
    table: EventTable, steps: list[int] | None = None, options: BuildOptions | None = None, engine: Engine | None = None
) -> Iterator[ExecutionGraph]:
    """The graphs of ``build_graphs`` one at a time, in step order (a long run's graphs need not
    all be held at once). The steps are checked before anything is built: a bad selection or
    traces of different runs raise here, not halfway through."""
    present = checked_steps(table, steps)
    if present is None:
        return iter([build_graph(table, None, options)])
    return _graphs(table, present, options, engine)


def checked_steps(table: EventTable, steps: list[int] | None = None) -> list[int] | None:
    """The step numbers to build (``steps``, or every step present), checked: a step that is not in
    the trace, or ranks starting one step too far apart (traces of different runs), raise
    GraphError; steps lasting 0 µs and steps missing on some ranks are warned about. None: the
    trace has no step markers (one window for the whole trace, with a warning). The table's
    look-up indexes are computed here, before it is shared with workers."""
    present = sorted({s.number for s in table.steps})
    if steps is not None:
        missing = sorted(set(steps) - set(present))
        if missing:
            raise GraphError(f"no ProfilerStep#{missing[0]} in the trace (steps present: {present or 'none'})")
        present = sorted(set(steps))
    if not present:
        files = ", ".join(dict.fromkeys(table.files.values()))  # (ranks merged into one file share its name)
        hints = [info["step_hint"] for info in table.inputs.values() if info.get("step_hint")]
        hint = max(hints, key=lambda h: h[1]) if hints else None
        warnings.warn(
            f"{files}: no ProfilerStep markers; analysing the whole trace as one window (--steps-at NAME starts a step at each "
            "host op so named"
            + (f"; e.g. --steps-at '{hint[0]}': {hint[1]} such annotations at the top of a thread" if hint else "")
            + ")",
            OracleWarning,
            stacklevel=4,
        )
        return None
    for number in present:
        mine = table.steps_of(number)
        ranks = {s.rank for s in mine}
        starts = [s.start for s in mine]
        longest = max(s.span for s in mine)
        if len(mine) > 1 and max(starts) - min(starts) > max(MIXED_RUNS_US, 10 * longest):
            first, last = min(mine, key=lambda s: s.start), max(mine, key=lambda s: s.start)
            raise GraphError(
                f"rank {last.rank} starts ProfilerStep#{number} {(last.start - first.start) / 1e6:.1f} s after rank {first.rank}, "
                f"for a step of {longest / 1000:.1f} ms: these traces are from different runs (or from hosts whose clocks disagree)"
            )
        if longest <= 0:
            warnings.warn(f"ProfilerStep#{number} lasts 0 µs on every rank: nothing ran in it", OracleWarning, stacklevel=4)
        absent = sorted(set(table.ranks) - ranks)
        if absent:
            warnings.warn(f"step {number} is missing on rank(s) {absent}; analysing the ranks that have it", OracleWarning, stacklevel=4)
    table.index()  # computed once, before the table is shared
    table.launchers()
    rules.flow_index(table)
    table_lookups(table)
    index_facts(table)
    return present


def _graphs(table: EventTable, present: list[int], options: BuildOptions | None, engine: Engine | None) -> Iterator[ExecutionGraph]:
    if engine is not None and not isinstance(engine, LocalEngine):
        yield from engine.imap(_build_task, present, shared=(table, options))
        return
    big_steps = len(table) >= PARALLEL_EVENTS and len(table) >= PARALLEL_STEP_EVENTS * len(present)
    workers = min(os.cpu_count() or 1, len(present)) if big_steps else 1
    if workers < 2:
        yield from (build_graph(table, number, options) for number in present)
        return
    # forked workers hand their graphs back as files: a pickled graph would be held twice on each side
    with tempfile.TemporaryDirectory(prefix="bottleneck-oracle-") as folder:
        for path in LocalEngine(workers).imap(_build_to_file, present, shared=(table, options, folder)):
            g = ExecutionGraph.load(path)
            os.unlink(path)
            yield g


MIXED_RUNS_US = 1e6  # µs: ranks starting one step further apart than this (and 10 steps) are not one run
PARALLEL_EVENTS = 200_000  # build the steps of tables at least this large in parallel ...
PARALLEL_STEP_EVENTS = 50_000  # ... and whose steps hold this many events on average: a graph handed back as a file costs
# more to write and read than a small step costs to build (2,000 steps of 400 events: 14 s reading files, 5 s building here)


def _build_task(shared: tuple[EventTable, BuildOptions | None], step: int) -> ExecutionGraph:
    table, options = shared
    return build_graph(table, step, options)


def _build_to_file(shared: tuple[EventTable, BuildOptions | None, str], step: int) -> str:
    table, options, folder = shared
    path = os.path.join(folder, f"step-{step}.npz")
    build_graph(table, step, options).save(path, compress=False)
    return path

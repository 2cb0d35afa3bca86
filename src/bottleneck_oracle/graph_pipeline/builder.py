"""EventTable -> ExecutionGraph per step: nodes (window.py), edge rules (edges.py),
cross-rank barriers (collectives.py), then edge weights.

Weights. Every node has a modelled start: its measured start, or for a blocking
op (a sync call, a collective) the moment what it waits for was ready. Of a
node's in-edges the one whose source ended last is binding and gets weight =
start - source end (launch latency, framework gap); the others get
min(gap, 0). So the longest path reproduces every measured start exactly, and
the slack of the non-binding paths is what the trace shows could be absorbed.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from bottleneck_oracle.errors import GraphError, OracleWarning
from bottleneck_oracle.graph_pipeline import edges as rules
from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline.collectives import barrier_labels, match_instances, modelled_ends
from bottleneck_oracle.graph_pipeline.events import EventTable
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind, NodeType
from bottleneck_oracle.graph_pipeline.window import GPU_CLASSES, P2P_KINDS, make_window


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

    def __post_init__(self) -> None:
        if not self.feeds_resume_us >= 0:
            raise ValueError(f"feeds_resume_us must be >= 0 (found {self.feeds_resume_us})")


def _weights(src, dst, is_wait, start, mstart, end) -> np.ndarray:
    """Binding local in-edge of each node: weight = start - source end; other local edges:
    min(gap, 0); edges a blocking node waits on: min(modelled start - source end, 0)."""
    weight = np.empty(len(src))
    gap = start[dst] - end[src]
    loc = np.flatnonzero(~is_wait)
    loc = loc[np.lexsort((end[src[loc]], dst[loc]))]
    binding = np.ones(len(loc), dtype=bool)
    binding[:-1] = dst[loc[1:]] != dst[loc[:-1]]
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


def finalize(raw: RawGraph) -> ExecutionGraph:
    """Barriers at the last arrival of each cross-rank instance, modelled starts of blocking
    ops, edge weights (module docstring), releases; then the validated ExecutionGraph."""
    nd, inst, src, dst, kind, is_wait = raw.nodes, raw.inst, raw.src, raw.dst, raw.kind, raw.is_wait
    n = len(nd["start"])
    n_bar = int(inst.max()) + 1 if n and inst.max() >= 0 else 0
    member = np.flatnonzero(inst >= 0)
    arrival = np.full(n_bar, -np.inf)
    np.maximum.at(arrival, inst[member], nd["start"][member])
    start = np.concatenate([nd["start"], arrival])
    end = np.concatenate([raw.end, arrival])

    # a send that ended before its receiver arrived was buffered: it did not wait for it; one
    # still running when the receive was posted (gloo's rendezvous waits for the receiver's
    # buffer; large NCCL messages too) waited like every other participant
    buffered = (nd["coll_kind"][member] == CollectiveKind.SEND) & (raw.end[member] < arrival[inst[member]])
    sends = member[buffered]
    waiting = member[~buffered]
    mstart = start.copy()
    mstart[waiting] = np.clip(arrival[inst[waiting]], start[waiting], end[waiting])
    ws, wd = src[is_wait], dst[is_wait]
    if len(ws):
        ready = np.full(n + n_bar, -np.inf)
        np.maximum.at(ready, wd, end[ws])
        s = np.unique(wd)
        mstart[s] = np.clip(ready[s], start[s], end[s])

    weight = _weights(src, dst, is_wait, start, mstart, end)
    has_local = np.zeros(n + n_bar, dtype=bool)
    has_local[dst[~is_wait]] = True
    release = np.where(has_local, -np.inf, mstart)  # earliest start of nodes nobody waits for

    ckind = nd["coll_kind"]
    if n_bar:
        # a participant's own dependencies decide when it arrives: they now lead to its barrier
        # (a send's are copied there, the send itself still starts when they allow)
        inst_all = np.concatenate([inst, np.full(n_bar, -1)])
        is_send = np.zeros(n + n_bar, dtype=bool)
        is_send[sends] = True
        into = (inst_all[dst] >= 0) & ~is_wait
        copy = np.flatnonzero(into & is_send[dst])
        to_barrier = n + inst_all[dst[copy]]
        dst = np.where(into & ~is_send[dst], n + inst_all[dst], dst)
        src = np.concatenate([src, src[copy]])
        dst = np.concatenate([dst, to_barrier])
        kind = np.concatenate([kind, kind[copy]])
        weight = np.concatenate([weight, weight[copy]])
        bar_release = np.full(n_bar, -np.inf)
        lone = member[~has_local[member]]
        np.maximum.at(bar_release, inst[lone], start[lone])
        release[waiting] = -np.inf
        release[n:] = bar_release
        p2p = np.isin(ckind[waiting], P2P_KINDS)
        src = np.concatenate([src, n + inst[waiting]])
        dst = np.concatenate([dst, waiting])
        kind = np.concatenate([kind, np.where(p2p, EdgeKind.SEND_RECV, EdgeKind.COLLECTIVE_SYNC).astype(np.int8)])
        weight = np.concatenate([weight, np.minimum(mstart[waiting] - arrival[inst[waiting]], 0.0)])

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
    )
    g.validate()
    return g


def build_graph(table: EventTable, step: int | None, options: BuildOptions | None = None) -> ExecutionGraph:
    """The ExecutionGraph of one step (``None``: the whole trace), all ranks merged."""
    opt = options or BuildOptions()
    w = make_window(table, step)
    c, rows = w.c, w.node_rows
    start = w.ts[rows]
    E = rules.EdgeSet()
    rules.program_order(w, E)
    rules.launches(w, E)
    rules.forward_backward(table, w, E)
    rules.data_dependencies(table, w, E)
    rules.cuda_syncs(w, E, opt.blocking_sync_calls)
    pairs = rules.backends(w, E)
    peer = np.full(len(rows), -1, dtype=np.int64)  # a backend send/recv's peer is its c10d call's
    for call, work in pairs:
        peer[work] = c["peer"][call]
    inst = match_instances(c["rank"][rows], start, w.ckind, c["pg"][rows], c["msg_nelems"][rows], peer)
    end = modelled_ends(start, w.end[rows], w.ckind, inst)
    rules.completions(w, E, pairs, inst, end, opt.feeds_resume_us)
    src, dst, kind, is_wait = E.arrays()
    nodes = {
        "rank": c["rank"][rows],
        "tid": c["tid"][rows],
        "on_gpu": np.isin(c["cls"][rows], GPU_CLASSES),
        "name": c["name"][rows],
        "node_type": w.node_type(),
        "category": w.node_category(),
        "start": start,
        "dur": c["dur"][rows],
        "event": w.rows[rows],
        "msg_bytes": w.msg_bytes(),
        "group_size": np.where(w.is_net, c["group_size"][rows], -1),
        "coll_kind": w.ckind,
    }
    raw = RawGraph(
        names=w.names, nodes=nodes, end=end, inst=inst, src=src, dst=dst, kind=kind, is_wait=is_wait,
        window_start=table.t0 + w.w0, step=step, measured=w.measured,
        meta={"files": {str(k): v for k, v in table.files.items()}, "rank_start_us": _rank_starts(w, table), "fields_version": F.FIELDS_VERSION},
    )  # fmt: skip
    return finalize(raw)


def _rank_starts(w, table: EventTable) -> dict[str, float]:
    """Each rank's step start, µs from the window start (ranks start a step at different times)."""
    if w.steps:
        return {str(s.rank): s.start - w.w0 for s in w.steps}
    return {str(r): float(w.ts[w.c["rank"] == r].min()) for r in table.ranks}


def build_graphs(table: EventTable, steps: list[int] | None = None, options: BuildOptions | None = None) -> list[ExecutionGraph]:
    """One graph per ProfilerStep present on any rank (or one for the whole trace, with a warning)."""
    present = sorted({s.number for s in table.steps})
    if steps is not None:
        missing = sorted(set(steps) - set(present))
        if missing:
            raise GraphError(f"no ProfilerStep#{missing[0]} in the trace (steps present: {present or 'none'})")
        present = sorted(set(steps))
    if not present:
        files = ", ".join(table.files.values())
        warnings.warn(f"{files}: no ProfilerStep markers; analysing the whole trace as one window", OracleWarning, stacklevel=2)
        return [build_graph(table, None, options)]
    for number in present:
        ranks = {s.rank for s in table.steps if s.number == number}
        absent = sorted(set(table.ranks) - ranks)
        if absent:
            warnings.warn(
                f"ProfilerStep#{number} is missing on rank(s) {absent}; analysing the ranks that have it", OracleWarning, stacklevel=2
            )
    workers = min(os.cpu_count() or 1, len(present)) if len(table) >= PARALLEL_EVENTS else 1
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [build_graph(table, number, options) for number in present]
    # steps are independent: one process per core; forked workers share the table's memory
    table.index()
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init, initargs=(table, options)) as pool:
        return list(pool.map(_worker_build, present, chunksize=max(1, len(present) // (4 * workers))))


PARALLEL_EVENTS = 200_000  # build the steps of tables at least this large in parallel
_WORKER: dict = {}  # per worker process: the table and options it builds from


def _worker_init(table: EventTable, options: BuildOptions | None) -> None:
    _WORKER["table"], _WORKER["options"] = table, options


def _worker_build(step: int) -> ExecutionGraph:
    return build_graph(_WORKER["table"], step, _WORKER["options"])

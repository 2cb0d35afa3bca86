"""Exact critical path method on an ExecutionGraph, on arrays (numba-compiled passes).

EST/EFT by a forward pass in topological order, LST/LFT by a backward pass from
the deadlines, slack = LST - EST, and the critical path by following, from the
node that ends the step, the predecessor that determined each start.

The objective ("makespan") is the step time: from each rank's origin (ExecutionGraph.rank_origin:
its step start, or the end of device work queued before it; on a step of several ranks that
follows one of theirs in the trace, every rank's is the latest of them, when the last rank
finished the step before) to the end of its last op, the longest. Ranks start a step at different
times (a pipeline's last stage finishes a step early and starts the next one early, then waits),
so this is not the merged window (first rank's start to last op's end, ``window``). Every node's
deadline is its rank's origin + the step time; a node's slack is how much it can grow before the
step gets longer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from bottleneck_oracle.errors import GraphError
from bottleneck_oracle.graph_pipeline.arrays import csr as _csr
from bottleneck_oracle.graph_pipeline.arrays import kahn as _topo
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph


@dataclass(slots=True)
class CPMResult:
    est: np.ndarray  # float64 µs, earliest start (from the window start)
    eft: np.ndarray  # float64 µs, earliest finish
    lst: np.ndarray  # float64 µs, latest start that keeps the makespan
    lft: np.ndarray  # float64 µs
    slack: np.ndarray  # float64 µs, lst - est (>= 0)
    makespan: float  # µs, the step time: max over ranks of (end of its last op - its step start)
    path: np.ndarray  # int64 node ids of the critical path, in time order
    path_edges: np.ndarray  # int64 edge ids between consecutive path nodes
    pred: np.ndarray  # int64, the determining in-edge of each node (-1 if its release decided)
    window: float = 0.0  # µs, from the window start to the last op's end
    path_origin: float = 0.0  # µs, step start of the rank whose span is the step time

    @property
    def critical(self) -> np.ndarray:
        mask = np.zeros(len(self.est), dtype=bool)
        mask[self.path] = True
        return mask


@numba.njit(cache=True)
def _passes(
    n: int,
    dur: np.ndarray,
    release: np.ndarray,
    origin: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    w: np.ndarray,
    topo: np.ndarray,
    out_ptr: np.ndarray,
    out_order: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    in_ptr, in_order = _csr(n, dst)
    est = np.empty(n)
    pred = np.full(n, -1, dtype=np.int64)
    for v in topo:
        best = release[v]
        arg = -1
        for j in range(in_ptr[v], in_ptr[v + 1]):
            e = in_order[j]
            t = est[src[e]] + dur[src[e]] + w[e]
            if t > best + 1e-9:  # ties (to rounding) go to the release, then to the first edge
                best = t
                arg = e
        if best == -np.inf:
            best = 0.0
        est[v] = best
        pred[v] = arg
    eft = est + dur
    makespan = (eft - origin).max() if n else 0.0
    lft = np.empty(n)
    for i in range(len(topo) - 1, -1, -1):
        v = topo[i]
        best = makespan + origin[v]
        for j in range(out_ptr[v], out_ptr[v + 1]):
            e = out_order[j]
            t = lft[dst[e]] - dur[dst[e]] - w[e]
            if t < best:
                best = t
        lft[v] = best
    return est, eft, lft, pred, makespan


NEAR_TIE_SHARE = 0.01  # of the step: a device op whose stream was ready this close to its binding release
NEAR_TIE_US = 50.0  # µs: ... or this close (the larger) is traced back along its stream


def _stream_order_edges(
    g: ExecutionGraph, src: np.ndarray, dst: np.ndarray, w: np.ndarray, est: np.ndarray, dur: np.ndarray, makespan: float
) -> dict[int, int]:
    """Device ops whose binding in-edge comes from another stream (a stream wait) while the op
    before them on their own stream ended within a near tie of it: node -> that program-order
    edge. The path is traced back along the stream there, so that a device-bound step's path runs
    along its device, not across streams wherever one dependency ended a few µs after another (the
    times, the slack and the makespan are unchanged: only which of two nearly equal chains is
    shown). The gap it leaves is explained by segments.explain."""
    from bottleneck_oracle.graph_pipeline.schema import EdgeKind

    n = g.nodes
    gpu = n["on_gpu"]
    kind = g.edges["kind"]
    arrive = est[src] + dur[src] + w
    tie = max(NEAR_TIE_US, NEAR_TIE_SHARE * makespan)
    cand = np.flatnonzero((kind == EdgeKind.PROGRAM_ORDER) & gpu[src] & gpu[dst] & (arrive >= est[dst] - tie))
    return dict(zip(dst[cand].tolist(), cand.tolist()))


def origins(g: ExecutionGraph) -> np.ndarray:
    """Per node, where its rank's step time starts (µs from the window start: ExecutionGraph.rank_origin,
    the step start, or the end of the device work queued before it); for barriers, which span
    ranks, the latest of them (they end no rank's step)."""
    rank = g.nodes["rank"]
    ranks = np.unique(rank[rank >= 0])
    starts = np.array([g.rank_origin(int(r)) for r in ranks])
    out = np.full(g.n_nodes, starts.max() if len(starts) else 0.0)
    if len(ranks):
        pos = np.searchsorted(ranks, rank)
        ok = rank >= 0
        out[ok] = starts[pos[ok]]
    return out


def topological_order(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Node ids in a topological order; GraphError naming nodes if there is a cycle."""
    topo, _, _ = _topo(n, src.astype(np.int64), dst.astype(np.int64))
    if len(topo) != n:
        raise GraphError(f"dependency cycle among {n - len(topo)} nodes")
    return topo


def run_cpm(
    g: ExecutionGraph, dur: np.ndarray | None = None, weight: np.ndarray | None = None, release: np.ndarray | None = None
) -> CPMResult:
    """CPM on ``g`` with its modelled durations, edge latencies and releases, or with ``dur`` /
    ``weight`` / ``release`` (what-if edits)."""
    n = g.n_nodes
    d = (g.nodes["mdur"] if dur is None else dur).astype(np.float64)
    src = g.edges["src"].astype(np.int64)
    dst = g.edges["dst"].astype(np.int64)
    w = (g.edges["weight"] if weight is None else weight).astype(np.float64)
    topo, out_ptr, out_order = _topo(n, src, dst)
    if len(topo) != n:
        seen = np.zeros(n, dtype=bool)
        seen[topo] = True
        stuck = np.flatnonzero(~seen)[:5]
        desc = "; ".join(f"{g.node_name(i)[:60]!r} rank {g.nodes['rank'][i]} at {g.nodes['start'][i]:.1f} µs" for i in stuck)
        raise GraphError(f"dependency cycle while building the graph of step {g.step}: {n - len(topo)} nodes involved, e.g. {desc}")
    origin = origins(g)
    est, eft, lft, pred, makespan = _passes(
        n, d, (g.release if release is None else release).astype(np.float64), origin, src, dst, w, topo, out_ptr, out_order
    )
    lst = lft - d
    slack = np.maximum(lst - est, 0.0)
    path_nodes = []
    path_edges = []
    path_origin = 0.0
    if n:
        v = int(np.argmax(eft - origin))
        path_origin = float(origin[v])
        on_stream = _stream_order_edges(g, src, dst, w, est, d, makespan)
        while v >= 0:
            path_nodes.append(v)
            e = int(pred[v])
            if e < 0:
                break
            if v in on_stream and g.nodes["on_gpu"][src[e]]:  # a stream wait binds, the stream was ready nearly as early
                e = on_stream[v]
            path_edges.append(e)
            v = int(src[e])
    return CPMResult(
        est=est,
        eft=eft,
        lst=lst,
        lft=lft,
        slack=slack,
        makespan=float(makespan),
        path=np.array(path_nodes[::-1], dtype=np.int64),
        path_edges=np.array(path_edges[::-1], dtype=np.int64),
        pred=pred,
        window=float(eft.max()) if n else 0.0,
        path_origin=path_origin,
    )


@numba.njit(cache=True)
def _forward_makespan(
    n: int,
    dur: np.ndarray,
    release: np.ndarray,
    origin: np.ndarray,
    src: np.ndarray,
    w: np.ndarray,
    topo: np.ndarray,
    in_ptr: np.ndarray,
    in_order: np.ndarray,
) -> float:
    """The makespan of _passes' forward pass alone (the same loop: the same floats)."""
    est = np.empty(n)
    for v in topo:
        best = release[v]
        for j in range(in_ptr[v], in_ptr[v + 1]):
            e = in_order[j]
            t = est[src[e]] + dur[src[e]] + w[e]
            if t > best + 1e-9:
                best = t
        if best == -np.inf:
            best = 0.0
        est[v] = best
    eft = est + dur
    return (eft - origin).max() if n else 0.0


# id(graph) -> (graph, its edge columns, (sources, topological order, in-edge index, origins)) of the last
# few graphs replayed: a cache, checked against the graph and its edge arrays on every hit
_STRUCTURE: dict[int, tuple[ExecutionGraph, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, ...]]] = {}


def _structure(g: ExecutionGraph) -> tuple[np.ndarray, ...]:
    """(sources, topological order, in-edge index, in-edge order, origins) of ``g``, computed once
    for the last few graphs replayed (blame and the run answer replay one step many times). The
    order is shorter than the graph where it has a cycle."""
    hit = _STRUCTURE.get(id(g))
    if hit is None or hit[0] is not g or hit[1][0] is not g.edges["src"] or hit[1][1] is not g.edges["dst"]:
        n = g.n_nodes
        src = g.edges["src"].astype(np.int64)
        dst = g.edges["dst"].astype(np.int64)
        topo, _, _ = _topo(n, src, dst)
        in_ptr, in_order = _csr(n, dst)
        if len(_STRUCTURE) >= 8:  # the last few graphs replayed
            _STRUCTURE.pop(next(iter(_STRUCTURE)))
        hit = _STRUCTURE[id(g)] = (g, (g.edges["src"], g.edges["dst"]), (src, topo, in_ptr, in_order, origins(g)))
    return hit[2]


def makespan_of(
    g: ExecutionGraph, dur: np.ndarray | None = None, weight: np.ndarray | None = None, release: np.ndarray | None = None
) -> float:
    """``run_cpm(g, dur, weight, release).makespan``, from the forward pass alone and the graph's
    order and edge index computed once (_structure)."""
    src, topo, in_ptr, in_order, origin = _structure(g)
    if len(topo) != g.n_nodes:
        return run_cpm(g, dur, weight, release).makespan  # (raises, naming the cycle)
    d = (g.nodes["mdur"] if dur is None else dur).astype(np.float64)
    w = (g.edges["weight"] if weight is None else weight).astype(np.float64)
    rel = (g.release if release is None else release).astype(np.float64)
    return float(_forward_makespan(g.n_nodes, d, rel, origin, src, w, topo, in_ptr, in_order))


@numba.njit(cache=True)
def _edited_makespans(
    dur: np.ndarray,
    release: np.ndarray,
    origin: np.ndarray,
    src: np.ndarray,
    w: np.ndarray,
    topo: np.ndarray,
    in_ptr: np.ndarray,
    in_order: np.ndarray,
    vs: np.ndarray,
    new_dur: np.ndarray,
) -> np.ndarray:
    """Makespan after each single edit dur[vs[k]] = new_dur[k] (forward passes only)."""
    n = len(dur)
    out = np.empty(len(vs))
    est = np.empty(n)
    for k in range(len(vs)):
        v = vs[k]
        old = dur[v]
        dur[v] = new_dur[k]
        best_all = -np.inf
        for t in topo:
            best = release[t]
            for j in range(in_ptr[t], in_ptr[t + 1]):
                e = in_order[j]
                c = est[src[e]] + dur[src[e]] + w[e]
                if c > best:
                    best = c
            if best == -np.inf:
                best = 0.0
            est[t] = best
            if best + dur[t] - origin[t] > best_all:
                best_all = best + dur[t] - origin[t]
        out[k] = best_all if n else 0.0
        dur[v] = old
    return out


def makespans_after(g: ExecutionGraph, ids: np.ndarray, new_dur: np.ndarray) -> np.ndarray:
    """Exact makespan after each single-node duration change ``ids[k]`` -> ``new_dur[k]`` µs:
    one compiled forward pass per edit, sharing the topological order and in-edge index."""
    src, topo, in_ptr, in_order, origin = _structure(g)
    return _edited_makespans(
        g.nodes["mdur"].astype(np.float64).copy(),
        g.release.astype(np.float64),
        origin,
        src,
        g.edges["weight"].astype(np.float64),
        topo,
        in_ptr,
        in_order,
        np.asarray(ids, dtype=np.int64),
        np.asarray(new_dur, dtype=np.float64),
    )

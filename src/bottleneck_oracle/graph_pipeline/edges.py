"""The edge rules, each a function from a Window to (src, dst) node pairs.

Every rule is documented in README.md ("Edge rules") and tested on a small real trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bottleneck_oracle.graph_pipeline.events import SYNC_KINDS, EvClass, EventTable
from bottleneck_oracle.graph_pipeline.schema import EdgeKind
from bottleneck_oracle.graph_pipeline.window import Window

CONTEXT_SYNC, STREAM_SYNC, EVENT_SYNC, STREAM_WAIT_EVENT = range(len(SYNC_KINDS))


@dataclass(slots=True)
class EdgeSet:
    src: list[np.ndarray] = field(default_factory=list)
    dst: list[np.ndarray] = field(default_factory=list)
    kind: list[np.ndarray] = field(default_factory=list)
    waits: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # edges a blocking op waits on

    def add(self, src, dst, kind: EdgeKind, wait: bool = False) -> None:
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        ok = (src >= 0) & (dst >= 0) & (src != dst)
        src, dst = src[ok], dst[ok]
        self.src.append(src)
        self.dst.append(dst)
        self.kind.append(np.full(len(src), int(kind), dtype=np.int8))
        if wait:
            self.waits.append((src, dst))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, kind, is_wait), one edge per (src, dst): the first rule that produced it."""
        if not self.src:
            e = np.zeros(0, np.int64)
            return e, e, np.zeros(0, np.int8), np.zeros(0, bool)
        src, dst, kind = np.concatenate(self.src), np.concatenate(self.dst), np.concatenate(self.kind)
        order = np.lexsort((kind, dst, src))
        src, dst, kind = src[order], dst[order], kind[order]
        first = np.ones(len(src), dtype=bool)
        first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
        src, dst, kind = src[first], dst[first], kind[first]
        is_wait = np.zeros(len(src), dtype=bool)
        if self.waits and len(src):
            n = int(max(src.max(), dst.max())) + 1
            ws = np.concatenate([a for a, _ in self.waits])
            wd = np.concatenate([b for _, b in self.waits])
            is_wait = np.isin(src * n + dst, ws * n + wd)
        return src, dst, kind, is_wait


def program_order(w: Window, E: EdgeSet) -> None:
    """Consecutive leaves on a CPU thread; consecutive ops on a GPU stream."""
    same = np.flatnonzero(w.leaf_thread[1:] == w.leaf_thread[:-1])
    E.add(same, same + 1, EdgeKind.PROGRAM_ORDER)
    gsame = np.flatnonzero(w.gpu_stream[1:] == w.gpu_stream[:-1])
    E.add(w.n_leaf + gsame, w.n_leaf + gsame + 1, EdgeKind.PROGRAM_ORDER)


def launches(w: Window, E: EdgeSet) -> None:
    """Runtime call -> the GPU op with its correlation id on the same rank (flows are incomplete)."""
    c = w.c
    corr = c["correlation"]
    rt = np.flatnonzero((c["cls"] == EvClass.RUNTIME) & (corr >= 0))
    if not len(rt) or not len(w.gpu_rows):
        return
    key = c["rank"][rt].astype(np.int64) * (1 << 40) + corr[rt]
    order = np.argsort(key, kind="stable")
    rt, key = rt[order], key[order]
    gkey = c["rank"][w.gpu_rows].astype(np.int64) * (1 << 40) + corr[w.gpu_rows]
    pos = np.minimum(np.searchsorted(key, gkey), len(rt) - 1)
    hit = (corr[w.gpu_rows] >= 0) & (key[pos] == gkey)
    E.add(w.out_node(rt[pos[hit]]), w.n_leaf + np.flatnonzero(hit), EdgeKind.LAUNCH)


def forward_backward(table: EventTable, w: Window, E: EdgeSet) -> None:
    """fwdbwd flows: the forward op (its last leaf) -> the backward op (its first leaf).

    A flow endpoint binds to the outermost CPU event starting at the flow's timestamp on
    its thread; a flow that would run back in time is dropped."""
    fl = table.flows
    if not len(fl["ts"]) or not w.n_leaf:
        return
    c = w.c
    cpu = w.cpu_rows
    thread_of: dict[tuple[int, int, int], int] = {}
    for k, r, p, t in zip(w.ev_thread[cpu].tolist(), c["rank"][cpu].tolist(), c["pid"][cpu].tolist(), c["tid"][cpu].tolist()):
        thread_of.setdefault((r, p, t), k)
    fthread = np.array([thread_of.get(key, -1) for key in zip(fl["rank"].tolist(), fl["pid"].tolist(), fl["tid"].tolist())], dtype=np.int64)
    fts = fl["ts"] - w.w0
    order = np.lexsort((-c["dur"][cpu], w.ts[cpu], w.ev_thread[cpu]))
    srt = cpu[order]
    span = float(w.end.max()) + 2.0
    keys = w.ev_thread[srt] * span + w.ts[srt]
    fkey = fthread * span + fts
    pos = np.minimum(np.searchsorted(keys, fkey - 1e-3), len(keys) - 1)
    ok = (fthread >= 0) & (np.abs(keys[pos] - fkey) <= 1e-3)
    ev = np.where(ok, srt[pos], -1)
    starts: dict[tuple[int, int], int] = {}
    ends: dict[tuple[int, int], int] = {}
    for r, i, is_start, e in zip(fl["rank"].tolist(), fl["id"].tolist(), fl["is_start"].tolist(), ev.tolist()):
        if e >= 0:
            (starts if is_start else ends)[(r, i)] = e
    pairs = np.array([(starts[k], ends[k]) for k in starts if k in ends], dtype=np.int64).reshape(-1, 2)
    forward = w.ts[pairs[:, 1]] >= w.ts[pairs[:, 0]]
    E.add(w.out_node(pairs[forward, 0]), w.in_node(pairs[forward, 1]), EdgeKind.FWD_BWD)


class _LaunchOrder:
    """GPU ops of one rank (or one stream) in launch order, with a running latest-end index."""

    def __init__(self, w: Window, mask: np.ndarray) -> None:
        corr = w.c["correlation"][w.gpu_rows]
        idx = np.flatnonzero(mask & (corr >= 0))
        self.idx = idx[np.argsort(corr[idx], kind="stable")]
        self.corr = corr[self.idx]
        end = w.end[w.gpu_rows[self.idx]]
        running = np.maximum.accumulate(end) if len(end) else end
        at_max = np.where(end >= running, np.arange(len(end)), 0)
        self.latest = np.maximum.accumulate(at_max) if len(end) else at_max

    def before(self, corr: int, latest_end: bool) -> int:
        """GPU op (index into gpu_rows) launched last before ``corr``, or the one of those that ends last."""
        p = int(np.searchsorted(self.corr, corr)) - 1
        if p < 0:
            return -1
        return int(self.idx[self.latest[p]] if latest_end else self.idx[p])

    def after(self, corr: int) -> int:
        p = int(np.searchsorted(self.corr, corr, side="right"))
        return int(self.idx[p]) if p < len(self.idx) else -1


def cuda_syncs(w: Window, E: EdgeSet, blocking_calls: tuple[str, ...]) -> None:
    """A blocking sync call waits for the GPU ops launched before it:
    context sync -> the latest-ending op of the device, stream sync -> of the stream,
    cudaEventSynchronize -> the last op before the event record. cudaStreamWaitEvent
    orders two streams: the op before the record -> the next op on the waiting stream.
    Traces without cuda_sync events: cudaDeviceSynchronize / cudaStreamSynchronize calls
    wait for the latest-ending op of the device."""
    c = w.c
    cls, corr, rank, name = c["cls"], c["correlation"], c["rank"], c["name"]
    grank = rank[w.gpu_rows]
    gstream = c["tid"][w.gpu_rows]
    orders: dict[tuple, _LaunchOrder] = {}

    def lo(r: int, stream: int | None = None) -> _LaunchOrder:
        key = (r, stream)
        if key not in orders:
            mask = grank == r if stream is None else (grank == r) & (gstream == stream)
            orders[key] = _LaunchOrder(w, mask)
        return orders[key]

    rt = np.flatnonzero((cls == EvClass.RUNTIME) & (corr >= 0))
    caller_of = dict(zip(zip(rank[rt].tolist(), corr[rt].tolist()), rt.tolist()))
    waits_src, waits_dst, order_src, order_dst = [], [], [], []
    syncs = np.flatnonzero(cls == EvClass.GPU_SYNC)
    for s in syncs.tolist():
        kind, r = int(c["sync_kind"][s]), int(rank[s])
        caller = caller_of.get((r, int(corr[s])), -1)
        node = int(w.ev2node[caller]) if caller >= 0 else -1
        g = -1
        if kind == CONTEXT_SYNC and node >= 0:
            g = lo(r).before(int(corr[s]), latest_end=True)
        elif kind == STREAM_SYNC and node >= 0:
            g = lo(r, int(c["stream"][s])).before(int(corr[s]), latest_end=True)
        elif kind == EVENT_SYNC and node >= 0 and "Synchronize" in w.names[name[caller]]:
            if c["wait_stream"][s] >= 0 and c["wait_event_corr"][s] >= 0:
                g = lo(r, int(c["wait_stream"][s])).before(int(c["wait_event_corr"][s]), latest_end=False)
        elif kind == STREAM_WAIT_EVENT:
            st, ws, rec = int(c["stream"][s]), int(c["wait_stream"][s]), int(c["wait_event_corr"][s])
            if ws >= 0 and rec >= 0 and ws != st:
                a, b = lo(r, ws).before(rec, latest_end=False), lo(r, st).after(int(corr[s]))
                if a >= 0 and b >= 0:
                    order_src.append(w.n_leaf + a)
                    order_dst.append(w.n_leaf + b)
            continue
        if g >= 0:
            waits_src.append(w.n_leaf + g)
            waits_dst.append(node)
    with_sync = np.unique(rank[syncs])
    blocking_names = [i for i, n in enumerate(w.names) if n in blocking_calls]
    calls = np.flatnonzero((cls == EvClass.RUNTIME) & np.isin(name, blocking_names) & ~np.isin(rank, with_sync) & (corr >= 0))
    for call in calls.tolist():
        g = lo(int(rank[call])).before(int(corr[call]), latest_end=True)
        if g >= 0 and w.ev2node[call] >= 0:
            waits_src.append(w.n_leaf + g)
            waits_dst.append(int(w.ev2node[call]))
    E.add(waits_src, waits_dst, EdgeKind.SYNC, wait=True)
    E.add(order_src, order_dst, EdgeKind.SYNC)


def backends(w: Window, E: EdgeSet, node_end: np.ndarray, resume_us: float) -> None:
    """gloo: the k-th c10d call of one kind and size on a rank enqueued the k-th backend op of
    them (the backend op's 'Record function id' is not filled in by every version).
    Completion -> the op the calling thread resumes with, if that thread was idle when the
    collective completed and resumed within ``resume_us`` after it (it was waiting)."""
    c = w.c
    name, rank = c["name"], c["rank"]
    net = np.flatnonzero(w.is_net & w.name_gloo[name[w.node_rows]])
    if not len(net):
        return
    calls = np.flatnonzero(w.name_c10d[name] & (w.name_coll[name] >= 0) & (w.ev_thread >= 0))
    size = np.where(np.isnan(c["msg_nelems"]), -1, c["msg_nelems"]).astype(np.int64)

    def sequences(ev: np.ndarray) -> dict[tuple, list[int]]:
        out: dict[tuple, list[int]] = {}
        for e in ev[np.argsort(w.ts[ev], kind="stable")].tolist():
            out.setdefault((int(rank[e]), int(w.name_coll[name[e]]), int(size[e])), []).append(e)
        return out

    issued = sequences(calls)
    call_ev, work_node = [], []
    node_of_row = dict(zip(w.node_rows[net].tolist(), net.tolist()))
    for key, works in sequences(w.node_rows[net]).items():
        for call, work in zip(issued.get(key, []), works):
            if w.ts[call] <= w.ts[work] + 1e-6:
                call_ev.append(call)
                work_node.append(node_of_row[work])
    if not call_ev:
        return
    call_ev_a = np.array(call_ev, dtype=np.int64)
    E.add(w.out_node(call_ev_a), work_node, EdgeKind.BACKEND)

    leaf_ts = w.ts[w.leaf_rows]
    leaf_end = w.end[w.leaf_rows]
    feed_src, feed_dst = [], []
    for call, work in zip(call_ev, work_node):
        t, done = w.ev_thread[call], node_end[work]
        lo = int(np.searchsorted(w.leaf_thread, t, side="left"))
        hi = int(np.searchsorted(w.leaf_thread, t, side="right"))
        p = lo + int(np.searchsorted(leaf_ts[lo:hi], done, side="left"))
        if p >= hi or p == lo:
            continue
        resume = leaf_ts[p] - done
        idle = leaf_ts[p] - leaf_end[p - 1]
        if leaf_end[p - 1] < done and resume <= resume_us and idle > 2 * resume:
            feed_src.append(work)
            feed_dst.append(p)
    E.add(feed_src, feed_dst, EdgeKind.FEEDS)

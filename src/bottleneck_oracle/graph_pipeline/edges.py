"""The edge rules, each a function from a Window to (src, dst) node pairs.

Every rule is documented in README.md ("Edge rules") and tested on a small real trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from bottleneck_oracle.graph_pipeline.arrays import in_read_order, isin_small, span_positions
from bottleneck_oracle.graph_pipeline.events import SYNC_KINDS, EvClass, EventTable
from bottleneck_oracle.graph_pipeline.schema import CollectiveKind, EdgeKind
from bottleneck_oracle.graph_pipeline.window import P2P_KINDS, UNEVEN_KINDS, Window

CONTEXT_SYNC, STREAM_SYNC, EVENT_SYNC, STREAM_WAIT_EVENT = range(len(SYNC_KINDS))


_NONE = np.zeros(0, np.int64)  # an emptied list entry (EdgeSet.arrays with release)


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

    def clear(self) -> None:
        """Forget the edges (their ``arrays`` taken: the lists are as large again)."""
        self.src, self.dst, self.kind, self.waits = [], [], [], []

    def lanes_joined(self, lane: np.ndarray) -> np.ndarray:
        """The distinct pairs of different lanes (``lane[node]``) some edge joins, each as
        ``a * n_lanes + b`` for an edge from lane a to lane b; without the sorted copy of every edge
        that ``arrays`` makes."""
        n = int(lane.max()) + 1 if len(lane) else 1
        found = []
        for s, d in zip(self.src, self.dst):
            a, b = lane[s], lane[d]
            cross = a != b
            found.append(np.unique(a[cross].astype(np.int64) * n + b[cross]))
        return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)

    def arrays(self, release: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, kind, is_wait), one edge per (src, dst), sorted by (src, dst): the rule of the
        lowest kind that produced it. ``release``: the lists are emptied as they are read (a large
        step's edges are hundreds of MB; the sort needs one key per edge, not the lists beside it)."""
        if not self.src:
            e = np.zeros(0, np.int64)
            return e, e, np.zeros(0, np.int8), np.zeros(0, bool)
        n = max(int(a.max()) for a in (*self.src, *self.dst) if len(a)) + 1 if any(len(a) for a in self.src) else 1
        total = sum(len(a) for a in self.src)
        key = np.empty(total, dtype=np.int64)  # src * n + dst: one sort key per edge
        kind = np.empty(total, dtype=np.int8)
        at = 0
        for i in range(len(self.src)):
            s, d, k = self.src[i], self.dst[i], self.kind[i]
            np.multiply(s, n, out=key[at : at + len(s)])
            key[at : at + len(s)] += d
            kind[at : at + len(s)] = k
            at += len(s)
            if release:
                self.src[i] = self.dst[i] = self.kind[i] = _NONE
        order = np.lexsort((kind, key))
        key, kind = key[order], kind[order]
        del order
        first = np.ones(len(key), dtype=bool)
        first[1:] = key[1:] != key[:-1]
        key, kind = key[first], kind[first]
        del first
        is_wait = np.zeros(len(key), dtype=bool)
        wk = np.unique(np.concatenate([a * n + b for a, b in self.waits])) if self.waits else _NONE
        if len(wk) and len(key):
            is_wait = wk[np.minimum(np.searchsorted(wk, key), len(wk) - 1)] == key
        src, dst = np.divmod(key, n)
        if release:
            self.clear()
        return src, dst, kind, is_wait


def program_order(w: Window, E: EdgeSet) -> None:
    """Consecutive leaves on a CPU thread; consecutive ops on a GPU stream; consecutive backend
    ops of a thread that do not overlap."""
    same = np.flatnonzero(w.leaf_thread[1:] == w.leaf_thread[:-1])
    E.add(same, same + 1, EdgeKind.PROGRAM_ORDER)
    gsame = np.flatnonzero(w.gpu_stream[1:] == w.gpu_stream[:-1])
    E.add(w.n_leaf + gsame, w.n_leaf + gsame + 1, EdgeKind.PROGRAM_ORDER)
    # backend ops on one thread run one after the other unless their spans overlap (async work)
    b = w.n_leaf + len(w.gpu_rows)
    rows = w.backend_rows
    serial = np.flatnonzero((w.backend_lane[1:] == w.backend_lane[:-1]) & (w.ts[rows[1:]] >= w.end[rows[:-1]] - 1e-6))
    E.add(b + serial, b + serial + 1, EdgeKind.PROGRAM_ORDER)
    # a backend op that stages its tensor on its own thread (window._stage_exchanges) sits in
    # that thread's program between the ops before and after its exchange
    before = np.flatnonzero(w.staged_prev >= 0)
    E.add(w.staged_prev[before], b + before, EdgeKind.PROGRAM_ORDER)
    after = np.flatnonzero(w.staged_next >= 0)
    E.add(b + after, w.staged_next[after], EdgeKind.PROGRAM_ORDER)


def launches(w: Window, E: EdgeSet) -> tuple[np.ndarray, int]:
    """Runtime call -> the GPU op with its correlation id on the same rank (flows are incomplete).
    Returns the launching event of each GPU op (index into gpu_rows order; -1: not launched in the
    window), and how many ops a blocking call launched as its thread's first op in the window
    (released by nothing before it: no launch edge, their call's wait on them instead)."""
    c = w.c
    corr = c["correlation"]
    launcher = np.full(len(w.gpu_rows), -1, dtype=np.int64)
    rt = np.flatnonzero((c["cls"] == EvClass.RUNTIME) & (corr >= 0))
    if not len(rt) or not len(w.gpu_rows):
        return launcher, 0
    key = c["rank"][rt].astype(np.int64) * (1 << 40) + corr[rt]
    order = np.argsort(key, kind="stable")
    rt, key = rt[order], key[order]
    gkey = c["rank"][w.gpu_rows].astype(np.int64) * (1 << 40) + corr[w.gpu_rows]
    pos = np.minimum(np.searchsorted(key, gkey), len(rt) - 1)
    hit = (corr[w.gpu_rows] >= 0) & (key[pos] == gkey)
    launcher[hit] = rt[pos[hit]]
    src = w.out_node(rt[pos[hit]])
    # a blocking copy's call enqueues its copy when it starts and returns when the copy is done
    # (blocking_copies): the copy is released by what ran before the call, not by the call itself
    waits_on_it = w.copy_op[rt[pos[hit]]] == w.gpu_rows[np.flatnonzero(hit)]
    if waits_on_it.any():
        leaf = src[waits_on_it]
        prev = np.where((leaf > 0) & (w.leaf_thread[np.maximum(leaf - 1, 0)] == w.leaf_thread[np.maximum(leaf, 0)]), leaf - 1, -1)
        src = src.copy()
        src[waits_on_it] = np.where(leaf >= 0, prev, -1)
    E.add(src, w.n_leaf + np.flatnonzero(hit), EdgeKind.LAUNCH)
    return launcher, int((waits_on_it & (src < 0)).sum())


def blocking_copies(w: Window, E: EdgeSet) -> None:
    """A copy or set call that returned only after its device op ended (window._blocking_copies:
    a copy into pageable host memory, ``cudaMemcpy``, ``hipMemcpyWithStream``) waited for that
    op, and through it for everything queued before it on its stream: op -> call (a wait). A
    launch that waited for room in a full device queue (EventTable.queue_waits) waited for the op
    whose end made room: op -> call (a wait), where that op is in the window."""
    calls = np.flatnonzero(w.copy_op >= 0)
    if len(calls):
        E.add(w.ev2node[w.copy_op[calls]], w.ev2node[calls], EdgeKind.SYNC, wait=True)
    calls = np.flatnonzero(w.slot_op >= 0)
    if len(calls):
        E.add(w.ev2node[w.slot_op[calls]], w.ev2node[calls], EdgeKind.SYNC, wait=True)


def forward_backward(table: EventTable, w: Window, E: EdgeSet) -> None:
    """fwdbwd flows: the forward op (its last leaf) -> the backward op (its first leaf).

    A flow endpoint binds to the outermost CPU event starting at the flow's timestamp on
    its thread; a flow that would run back in time is dropped."""
    fl = table.flows
    if not len(fl["ts"]) or not w.n_leaf:
        return
    c = w.c
    f = _flows_near(table, w) if w.steps else in_read_order(np.arange(len(fl["ts"])), table.flow_layout)
    fts = fl["ts"][f] - w.w0
    keep = (fts >= 0) & (fts <= w.end.max())
    if w.steps:  # (a window over several steps: from the first one's start to the last one's end)
        lo: dict[int, float] = {}
        hi: dict[int, float] = {}
        for s in w.steps:
            lo[s.rank] = min(lo.get(s.rank, np.inf), s.start - w.w0)
            hi[s.rank] = max(hi.get(s.rank, -np.inf), s.end - w.w0)
        ranks = np.array(sorted(lo))
        keep &= np.isin(fl["rank"][f], ranks)
        pos = np.searchsorted(ranks, fl["rank"][f]).clip(0, len(ranks) - 1)
        keep &= (fts >= np.array([lo[r] for r in ranks])[pos]) & (fts < np.array([hi[r] for r in ranks])[pos])
    f, fts = f[keep], fts[keep]
    if not len(f):
        return
    # the window's thread id of each flow endpoint (-1: a thread with no CPU op in the window)
    srt = w.cpu_sorted
    first = np.ones(len(srt), dtype=bool)
    first[1:] = w.ev_thread[srt][1:] != w.ev_thread[srt][:-1]
    heads = srt[first]
    thread_of = {
        (r, p, t): k
        for r, p, t, k in zip(c["rank"][heads].tolist(), c["pid"][heads].tolist(), c["tid"][heads].tolist(), w.ev_thread[heads].tolist())
    }
    ends = zip(fl["rank"][f].tolist(), fl["pid"][f].tolist(), fl["tid"][f].tolist())
    fl_th = np.array([thread_of.get(x, -1) for x in ends], dtype=np.int64).reshape(-1)
    span = float(w.end.max()) + 2.0
    keys = w.ev_thread[srt] * span + w.ts[srt]
    fkey = np.where(fl_th >= 0, fl_th * span + fts, -1.0)
    pos = np.minimum(np.searchsorted(keys, fkey - 1e-3), len(keys) - 1)
    ok = (fl_th >= 0) & (np.abs(keys[pos] - fkey) <= 1e-3)
    ev = np.where(ok, srt[pos], -1)
    # pair the start and end of each flow id (per rank)
    rank, fid, is_start = fl["rank"][f], fl["id"][f], fl["is_start"][f]
    o = np.lexsort((~is_start, fid, rank))  # per (rank, id): start first
    rank, fid, is_start, ev = rank[o], fid[o], is_start[o], ev[o]
    pair = (rank[:-1] == rank[1:]) & (fid[:-1] == fid[1:]) & is_start[:-1] & ~is_start[1:]
    a, b = ev[:-1][pair], ev[1:][pair]
    good = (a >= 0) & (b >= 0)
    a, b = a[good], b[good]
    forward = w.ts[b] >= w.ts[a]
    E.add(w.out_node(a[forward]), w.in_node(b[forward]), EdgeKind.FWD_BWD)


FLOW_SLACK_US = 1.0  # µs either side of a step's span in which its flow endpoints are looked for (the rule then keeps those inside)


def _flow_spans_of(rank_s: np.ndarray, ts_s: np.ndarray, spans: list[tuple[int, float, float]]) -> list[tuple[int, int]]:
    """Positions in the flows sorted by (rank, ts) of each (rank, start, end) span's endpoints,
    FLOW_SLACK_US either side."""
    wide = [(r, start - FLOW_SLACK_US, end + FLOW_SLACK_US) for r, start, end in spans]
    return span_positions(rank_s, ts_s, wide, end_side="right")


def _flows_near(table: EventTable, w: Window) -> np.ndarray:
    """The flow endpoints of the window's ranks near their steps' spans (_flow_spans_of), in the
    order read (ascending, unless ``share`` laid them out step by step): a superset of those
    forward_backward keeps, found in the flows sorted by (rank, ts) once per table instead of a
    pass over every flow of the trace per step."""
    order, rank_s, ts_s = flow_index(table)
    merged: dict[int, tuple[float, float]] = {}
    for s in w.steps:
        lo, hi = merged.get(s.rank, (np.inf, -np.inf))
        merged[s.rank] = (min(lo, s.start), max(hi, s.end))
    spans = [(r, lo, hi) for r, (lo, hi) in merged.items()]
    known = table.lookups.get("flow_spans")
    if known is not None and known[0] is order and all(x in known[1] for x in spans):  # one step's spans (share)
        parts = [known[2][a:b] for a, b in (known[1][x] for x in spans)]
    else:
        parts = [order[a:b] for a, b in _flow_spans_of(rank_s, ts_s, spans)]
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return in_read_order(np.concatenate(parts), table.flow_layout)  # (ranks apart: no duplicates)


def lay_out_flows(table: EventTable) -> None:
    """The flow endpoints laid out step by step (by the spans ``_flows_near`` looks in; an
    endpoint near two steps goes with the first), their places as read kept in
    ``table.flow_layout``: a step's rule then reads its own part of them (``EventTable.share``)."""
    fl = table.flows
    if not len(fl["ts"]) or not table.steps:
        return
    numbers = {n: i for i, n in enumerate(sorted({s.number for s in table.steps}))}
    block = np.full(len(fl["ts"]), len(numbers), dtype=np.int32)
    order = np.lexsort((fl["ts"], fl["rank"]))
    found = _flow_spans_of(fl["rank"][order], fl["ts"][order], [(s.rank, s.start, s.end) for s in table.steps])
    for s, (a, b) in zip(table.steps, found):
        block[order[a:b]] = np.minimum(block[order[a:b]], numbers[s.number])
    perm = np.argsort(block, kind="stable")
    table.flows = {k: v[perm] for k, v in fl.items()}
    table.flow_layout = perm


def flow_spans(table: EventTable) -> None:
    """Each rank's step span's flow endpoints (``_flows_near`` of a one-step window), one after
    another step by step: a step worker reads its own part (``EventTable.share``)."""
    order, rank_s, ts_s = flow_index(table)
    steps = sorted(table.steps, key=lambda s: (s.number, s.rank))
    spans = [(s.rank, s.start, s.end) for s in steps]
    found = _flow_spans_of(rank_s, ts_s, spans)
    ends = np.cumsum([b - a for a, b in found], dtype=np.int64).tolist()
    at = dict(zip(spans, zip([0, *ends[:-1]], ends)))
    near = np.concatenate([order[a:b] for a, b in found]) if found else np.zeros(0, dtype=np.int64)
    table.lookups["flow_spans"] = (order, at, near)


def flow_index(table: EventTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The flow endpoints sorted by (rank, ts): (their rows, ranks, times), computed once per table."""
    fl = table.flows
    cached = table.lookups.get("flows")
    if cached is None or cached[0] is not fl["ts"]:
        order = np.lexsort((fl["ts"], fl["rank"]))
        cached = table.lookups["flows"] = (fl["ts"], order, fl["rank"][order], fl["ts"][order])
    return cached[1], cached[2], cached[3]


def data_dependencies(table: EventTable, w: Window, E: EdgeSet) -> None:
    """Execution-trace tensor dependencies (et.attach): the op that wrote a tensor (its last
    leaf) -> the op that reads it (its first leaf); dropped if it would run back in time."""
    deps = table.data_deps
    if not len(deps):
        return
    real = w.rows >= 0
    by_row = np.argsort(w.rows[real], kind="stable")  # (in table order: sorted unless share() moved the rows)
    rows = w.rows[real][by_row]
    idx = np.flatnonzero(real)[by_row]
    pos = np.searchsorted(rows, deps).clip(0, max(len(rows) - 1, 0))
    inside = (rows[pos] == deps).all(axis=1) if len(rows) else np.zeros(len(deps), bool)
    a, b = idx[pos[inside, 0]], idx[pos[inside, 1]]
    forward = w.end[a] <= w.ts[b] + 1e-3
    E.add(w.out_node(a[forward]), w.in_node(b[forward]), EdgeKind.DATA)


class _LaunchOrder:
    """GPU ops of one rank (or one stream) in launch order, with a running latest-end index."""

    def __init__(self, w: Window, members: np.ndarray, corr: np.ndarray) -> None:
        """``members``: positions in w.gpu_rows; ``corr``: the correlation id of every GPU op."""
        idx = members[corr[members] >= 0]
        self.idx = idx[np.argsort(corr[idx], kind="stable")]
        self.corr = corr[self.idx]
        self.end = end = w.end[w.gpu_rows[self.idx]]
        running = np.maximum.accumulate(end) if len(end) else end
        at_max = np.where(end >= running, np.arange(len(end)), 0)
        self.latest = np.maximum.accumulate(at_max) if len(end) else at_max

    def before(self, corr: int, latest_end: bool, limit: float = np.inf) -> int:
        """GPU op (index into gpu_rows) launched last before ``corr``, or the one of those that ends
        last, no later than ``limit`` µs (an op that ended after a waiter returned did not release it)."""
        p = int(np.searchsorted(self.corr, corr)) - 1
        if p < 0:
            return -1
        if not latest_end:
            return int(self.idx[p]) if self.end[p] <= limit else -1
        best = int(self.latest[p])
        if self.end[best] <= limit:
            return int(self.idx[best])
        ok = np.flatnonzero(self.end[: p + 1] <= limit)
        return int(self.idx[ok[np.argmax(self.end[ok])]]) if len(ok) else -1

    def after(self, corr: int) -> int:
        p = int(np.searchsorted(self.corr, corr, side="right"))
        return int(self.idx[p]) if p < len(self.idx) else -1


def _groups(keys: np.ndarray) -> dict[int, np.ndarray]:
    """Positions of each distinct key, ascending: one sort instead of one scan per key."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    cut = np.flatnonzero(np.diff(k)) + 1
    return {int(part[0]): idx for part, idx in zip(np.split(k, cut), np.split(order, cut))} if len(k) else {}


_DEVICE_WIDE = re.compile(r"(device|ctx|context)_?synchroni[sz]e", re.IGNORECASE)
"""A synchronize call that waits for every stream of its device (``cudaDeviceSynchronize``,
``hipDeviceSynchronize``, ``cuCtxSynchronize``), not one stream's or one event's."""


def cuda_syncs(w: Window, E: EdgeSet, blocking_calls: tuple[str, ...], tol: float, wake_us: float = 50.0) -> None:
    """A blocking sync call waits for the GPU ops launched before it:
    context sync -> the latest-ending op of the device (the record's device, where the rank drives
    several), stream sync -> of the stream, cudaEventSynchronize -> the last op before the event record. cudaStreamWaitEvent
    orders two streams: the op before the record -> the next op on the waiting stream.
    Traces without cuda_sync events: the blocking calls (any synchronize call of any vendor's
    runtime) wait for the latest-ending op of the device launched before them; a polling loop of
    event or stream queries (window._polling_loops) does so on every trace. A call with no
    correlation id (a runtime whose device ops carry none) waits for the device op that ended
    last while it waited, if it returned within ``wake_us`` µs of it. Causality: an op that ended
    more than ``tol`` µs after the call returned did not release it and is never its cause."""
    c = w.c
    cls, corr, rank, name = c["cls"], c["correlation"], c["rank"], c["name"]
    grank = rank[w.gpu_rows]
    gstream = c["tid"][w.gpu_rows]
    orders: dict[tuple, _LaunchOrder] = {}
    by_rank = _groups(grank)  # GPU ops of each rank, of each (rank, stream): found once, not per lookup
    by_stream = _groups(grank.astype(np.int64) * (1 << 32) + (gstream.astype(np.int64) & 0xFFFFFFFF))
    gdevice = c["pid"][w.gpu_rows]
    by_device = _groups(grank.astype(np.int64) * (1 << 32) + (gdevice.astype(np.int64) & 0xFFFFFFFF))
    several = {int(r) for r in np.unique(grank).tolist() if len(np.unique(gdevice[grank == r])) > 1}
    empty = np.zeros(0, dtype=np.int64)
    gcorr = corr[w.gpu_rows]

    def lo(r: int, stream: int | None = None, device: int | None = None) -> _LaunchOrder:
        """The rank's GPU ops in launch order: of one stream, or of one device (a context sync's:
        it waits for its own device, where the rank drives several), or all of them."""
        members = None
        if stream is not None:
            members = by_stream.get(r * (1 << 32) + (stream & 0xFFFFFFFF), empty)
        elif device is not None and r in several:
            members = by_device.get(r * (1 << 32) + (device & 0xFFFFFFFF))
        key = (r, stream, device if members is not None and stream is None else None)
        if key not in orders:
            orders[key] = _LaunchOrder(w, by_rank.get(r, empty) if members is None else members, gcorr)
        return orders[key]

    streams_of: dict[tuple[int, int | None], list[int]] = {}

    def every_stream(r: int, device: int | None, corr_id: int, limit: float) -> list[int]:
        """A device-wide synchronize's ops: the last launched before ``corr_id`` on each stream of
        the rank (of ``device`` where the rank drives several), each ending by ``limit``. Only the
        latest-ending one held the call in the recording; the others are its waits all the same,
        and bind once an edit ends that one earlier."""
        key = (r, device if r in several else None)
        if key not in streams_of:
            mine = grank == r if key[1] is None else (grank == r) & (gdevice == key[1])
            streams_of[key] = np.unique(gstream[mine]).tolist()
        got = (lo(r, st).before(corr_id, latest_end=False, limit=limit) for st in streams_of[key])
        return [x for x in got if x >= 0]

    rt = np.flatnonzero((cls == EvClass.RUNTIME) & (corr >= 0))
    syncs = np.flatnonzero(cls == EvClass.GPU_SYNC)
    # the runtime call of each sync record (same rank and correlation id; the last such call, as a
    # dict would keep it), found by one sort instead of a dict of every runtime call of the step
    rt_key = rank[rt].astype(np.int64) * (1 << 40) + corr[rt]
    by_key = np.argsort(rt_key, kind="stable")
    s_key = rank[syncs].astype(np.int64) * (1 << 40) + corr[syncs]
    at = np.searchsorted(rt_key[by_key], s_key, side="right") - 1
    found = (at >= 0) & (rt_key[by_key][np.maximum(at, 0)] == s_key) if len(rt) else np.zeros(len(syncs), dtype=bool)
    caller_of_sync = np.where(found, rt[by_key][np.maximum(at, 0)] if len(rt) else -1, -1)
    waits_src: list[int] = []
    waits_dst: list[int] = []
    order_src: list[int] = []
    order_dst: list[int] = []
    for s, caller in zip(syncs.tolist(), caller_of_sync.tolist()):
        kind, r = int(c["sync_kind"][s]), int(rank[s])
        node = int(w.ev2node[caller]) if caller >= 0 else -1
        g = -1
        limit = float(w.end[caller]) + tol if caller >= 0 else np.inf
        if kind == CONTEXT_SYNC and node >= 0:
            g = lo(r, device=int(c["pid"][s])).before(int(corr[s]), latest_end=True, limit=limit)
            others = [x for x in every_stream(r, int(c["pid"][s]), int(corr[s]), limit) if x != g] if g >= 0 else []
            waits_src.extend(w.n_leaf + x for x in others)
            waits_dst.extend(node for _ in others)
        elif kind == STREAM_SYNC and node >= 0:
            g = lo(r, int(c["stream"][s])).before(int(corr[s]), latest_end=True, limit=limit)
        elif kind == EVENT_SYNC and node >= 0 and "Synchronize" in w.names[name[caller]]:
            if c["wait_stream"][s] >= 0 and c["wait_event_corr"][s] >= 0:
                g = lo(r, int(c["wait_stream"][s])).before(int(c["wait_event_corr"][s]), latest_end=False, limit=limit)
        elif kind == STREAM_WAIT_EVENT:
            st, ws, rec = int(c["stream"][s]), int(c["wait_stream"][s]), int(c["wait_event_corr"][s])
            if ws >= 0 and rec >= 0 and ws != st:
                a, b = lo(r, ws).before(rec, latest_end=False), lo(r, st).after(int(corr[s]))
                if a >= 0 and b >= 0 and w.end[w.gpu_rows[a]] <= w.ts[w.gpu_rows[b]] + tol:
                    order_src.append(w.n_leaf + a)
                    order_dst.append(w.n_leaf + b)
            continue
        if g >= 0:
            waits_src.append(w.n_leaf + g)
            waits_dst.append(node)
    described = np.zeros(len(cls), dtype=bool)
    described[caller_of_sync[caller_of_sync >= 0]] = True
    blocking_names = w.codes_of(blocking_calls)
    # the blocking calls no sync record describes: synchronize calls whose record the trace lacks (a
    # rank without cuda_sync records, or a record lost: the profiler's buffer full, a runtime that
    # writes some), and polling loops of queries and implicit waits (a free as the device drained:
    # no record describes either) everywhere
    named = (cls == EvClass.RUNTIME) & (
        isin_small(name, blocking_names) | (w.blocking & (w.copy_op < 0) & (w.polls == 0) & ~w.queued & ~w.implicit)
    )
    calls = np.flatnonzero(((named & ~described) | (w.polls > 0) | w.implicit) & (w.ev2node >= 0))
    dev_by_end: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    device_wide = {int(k): bool(_DEVICE_WIDE.search(w.names[int(k)])) for k in np.unique(name[calls]).tolist()}
    for call in calls.tolist():
        limit = float(w.end[call]) + tol
        g = lo(int(rank[call])).before(int(corr[call]), latest_end=True, limit=limit) if corr[call] >= 0 else -1
        if g < 0:  # no correlation to order by (another vendor's runtime): the device op that ended
            # last while the call waited, if the call returned right after it
            r = int(rank[call])
            if r not in dev_by_end:
                mine = by_rank.get(r, empty)
                mine = mine[np.argsort(w.end[w.gpu_rows[mine]], kind="stable")]
                dev_by_end[r] = (mine, w.end[w.gpu_rows[mine]])
            mine, ends = dev_by_end[r]
            p = int(np.searchsorted(ends, limit, side="right")) - 1
            if p >= 0 and ends[p] >= w.ts[call] and w.end[call] - ends[p] <= wake_us:
                g = int(mine[p])
        if g >= 0:
            waits_src.append(w.n_leaf + g)
            waits_dst.append(int(w.ev2node[call]))
            if device_wide[int(name[call])] and corr[call] >= 0:  # every stream's last op before it, not only the one that ended last
                others = [x for x in every_stream(int(rank[call]), int(gdevice[g]), int(corr[call]), limit) if x != g]
                waits_src.extend(w.n_leaf + x for x in others)
                waits_dst.extend(int(w.ev2node[call]) for _ in others)
    E.add(waits_src, waits_dst, EdgeKind.SYNC, wait=True)
    E.add(order_src, order_dst, EdgeKind.SYNC)


def device_waits(w: Window, E: EdgeSet, tol: float) -> None:
    """A device op that is its queue waiting for another stream (fields.DEVICE_WAIT_PATTERN, with
    the stream it waits on in its args: an MTIA queue's ``event_wait``, ``wait_on_stream``) waits
    for the op of that stream, on its rank, that ended last by the wait's end (``tol`` µs after it
    at most: the record that completes the event ends with the wait, 1-3 µs after it in MTIA's
    traces) and while it waited. Edge: that op -> the wait, which waits on it (its modelled start
    is the release, so the path runs through the stream it waited for)."""
    c = w.c
    if not len(w.gpu_rows):
        return
    rows = w.gpu_rows
    waits = np.flatnonzero(w.name_queue_wait[c["name"][rows]] & (c["wait_stream"][rows] >= 0))
    if not len(waits):
        return
    key = c["rank"][rows].astype(np.int64) * (1 << 32) + (c["stream"][rows].astype(np.int64) & 0xFFFFFFFF)
    ends = w.end[rows]
    order = np.lexsort((ends, key))  # each (rank, stream)'s ops by end
    key_s, end_s = key[order], ends[order]
    src, dst = [], []
    for k in waits.tolist():
        r, ws = int(c["rank"][rows[k]]), int(c["wait_stream"][rows[k]])
        want = r * (1 << 32) + (ws & 0xFFFFFFFF)
        lo = int(np.searchsorted(key_s, want, side="left"))
        hi = int(np.searchsorted(key_s, want, side="right"))
        p = lo + int(np.searchsorted(end_s[lo:hi], float(ends[k]) + tol, side="right")) - 1
        if p >= lo and end_s[p] >= w.ts[rows[k]] and int(order[p]) != k:
            src.append(w.n_leaf + int(order[p]))
            dst.append(w.n_leaf + k)
    E.add(src, dst, EdgeKind.SYNC, wait=True)


def backends(w: Window, E: EdgeSet) -> list[tuple[int, int]]:
    """gloo: the k-th c10d call of one kind and size on a rank enqueued the k-th backend op of
    them (the backend op's 'Record function id' is not filled in by every version); of one kind,
    for the kinds whose sizes differ by design (window.UNEVEN_KINDS: ``c10d::alltoall_base_``'s
    first input is its output).
    Returns the (call event, backend node) pairs."""
    c = w.c
    name, rank = c["name"], c["rank"]
    net = np.flatnonzero(w.is_net & w.name_gloo[name[w.node_rows]])
    if not len(net):
        return []
    calls = np.flatnonzero(w.name_c10d[name] & (w.name_coll[name] >= 0) & (w.ev_thread >= 0))
    # (an all-to-all's c10d call reads as the size of its first input, its output: kind and order alone)
    size = np.where(np.isnan(c["msg_nelems"]) | isin_small(w.name_coll[name], UNEVEN_KINDS), -1, c["msg_nelems"]).astype(np.int64)

    def sequences(ev: np.ndarray) -> dict[tuple, list[int]]:
        out: dict[tuple, list[int]] = {}
        for e in ev[np.argsort(w.ts[ev], kind="stable")].tolist():
            out.setdefault((int(rank[e]), int(w.name_coll[name[e]]), int(size[e])), []).append(e)
        return out

    issued = sequences(calls)
    pairs = []
    node_of_row = dict(zip(w.node_rows[net].tolist(), net.tolist()))
    for key, works in sequences(w.node_rows[net]).items():
        for call, work in zip(issued.get(key, []), works):
            if w.ts[call] <= w.ts[work] + 1e-6:
                pairs.append((call, node_of_row[work]))
    pairs += _backends_left(w, calls, w.node_rows[net], pairs, node_of_row)
    if pairs:
        call_ev = np.array([p[0] for p in pairs], dtype=np.int64)
        work_node = np.array([p[1] for p in pairs], dtype=np.int64)
        src = w.out_node(call_ev)
        # gloo posts a send's or a receive's buffer inside the c10d call, before the span of its
        # gloo:send / gloo:recv begins (at the call's end): the transfer can be over by then. Such
        # an op starts with its call (_finish), after what the call waited for: the leaf before it.
        p2p = isin_small(w.ckind[work_node], P2P_KINDS)
        first = w.in_node(call_ev[p2p])
        before = first - 1
        ok = (first > 0) & (first < w.n_leaf)
        ok[ok] &= w.leaf_thread[before[ok]] == w.leaf_thread[first[ok]]
        at = np.flatnonzero(p2p)
        src[at] = np.where(ok, before, -1)
        E.add(src, work_node, EdgeKind.BACKEND)  # (-1: the call is its thread's first leaf in the window)
    return pairs


def collective_waits(w: Window, E: EdgeSet, pairs: list[tuple[int, int]]) -> set[int]:
    """A functional collective's wait (``_c10d_functional::wait_tensor``, fields.COLLECTIVE_WAIT_PATTERN)
    waits for the backend op of a collective its thread called before it: the earliest such call
    (``pairs``: c10d call event, backend node) not waited for yet, in the order they came
    (``wait_tensors``: every one not waited for yet). Edge: backend op -> the wait, which waits on
    it (its modelled start is the op's end). Returns the calls so waited for: their thread went on
    after the call (an asynchronous collective) and waited later, so ``completions`` leaves them."""
    if not pairs or not w.n_leaf:
        return set()
    leaves = w.leaf_rows
    waits = leaves[w.name_coll_wait[w.c["name"][leaves]]]
    if not len(waits):
        return set()
    # only a functional collective's call is waited so (``_c10d_functional::all_reduce`` encloses its
    # ``c10d::allreduce_``): FSDP's all-gather, called directly and waited with ``work.wait()``,
    # took a tensor-parallel wait_tensor in a job with both
    holders = np.flatnonzero(w.name_functional[w.c["name"]] & (w.ev_thread >= 0))
    spans: dict[int, list[tuple[float, float]]] = {}
    for h in holders.tolist():
        spans.setdefault(int(w.ev_thread[h]), []).append((float(w.ts[h]), float(w.end[h])))
    calls: dict[int, list[tuple[float, int, int]]] = {}
    for call, work in pairs:
        t, at = int(w.ev_thread[call]), float(w.ts[call])
        if any(a <= at + 1e-6 and float(w.end[call]) <= b + 1e-6 for a, b in spans.get(t, ())):
            calls.setdefault(t, []).append((at, work, call))
    for v in calls.values():
        v.sort()
    taken = {t: 0 for t in calls}
    src, dst, waited = [], [], set()
    for ev in waits[np.argsort(w.ts[waits], kind="stable")].tolist():
        t = int(w.ev_thread[ev])
        pending = calls.get(t)
        if not pending:
            continue
        every = w.names[int(w.c["name"][ev])].endswith("s")  # (wait_tensors)
        node = int(w.ev2node[ev])
        while taken[t] < len(pending) and pending[taken[t]][0] < w.ts[ev]:
            src.append(pending[taken[t]][1])
            dst.append(node)
            waited.add(pending[taken[t]][2])
            taken[t] += 1
            if not every:
                break
    E.add(src, dst, EdgeKind.FEEDS, wait=True)
    return waited


BACKEND_SERVES = {int(CollectiveKind.REDUCE_SCATTER): (int(CollectiveKind.REDUCE_SCATTER), int(CollectiveKind.ALL_REDUCE))}
"""The backend op kinds that may carry a c10d call of a kind (by default its own): gloo runs
``reduce_scatter_tensor`` (``c10d::_reduce_scatter_base_``) as an all-reduce of the whole input
(``gloo:all_reduce``), then keeps its shard."""


def _backends_left(
    w: Window, calls: np.ndarray, works: np.ndarray, paired: list[tuple[int, int]], node_of_row: dict[int, int]
) -> list[tuple[int, int]]:
    """The c10d calls and gloo backend ops that matching by kind and size left alone, paired in
    time order per rank: each op with the earliest call left before it whose kind it may carry
    (BACKEND_SERVES). A backend runs its calls' work in the order they came: the sizes differ
    where a call's first input is its output (``c10d::_allgather_base_``'s is the gathered
    tensor; FSDP's all-gathers and reduce-scatters are such calls), and the kind where the
    backend runs one collective as another."""
    c = w.c
    name, rank = c["name"], c["rank"]
    done_calls = {p[0] for p in paired}
    done_works = {p[1] for p in paired}
    left_calls = [e for e in calls[np.argsort(w.ts[calls], kind="stable")].tolist() if e not in done_calls]
    left_works = [e for e in works[np.argsort(w.ts[works], kind="stable")].tolist() if node_of_row[e] not in done_works]
    if not left_calls or not left_works:
        return []
    out = []
    waiting: dict[int, list[int]] = {}  # per rank: calls not yet paired, in time order
    i = 0
    for work in left_works:
        while i < len(left_calls) and w.ts[left_calls[i]] <= w.ts[work] + 1e-6:
            waiting.setdefault(int(rank[left_calls[i]]), []).append(left_calls[i])
            i += 1
        queue = waiting.get(int(rank[work]), [])
        kind = int(w.name_coll[name[work]])
        for k, call in enumerate(queue):
            ck = int(w.name_coll[name[call]])
            if kind in BACKEND_SERVES.get(ck, (ck,)):
                out.append((call, node_of_row[work]))
                del queue[k]
                break
    return out


P2P_WAIT_SHARE = 0.25
"""A side of a send/recv pair waited for the transfer where its thread sat idle before its span
closed for this share (or more) of the time from the later side's post to the close (and
``idle_us``): a thread that ran its ops until 60 µs before a 6 ms receive closed only called wait."""


def p2p_completions(w: Window, pairs: list[tuple[int, int]], inst: np.ndarray, node_end: np.ndarray, idle_us: float) -> None:
    """When a send/recv pair's transfer was done, from when each side saw it done. gloo records a
    send's or a receive's span on the calling thread, closed when that thread's wait on it returns:
    a side whose thread sat idle before its span closed (P2P_WAIT_SHARE) was waiting, and saw the
    transfer done when the span closed; a side whose thread ran its own ops until just before (an
    ``irecv`` posted ahead of the micro-batch that needs it) found it done when it got to the wait,
    the end of its last op (an op of its own: a c10d call, the next send's holding its thread, is
    communication, fields.C10D_CALL_PATTERN, not work; in torch.distributed.pipelining's stages a
    sender whose next ``c10d::send`` held its thread 1.5 ms read as busy to its peer's close: the
    transfer done at the later post, and the receiver's 1.5 ms wait for it, untraced). Where the earliest of these is a waiting side's, the transfer was done
    then; where it is a side that found it done, it was there before anyone needed it: done when
    the later side posted (the pair's last start, the calls'). ``node_end`` (the pair's modelled
    ends) is set so, in place, never later than it was. (With the spans' ends alone, a 32 KB receive posted early ran 10 ms on the
    path as communication while its thread computed.)"""
    p2p = {work: call for call, work in pairs if int(w.ckind[work]) in P2P_KINDS and inst[work] >= 0}
    if not p2p or not w.n_leaf:
        return
    nodes = w.node_rows
    by_inst: dict[int, list[int]] = {}
    for work in p2p:
        by_inst.setdefault(int(inst[work]), []).append(work)
    leaf_ts, leaf_end = w.ts[w.leaf_rows], w.end[w.leaf_rows]
    size = np.bincount(inst[inst >= 0])  # participants per instance
    for k, members in by_inst.items():
        if len(members) != size[k]:  # (a side that is no gloo op: left as it is)
            continue
        posted = max(float(w.ts[nodes[m]]) for m in members)
        done, seen = np.inf, False  # the earliest bound, and whether a side waiting for it saw it
        for m in members:
            call, closed = p2p[m], float(w.end[nodes[m]])
            t = w.ev_thread[call]
            lo = int(np.searchsorted(w.leaf_thread, t, side="left"))
            hi = int(np.searchsorted(w.leaf_thread, t, side="right"))
            q = lo + int(np.searchsorted(leaf_ts[lo:hi], closed, side="left")) - 1  # its last leaf starting before the span closed
            while q >= lo and w.name_c10d[w.c["name"][w.leaf_rows[q]]]:  # (a collective's call holding its thread: no work)
                q -= 1
            busy = min(max(float(w.end[call]), float(leaf_end[q]) if q >= lo else -np.inf), closed)
            waited = closed - busy >= max(idle_us, P2P_WAIT_SHARE * (closed - posted))
            bound = closed if waited else busy
            if bound < done - 1.0 or (waited and bound <= done + 1.0):
                done, seen = min(done, bound), waited
        for m in members:  # (a side that found it done bounds it only: it was there before, done when the later side posted)
            node_end[m] = max(posted, min(done if seen else posted, float(node_end[m])))


def completions(
    w: Window,
    E: EdgeSet,
    pairs: list[tuple[int, int]],
    inst: np.ndarray,
    node_end: np.ndarray,
    resume_us: float,
    idle_us: float = 0.0,
    pieces: dict[str, np.ndarray] | None = None,
) -> None:
    """Completion -> the op the calling thread resumes with, when that thread waited for it.

    The thread waited if, at the first op it runs after the last participant arrived, it had
    been idle since before the collective completed, it resumed within ``resume_us`` of the
    completion (or a quarter of its idle time, if longer: wake-ups on a loaded machine are
    late), and it was idle longer before the completion than after it. For collectives (a
    pipeline's sends and receives keep the rule as said so far: their spans hold the peer's
    wait), the thread was also idle ``idle_us`` or more and through at least half of the
    collective's modelled time from the last arrival (a thread that went on after an
    asynchronous call, ``async_op=True``, runs its next op after a few µs of Python: no wait;
    the first pass below had cut a 27 ms all-reduce to 0.05 ms there); time between two leaves
    that is the own time of an ATen op enclosing them (``pieces``: graph.gaps; an ``aten::mm``
    computing between its children) is work, not idleness (an autograd Function's own time,
    ``_ReduceFromParallel`` calling the all-reduce, may be its wait); and a thread waiting for
    several collectives (a DDP job's gradient buckets) resumes for the one that ended last
    before it went on: a resume another collective of its thread explains (it ended in the idle
    stretch, later than this one or before this one's recorded end) is not this one's (it had
    cut a bucket's 9 ms all-reduce to 0.7 ms at the resume after the first bucket).

    A waiting thread that resumed before the backend recorded the end proves the collective was
    complete by then (a descheduled backend thread can close its span late), so the modelled end
    of the instance moves to that resume time. A thread that went on after a collective's call
    and waited later (``work.wait()``, which records no op) resumes after its own backend op's
    recorded end: where the first op after the last arrival is no resume, the first op after
    that end is tried the same way, and where the thread resumed so, its backend op ends where it
    was recorded (the instance may have ended earlier on another rank; this thread could not go
    on before its own op was done). ``node_end`` is updated in place."""
    if not pairs:
        return
    nodes = w.node_rows
    start = w.ts[nodes]
    arrival = start.copy()
    members = np.flatnonzero(inst >= 0)
    if len(members):
        last = np.full(int(inst.max()) + 1, -np.inf)
        np.maximum.at(last, inst[members], start[members])
        arrival[members] = last[inst[members]]
    leaf_ts, leaf_end = w.ts[w.leaf_rows], w.end[w.leaf_rows]
    working = np.zeros(w.n_leaf)  # per leaf: the own time of enclosing ATen ops in the stretch before it
    if pieces is not None and len(pieces["node"]):
        own = pieces["owner_op"].astype(bool) & (pieces["node"] < w.n_leaf) & (pieces["owner"] >= 0)
        codes, at = np.unique(pieces["owner"][own], return_inverse=True)  # (the owners there are, not every name)
        own[own] &= np.array([w.names[k].startswith("aten::") for k in codes.tolist()], dtype=bool)[at.reshape(-1)]
        np.add.at(working, pieces["node"][own], (pieces["end"] - pieces["start"])[own])
    # each thread's collectives and when they end (as modelled before this rule): a thread waiting
    # for several (a DDP job's buckets) resumes for the one that ended last before it went on
    ends0 = node_end.copy()
    of_thread: dict[int, list[int]] = {}
    for call, work in pairs:
        of_thread.setdefault(int(w.ev_thread[call]), []).append(work)

    def explained_elsewhere(t: int, work: int, done: float, q: int) -> bool:
        """Did another collective of thread ``t`` end in the stretch before leaf ``q`` later than
        ``work`` did (or at all, where ``work`` ends after ``q`` began)? Then that one is what the
        thread waited for."""
        since = leaf_end[q - 1] if done > leaf_ts[q] else done
        return any(o != work and since < ends0[o] <= leaf_ts[q] + 1.0 for o in of_thread.get(t, ()))

    def resumed(call: int, work: int, later: bool = False) -> int:
        t = w.ev_thread[call]
        lo = int(np.searchsorted(w.leaf_thread, t, side="left"))
        hi = int(np.searchsorted(w.leaf_thread, t, side="right"))
        done = node_end[work]
        least = max(idle_us, (done - arrival[work]) / 2)  # (a thread that waited for the collective was idle through most of it)
        # (its thread goes on once its call returned: a send posted inside its call arrived at the call's start)
        since = max(arrival[work], float(w.end[call]))
        p2p = int(w.ckind[work]) in P2P_KINDS  # (a pipeline's sends and receives keep the first rule: their spans hold the peer's wait)
        if p2p:
            least = 0.0
            # gloo records a send's or receive's span on the calling thread and closes it when the
            # thread's wait returns: an op before that is no resume (an isend's thread goes on)
            since = max(since, float(w.end[nodes[work]]) - 1.0)
        if later:  # (after an asynchronous call: its thread resumes after its own backend op ended, idle through most of it)
            since = done = max(done, float(w.end[nodes[work]]))
            least = max(idle_us, (done - arrival[work]) / 2)
        q = lo + int(np.searchsorted(leaf_ts[lo:hi], since, side="left"))
        if q >= hi or q == lo:
            return -1
        after = leaf_ts[q] - done
        idle = leaf_ts[q] - leaf_end[q - 1] - (0.0 if p2p else working[q])
        # woken late on a loaded machine: a long wait tolerates a proportionally late resume
        if leaf_end[q - 1] <= done and after <= max(resume_us, idle / 4) and idle > max(after, 0.0) and idle >= least:
            return -1 if not p2p and explained_elsewhere(int(t), work, done, q) else q
        return -1

    # first pass: waiting threads that resumed before the recorded end bound the completion
    for call, work in pairs:
        q = resumed(call, work)
        if q >= 0 and leaf_ts[q] < node_end[work]:
            group = np.flatnonzero(inst == inst[work]) if inst[work] >= 0 else np.array([work])
            node_end[group] = np.maximum(np.minimum(node_end[group], leaf_ts[q]), arrival[group])
    feed_src, feed_dst = [], []
    for call, work in pairs:
        q = resumed(call, work)
        if q < 0 and int(w.ckind[work]) not in P2P_KINDS:  # (a pipeline's sends and receives pair as they are)
            q = resumed(call, work, later=True)
            if q >= 0:  # the thread could not go on before its own backend op was done: that op ends where it was recorded
                node_end[work] = max(node_end[work], float(w.end[nodes[work]]))
        if q >= 0:
            feed_src.append(work)
            feed_dst.append(q)
    E.add(feed_src, feed_dst, EdgeKind.FEEDS)


def stream_waits(w: Window, E: EdgeSet, launcher: np.ndarray, tol: float, clock_tol: float) -> None:
    """Traces without cuda_sync events (no record of cudaStreamWaitEvent's streams): a GPU op that
    started more than ``tol`` µs after both its launch and the op before it on its stream ended
    waited for something; if an op on another stream of its device ended at most ``tol`` µs before
    it started (NCCL stream -> compute stream, copy stream -> compute stream), that op released
    it. So did the op on another stream that ended last before it started, further back, where
    the device stayed busy from that op's end until the waiter started (no gap over ``tol`` µs
    in the union of its ops): a waiter released while other streams' kernels hold the device
    starts when they make room, and that delay is the device's, not an untraced cause
    (diff_test's all-to-all kernel 129 µs after the copy it waited for, the device busy
    throughout: 7 ms of its steps read "untraced" where the device was 96% busy). Never from an
    op that ended after the waiter started (beyond ``clock_tol``), nor from before its launch or
    its stream's previous op."""
    c = w.c
    n_gpu = len(w.gpu_rows)
    if not n_gpu:
        return
    rank = c["rank"][w.gpu_rows]
    recorded = np.unique(c["rank"][c["cls"] == EvClass.GPU_SYNC])
    start, end = w.ts[w.gpu_rows], w.end[w.gpu_rows]
    # a blocking copy is enqueued when its call starts (the call returns only after it)
    enqueued = np.where(w.copy_op[np.maximum(launcher, 0)] == w.gpu_rows, w.ts[np.maximum(launcher, 0)], w.end[np.maximum(launcher, 0)])
    lower = np.where(launcher >= 0, enqueued, -np.inf)
    prev_same = np.zeros(n_gpu, dtype=bool)
    prev_same[1:] = w.gpu_stream[1:] == w.gpu_stream[:-1]
    prev_end = np.full(n_gpu, -np.inf)
    prev_end[1:] = end[:-1]
    lower = np.maximum(lower, np.where(prev_same, prev_end, -np.inf))
    lower = np.maximum(lower, w.carry[w.n_leaf : w.n_leaf + n_gpu])
    late = np.flatnonzero((start - lower > tol) & np.isfinite(lower) & ~np.isin(rank, recorded))
    if not len(late):
        return
    src, dst = [], []
    queue_waits = w.name_queue_wait[c["name"][w.gpu_rows]]  # (a queue waiting releases nothing: device_waits)
    for r in np.unique(rank[late]).tolist():
        mine = np.flatnonzero((rank == r) & ~queue_waits)
        by_end = mine[np.argsort(end[mine], kind="stable")]
        ends = end[by_end]
        # the device's busy stretches: its ops' union, joined across gaps of at most tol
        order = mine[np.argsort(start[mine], kind="stable")]
        s_o, reach = start[order], np.maximum.accumulate(end[order])
        new = np.ones(len(order), dtype=bool)
        new[1:] = s_o[1:] > reach[:-1] + tol
        block_of = np.cumsum(new) - 1
        block_end = np.maximum.reduceat(reach, np.flatnonzero(new)) if len(order) else reach
        for b in late[rank[late] == r].tolist():
            p = int(np.searchsorted(ends, start[b] + clock_tol, side="right")) - 1
            while p >= 0 and ends[p] >= lower[b]:
                a = int(by_end[p])
                if w.gpu_stream[a] != w.gpu_stream[b]:
                    if ends[p] >= start[b] - tol:
                        src.append(w.n_leaf + a)
                        dst.append(w.n_leaf + b)
                    else:  # further back: only where the device stayed busy until the waiter started
                        k = int(block_of[int(np.searchsorted(s_o, start[a], side="right")) - 1])
                        if block_end[k] >= start[b] - tol:
                            src.append(w.n_leaf + a)
                            dst.append(w.n_leaf + b)
                    break
                p -= 1
    E.add(src, dst, EdgeKind.SYNC)


def queries_only(w: Window) -> np.ndarray:
    """Per dense thread id: every op of the thread in the window is a runtime call that does not
    synchronize (event and stream queries and loops of them, pointer attributes, launches). (A
    thread that synchronizes may wake another when the device is done.)"""
    n_thread = int(w.leaf_thread.max()) + 1 if w.n_leaf else 0
    other = np.zeros(n_thread, dtype=bool)
    rows = w.leaf_rows
    np.logical_or.at(other, w.leaf_thread, (w.c["cls"][rows] != EvClass.RUNTIME) | (w.blocking[rows] & (w.polls[rows] == 0)))
    out: np.ndarray = ~other
    return out


def pollers(w: Window, launcher: np.ndarray) -> np.ndarray:
    """Per dense thread id: the thread only polls, ``queries_only`` and launching no device work: a
    monitor (NCCL's watchdog checks its collectives' events every few ms; a heartbeat). It hands
    no work to another thread and waits for none of theirs."""
    out = queries_only(w)
    launched = w.ev_thread[launcher[launcher >= 0]]
    out[launched[launched >= 0]] = False
    return out


def thread_handoffs(w: Window, E: EdgeSet, pieces: dict[str, np.ndarray], idle_us: float, resume_us: float, launcher: np.ndarray) -> None:
    """A thread that resumes after an idle stretch waits for the thread of its process that handed
    over to it: the autograd engine's thread runs the backward pass while the thread that called
    ``backward()`` waits, then hands back; the calling thread hands the backward to it first. A
    thread that only polls (``pollers``) neither hands over nor is handed to: its calls end and its
    next ones start on its own timer, beside the others' work.

    For a stretch of at least ``idle_us`` µs in which nothing opened or closed on a thread (a gap
    piece, see gaps.py), the releasing op is the latest-ending leaf of another thread of the same
    rank and process that ended inside the stretch, after which its thread started nothing before
    the stretch ended (it handed over and went idle) or its next leaf is a call that blocks it
    (``_blocked_leaves``: it handed over and waits for its next job), with the waiting thread resuming within
    ``resume_us`` µs of it (or a quarter of its idle time, if longer: wake-ups on a loaded machine
    are late) and idle longer before the release than after it. Edge: that op -> the leaf the
    stretch precedes (the THREAD edge's latency covers the wake-up and what ran before that leaf).
    "Went idle" here asks no minimum pause of the releaser, unlike ``blocked_handoffs``: the
    autograd engine's thread hands CPU work back to the caller's queue and goes on with its own
    (dlrm worker 5: its last launch before the caller's AccumulateGrad is followed by more of its
    work within microseconds); asking it to pause for ``idle_us`` loses that hand-back and leaves
    4.3 ms of the caller's wait untraced."""
    if not len(pieces["node"]) or not w.n_leaf:
        return
    c = w.c
    polling = pollers(w, launcher)
    long = np.flatnonzero((pieces["end"] - pieces["start"] >= idle_us) & ~polling[w.leaf_thread[pieces["node"]]])
    if not len(long):
        return
    leaf_ev = w.leaf_rows
    blocked = _blocked_leaves(w, idle_us)[0]  # (a thread that hands over and blocks for its next job went idle too)
    proc = c["rank"][leaf_ev].astype(np.int64) * (1 << 32) + c["pid"][leaf_ev]
    srt = w.cpu_sorted  # every CPU event by (thread, ts): when did a thread next start something?
    ev_th, ev_ts = w.ev_thread[srt], w.ts[srt]
    span = float(w.end.max()) + 2.0
    ev_key = ev_th * span + ev_ts
    src, dst = [], []
    piece_leaf = pieces["node"][long]
    piece_proc = proc[piece_leaf]
    by_proc = np.argsort(proc, kind="stable")  # each process's leaves, ascending: one sort, not one scan per process
    procs = proc[by_proc]
    for q in np.unique(piece_proc).tolist():
        mine = by_proc[np.searchsorted(procs, q, side="left") : np.searchsorted(procs, q, side="right")]
        if len(np.unique(w.leaf_thread[mine])) < 2:
            continue
        by_end = mine[np.argsort(w.end[leaf_ev[mine]], kind="stable")]
        ends = w.end[leaf_ev[by_end]]
        for k in long[piece_proc == q].tolist():
            lo, hi, b = float(pieces["start"][k]), float(pieces["end"][k]), int(pieces["node"][k])
            p = int(np.searchsorted(ends, hi, side="right")) - 1
            while p >= 0 and ends[p] >= lo:
                a = int(by_end[p])
                t_a, after, before = ends[p], hi - ends[p], ends[p] - lo
                if after > max(resume_us, (hi - lo) / 4) or before <= after:
                    break
                th = w.leaf_thread[a]
                if th != w.leaf_thread[b] and not polling[th]:
                    nxt = int(np.searchsorted(ev_key, th * span + t_a - 1e-6, side="right"))
                    while nxt < len(ev_key) and srt[nxt] == leaf_ev[a]:  # a zero-length op itself
                        nxt += 1
                    idle = nxt >= len(ev_key) or ev_th[nxt] != th or ev_ts[nxt] >= hi
                    if idle or (a + 1 < w.n_leaf and w.leaf_thread[a + 1] == th and blocked[a + 1]):
                        src.append(a)
                        dst.append(b)
                        break
                p -= 1
    E.add(src, dst, EdgeKind.THREAD)


WALK_FIRST = 32
"""``blocked_handoffs`` looks at this many of the latest-ending leaves one by one before the rest in one pass."""


def _blocked_leaves(w: Window, idle_us: float) -> tuple[np.ndarray, np.ndarray]:
    """Per leaf: a Python call that blocks its thread (``fields.HOST_BLOCKED_PATTERN``) for at
    least ``idle_us`` µs; of those, a lock's or a future's wait (``fields.LOCK_WAIT_PATTERN``)."""
    codes = w.c["name"][w.leaf_rows]
    long = w.end[w.leaf_rows] - w.ts[w.leaf_rows] >= idle_us
    return w.name_blocked[codes] & long, w.name_lock[codes] & long


def blocked_handoffs(w: Window, E: EdgeSet, idle_us: float, resume_us: float) -> None:
    """A thread blocked in a lock's acquire or a future's wait (``fields.LOCK_WAIT_PATTERN``, as the
    Python tracer names them: ``with_stack=True``) for at least ``idle_us`` µs waits for the thread
    of its process that released it: ``queue.get`` returns when another thread has put the item.
    ``thread_handoffs`` finds such hand-overs where the waiting thread has nothing open; here the
    wait is an op of its own. The releasing op is the latest-ending leaf of another thread of the
    same rank and process that ended inside the wait, is not itself a blocked call, and after which
    its thread's next leaf is a blocked call, or starts after the wait ended and ``idle_us`` or more
    after it, if it has one in the window (it handed over and blocked waiting for its next job, or
    went idle; a busy thread's next op may start just after any moment; a step's end marker is no
    op that hands over), with the wait ending within ``resume_us`` µs
    of it (or a quarter of the wait, if longer) and more of the wait before the release than after.
    Edge: that op -> the blocked call, which waits on it (its modelled start is the release)."""
    if not w.n_leaf:
        return
    c = w.c
    leaf_ev = w.leaf_rows
    ts, end = w.ts[leaf_ev], w.end[leaf_ev]
    blocked, waits = _blocked_leaves(w, idle_us)
    waits = np.flatnonzero(waits)
    if not len(waits):
        return
    thread = w.leaf_thread
    marker = w.rows[leaf_ev] < 0  # a step's end marker is no op
    proc = c["rank"][leaf_ev].astype(np.int64) * (1 << 32) + c["pid"][leaf_ev]
    by_end = np.lexsort((end, proc))  # each process's leaves by end
    key_end = end[by_end]
    # one sorted key over (process, end), so that every wait's bounds are found in one pass
    dense = np.unique(proc, return_inverse=True)[1].reshape(-1)
    width = float(end.max() - min(float(end.min()), float(ts.min()))) + 1.0
    base = min(float(end.min()), float(ts.min()))
    key = dense[by_end] * width + (key_end - base)
    lo_w, hi_w = ts[waits], end[waits]
    floor_w = np.maximum(hi_w - np.maximum(resume_us, (hi_w - lo_w) / 4), lo_w)  # the releaser ends after this ...
    at_w = dense[waits] * width
    first_w = np.searchsorted(key, at_w, side="left")
    top_w = np.searchsorted(key, at_w + (hi_w - base), side="right") - 1  # the latest-ending leaf of its process ending by the wait's end
    floor_at = np.searchsorted(key, at_w + (floor_w - base), side="left")
    src, dst = [], []

    def releases(a: int, hi: float) -> bool:
        """After ``a`` its thread blocks, or stays idle past the wait's end and for idle_us at least
        (a busy thread whose next op merely starts just after the wake-up handed nothing over)."""
        nxt = a + 1  # leaves are sorted by (thread, ts)
        if nxt >= w.n_leaf or thread[nxt] != thread[a]:
            return True
        return bool(blocked[nxt] or (ts[nxt] >= hi and ts[nxt] - end[a] >= idle_us))

    for k, b in enumerate(waits.tolist()):
        lo, hi = float(lo_w[k]), float(hi_w[k])
        first, floor, p = int(first_w[k]), float(floor_w[k]), int(top_w[k])
        mid = (lo + hi) / 2  # ... and after the middle of the wait
        seen: set[int] = {int(thread[b])}
        found = False
        for _ in range(WALK_FIRST):  # the leaves ending latest, one at a time: the releaser is most often among them
            if p < first or key_end[p] < floor or key_end[p] <= mid:
                found = True  # (nothing left to look at)
                break
            a = int(by_end[p])
            p -= 1
            th = int(thread[a])
            if th in seen or blocked[a] or marker[a]:
                continue
            seen.add(th)  # its earlier leaves are followed by this one: not where it went idle
            if releases(a, hi):
                src.append(a)
                dst.append(b)
                found = True
                break
        if found:
            continue
        # the rest in one numpy pass (a server's trace may hold thousands of waits and of other threads' ops)
        cand = by_end[int(floor_at[k]) : p + 1][::-1]
        cand = cand[(end[cand] > mid) & ~np.isin(thread[cand], list(seen)) & ~blocked[cand] & ~marker[cand]]
        _, at = np.unique(thread[cand], return_index=True)  # each thread's latest-ending one
        for a in cand[np.sort(at)].tolist():
            if releases(a, hi):
                src.append(a)
                dst.append(b)
                break
    E.add(src, dst, EdgeKind.THREAD, wait=True)

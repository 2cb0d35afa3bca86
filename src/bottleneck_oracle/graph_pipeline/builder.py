"""EventTable -> ExecutionGraph per step, with the documented edge rules.

Nodes
  * CPU threads: the leaf slices of each thread's op tree (an op that contains
    no other op). Leaves on one thread never overlap, so program order is a
    chain; parent ops (modules, autograd nodes) stay in the event table and
    are mapped onto their first/last leaf when an edge starts or ends at them.
  * GPU streams: every kernel, memcpy and memset.
  * gloo backend ops (``gloo:*`` on runloop threads) and NCCL kernels are
    ``network`` nodes; a collective seen on two or more ranks gets a virtual
    zero-duration ``barrier`` node (the moment the last participant arrived).

Edges (finish-to-start, weight in µs) -- see schema.EdgeKind:
  program order, launch (correlation id), fwd->bwd (fwdbwd flows), CUDA syncs
  (context / stream / event sync, stream-wait-event), c10d -> backend op,
  collective barrier -> participants, completion -> the op a waiting thread
  resumes with.

Weights. Every node has a modelled start: its measured start, or for a
blocking op (a sync call, a collective) the moment what it waits for was ready.
Of a node's local in-edges the one whose source ended last is binding and gets
weight = start - source end (launch latency, framework gap); the others get
min(gap, 0). So the longest path reproduces every measured start exactly and
the slack of non-binding paths is what the trace shows could be absorbed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bottleneck_oracle.errors import GraphError
from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline.events import EventTable, EvClass, Step
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind, NodeType, collective_kind

_GPU_CLASSES = (EvClass.KERNEL, EvClass.MEMCPY, EvClass.MEMSET)
_CLASS_CATEGORY = {
    EvClass.CPU: Category.CPU_OP,
    EvClass.RUNTIME: Category.RUNTIME,
    EvClass.KERNEL: Category.KERNEL,
    EvClass.MEMCPY: Category.MEMCPY,
    EvClass.MEMSET: Category.MEMSET,
}
_P2P = (CollectiveKind.SEND, CollectiveKind.RECV)


@dataclass(kw_only=True, slots=True)
class BuildOptions:
    feeds_resume_us: float = 1000.0
    """A thread that was idle when a collective finished and resumes within this many µs
    after it is taken to have waited for it (a FEEDS edge)."""
    blocking_sync_calls: tuple[str, ...] = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "hipDeviceSynchronize", "hipStreamSynchronize")
    """Runtime calls that block until the GPU drains (used when a trace has no cuda_sync events)."""

    def __post_init__(self) -> None:
        if not self.feeds_resume_us >= 0:
            raise ValueError(f"feeds_resume_us must be >= 0 (found {self.feeds_resume_us})")


def _thread_keys(*cols: np.ndarray) -> np.ndarray:
    """Dense integer id per distinct tuple of the given integer columns."""
    stacked = np.stack([c.astype(np.int64) for c in cols], axis=1)
    _, inv = np.unique(stacked, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)


def _name_flags(names: list[str]) -> dict[str, np.ndarray]:
    """Per-name lookups computed once per name, not per event."""
    coll = np.array([collective_kind(n) for n in names], dtype=np.int8) if names else np.zeros(0, np.int8)
    lower = [n.lower() for n in names]
    gloo = np.array([n.startswith("gloo:") for n in lower], dtype=bool)
    nccl_kernel = np.array([n.startswith("nccl") and "kernel" in n for n in lower], dtype=bool)
    c10d = np.array([n.startswith("c10d::") and "wait" not in n for n in lower], dtype=bool)
    return {"coll": coll, "gloo": gloo, "nccl_kernel": nccl_kernel, "c10d": c10d}


def select_window(table: EventTable, step: int | None) -> tuple[np.ndarray, float, dict[int, float], list[Step]]:
    """Rows of the events in one ProfilerStep (all ranks), its start, measured spans and steps.

    A step is everything that starts within its ProfilerStep span on that rank, GPU ops
    included (a kernel belongs to the step it runs in, not the one that launched it).
    With ``step=None`` the whole trace is one window.
    """
    c = table.cols
    ts, end = c["ts"], c["ts"] + c["dur"]
    if step is None:
        measured = {}
        for r in table.ranks:
            m = c["rank"] == r
            measured[r] = float(end[m].max() - ts[m].min())
        return np.arange(len(table)), float(ts.min()), measured, []
    steps = [s for s in table.steps if s.number == step]
    if not steps:
        raise GraphError(f"no ProfilerStep#{step} in the trace")
    keep = np.zeros(len(table), dtype=bool)
    for s in steps:
        keep |= (c["rank"] == s.rank) & (ts >= s.start) & (ts < s.end)
    return np.flatnonzero(keep), min(s.start for s in steps), {s.rank: s.span for s in steps}, steps


def _with_step_ends(table: EventTable, rows: np.ndarray, steps: list[Step]) -> tuple[dict[str, np.ndarray], np.ndarray, list[str]]:
    """The window's columns plus one zero-duration marker per rank at its step's end, on the
    thread of the ProfilerStep span: the framework time after the last op is part of the step."""
    c = {k: v[rows] for k, v in table.cols.items()}
    names = table.names
    if not steps:
        return c, rows, names
    names = list(names)
    extra = {k: np.full(len(steps), F.ARG_SPECS[k].default if k in F.ARG_SPECS else -1, dtype=v.dtype) for k, v in c.items()}
    extra["rank"] = np.array([s.rank for s in steps], dtype=c["rank"].dtype)
    extra["pid"] = np.array([s.pid for s in steps], dtype=np.int64)
    extra["tid"] = np.array([s.tid for s in steps], dtype=np.int64)
    extra["ts"] = np.array([s.end for s in steps], dtype=np.float64)
    extra["dur"] = np.zeros(len(steps))
    extra["cls"] = np.full(len(steps), EvClass.CPU, dtype=np.int8)
    extra["elem_bytes"] = np.full(len(steps), np.nan)
    label = f"{F.STEP_PREFIX}{steps[0].number} end"
    names.append(label)
    extra["name"] = np.full(len(steps), len(names) - 1, dtype=np.int32)
    c = {k: np.concatenate([v, extra[k]]) for k, v in c.items()}
    return c, np.concatenate([rows, np.full(len(steps), -1, dtype=np.int64)]), names


class _Edges:
    def __init__(self) -> None:
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []
        self.kind: list[np.ndarray] = []

    def add(self, src: np.ndarray, dst: np.ndarray, kind: EdgeKind) -> None:
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        ok = (src >= 0) & (dst >= 0) & (src != dst)
        self.src.append(src[ok])
        self.dst.append(dst[ok])
        self.kind.append(np.full(int(ok.sum()), int(kind), dtype=np.int8))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.src:
            e = np.zeros(0, np.int64)
            return e, e, np.zeros(0, np.int8)
        src, dst, kind = np.concatenate(self.src), np.concatenate(self.dst), np.concatenate(self.kind)
        # one edge per (src, dst): keep the first rule that produced it
        order = np.lexsort((kind, dst, src))
        src, dst, kind = src[order], dst[order], kind[order]
        first = np.ones(len(src), dtype=bool)
        first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
        return src[first], dst[first], kind[first]


def _prefix_argmax(values: np.ndarray) -> np.ndarray:
    """For each position i, the index of the maximum of values[:i+1]."""
    idx = np.arange(len(values))
    running = np.maximum.accumulate(values) if len(values) else values
    at_max = np.where(values >= running, idx, 0)
    return np.maximum.accumulate(at_max) if len(values) else idx


def build_graph(table: EventTable, step: int | None, options: BuildOptions | None = None) -> ExecutionGraph:
    """The ExecutionGraph of one step (``None``: the whole trace), all ranks merged."""
    opt = options or BuildOptions()
    rows, w0, measured, steps = select_window(table, step)
    c, rows, names = _with_step_ends(table, rows, steps)
    n_ev = len(rows)
    ts = c["ts"] - w0
    dur = c["dur"]
    end = ts + dur
    cls = c["cls"]
    rank = c["rank"]
    flags = _name_flags(names)
    name = c["name"]

    # ---- nodes: CPU leaves, GPU ops -------------------------------------------------
    on_cpu = (cls == EvClass.CPU) | (cls == EvClass.RUNTIME)
    cpu_rows = np.flatnonzero(on_cpu)
    tkey_cpu = _thread_keys(rank[cpu_rows], c["pid"][cpu_rows], c["tid"][cpu_rows])
    order = np.lexsort((-dur[cpu_rows], ts[cpu_rows], tkey_cpu))
    cpu_sorted = cpu_rows[order]
    tk_sorted = tkey_cpu[order]
    nxt_same = np.zeros(len(cpu_sorted), dtype=bool)
    nxt_same[:-1] = tk_sorted[1:] == tk_sorted[:-1]
    nxt_ts = np.empty(len(cpu_sorted))
    nxt_ts[:-1] = ts[cpu_sorted[1:]]
    nxt_ts[-1:] = np.inf
    is_leaf = ~nxt_same | (nxt_ts >= end[cpu_sorted])
    leaf_rows = cpu_sorted[is_leaf]  # sorted by (thread, ts)
    leaf_tk = tk_sorted[is_leaf]

    gpu_rows = np.flatnonzero(np.isin(cls, _GPU_CLASSES))
    tkey_gpu = _thread_keys(rank[gpu_rows], c["pid"][gpu_rows], c["tid"][gpu_rows])
    g_order = np.lexsort((ts[gpu_rows], tkey_gpu))
    gpu_rows = gpu_rows[g_order]
    gpu_tk = tkey_gpu[g_order]

    node_rows = np.concatenate([leaf_rows, gpu_rows])
    n_real = len(node_rows)
    ev2node = np.full(n_ev, -1, dtype=np.int64)
    ev2node[node_rows] = np.arange(n_real)
    nname = name[node_rows]
    ncls = cls[node_rows]
    category = np.array([_CLASS_CATEGORY[EvClass(x)] for x in range(5)], dtype=np.int8)[np.minimum(ncls, 4)]
    ckind = flags["coll"][nname]
    is_net = (flags["gloo"][nname] & (ncls == EvClass.CPU)) | (flags["nccl_kernel"][nname] & (ncls == EvClass.KERNEL))
    ckind = np.where(is_net, ckind, -1).astype(np.int8)
    category[is_net] = np.where(np.isin(ckind[is_net], _P2P), Category.P2P, Category.COLLECTIVE)
    node_type = np.where(is_net, NodeType.NETWORK, NodeType.COMPUTE).astype(np.int8)
    elem = np.where(np.isnan(c["elem_bytes"][node_rows]), 4.0, c["elem_bytes"][node_rows])
    msg_bytes = np.where(is_net, c["msg_nelems"][node_rows] * elem, np.nan)

    # representative leaves of any CPU event: first leaf inside (edges into it), last (edges out)
    span = float(np.max(end)) + 1.0 if n_ev else 1.0
    leaf_key = leaf_tk * span + ts[leaf_rows]
    ev_tk = np.full(n_ev, -1, dtype=np.int64)
    ev_tk[cpu_rows] = tkey_cpu

    def in_node(ev: np.ndarray) -> np.ndarray:
        ev = np.asarray(ev, dtype=np.int64)
        out = np.full(len(ev), -1, dtype=np.int64)
        direct = ev2node[ev]
        cpu = (direct < 0) & (ev_tk[ev] >= 0) & (len(leaf_rows) > 0)
        pos = np.searchsorted(leaf_key, ev_tk[ev[cpu]] * span + ts[ev[cpu]], side="left")
        pos = np.minimum(pos, len(leaf_rows) - 1)
        good = (leaf_tk[pos] == ev_tk[ev[cpu]]) & (ts[leaf_rows[pos]] < end[ev[cpu]] + 1e-9)
        tmp = np.where(good, pos, -1)
        out[cpu] = tmp
        return np.where(direct >= 0, direct, out)

    def out_node(ev: np.ndarray) -> np.ndarray:
        ev = np.asarray(ev, dtype=np.int64)
        out = np.full(len(ev), -1, dtype=np.int64)
        direct = ev2node[ev]
        cpu = (direct < 0) & (ev_tk[ev] >= 0) & (len(leaf_rows) > 0)
        pos = np.searchsorted(leaf_key, ev_tk[ev[cpu]] * span + end[ev[cpu]], side="left") - 1
        pos = np.maximum(pos, 0)
        good = (leaf_tk[pos] == ev_tk[ev[cpu]]) & (ts[leaf_rows[pos]] >= ts[ev[cpu]] - 1e-9)
        out[cpu] = np.where(good, pos, -1)
        return np.where(direct >= 0, direct, out)

    E = _Edges()
    blocking = np.zeros(n_real, dtype=bool)
    wait_edge_lists: list[tuple[np.ndarray, np.ndarray]] = []  # (src, dst) that model waiting

    # ---- program order ----------------------------------------------------------------
    n_leaf = len(leaf_rows)
    same = leaf_tk[1:] == leaf_tk[:-1]
    E.add(np.flatnonzero(same), np.flatnonzero(same) + 1, EdgeKind.PROGRAM_ORDER)
    gsame = gpu_tk[1:] == gpu_tk[:-1]
    E.add(n_leaf + np.flatnonzero(gsame), n_leaf + np.flatnonzero(gsame) + 1, EdgeKind.PROGRAM_ORDER)

    # ---- launch: runtime call -> GPU op, same rank and correlation id ------------------
    corr = c["correlation"]
    rt = np.flatnonzero((cls == EvClass.RUNTIME) & (corr >= 0))
    rt_key = rank[rt].astype(np.int64) * (1 << 40) + corr[rt]
    o = np.argsort(rt_key, kind="stable")
    rt, rt_key = rt[o], rt_key[o]
    g_key = rank[gpu_rows].astype(np.int64) * (1 << 40) + corr[gpu_rows]
    pos = np.minimum(np.searchsorted(rt_key, g_key), max(len(rt) - 1, 0))
    hit = (corr[gpu_rows] >= 0) & (len(rt) > 0) & (rt_key[pos] == g_key) if len(rt) else np.zeros(len(gpu_rows), bool)
    launcher = np.full(len(gpu_rows), -1, dtype=np.int64)
    launcher[hit] = rt[pos[hit]]
    E.add(out_node(launcher[hit]), n_leaf + np.flatnonzero(hit), EdgeKind.LAUNCH)

    # ---- forward -> backward (fwdbwd flows) -------------------------------------------
    _flow_edges(table, w0, c, ts, rank, cpu_sorted, tk_sorted, tkey_cpu, cpu_rows, in_node, out_node, E)

    # ---- CUDA synchronisation -----------------------------------------------------------
    _sync_edges(c, ts, end, rank, cls, corr, gpu_rows, gpu_tk, launcher, n_leaf, ev2node, names, name, opt, E, blocking, wait_edge_lists)

    # ---- c10d op -> backend op, and completion -> the thread that waited ------------------
    _backend_edges(c, ts, end, rank, name, flags, node_rows, is_net, leaf_rows, leaf_tk, ev_tk, out_node, opt, E)

    # ---- cross-rank collectives: barrier nodes ---------------------------------------------
    src, dst, kind = E.arrays()
    inst = _match_collectives(rank[node_rows], ts[node_rows], ckind, is_net, c["pg"][node_rows], c["msg_nelems"][node_rows])
    n_bar = int(inst.max()) + 1 if len(inst) and inst.max() >= 0 else 0
    n_all = n_real + n_bar

    start = np.concatenate([ts[node_rows], np.zeros(n_bar)])
    ndur = np.concatenate([dur[node_rows], np.zeros(n_bar)])
    nend = start + ndur
    member = np.flatnonzero(inst >= 0)
    bar_of = n_real + inst[member]
    bar_start = np.full(n_bar, -np.inf)
    np.maximum.at(bar_start, inst[member], start[member])
    start[n_real:] = bar_start
    nend[n_real:] = bar_start
    blocking[member] = True

    # modelled start of blocking nodes
    mstart = start.copy()
    mstart[member] = np.clip(bar_start[inst[member]], start[member], nend[member])
    wsrc = np.concatenate([w[0] for w in wait_edge_lists]) if wait_edge_lists else np.zeros(0, np.int64)
    wdst = np.concatenate([w[1] for w in wait_edge_lists]) if wait_edge_lists else np.zeros(0, np.int64)
    if len(wsrc):
        ready = np.full(n_all, -np.inf)
        np.maximum.at(ready, wdst, nend[wsrc])
        sync_nodes = np.unique(wdst)
        mstart[sync_nodes] = np.clip(np.maximum(start[sync_nodes], ready[sync_nodes]), start[sync_nodes], nend[sync_nodes])

    # weights of local edges: binding = the source that ended last
    is_wait = np.zeros(len(src), dtype=bool)
    if len(wsrc):
        wkey = set(zip(wsrc.tolist(), wdst.tolist()))
        is_wait = np.fromiter(((s, d) in wkey for s, d in zip(src.tolist(), dst.tolist())), dtype=bool, count=len(src))
    weight = np.empty(len(src))
    gap_local = start[dst] - nend[src]
    loc = np.flatnonzero(~is_wait)
    o = np.lexsort((nend[src[loc]], dst[loc]))
    loc = loc[o]
    last = np.ones(len(loc), dtype=bool)
    last[:-1] = dst[loc[1:]] != dst[loc[:-1]]
    weight[loc] = np.minimum(gap_local[loc], 0.0)
    weight[loc[last]] = gap_local[loc[last]]
    wt = np.flatnonzero(is_wait)
    weight[wt] = np.minimum(mstart[dst[wt]] - nend[src[wt]], 0.0)
    has_local = np.zeros(n_all, dtype=bool)
    has_local[dst[loc]] = True

    # redirect members' local in-edges to their barrier, add barrier -> member edges
    if n_bar:
        inst_all = np.concatenate([inst, np.full(n_bar, -1)])
        into_member = (inst_all[dst] >= 0) & ~is_wait
        dst = dst.copy()
        dst[into_member] = n_real + inst_all[dst[into_member]]
        release_bar = np.full(n_bar, -np.inf)
        lone = member[~has_local[member]]
        np.maximum.at(release_bar, inst[lone], start[lone])
        bar_kind = np.where(np.isin(ckind[member], _P2P), EdgeKind.SEND_RECV, EdgeKind.COLLECTIVE_SYNC)
        src = np.concatenate([src, bar_of])
        dst = np.concatenate([dst, member])
        kind = np.concatenate([kind, bar_kind.astype(np.int8)])
        weight = np.concatenate([weight, np.minimum(mstart[member] - bar_start[inst[member]], 0.0)])
    release = np.where(has_local, -np.inf, mstart)
    if n_bar:
        release[member] = -np.inf
        release[n_real:] = release_bar

    def pad(a: np.ndarray, fill) -> np.ndarray:
        return np.concatenate([a, np.full(n_bar, fill, dtype=a.dtype)])

    bar_rank_names = n_bar and _barrier_names(ckind[member], inst[member], n_bar)
    bar_name = np.zeros(n_bar, dtype=np.int32)
    if n_bar:
        names = list(names)
        for i, label in enumerate(bar_rank_names):
            bar_name[i] = len(names)
            names.append(label)
    rank_n = np.concatenate([rank[node_rows], np.full(n_bar, -1, dtype=rank.dtype)])
    group = np.full(n_all, -1, dtype=np.int32)
    group[:n_real] = np.where(is_net, c["group_size"][node_rows], -1)
    if n_bar:
        counts = np.bincount(inst[member], minlength=n_bar)
        group[n_real:] = counts
        unknown = group[member] < 0
        group[member[unknown]] = counts[inst[member[unknown]]]
    bar_bytes = np.full(n_bar, np.nan)
    if n_bar:
        np.fmax.at(bar_bytes, inst[member], msg_bytes[member])
    nodes = {
        "rank": rank_n.astype(np.int32),
        "tid": np.concatenate([c["tid"][node_rows], np.full(n_bar, -1, dtype=np.int64)]),
        "on_gpu": pad(np.isin(ncls, _GPU_CLASSES), False),
        "name": np.concatenate([nname, bar_name]).astype(np.int32),
        "node_type": pad(node_type, np.int8(NodeType.NETWORK)),
        "category": pad(category, np.int8(Category.BARRIER)),
        "start": start,
        "dur": ndur,
        "mstart": mstart,
        "mdur": nend - mstart,
        "event": np.concatenate([rows[node_rows], np.full(n_bar, -1, dtype=np.int64)]).astype(np.int64),
        "msg_bytes": np.concatenate([msg_bytes, bar_bytes]),
        "group_size": group,
        "coll_kind": np.concatenate([ckind, np.array([_barrier_kind(ckind, inst, i) for i in range(n_bar)], dtype=np.int8)]),
    }
    edges = {"src": src.astype(np.int64), "dst": dst.astype(np.int64), "kind": kind.astype(np.int8), "weight": weight}
    g = ExecutionGraph(
        names=names,
        nodes=nodes,
        edges=edges,
        release=release,
        window_start=table.t0 + w0,
        step=step,
        measured=measured,
        meta={"files": {str(k): v for k, v in table.files.items()}},
    )
    g.validate()
    return g


def _barrier_kind(ckind: np.ndarray, inst: np.ndarray, i: int) -> int:
    members = np.flatnonzero(inst == i)
    return int(ckind[members[0]]) if len(members) else -1


def _barrier_names(kinds: np.ndarray, inst: np.ndarray, n_bar: int) -> list[str]:
    labels = []
    first = np.full(n_bar, -1)
    for j in range(len(inst) - 1, -1, -1):
        first[inst[j]] = kinds[j]
    for i in range(n_bar):
        k = int(first[i])
        labels.append(f"barrier:{CollectiveKind(k).name.lower() if k >= 0 else 'collective'}#{i}")
    return labels


def _flow_edges(table, w0, c, ts, rank, cpu_sorted, tk_sorted, tkey_cpu, cpu_rows, in_node, out_node, E) -> None:
    fl = table.flows
    if not len(fl["ts"]) or not len(cpu_sorted):
        return
    # flow endpoints bind to the outermost CPU event that starts at the flow's ts on its thread
    thread_of = {}
    for k, (r, p, t) in zip(
        tkey_cpu.tolist(), zip(rank[cpu_rows].tolist(), c["pid"][cpu_rows].tolist(), c["tid"][cpu_rows].tolist())
    ):
        thread_of.setdefault((r, p, t), k)
    fk = np.array(
        [thread_of.get((r, p, t), -1) for r, p, t in zip(fl["rank"].tolist(), fl["pid"].tolist(), fl["tid"].tolist())],
        dtype=np.int64,
    )
    fts = fl["ts"] - w0
    span = float(ts.max()) + 2.0 if len(ts) else 1.0
    key = tk_sorted * span + ts[cpu_sorted]
    fkey = fk * span + fts
    pos = np.minimum(np.searchsorted(key, fkey - 1e-3), len(key) - 1)
    ok = (fk >= 0) & (np.abs(key[pos] - fkey) <= 1e-3)
    ev = np.where(ok, cpu_sorted[pos], -1)
    starts = {}
    ends = {}
    for r, i, s, e in zip(fl["rank"].tolist(), fl["id"].tolist(), fl["is_start"].tolist(), ev.tolist()):
        if e < 0:
            continue
        (starts if s else ends)[(r, i)] = e
    pairs = [(starts[k], ends[k]) for k in starts if k in ends]
    if not pairs:
        return
    a = np.array(pairs, dtype=np.int64)
    src = out_node(a[:, 0])
    dst = in_node(a[:, 1])
    ok = (src >= 0) & (dst >= 0) & (ts[a[:, 1]] >= ts[a[:, 0]])  # a flow never runs back in time
    E.add(src[ok], dst[ok], EdgeKind.FWD_BWD)


def _sync_edges(c, ts, end, rank, cls, corr, gpu_rows, gpu_tk, launcher, n_leaf, ev2node, names, name, opt, E, blocking, wait_edges) -> None:
    """Sync call waits for the last GPU op launched before it; stream-wait-event orders streams."""
    gcorr = corr[gpu_rows]
    gstream = c["tid"][gpu_rows]
    gend = end[gpu_rows]
    grank = rank[gpu_rows]
    syncs = np.flatnonzero(cls == EvClass.GPU_SYNC)
    rt_rows = np.flatnonzero(cls == EvClass.RUNTIME)
    rt_by_corr = {(int(r), int(k)): int(i) for r, k, i in zip(rank[rt_rows], corr[rt_rows], rt_rows) if k >= 0}
    sync_src: list[int] = []
    sync_dst: list[int] = []
    order_src: list[int] = []
    order_dst: list[int] = []
    # per (rank) and per (rank, stream) GPU ops sorted by correlation (launch order)
    groups: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def group(key: tuple, mask: np.ndarray):
        if key not in groups:
            idx = np.flatnonzero(mask & (gcorr >= 0))
            idx = idx[np.argsort(gcorr[idx], kind="stable")]
            groups[key] = (idx, gcorr[idx], _prefix_argmax(gend[idx]))
        return groups[key]

    def last_before(key, mask, limit, latest_end: bool) -> int:
        idx, corrs, pam = group(key, mask)
        p = int(np.searchsorted(corrs, limit)) - 1
        if p < 0:
            return -1
        return int(idx[pam[p]] if latest_end else idx[p])

    ranks_with_sync = set(rank[syncs].tolist())
    for s in syncs.tolist():
        kind = int(c["sync_kind"][s])
        r = int(rank[s])
        caller = rt_by_corr.get((r, int(corr[s])))
        if kind in (0, 1):  # context / stream sync: the call blocks until the GPU (stream) drains
            if caller is None or ev2node[caller] < 0:
                continue
            if kind == 0:
                g = last_before((r,), grank == r, corr[s], True)
            else:
                st = int(c["stream"][s])
                g = last_before((r, st), (grank == r) & (gstream == st), corr[s], True)
            if g >= 0:
                sync_src.append(n_leaf + g)
                sync_dst.append(int(ev2node[caller]))
        elif kind == 2:  # event sync: blocking only for cudaEventSynchronize
            if caller is None or ev2node[caller] < 0 or "Synchronize" not in names[name[caller]]:
                continue
            ws, rec = int(c["wait_stream"][s]), int(c["wait_event_corr"][s])
            if ws < 0 or rec < 0:
                continue
            g = last_before((r, ws), (grank == r) & (gstream == ws), rec, False)
            if g >= 0:
                sync_src.append(n_leaf + g)
                sync_dst.append(int(ev2node[caller]))
        elif kind == 3:  # stream wait event: GPU-side order between streams
            st, ws, rec = int(c["stream"][s]), int(c["wait_stream"][s]), int(c["wait_event_corr"][s])
            if ws < 0 or rec < 0 or ws == st:
                continue
            g = last_before((r, ws), (grank == r) & (gstream == ws), rec, False)
            idx, corrs, _ = group((r, st), (grank == r) & (gstream == st))
            p = int(np.searchsorted(corrs, corr[s], side="right"))
            if g >= 0 and p < len(idx):
                order_src.append(n_leaf + g)
                order_dst.append(n_leaf + int(idx[p]))
    # traces without cuda_sync events: blocking sync calls wait for the whole device
    blocking_names = {i for i, n in enumerate(names) if n in opt.blocking_sync_calls}
    if blocking_names:
        calls = np.flatnonzero((cls == EvClass.RUNTIME) & np.isin(name, list(blocking_names)) & ~np.isin(rank, list(ranks_with_sync)))
        for call in calls.tolist():
            if ev2node[call] < 0:
                continue
            r = int(rank[call])
            g = last_before((r,), grank == r, corr[call], True) if corr[call] >= 0 else -1
            if g >= 0:
                sync_src.append(n_leaf + g)
                sync_dst.append(int(ev2node[call]))
    if sync_src:
        s_arr = np.array(sync_src, dtype=np.int64)
        d_arr = np.array(sync_dst, dtype=np.int64)
        E.add(s_arr, d_arr, EdgeKind.SYNC)
        blocking[d_arr] = True
        wait_edges.append((s_arr, d_arr))
    if order_src:
        E.add(np.array(order_src), np.array(order_dst), EdgeKind.SYNC)


def _backend_edges(c, ts, end, rank, name, flags, node_rows, is_net, leaf_rows, leaf_tk, ev_tk, out_node, opt, E) -> None:
    """gloo: the k-th c10d op of a kind and size on a rank enqueues the k-th backend op of them."""
    net_nodes = np.flatnonzero(is_net & flags["gloo"][name[node_rows]])
    if not len(net_nodes):
        return
    c10d_ev = np.flatnonzero(flags["c10d"][name] & (flags["coll"][name] >= 0) & (ev_tk >= 0))
    nelems = c["msg_nelems"]

    def key_of(ev: np.ndarray) -> list[tuple]:
        ne = np.where(np.isnan(nelems[ev]), -1, nelems[ev]).astype(np.int64)
        return list(zip(rank[ev].tolist(), flags["coll"][name[ev]].tolist(), ne.tolist()))

    def by_key(ev: np.ndarray) -> dict[tuple, list[int]]:
        out: dict[tuple, list[int]] = {}
        for k, e in sorted(zip(key_of(ev), ev.tolist()), key=lambda x: (x[0], ts[x[1]])):
            out.setdefault(k, []).append(e)
        return out

    calls = by_key(c10d_ev)
    works = by_key(node_rows[net_nodes])
    src_ev, dst_ev = [], []
    for k, wl in works.items():
        cl = calls.get(k, [])
        for call, work in zip(cl, wl):
            if ts[call] <= ts[work] + 1e-6:
                src_ev.append(call)
                dst_ev.append(work)
    if not src_ev:
        return
    src_ev_a = np.array(src_ev, dtype=np.int64)
    node_of_row = {int(r): i for i, r in enumerate(node_rows.tolist())}
    dst_nodes = np.array([node_of_row[d] for d in dst_ev], dtype=np.int64)
    E.add(out_node(src_ev_a), dst_nodes, EdgeKind.BACKEND)

    # completion -> the op the calling thread resumes with after idling across it
    leaf_ts = ts[leaf_rows]
    leaf_end = end[leaf_rows]
    feed_src, feed_dst = [], []
    for call, work in zip(src_ev, dst_nodes.tolist()):
        t = ev_tk[call]
        e_work = end[node_rows[work]]
        lo = np.searchsorted(leaf_tk, t, side="left")
        hi = np.searchsorted(leaf_tk, t, side="right")
        p = lo + int(np.searchsorted(leaf_ts[lo:hi], e_work, side="left"))
        if p >= hi or p == lo:
            continue
        resume = leaf_ts[p] - e_work
        idle = leaf_ts[p] - leaf_end[p - 1]
        if leaf_end[p - 1] < e_work and resume <= opt.feeds_resume_us and idle > 2 * resume:
            feed_src.append(work)
            feed_dst.append(p)
    if feed_src:
        E.add(np.array(feed_src), np.array(feed_dst), EdgeKind.FEEDS)


def _match_collectives(rank, ts, ckind, is_net, pg, nelems) -> np.ndarray:
    """Instance id per network node (-1 if alone): the k-th op of one kind, group and size
    on each rank is the same collective. Send on one rank pairs with recv on another."""
    inst = np.full(len(rank), -1, dtype=np.int64)
    net = np.flatnonzero(is_net)
    if len(np.unique(rank[net])) < 2:
        return inst
    ne = np.where(np.isnan(nelems[net]), -1, nelems[net]).astype(np.int64)
    kind = ckind[net].astype(np.int64)
    p2p = np.isin(kind, _P2P)
    occ: dict[tuple, list[tuple[float, int]]] = {}
    for i, r, k, g, m, t, is_p in zip(net.tolist(), rank[net].tolist(), kind.tolist(), pg[net].tolist(), ne.tolist(), ts[net].tolist(), p2p.tolist()):
        occ.setdefault((r, k, g, m), []).append((t, i))
    groups: dict[tuple, list[int]] = {}
    for (r, k, g, m), lst in occ.items():
        lst.sort()
        for j, (_, i) in enumerate(lst):
            if k in (CollectiveKind.SEND, CollectiveKind.RECV):
                groups.setdefault(("p2p", g, m, j), []).append(i)
            else:
                groups.setdefault((k, g, m, j), []).append(i)
    n = 0
    for key, members in groups.items():
        ranks = {int(rank[i]) for i in members}
        if len(ranks) < 2 or len(ranks) != len(members):
            continue
        if key[0] == "p2p":
            kinds = {int(ckind[i]) for i in members}
            if kinds != {int(CollectiveKind.SEND), int(CollectiveKind.RECV)} or len(members) != 2:
                continue
        inst[members] = n
        n += 1
    return inst


def build_graphs(table: EventTable, steps: list[int] | None = None, options: BuildOptions | None = None) -> list[ExecutionGraph]:
    """One graph per ProfilerStep present on any rank (or one for the whole trace)."""
    numbers = sorted({s.number for s in table.steps})
    if steps is not None:
        missing = sorted(set(steps) - set(numbers))
        if missing:
            raise GraphError(f"no ProfilerStep#{missing[0]} in the trace (steps present: {numbers or 'none'})")
        numbers = sorted(steps)
    if not numbers:
        return [build_graph(table, None, options)]
    return [build_graph(table, n, options) for n in numbers]


"""The events of one analysis window and the node set drawn from them.

A window is one ProfilerStep on every rank (the CPU events that start within the step's span
on that rank and the GPU ops they launched, wherever those ran) or the whole trace. Nodes are the
leaf slices of each CPU thread's op tree, every GPU op and every backend op (gloo:*,
kept off the leaf chain: an async op's span overlaps its thread's later work); parent
ops are mapped onto their first leaf (edges into them) or last leaf (edges out of them).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from bottleneck_oracle.errors import GraphError
from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline.arrays import in_read_order, isin_small, isin_sorted
from bottleneck_oracle.graph_pipeline.events import DEVICE_WAIT_NAME, EvClass, EventTable, Step
from bottleneck_oracle.graph_pipeline.facts import C10D_CALL_NAME, COLLECTIVE_WAIT_NAME, HOST_BLOCKED_NAME, synchronous_launches
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, NodeType, collective_kind

GPU_CLASSES = (EvClass.KERNEL, EvClass.MEMCPY, EvClass.MEMSET)
# runtime calls that block the host until device work completes: any synchronize (CUDA, HIP, the
# driver's, other vendors' ``synchronizeStream``, ``zeEventHostSynchronize``) and the other
# vendors' waits (fields.HOST_WAIT_PATTERN: ``urQueueFinish``, ``clFinish``); copies and sets are
# decided from their timing, polling loops of queries from their run length, launches into a full
# queue from the queue (see make_window)
SYNC_NAME = re.compile(r"synchroni[sz]e|" + F.HOST_WAIT_PATTERN, re.IGNORECASE)
COPY_NAME = re.compile(F.COPY_CALL_PATTERN, re.IGNORECASE)
QUERY_NAME = re.compile(r"(event|stream)query", re.IGNORECASE)
LOCK_WAIT_NAME = re.compile(F.LOCK_WAIT_PATTERN)
FUNCTIONAL_NAME = re.compile(F.FUNCTIONAL_COLLECTIVE_PATTERN)
POLL_MIN_CALLS = 3  # consecutive query calls on a thread, nothing else between them: a polling loop
P2P_KINDS = (CollectiveKind.SEND, CollectiveKind.RECV)
UNEVEN_KINDS = (CollectiveKind.ALL_TO_ALL, CollectiveKind.GATHER, CollectiveKind.SCATTER)
"""Collectives whose message size differs between ranks and between a call and its backend op by
design (an all-to-all's uneven splits — a mixture-of-experts' token exchange —, whose c10d call's
first input is its output; a gather's or scatter's root): matched by kind and place alone."""
_CLASS_CATEGORY = np.array([Category.CPU_OP, Category.RUNTIME, Category.KERNEL, Category.MEMCPY, Category.MEMSET], dtype=np.int8)


def select_window(table: EventTable, step: int | None, span: int = 1) -> tuple[np.ndarray, float, dict[int, float], list[Step]]:
    """Rows of the events in one ProfilerStep (all ranks), its start, measured spans and steps;
    with ``span`` > 1, of that step and the ``span - 1`` steps after it that are in the trace (a
    window over consecutive steps: a path can cross the step boundary; the measured spans are the
    first step's).

    A step is every CPU event that starts within its ProfilerStep span on that rank and the GPU
    ops those launched (joined on correlation ids), even where the GPU ran them after the span:
    GPU work belongs to the step whose CPU launched it. GPU ops whose launch is not in the trace
    belong to the step they start in. With ``step=None`` the whole trace is one window.
    """
    c = table.cols
    if step is None:
        ts, end = c["ts"], c["ts"] + c["dur"]
        measured = {}
        for r in table.ranks:
            m = c["rank"] == r
            measured[r] = float(end[m].max() - ts[m].min())
        return in_read_order(np.arange(len(table)), table.layout), float(ts.min()), measured, []
    steps = [s for k in range(step, step + span) for s in table.steps_of(k)]
    first = [s for s in steps if s.number == step]
    if not first:
        raise GraphError(f"no ProfilerStep#{step} in the trace")
    steps.sort(key=lambda s: (s.number, s.rank))
    rows = in_read_order(np.concatenate([table.rows_between(s.rank, s.start, s.end) for s in steps]), table.layout)
    return rows, min(s.start for s in first), {s.rank: s.span for s in first}, steps


class Columns(Mapping[str, np.ndarray]):
    """A window's columns (the table's, at the window's rows, then its step-end markers), each
    gathered from the table when first read: a large step's window is gigabytes, and the columns
    no rule reads are never copied (nor the table's pages of them touched)."""

    def __init__(self, cols: dict[str, np.ndarray], rows: np.ndarray, extra: dict[str, np.ndarray] | None = None) -> None:
        self._cols, self._rows, self._extra = cols, rows, extra
        self._got: dict[str, np.ndarray] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        got = self._got.get(key)
        if got is None:
            got = self._got[key] = self._gather(key)
        return got

    def _gather(self, key: str) -> np.ndarray:
        v, rows = self._cols[key], self._rows
        if self._extra is None:
            return v[rows]
        extra = self._extra[key]
        col = np.empty(len(rows) + len(extra), dtype=np.result_type(v.dtype, extra.dtype))  # one copy, room for the markers
        if col.dtype == v.dtype:
            np.take(v, rows, out=col[: len(rows)])
        else:  # (a float32 column beside its float64 markers)
            col[: len(rows)] = v[rows]
        col[len(rows) :] = extra
        return col

    def forget(self, keep: tuple[str, ...]) -> None:
        """Let the gathered columns not in ``keep`` go (gathered again if read again)."""
        self._got = {k: v for k, v in self._got.items() if k in keep}

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def __len__(self) -> int:
        return len(self._cols)


def _with_step_ends(table: EventTable, rows: np.ndarray, steps: list[Step]) -> tuple[Columns, np.ndarray, list[str]]:
    """The window's columns plus one zero-duration marker per rank at its step's end, on the
    thread of the ProfilerStep span: the framework time after the last op is part of the step."""
    if not steps:
        return Columns(table.cols, rows), rows, table.names
    names = [*table.names, f"{F.STEP_PREFIX}{steps[0].number} end"]
    k = len(steps)
    extra = {key: np.full(k, F.ARG_SPECS[key].default if key in F.ARG_SPECS else -1, dtype=v.dtype) for key, v in table.cols.items()}
    extra.update(
        rank=np.array([s.rank for s in steps], dtype=table.cols["rank"].dtype),
        pid=np.array([s.pid for s in steps], dtype=np.int64),
        tid=np.array([s.tid for s in steps], dtype=np.int64),
        ts=np.array([s.end for s in steps], dtype=np.float64),
        dur=np.zeros(k),
        cls=np.full(k, EvClass.CPU, dtype=np.int8),
        elem_bytes=np.full(k, np.nan),
        name=np.full(k, len(names) - 1, dtype=np.int32),
        is_range=np.zeros(k, dtype=bool),
    )
    return Columns(table.cols, rows, extra), np.concatenate([rows, np.full(k, -1, dtype=np.int64)]), names


def dense_ids(*cols: np.ndarray) -> np.ndarray:
    """Dense integer id per distinct tuple of the given integer columns, ordered like the tuples."""
    n = len(cols[0])
    if not n:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(cols[::-1])  # by the first column, then the next, ...
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for col in cols:
        s = col[order]
        new[1:] |= s[1:] != s[:-1]
    out = np.empty(n, dtype=np.int64)
    out[order] = np.cumsum(new) - 1
    return out


@dataclass(slots=True)
class Window:
    """Columns of one window's events (times in µs from the window start) and its nodes."""

    step: int | None
    w0: float  # table-relative µs of the window start
    measured: dict[int, float]
    steps: list[Step]
    rows: np.ndarray  # EventTable row of each window event (-1 for step-end markers)
    c: Columns
    names: list[str]
    ts: np.ndarray
    end: np.ndarray
    # per-name lookups
    name_coll: np.ndarray  # CollectiveKind per name (-1: none)
    name_gloo: np.ndarray  # gloo backend op
    name_nccl: np.ndarray  # NCCL kernel
    name_c10d: np.ndarray  # c10d collective call (not a wait)
    name_blocked: np.ndarray  # a Python call that blocks its thread (fields.HOST_BLOCKED_PATTERN)
    name_lock: np.ndarray  # of those, a wait another thread of the process ends (fields.LOCK_WAIT_PATTERN)
    name_queue_wait: np.ndarray  # a device op that is its queue waiting (fields.DEVICE_WAIT_PATTERN)
    name_coll_wait: np.ndarray  # a functional collective's wait (fields.COLLECTIVE_WAIT_PATTERN)
    name_functional: np.ndarray  # a functional collective's op, its c10d call inside (fields.FUNCTIONAL_COLLECTIVE_PATTERN)
    # CPU threads
    cpu_rows: np.ndarray
    cpu_sorted: np.ndarray  # the CPU rows sorted by (thread, ts, -dur): outermost op first
    ev_thread: np.ndarray  # dense thread key per event (-1 for GPU events)
    leaf_rows: np.ndarray  # sorted by (thread, ts)
    leaf_thread: np.ndarray
    # GPU streams
    gpu_rows: np.ndarray  # sorted by (stream, ts)
    gpu_stream: np.ndarray
    # backend ops (gloo:*), after the GPU ops in the node order
    backend_rows: np.ndarray  # sorted by (thread, ts)
    backend_lane: np.ndarray
    staged_prev: np.ndarray  # per backend op: the leaf before its exchange, when it stages CUDA tensors on its thread (-1: none)
    staged_next: np.ndarray  # the leaf after its exchange (-1: none)
    # nodes (leaves first, then GPU ops)
    node_rows: np.ndarray
    ev2node: np.ndarray
    is_net: np.ndarray
    ckind: np.ndarray  # CollectiveKind per node (-1 for compute)
    carry: np.ndarray  # µs per node: when the op before it on its GPU stream, launched in an earlier step, ended (-inf: none)
    lead_from: np.ndarray  # µs per event: its rank's step start
    blocking: np.ndarray  # per event: a runtime call that blocks until device work completes (sync, blocking copy, polling loop)
    copy_op: np.ndarray  # per event: for a blocking copy or set call, the window event of its device op (-1: none)
    polls: np.ndarray  # per event: how many query calls a merged polling loop holds (0: not one)
    queued: np.ndarray  # per event: a launch that waited for room in a full device queue (EventTable.queue_waits)
    implicit: np.ndarray  # per event: a call that waited for its device without saying so (_implicit_waits: a free as the device drained)
    slot_op: np.ndarray  # per event: for a launch that waited for room in a full device queue, the window event of the op that made room (-1: none, or outside the window)
    origins: dict[int, float]  # µs per rank: where its step's period starts (facts.py), from the window start
    codes: tuple[dict[str, list[int]], int] | None = None  # the table's name -> codes, for names[:n] (None: none)

    def let_go(self) -> None:
        """Drop what only the edge rules read (per-event look-ups, the thread and stream orders, the
        columns the graph does not carry): a large step's window is gigabytes, and the graph's
        columns are made after the rules. The window keeps its nodes, their classes and the
        columns the graph copies; reading anything else afterwards is an error."""
        gone = np.zeros(0, dtype=np.int64)
        for name in _RULES_ONLY:
            setattr(self, name, gone)
        self.c.forget(_GRAPH_COLUMNS)

    def codes_of(self, wanted: tuple[str, ...]) -> list[int]:
        """The codes of the names in ``wanted``, ascending: from the table's index of its names,
        and a scan of the window's own names after them (the step-end marker)."""
        index, n = self.codes if self.codes is not None else ({}, 0)
        found = [i for name in set(wanted) for i in index.get(name, ())]
        return sorted(found + [i for i, name in enumerate(self.names[n:], n) if name in wanted])

    @property
    def n_leaf(self) -> int:
        return len(self.leaf_rows)

    @property
    def n_nodes(self) -> int:
        return len(self.node_rows)

    def _leaf_key(self, thread: np.ndarray, t: np.ndarray) -> np.ndarray:
        span = float(self.end.max()) + 1.0 if len(self.end) else 1.0
        return thread * span + t

    def in_node(self, ev: np.ndarray) -> np.ndarray:
        """Node an edge into event ``ev`` lands on: itself, or the first leaf inside it."""
        return self._representative(np.asarray(ev, dtype=np.int64), first=True)

    def out_node(self, ev: np.ndarray) -> np.ndarray:
        """Node an edge out of event ``ev`` leaves from: itself, or the last leaf inside it."""
        return self._representative(np.asarray(ev, dtype=np.int64), first=False)

    def _representative(self, ev: np.ndarray, first: bool) -> np.ndarray:
        direct = self.ev2node[ev]
        out = direct.copy()
        cpu = np.flatnonzero((direct < 0) & (self.ev_thread[ev] >= 0))
        if not len(cpu) or not self.n_leaf:
            return out
        e = ev[cpu]
        keys = self._leaf_key(self.leaf_thread, self.ts[self.leaf_rows])
        if first:
            pos = np.minimum(np.searchsorted(keys, self._leaf_key(self.ev_thread[e], self.ts[e]), side="left"), self.n_leaf - 1)
            good = (self.leaf_thread[pos] == self.ev_thread[e]) & (self.ts[self.leaf_rows[pos]] < self.end[e] + 1e-9)
        else:
            pos = np.maximum(np.searchsorted(keys, self._leaf_key(self.ev_thread[e], self.end[e]), side="left") - 1, 0)
            good = (self.leaf_thread[pos] == self.ev_thread[e]) & (self.ts[self.leaf_rows[pos]] >= self.ts[e] - 1e-9)
        out[cpu] = np.where(good, pos, -1)
        return out

    # node-level columns
    def node_category(self) -> np.ndarray:
        cat = _CLASS_CATEGORY[np.minimum(self.c["cls"][self.node_rows], 4)].copy()
        cat[self.blocking[self.node_rows]] = Category.BLOCKING
        net = self.is_net
        cat[net] = np.where(isin_small(self.ckind[net], P2P_KINDS), Category.P2P, Category.COLLECTIVE)
        return cat

    def node_type(self) -> np.ndarray:
        return np.where(self.is_net, NodeType.NETWORK, NodeType.COMPUTE).astype(np.int8)

    def msg_bytes(self) -> np.ndarray:
        elem = self.c["elem_bytes"][self.node_rows]
        elem = np.where(np.isnan(elem), 4.0, elem)  # fp32 when the trace does not say
        return np.where(self.is_net, self.c["msg_nelems"][self.node_rows] * elem, np.nan)


_RULES_ONLY = (
    "ts",
    "cpu_rows",
    "cpu_sorted",
    "ev_thread",
    "leaf_rows",
    "leaf_thread",
    "gpu_rows",
    "gpu_stream",
    "backend_rows",
    "backend_lane",
    "staged_prev",
    "staged_next",
    "ev2node",
    "lead_from",
    "copy_op",
    "polls",
    "queued",
    "implicit",
    "slot_op",
)
"""The Window's arrays that ``let_go`` drops."""
_GRAPH_COLUMNS = ("rank", "tid", "cls", "name", "dur", "elem_bytes", "msg_nelems", "group_size")
"""The columns the graph's nodes copy (builder._finish), kept by ``let_go``."""


def _name_lookups(table: EventTable, names: list[str]) -> dict[str, np.ndarray]:
    """Per name of ``names`` (the table's names and the window's step-end marker after them):
    name_flags and whether it matches SYNC_NAME, COPY_NAME, QUERY_NAME. The table's part is
    computed once per table (every step reads the same thousands of names), the rest here."""
    n_table = len(table.names)
    cached = table.lookups.get("names")
    if cached is None or cached[0] != n_table:
        cached = table.lookups["names"] = (n_table, _flags_of(table.names))
        codes: dict[str, list[int]] = {}
        for i, n in enumerate(table.names):
            codes.setdefault(n, []).append(i)
        table.lookups["codes"] = codes
    extra = names[n_table:]
    if not extra:
        return cached[1]
    more = _flags_of(extra)
    return {k: np.concatenate([v, more[k]]) for k, v in cached[1].items()}


def table_lookups(table: EventTable) -> None:
    """Compute the table's name look-ups (before the table is shared with workers)."""
    _name_lookups(table, table.names)


def _flags_of(names: list[str]) -> dict[str, np.ndarray]:
    coll, gloo, nccl, c10d = name_flags(names)
    return {
        "coll": coll,
        "gloo": gloo,
        "nccl": nccl,
        "c10d": c10d,
        "sync": np.array([bool(SYNC_NAME.search(n)) for n in names], dtype=bool),
        "copy": np.array([bool(COPY_NAME.search(n)) for n in names], dtype=bool),
        "query": np.array([bool(QUERY_NAME.search(n)) for n in names], dtype=bool),
        # Python calls that block their thread, and of those the waits another thread ends (fields.py)
        "blocked": np.array([n.startswith("<built-in") and bool(HOST_BLOCKED_NAME.search(n)) for n in names], dtype=bool),
        "lock": np.array([n.startswith("<built-in") and bool(LOCK_WAIT_NAME.search(n)) for n in names], dtype=bool),
        # a device op that is its queue waiting for another stream (fields.DEVICE_WAIT_PATTERN)
        "queue_wait": np.array([bool(DEVICE_WAIT_NAME.match(n)) for n in names], dtype=bool),
        # a functional collective's wait (fields.COLLECTIVE_WAIT_PATTERN)
        "coll_wait": np.array([bool(COLLECTIVE_WAIT_NAME.match(n)) for n in names], dtype=bool),
        # a functional collective's op (fields.FUNCTIONAL_COLLECTIVE_PATTERN)
        "functional": np.array([bool(FUNCTIONAL_NAME.match(n)) for n in names], dtype=bool),
    }


def name_flags(names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per name: its CollectiveKind (-1: none), whether it is a gloo backend op, an NCCL kernel,
    a c10d call that is not a wait."""
    lower = [n.lower() for n in names]
    return (
        np.array([collective_kind(n) for n in names], dtype=np.int8),
        np.array([n.startswith(F.CPU_BACKEND_PREFIXES) for n in lower], dtype=bool),
        np.array([n.startswith("nccl") and "kernel" in n for n in lower], dtype=bool),
        np.array([bool(C10D_CALL_NAME.match(n)) for n in names], dtype=bool),
    )


def collective_kinds(c: Mapping[str, np.ndarray], rows: np.ndarray, name_coll: np.ndarray) -> np.ndarray:
    """Per row of ``rows`` (network ops): the CollectiveKind its name names (``name_coll`` per name
    code); where the name names none (NCCL 2.19 and later run every collective in
    ``ncclDevKernel_Generic``), the one its args name ("Collective name", recent PyTorch); for a
    device op with neither, the one the CPU op of its rank with the same External id names (the
    record_param_comms that launched it). -1 where nothing does. NCCL runs a send, a receive, an
    all-to-all and a batch of sends and receives each in one ``SendRecv`` kernel: where the kernel
    or the op that launched it says it is one send or one receive, it is that (a pair of two
    ranks, not a collective of every rank making such calls)."""
    kind = name_coll[c["name"][rows]].astype(np.int8)
    unnamed = kind < 0
    vague = kind == CollectiveKind.SEND_RECV
    if not (unnamed.any() or vague.any()):
        return kind
    own = c["coll_kind"][rows]
    one_way = (own == CollectiveKind.SEND) | (own == CollectiveKind.RECV)
    kind = np.where(unnamed | (vague & one_way), own, kind).astype(np.int8)
    lacking = np.flatnonzero(((kind < 0) | (vague & ~one_way)) & (c["cls"][rows] != EvClass.CPU))
    if len(lacking):
        launched = launching_op_values(c, rows[lacking], "coll_kind")
        take = (kind[lacking] < 0) | (launched == CollectiveKind.SEND) | (launched == CollectiveKind.RECV)
        kind[lacking[take]] = launched[take]
    return kind


def launching_op_values(c: Mapping[str, np.ndarray], rows: np.ndarray, col: str) -> np.ndarray:
    """Per row of ``rows``: column ``col`` (an id or a code, -1 where unknown) of the CPU op of its
    rank with the same External id that has one (the record_param_comms that launched a
    collective's kernel); -1 where there is none (or the row has no External id)."""
    out = np.full(len(rows), -1, dtype=np.int64)
    ask = np.flatnonzero(c["ext_id"][rows] >= 0)
    if not len(ask):
        return out
    known = np.flatnonzero((c[col] >= 0) & (c["cls"] == EvClass.CPU) & (c["ext_id"] >= 0))
    if len(known):
        lookup = dict(zip(zip(c["rank"][known].tolist(), c["ext_id"][known].tolist()), c[col][known].tolist()))
        at = rows[ask]
        out[ask] = [lookup.get(key, -1) for key in zip(c["rank"][at].tolist(), c["ext_id"][at].tolist())]
    return out


def is_network(name: np.ndarray, cls: np.ndarray, gloo: np.ndarray, nccl: np.ndarray) -> np.ndarray:
    """Events that are network ops: a gloo backend op on the CPU, an NCCL kernel on the GPU
    (``gloo`` and ``nccl`` per name code, from name_flags)."""
    return (gloo[name] & (cls == EvClass.CPU)) | (nccl[name] & (cls == EvClass.KERNEL))


def _stage_exchanges(
    c: Mapping[str, np.ndarray],
    ts: np.ndarray,
    end: np.ndarray,
    back: np.ndarray,
    cpu_rows: np.ndarray,
    thread: np.ndarray,
    srt: np.ndarray,
    th: np.ndarray,
    leaf: np.ndarray,
    callers: frozenset[int] = frozenset(),
) -> tuple[np.ndarray, np.ndarray]:
    """Backend ops whose span holds CUDA runtime calls of their own thread (and no other leaf op),
    or any ops of a thread that makes no c10d call (the backend's own worker, ``pt_gloo_runloop``:
    ``callers`` are the threads that do): gloo's algorithms for CUDA tensors copy the tensor to
    host memory and wait for the copy (``cudaMemcpyAsync``, ``cudaStreamSynchronize``), exchange
    it with the peers, then copy it back (``aten::copy_``), all inside ``gloo:all_reduce`` on the
    backend's thread; its all-gather of CPU tensors (FSDP's) copies the shard in and the gathered
    tensor out (``aten::copy_``) around the exchange. The exchange,
    and the wait for the last peer in it, is the op's longest stretch with no other event of the
    thread open: the op's span shrinks to that stretch (``ts``, ``end`` and ``c["dur"]`` in
    place), and the leaves before and after it are returned (leaf positions, -1: none) so that the
    thread's program runs through the exchange, not through a fixed gap that already holds the
    wait for the peer; on a worker thread the exchange is a stretch before an op inside (the copy
    out), never the stretch after the last one: a descheduled worker closes its span late, and
    that idle end is no exchange (its peer's exchange ended before it). ``srt``/``th``: the CPU
    events sorted by (thread, ts, -dur) and their
    threads; ``leaf``: which of them are leaves."""
    prev = np.full(len(back), -1, dtype=np.int64)
    nxt = np.full(len(back), -1, dtype=np.int64)
    if not len(back) or not leaf.any():
        return prev, nxt
    uniq, first = np.unique(thread, return_index=True)
    if not (c["cls"][cpu_rows] == EvClass.RUNTIME).any() and len(callers) == len(uniq):
        return prev, nxt  # nothing to stage: CPU-only traces with no backend worker stop here, before any per-thread work
    first_row = cpu_rows[first]
    key_of = {(int(r), int(p), int(t)): int(u) for u, r, p, t in zip(uniq, c["rank"][first_row], c["pid"][first_row], c["tid"][first_row])}
    leaf_pos = np.cumsum(leaf) - 1  # position of each sorted event among the leaves
    sts, send = ts[srt], end[srt]
    for k, b in enumerate(back.tolist()):
        t = key_of.get((int(c["rank"][b]), int(c["pid"][b]), int(c["tid"][b])))
        if t is None:
            continue
        lo = int(np.searchsorted(th, t, side="left"))
        hi = int(np.searchsorted(th, t, side="right"))
        a = lo + int(np.searchsorted(sts[lo:hi], ts[b] - 1e-6, side="left"))
        z = lo + int(np.searchsorted(sts[lo:hi], end[b] + 1e-6, side="right"))
        inside = [q for q in range(a, z) if send[q] <= end[b] + 1e-6]
        leaves = [q for q in inside if leaf[q]]
        worker = t not in callers
        if not leaves or (not worker and any(c["cls"][srt[q]] != EvClass.RUNTIME for q in leaves)):
            continue  # not a staging (an async CPU send's span on the calling thread holds the thread's later work)
        best, lo_t, hi_t, busy = -1.0, ts[b], ts[b], ts[b]
        for q in inside:  # stretches with nothing open, in time order (events are sorted, outermost first)
            if sts[q] - busy > best:
                best, lo_t, hi_t = sts[q] - busy, busy, sts[q]
            busy = max(busy, send[q])
        if end[b] - busy > best and (not worker or best < 0.0):
            # (the stretch after the last op inside is the exchange only where nothing is copied out
            # after it: on a worker thread, whose op copies the result out, it is the span closed late)
            lo_t, hi_t = busy, end[b]
        before = [q for q in leaves if send[q] <= lo_t + 1e-6]
        after = [q for q in leaves if sts[q] >= hi_t - 1e-6]
        prev[k] = leaf_pos[before[-1]] if before else -1
        nxt[k] = leaf_pos[after[0]] if after else -1
        ts[b], end[b] = lo_t, hi_t
        c["dur"][b] = hi_t - lo_t
    return prev, nxt


LEAF_OVERLAP_US = 0.005
"""An op whose next op on its thread starts at most this long before it ends is still a leaf: a
start and an end rounded apart to the ns overlap by one (pytorch#122425)."""


def _leaves(cpu_rows: np.ndarray, c: Mapping[str, np.ndarray], ts: np.ndarray, end: np.ndarray):
    """CPU events sorted by (thread, ts, -dur), their dense thread ids, and which are leaves (the
    next event on the thread starts at or after its end: leaves of a thread never overlap)."""
    thread = dense_ids(c["rank"][cpu_rows], c["pid"][cpu_rows], c["tid"][cpu_rows])
    order = np.lexsort((-c["dur"][cpu_rows], ts[cpu_rows], thread))
    srt, th = cpu_rows[order], thread[order]
    nxt_same = np.zeros(len(srt), dtype=bool)
    nxt_same[:-1] = th[1:] == th[:-1]
    nxt_ts = np.full(len(srt), np.inf)
    nxt_ts[:-1] = ts[srt[1:]]
    leaf = ~nxt_same | (nxt_ts >= end[srt] - LEAF_OVERLAP_US)
    return thread, srt, th, leaf


def _polling_loops(
    c: Mapping[str, np.ndarray], is_query: np.ndarray, srt: np.ndarray, th: np.ndarray, leaf: np.ndarray
) -> list[np.ndarray]:
    """Runs of at least POLL_MIN_CALLS consecutive leaves of a thread that are all event or stream
    queries (``while not event.query(): pass``; ``is_query`` per name code): each run's events,
    in time order."""
    lf = srt[leaf]
    if not len(lf):
        return []
    q = (c["cls"][lf] == EvClass.RUNTIME) & is_query[c["name"][lf]]
    if q.sum() < POLL_MIN_CALLS:
        return []
    lth = th[leaf]
    runs, k = [], 0
    while k < len(lf):
        if not q[k]:
            k += 1
            continue
        j = k
        while j + 1 < len(lf) and q[j + 1] and lth[j + 1] == lth[k]:
            j += 1
        if j - k + 1 >= POLL_MIN_CALLS:
            runs.append(lf[k : j + 1])
        k = j + 1
    return runs


def _blocking_copies(
    c: Mapping[str, np.ndarray], is_copy: np.ndarray, ts: np.ndarray, end: np.ndarray, tol: float, synchronous: np.ndarray
) -> np.ndarray:
    """Per event, the device op of a copy or set call that returned only after that op ended
    (a copy to pageable host memory, ``cudaMemcpy``, ``hipMemcpyWithStream``: what ``.item()``,
    ``.cpu()`` and ``.tolist()`` do), -1 otherwise (``is_copy`` per name code: COPY_NAME); on the
    ``synchronous`` ranks (facts.synchronous_launches: their launches wait for their work), of any
    launch that did. Joined on the correlation id."""
    out = np.full(len(ts), -1, dtype=np.int64)
    kind = is_copy[c["name"]] | (isin_small(c["rank"], synchronous) if len(synchronous) else False)
    calls = np.flatnonzero((c["cls"] == EvClass.RUNTIME) & kind & (c["correlation"] >= 0))
    ops = np.flatnonzero(isin_small(c["cls"], GPU_CLASSES) & (c["correlation"] >= 0))
    if not len(calls) or not len(ops):
        return out
    key = c["rank"][ops].astype(np.int64) * (1 << 40) + c["correlation"][ops]
    order = np.argsort(key, kind="stable")
    ops, key = ops[order], key[order]
    ckey = c["rank"][calls].astype(np.int64) * (1 << 40) + c["correlation"][calls]
    pos = np.minimum(np.searchsorted(key, ckey), len(ops) - 1)
    op = ops[pos]
    # the op ran inside the call: it started after the call did (its clock may be ``tol`` µs off)
    # and ended before the call returned (a copy that ended later ran on after an async call)
    hit = (key[pos] == ckey) & (end[op] <= end[calls]) & (ts[op] >= ts[calls] - tol) & (end[op] >= ts[calls])
    out[calls[hit]] = op[hit]
    return out


IMPLICIT_MIN_US = 100.0  # µs: a runtime call this long that returned as its device drained waited for it ...
IMPLICIT_WAKE_US = 50.0  # ... if it returned within this after the device's last op ended


def _implicit_waits(c: Mapping[str, np.ndarray], ts: np.ndarray, end: np.ndarray, blocking: np.ndarray, is_query: np.ndarray) -> np.ndarray:
    """Per event, whether it is a runtime call that waited for its device without saying so: a
    call that launched nothing (no device op shares its correlation id), not already a wait,
    lasting IMPLICIT_MIN_US or more, that began while a device op of its rank ran and returned
    within IMPLICIT_WAKE_US after the last op of its rank started before its return had ended —
    it returned as the device drained. ``cudaFree`` and ``hipFree`` synchronize the device so (the
    caching allocator frees memory under pressure, ``torch.cuda.empty_cache()``); so may an
    allocation, a host-memory allocation or a module load. A slow call of the host's own that
    does not end as the device drains is not one (no trace here has either: every long free in
    them began with the device idle)."""
    out = np.zeros(len(ts), dtype=bool)
    cls, rank, corr = c["cls"], c["rank"], c["correlation"]
    calls = np.flatnonzero((cls == EvClass.RUNTIME) & ~blocking & ~is_query[c["name"]] & (c["dur"] >= IMPLICIT_MIN_US))
    dev = np.flatnonzero(isin_small(cls, GPU_CLASSES))
    if not len(calls) or not len(dev):
        return out
    launched = np.unique(rank[dev].astype(np.int64) * (1 << 40) + corr[dev])
    own = isin_sorted(rank[calls].astype(np.int64) * (1 << 40) + corr[calls], launched) & (corr[calls] >= 0)
    calls = calls[~own]
    for r in np.unique(rank[calls]).tolist():
        mine = calls[rank[calls] == r]
        ops = dev[rank[dev] == r]
        ops = ops[np.argsort(ts[ops], kind="stable")]
        reach = np.maximum.accumulate(end[ops])  # the latest end among the ops started so far
        at_start = np.searchsorted(ts[ops], ts[mine], side="right") - 1
        at_back = np.searchsorted(ts[ops], end[mine], side="left") - 1
        busy = (at_start >= 0) & (reach[np.maximum(at_start, 0)] > ts[mine])
        drained = end[mine] - reach[np.maximum(at_back, 0)]
        out[mine[busy & (at_back >= 0) & (drained >= 0) & (drained <= IMPLICIT_WAKE_US)]] = True
    return out


def _queue_waits(table: EventTable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per window event (``rows``: its table rows, -1 for a marker): whether it is a launch that
    waited for room in a full device queue (EventTable.queue_waits), and the window event of the
    op whose end made room (-1: none, or an op of an earlier step outside the window)."""
    queued = np.zeros(len(rows), dtype=bool)
    slot_op = np.full(len(rows), -1, dtype=np.int64)
    rel = np.where(rows >= 0, table.queue_waits()[np.maximum(rows, 0)], -1)
    calls = np.flatnonzero(rel >= 0)
    if len(calls):
        queued[calls] = True
        order = np.argsort(rows, kind="stable")
        pos = np.minimum(np.searchsorted(rows[order], rel[calls]), len(rows) - 1)
        hit = rows[order][pos] == rel[calls]
        slot_op[calls[hit]] = order[pos[hit]]
    return queued, slot_op


def make_window(
    table: EventTable,
    step: int | None,
    exclude: frozenset[tuple[int, int, int]] = frozenset(),
    origins: dict[int, float] | None = None,
    tol: float = 5.0,
    span: int = 1,
    tails: dict[tuple[int, int, int], float] | None = None,
) -> Window:
    """The window of ``step`` (None: the whole trace; ``span``: that many consecutive steps) without
    the host threads in ``exclude`` ((rank, pid, tid): bystanders, see builder), with each rank's
    period starting at ``origins`` (table-relative µs; default: its first step's start). ``tol``:
    µs of CPU/GPU clock disagreement. ``tails``: (rank, pid, tid) -> table-relative µs from
    which that host thread's events are left out (builder._tails: after its last dependency into
    the step's work)."""
    rows, w0, measured, steps = select_window(table, step, span)
    if tails:
        tc = table.cols
        host = np.isin(tc["cls"][rows], (EvClass.CPU, EvClass.RUNTIME))
        triples = zip(tc["rank"][rows].tolist(), tc["pid"][rows].tolist(), tc["tid"][rows].tolist())
        cut = np.array([tails.get(k, np.inf) for k in triples], dtype=np.float64)
        rows = rows[~(host & (tc["ts"][rows] >= cut))]
    if exclude:
        tc = table.cols
        host = np.isin(tc["cls"][rows], (EvClass.CPU, EvClass.RUNTIME))
        key = list(zip(tc["rank"][rows].tolist(), tc["pid"][rows].tolist(), tc["tid"][rows].tolist()))
        rows = rows[~(host & np.array([k in exclude for k in key], dtype=bool))]
    c, rows, names = _with_step_ends(table, rows, steps)
    ts = c["ts"] - w0
    dur = c["dur"]
    end = ts + dur
    cls = c["cls"]
    flags = _name_lookups(table, names)
    name_coll, name_gloo, name_nccl, name_c10d = flags["coll"], flags["gloo"], flags["nccl"], flags["c10d"]

    # CPU leaves: sorted by (thread, ts, -dur), an event is a leaf if the next one on its
    # thread starts at or after its end (leaves of one thread therefore never overlap)
    # backend ops (gloo:*) are the backend's work, not the calling thread's program: an async
    # send's span overlaps the thread's later ops. They are nodes of their own, off the leaf chain.
    backend = (cls == EvClass.CPU) & name_gloo[c["name"]]
    cpu_mask = ((cls == EvClass.CPU) | (cls == EvClass.RUNTIME)) & ~backend
    cpu_rows = np.flatnonzero(cpu_mask)
    thread, srt, th, leaf = _leaves(cpu_rows, c, ts, end)
    polls = np.zeros(len(ts), dtype=np.int64)
    blocking = (cls == EvClass.RUNTIME) & flags["sync"][c["name"]]
    loops = _polling_loops(c, flags["query"], srt, th, leaf)
    if loops:  # each loop becomes its first call, lasting the whole loop: one wait on the device
        for run in loops:
            first = run[0]
            dur[first] = end[run[-1]] - ts[first]
            end[first] = ts[first] + dur[first]
            polls[first] = len(run)
            cpu_mask[run[1:]] = False
        cpu_rows = np.flatnonzero(cpu_mask)
        thread, srt, th, leaf = _leaves(cpu_rows, c, ts, end)
    blocking |= polls > 0
    copy_op = _blocking_copies(c, flags["copy"], ts, end, tol, np.array(sorted(synchronous_launches(table)), dtype=np.int64))
    blocking |= copy_op >= 0
    queued, slot_op = _queue_waits(table, rows)
    blocking |= queued
    implicit = _implicit_waits(c, ts, end, blocking, flags["query"])
    blocking |= implicit
    ev_thread = np.full(len(ts), -1, dtype=np.int64)
    ev_thread[cpu_rows] = thread

    gpu_rows = np.flatnonzero(isin_small(cls, GPU_CLASSES))
    stream = dense_ids(c["rank"][gpu_rows], c["pid"][gpu_rows], c["tid"][gpu_rows])
    g_order = np.lexsort((ts[gpu_rows], stream))

    back_rows = np.flatnonzero(backend)
    lane = dense_ids(c["rank"][back_rows], c["pid"][back_rows], c["tid"][back_rows])
    b_order = np.lexsort((ts[back_rows], lane))
    callers = frozenset(np.unique(thread[name_c10d[c["name"][cpu_rows]]]).tolist())  # threads that make c10d calls
    staged_prev, staged_next = _stage_exchanges(c, ts, end, back_rows[b_order], cpu_rows, thread, srt, th, leaf, callers)

    node_rows = np.concatenate([srt[leaf], gpu_rows[g_order], back_rows[b_order]])
    ev2node = np.full(len(ts), -1, dtype=np.int64)
    ev2node[node_rows] = np.arange(len(node_rows))
    nname, ncls = c["name"][node_rows], cls[node_rows]
    is_net = is_network(nname, ncls, name_gloo, name_nccl)

    # a GPU op queued behind work an earlier step launched on its stream starts when that ends
    carry = np.full(len(node_rows), -np.inf)
    g_nodes = len(srt[leaf]) + np.arange(len(gpu_rows))
    prev = table.stream_predecessors(rows[node_rows[g_nodes]]) if len(g_nodes) else np.zeros(0, np.int64)
    outside = (prev >= 0) & ~isin_sorted(prev, np.sort(rows))
    if outside.any():
        p_end = table.cols["ts"][prev[outside]] + table.cols["dur"][prev[outside]] - w0
        g_start = ts[node_rows[g_nodes[outside]]]
        carry[g_nodes[outside]] = np.where(g_start - p_end < 1e-3, g_start, p_end)  # back to back: float noise
    starts: dict[int, float] = {}
    for s_ in steps:  # the first step's start of each rank (steps come in step order)
        starts.setdefault(s_.rank, s_.start - w0)
    starts = starts or {int(r): float(ts[c["rank"] == r].min()) for r in np.unique(c["rank"])}
    origin_of = {r: (origins[r] - w0 if origins and r in origins else t) for r, t in starts.items()}
    known = np.array(sorted(starts), dtype=np.int64)
    at = np.array([starts[r] for r in known.tolist()], dtype=np.float64)
    lead_from = at[np.searchsorted(known, c["rank"]).clip(0, max(len(known) - 1, 0))] if len(known) else np.zeros(len(ts))
    return Window(
        step=step,
        w0=w0,
        measured=measured,
        steps=steps,
        rows=rows,
        c=c,
        names=names,
        ts=ts,
        end=end,
        name_coll=name_coll,
        name_gloo=name_gloo,
        name_nccl=name_nccl,
        name_c10d=name_c10d,
        name_blocked=flags["blocked"],
        name_lock=flags["lock"],
        name_queue_wait=flags["queue_wait"],
        name_coll_wait=flags["coll_wait"],
        name_functional=flags["functional"],
        cpu_rows=cpu_rows,
        cpu_sorted=srt,
        ev_thread=ev_thread,
        leaf_rows=srt[leaf],
        leaf_thread=th[leaf],
        gpu_rows=gpu_rows[g_order],
        gpu_stream=stream[g_order],
        backend_rows=back_rows[b_order],
        backend_lane=lane[b_order],
        staged_prev=staged_prev,
        staged_next=staged_next,
        node_rows=node_rows,
        ev2node=ev2node,
        is_net=is_net,
        ckind=np.where(is_net, collective_kinds(c, node_rows, name_coll), -1).astype(np.int8),
        carry=carry,
        lead_from=lead_from,
        blocking=blocking,
        copy_op=copy_op,
        polls=polls,
        queued=queued,
        implicit=implicit,
        slot_op=slot_op,
        origins=origin_of,
        codes=_codes(table),
    )


def _codes(table: EventTable) -> tuple[dict[str, list[int]], int]:
    """The table's index of its names (cached by _name_lookups) and how many it covers."""
    return table.lookups["codes"], len(table.names)

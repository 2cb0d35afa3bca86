"""PyTorch execution traces (ET JSON, schemas 1.0 and 1.1): tensor data dependencies between ops.

An execution trace records every op with its input and output tensors but no timings;
the Kineto trace of the same run has the timings. Joined on the op's record-function id
(ET ``rf_id`` = Kineto ``Record function id``, or ``External id`` in traces without it; same name), the ET adds one edge rule: the op that
last wrote a tensor -> each later op that reads it (EdgeKind.DATA). Within one thread this
is implied by program order; across threads (forward on the main thread, backward on the
autograd thread) it is a real dependency that the Kineto trace alone does not show.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bottleneck_oracle.errors import OracleWarning, TraceError
from bottleneck_oracle.graph_pipeline.events import RANK_IN_NAME, EvClass, EventTable, read_json, trace_files

_NUMBER_AT_END = re.compile(r"[-_.](\d+)$")  # dlrm_eg_3.json, et-3.json.gz


@dataclass(slots=True)
class ExecutionTrace:
    path: str
    rank: int  # -1 until assigned (assign_ranks)
    names: list[str]
    rf_id: np.ndarray  # int64 per ET node (-1: none)
    deps: np.ndarray  # (producer, consumer) node indices, int64, shape (k, 2)
    tid: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # ET thread per node
    pid: int = -1  # the recording process (ET field "pid"), -1 when absent
    rank_from: str = ""  # how the rank was told: "given", "process id", "file name", "only rank"
    joined: int = 0  # ET nodes joined to a Kineto op (attach)
    op_nodes: int = 0  # ET nodes that are ops (not the profiler's own thread/process nodes)
    unjoined: dict = field(default_factory=dict)  # why nodes did not join: reason -> count
    join_rule: str = ""  # "record-function id" or "thread order" (_join)


def _tensors(values: list, types: list) -> list[tuple[int, int]]:
    """(tensor id, storage id) of every tensor among an op's inputs or outputs."""
    out = []
    for v, t in zip(values, types):
        if not isinstance(t, str):
            continue
        if t.startswith("Tensor") and isinstance(v, list) and len(v) >= 2:
            out.append((v[0], v[1]))
        elif t.startswith("GenericList[Tensor") and isinstance(v, list):
            out.extend((x[0], x[1]) for x in v if isinstance(x, list) and len(x) >= 2)
    return out


def _io(node: dict, which: str) -> tuple[list, list]:
    """(values, types) of a node's inputs or outputs: schema 1.0 keeps them in parallel lists,
    1.1 in an object {values, shapes, types}."""
    v = node.get(which, [])
    if isinstance(v, dict):
        return v.get("values", []), v.get("types", [])
    return v, node.get(f"{which[:-1]}_types", [])


def _rf_id(node: dict) -> int:
    """The record-function id: a field in schema 1.0, an attribute in 1.1."""
    if isinstance(node.get("rf_id"), int):
        return node["rf_id"]
    for a in node.get("attrs", []):
        if isinstance(a, dict) and a.get("name") == "rf_id" and isinstance(a.get("value"), int):
            return a["value"]
    return -1


def load_execution_trace(path: str | Path, rank: int | None = None) -> ExecutionTrace:
    """Parse an ET JSON file; TraceError names the file and what is wrong."""
    p = Path(path)
    doc = read_json(p)
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or "schema" not in doc:
        raise TraceError(p, "not a PyTorch execution trace (expected an object with 'schema' and a 'nodes' list)")
    nodes = doc["nodes"]
    if not nodes:
        raise TraceError(p, "execution trace holds no nodes")
    try:
        nodes = sorted(nodes, key=lambda n: n["id"])  # ids follow execution order
        parent = {n["id"]: n.get("parent", n.get("ctrl_deps", -1)) for n in nodes}  # 1.1 calls the parent ctrl_deps
    except (KeyError, TypeError):
        raise TraceError(p, "execution trace node without an integer 'id'") from None

    def ancestors(i: int) -> set[int]:
        seen = set()
        while i in parent and i not in seen:
            seen.add(i)
            i = parent[i]
        return seen

    last_writer: dict[tuple, int] = {}
    deps = []
    for idx, n in enumerate(nodes):
        lineage = ancestors(n["id"])
        for t in _tensors(*_io(n, "inputs")):
            w = last_writer.get(t)
            if w is not None and nodes[w]["id"] not in lineage and n["id"] not in ancestors(nodes[w]["id"]):
                deps.append((w, idx))
        for t in _tensors(*_io(n, "outputs")):
            last_writer[t] = idx
    return ExecutionTrace(
        path=str(p),
        rank=rank if rank is not None else -1,
        names=[str(n.get("name", "")) for n in nodes],
        rf_id=np.array([_rf_id(n) for n in nodes], dtype=np.int64),
        deps=np.array(sorted(set(deps)), dtype=np.int64).reshape(-1, 2),
        tid=np.array([n["tid"] if isinstance(n.get("tid"), int) else -1 for n in nodes], dtype=np.int64),
        pid=doc["pid"] if isinstance(doc.get("pid"), int) and not isinstance(doc.get("pid"), bool) else -1,
        rank_from="given" if rank is not None else "",
    )


def _rank_in_name(path: str) -> int | None:
    """rank-3 anywhere in the name, else a number ending the stem (dlrm_eg_3.json.gz)."""
    name = Path(path).name
    m = RANK_IN_NAME.search(name)
    if m:
        return int(m.group(1))
    stem = name[: name.find(".json")] if ".json" in name else name
    m = _NUMBER_AT_END.search(stem)
    return int(m.group(1)) if m else None


def assign_ranks(traces: list[ExecutionTrace], table: EventTable) -> list[ExecutionTrace]:
    """Give every execution trace the rank of the Kineto trace it belongs to, by content first:

    1. the ET's ``pid`` is the process id of exactly one rank's CPU ops (the same process
       recorded both files);
    2. else the file name: ``rank-N`` anywhere, or a number ending the name (``dlrm_eg_3.json``);
    3. else, for one ET beside a one-rank trace, that rank.

    Two ETs on one rank, or an ET whose rank cannot be told or has no Kineto trace, is a
    TraceError naming the file."""
    c = table.cols
    cpu = c["cls"] == EvClass.CPU
    pid_ranks: dict[int, set[int]] = {}
    for r in table.ranks:
        for pid in np.unique(c["pid"][cpu & (c["rank"] == r)]).tolist():
            if pid > 0:
                pid_ranks.setdefault(int(pid), set()).add(r)
    seen: dict[int, str] = {}
    for et in traces:
        if et.rank < 0:
            owners = pid_ranks.get(et.pid, set())
            by_name = _rank_in_name(et.path)
            if len(owners) == 1:
                et.rank, et.rank_from = next(iter(owners)), "process id"
            elif by_name is not None:
                et.rank, et.rank_from = by_name, "file name"
            elif len(traces) == 1 and len(table.ranks) == 1:
                et.rank, et.rank_from = table.ranks[0], "only rank"
            else:
                raise TraceError(
                    et.path,
                    "cannot tell which rank this execution trace belongs to: its pid matches no rank's "
                    "process and its name carries no rank (name it rank-N.json or et_N.json)",
                )
        if et.rank not in table.files:
            raise TraceError(et.path, f"rank {et.rank} ({et.rank_from}) has no Kineto trace (ranks: {table.ranks})")
        if et.rank in seen:
            raise TraceError(et.path, f"rank {et.rank} ({et.rank_from}) already has an execution trace: {seen[et.rank]}")
        seen[et.rank] = et.path
    return traces


def load_execution_traces(path: str | Path, table: EventTable) -> list[ExecutionTrace]:
    """One ET file or a folder of per-rank ET files, each assigned to its rank (assign_ranks)."""
    return assign_ranks([load_execution_trace(f) for f in trace_files(path)], table)


_PROFILER_NODE = "[pytorch|profiler|execution_"  # the ET's own process/thread nodes: no Kineto twin
_LOOKAHEAD = 16  # how far the alignment looks for an op that is only in one of the two files


def _align(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """Monotone alignment of two name sequences (one thread's ops in the ET and in Kineto, both
    in record-function order): equal names pair up; an op only in one file (a user annotation
    Kineto has, a node the ET adds) is stepped over by looking up to _LOOKAHEAD ahead."""
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            out.append((i, j))
            i += 1
            j += 1
            continue
        k = next((k for k in range(1, _LOOKAHEAD) if j + k < len(b) and b[j + k] == a[i]), None)
        m = next((m for m in range(1, _LOOKAHEAD) if i + m < len(a) and a[i + m] == b[j]), None)
        if k is not None and (m is None or k <= m):
            j += k
        elif m is not None:
            i += m
        else:
            i += 1
            j += 1
    return out


def _steady(m: list[tuple[int, int]], rf_id: np.ndarray, key: np.ndarray) -> bool:
    """Whether an alignment is the same run's ops and not names that happen to recur: the id
    offset (Kineto id - ET rf_id) of successive matched ops stays the same for most of them
    (it shifts only where one file has an op the other lacks); matches scattered over
    another run's ops change it at almost every step."""
    if len(m) < 2:
        return False
    off = np.array([key[r] - rf_id[i] for i, r in m])
    return float((np.diff(off) == 0).mean()) >= 0.8


def _join(et: ExecutionTrace, table: EventTable, key: np.ndarray, cpu: np.ndarray, ops: np.ndarray) -> tuple[np.ndarray, str]:
    """Kineto row per ET node (-1: none) and the rule that joined them (``ops``: the nodes that
    are ops, not the ET's own process and thread nodes).

    First by id: the ET's rf_id equals the Kineto op's record-function id with the same name
    (one profiler session, one thread). Where that leaves most ops unjoined, by thread order:
    record-function ids are handed out process-wide in start order, and Kineto and the ET can
    number them differently once two threads interleave (DLRM's forward thread and autograd
    thread) or one file has ops the other lacks (user annotations), so each ET thread's ops are
    aligned by name with the Kineto thread they match best, both taken in id order."""
    c = table.cols
    names = table.names
    rows = cpu[c["rank"][cpu] == et.rank]
    by_id = {int(e): int(r) for e, r in zip(key[rows].tolist(), rows.tolist())}
    direct = np.full(len(et.names), -1, dtype=np.int64)
    for i, (rf, name) in enumerate(zip(et.rf_id.tolist(), et.names)):
        r = by_id.get(rf, -1)
        if r >= 0 and names[c["name"][r]] == name:
            direct[i] = r
    if (direct[ops] >= 0).mean() >= 0.9 if ops.any() else True:
        return direct, "record-function id"
    aligned = np.full(len(et.names), -1, dtype=np.int64)
    k_rows = rows[np.argsort(key[rows], kind="stable")]
    k_threads: dict[tuple[int, int], list[int]] = {}
    for r in k_rows.tolist():
        k_threads.setdefault((int(c["pid"][r]), int(c["tid"][r])), []).append(r)
    e_threads: dict[int, list[int]] = {}
    for i in np.flatnonzero(ops)[np.argsort(et.rf_id[ops], kind="stable")].tolist():
        e_threads.setdefault(int(et.tid[i]), []).append(i)
    pairs = []
    for et_tid, e_idx in e_threads.items():
        a = [et.names[i] for i in e_idx]
        for k_tid, k_idx in k_threads.items():
            m = [(e_idx[x], k_idx[y]) for x, y in _align(a, [names[c["name"][r]] for r in k_idx])]
            if _steady(m, et.rf_id, key):
                pairs.append((len(m), et_tid, k_tid, m))
    used_e, used_k = set(), set()
    for n, et_tid, k_tid, m in sorted(pairs, key=lambda p: -p[0]):  # best thread pairs first, each thread once
        if n and et_tid not in used_e and k_tid not in used_k:
            used_e.add(et_tid)
            used_k.add(k_tid)
            for i, r in m:
                aligned[i] = r
    if (aligned >= 0).sum() > (direct >= 0).sum():
        return aligned, "thread order"
    return direct, "record-function id"


def attach(table: EventTable, traces: list[ExecutionTrace]) -> int:
    """Join ET nodes to Kineto CPU ops of the same rank (_join) and store the data dependencies
    between joined ops in ``table.data_deps``; returns how many. Each trace's ``joined`` and
    ``op_nodes`` say how much of it joined; under half is warned about, with the likely reason."""
    c = table.cols
    # the ET's rf_id is Kineto's "Record function id" where the trace has one (it can differ
    # from the External id once a process has profiled before), else the External id
    key = np.where(c["rf_id"] > 0, c["rf_id"], c["ext_id"])
    cpu = np.flatnonzero((c["cls"] == EvClass.CPU) & (key >= 0))
    pairs = []
    for et in traces:
        if et.rank not in table.files:
            raise TraceError(et.path, f"rank {et.rank} has no Kineto trace (ranks: {table.ranks})")
        ops = np.array([not n.startswith(_PROFILER_NODE) for n in et.names], dtype=bool)  # the ET's op nodes
        row_of, rule = _join(et, table, key, cpu, ops)
        et.op_nodes, et.joined, et.join_rule = int(ops.sum()), int((row_of[ops] >= 0).sum()), rule
        if et.joined == 0:
            raise TraceError(
                et.path, f"no op matches the Kineto trace of rank {et.rank} (record-function ids and op order differ: not the same run?)"
            )
        kineto_names = {table.names[i] for i in c["name"][cpu[c["rank"][cpu] == et.rank]].tolist()}
        absent = sum(1 for n, o in zip(et.names, ops.tolist()) if o and n not in kineto_names)
        et.unjoined = {"not in the Kineto trace": absent, "not aligned": et.op_nodes - et.joined - absent}
        if et.joined < et.op_nodes / 2:
            warnings.warn(
                f"{et.path}: only {et.joined} of {et.op_nodes} execution-trace ops join rank {et.rank}'s Kineto ops "
                f"({absent} have names the Kineto trace lacks: a different profiler window or run?)",
                OracleWarning,
                stacklevel=2,
            )
        if len(et.deps):
            a, b = row_of[et.deps[:, 0]], row_of[et.deps[:, 1]]
            ok = (a >= 0) & (b >= 0) & (a != b)
            pairs.append(np.stack([a[ok], b[ok]], axis=1))
    table.data_deps = np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)
    table.execution_traces = [
        {
            "path": et.path,
            "rank": et.rank,
            "rank_from": et.rank_from,
            "joined": et.joined,
            "op_nodes": et.op_nodes,
            "join_rule": et.join_rule,
            "unjoined": et.unjoined,
        }
        for et in traces
    ]
    return len(table.data_deps)

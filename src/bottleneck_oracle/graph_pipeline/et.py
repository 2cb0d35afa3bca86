"""PyTorch execution traces (ET JSON, schemas 1.0 and 1.1): tensor data dependencies between ops.

An execution trace records every op with its input and output tensors but no timings;
the Kineto trace of the same run has the timings. Joined on the op's record-function id
(ET ``rf_id`` = Kineto ``Record function id``, or ``External id`` in traces without it; same name), the ET adds one edge rule: the op that
last wrote a tensor -> each later op that reads it (EdgeKind.DATA). Within one thread this
is implied by program order; across threads (forward on the main thread, backward on the
autograd thread) it is a real dependency that the Kineto trace alone does not show.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline.events import EvClass, EventTable, rank_of, read_json, trace_files


@dataclass(slots=True)
class ExecutionTrace:
    path: str
    rank: int
    names: list[str]
    rf_id: np.ndarray  # int64 per ET node (-1: none)
    deps: np.ndarray  # (producer, consumer) node indices, int64, shape (k, 2)


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
        rank=rank if rank is not None else rank_of({}, p, default=0),
        names=[str(n.get("name", "")) for n in nodes],
        rf_id=np.array([_rf_id(n) for n in nodes], dtype=np.int64),
        deps=np.array(sorted(set(deps)), dtype=np.int64).reshape(-1, 2),
    )


def load_execution_traces(path: str | Path, ranks: list[int]) -> list[ExecutionTrace]:
    """One ET file (for a single-rank Kineto trace) or a folder of rank-N ET files."""
    files = trace_files(path)
    if len(files) == 1 and len(ranks) == 1:
        return [load_execution_trace(files[0], rank=ranks[0])]
    return [load_execution_trace(f) for f in files]


def attach(table: EventTable, traces: list[ExecutionTrace]) -> int:
    """Join ET nodes to Kineto CPU ops (same rank, rf_id = External id, same name) and store
    the data dependencies between joined ops in ``table.data_deps``; returns how many."""
    c = table.cols
    # the ET's rf_id is Kineto's "Record function id" where the trace has one (it can differ
    # from the External id once a process has profiled before), else the External id
    key = np.where(c["rf_id"] > 0, c["rf_id"], c["ext_id"])
    cpu = np.flatnonzero((c["cls"] == EvClass.CPU) & (key >= 0))
    pairs = []
    for et in traces:
        if et.rank not in table.files:
            raise TraceError(et.path, f"rank {et.rank} has no Kineto trace (ranks: {table.ranks})")
        rows = cpu[c["rank"][cpu] == et.rank]
        by_ext = {int(e): int(r) for e, r in zip(key[rows].tolist(), rows.tolist())}
        row_of = np.full(len(et.names), -1, dtype=np.int64)
        for i, (rf, name) in enumerate(zip(et.rf_id.tolist(), et.names)):
            r = by_ext.get(rf, -1)
            if r >= 0 and table.names[c["name"][r]] == name:
                row_of[i] = r
        if (row_of >= 0).sum() == 0:
            raise TraceError(et.path, f"no op matches the Kineto trace of rank {et.rank} (record-function ids differ: not the same run?)")
        if len(et.deps):
            a, b = row_of[et.deps[:, 0]], row_of[et.deps[:, 1]]
            ok = (a >= 0) & (b >= 0) & (a != b)
            pairs.append(np.stack([a[ok], b[ok]], axis=1))
    table.data_deps = np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)
    return len(table.data_deps)

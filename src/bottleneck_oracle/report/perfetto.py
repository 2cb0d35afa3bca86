"""Annotated trace for Perfetto / chrome://tracing: the input events with the critical path marked.

As HTA's overlay does: every event on the critical path (and the ops enclosing it)
gets ``args.critical = 1`` and ``args.slack_us``; consecutive critical events are
joined by flow arrows of category ``critical_path``. Several rank files are merged
into one trace, each rank's processes renamed ``rank N: ...``.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import orjson

from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.graph_pipeline.events import EventTable, ancestors_of, cpu_parents, read_json


def _pid(rank: int, pid: object, multi: bool) -> object:
    if not multi:
        return pid
    if isinstance(pid, int):
        return rank * 10_000_000 + pid
    return f"rank {rank}: {pid}"


def write_overlay(table: EventTable, analyses: list[StepAnalysis], out: str | Path, gz: bool | None = None) -> Path:
    """Write the annotated trace atomically (gzipped if ``gz``, by default if the name ends in .gz); returns the path."""
    out = Path(out)
    gz = out.name.endswith(".gz") if gz is None else gz
    rows_cp: list[np.ndarray] = []
    slack_of: dict[int, float] = {}
    flows: list[tuple[int, int]] = []
    for a in analyses:
        ev = a.graph.nodes["event"][a.cpm.path]
        real = a.cpm.path[ev >= 0]
        for node in real.tolist():
            slack_of[int(a.graph.nodes["event"][node])] = float(a.cpm.slack[node])
        ev = ev[ev >= 0]
        rows_cp.append(ev)
        flows.extend(zip(ev[:-1].tolist(), ev[1:].tolist()))
    crit_rows = ancestors_of(cpu_parents(table), np.concatenate(rows_cp) if rows_cp else np.zeros(0, np.int64))
    by_rank: dict[int, set[int]] = {}
    rank_col = table.cols["rank"]
    src_idx = table.cols["src_idx"]
    for r in crit_rows.tolist():
        by_rank.setdefault(int(rank_col[r]), set()).add(int(src_idx[r]))
    multi = len(table.files) > 1
    merged: list[dict] = []
    located: dict[tuple[int, int], dict] = {}
    for rank, path in sorted(table.files.items()):
        doc = read_json(Path(path))
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        marks = by_rank.get(rank, set())
        for i, e in enumerate(events):
            if not isinstance(e, dict):
                continue
            if "pid" in e:
                e["pid"] = _pid(rank, e["pid"], multi)
            if e.get("ph") == "M" and e.get("name") == "process_name" and multi:
                e.setdefault("args", {})["name"] = f"rank {rank}: {e.get('args', {}).get('name', '')}"
            if i in marks:
                e.setdefault("args", {})["critical"] = 1
            located[(rank, i)] = e
            merged.append(e)
    for row, slack in slack_of.items():
        e = located.get((int(rank_col[row]), int(src_idx[row])))
        if e is not None:
            e.setdefault("args", {})["slack_us"] = round(slack, 3)
    for k, (a, b) in enumerate(flows):
        ea = located.get((int(rank_col[a]), int(src_idx[a])))
        eb = located.get((int(rank_col[b]), int(src_idx[b])))
        if ea is None or eb is None:
            continue
        common = {"cat": "critical_path", "name": "critical_path", "id": 900_000_000 + k}
        merged.append({**common, "ph": "s", "pid": ea["pid"], "tid": ea["tid"], "ts": ea["ts"] + ea.get("dur", 0)})
        merged.append({**common, "ph": "f", "bp": "e", "pid": eb["pid"], "tid": eb["tid"], "ts": eb["ts"]})
    data = orjson.dumps({"traceEvents": merged, "displayTimeUnit": "ms", "bottleneckOracle": {"critical_events": int(len(crit_rows))}})
    with atomic_path(out) as tmp:
        if gz:
            with gzip.open(tmp, "wb", compresslevel=5) as fh:
                fh.write(data)
        else:
            tmp.write_bytes(data)
    return out

"""Our critical path against Holistic Trace Analysis' critical-path overlay of the same trace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bottleneck_oracle.analysis.cpm import CPMResult
from bottleneck_oracle.graph_pipeline.events import EventTable, ancestors_of, cpu_parents, read_json
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph

# HTA's critical-path graph holds CPU ops, runtime calls and GPU ops of non-zero duration
HTA_CATEGORIES = frozenset({"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"})


EventKey = tuple[str, float, str]  # (thread id, start µs to 0.1, name): an event in both traces


def _key(tid: object, ts: float, name: str) -> EventKey:
    return (str(tid), round(float(ts), 1), name)


@dataclass(frozen=True, slots=True)
class HTAAgreement:
    """Our critical events against HTA's (``hta_agreement``)."""

    jaccard: float  # on the events HTA models
    jaccard_all_events: float
    ours: int  # critical events of ours among those HTA models
    hta: int  # HTA's
    shared: int
    only_ours: list[EventKey]
    only_hta: list[EventKey]
    only_ours_all: int  # among every event
    only_hta_all: int
    categories_only_hta: list[str]  # the categories of the events only HTA marks
    cp_nodes: int  # nodes on our critical path
    cp_gpu_nodes: int


def hta_agreement(table: EventTable, graph: ExecutionGraph, cpm: CPMResult, overlay: str | Path) -> HTAAgreement:
    """Jaccard overlap of critical events with HTA's overlay (events with args.critical=1).

    An op of ours is critical if time inside it is on our critical path (the path's leaves
    and every op enclosing them). Compared on the events HTA models; the events only one
    side marks are returned for inspection."""
    rows = graph.nodes["event"][cpm.path]
    rows = ancestors_of(cpu_parents(table), rows[rows >= 0])
    c = table.cols
    ours_all = {_key(c["tid"][i], c["ts"][i] + table.t0, table.names[c["name"][i]]) for i in rows.tolist()}
    doc: Any = read_json(Path(overlay))  # a Chrome trace document, read as it is
    events = {
        _key(e.get("tid"), e["ts"], e.get("name", "")): e
        for e in doc["traceEvents"]
        if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)) and e.get("cat") != "Trace"
    }
    hta_all = {k for k, e in events.items() if e.get("args", {}).get("critical") == 1}
    comparable = {k for k, e in events.items() if e.get("cat") in HTA_CATEGORIES and e.get("dur", 0) > 0}
    ours, hta = ours_all & comparable, hta_all & comparable
    union = ours | hta
    return HTAAgreement(
        jaccard=len(ours & hta) / len(union) if union else 1.0,
        jaccard_all_events=len(ours_all & hta_all) / max(len(ours_all | hta_all), 1),
        ours=len(ours),
        hta=len(hta),
        shared=len(ours & hta),
        only_ours=sorted(ours - hta),
        only_hta=sorted(hta - ours),
        only_ours_all=int(len(ours_all - hta_all)),
        only_hta_all=int(len(hta_all - ours_all)),
        categories_only_hta=sorted({events[k]["cat"] for k in hta - ours}),
        cp_nodes=int(len(cpm.path)),
        cp_gpu_nodes=int(np.sum(graph.nodes["on_gpu"][cpm.path])),
    )

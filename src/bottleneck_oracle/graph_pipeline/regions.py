"""The regions of a step: the CPU events that enclose leaf ops.

Nodes are the leaf ops of each thread's op tree; the events above them (``record_function`` and
user annotation ranges, ``nn.Module`` and other Python ranges, parent ops such as ``aten::linear``
over its ``aten::addmm``, autograd hooks) are no nodes of their own. Blame attributes excess to
them as a whole (analysis.blame.region_blame), so the graph keeps, per such event, the span of
leaves inside it: the leaves of a thread are consecutive nodes in time order, so a region is the
node range first..last on its thread, with the untraced time between them.
"""

from __future__ import annotations

import numpy as np

from bottleneck_oracle.graph_pipeline.schema import REGION_COLUMNS


def empty_regions() -> dict[str, np.ndarray]:
    return {k: np.zeros(0, dtype=dtype) for k, (dtype, _) in REGION_COLUMNS.items()}


def window_regions(w) -> dict[str, np.ndarray]:
    """The regions (schema.REGION_COLUMNS) of a Window: every CPU event of its threads that is
    not a leaf and has leaves inside it, in (thread, start, -duration) order."""
    srt = w.cpu_sorted
    ev = srt[w.ev2node[srt] < 0] if len(srt) else srt
    if not len(ev) or not w.n_leaf:
        return empty_regions()
    first, last = w.in_node(ev), w.out_node(ev)
    ok = (first >= 0) & (last >= first)
    ev, first, last = ev[ok], first[ok], last[ok]
    c = w.c
    return {
        "name": c["name"][ev].astype(np.int32),
        "rank": c["rank"][ev].astype(np.int32),
        "tid": c["tid"][ev].astype(np.int64),
        "start": w.ts[ev].astype(np.float64),
        "end": w.end[ev].astype(np.float64),
        "first": first.astype(np.int64),
        "last": last.astype(np.int64),
        "is_range": c["is_range"][ev].astype(bool),
    }

"""The time between the ops of a CPU thread, split by what was open then.

Nodes are the leaf ops of each thread's op tree, so the time between two consecutive leaves
is not an op of its own: it is the own time of the ops and ranges that enclose it
(``aten::addmm``'s compute between its children, the Python of ``Optimizer.step`` before its
first op), or time with nothing open at all. A *piece* is a stretch of that time with one
innermost open event, its owner (or none). Pieces end wherever an event opens or closes on
the thread, so a thread that slept or waited shows one long piece, and the first piece after
it starts where the thread was seen running again.

Every piece belongs to the leaf that follows it on its thread (``node``). The first leaf of a
thread also gets the stretch from its rank's step start to the thread's first event (owner
none). Pieces after a thread's last leaf are dropped (no node follows them), except on the
thread of the ProfilerStep span, whose step-end marker is a leaf.
"""

from __future__ import annotations

import numba
import numpy as np

from bottleneck_oracle.graph_pipeline.schema import GAP_COLUMNS


@numba.njit(cache=True)
def _sweep(thread, ts, end, leaf, node, lead_from):
    """Pieces of events sorted by (thread, ts, -dur): (node, start, end, owner position or -1)."""
    n = len(ts)
    cap = 2 * n + 2
    p_node = np.empty(cap, np.int64)
    p_lo = np.empty(cap)
    p_hi = np.empty(cap)
    p_owner = np.empty(cap, np.int64)
    stack = np.empty(max(n, 1), np.int64)
    k = 0
    i = 0
    while i < n:
        t = thread[i]
        sp = 0
        first = k  # first piece not yet given to a leaf
        cursor = ts[i]
        if lead_from[i] < ts[i]:  # from the rank's step start to the thread's first event
            p_lo[k] = lead_from[i]
            p_hi[k] = ts[i]
            p_owner[k] = -1
            k += 1
        j = i
        while j < n and thread[j] == t:
            while sp > 0 and end[stack[sp - 1]] <= ts[j]:
                top = stack[sp - 1]
                sp -= 1
                if end[top] > cursor:
                    p_lo[k] = cursor
                    p_hi[k] = end[top]
                    p_owner[k] = top
                    k += 1
                    cursor = end[top]
            if ts[j] > cursor:
                p_lo[k] = cursor
                p_hi[k] = ts[j]
                p_owner[k] = stack[sp - 1] if sp > 0 else -1
                k += 1
                cursor = ts[j]
            if leaf[j]:
                for q in range(first, k):
                    p_node[q] = node[j]
                first = k
                if end[j] > cursor:
                    cursor = end[j]
            else:
                stack[sp] = j
                sp += 1
            j += 1
        k = first  # pieces after the thread's last leaf: nobody waits on them
        i = j
    return p_node[:k], p_lo[:k], p_hi[:k], p_owner[:k]


def gap_pieces(w, lead_from: np.ndarray) -> dict[str, np.ndarray]:
    """The pieces (schema.GAP_COLUMNS) of a Window's CPU threads. ``lead_from``: per window
    event, its rank's step start (µs from the window start)."""
    srt = w.cpu_sorted
    if not len(srt):
        return empty_gaps()
    c = w.c
    is_leaf = w.ev2node[srt] >= 0
    node, lo, hi, owner = _sweep(
        w.ev_thread[srt], w.ts[srt], w.end[srt], is_leaf, np.maximum(w.ev2node[srt], 0), lead_from[srt].astype(np.float64)
    )
    has = owner >= 0
    ev = srt[np.maximum(owner, 0)]
    return {
        "node": node,
        "start": lo,
        "end": hi,
        "owner": np.where(has, c["name"][ev], -1).astype(np.int32),
        "owner_start": np.where(has, w.ts[ev], np.nan),
        "owner_end": np.where(has, w.end[ev], np.nan),
        "owner_op": has & ~c["is_range"][ev],
    }


def empty_gaps() -> dict[str, np.ndarray]:
    return {k: np.zeros(0, dtype=dtype) for k, (dtype, _) in GAP_COLUMNS.items()}

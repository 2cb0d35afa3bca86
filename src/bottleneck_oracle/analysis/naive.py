"""The naive culprit finders that blame is measured against (benchmarks/culprits.py): what a
notebook would do — the longest ops on the critical path, the ops most slower than the same op
on the other ranks."""

from __future__ import annotations

import numpy as np

from bottleneck_oracle.analysis.blame import typical_durations
from bottleneck_oracle.analysis.cpm import CPMResult, run_cpm
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category


def longest_on_critical_path(g: ExecutionGraph, cpm: CPMResult | None = None, k: int = 3) -> list[int]:
    """Naive culprit finder 1: the longest ops on the critical path."""
    r = cpm or run_cpm(g)
    path = [int(i) for i in r.path if g.nodes["category"][i] != Category.BARRIER]
    return sorted(path, key=lambda i: -float(g.nodes["mdur"][i]))[:k]


def largest_rank_deviation(g: ExecutionGraph, k: int = 3) -> list[int]:
    """Naive culprit finder 2: the ops most slower than the same op on the other ranks (every
    other rank, peer or not; no counterpart: deviation = its whole duration)."""
    typical, source, _ = typical_durations(g, [], all_ranks=True)
    dev = g.nodes["mdur"] - np.where(source == 0, 0.0, typical)
    dev[g.nodes["category"] == Category.BARRIER] = -np.inf
    return [int(i) for i in np.argsort(-dev)[:k]]

"""Causal attribution: which nodes, ranks and op kinds made this step slow.

The counterfactual of every node: restore it to its typical duration and replay. A node's
typical duration is the median modelled duration of its counterparts: the same op (same rank,
same name, same occurrence in the step) in the reference steps (the other steps of the trace,
or a baseline trace), or, when there are none, on the other ranks of the same step. An op with
no counterpart at all (work that normally does not happen) is typically absent: 0 µs. Its
causal contribution is the step time the restoration saves (exact, via the replay); a node
faster than typical contributes nothing. Ranks and op kinds are restored as a whole (one
replay each), and their saving is reported as a share of the saving of restoring everything.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from bottleneck_oracle.analysis.cpm import CPMResult, run_cpm
from bottleneck_oracle.analysis.whatif import single_node_makespans
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category

MIN_EXCESS_US = 20.0  # slower than typical by less than this: noise, not a candidate


def _keys(g: ExecutionGraph) -> list[tuple]:
    """(rank, on_gpu, name, occurrence) of every node: its identity across steps."""
    n = g.nodes
    order = np.lexsort((n["start"], n["name"], n["on_gpu"], n["rank"]))
    keys: list[tuple] = [()] * g.n_nodes
    prev, k = None, 0
    for i in order:
        base = (int(n["rank"][i]), bool(n["on_gpu"][i]), int(n["name"][i]))
        k = k + 1 if base == prev else 0
        prev = base
        keys[i] = (base[0], base[1], g.names[base[2]], k)
    return keys


def typical_durations(g: ExecutionGraph, references: list[ExecutionGraph]) -> tuple[np.ndarray, np.ndarray]:
    """(typical modelled duration µs, where it came from: 2 reference steps, 1 other ranks, 0 none)."""
    keys = _keys(g)
    source = np.zeros(g.n_nodes, dtype=np.int8)
    typical = np.zeros(g.n_nodes)
    seen: dict[tuple, list[float]] = defaultdict(list)
    for r in references:
        for key, d in zip(_keys(r), r.nodes["mdur"]):
            seen[key].append(float(d))
    across: dict[tuple, list[float]] = defaultdict(list)
    for key, d in zip(keys, g.nodes["mdur"]):
        across[(key[1], key[2], key[3])].append(float(d))
    for i, key in enumerate(keys):
        if key in seen:
            typical[i], source[i] = float(np.median(seen[key])), 2
        else:
            others = across[(key[1], key[2], key[3])]
            if len(others) > 1:  # the node itself is among them: the median of the others
                mine = float(g.nodes["mdur"][i])
                rest = list(others)
                rest.remove(mine)
                typical[i], source[i] = float(np.median(rest)), 1
    return typical, source


@dataclass(slots=True)
class Blame:
    step: int | None
    makespan: float
    restored_makespan: float  # every node restored to typical
    nodes: list[dict] = field(default_factory=list)  # ranked by saving
    ranks: list[dict] = field(default_factory=list)
    ops: list[dict] = field(default_factory=list)

    @property
    def excess(self) -> float:
        return self.makespan - self.restored_makespan

    def to_dict(self) -> dict:
        return {"step": self.step, "makespan_us": self.makespan, "restored_makespan_us": self.restored_makespan, "excess_us": self.excess,
                "nodes": self.nodes, "ranks": self.ranks, "ops": self.ops}  # fmt: skip


def blame(g: ExecutionGraph, references: list[ExecutionGraph], top: int = 20, cpm: CPMResult | None = None) -> Blame:
    """Rank the nodes (and ranks, and op kinds) of ``g`` by the step time restoring them saves."""
    base = cpm or run_cpm(g)
    n = g.nodes
    typical, source = typical_durations(g, references)
    d = n["mdur"].astype(np.float64)
    real = n["category"] != Category.BARRIER
    restored = np.where(real, np.minimum(d, typical), d)
    excess = d - restored
    cand = np.flatnonzero(excess > MIN_EXCESS_US)
    saving = base.makespan - single_node_makespans(g, cand, -excess[cand], base) if len(cand) else np.zeros(0)
    order = np.lexsort((-excess[cand], -saving))
    everything = run_cpm(g, restored).makespan
    out = Blame(step=g.step, makespan=base.makespan, restored_makespan=everything)
    total = max(base.makespan - everything, 1e-9)
    for j in order[:top]:
        i = int(cand[j])
        out.nodes.append({"id": i, "name": g.node_name(i), "rank": int(n["rank"][i]), "dur_us": float(d[i]), "typical_us": float(typical[i]),
                          "typical_from": ("none", "other ranks", "reference steps")[source[i]], "saving_us": float(saving[j]),
                          "share": float(saving[j] / total), "slack_us": float(base.slack[i])})  # fmt: skip
    for rank in g.ranks:
        m = n["rank"] == rank
        s = base.makespan - run_cpm(g, np.where(m, restored, d)).makespan
        out.ranks.append({"rank": int(rank), "saving_us": float(s), "share": float(s / total), "excess_us": float(excess[m].sum())})
    out.ranks.sort(key=lambda r: -r["saving_us"])
    by_name: dict[str, float] = defaultdict(float)
    for i in cand:
        by_name[g.node_name(i)] += float(excess[i])
    for name in sorted(by_name, key=lambda k: -by_name[k])[: max(top, 10)]:
        m = np.array([s == name for s in g.names])[n["name"]]
        s = base.makespan - run_cpm(g, np.where(m, restored, d)).makespan
        out.ops.append({"name": name, "saving_us": float(s), "share": float(s / total), "excess_us": by_name[name]})
    out.ops.sort(key=lambda r: -r["saving_us"])
    out.ops = out.ops[:top]
    return out


def longest_on_critical_path(g: ExecutionGraph, cpm: CPMResult | None = None, k: int = 3) -> list[int]:
    """Naive culprit finder 1: the longest ops on the critical path."""
    r = cpm or run_cpm(g)
    path = [int(i) for i in r.path if g.nodes["category"][i] != Category.BARRIER]
    return sorted(path, key=lambda i: -float(g.nodes["mdur"][i]))[:k]


def largest_rank_deviation(g: ExecutionGraph, k: int = 3) -> list[int]:
    """Naive culprit finder 2: the ops most slower than the same op on the other ranks."""
    typical, _ = typical_durations(g, [])
    dev = g.nodes["mdur"] - typical
    dev[g.nodes["category"] == Category.BARRIER] = -np.inf
    return [int(i) for i in np.argsort(-dev)[:k]]

"""What a user reads off one analysed step: breakdown, top ops, slack, rank skew."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bottleneck_oracle.analysis.cpm import CPMResult, run_cpm
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import GPU_CATEGORIES, Category, EdgeKind, NodeType

BREAKDOWN_KEYS = ("compute", "communication", "cpu_overhead", "idle")


@dataclass(slots=True)
class StepAnalysis:
    graph: ExecutionGraph
    cpm: CPMResult

    @classmethod
    def of(cls, g: ExecutionGraph) -> StepAnalysis:
        return cls(graph=g, cpm=run_cpm(g))

    # -- the numbers -------------------------------------------------------------------

    @property
    def measured(self) -> float:
        """The measured step time: the slowest rank's ProfilerStep span (µs)."""
        return max(self.graph.measured.values())

    def node_class(self) -> np.ndarray:
        """Breakdown class per node: 0 compute, 1 communication, 2 CPU overhead."""
        n = self.graph.nodes
        cat = n["category"]
        ranks_with_gpu = np.unique(n["rank"][n["on_gpu"]])
        cpu_is_overhead = np.isin(n["rank"], ranks_with_gpu)
        out = np.full(len(cat), 2, dtype=np.int8)
        out[np.isin(cat, GPU_CATEGORIES)] = 0
        out[(cat == Category.CPU_OP) & ~cpu_is_overhead] = 0
        out[n["node_type"] == NodeType.NETWORK] = 1
        return out

    def breakdown(self) -> dict[str, float]:
        """Critical path time by class (µs); the four parts add up to the makespan."""
        g, r = self.graph, self.cpm
        parts = np.zeros(4)
        if not len(r.path):
            return dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        klass = self.node_class()
        d = g.nodes["mdur"]
        np.add.at(parts, klass[r.path], d[r.path])
        parts[3] += r.est[r.path[0]]  # from the window start to the first op
        for e in r.path_edges.tolist():
            w = float(g.edges["weight"][e])
            src = int(g.edges["src"][e])
            if w < 0:
                parts[klass[src]] += w  # the next op overlapped the end of this one
            elif g.edges["kind"][e] in (EdgeKind.PROGRAM_ORDER, EdgeKind.LAUNCH) and not g.nodes["on_gpu"][src]:
                parts[2] += w  # framework time between ops on a thread, kernel launch latency
            else:
                parts[3] += w
        return dict(zip(BREAKDOWN_KEYS, parts.tolist()))

    def critical_time(self) -> np.ndarray:
        """Time each node contributes to the critical path (µs, 0 off the path)."""
        t = np.zeros(self.graph.n_nodes)
        t[self.cpm.path] = self.graph.nodes["mdur"][self.cpm.path]
        return t

    def top_ops(self, k: int = 20) -> list[dict]:
        """Op names ranked by their total time on the critical path."""
        g = self.graph
        t = self.critical_time()
        on = self.cpm.path
        if not len(on):
            return []
        names = g.nodes["name"][on]
        total = np.bincount(names, weights=t[on])
        count = np.bincount(names)
        order = np.argsort(-total)[:k]
        ms = self.cpm.makespan or 1.0
        return [
            {
                "name": g.names[i],
                "critical_us": float(total[i]),
                "share": float(total[i] / ms),
                "count": int(count[i]),
            }
            for i in order
            if total[i] > 0
        ]

    def lowest_slack_comm(self, k: int = 10) -> list[dict]:
        g, r = self.graph, self.cpm
        n = g.nodes
        net = np.flatnonzero((n["node_type"] == NodeType.NETWORK) & (n["category"] != Category.BARRIER))
        order = net[np.lexsort((-n["dur"][net], r.slack[net]))][:k]
        return [
            {
                "node": int(i),
                "name": g.node_name(i),
                "rank": int(n["rank"][i]),
                "slack_us": float(r.slack[i]),
                "dur_us": float(n["dur"][i]),
                "wait_us": float(n["mstart"][i] - n["start"][i]),
                "msg_bytes": None if np.isnan(n["msg_bytes"][i]) else float(n["msg_bytes"][i]),
                "critical": bool(r.critical[i]),
            }
            for i in order
        ]

    def ranks(self) -> list[dict]:
        """Per-rank step span, time spent waiting in collectives, share of the critical path."""
        g, r = self.graph, self.cpm
        n = g.nodes
        t = self.critical_time()
        wait = n["mstart"] - n["start"]
        out = []
        for rk in g.ranks:
            m = n["rank"] == rk
            out.append(
                {
                    "rank": rk,
                    "step_us": float(g.measured[rk]),
                    "collective_wait_us": float(wait[m & (n["node_type"] == NodeType.NETWORK)].sum()),
                    "critical_us": float(t[m].sum()),
                    "critical_share": float(t[m].sum() / (r.makespan or 1.0)),
                }
            )
        return out

    def straggler(self) -> dict | None:
        """The rank the others wait for: most critical-path time, least collective wait."""
        rows = self.ranks()
        if len(rows) < 2:
            return None
        best = max(rows, key=lambda x: (x["critical_us"], -x["collective_wait_us"]))
        others = [x["collective_wait_us"] for x in rows if x["rank"] != best["rank"]]
        return {"rank": best["rank"], "others_wait_us": float(np.mean(others)) if others else 0.0}

    def to_dict(self, top: int = 20) -> dict:
        g, r = self.graph, self.cpm
        err = (r.makespan - self.measured) / self.measured if self.measured else 0.0
        return {
            "step": g.step,
            "ranks": g.ranks,
            "makespan_us": r.makespan,
            "measured_us": self.measured,
            "makespan_error": err,
            "counts": g.summary_counts(),
            "breakdown_us": self.breakdown(),
            "top_ops": self.top_ops(top),
            "lowest_slack_comm": self.lowest_slack_comm(),
            "per_rank": self.ranks(),
            "straggler": self.straggler(),
            "critical_path_nodes": len(r.path),
        }

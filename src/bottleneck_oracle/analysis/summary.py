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

    def rank_step_times(self) -> dict[int, float]:
        """Each rank's step time from the CPM (µs): from its own step start to the end of its
        last op. Ranks start a step at different times, so the merged window is longer."""
        g, r = self.graph, self.cpm
        rank = g.nodes["rank"]
        out = {}
        for rk in g.ranks:
            m = rank == rk
            out[rk] = float(r.eft[m].max() - g.rank_start(rk)) if m.any() else 0.0
        return out

    @property
    def step_time(self) -> float:
        """Predicted step time: the slowest rank's CPM step time (µs), the CPM's objective."""
        return self.cpm.makespan

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
        """Critical path time by class (µs); the four parts add up to the makespan (the step time:
        idle counts from the step start of the rank whose span it is)."""
        g, r = self.graph, self.cpm
        parts = np.zeros(4)
        if not len(r.path):
            return dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        klass = self.node_class()
        d = g.nodes["mdur"]
        np.add.at(parts, klass[r.path], d[r.path])
        parts[3] += r.est[r.path[0]] - r.path_origin  # from the step start of the slowest rank to the first op
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

    def critical_time(self, with_gaps: bool = False) -> np.ndarray:
        """Time each node contributes to the critical path (µs, 0 off the path): its modelled
        duration, and with ``with_gaps`` also the gap on the path before it (untraced time,
        latencies), so that the parts add up to the makespan."""
        g, r = self.graph, self.cpm
        t = np.zeros(g.n_nodes)
        t[r.path] = g.nodes["mdur"][r.path]
        if with_gaps and len(r.path):
            t[r.path[1:]] += g.edges["weight"][r.path_edges]
            t[r.path[0]] += r.est[r.path[0]] - r.path_origin
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
        order = sorted(np.flatnonzero(total > 0).tolist(), key=lambda i: (-total[i], g.names[i]))[:k]  # ties by name
        ms = self.cpm.makespan or 1.0
        return [
            {
                "name": g.names[i],
                "critical_us": float(total[i]),
                "share": float(total[i] / ms),
                "count": int(count[i]),
            }
            for i in order
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
        t = self.critical_time(with_gaps=True)
        wait = n["mstart"] - n["start"]
        predicted = self.rank_step_times()
        out = []
        for rk in g.ranks:
            m = n["rank"] == rk
            out.append(
                {
                    "rank": rk,
                    "step_us": float(g.measured[rk]),
                    "predicted_step_us": predicted[rk],
                    "collective_wait_us": float(wait[m & (n["node_type"] == NodeType.NETWORK)].sum()),
                    "critical_us": float(t[m].sum()),
                    "critical_share": float(t[m].sum() / (r.makespan or 1.0)),
                }
            )
        return out

    def straggler(self) -> dict | None:
        """The rank the others waited for at the collectives on the critical path: at each such
        barrier, the last participant to arrive imposed the others' waits; reported with the
        longest of them (µs). None if no collective on the critical path made a rank wait."""
        g, r = self.graph, self.cpm
        n, e = g.nodes, g.edges
        imposed: dict[int, float] = {}
        for b in r.path[n["category"][r.path] == Category.BARRIER].tolist():
            edge = int(r.pred[b])
            if edge < 0:
                continue
            culprit = int(n["rank"][e["src"][edge]])
            members = e["dst"][(e["src"] == b) & (e["kind"] != EdgeKind.FEEDS)]
            waited = (n["mstart"] - n["start"])[members[n["rank"][members] != culprit]]
            # the longest wait it caused (waits at collectives on different threads overlap in time)
            imposed[culprit] = max(imposed.get(culprit, 0.0), float(waited.max(initial=0.0)))
        if not imposed or max(imposed.values()) <= 0:
            return None
        rank = max(imposed, key=imposed.get)
        return {"rank": rank, "imposed_wait_us": imposed[rank]}

    def to_dict(self, top: int = 20) -> dict:
        g, r = self.graph, self.cpm
        step_time = self.step_time
        return {
            "step": g.step,
            "ranks": g.ranks,
            "measured_us": self.measured,
            "step_time_us": step_time,
            "step_time_error": (step_time - self.measured) / self.measured if self.measured else 0.0,
            "makespan_us": r.makespan,
            "window_us": r.window,
            "counts": g.summary_counts(),
            "breakdown_us": self.breakdown(),
            "top_ops": self.top_ops(top),
            "lowest_slack_comm": self.lowest_slack_comm(),
            "per_rank": self.ranks(),
            "straggler": self.straggler(),
            "critical_path_nodes": len(r.path),
        }

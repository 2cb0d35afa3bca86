"""What each op of a step was doing, from the trace's ranges: the training phase and micro-batch
of every node, whether a step is a pipeline step, and the analytic step-time formula that
uses them (the textbook baseline the graph network is measured against).

- ``node_phases``: forward / backward / optimizer / DP sync, and the micro-batch, of every node.
- ``is_pipeline``: one rule, used by training and inference alike.
- ``formula_step``: pipeline layouts: step ≈ (m + p - 1)(t_f + t_b) + DP sync + optimizer + the
  rest, with t_f / t_b the slowest stage's mean per-micro-batch forward / backward compute, read
  from the phase ranges; other layouts: the busiest rank's compute (the sum of the modelled,
  non-waiting durations on its training-loop thread).
"""

from __future__ import annotations

import re

import numpy as np

from bottleneck_oracle.analysis.whatif import main_thread
from bottleneck_oracle.graph_pipeline.events import EventTable
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, EdgeKind


def is_pipeline(g: ExecutionGraph, table: EventTable | None) -> bool:
    """A pipeline-parallel step: it has per-micro-batch phase ranges and send/recv nodes."""
    return bool((g.nodes["category"] == Category.P2P).any()) and table is not None and any(".mb" in s for s in table.names)


# phase codes of nodes (node_phases)
NONE, FORWARD, BACKWARD, OPTIMIZER, DP_SYNC = 0, 1, 2, 3, 4
# our hook's phase ranges ("backward", "forward.mb3") and the profiler's own ("## backward ##")
_PHASE = re.compile(r"^(?:## )?(forward|backward|optimizer|dp_allreduce)(?:\.mb(\d+))?(?: ##)?$")
_CODES = {"forward": FORWARD, "backward": BACKWARD, "optimizer": OPTIMIZER, "dp_allreduce": DP_SYNC}
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
"""The range PyTorch records around every optimizer's step (``Optimizer.step#AdamW.step``,
``Optimizer.step#FusedAdam.step``): the optimizer phase in any trace, with or without our ranges."""


def _phase(name: str) -> tuple[int, int]:
    """(phase code, micro-batch index or -1) of a range name already selected by _PHASE or _OPTIMIZER_STEP."""
    m = _PHASE.match(name)
    if m is None:
        if _OPTIMIZER_STEP.match(name):
            return OPTIMIZER, -1
        raise ValueError(f"not a phase range: {name!r}")
    return _CODES[m.group(1)], int(m.group(2)) if m.group(2) else -1


def node_phases(table: EventTable, g: ExecutionGraph) -> tuple[np.ndarray, np.ndarray]:
    """(phase code, micro-batch index or -1) of every node: the innermost phase range
    (``profiler.phase``, the profiler's ``## forward ##`` / ``## backward ##``, or PyTorch's
    ``Optimizer.step#...`` around every optimizer step) on the node's
    rank and thread that contains its start. The autograd engine runs the backward pass on
    threads of its own: a node in no range of its thread that starts while a backward range is
    open on another thread of its rank is in the backward phase. A device op is in the phase of
    the call that launched it (a device can run a step behind its host: what runs on it during
    the host's backward was launched earlier); one whose launch is not in the window keeps the
    phase its start falls in."""
    phase = np.zeros(g.n_nodes, dtype=np.int8)
    mb = np.full(g.n_nodes, -1, dtype=np.int16)
    n, c = g.nodes, table.cols
    ts_rel = g.window_start - table.t0
    name_ok = np.array([bool(_PHASE.match(s) or _OPTIMIZER_STEP.match(s)) for s in table.names], dtype=bool)
    for rank in g.ranks:
        rows = table.window_rows(rank, g)
        rows = rows[name_ok[c["name"][rows]]]
        mine = np.flatnonzero(n["rank"] == rank)
        start = n["start"][mine]
        best = np.full(len(mine), np.inf)
        for r in rows[np.argsort(-c["dur"][rows])]:  # longest first, so inner ranges win
            code, index = _phase(table.names[c["name"][r]])
            lo, hi = c["ts"][r] - ts_rel, c["ts"][r] - ts_rel + c["dur"][r]
            inside = (start >= lo - 0.5) & (start < hi) & (n["tid"][mine] == c["tid"][r]) & (c["dur"][r] < best)
            phase[mine[inside]] = code
            mb[mine[inside]] = index
            best[inside] = c["dur"][r]
        for r in rows[[_phase(table.names[c["name"][r]])[0] == BACKWARD for r in rows]] if len(rows) else rows:
            lo, hi = c["ts"][r] - ts_rel, c["ts"][r] - ts_rel + c["dur"][r]
            other = ~np.isinf(best) | (n["tid"][mine] == c["tid"][r])
            inside = ~other & (start >= lo - 0.5) & (start < hi)
            phase[mine[inside]] = BACKWARD
    e = g.edges
    launch = e["kind"] == EdgeKind.LAUNCH
    src, dst = e["src"][launch], e["dst"][launch]
    on_device = n["on_gpu"][dst]
    phase[dst[on_device]] = phase[src[on_device]]
    mb[dst[on_device]] = mb[src[on_device]]
    return phase, mb


def formula_parts(g: ExecutionGraph, dur: np.ndarray, phase: np.ndarray, mb: np.ndarray) -> dict[str, float]:
    """The pipeline formula's terms (µs): stages p, micro-batches m, the slowest stage's mean
    per-micro-batch forward t_f and backward t_b, DP sync, optimizer, the rest."""
    n = g.nodes
    p = len(g.ranks)
    t_f = t_b = sync = opt = rest = 0.0
    m = 1
    for rank in g.ranks:
        tid = main_thread(g, rank)
        ids = np.flatnonzero((n["rank"] == rank) & (n["tid"] == tid) & ~n["on_gpu"])
        ph, k = phase[ids], mb[ids]
        m = max(m, int(k.max()) + 1 if len(k) else 1)
        for code in (FORWARD, BACKWARD):
            sel = ph == code
            per_mb = np.bincount(k[sel].clip(0), weights=dur[ids][sel]) if sel.any() else np.zeros(1)
            if code == FORWARD:
                t_f = max(t_f, float(per_mb.mean()))
            else:
                t_b = max(t_b, float(per_mb.mean()))
        sync = max(sync, float(dur[ids][ph == DP_SYNC].sum()))
        opt = max(opt, float(dur[ids][ph == OPTIMIZER].sum()))
        rest = max(rest, float(dur[ids][ph == NONE].sum()))
    return {"p": p, "m": m, "t_f": t_f, "t_b": t_b, "sync": sync, "optimizer": opt, "rest": rest}


def pipeline_step(parts: dict[str, float]) -> float:
    """(m + p - 1)(t_f + t_b) + sync + optimizer + rest (a re-split into other micro-batch counts is
    ``whatif --set microbatches=``, analysis.knobs)."""
    return (parts["m"] + parts["p"] - 1) * (parts["t_f"] + parts["t_b"]) + parts["sync"] + parts["optimizer"] + parts["rest"]


def formula_step(g: ExecutionGraph, dur: np.ndarray, phase: np.ndarray, mb: np.ndarray, pipeline: bool) -> float:
    """The analytic step time (µs) with modelled durations ``dur`` (see the module doc)."""
    n = g.nodes
    if not pipeline:
        busy = []
        for rank in g.ranks:
            tid = main_thread(g, rank)
            busy.append(float(dur[(n["rank"] == rank) & (n["tid"] == tid) & ~n["on_gpu"]].sum()))
        return max(busy)
    return pipeline_step(formula_parts(g, dur, phase, mb))

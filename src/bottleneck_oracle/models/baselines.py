"""The analytic and classical baselines the graph network is measured against.

- ``formula_step``: the textbook estimate. Pipeline layouts: step ≈ (m + p - 1)(t_f + t_b)
  + DP sync + optimizer + the rest, with t_f / t_b the slowest stage's mean per-micro-batch
  forward / backward compute, read from the trace's phase ranges. Other layouts: the busiest
  rank's compute (the sum of the modelled, non-waiting durations on its training-loop thread).
- the replay (CPM on the graph: ``analysis.whatif``) is the exact analytic baseline.
- ``pooled_features`` + ``MLPRegressor`` / ``XGBRegressor``: a graph summarised as one vector
  (sums, means and maxima of the node features per type, counts, the what-if's edit size and
  the replay's estimate), regressed on the measured step time.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from torch import nn

from bottleneck_oracle.analysis.whatif import main_thread
from bottleneck_oracle.graph_pipeline.events import EventTable
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph

# phase codes of nodes (node_phases)
NONE, FORWARD, BACKWARD, OPTIMIZER, DP_SYNC = 0, 1, 2, 3, 4
# our hook's phase ranges ("backward", "forward.mb3") and the profiler's own ("## backward ##")
_PHASE = re.compile(r"^(?:## )?(forward|backward|optimizer|dp_allreduce)(?:\.mb(\d+))?(?: ##)?$")
_CODES = {"forward": FORWARD, "backward": BACKWARD, "optimizer": OPTIMIZER, "dp_allreduce": DP_SYNC}


def node_phases(table: EventTable, g: ExecutionGraph) -> tuple[np.ndarray, np.ndarray]:
    """(phase code, micro-batch index or -1) of every node: the innermost phase range
    (``profiler.phase``, or the profiler's ``## forward ##`` / ``## backward ##``) on the node's
    rank and thread that contains its start. The autograd engine runs the backward pass on
    threads of its own: a node in no range of its thread that starts while a backward range is
    open on another thread of its rank is in the backward phase."""
    phase = np.zeros(g.n_nodes, dtype=np.int8)
    mb = np.full(g.n_nodes, -1, dtype=np.int16)
    n, c = g.nodes, table.cols
    ts_rel = g.window_start - table.t0
    name_ok = np.array([bool(_PHASE.match(s)) for s in table.names], dtype=bool)
    for rank in g.ranks:
        rows = table.window_rows(rank, g)
        rows = rows[name_ok[c["name"][rows]]]
        mine = np.flatnonzero(n["rank"] == rank)
        start = n["start"][mine]
        best = np.full(len(mine), np.inf)
        for r in rows[np.argsort(-c["dur"][rows])]:  # longest first, so inner ranges win
            m = _PHASE.match(table.names[c["name"][r]])
            lo, hi = c["ts"][r] - ts_rel, c["ts"][r] - ts_rel + c["dur"][r]
            inside = (start >= lo - 0.5) & (start < hi) & (n["tid"][mine] == c["tid"][r]) & (c["dur"][r] < best)
            phase[mine[inside]] = _CODES[m.group(1)]
            mb[mine[inside]] = int(m.group(2)) if m.group(2) else -1
            best[inside] = c["dur"][r]
        for r in rows[[_PHASE.match(table.names[c["name"][r]]).group(1) == "backward" for r in rows]] if len(rows) else rows:
            lo, hi = c["ts"][r] - ts_rel, c["ts"][r] - ts_rel + c["dur"][r]
            other = ~np.isinf(best) | (n["tid"][mine] == c["tid"][r])
            inside = ~other & (start >= lo - 0.5) & (start < hi)
            phase[mine[inside]] = BACKWARD
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


def pipeline_step(parts: dict[str, float], microbatches: int | None = None) -> float:
    """(m + p - 1)(t_f + t_b) + sync + optimizer + rest; with ``microbatches`` m', the same batch
    split into m' micro-batches: per-micro-batch times scale by m / m'."""
    m = parts["m"]
    m2 = microbatches or m
    return (m2 + parts["p"] - 1) * (parts["t_f"] + parts["t_b"]) * m / m2 + parts["sync"] + parts["optimizer"] + parts["rest"]


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


def pooled_features(data) -> np.ndarray:
    """One vector per sample: per node type the sum / mean / max of every feature column and the
    node count, then log(reference step ms), the edit's size as a share of the step and the
    replay's and the formula's ratio to the reference step."""
    parts = []
    for t in ("compute", "network"):
        x = data[t].x.numpy().astype(np.float64)
        if len(x):
            parts += [x.sum(0) / 1000.0, x.mean(0), x.max(0)]
        else:
            parts += [np.zeros(x.shape[1])] * 3
        parts.append(np.array([np.log1p(len(x))]))
    parts.append(graph_inputs(data).numpy().astype(np.float64))
    return np.concatenate(parts).astype(np.float32)


def graph_inputs(data) -> torch.Tensor:
    """The graph-level inputs every learned model gets (shape [4]): log(reference step ms), the
    edit's size / reference step, log of the replay's and the formula's ratio to the reference."""
    ref = float(data.ref_step)
    edit = float(data.edit_us) if "edit_us" in data else 0.0
    return torch.tensor(
        [np.log(ref / 1000.0), edit / ref, np.log(float(data.replay_step) / ref), np.log(float(data.formula_step) / ref)],
        dtype=torch.float32,
    )


class MLPRegressor(nn.Module):
    """Two hidden layers on the standardised pooled features; predicts log(step / reference)."""

    def __init__(self, n_in: int, hidden: int = 64) -> None:
        super().__init__()
        self.register_buffer("mu", torch.zeros(n_in))
        self.register_buffer("sd", torch.ones(n_in))
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mu) / self.sd).squeeze(-1)


def fit_mlp(x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray, seed: int, epochs: int = 400) -> MLPRegressor:
    """Full-batch Adam with early stopping on the validation MSE."""
    torch.manual_seed(seed)
    model = MLPRegressor(x.shape[1])
    mu, sd = x.mean(0), x.std(0)
    model.mu.copy_(torch.from_numpy(mu))
    model.sd.copy_(torch.from_numpy(np.where(sd > 1e-8, sd, 1.0)))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    xt, yt, xvt, yvt = (torch.from_numpy(a).float() for a in (x, y, xv, yv))
    best, best_state, patience = np.inf, None, 0
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        loss = ((model(xt) - yt) ** 2).mean()
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            v = float(((model(xvt) - yvt) ** 2).mean()) if len(yv) else float(loss)
        if v < best - 1e-9:
            best, best_state, patience = v, {k: t.clone() for k, t in model.state_dict().items()}, 0
        else:
            patience += 1
            if patience > 40:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    return model.eval()


def fit_xgb(x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray, seed: int):
    """Gradient-boosted trees (xgboost-cpu, native API) with early stopping on the validation set."""
    import xgboost as xgb

    params = {
        "max_depth": 4,
        "eta": 0.05,
        "subsample": 0.8,
        "colsample_bytree": 0.8,
        "seed": seed,
        "nthread": 2,
        "objective": "reg:squarederror",
    }
    train = xgb.DMatrix(x, label=y)
    if len(yv):
        val = xgb.DMatrix(xv, label=yv)
        return xgb.train(params, train, num_boost_round=400, evals=[(val, "val")], early_stopping_rounds=30, verbose_eval=False)
    return xgb.train(params, train, num_boost_round=200)

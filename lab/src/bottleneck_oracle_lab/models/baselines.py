"""The classical baselines the graph network is measured against.

- the analytic formula: ``analysis.phases.formula_step``.
- the replay (CPM on the graph: ``analysis.whatif``) is the exact analytic baseline.
- ``pooled_features`` + ``MLPRegressor`` / ``XGBRegressor``: a graph summarised as one vector
  (sums, means and maxima of the node features per type, counts, the what-if's edit size and
  the replay's estimate), regressed on the measured step time.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bottleneck_oracle.models.gat_numpy import graph_features


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
    """``gat_numpy.graph_features`` of a HeteroData sample, as a tensor (shape [4])."""
    edit = float(data.edit_us) if "edit_us" in data else 0.0
    return torch.from_numpy(graph_features(float(data.ref_step), edit, float(data.replay_step), float(data.formula_step)))


class MLPRegressor(nn.Module):
    """Two hidden layers on the standardised pooled features; predicts log(step / reference)."""

    mu: torch.Tensor  # buffers: the features' standardisation
    sd: torch.Tensor

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

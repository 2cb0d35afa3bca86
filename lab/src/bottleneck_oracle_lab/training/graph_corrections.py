"""Training the graph network that corrects the replay (``models.corrections.GraphCorrections``).

``CorrectionNet`` is the PyTorch Geometric module: per node the edit's features
(``models.corrections.FEATURES``, standardised), per edge its kind and latency; messages go along
the dependencies and against them (two ``GATConv`` per layer, summed), so a node's factor can
depend on what waited for it and what it waited for. Its output is a node's log duration factor
(``tanh``: at most e times faster or slower), the last layer starting at zero (every factor 1:
the exact replay).

The targets are those of the ridge model (``training.reruns``): per node the edit leaves in
place, log(its median duration in the clean steps / its median in the perturbed steps), NaN
where the node has no clean twin. The loss weighs each node by its duration, so an error counts
in proportion to the time it moves. Each member of the ensemble trains on a bootstrap resample
of the training conditions with its own seed; the interval is calibrated afterwards
(``training.reruns.calibrate``), on conditions none of the members saw.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import GATConv

from bottleneck_oracle.models.corrections import EDGE_DIM, FEATURES, GraphCorrections, graph_inputs
from bottleneck_oracle_lab.training.reruns import Conditions


class CorrectionNet(nn.Module):
    def __init__(self, hidden: int = 32, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        k = len(FEATURES)
        self.encode = nn.Linear(k, hidden)

        def conv() -> GATConv:
            return GATConv(hidden, hidden // heads, heads=heads, edge_dim=EDGE_DIM, add_self_loops=False)

        self.along = nn.ModuleList(conv() for _ in range(layers))
        self.against = nn.ModuleList(conv() for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        last = nn.Linear(hidden, 1)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.head = nn.Sequential(nn.Linear(hidden + k, hidden), nn.ELU(), last)

    def forward(self, z: torch.Tensor, edge_index: torch.Tensor, attr: torch.Tensor) -> torch.Tensor:
        h = nn.functional.elu(self.encode(z))
        rev = edge_index.flip(0)
        for a, b, norm in zip(self.along, self.against, self.norms):
            h = norm(h + nn.functional.elu(a(h, edge_index, attr) + b(h, rev, attr)))
        return torch.tanh(self.head(torch.cat([h, z], dim=1))[:, 0])


def _samples(train: Conditions, steps_per_condition: int, rng: np.random.Generator) -> list[list[tuple]]:
    """Per condition, up to ``steps_per_condition`` of its steps as (x, edge_index, attr, y, weight)."""
    out = []
    for steps in train.steps:
        pick = rng.permutation(len(steps))[:steps_per_condition]
        cond = []
        for i in pick:
            g, f, y = steps[i]
            keep = np.isfinite(y)
            if not keep.any():
                continue
            x, ei, attr = graph_inputs(g, f)
            w = np.where(keep, np.maximum(g.nodes["mdur"].astype(np.float64), 0.0), 0.0)
            cond.append(
                (x, ei, attr, np.where(keep, np.clip(y, -1.0, 1.0), 0.0).astype(np.float32), (w / max(w.sum(), 1e-9)).astype(np.float32))
            )
        if cond:
            out.append(cond)
    return out


def _batches(samples: list[tuple], size: int, mean: np.ndarray, std: np.ndarray):
    """Disjoint unions of ``size`` step graphs as tensors."""
    for s in range(0, len(samples), size):
        part = samples[s : s + size]
        offs = np.cumsum([0] + [len(p[0]) for p in part[:-1]])
        x = np.concatenate([p[0] for p in part])
        yield (
            torch.from_numpy(((x - mean) / std).astype(np.float32)),
            torch.from_numpy(np.concatenate([p[1] + o for p, o in zip(part, offs)], axis=1)),
            torch.from_numpy(np.concatenate([p[2] for p in part])),
            torch.from_numpy(np.concatenate([p[3] for p in part])),
            torch.from_numpy(np.concatenate([p[4] for p in part])),
        )


def fit_graph_corrections(
    train: Conditions,
    members: int = 4,
    epochs: int = 15,
    steps_per_condition: int = 6,
    batch: int = 8,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    lr: float = 3e-3,
    seed: int = 0,
    log: bool = False,
) -> GraphCorrections:
    """The ensemble on the training conditions' matched nodes; uncalibrated (``reruns.calibrate``)."""
    rng = np.random.default_rng(seed)
    per_cond = _samples(train, steps_per_condition, rng)
    if not per_cond:
        raise ValueError("no training conditions with matched nodes")
    xs = np.concatenate([s[0] for cond in per_cond for s in cond]).astype(np.float64)
    mean, std = xs.mean(axis=0), xs.std(axis=0)
    std[std == 0] = 1.0
    every = np.concatenate([f.x for steps in train.steps for _, f, _ in steps]).astype(np.float64)  # the range inference sees
    torch.manual_seed(seed)
    states = []
    t0 = time.monotonic()
    for m in range(members):
        net = CorrectionNet(hidden, layers, heads)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        pick = rng.integers(0, len(per_cond), len(per_cond))  # bootstrap over conditions
        samples = [s for i in pick for s in per_cond[i]]
        for epoch in range(epochs):
            order = rng.permutation(len(samples))
            total = 0.0
            for z, ei, attr, y, w in _batches([samples[i] for i in order], batch, mean, std):
                opt.zero_grad()
                loss = (w * (net(z, ei, attr) - y) ** 2).sum() / max(float(w.sum()), 1e-9)
                loss.backward()
                opt.step()
                total += float(loss.detach())
            if log:
                print(
                    f"  member {m + 1}/{members} epoch {epoch + 1}/{epochs}: loss {total:.4f} ({time.monotonic() - t0:.0f} s)",
                    file=sys.stderr,
                )
        states.append({k: v.detach().numpy().astype(np.float32) for k, v in net.state_dict().items()})
    return GraphCorrections(
        states,
        mean,
        std,
        every.min(axis=0),
        every.max(axis=0),
        hidden=hidden,
        layers=layers,
        heads=heads,
        trained_on=f"{len(per_cond)} paired conditions",
    )

"""HeteroGAT: graph attention over the execution graph's typed nodes and edges.

Input: the HeteroData of ``graph_pipeline.hetero`` (node types ``compute`` / ``network``, edge
types ``depends_on``, ``triggers``, ``feeds``, ``syncs``). Three variants:

- ``bidirectional``: every edge type also carried backwards (``rev_<rel>``), so a node hears
  both what it waits for and what waits for it.
- ``directed``: messages only along dependencies (a node hears its predecessors), the way time
  flows through the graph.
- ``correction``: directed, and given the replay's answer: per node the CPM's EST, slack and
  criticality on the input graph, per graph the replay's (and the formula's) estimate; its step
  head learns a correction to the replay, starting at zero (it predicts the replay at init).

Heads: graph-level log(step / reference step), node-level slack (log1p of ms) and
criticality (a logit). The reference step is the input trace's measured step (for a what-if,
the unedited baseline), so every prediction is relative to something the user has measured.

This module is what training runs. Inference runs ``models.gat_numpy.NumpyGAT``, the same
forward in numpy on this module's state dict (tested equal), so it needs no torch; the config,
the edge types and the input transforms (``prepare``) are defined there once for both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch import nn
from torch_geometric.nn import GATConv, HeteroConv, global_max_pool, global_mean_pool

from bottleneck_oracle.models.gat_numpy import CPM_INPUTS, NODE_TYPES, VARIANTS, GATConfig, edge_types, model_inputs
from bottleneck_oracle_lab.models.pyg import from_heterodata

__all__ = ["CPM_INPUTS", "NODE_TYPES", "VARIANTS", "GATConfig", "HeteroGAT", "edge_types", "in_dims_of", "prepare"]


def prepare(data, variant: str):
    """Model inputs of one sample (in place; ``gat_numpy.model_inputs``, the definition inference
    uses too): ``x_in`` per node type, ``edge_in`` (and the reverse edges for the bidirectional
    variant) per edge type, ``g_in``."""
    if getattr(data, "_prepared", None) == variant:
        return data
    inp = model_inputs(from_heterodata(data), variant)
    for t in NODE_TYPES:
        data[t].x_in = torch.from_numpy(inp.x[t])
    for et in edge_types(variant):
        if et[1].startswith("rev_"):
            data[et].edge_index = torch.from_numpy(inp.edge_index[et])
        data[et].edge_in = torch.from_numpy(inp.edge_in[et])
    data.g_in = torch.from_numpy(inp.g_in).unsqueeze(0)
    data._prepared = variant
    return data


class HeteroGAT(nn.Module):
    def __init__(self, cfg: GATConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        dims = dict(cfg.in_dims)
        self.encode = nn.ModuleDict({t: nn.Linear(dims[t], h) for t in NODE_TYPES})
        self.types = edge_types(cfg.variant)
        self.convs = nn.ModuleList(
            HeteroConv(
                {
                    et: GATConv((h, h), h // cfg.heads, heads=cfg.heads, edge_dim=cfg.edge_dim, add_self_loops=False, dropout=cfg.dropout)
                    for et in self.types
                },
                aggr="sum",
            )
            for _ in range(cfg.layers)
        )
        self.norms = nn.ModuleList(nn.ModuleDict({t: nn.LayerNorm(h) for t in NODE_TYPES}) for _ in range(cfg.layers))
        n_g = 4 if cfg.variant == "correction" else 2
        self.step_head = nn.Sequential(nn.Linear(4 * h + n_g, h), nn.ELU(), nn.Linear(h, 1))
        if cfg.variant == "correction":  # start as the replay
            last = cast(nn.Linear, self.step_head[-1])
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)
        self.node_head = nn.ModuleDict({t: nn.Sequential(nn.Linear(h, h), nn.ELU(), nn.Linear(h, 2)) for t in NODE_TYPES})

    def forward(self, batch) -> dict[str, torch.Tensor]:
        """{'step': log(step / ref) per graph, 'slack_<type>': log1p(slack ms), 'critical_<type>': logits}."""
        h = {t: torch.nn.functional.elu(self.encode[t](batch[t].x_in)) for t in NODE_TYPES}
        edge_index = {et: batch[et].edge_index for et in self.types}
        edge_attr = {et: batch[et].edge_in for et in self.types}
        for conv, norm in zip(self.convs, cast("Iterable[nn.ModuleDict]", self.norms)):
            msg = conv(h, edge_index, edge_attr_dict=edge_attr)
            h = {t: norm[t](h[t] + torch.nn.functional.elu(msg[t])) if t in msg else h[t] for t in NODE_TYPES}
        n_graphs = batch.g_in.shape[0]
        pooled = []
        for t in NODE_TYPES:
            b = batch[t].batch if hasattr(batch[t], "batch") else torch.zeros(len(h[t]), dtype=torch.long)
            pooled += [global_mean_pool(h[t], b, size=n_graphs), global_max_pool(h[t], b, size=n_graphs)]
        pooled = [torch.nan_to_num(p, neginf=0.0) for p in pooled]
        out = {"step": self.step_head(torch.cat([*pooled, batch.g_in], dim=1)).squeeze(-1)}
        if self.cfg.variant == "correction":
            out["step"] = out["step"] + batch.g_in[:, 2]
        for t in NODE_TYPES:
            y = self.node_head[t](h[t])
            out[f"slack_{t}"], out[f"critical_{t}"] = y[:, 0], y[:, 1]
        return out


def in_dims_of(data, variant: str) -> tuple[tuple[str, int], ...]:
    prepare(data, variant)
    return tuple((t, int(data[t].x_in.shape[1])) for t in NODE_TYPES)

"""The graph network's input as PyTorch Geometric reads it for training: ``GraphArrays``
(``bottleneck_oracle.models.hetero``, numpy) as a ``HeteroData``, and a HeteroData as a flat dict
of plain tensors for the dataset's files (``torch.load(weights_only=True)`` reads them)."""

from __future__ import annotations

import torch
from torch_geometric.data import HeteroData

from bottleneck_oracle.analysis.cpm import CPMResult
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import EDGE_TYPES, NODE_TYPE_NAMES
from bottleneck_oracle.models.hetero import FEATURE_VERSION, SCALARS, GraphArrays, graph_arrays


def heterodata(a: GraphArrays) -> HeteroData:
    """The arrays of one graph (``models.hetero.graph_arrays``) as a PyG HeteroData, validated."""
    data = HeteroData()
    for t, arrays in a.nodes.items():
        for k, v in arrays.items():
            data[t][k] = torch.from_numpy(v)
    for k, x in a.scalars.items():
        data[k] = torch.tensor([x], dtype=torch.float32)
    for triple, arrays in a.edges.items():
        for k, v in arrays.items():
            data[triple][k] = torch.from_numpy(v)
    data.validate(raise_on_error=True)
    return data


def from_heterodata(data) -> GraphArrays:
    """A (single-graph) HeteroData's node, edge and per-graph values as numpy arrays."""
    nodes = {t: {k: v.numpy() for k, v in data[t].items()} for t in NODE_TYPE_NAMES.values()}
    edges = {triple: {k: v.numpy() for k, v in data[triple].items()} for triple in EDGE_TYPES}
    return GraphArrays(nodes, edges, {k: float(data[k]) for k in SCALARS if k in data})


def to_heterodata(g: ExecutionGraph, cpm: CPMResult | None = None):
    """The PyG HeteroData of a graph, with CPM labels; validated."""
    return heterodata(graph_arrays(g, cpm))


def to_tensors(data) -> dict[str, torch.Tensor]:
    """A HeteroData as a flat dict of plain tensors (torch.load(weights_only=True) can read it)."""
    out = {"feature_version": torch.tensor(FEATURE_VERSION)}
    for t in NODE_TYPE_NAMES.values():
        for k, v in data[t].items():
            out[f"{t}/{k}"] = v
    for triple in EDGE_TYPES:
        for k, v in data[triple].items():
            out[f"{'__'.join(triple)}/{k}"] = v
    for k in ("y_step", "ref_step", "replay_step", "formula_step", "edit_us"):
        if k in data:
            out[k] = data[k]
    return out


def from_tensors(tensors: dict[str, torch.Tensor]):
    """The HeteroData back from to_tensors' dict."""
    if int(tensors.get("feature_version", torch.tensor(-1))) != FEATURE_VERSION:
        raise ValueError(
            f"feature version {int(tensors.get('feature_version', torch.tensor(-1)))} is not {FEATURE_VERSION}; rebuild the dataset"
        )
    data = HeteroData()
    for key, v in tensors.items():
        if "/" not in key:
            if key != "feature_version":
                data[key] = v
            continue
        where, attr = key.split("/", 1)
        store = data[tuple(where.split("__"))] if "__" in where else data[where]
        store[attr] = v
    data.validate(raise_on_error=True)
    return data

"""ExecutionGraph -> the graph network's input: node features, typed edges, CPM labels.

Node types ``compute`` and ``network`` (barriers included), edge types the schema's
(src, rel, dst) triples; every edge keeps its kind and weight as attributes. Features
(one row per node; µs values on a log scale, shares of the measured step):

compute  (Shapes: x [n_compute, 6 + MODEL_CATEGORIES])
  log1p(modelled duration µs), log1p(measured duration µs), modelled duration / step,
  on_gpu, rank / (ranks - 1), start / step, category one-hot
network  (Shapes: x [n_network, 7 + len(CollectiveKind)])
  log1p(modelled duration µs), log1p(measured duration µs), modelled duration / step,
  log1p(message bytes), group size / ranks, is barrier, rank / (ranks - 1) (-1 for barriers),
  collective-kind one-hot
edges  (Shapes: edge_index [2, n_edges], edge_attr [n_edges, 1 + len(EdgeKind)])
  weight µs / 1000, edge-kind one-hot

Labels: ``y_step`` (measured step time µs, shape [1]), per node ``slack`` and ``est`` (µs)
and ``critical`` (bool) from the CPM, and ``node_id`` (the ExecutionGraph row of each node).
Dataset samples (training.dataset) add, shape [1] each: ``ref_step`` (the measured step the
features are relative to; for a what-if sample the unedited baseline's), ``replay_step`` and
``formula_step`` (the replay's and the analytic formula's estimate of y_step) and ``edit_us``
(the what-if's added time; 0 for a graph as recorded).

``graph_arrays`` builds all of it in numpy (``GraphArrays``: what inference reads, without
torch); the lab's ``bottleneck_oracle_lab.models.pyg`` turns those arrays into a PyG HeteroData
(what training reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bottleneck_oracle.analysis.cpm import CPMResult, run_cpm
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import EDGE_TYPES, Category, CollectiveKind, EdgeKind, NodeType

MODEL_CATEGORIES = 8  # category one-hot width the shipped models were trained with (BLOCKING reads as RUNTIME)

FEATURE_VERSION = 3  # 3: the THREAD edge kind

COMPUTE_COLUMNS = ["log1p_mdur_us", "log1p_dur_us", "mdur_share_of_step", "on_gpu", "rank_position", "start_share_of_step"] + [
    f"category_{c.name.lower()}" for c in Category if c < MODEL_CATEGORIES
]
NETWORK_COLUMNS = [
    "log1p_mdur_us",
    "log1p_dur_us",
    "mdur_share_of_step",
    "log1p_msg_bytes",
    "group_share_of_ranks",
    "is_barrier",
    "rank_position",
] + [f"collective_{k.name.lower()}" for k in CollectiveKind]
EDGE_COLUMNS = ["weight_ms"] + [f"kind_{k.name.lower()}" for k in EdgeKind]


def feature_schema() -> dict[str, list[str]]:
    """The feature columns a model is trained on (checkpoints store it; a mismatch is refused)."""
    return {"version": [str(FEATURE_VERSION)], "compute": COMPUTE_COLUMNS, "network": NETWORK_COLUMNS, "edge": EDGE_COLUMNS}


def _one_hot(values: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((len(values), n), dtype=np.float32)
    ok = (values >= 0) & (values < n)
    out[np.flatnonzero(ok), values[ok].astype(np.int64)] = 1.0
    return out


def node_features(g: ExecutionGraph) -> dict[str, np.ndarray]:
    """Feature matrix per node type (float32), rows in ExecutionGraph order within each type."""
    n = g.nodes
    step = max(g.measured.values()) or 1.0
    ranks = max(len(g.ranks) - 1, 1)
    pos = np.where(n["rank"] >= 0, n["rank"] / ranks, -1.0)
    common = [np.log1p(n["mdur"]), np.log1p(n["dur"]), n["mdur"] / step]
    comp = np.column_stack([*common, n["on_gpu"].astype(float), pos, n["start"] / step]).astype(np.float32)
    cat = n["category"].astype(np.int64)
    cat = np.where(cat == Category.BLOCKING, Category.RUNTIME, cat)  # the trained models know the first 8 categories
    comp = np.hstack([comp, _one_hot(cat, MODEL_CATEGORIES)])
    msg = np.nan_to_num(n["msg_bytes"], nan=0.0)
    net = np.column_stack(
        [
            *common,
            np.log1p(msg),
            np.maximum(n["group_size"], 0) / max(len(g.ranks), 1),
            (n["category"] == Category.BARRIER).astype(float),
            pos,
        ]
    ).astype(np.float32)
    net = np.hstack([net, _one_hot(n["coll_kind"].astype(np.int64), len(CollectiveKind))])
    is_net = n["node_type"] == NodeType.NETWORK
    return {"compute": comp[~is_net], "network": net[is_net]}


SCALARS = ("y_step", "ref_step", "replay_step", "formula_step", "edit_us")


def f32(v: float) -> float:
    """``v`` rounded to float32, as a shape-[1] float32 tensor holds it."""
    return float(np.float32(v))


@dataclass(slots=True)
class GraphArrays:
    """A graph's model input in numpy: per node type ``x``, ``slack``, ``est``, ``critical``,
    ``node_id``; per edge type ``edge_index``, ``edge_attr``; the per-graph scalars (float32
    values; None where not set). ``bottleneck_oracle_lab.models.pyg.heterodata`` gives the same as a PyG HeteroData."""

    nodes: dict[str, dict[str, np.ndarray]]
    edges: dict[tuple[str, str, str], dict[str, np.ndarray]]
    scalars: dict[str, float] = field(default_factory=dict)

    def set(self, **values: float) -> None:
        for k, v in values.items():
            if k not in SCALARS:
                raise KeyError(k)
            self.scalars[k] = f32(v)


def graph_arrays(g: ExecutionGraph, cpm: CPMResult | None = None) -> GraphArrays:
    """The model input of a graph in numpy, with CPM labels."""
    r = cpm or run_cpm(g)
    n, e = g.nodes, g.edges
    is_net = n["node_type"] == NodeType.NETWORK
    local = np.empty(g.n_nodes, dtype=np.int64)  # index of each node within its type
    local[~is_net] = np.arange(int((~is_net).sum()))
    local[is_net] = np.arange(int(is_net.sum()))
    feats = node_features(g)
    critical = r.critical
    nodes = {
        t: {
            "x": feats[t],
            "slack": r.slack[mask].astype(np.float32),
            "est": r.est[mask].astype(np.float32),
            "critical": critical[mask],
            "node_id": np.flatnonzero(mask),
        }
        for t, mask in (("compute", ~is_net), ("network", is_net))
    }
    src_t, dst_t = n["node_type"][e["src"]], n["node_type"][e["dst"]]
    attr = np.hstack([(e["weight"] / 1000.0)[:, None], _one_hot(e["kind"].astype(np.int64), len(EdgeKind))]).astype(np.float32)
    edges = {}
    for triple in EDGE_TYPES:
        s_type = NodeType.COMPUTE if triple[0] == "compute" else NodeType.NETWORK
        d_type = NodeType.COMPUTE if triple[2] == "compute" else NodeType.NETWORK
        m = (src_t == s_type) & (dst_t == d_type)
        edges[triple] = {"edge_index": np.stack([local[e["src"][m]], local[e["dst"][m]]]), "edge_attr": attr[m]}
    out = GraphArrays(nodes, edges)
    out.set(y_step=max(g.measured.values()))
    return out

"""HeteroGAT without torch: its configuration, its inputs and its forward pass in numpy.

Training runs the PyTorch Geometric module (``models.hetero_gat.HeteroGAT``); inference
(``models.predict``) runs ``NumpyGAT`` on the same state dict, so ``whatif``, ``blame`` and
``advise`` consult the graph network without importing torch. ``NumpyGAT`` is the module's
forward in eval mode, operation for operation:

- encoder: ``elu(Linear(x))`` per node type;
- per layer, a HeteroConv (aggr ``sum`` over the edge types into each destination type) of
  GATConv(heads, concat, ``edge_dim``, ``add_self_loops=False``): ``lin_src`` / ``lin_dst`` on
  the source / destination features, attention ``leaky_relu(a_src·x_j + a_dst·x_i +
  a_edge·lin_edge(e), 0.2)`` normalised by a softmax over each destination's incoming edges,
  the weighted sum of ``lin_src(x_j)``, plus the bias (a destination without incoming edges
  gets the bias alone); then ``LayerNorm(h + elu(message))``;
- readout: per node type the mean and the max of the nodes (0 for a type without nodes,
  ``nan_to_num``), with the graph inputs, into the step head; the correction variant adds the
  replay's log ratio (its third graph input); node heads for slack and criticality.

``model_inputs`` is the one definition of what a model reads from a sample (``prepare`` in
``models.hetero_gat`` gives training the same arrays as tensors).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from bottleneck_oracle.config import GAT_VARIANTS
from bottleneck_oracle.graph_pipeline.schema import EDGE_TYPES
from bottleneck_oracle.models.hetero import GraphArrays

VARIANTS = GAT_VARIANTS
NODE_TYPES = ("compute", "network")
CPM_INPUTS = 3  # est / ref, slack / ref, critical
NEGATIVE_SLOPE = 0.2  # GATConv's leaky_relu on the attention logits
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default
SOFTMAX_EPS = 1e-16  # torch_geometric.utils.softmax adds it to each destination's sum


@dataclass(frozen=True, kw_only=True, slots=True)
class GATConfig:
    variant: str = "directed"
    hidden: int = 32
    layers: int = 3
    heads: int = 2
    dropout: float = 0.0
    in_dims: tuple[tuple[str, int], ...] = ()
    edge_dim: int = 0

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS} (found {self.variant!r})")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.layers < 1:
            raise ValueError("layers must be >= 1")

    @classmethod
    def from_dict(cls, d: dict) -> GATConfig:
        d = dict(d)
        d["in_dims"] = tuple((str(a), int(b)) for a, b in d.get("in_dims", ()))
        return cls(**d)


def edge_types(variant: str) -> list[tuple[str, str, str]]:
    types = list(EDGE_TYPES)
    if variant == "bidirectional":
        types += [(d, f"rev_{r}", s) for s, r, d in EDGE_TYPES]
    return types


GRAPH_COLUMNS = ("log_ref_step_ms", "edit_share", "log_replay_ratio", "log_formula_ratio")  # graph_features, in order


def graph_features(ref: float, edit: float, replay: float, formula: float) -> np.ndarray:
    """The graph-level inputs every learned model gets (float32, shape [4]): log(reference step
    ms), the edit's size / reference step, log of the replay's and the formula's ratio to the
    reference (all µs)."""
    return np.array([np.log(ref / 1000.0), edit / ref, np.log(replay / ref), np.log(formula / ref)], dtype=np.float32)


def graph_inputs_of(a: GraphArrays) -> np.ndarray:
    s = a.scalars
    return graph_features(s["ref_step"], s.get("edit_us", 0.0), s["replay_step"], s["formula_step"])


@dataclass(slots=True)
class ModelInputs:
    """What a variant reads from one sample: node features (``x_in``), edges (reverse ones added
    for the bidirectional variant) with their transformed attributes (``edge_in``), graph inputs."""

    x: dict[str, np.ndarray]
    edge_index: dict[tuple[str, str, str], np.ndarray]
    edge_in: dict[tuple[str, str, str], np.ndarray]
    g_in: np.ndarray


def model_inputs(a: GraphArrays, variant: str) -> ModelInputs:
    """Node features with the CPM columns (est / ref, slack / ref, critical) appended for the
    correction variant; edge latency as sign·log1p(|ms|); reverse edges for the bidirectional
    variant; the graph inputs (the first two, or all four for the correction variant)."""
    ref = a.scalars["ref_step"]
    x = {}
    for t in NODE_TYPES:
        store = a.nodes[t]
        xt = store["x"]
        if variant == "correction":
            cpm = (
                np.stack([store["est"] / ref, store["slack"] / ref, store["critical"].astype(np.float32)], axis=1)
                if len(xt)
                else np.zeros((0, CPM_INPUTS), dtype=xt.dtype)
            )
            xt = np.concatenate([xt, cpm.astype(xt.dtype)], axis=1)
        x[t] = xt
    edge_index, edge_in = {}, {}
    for s, r, d in EDGE_TYPES:
        attr = a.edges[(s, r, d)]["edge_attr"]
        w = attr[:, :1]
        edge_index[(s, r, d)] = a.edges[(s, r, d)]["edge_index"]
        edge_in[(s, r, d)] = np.concatenate([np.sign(w) * np.log1p(np.abs(w)), attr[:, 1:]], axis=1)
        if variant == "bidirectional":
            edge_index[(d, f"rev_{r}", s)] = edge_index[(s, r, d)][[1, 0]]
            edge_in[(d, f"rev_{r}", s)] = edge_in[(s, r, d)]
    g = graph_inputs_of(a)
    return ModelInputs(x, edge_index, edge_in, g if variant == "correction" else g[:2])


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    y = x @ w.T
    return y + b if b is not None else y


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(LAYER_NORM_EPS)) * w + b


def _segments(dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The edges grouped by destination: (edge order, first position of each group, the group's
    destination, each ordered edge's group)."""
    order = np.argsort(dst, kind="stable")
    d = dst[order]
    starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
    return order, starts, d[starts], np.cumsum(np.r_[False, d[1:] != d[:-1]])


@dataclass(slots=True)
class ConvWeights:
    lin_src: np.ndarray
    lin_dst: np.ndarray
    att_src: np.ndarray  # [heads, channels]
    att_dst: np.ndarray
    lin_edge: np.ndarray | None
    att_edge: np.ndarray | None
    res: np.ndarray | None
    bias: np.ndarray | None


def gat_conv(
    p: ConvWeights, heads: int, ch: int, x_src: np.ndarray, x_dst: np.ndarray, edge_index: np.ndarray, edge_in: np.ndarray | None, seg
) -> np.ndarray:
    """One GATConv (concat heads, ``add_self_loops=False``) in eval mode: ``seg`` is
    ``_segments(edge_index[1])`` (None when there are no edges)."""
    xs = _linear(x_src, p.lin_src).reshape(-1, heads, ch)
    xd = _linear(x_dst, p.lin_dst).reshape(-1, heads, ch)
    out: np.ndarray = np.zeros((len(x_dst), heads, ch), dtype=np.float32)
    if edge_index.shape[1]:
        src, dst = edge_index
        order, starts, ids, group = seg
        alpha = (xs * p.att_src).sum(-1)[src] + (xd * p.att_dst).sum(-1)[dst]
        if p.lin_edge is not None and p.att_edge is not None and edge_in is not None:
            alpha = alpha + (_linear(edge_in, p.lin_edge).reshape(-1, heads, ch) * p.att_edge).sum(-1)
        alpha = np.where(alpha > 0, alpha, np.float32(NEGATIVE_SLOPE) * alpha)[order]
        # softmax over each destination's incoming edges (max-shifted), then the weighted sum of messages
        ex = np.exp(alpha - np.maximum.reduceat(alpha, starts, axis=0)[group])
        att = ex / (np.add.reduceat(ex, starts, axis=0) + np.float32(SOFTMAX_EPS))[group]
        out[ids] = np.add.reduceat(att[..., None] * xs[src[order]], starts, axis=0)
    out = out.reshape(-1, heads * ch)
    if p.res is not None:
        out = out + _linear(x_dst, p.res)
    if p.bias is not None:
        out = out + p.bias
    return out


class NumpyGAT:
    """The eval-mode forward of a ``HeteroGAT`` state dict (any PyG key naming of its HeteroConv)."""

    def __init__(self, cfg: GATConfig, state: Mapping[str, np.ndarray]) -> None:
        self.cfg = cfg
        self.types = edge_types(cfg.variant)
        self.heads, self.channels = cfg.heads, cfg.hidden // cfg.heads
        used: set[str] = set()

        h, dims = cfg.hidden, dict(cfg.in_dims)
        n_g = 4 if cfg.variant == "correction" else 2
        att = (1, self.heads, self.channels)

        def maybe(key: str, shape: tuple[int, ...]) -> np.ndarray | None:
            """The weight ``key`` (None if the model has none), checked to have ``shape``."""
            if key not in state:
                return None
            used.add(key)
            a = np.asarray(state[key], dtype=np.float32)
            if a.shape != shape:
                raise ValueError(f"the {cfg.variant} model's {key} is {a.shape}, its config builds {shape}")
            return a

        def get(key: str, shape: tuple[int, ...]) -> np.ndarray:
            a = maybe(key, shape)
            if a is None:
                raise ValueError(f"the {cfg.variant} model's weights lack {key}")
            return a

        def conv(layer: int, et: tuple[str, str, str]) -> ConvWeights:
            names = [f"convs.{layer}.convs.<{'___'.join(et)}>.", f"convs.{layer}.convs.{'__'.join(et)}."]
            prefix = next((p for p in names if f"{p}att_src" in state), names[0])
            shared = maybe(prefix + "lin.weight", (h, h))
            hc = (self.heads, self.channels)
            att_edge = maybe(prefix + "att_edge", att)
            return ConvWeights(
                lin_src=shared if shared is not None else get(prefix + "lin_src.weight", (h, h)),
                lin_dst=shared if shared is not None else get(prefix + "lin_dst.weight", (h, h)),
                att_src=get(prefix + "att_src", att).reshape(hc),
                att_dst=get(prefix + "att_dst", att).reshape(hc),
                lin_edge=maybe(prefix + "lin_edge.weight", (h, cfg.edge_dim)),
                att_edge=None if att_edge is None else att_edge.reshape(hc),
                res=maybe(prefix + "res.weight", (h, h)),
                bias=maybe(prefix + "bias", (h,)),
            )

        self.encode = {t: (get(f"encode.{t}.weight", (h, dims[t])), get(f"encode.{t}.bias", (h,))) for t in NODE_TYPES}
        self.convs = [{et: conv(i, et) for et in self.types} for i in range(cfg.layers)]
        self.norms = [
            {t: (get(f"norms.{i}.{t}.weight", (h,)), get(f"norms.{i}.{t}.bias", (h,))) for t in NODE_TYPES} for i in range(cfg.layers)
        ]
        self.step_head = [
            (get(f"step_head.{i}.weight", (o, n)), get(f"step_head.{i}.bias", (o,))) for i, o, n in ((0, h, 4 * h + n_g), (2, 1, h))
        ]
        self.node_head = {
            t: [(get(f"node_head.{t}.{i}.weight", (o, h)), get(f"node_head.{t}.{i}.bias", (o,))) for i, o in ((0, h), (2, 2))]
            for t in NODE_TYPES
        }
        unused = sorted(set(state) - used)
        if unused:  # a module this forward does not reproduce
            raise ValueError(f"the {cfg.variant} model has weights this version does not use: {', '.join(unused[:5])}")

    def __call__(self, inp: ModelInputs) -> dict[str, np.ndarray]:
        """{'step': log(step / ref), shape [1]; 'slack_<type>': log1p(slack ms); 'critical_<type>': logits}."""
        h = {t: _elu(_linear(inp.x[t].astype(np.float32, copy=False), *self.encode[t])) for t in NODE_TYPES}
        seg = {et: _segments(inp.edge_index[et][1]) for et in self.types if inp.edge_index[et].shape[1]}
        for convs, norms in zip(self.convs, self.norms):
            msg: dict[str, np.ndarray] = {}
            for et in self.types:  # HeteroConv, aggr="sum"
                s, _, d = et
                y = gat_conv(convs[et], self.heads, self.channels, h[s], h[d], inp.edge_index[et], inp.edge_in[et], seg.get(et))
                msg[d] = y if d not in msg else msg[d] + y
            h = {t: _layer_norm(h[t] + _elu(msg[t]), *norms[t]) if t in msg else h[t] for t in NODE_TYPES}
        pooled = []
        for t in NODE_TYPES:
            n = len(h[t])
            pooled += [
                h[t].mean(0) if n else np.zeros(self.cfg.hidden, np.float32),
                h[t].max(0) if n else np.zeros(self.cfg.hidden, np.float32),
            ]
        z = np.concatenate([np.nan_to_num(p, neginf=0.0) for p in pooled] + [inp.g_in.astype(np.float32)])[None, :]
        (w0, b0), (w2, b2) = self.step_head
        step = _linear(_elu(_linear(z, w0, b0)), w2, b2)[:, 0]
        if self.cfg.variant == "correction":
            step = step + inp.g_in[2]
        out = {"step": step}
        for t in NODE_TYPES:
            (w0, b0), (w2, b2) = self.node_head[t]
            y = _linear(_elu(_linear(h[t], w0, b0)), w2, b2)
            out[f"slack_{t}"], out[f"critical_{t}"] = y[:, 0], y[:, 1]
        return out

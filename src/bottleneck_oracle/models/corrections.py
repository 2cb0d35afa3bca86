"""Per-node duration corrections to the replay: what the exact replay cannot know.

The replay keeps every op's duration as measured when an edit removes or shortens work. On a
real machine the other ops change too: a rank that sleeps less leaves less time for the other
to run alone, ops after a stall start with cold caches, a shorter step moves a collective's
wait. ``Corrections`` predicts, for every node an edit leaves in place, the factor its duration
changes by (log(after / before), as measured on paired re-runs: ``generate --paired``), and the
CPM composes the corrected durations exactly like the replay. Two models give the factors:

- ``Corrections``: an ensemble of ridge regressions (bootstrap resamples of the training
  conditions) over ``FEATURES`` and their products with a node's relation to the edited work;
- ``GraphCorrections``: an ensemble of graph attention networks over the step's execution
  graph (``FEATURES`` per node, the edge's kind and latency per edge, messages along and against
  the dependencies), so a node's factor can depend on what runs before and after it. Training
  runs the PyTorch Geometric module (``training.graph_corrections``); this module runs the same
  forward in numpy (``models.gat_numpy.gat_conv``).

Both report a 90% interval on the corrected saving (split conformal on held-out conditions: the
quantile of |measured - corrected| over the time the edit removes). Numpy only (no torch):
``whatif`` runs them wherever the analysis runs. They answer only edits of the kind they were
trained on (they shorten or remove work; nothing lengthens) with node features inside their
training range (``refusal``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from bottleneck_oracle.analysis.cpm import CPMResult, run_cpm
from bottleneck_oracle.analysis.whatif import EditedTimes
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.files import check_archive
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, EdgeKind
from bottleneck_oracle.models.gat_numpy import ConvWeights, _elu, _layer_norm, _linear, _segments, gat_conv

PRETRAINED = "corrections.npz"
FEATURES = (
    "log_dur",  # log1p(modelled duration, µs)
    "same_rank",  # on a rank the edit touches
    "after_edited",  # starts after the last edited node ended
    "log_after",  # log1p(µs from that end to the node's start)
    "concurrent",  # on another rank, running while the edited work ran
    "cpu_op",
    "collective",  # collective or send/recv
    "runtime",
    "critical",  # on the critical path before the edit (slack <= 1 µs)
    "log_removed",  # log1p(µs of work and untraced time the edit removes)
)
RELATIONS = (1, 2, 4)  # same_rank, after_edited, concurrent: crossed with every feature
MARGIN = 0.25  # a term may leave its training range by this share of the range before the input is out of domain


@dataclass(frozen=True, slots=True)
class CorrectedSaving:
    """The corrected replay's answer to one edit: its saving (µs) and the 90% interval of it; or
    None for both and ``out_of_domain`` saying why the corrections do not answer."""

    saving_us: float | None
    interval_us: tuple[float, float] | None
    out_of_domain: str | None


@dataclass(slots=True)
class EditFeatures:
    """Per node of one step: model inputs, and the edited times."""

    x: np.ndarray  # [n, len(FEATURES)] float32
    times: EditedTimes  # the step's durations, latencies and releases after the edit
    edited: np.ndarray  # bool: nodes the edit changed (removed work)
    removed_us: float  # work and untraced time the edit removes, µs
    lengthens: bool  # the edit adds time somewhere (outside what the corrections were trained on)
    gpu: bool = False  # the step has GPU ops (the corrections were trained on CPU runs)


def edit_features(times: EditedTimes, base: CPMResult | None = None) -> EditFeatures:
    """How each node stands to the work an edit (``times``: ``whatif.apply_edits``) changes: on the
    edited rank or not, after the edited work (and how long after), running on another rank while
    it ran; the node's own duration, category and criticality; and the total removed."""
    g = times.graph
    n = g.nodes
    d0 = n["mdur"].astype(np.float64)
    delta = times.delta()
    edited = delta.changed_nodes(g.edges["src"])
    removed_us = delta.removed_us
    lengthens = delta.lengthens
    start = n["start"].astype(np.float64)
    if edited.any():
        r0, r1 = float(start[edited].min()), float((start + d0)[edited].max())
    else:
        r0 = r1 = float(start.max())
    base = base or run_cpm(g)
    cat = n["category"]
    ranks = np.unique(n["rank"][edited])
    same = np.isin(n["rank"], ranks)
    after = start >= r1
    concurrent = (~same) & (start < r1) & (start + d0 > r0)
    x = np.column_stack(
        [
            np.log1p(np.maximum(d0, 0.0)),
            same,
            after,
            np.log1p(np.maximum(start - r1, 0.0)),
            concurrent,
            cat == Category.CPU_OP,
            np.isin(cat, [Category.COLLECTIVE, Category.P2P]),
            np.isin(cat, [Category.RUNTIME, Category.BLOCKING]),
            base.slack <= 1.0,
            np.full(g.n_nodes, math.log1p(max(removed_us, 0.0))),
        ]
    ).astype(np.float32)
    return EditFeatures(x, times, edited, removed_us, lengthens, bool(n["on_gpu"].any()))


def terms(x: np.ndarray) -> np.ndarray:
    """The regression's inputs: the features and their products with the relation features."""
    x = x.astype(np.float64)
    return np.column_stack([x] + [x * x[:, [j]] for j in RELATIONS])


def _first_outside(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> int | None:
    """The first column of ``values`` with a value outside its training range [lo, hi] widened
    by ``MARGIN`` of the range on each side (None: all inside)."""
    span = np.maximum(hi - lo, 1e-9)
    bad = np.flatnonzero(((values < lo - MARGIN * span) | (values > hi + MARGIN * span)).any(axis=0))
    return int(bad[0]) if len(bad) else None


class _Corrector:
    """What both models share: the refusal of edits they were not trained on, the corrected
    replay, and the interval. A model gives ``factors(g, f)``, [members, n] duration factors."""

    halfwidth: float
    trained_on: str

    def factors(self, g: ExecutionGraph, f: EditFeatures) -> np.ndarray:
        raise NotImplementedError

    def _range_refusal(self, f: EditFeatures) -> str | None:
        raise NotImplementedError

    def refusal(self, f: EditFeatures) -> str | None:
        """Why the corrections do not answer this edit (None: they do)."""
        if f.gpu:
            return "out of domain: a GPU trace, and the corrections were trained on CPU (gloo) runs only"
        if f.lengthens:
            return "out of domain: the corrections were trained on edits that remove or shorten work, and this edit lengthens some"
        if not f.edited.any():
            return "out of domain: the edit changes no node"
        return self._range_refusal(f)

    def corrected_durations(self, g: ExecutionGraph, f: EditFeatures) -> np.ndarray:
        factor = self.factors(g, f).mean(axis=0)
        return np.where(f.edited, f.times.dur, f.times.dur * factor)

    def saving(self, g: ExecutionGraph, f: EditFeatures, base: CPMResult | None = None) -> float:
        """The corrected replay's saving (µs): the CPM on the edit's durations, every node the edit
        leaves in place scaled by the ensemble's mean factor."""
        base = base or run_cpm(g)
        return base.makespan - run_cpm(g, self.corrected_durations(g, f), f.times.weight, f.times.release).makespan

    def answer(self, times: EditedTimes, base: CPMResult | None = None) -> CorrectedSaving:
        """For an edit (``whatif.apply_edits``' times): the corrected saving (µs) and its 90%
        interval, or why the corrections do not answer it."""
        f = edit_features(times, base)
        reason = self.refusal(f)
        if reason is not None:
            return CorrectedSaving(None, None, reason)
        saving = self.saving(times.graph, f, base)
        return CorrectedSaving(saving, self.interval(saving, f), None)

    def interval(self, saving: float, f: EditFeatures) -> tuple[float, float]:
        half = self.halfwidth * max(f.removed_us, 1.0)
        return saving - half, saving + half


@dataclass(slots=True)
class Corrections(_Corrector):
    coef: np.ndarray  # [members, n_terms + 1]: the last is the intercept
    mean: np.ndarray  # [n_terms]: standardisation of the terms
    std: np.ndarray
    lo: np.ndarray  # [n_terms]: the training range of each term
    hi: np.ndarray
    halfwidth: float = float("inf")
    """90% interval half-width, as a share of the removed time (inf: not calibrated)."""
    trained_on: str = ""

    def node_factors(self, x: np.ndarray) -> np.ndarray:
        """[members, n]: each member's duration factor per node (within [1/e, e])."""
        z = (terms(x) - self.mean) / self.std
        z = np.column_stack([z, np.ones(len(z))])
        out: np.ndarray = np.exp(np.clip(z @ self.coef.T, -1.0, 1.0)).T
        return out

    def factors(self, g: ExecutionGraph, f: EditFeatures) -> np.ndarray:
        return self.node_factors(f.x)

    def _range_refusal(self, f: EditFeatures) -> str | None:
        j = _first_outside(terms(f.x), self.lo, self.hi)
        if j is not None:
            name = FEATURES[j % len(FEATURES)] + ("" if j < len(FEATURES) else f" x {FEATURES[RELATIONS[j // len(FEATURES) - 1]]}")
            return f"out of domain: node term {name} outside its training range [{self.lo[j]:.3g}, {self.hi[j]:.3g}]"
        return None

    def save(self, path: str | Path) -> None:
        np.savez(
            path,
            kind=np.array("ridge"),
            coef=self.coef,
            mean=self.mean,
            std=self.std,
            lo=self.lo,
            hi=self.hi,
            halfwidth=np.array(self.halfwidth),
            trained_on=np.array(self.trained_on),
            features=np.array(FEATURES),
        )


_Segments = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # gat_numpy._segments of one edge set
# the standardised features, the edges, the reversed edges, and each grouped by destination (None: no edge)
_Prepared = tuple[np.ndarray, np.ndarray, np.ndarray, "_Segments | None", "_Segments | None"]

EDGE_DIM = len(EdgeKind) + 1  # the edge's kind (one-hot) and sign * log1p(|latency ms|)


def graph_inputs(g: ExecutionGraph, f: EditFeatures) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The graph network's inputs for one edit: node features ``f.x`` (raw; the model
    standardises them), edges [2, E] along the dependencies, edge attributes [E, EDGE_DIM]."""
    e = g.edges
    kind = e["kind"].astype(np.int64)
    w = np.nan_to_num(e["weight"].astype(np.float64) / 1000.0, posinf=0.0, neginf=0.0)
    attr = np.zeros((len(kind), EDGE_DIM), dtype=np.float32)
    attr[np.arange(len(kind)), kind] = 1.0
    attr[:, -1] = np.sign(w) * np.log1p(np.abs(w))
    return f.x.astype(np.float32), np.stack([e["src"], e["dst"]]).astype(np.int64), attr


@dataclass(slots=True)
class GraphCorrections(_Corrector):
    """An ensemble of graph attention networks giving each node's log duration factor (within
    [-1, 1]). Per member: ``elu(Linear(x))``; per layer ``LayerNorm(h + elu(GAT_along(h) +
    GAT_against(h)))`` (GATConv, heads concatenated, the edge attributes in the attention);
    head ``tanh(Linear(elu(Linear([h, x]))))``. ``members`` hold the PyTorch Geometric state
    dicts (``training.graph_corrections.CorrectionNet``) as numpy arrays."""

    members: list[dict[str, np.ndarray]]
    mean: np.ndarray  # [len(FEATURES)]: standardisation of the node features
    std: np.ndarray
    lo: np.ndarray  # [len(FEATURES)]: the training range of each feature
    hi: np.ndarray
    hidden: int = 32
    layers: int = 2
    heads: int = 2
    halfwidth: float = float("inf")
    trained_on: str = ""

    def __post_init__(self) -> None:
        h, k = self.hidden, len(FEATURES)
        want = {
            "encode.weight": (h, k),
            "encode.bias": (h,),
            "head.0.weight": (h, h + k),
            "head.0.bias": (h,),
            "head.2.weight": (1, h),
            "head.2.bias": (1,),
        }
        for i in range(self.layers):
            for d in ("along", "against"):
                p = f"{d}.{i}."
                want.update(
                    {
                        p + "lin.weight": (h, h),
                        p + "att_src": (1, self.heads, h // self.heads),
                        p + "att_dst": (1, self.heads, h // self.heads),
                        p + "att_edge": (1, self.heads, h // self.heads),
                        p + "lin_edge.weight": (h, EDGE_DIM),
                        p + "bias": (h,),
                    }
                )
            want.update({f"norms.{i}.weight": (h,), f"norms.{i}.bias": (h,)})
        if not self.members:
            raise ValueError("a graph correction model needs at least one member")
        for m in self.members:
            if set(m) != set(want) or any(tuple(m[key].shape) != shape for key, shape in want.items()):
                wrong = sorted(set(want) ^ set(m)) or [key for key, shape in want.items() if tuple(m[key].shape) != shape]
                raise ValueError(f"member weights do not match the configuration: {', '.join(wrong[:4])}")

    def _conv(self, m: dict[str, np.ndarray], prefix: str) -> ConvWeights:
        c = self.hidden // self.heads
        lin = m[prefix + "lin.weight"]
        return ConvWeights(
            lin,
            lin,
            m[prefix + "att_src"].reshape(self.heads, c),
            m[prefix + "att_dst"].reshape(self.heads, c),
            m[prefix + "lin_edge.weight"],
            m[prefix + "att_edge"].reshape(self.heads, c),
            None,
            m[prefix + "bias"],
        )

    def _prepare(self, x: np.ndarray, edge_index: np.ndarray) -> _Prepared:
        """What every member's forward shares for one input: the standardised features, the
        reversed edges, and both edge sets grouped by destination."""
        rev = edge_index[[1, 0]]
        some = edge_index.shape[1] > 0
        z = ((x - self.mean) / self.std).astype(np.float32)
        return z, edge_index, rev, _segments(edge_index[1]) if some else None, _segments(rev[1]) if some else None

    def _member(self, m: dict[str, np.ndarray], prepared: _Prepared, attr: np.ndarray) -> np.ndarray:
        c = self.hidden // self.heads
        z, edge_index, rev, seg_a, seg_r = prepared
        h = _elu(_linear(z, m["encode.weight"], m["encode.bias"]))
        for i in range(self.layers):
            msg = gat_conv(self._conv(m, f"along.{i}."), self.heads, c, h, h, edge_index, attr, seg_a)
            msg = msg + gat_conv(self._conv(m, f"against.{i}."), self.heads, c, h, h, rev, attr, seg_r)
            h = _layer_norm(h + _elu(msg), m[f"norms.{i}.weight"], m[f"norms.{i}.bias"])
        y = _linear(
            _elu(_linear(np.concatenate([h, z], axis=1), m["head.0.weight"], m["head.0.bias"])), m["head.2.weight"], m["head.2.bias"]
        )
        out: np.ndarray = np.tanh(y[:, 0])
        return out

    def member_log_factors(self, m: dict[str, np.ndarray], x: np.ndarray, edge_index: np.ndarray, attr: np.ndarray) -> np.ndarray:
        """One member's log factor per node ([n], float32)."""
        return self._member(m, self._prepare(x, edge_index), attr)

    def factors(self, g: ExecutionGraph, f: EditFeatures) -> np.ndarray:
        x, ei, attr = graph_inputs(g, f)
        prepared = self._prepare(x, ei)  # once for all members
        return np.exp(np.stack([self._member(m, prepared, attr) for m in self.members]).astype(np.float64))

    def _range_refusal(self, f: EditFeatures) -> str | None:
        j = _first_outside(f.x, self.lo, self.hi)
        if j is not None:
            return f"out of domain: node feature {FEATURES[j]} outside its training range [{self.lo[j]:.3g}, {self.hi[j]:.3g}]"
        return None

    def save(self, path: str | Path) -> None:
        arrays: dict[str, np.ndarray] = {f"m{k}/{name}": a for k, m in enumerate(self.members) for name, a in m.items()}
        arrays.update(
            kind=np.array("graph"),
            mean=self.mean,
            std=self.std,
            lo=self.lo,
            hi=self.hi,
            shape=np.array([self.hidden, self.layers, self.heads, len(self.members)]),
            halfwidth=np.array(self.halfwidth),
            trained_on=np.array(self.trained_on),
            features=np.array(FEATURES),
        )
        np.savez(path, **arrays)  # type: ignore[arg-type]


def pretrained_corrections() -> Path:
    """Where the bundled corrections live (trained on the paired grid of docs/eval.md)."""
    return Path(str(resources.files("bottleneck_oracle.models") / PRETRAINED))


def load_corrections(path: str | Path | None = None) -> Corrections | GraphCorrections:
    """A saved ``Corrections`` or ``GraphCorrections`` (the bundled one by default); OracleError
    (one line) if the file is not one."""
    path = Path(path) if path is not None else pretrained_corrections()
    if path.is_file():
        check_archive(path, "corrections file")
    try:
        with np.load(path, allow_pickle=False) as z:
            if tuple(str(s) for s in z["features"]) != FEATURES:
                raise OracleError(f"{path}: corrections for other features ({', '.join(str(s) for s in z['features'])})")
            if "kind" in z.files and str(z["kind"]) == "graph":
                return _load_graph(path, z)
            k = len(FEATURES) * (1 + len(RELATIONS))
            arrays = {name: np.asarray(z[name], dtype=np.float64) for name in ("coef", "mean", "std", "lo", "hi")}
            out = Corrections(**arrays, halfwidth=float(z["halfwidth"]), trained_on=str(z["trained_on"]))
    except (OSError, ValueError, KeyError) as exc:
        raise OracleError(f"{path}: not a corrections file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    shapes = {
        "coef": (out.coef.ndim == 2 and out.coef.shape[1] == k + 1),
        "mean": out.mean.shape == (k,),
        "std": out.std.shape == (k,),
        "lo": out.lo.shape == (k,),
        "hi": out.hi.shape == (k,),
    }
    bad = [name for name, ok in shapes.items() if not ok]
    if bad or not np.isfinite(out.coef).all() or (out.std <= 0).any():
        raise OracleError(f"{path}: not a corrections file (wrong shape or values: {', '.join(bad) or 'coef/std'})")
    return out


def _load_graph(path: Path, z: Any) -> GraphCorrections:  # z: the opened np.load archive
    hidden, layers, heads, n = (int(v) for v in z["shape"])
    if not (1 <= n <= 64 and 1 <= layers <= 8 and 1 <= heads <= hidden <= 1024 and hidden % heads == 0):
        raise OracleError(f"{path}: not a corrections file (shape {hidden}, {layers}, {heads}, {n})")
    members: list[dict[str, np.ndarray]] = [{} for _ in range(n)]
    for key in z.files:
        if key.startswith("m") and "/" in key:
            k, name = key[1:].split("/", 1)
            if not k.isdigit() or int(k) >= n:
                raise OracleError(f"{path}: not a corrections file (member {k!r} of {n})")
            members[int(k)][name] = np.asarray(z[key], dtype=np.float32)
    arrays = {name: np.asarray(z[name], dtype=np.float64) for name in ("mean", "std", "lo", "hi")}
    if any(a.shape != (len(FEATURES),) for a in arrays.values()) or (arrays["std"] <= 0).any():
        raise OracleError(f"{path}: not a corrections file (wrong shape or values: mean/std/lo/hi)")
    if not all(np.isfinite(a).all() for m in members for a in m.values()):
        raise OracleError(f"{path}: not a corrections file (weights not finite)")
    try:
        return GraphCorrections(
            members, **arrays, hidden=hidden, layers=layers, heads=heads, halfwidth=float(z["halfwidth"]), trained_on=str(z["trained_on"])
        )
    except ValueError as exc:
        raise OracleError(f"{path}: not a corrections file ({exc})") from None

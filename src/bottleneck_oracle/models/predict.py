"""The trained models on a user's trace: what-if predictions beside the replay.

``Predictor`` loads a checkpoint's inference file (the shipped ``pretrained.npz`` by default) and
answers, for one ExecutionGraph and a set of duration edits, the step time the replay predicts
and the step time each HeteroGAT variant predicts, all relative to the step as measured. It runs
the variants in numpy (``models.gat_numpy``), without importing torch; the lab's
``bottleneck_oracle_lab.models.reference.TorchPredictor`` runs the PyTorch Geometric modules
instead (the same numbers; the reference the numpy forward is tested against).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from bottleneck_oracle.analysis.cpm import CPMResult, run_cpm
from bottleneck_oracle.analysis.results import ModelAnswer
from bottleneck_oracle.analysis.whatif import EditedTimes
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.graph_pipeline.events import EventTable
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.models.gat_numpy import GRAPH_COLUMNS, GATConfig, NumpyGAT, graph_inputs_of, model_inputs
from bottleneck_oracle.models.hetero import GraphArrays, graph_arrays

PRETRAINED = "pretrained.npz"


def pretrained_path() -> Path:
    return Path(str(resources.files("bottleneck_oracle.models") / PRETRAINED))


def sample_for(
    g: ExecutionGraph,
    times: EditedTimes | None = None,
    table: EventTable | None = None,
    base: CPMResult | None = None,
    phases: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[GraphArrays, CPMResult]:
    """The model input of ``g`` with the edited ``times`` (a what-if; None: as recorded), and the
    CPM on them. ``phases``: ``node_phases(table, g)`` if the caller has it (else computed from
    ``table``)."""
    from bottleneck_oracle.analysis.phases import formula_step, is_pipeline, node_phases

    ref = max(g.measured.values())
    base = base or run_cpm(g)
    edited = g if times is None else times.applied()
    r1 = base if edited is g else run_cpm(edited)
    if phases is not None:
        phase, mb = phases
    elif table is not None:
        phase, mb = node_phases(table, g)
    else:
        phase, mb = np.zeros(g.n_nodes, dtype=np.int8), np.full(g.n_nodes, -1, dtype=np.int16)
    pp = is_pipeline(g, table)
    d0 = g.nodes["mdur"].astype(np.float64)
    formula_dt = 0.0 if times is None else formula_step(g, times.dur, phase, mb, pp) - formula_step(g, d0, phase, mb, pp)
    data = graph_arrays(edited, r1)
    data.set(ref_step=ref, replay_step=ref + r1.makespan - base.makespan, formula_step=max(ref + formula_dt, 1.0))
    data.set(edit_us=0.0 if times is None else times.delta().size_us, y_step=ref)
    return data, r1


MAX_RATIO = 5.0  # a predicted step more than this many times longer or shorter than the reference is out of domain
MARGIN = 0.25  # a feature may exceed the training range by this share of the range before the input is out of domain


class Predictor:
    """The graph network of a checkpoint, answering only inside the domain it was trained on.

    A model trained on CPU (gloo) runs has never seen a GPU kernel, a trace with a different
    shape of feature values, or a step far from its training sizes: there its numbers are not
    predictions (a 1e41 µs step, savings of the wrong sign). ``refusal`` says why an input is
    outside the domain: a GPU trace for a model trained without GPU ops, or a feature outside
    the training range (the checkpoint's ``feature_ranges``) widened by MARGIN on each side;
    predictions are bounded to [1/MAX_RATIO, MAX_RATIO] x the reference step, and one that hits
    the bound is refused too. Refused answers are None with the reason, never a number.

    ``checkpoint``: an inference file (``X.npz``), or a checkpoint ``X.pt`` with its ``X.npz``
    beside it (``models.checkpoint.load_inference``); None: the shipped one."""

    def __init__(self, checkpoint: str | Path | None = None, variants: list[str] | None = None) -> None:
        from bottleneck_oracle.models.checkpoint import as_numpy

        self.path = Path(checkpoint) if checkpoint else pretrained_path()
        self.ckpt = self._load(self.path)
        self.variants = [v for v in (variants or list(self.ckpt["gat"])) if v in self.ckpt["gat"]]
        self.models = self._models()
        self.ranges = {t: as_numpy(r) for t, r in (self.ckpt.get("feature_ranges") or {}).items()}

    def _load(self, path: Path) -> dict[str, Any]:
        from bottleneck_oracle.models.checkpoint import load_inference

        return load_inference(path)

    def _models(self) -> dict[str, Any]:
        try:
            return {v: NumpyGAT(GATConfig.from_dict(self.ckpt["gat"][v]["config"]), self.ckpt["gat"][v]["state"]) for v in self.variants}
        except ValueError as exc:
            raise OracleError(f"{self.path}: {exc}") from None

    def refusal(self, g: ExecutionGraph, data: GraphArrays) -> str | None:
        """None if the model may answer for graph ``g`` (model input ``data``), else why not."""
        from bottleneck_oracle.models.hetero import COMPUTE_COLUMNS, NETWORK_COLUMNS

        ranges = self.ranges
        if g.nodes["on_gpu"].any() and "compute" in ranges and float(ranges["compute"][1][COMPUTE_COLUMNS.index("on_gpu")]) < 1:
            return "out of domain: a GPU trace, and the model was trained on CPU (gloo) runs only"
        columns = {
            "compute": COMPUTE_COLUMNS,
            "network": NETWORK_COLUMNS,
            "graph": GRAPH_COLUMNS,
        }
        for t, cols in columns.items():
            if t not in ranges:
                continue
            x = graph_inputs_of(data)[None, :] if t == "graph" else data.nodes[t]["x"]
            if not len(x):
                continue
            lo, hi = ranges[t][0], ranges[t][1]
            pad = MARGIN * (hi - lo)
            outside = (x < lo - pad - 1e-6) | (x > hi + pad + 1e-6)
            if outside.any():
                col = int(outside.any(0).argmax())
                return f"out of domain: {t} feature {cols[col]} outside its training range [{float(lo[col]):.3g}, {float(hi[col]):.3g}]"
        return None

    def log_ratios(self, data: GraphArrays) -> dict[str, float]:
        """Each variant's raw output: log(predicted step / reference step)."""
        return {v: float(self.models[v](model_inputs(data, v))["step"][0]) for v in self.variants}

    def step_times(self, data: GraphArrays) -> dict[str, float]:
        """Predicted step time (µs) of a model input, per variant, bounded to MAX_RATIO x the reference."""
        out = {}
        bound = float(np.log(MAX_RATIO))
        for v, log_ratio in self.log_ratios(data).items():
            log_ratio = log_ratio if np.isfinite(log_ratio) else bound
            out[v] = data.scalars["ref_step"] * float(np.exp(np.clip(log_ratio, -bound, bound)))
        return out

    def effect(self, g: ExecutionGraph, base_data: GraphArrays, edited_data: GraphArrays) -> ModelAnswer:
        """What the model says an edit does: per variant its effect (edited - unedited prediction,
        µs) and the measured step plus that effect, or None for both and ``out_of_domain`` naming why."""
        reason = self.refusal(g, base_data) or self.refusal(g, edited_data)
        if reason is None:
            before, after = self.step_times(base_data), self.step_times(edited_data)
            ref = base_data.scalars["ref_step"]
            hit = [
                v
                for v in self.variants
                if max(after[v], before[v]) >= MAX_RATIO * ref * 0.999 or min(after[v], before[v]) <= ref / MAX_RATIO * 1.001
            ]
            if hit:
                reason = f"out of domain: {', '.join(hit)} predicted a step {MAX_RATIO:g}x off the measured one"
        if reason is not None:
            return ModelAnswer(str(self.path), reason, dict.fromkeys(self.variants), dict.fromkeys(self.variants))
        delta = {v: after[v] - before[v] for v in self.variants}
        shown = g.span()  # (the step as the user reads it; the model's own reference, ref_step, is its input as trained)
        return ModelAnswer(str(self.path), None, {v: shown + d for v, d in delta.items()}, dict(delta))

"""The trained models on a user's trace: what-if predictions beside the replay.

``Predictor`` loads a checkpoint (the shipped ``pretrained.pt`` by default) and answers, for one
ExecutionGraph and a set of duration edits, the step time the replay predicts and the step time
each HeteroGAT variant predicts, all relative to the step as measured.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import torch

from bottleneck_oracle.analysis.cpm import CPMResult, run_cpm
from bottleneck_oracle.analysis.whatif import with_durations
from bottleneck_oracle.graph_pipeline.events import EventTable
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.hetero import to_heterodata

PRETRAINED = "pretrained.pt"


def pretrained_path() -> Path:
    return Path(str(resources.files("bottleneck_oracle.models") / PRETRAINED))


def is_pipeline(g: ExecutionGraph, table: EventTable | None) -> bool:
    """A pipeline-parallel step: it has per-micro-batch phase ranges and send/recv nodes."""
    from bottleneck_oracle.graph_pipeline.schema import Category

    return bool((g.nodes["category"] == Category.P2P).any()) and table is not None and any(".mb" in s for s in table.names)


def sample_for(
    g: ExecutionGraph, dur: np.ndarray | None = None, table: EventTable | None = None, base: CPMResult | None = None,
    weight: np.ndarray | None = None, release: np.ndarray | None = None, phases: tuple[np.ndarray, np.ndarray] | None = None,
):  # fmt: skip
    """The model input of ``g`` with modelled durations ``dur``, edge latencies ``weight`` and
    releases ``release`` (a what-if; None: as recorded). ``phases``: ``node_phases(table, g)``
    if the caller has it (else computed from ``table``)."""
    from bottleneck_oracle.models.baselines import formula_step, node_phases

    ref = max(g.measured.values())
    base = base or run_cpm(g)
    d0 = g.nodes["mdur"].astype(np.float64)
    d1 = d0 if dur is None else np.asarray(dur, dtype=np.float64)
    edited = g if dur is None and weight is None and release is None else with_durations(g, d1, weight, release)
    r1 = base if edited is g else run_cpm(edited)
    if phases is not None:
        phase, mb = phases
    elif table is not None:
        phase, mb = node_phases(table, g)
    else:
        phase, mb = np.zeros(g.n_nodes, dtype=np.int8), np.full(g.n_nodes, -1, dtype=np.int16)
    pp = is_pipeline(g, table)
    formula_dt = 0.0 if dur is None else formula_step(g, d1, phase, mb, pp) - formula_step(g, d0, phase, mb, pp)
    data = to_heterodata(edited, r1)
    data.ref_step = torch.tensor([ref], dtype=torch.float32)
    data.replay_step = torch.tensor([ref + r1.makespan - base.makespan], dtype=torch.float32)
    data.formula_step = torch.tensor([max(ref + formula_dt, 1.0)], dtype=torch.float32)
    gap = 0.0
    if weight is not None:
        keep = np.isfinite(np.asarray(weight))
        gap = float(np.abs(np.asarray(weight)[keep] - g.edges["weight"][keep]).sum())
    if release is not None:
        gap += float(
            np.abs(
                np.where(np.isfinite(g.release), np.nan_to_num(np.asarray(release), neginf=0.0) - np.nan_to_num(g.release, neginf=0.0), 0.0)
            ).sum()
        )
    data.edit_us = torch.tensor([float(np.abs(d1 - d0).sum()) + gap], dtype=torch.float32)
    data.y_step = torch.tensor([ref], dtype=torch.float32)
    return data, r1


class Predictor:
    def __init__(self, checkpoint: str | Path | None = None, variants: list[str] | None = None) -> None:
        from bottleneck_oracle.training.train import gat_from, load_checkpoint

        self.path = Path(checkpoint) if checkpoint else pretrained_path()
        self.ckpt = load_checkpoint(self.path)
        self.variants = [v for v in (variants or list(self.ckpt["gat"])) if v in self.ckpt["gat"]]
        self.models = {v: gat_from(self.ckpt, v) for v in self.variants}

    def step_times(self, data) -> dict[str, float]:
        """Predicted step time (µs) of a model input, per variant."""
        from torch_geometric.data import Batch

        from bottleneck_oracle.models.hetero_gat import prepare

        out = {}
        with torch.no_grad():
            for v in self.variants:
                y = self.models[v](Batch.from_data_list([prepare(data.clone(), v)]))
                out[v] = float(data.ref_step) * float(torch.exp(y["step"][0]))
        return out

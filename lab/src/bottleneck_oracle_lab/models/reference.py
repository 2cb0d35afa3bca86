"""The graph network run by PyTorch Geometric: the reference the product's numpy forward
(``bottleneck_oracle.models.gat_numpy``) is tested against, the same answers from a ``.pt``."""

from __future__ import annotations

from pathlib import Path

import torch
from torch_geometric.data import Batch

from bottleneck_oracle.models.hetero import GraphArrays
from bottleneck_oracle.models.predict import Predictor
from bottleneck_oracle_lab.models.checkpoint import gat_from, load_checkpoint
from bottleneck_oracle_lab.models.hetero_gat import prepare
from bottleneck_oracle_lab.models.pyg import heterodata

THREADS = 1  # torch threads for inference: graphs of one step are small, a thread per core only contends


class TorchPredictor(Predictor):
    """``Predictor`` with the PyG modules of a checkpoint ``X.pt`` (read with torch) in place of
    the numpy forward."""

    def _load(self, path: Path) -> dict:
        torch.set_num_threads(THREADS)
        return load_checkpoint(path)

    def _models(self) -> dict:
        return {v: gat_from(self.ckpt, v) for v in self.variants}

    def log_ratios(self, data: GraphArrays) -> dict[str, float]:
        hetero = heterodata(data)
        with torch.no_grad():
            return {v: float(self.models[v](Batch.from_data_list([prepare(hetero.clone(), v)]))["step"][0]) for v in self.variants}

"""Checkpoints of the learned models: written by ``train``, read by inference (models.predict)
and ``eval``. A checkpoint is a plain dict of tensors, numbers and strings saved with
``torch.save`` and read with ``torch.load(weights_only=True)``: nothing in it is executed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.models.hetero import FEATURE_VERSION, feature_schema
from bottleneck_oracle.models.hetero_gat import GATConfig, HeteroGAT

FORMAT = "bottleneck-oracle/checkpoint"
CHECKPOINT_VERSION = 1


def save_checkpoint(ckpt: dict, path: str | Path) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(ckpt, tmp)
    return path


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by train; OracleError (one line) if it is not one, or not for this version."""
    path = Path(path)
    if not path.is_file():
        raise OracleError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises many types for foreign / corrupt files
        raise OracleError(f"{path}: not a readable checkpoint ({exc.__class__.__name__}: {str(exc).splitlines()[0][:120]})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise OracleError(f"{path}: not a BottleneckOracle checkpoint")
    if ckpt.get("checkpoint_version") != CHECKPOINT_VERSION:
        raise OracleError(
            f"{path}: checkpoint format {ckpt.get('checkpoint_version')} (BottleneckOracle {ckpt.get('package_version')}); "
            f"this version reads format {CHECKPOINT_VERSION}: retrain with `bottleneck-oracle train`"
        )
    if ckpt.get("feature_version") != FEATURE_VERSION or ckpt.get("feature_schema") != feature_schema():
        theirs = ckpt.get("feature_schema") or {}
        differ = [k for k, v in feature_schema().items() if theirs.get(k) != v]
        raise OracleError(
            f"{path}: trained on feature schema {ckpt.get('feature_version')}, this version builds schema {FEATURE_VERSION} "
            f"(they differ in: {', '.join(differ) or 'version'}): rebuild the dataset and retrain"
        )
    return ckpt


def gat_from(ckpt: dict, variant: str) -> HeteroGAT:
    entry = ckpt["gat"][variant]
    model = HeteroGAT(GATConfig.from_dict(entry["config"]))
    model.load_state_dict(entry["state"])
    return model.eval()


def mlp_from(ckpt: dict):
    from bottleneck_oracle.models.baselines import MLPRegressor

    model = MLPRegressor(ckpt["mlp"]["n_in"])
    model.load_state_dict(ckpt["mlp"]["state"])
    return model.eval()


def xgb_from(ckpt: dict):
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(ckpt["xgboost"].encode()))
    return booster

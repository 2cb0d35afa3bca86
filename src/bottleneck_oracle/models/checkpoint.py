"""Checkpoints of the learned models: written by ``train``, read by inference (models.predict)
and ``eval``. A checkpoint is a plain dict of tensors, numbers and strings saved with
``torch.save`` and read with ``torch.load(weights_only=True)``: nothing in it is executed.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.models.hetero import COMPUTE_COLUMNS, FEATURE_VERSION, NETWORK_COLUMNS, feature_schema
from bottleneck_oracle.models.hetero_gat import GATConfig, HeteroGAT

FORMAT = "bottleneck-oracle/checkpoint"
CHECKPOINT_VERSION = 1


def save_checkpoint(ckpt: dict, path: str | Path) -> Path:
    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(ckpt, tmp)
    return path


def safe_load(path: Path, what: str) -> object:
    """``torch.load(path, weights_only=True)``: tensors and plain values only, nothing in the file
    is run; a file that is not that is one OracleError naming it (torch raises many types)."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        if "weights only" not in str(exc).lower():
            raise OracleError(f"{path}: not a {what} (not a file torch.save wrote)") from None
        raise OracleError(
            f"{path}: not a {what}: it holds objects other than tensors and plain values (read with weights_only=True, nothing was run)"
        ) from None
    except FileNotFoundError:
        raise OracleError(f"{path}: {what} not found") from None
    except Exception as exc:  # noqa: BLE001 - foreign or corrupt files
        first = (str(exc).splitlines() or [""])[0][:120]
        raise OracleError(f"{path}: not a readable {what} ({exc.__class__.__name__}: {first})") from None


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by train; OracleError (one line) if it is not one, or not for this version."""
    path = Path(path)
    if not path.is_file():
        raise OracleError(f"{path}: checkpoint not found")
    ckpt = safe_load(path, "checkpoint")
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
    _check_models(path, ckpt)
    return ckpt


MAX_HIDDEN = 4096  # sizes a checkpoint may claim before anything is allocated for it
MAX_LAYERS = 64
MAX_IN_DIM = 4096


def _check_models(path: Path, ckpt: dict) -> None:
    """Each graph network's config is sane and its weights have exactly the shapes that config
    builds (checked on the meta device: no memory is asked for the sizes a file claims), so a
    damaged or hostile checkpoint is one error line, not a 40 PB allocation or a KeyError."""
    gat = ckpt.get("gat")
    if not isinstance(gat, dict) or not gat:
        raise OracleError(f"{path}: the checkpoint holds no graph network ('gat' missing or empty)")
    for variant, entry in gat.items():
        where = f"{path}: graph network {variant!r}"
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict) or not isinstance(entry.get("state"), dict):
            raise OracleError(f"{where}: expected a config and a state")
        try:
            cfg = GATConfig.from_dict(entry["config"])
        except (TypeError, ValueError) as exc:
            raise OracleError(f"{where}: bad config ({str(exc).splitlines()[0][:160]})") from None
        dims = [d for _, d in cfg.in_dims]
        if (
            not 0 < cfg.hidden <= MAX_HIDDEN
            or not 0 < cfg.layers <= MAX_LAYERS
            or not 0 < cfg.heads <= cfg.hidden
            or not 0 <= cfg.edge_dim <= MAX_IN_DIM
            or sorted(t for t, _ in cfg.in_dims) != ["compute", "network"]
            or not all(0 < d <= MAX_IN_DIM for d in dims)
        ):
            raise OracleError(
                f"{where}: implausible sizes (hidden {cfg.hidden}, layers {cfg.layers}, heads {cfg.heads}, inputs {cfg.in_dims})"
            )
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in HeteroGAT(cfg).state_dict().items()}
        state = entry["state"]
        found = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
        if found != expected or len(found) != len(state):
            wrong = sorted(set(found) ^ set(expected)) or sorted(k for k in expected if found.get(k) != expected[k])
            raise OracleError(f"{where}: weights do not match its config (first mismatch: {(wrong or ['a non-tensor entry'])[0]})")
    ranges = ckpt.get("feature_ranges")
    if ranges is not None:
        width = {"compute": len(COMPUTE_COLUMNS), "network": len(NETWORK_COLUMNS), "graph": 4}
        if not isinstance(ranges, dict) or not all(
            t in width and isinstance(r, torch.Tensor) and tuple(r.shape) == (2, width[t]) for t, r in ranges.items()
        ):
            raise OracleError(f"{path}: feature_ranges is not a (low, high) row pair per node type")


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

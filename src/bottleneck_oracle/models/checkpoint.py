"""Checkpoints of the learned models: written by ``train``, read by inference (models.predict)
and ``eval``. A checkpoint ``X.pt`` is a plain dict of tensors, numbers and strings saved with
``torch.save`` and read with ``torch.load(weights_only=True)``: nothing in it is executed.

Beside it ``train`` writes its inference part, ``X.npz``: the graph networks' configs and
weights, the feature ranges, the versions and the feature schema, as two arrays (``meta``, a JSON
string that also indexes the others; ``arrays``, their bytes end to end, one read instead of
hundreds) read with ``np.load(allow_pickle=False)`` and no torch (the baselines stay in the .pt,
for ``eval``). The .npz names the SHA-256 of the .pt it was written from; inference
(``load_inference``) reads it only while that matches, and otherwise reads the .pt with torch
and converts it in memory. ``write_companion`` writes the .npz of an existing .pt.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.models.hetero import FEATURE_VERSION, feature_schema

FORMAT = "bottleneck-oracle/checkpoint"
CHECKPOINT_VERSION = 1
COMPANION_FORMAT = "bottleneck-oracle/inference"
COMPANION_SUFFIX = ".npz"
ALIGN = 16  # bytes: each array of a companion starts at a multiple of this
META_KEYS = ("format", "checkpoint_version", "feature_version", "feature_schema", "package_version", "split")


def save_checkpoint(ckpt: dict, path: str | Path) -> Path:
    """Write ``ckpt`` to ``path`` (torch.save) and its inference part beside it (``write_companion``)."""
    import torch

    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(ckpt, tmp)
    write_companion(path, ckpt)
    return path


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by train; OracleError (one line) if it is not one, or not for this version."""
    path = Path(path)
    if not path.is_file():
        raise OracleError(f"{path}: checkpoint not found")
    try:
        import torch
    except ImportError:
        raise OracleError(
            f"{path}: reading a .pt checkpoint needs torch (pip install 'bottleneck-oracle[models]'); inference reads "
            f"its {companion_path(path).name} without it (models.checkpoint.write_companion writes one)"
        ) from None
    try:
        ckpt = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises many types for foreign / corrupt files
        raise OracleError(f"{path}: not a readable checkpoint ({exc.__class__.__name__}: {str(exc).splitlines()[0][:120]})") from None
    return _checked(ckpt, path)


def _checked(ckpt, path: Path) -> dict:
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


def companion_path(path: str | Path) -> Path:
    """Where the inference part of checkpoint ``path`` lives: ``X.npz`` beside ``X.pt``."""
    return Path(path).with_suffix(COMPANION_SUFFIX)


def as_numpy(value) -> np.ndarray:
    """A tensor (or array) as a numpy array."""
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def inference_part(ckpt: dict) -> dict:
    """What inference reads of a checkpoint, numpy arrays for tensors: the META_KEYS, per
    variant ``gat[v]`` = {"config", "state"}, and ``feature_ranges``."""
    out = {k: ckpt[k] for k in META_KEYS if k in ckpt}
    out["gat"] = {v: {"config": e["config"], "state": {k: as_numpy(t) for k, t in e["state"].items()}} for v, e in ckpt["gat"].items()}
    out["feature_ranges"] = {t: as_numpy(r) for t, r in (ckpt.get("feature_ranges") or {}).items()}
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_companion(path: str | Path, ckpt: dict | None = None) -> Path:
    """Write the inference part of checkpoint ``path`` (``ckpt`` if given, else read from ``path``)
    to ``companion_path(path)``; returns that path."""
    path = Path(path)
    part = inference_part(ckpt if ckpt is not None else load_checkpoint(path))
    meta = {k: part[k] for k in META_KEYS if k in part}
    meta |= {"companion_format": COMPANION_FORMAT, "source_sha256": _sha256(path), "gat": {v: e["config"] for v, e in part["gat"].items()}}
    arrays = {f"gat/{v}/{k}": a for v, e in part["gat"].items() for k, a in e["state"].items()}
    arrays |= {f"feature_ranges/{t}": r for t, r in part["feature_ranges"].items()}
    chunks, meta["arrays"], offset = [], [], 0
    for name, a in arrays.items():
        data = np.ascontiguousarray(a).tobytes()
        meta["arrays"].append([name, a.dtype.str, list(a.shape), offset])
        chunks.append(data + bytes(-len(data) % ALIGN))
        offset += len(data) + -len(data) % ALIGN
    out = companion_path(path)
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta)), arrays=np.frombuffer(b"".join(chunks), dtype=np.uint8))
    return out


def load_inference(path: str | Path) -> dict:
    """``inference_part`` of checkpoint ``path``: from ``X.npz`` without torch (given directly,
    or beside ``X.pt`` and written from it), else from the .pt (torch.load, weights_only)."""
    path = Path(path)
    if not path.is_file():
        raise OracleError(f"{path}: checkpoint not found")
    if path.suffix == COMPANION_SUFFIX:
        return _read_companion(path)
    companion = companion_path(path)
    if companion.is_file():
        part = _read_companion(companion, source=path)
        if part is not None:
            return part
    return inference_part(load_checkpoint(path))


def _read_companion(path: Path, source: Path | None = None) -> dict | None:
    """The inference part stored in ``path``; None if it was written from another file than
    ``source`` (a stale companion); OracleError if it is not one, or not for this version."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"][()]))
            blob = z["arrays"]
        arrays = {}
        for name, dtype, shape, offset in meta["arrays"]:
            dt = np.dtype(dtype)
            if dt.hasobject:
                raise TypeError(f"{name} holds objects")
            arrays[name] = blob[offset : offset + dt.itemsize * int(np.prod(shape, dtype=np.int64))].view(dt).reshape(shape)
    except Exception as exc:  # not a zip, a missing array, an object array (refused without pickle), bad JSON or index
        raise OracleError(f"{path}: not a readable inference file ({exc.__class__.__name__}: {str(exc).splitlines()[0][:120]})") from None
    if not isinstance(meta, dict) or meta.get("companion_format") != COMPANION_FORMAT:
        raise OracleError(f"{path}: not a BottleneckOracle inference file")
    if source is not None and meta.get("source_sha256") != _sha256(source):
        return None
    part = _checked({k: meta[k] for k in META_KEYS if k in meta}, path)
    part["gat"] = {
        v: {"config": cfg, "state": {k[len(f"gat/{v}/") :]: a for k, a in arrays.items() if k.startswith(f"gat/{v}/")}}
        for v, cfg in meta.get("gat", {}).items()
    }
    part["feature_ranges"] = {k.split("/", 1)[1]: a for k, a in arrays.items() if k.startswith("feature_ranges/")}
    return part


def gat_from(ckpt: dict, variant: str):
    """The PyG HeteroGAT of ``variant`` in a checkpoint (eval mode)."""
    from bottleneck_oracle.models.hetero_gat import GATConfig, HeteroGAT

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

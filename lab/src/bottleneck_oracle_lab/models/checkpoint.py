"""Checkpoints as ``train`` writes them and ``eval`` reads them: ``X.pt``, a plain dict of
tensors, numbers and strings saved with ``torch.save`` and read with
``torch.load(weights_only=True)`` (nothing in it is executed), the baselines included; and beside
it its inference part ``X.npz`` (``write_companion``), which the product reads without torch
(``bottleneck_oracle.models.checkpoint``).
"""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import numpy as np

from bottleneck_oracle.atomic import atomic_path, uninterrupted
from bottleneck_oracle.errors import OracleError, first_line
from bottleneck_oracle.files import check_archive
from bottleneck_oracle.models.checkpoint import (
    ALIGN,
    COMPANION_FORMAT,
    META_KEYS,
    check_models,
    check_versions,
    companion_path,
    file_sha256,
    inference_part,
    read_companion,
)
from bottleneck_oracle.models.gat_numpy import GATConfig

PRETRAINED = "pretrained.pt"


def pretrained_checkpoint() -> Path:
    """The full checkpoint the shipped ``bottleneck_oracle/models/pretrained.npz`` was written from
    (the random split's; the baselines included)."""
    from importlib import resources

    return Path(str(resources.files("bottleneck_oracle_lab.models") / PRETRAINED))


def save_checkpoint(ckpt: dict, path: str | Path) -> Path:
    """Write ``ckpt`` to ``path`` (torch.save) and its inference part beside it (``write_companion``)."""
    import torch

    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(ckpt, tmp)
    write_companion(path, ckpt)
    return path


def safe_load(path: Path, what: str) -> object:
    """``torch.load(path, weights_only=True)``: tensors and plain values only, nothing in the file
    is run; a file that is not that is one OracleError naming it (torch raises many types)."""
    import torch

    if zipfile.is_zipfile(path):  # (anything else: torch says what it is below)
        check_archive(path, what)  # torch inflates what its members declare before it checks a thing
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        if "weights only" not in str(exc).lower() or not zipfile.is_zipfile(path):
            raise OracleError(f"{path}: not a {what} (not a file torch.save wrote)") from None
        raise OracleError(
            f"{path}: not a {what}: it holds objects other than tensors and plain values (read with weights_only=True, nothing was run)"
        ) from None
    except FileNotFoundError:
        raise OracleError(f"{path}: {what} not found") from None
    except Exception as exc:  # noqa: BLE001 - foreign or corrupt files
        raise OracleError(f"{path}: not a readable {what} ({exc.__class__.__name__}: {first_line(exc)})") from None


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by train; OracleError (one line) if it is not one, or not for this version."""
    path = Path(path)
    if not path.is_file():
        raise OracleError(f"{path}: checkpoint not found")
    try:
        import torch  # noqa: F401 - only to say what to install
    except ImportError:
        raise OracleError(
            f"{path}: reading a .pt checkpoint needs torch (pip install -e lab/); inference reads "
            f"its {companion_path(path).name} without it (write_companion writes one)"
        ) from None
    ckpt = check_versions(safe_load(path, "checkpoint"), path)
    check_models(path, ckpt)
    _check_shapes(path, ckpt)
    return ckpt


def _check_shapes(path: Path, ckpt: dict) -> None:
    """The weights of each graph network have exactly the shapes its config builds in PyG
    (built on the meta device: no memory for the sizes a file claims)."""
    import torch

    from bottleneck_oracle_lab.models.hetero_gat import HeteroGAT

    for variant, entry in ckpt["gat"].items():
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in HeteroGAT(GATConfig.from_dict(entry["config"])).state_dict().items()}
        state = entry["state"]
        found = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
        if found != expected or len(found) != len(state):
            wrong = sorted(set(found) ^ set(expected)) or sorted(k for k in expected if found.get(k) != expected[k])
            raise OracleError(
                f"{path}: graph network {variant!r}: weights do not match its config (first mismatch: {(wrong or ['a non-tensor entry'])[0]})"
            )


def write_companion(path: str | Path, ckpt: dict | None = None) -> Path:
    """Write the inference part of checkpoint ``path`` (``ckpt`` if given, else read from ``path``)
    to ``companion_path(path)``; returns that path."""
    path = Path(path)
    part = inference_part(ckpt if ckpt is not None else load_checkpoint(path))
    meta = {k: part[k] for k in META_KEYS if k in part}
    meta |= {
        "companion_format": COMPANION_FORMAT,
        "source_sha256": file_sha256(path),
        "gat": {v: e["config"] for v, e in part["gat"].items()},
    }
    arrays = {f"gat/{v}/{k}": a for v, e in part["gat"].items() for k, a in e["state"].items()}
    arrays |= {f"feature_ranges/{t}": r for t, r in part["feature_ranges"].items()}
    chunks, meta["arrays"], offset = [], [], 0
    for name, a in arrays.items():
        data = np.ascontiguousarray(a).tobytes()
        meta["arrays"].append([name, a.dtype.str, list(a.shape), offset])
        chunks.append(data + bytes(-len(data) % ALIGN))
        offset += len(data) + -len(data) % ALIGN
    out = companion_path(path)
    with atomic_path(out) as tmp, open(tmp, "wb") as f, uninterrupted():
        np.savez(f, meta=np.array(json.dumps(meta)), arrays=np.frombuffer(b"".join(chunks), dtype=np.uint8))
    return out


def load_inference(path: str | Path) -> dict:
    """``inference_part`` of checkpoint ``path``: its ``X.npz`` where that is current (as the
    product reads it), else the .pt read with torch and converted in memory."""
    path = Path(path)
    if path.suffix != ".npz":
        companion = companion_path(path)
        part = read_companion(companion, source=path) if companion.is_file() and path.is_file() else None
        if part is None:
            return inference_part(load_checkpoint(path))
        return part
    from bottleneck_oracle.models.checkpoint import load_inference as load_npz

    return load_npz(path)


def gat_from(ckpt: dict, variant: str):
    """The PyG HeteroGAT of ``variant`` in a checkpoint (eval mode)."""
    from bottleneck_oracle_lab.models.hetero_gat import HeteroGAT

    entry = ckpt["gat"][variant]
    model = HeteroGAT(GATConfig.from_dict(entry["config"]))
    model.load_state_dict(entry["state"])
    return model.eval()


def mlp_from(ckpt: dict):
    from bottleneck_oracle_lab.models.baselines import MLPRegressor

    model = MLPRegressor(ckpt["mlp"]["n_in"])
    model.load_state_dict(ckpt["mlp"]["state"])
    return model.eval()


def xgb_from(ckpt: dict):
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(ckpt["xgboost"].encode()))
    return booster

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
import pickle
import zipfile
from pathlib import Path

import numpy as np

from bottleneck_oracle.atomic import atomic_path, uninterrupted
from bottleneck_oracle.errors import OracleError, first_line
from bottleneck_oracle.files import check_archive
from bottleneck_oracle.models.gat_numpy import GRAPH_COLUMNS, GATConfig
from bottleneck_oracle.models.hetero import COMPUTE_COLUMNS, FEATURE_VERSION, NETWORK_COLUMNS, feature_schema

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
            f"{path}: reading a .pt checkpoint needs torch (pip install 'bottleneck-oracle[models]'); inference reads "
            f"its {companion_path(path).name} without it (models.checkpoint.write_companion writes one)"
        ) from None
    ckpt = _checked(safe_load(path, "checkpoint"), path)
    _check_models(path, ckpt)
    _check_shapes(path, ckpt)
    return ckpt


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


MAX_HIDDEN = 4096  # sizes a checkpoint may claim before anything is allocated for it
MAX_LAYERS = 64
MAX_IN_DIM = 4096


def _check_models(path: Path, ckpt: dict) -> None:
    """Each graph network has a config of plausible sizes and a state, and the feature ranges
    their shape; its weights must have exactly the shapes that config
    builds (``_check_shapes`` for a .pt; the numpy forward checks a companion's): a damaged or
    hostile checkpoint is one error line, not a 40 PB allocation or a KeyError."""
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
            raise OracleError(f"{where}: bad config ({first_line(exc, 160)})") from None
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
    ranges = ckpt.get("feature_ranges")
    if ranges is not None:
        width = {"compute": len(COMPUTE_COLUMNS), "network": len(NETWORK_COLUMNS), "graph": len(GRAPH_COLUMNS)}
        if not isinstance(ranges, dict) or not all(
            t in width and hasattr(r, "shape") and tuple(r.shape) == (2, width[t]) for t, r in ranges.items()
        ):
            raise OracleError(f"{path}: feature_ranges is not a (low, high) row pair per node type")


def _check_shapes(path: Path, ckpt: dict) -> None:
    """The weights of each graph network have exactly the shapes its config builds in PyG
    (built on the meta device: no memory for the sizes a file claims)."""
    import torch

    from bottleneck_oracle.models.hetero_gat import HeteroGAT

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
    with atomic_path(out) as tmp, open(tmp, "wb") as f, uninterrupted():
        np.savez(f, meta=np.array(json.dumps(meta)), arrays=np.frombuffer(b"".join(chunks), dtype=np.uint8))
    return out


def load_inference(path: str | Path) -> dict:
    """``inference_part`` of checkpoint ``path``: from ``X.npz`` without torch (given directly,
    or beside ``X.pt`` and written from it), else from the .pt (torch.load, weights_only)."""
    path = Path(path)
    if not path.is_file():
        raise OracleError(f"{path}: checkpoint not found")
    if path.suffix == COMPANION_SUFFIX:
        part = _read_companion(path)
        if part is None:  # (only a companion read for its .pt can be stale)
            raise OracleError(f"{path}: not a readable inference file")
        return part
    companion = companion_path(path)
    if companion.is_file():
        part = _read_companion(companion, source=path)
        if part is not None:
            return part
    return inference_part(load_checkpoint(path))


def _read_companion(path: Path, source: Path | None = None) -> dict | None:
    """The inference part stored in ``path``; None if it was written from another file than
    ``source`` (a stale companion); OracleError if it is not one, or not for this version."""
    if not zipfile.is_zipfile(path):
        raise OracleError(f"{path}: not a readable inference file (not an .npz archive)")
    check_archive(path, "inference file")
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
        raise OracleError(f"{path}: not a readable inference file ({exc.__class__.__name__}: {first_line(exc)})") from None
    if not isinstance(meta, dict) or meta.get("companion_format") != COMPANION_FORMAT:
        raise OracleError(f"{path}: not a BottleneckOracle inference file")
    if source is not None and meta.get("source_sha256") != _sha256(source):
        return None
    part = _checked({k: meta[k] for k in META_KEYS if k in meta}, path)
    if not isinstance(meta.get("gat"), dict) or not all(isinstance(c, dict) for c in meta["gat"].values()):
        raise OracleError(f"{path}: the inference file holds no graph network configs")
    part["gat"] = {
        v: {"config": cfg, "state": {k[len(f"gat/{v}/") :]: a for k, a in arrays.items() if k.startswith(f"gat/{v}/")}}
        for v, cfg in meta["gat"].items()
    }
    part["feature_ranges"] = {k.split("/", 1)[1]: a for k, a in arrays.items() if k.startswith("feature_ranges/")}
    _check_models(path, part)
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

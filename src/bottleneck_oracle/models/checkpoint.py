"""The inference file of a trained graph network: what ``whatif``, ``blame`` and ``advise``
read with ``--model``, without torch.

``train`` (the lab: ``bottleneck_oracle_lab.models.checkpoint``) writes a checkpoint ``X.pt`` (a
plain dict of tensors for torch, the baselines included, for ``eval``) and beside it its
inference part ``X.npz``: the graph networks' configs and weights, the feature ranges, the
versions and the feature schema, as two arrays (``meta``, a JSON string that also indexes the
others; ``arrays``, their bytes end to end, one read instead of hundreds) read with
``np.load(allow_pickle=False)``. The package ships the .npz alone (``models/pretrained.npz``).
The .npz names the SHA-256 of the .pt it was written from: given a .pt, ``load_inference``
reads the .npz beside it only while that matches.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np

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


def check_versions(ckpt, path: Path) -> dict:
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


def check_models(path: Path, ckpt: dict) -> None:
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


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_inference(path: str | Path) -> dict:
    """``inference_part`` of checkpoint ``path``: the ``X.npz`` given directly, or the one beside
    ``X.pt`` written from it; OracleError (one line) if there is none, or a stale one (the lab's
    ``bottleneck_oracle_lab.models.checkpoint.write_companion`` writes it)."""
    path = Path(path)
    if not path.is_file():
        raise OracleError(f"{path}: checkpoint not found")
    if path.suffix == COMPANION_SUFFIX:
        part = read_companion(path)
        if part is None:  # (only a companion read for its .pt can be stale)
            raise OracleError(f"{path}: not a readable inference file")
        return part
    companion = companion_path(path)
    part = read_companion(companion, source=path) if companion.is_file() else None
    if part is None:
        raise OracleError(
            f"{path}: inference reads its {companion.name} beside it, and {'it was written from another .pt' if companion.is_file() else 'there is none'}; "
            "write it with bottleneck_oracle_lab.models.checkpoint.write_companion (the lab: pip install -e lab/)"
        )
    return part


def read_companion(path: Path, source: Path | None = None) -> dict | None:
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
    if source is not None and meta.get("source_sha256") != file_sha256(source):
        return None
    part = check_versions({k: meta[k] for k in META_KEYS if k in meta}, path)
    if not isinstance(meta.get("gat"), dict) or not all(isinstance(c, dict) for c in meta["gat"].values()):
        raise OracleError(f"{path}: the inference file holds no graph network configs")
    part["gat"] = {
        v: {"config": cfg, "state": {k[len(f"gat/{v}/") :]: a for k, a in arrays.items() if k.startswith(f"gat/{v}/")}}
        for v, cfg in meta["gat"].items()
    }
    part["feature_ranges"] = {k.split("/", 1)[1]: a for k, a in arrays.items() if k.startswith("feature_ranges/")}
    check_models(path, part)
    return part

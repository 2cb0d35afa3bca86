"""train: the HeteroGAT variants and the learned baselines, one checkpoint per split.

Per split (random, OOD-size, OOD-layout, OOD-injection; see training.dataset) the training part
gives two kinds of samples: what-if samples (a baseline step with the injected op lengthened,
labelled with the measured perturbed step) and graphs as recorded (labelled with their own step,
CPM slack and criticality). The graph networks learn all three with a weighted loss; the MLP
and XGBoost baselines learn the step on pooled features. Validation: the dataset's val part
for the random split; for an OOD split 15% of its training runs' samples, drawn by hash. Early
stopping keeps the best validation state. Seeds are fixed; a checkpoint holds the model
configs, the feature schema and the versions, and is read back with weights_only=True.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bottleneck_oracle import __version__
from bottleneck_oracle.config import ModelsConfig
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.files import read_jsonl
from bottleneck_oracle.models.checkpoint import CHECKPOINT_VERSION, FORMAT
from bottleneck_oracle.models.hetero import FEATURE_VERSION, feature_schema
from bottleneck_oracle.serial import to_json
from bottleneck_oracle_lab.models.baselines import fit_mlp, fit_xgb, graph_inputs, pooled_features
from bottleneck_oracle_lab.models.checkpoint import save_checkpoint
from bottleneck_oracle_lab.models.hetero_gat import NODE_TYPES, GATConfig, HeteroGAT, in_dims_of, prepare
from bottleneck_oracle_lab.training.dataset import DATASET, load_sample


@dataclass(slots=True)
class SplitData:
    train_whatif: list
    train_plain: list
    val_whatif: list
    val_plain: list
    test_whatif: list
    test_plain: list
    test_rows: list[dict]


def read_rows(dataset: str | Path) -> list[dict]:
    path = Path(dataset)
    path = path / DATASET if path.is_dir() else path
    if not path.is_file():
        raise OracleError(f"{path}: no dataset (run `bottleneck-oracle build-dataset` first)")
    rows = read_jsonl(path, "dataset index", ROW_KEYS, "the dataset is damaged: rebuild it with `build-dataset`")
    for n, row in enumerate(rows, 1):
        whatif = row.get("whatif")
        if not all(isinstance(row[k], str) for k in ROW_KEYS) or (
            whatif is not None and not (isinstance(whatif, dict) and isinstance(whatif.get("path"), str))
        ):
            raise OracleError(f"{path}: sample {n} has a path or split that is not a string (rebuild it with `build-dataset`)")
    if not rows:
        raise OracleError(f"{path}: the dataset is empty")
    return rows


ROW_KEYS = ("id", "path", "split_random", "split_ood_size", "split_ood_layout", "split_ood_injection")  # what training reads of a row


def _hash_val(key: str, seed: int) -> bool:
    return int(hashlib.sha256(f"val:{seed}:{key}".encode()).hexdigest()[:8], 16) / 16**8 < 0.15


def parts(rows: list[dict], split: str, seed: int) -> dict[str, list[dict]]:
    """{'train', 'val', 'test'} rows of a split."""
    out: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for r in rows:
        if split == "random":
            out[r["split_random"]].append(r)
        else:
            part = r[f"split_{split}"]
            out["test" if part == "test" else "val" if _hash_val(r["id"], seed) else "train"].append(r)
    return out


def graph_dataset(
    dataset: str | Path, split: str | None = None, part: str | None = None, seed: int = 0, whatif: bool = False, transform=None
):
    """The built dataset as a ``torch_geometric.data.Dataset``: ``ds[i]`` is a sample's HeteroData,
    read with ``load_sample`` (weights_only: no pickled code runs), so PyG's ``DataLoader``,
    ``index_select`` and transforms work on it. ``split`` and ``part`` (``train``, ``val`` or
    ``test``) pick the rows ``train`` uses for that part (``parts``, the same seed); ``whatif``: the
    what-if samples of those rows instead of their steps."""
    from torch_geometric.data import Dataset

    rows = read_rows(dataset)
    if split is not None:
        if part not in ("train", "val", "test"):
            raise OracleError(f"part must be train, val or test (found {part!r})")
        if split != "random" and f"split_{split}" not in rows[0]:
            raise OracleError(f"{dataset}: no split {split!r} in the dataset index")
        rows = parts(rows, split, seed)[part]
    paths = [r["whatif"]["path"] for r in rows if r.get("whatif")] if whatif else [r["path"] for r in rows]

    class GraphDataset(Dataset):
        def __init__(self) -> None:
            super().__init__(None, transform=transform)

        def len(self) -> int:
            return len(paths)

        def get(self, idx: int):
            return load_sample(paths[idx])

    return GraphDataset()


class _Cache:
    """Samples loaded once per process (they are read by every split and variant)."""

    def __init__(self) -> None:
        self.data: dict[str, object] = {}

    def get(self, path: str):
        if path not in self.data:
            self.data[path] = load_sample(path)
        return self.data[path]


CACHE = _Cache()


def split_data(rows: list[dict], split: str, seed: int) -> SplitData:
    p = parts(rows, split, seed)

    def wi(rs):
        return [CACHE.get(r["whatif"]["path"]) for r in rs if r.get("whatif")]

    def plain(rs):
        return [CACHE.get(r["path"]) for r in rs]

    return SplitData(wi(p["train"]), plain(p["train"]), wi(p["val"]), plain(p["val"]), wi(p["test"]), plain(p["test"]), p["test"])


def _targets(batch) -> torch.Tensor:
    return torch.log(batch.y_step / batch.ref_step)


def _batch(samples: list, variant: str):
    from torch_geometric.data import Batch

    return Batch.from_data_list([prepare(s, variant) for s in samples])


SHRINK = 1.0  # correction variant: weight of the penalty on its departure from the replay


def step_loss(model: HeteroGAT, batch) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(batch)["step"], _targets(batch))


def gat_loss(model: HeteroGAT, batch, cfg: ModelsConfig) -> torch.Tensor:
    out = model(batch)
    loss = cfg.loss_step * torch.nn.functional.mse_loss(out["step"], _targets(batch))
    if model.cfg.variant == "correction":  # measured ΔT is noisy: stay near the replay unless the data says otherwise
        loss = loss + SHRINK * cfg.loss_step * ((out["step"] - batch.g_in[:, 2]) ** 2).mean()
    for t in NODE_TYPES:
        if batch[t].num_nodes == 0:
            continue
        slack = torch.log1p(batch[t].slack.clamp(min=0) / 1000.0)
        loss = loss + cfg.loss_slack * torch.nn.functional.mse_loss(out[f"slack_{t}"], slack)
        crit = batch[t].critical.float()
        pos = crit.mean().clamp(min=1e-3)
        weight = torch.where(crit > 0, 0.5 / pos, 0.5 / (1 - pos).clamp(min=1e-3))
        loss = loss + cfg.loss_critical * torch.nn.functional.binary_cross_entropy_with_logits(out[f"critical_{t}"], crit, weight=weight)
    return loss


def fit_gat(variant: str, data: SplitData, cfg: ModelsConfig, progress: Callable[[str], None] | None = None) -> tuple[HeteroGAT, dict]:
    """One HeteroGAT variant, early-stopped on the validation what-if samples' step loss (what the
    model is for); slack and criticality are trained alongside."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    sample = (data.train_whatif or data.train_plain)[0]
    gcfg = GATConfig(
        variant=variant,
        hidden=cfg.hidden,
        layers=cfg.layers,
        heads=cfg.heads,
        dropout=cfg.dropout,
        in_dims=in_dims_of(sample, variant),
        edge_dim=int(sample[("compute", "depends_on", "compute")].edge_attr.shape[1]),
    )
    model = HeteroGAT(gcfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=1e-5)
    val = data.val_whatif or data.val_plain[: max(cfg.plain_per_epoch // 4, 8)]
    val_batches = [_batch(val[i : i + cfg.batch], variant) for i in range(0, len(val), cfg.batch)]
    best, best_state, bad, history = np.inf, None, 0, []
    t0 = time.perf_counter()
    for epoch in range(cfg.epochs):
        items = list(data.train_whatif) + rng.sample(data.train_plain, min(cfg.plain_per_epoch, len(data.train_plain)))
        rng.shuffle(items)
        model.train()
        total = 0.0
        for i in range(0, len(items), cfg.batch):
            opt.zero_grad()
            loss = gat_loss(model, _batch(items[i : i + cfg.batch], variant), cfg)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            total += loss.item() * len(items[i : i + cfg.batch])
        model.eval()
        with torch.no_grad():
            v = sum(float(step_loss(model, b)) * b.num_graphs for b in val_batches) / max(len(val), 1)
        history.append({"epoch": epoch + 1, "train_loss": total / len(items), "val_loss": v})
        if progress:
            progress(f"{variant} epoch {epoch + 1}/{cfg.epochs}: train {total / len(items):.4f}, val {v:.4f}")
        if v < best - 1e-6:
            best, best_state, bad = v, {k: t.detach().clone() for k, t in model.state_dict().items()}, 0
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    return model.eval(), {"epochs": len(history), "best_val_loss": best, "seconds": time.perf_counter() - t0, "history": history}


def _xy(samples: list) -> tuple[np.ndarray, np.ndarray]:
    if not samples:
        return np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.float32)
    x = np.stack([pooled_features(s) for s in samples])
    y = np.array([float(np.log(float(s.y_step) / float(s.ref_step))) for s in samples], dtype=np.float32)
    return x, y


def train_split(rows: list[dict], split: str, cfg: ModelsConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Train every configured model on one split; returns the checkpoint dict."""
    data = split_data(rows, split, cfg.seed)
    if not data.train_whatif:
        raise OracleError(f"split {split}: no what-if samples to train on (the dataset has no perturbed steps with a baseline there)")
    ckpt: dict = {
        "format": FORMAT,
        "checkpoint_version": CHECKPOINT_VERSION,
        "feature_version": FEATURE_VERSION,
        "package_version": __version__,
        "feature_schema": feature_schema(),
        "split": split,
        "config": asdict(cfg),
        "gat": {},
        "counts": {
            "train_whatif": len(data.train_whatif),
            "train_graphs": len(data.train_plain),
            "val_whatif": len(data.val_whatif),
            "test_whatif": len(data.test_whatif),
            "test_graphs": len(data.test_plain),
        },
    }
    ckpt["feature_ranges"] = feature_ranges(data.train_whatif + data.train_plain)
    for variant in cfg.variants:
        model, info = fit_gat(variant, data, cfg, progress)
        ckpt["gat"][variant] = {
            "config": to_json(model.cfg),
            "state": model.state_dict(),
            "epochs": info["epochs"],
            "best_val_loss": float(info["best_val_loss"]),
            "seconds": float(info["seconds"]),
            "history": [[h["train_loss"], h["val_loss"]] for h in info["history"]],
        }
    # learned baselines: what-if samples plus as many graphs as recorded (they teach "no edit, no change")
    train_rows = data.train_whatif + data.train_plain[: len(data.train_whatif)]
    x, y = _xy(train_rows)
    xv, yv = _xy(data.val_whatif)
    xv = xv if len(xv) else np.zeros((0, x.shape[1]), dtype=np.float32)
    if progress:
        progress("mlp and xgboost")
    mlp = fit_mlp(x, y, xv, yv, cfg.seed)
    ckpt["mlp"] = {"n_in": int(x.shape[1]), "state": mlp.state_dict()}
    ckpt["xgboost"] = bytes(fit_xgb(x, y, xv, yv, cfg.seed).save_raw("json")).decode()
    return ckpt


def feature_ranges(samples: list) -> dict[str, torch.Tensor]:
    """Per node type, the smallest and largest value of every feature column in the training
    samples (shape [2, columns]), and of the graph-level inputs: the domain the model has seen."""
    out = {}
    for t in ("compute", "network"):
        xs = [s[t].x for s in samples if len(s[t].x)]
        if xs:
            x = torch.cat(xs)
            out[t] = torch.stack([x.min(0).values, x.max(0).values])
    g = torch.stack([graph_inputs(s) for s in samples]) if samples else torch.zeros((0, 4))
    if len(g):
        out["graph"] = torch.stack([g.min(0).values, g.max(0).values])
    return out


def _prefixed(progress: Callable[[str], None] | None, prefix: str) -> Callable[[str], None] | None:
    """``progress`` with ``prefix`` before every message (None stays None)."""
    if progress is None:
        return None
    report = progress
    return lambda m: report(prefix + m)


def train(dataset: str | Path, out: str | Path, cfg: ModelsConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Train a checkpoint per configured split into ``out`` (``<split>.pt``)."""
    rows = read_rows(dataset)
    out = Path(out)
    checkpoints: dict[str, dict[str, Any]] = {}
    summary = {"checkpoints": checkpoints, "dataset": str(dataset)}
    for split in cfg.splits:
        t0 = time.perf_counter()
        ckpt = train_split(rows, split, cfg, _prefixed(progress, f"{split}: "))
        path = save_checkpoint(ckpt, out / f"{split}.pt")
        checkpoints[split] = {
            "path": str(path),
            "seconds": round(time.perf_counter() - t0, 1),
            **ckpt["counts"],
            "epochs": {v: e["epochs"] for v, e in ckpt["gat"].items()},
        }
    return summary

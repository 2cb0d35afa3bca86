"""eval: every model and baseline side by side on the held-out part of each split.

What-if metrics are measured against re-runs: the input is the paired baseline step's graph
with the injected op(s) lengthened by the requested delay, the truth the perturbed step as it
was measured. ``step MAPE`` / ``MSE`` compare the predicted perturbed step time, ``ΔT MAPE`` /
``ΔT MAE`` / ``sign`` the predicted change (predicted step - measured baseline step) with the
measured change. A change counts as positive when it exceeds 1% of the baseline step (below
that, step-to-step noise decides). Slack Spearman ρ (mean per graph) and critical-node F1 are
against the CPM of the held-out graphs as recorded: the replay computes them exactly by
definition, the formula and the pooled-feature regressors do not predict them.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from bottleneck_oracle_lab.models.baselines import pooled_features
from bottleneck_oracle_lab.models.checkpoint import gat_from, load_checkpoint, mlp_from, xgb_from
from bottleneck_oracle_lab.models.hetero_gat import NODE_TYPES, prepare
from bottleneck_oracle_lab.training.eval_table import COLUMNS, HEAD, rows_of  # noqa: F401 (eval's table, re-exported)
from bottleneck_oracle_lab.training.train import read_rows, split_data

SIGN_DEADZONE = 0.01  # of the baseline step
LOG_RATIO_MAX = float(np.log(1e6))
"""The models predict log(step / reference): a prediction is read at most 10^6 times the reference
step either way. A model far out of its domain (a held-out layout whose pooled feature was nearly
constant in training: standardised by a tiny spread, its value is huge) can predict a log-ratio
past exp's range: read as infinity, it made every metric of the split infinite; read so, the
prediction is a million times off and its error says so."""
NODE_GRAPHS = 40  # held-out graphs the node-level metrics are computed on, per split
METRICS = (
    "n",
    "step_mape",
    "step_mse_ms2",
    "dt_mape",
    "dt_median_ape",
    "dt_mae_ms",
    "sign_acc",
    "slack_rho",
    "critical_f1",
    "ms_per_graph",
)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(a) < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    return float(spearmanr(a, b).statistic)


def _f1(pred: np.ndarray, truth: np.ndarray) -> float:
    tp = float((pred & truth).sum())
    p, t = float(pred.sum()), float(truth.sum())
    return 2 * tp / (p + t) if p + t else 1.0


def whatif_metrics(pred: np.ndarray, y: np.ndarray, ref: np.ndarray) -> dict:
    dt_p, dt_m = pred - ref, y - ref
    ape = np.abs(dt_p - dt_m) / np.maximum(np.abs(dt_m), 1e-9) * 100
    pos_p, pos_m = dt_p > SIGN_DEADZONE * ref, dt_m > SIGN_DEADZONE * ref
    return {
        "n": len(y),
        "step_mape": float(np.mean(np.abs(pred - y) / y) * 100),
        "step_mse_ms2": float(np.mean(((pred - y) / 1000) ** 2)),
        "dt_mape": float(np.mean(ape)),
        "dt_median_ape": float(np.median(ape)),
        "dt_mae_ms": float(np.mean(np.abs(dt_p - dt_m)) / 1000),
        "sign_acc": float(np.mean(pos_p == pos_m)),
    }


def _ratio(log_ratio):
    """exp of a predicted log(step / reference), within LOG_RATIO_MAX either way (NaN stays NaN)."""
    return np.exp(np.clip(log_ratio, -LOG_RATIO_MAX, LOG_RATIO_MAX))


def _gat_predict(model, samples: list, variant: str) -> tuple[np.ndarray, float]:
    from torch_geometric.data import Batch

    preds, t0 = [], time.perf_counter()
    with torch.no_grad():
        for s in samples:
            out = model(Batch.from_data_list([prepare(s, variant)]))
            preds.append(float(s.ref_step) * _ratio(float(out["step"][0])))
    return np.array(preds), 1000 * (time.perf_counter() - t0) / max(len(samples), 1)


def _gat_nodes(model, samples: list, variant: str) -> tuple[float, float]:
    from torch_geometric.data import Batch

    rhos, f1s = [], []
    with torch.no_grad():
        for s in samples:
            out = model(Batch.from_data_list([prepare(s, variant)]))
            slack = np.concatenate([out[f"slack_{t}"].numpy() for t in NODE_TYPES])
            truth = np.concatenate([s[t].slack.numpy() for t in NODE_TYPES])
            crit = np.concatenate([out[f"critical_{t}"].numpy() > 0 for t in NODE_TYPES])
            ctruth = np.concatenate([s[t].critical.numpy() for t in NODE_TYPES])
            rhos.append(_spearman(slack, truth))
            f1s.append(_f1(crit, ctruth))
    return float(np.nanmean(rhos)) if rhos else float("nan"), float(np.mean(f1s)) if f1s else float("nan")


def evaluate_checkpoint(ckpt_path: str | Path, dataset: str | Path) -> dict:
    """The metrics of every model in one checkpoint on its split's held-out part."""
    ckpt = load_checkpoint(ckpt_path)
    rows = read_rows(dataset)
    split = ckpt["split"]
    data = split_data(rows, split, int(ckpt["config"]["seed"]))
    test = data.test_whatif
    if not test:
        return {"split": split, "checkpoint": str(ckpt_path), "models": {}, "n_whatif": 0, "n_graphs": len(data.test_plain)}
    y = np.array([float(s.y_step) for s in test])
    ref = np.array([float(s.ref_step) for s in test])
    wi_rows = [r for r in data.test_rows if r.get("whatif")]
    node_samples = data.test_plain[:: max(len(data.test_plain) // NODE_GRAPHS, 1)][:NODE_GRAPHS]
    models: dict[str, dict] = {}
    replay = np.array([float(s.replay_step) for s in test])
    models["replay (CPM)"] = {
        **whatif_metrics(replay, y, ref),
        "slack_rho": 1.0,
        "critical_f1": 1.0,
        "ms_per_graph": float(np.mean([r["whatif"]["replay_ms"] for r in wi_rows])),
    }
    formula = np.array([float(s.formula_step) for s in test])
    models["1F1B / busy-rank formula"] = {**whatif_metrics(formula, y, ref), "slack_rho": None, "critical_f1": None, "ms_per_graph": None}
    t0 = time.perf_counter()
    x = np.stack([pooled_features(s) for s in test])
    feat_ms = 1000 * (time.perf_counter() - t0) / len(test)
    mlp = mlp_from(ckpt)
    t0 = time.perf_counter()
    with torch.no_grad():
        p = ref * _ratio(mlp(torch.from_numpy(x)).numpy().astype(np.float64))
    models["MLP (pooled)"] = {
        **whatif_metrics(p, y, ref),
        "slack_rho": None,
        "critical_f1": None,
        "ms_per_graph": feat_ms + 1000 * (time.perf_counter() - t0) / len(test),
    }
    import xgboost as xgb

    booster = xgb_from(ckpt)
    t0 = time.perf_counter()
    p = ref * _ratio(booster.predict(xgb.DMatrix(x)).astype(np.float64))
    models["XGBoost (pooled)"] = {
        **whatif_metrics(p, y, ref),
        "slack_rho": None,
        "critical_f1": None,
        "ms_per_graph": feat_ms + 1000 * (time.perf_counter() - t0) / len(test),
    }
    for variant in ckpt["gat"]:
        model = gat_from(ckpt, variant)
        p, ms = _gat_predict(model, test, variant)
        rho, f1 = _gat_nodes(model, node_samples, variant)
        models[f"HeteroGAT {variant}"] = {**whatif_metrics(p, y, ref), "slack_rho": rho, "critical_f1": f1, "ms_per_graph": ms}
    return {"split": split, "checkpoint": str(ckpt_path), "n_whatif": len(test), "n_graphs": len(node_samples), "models": models}


def checkpoints_in(path: str | Path) -> list[Path]:
    p = Path(path)
    if p.is_dir():
        found = [p / f"{s}.pt" for s in ("random", "ood_size", "ood_layout", "ood_injection") if (p / f"{s}.pt").is_file()]
        return found or sorted(p.glob("*.pt"))
    return [p]


def evaluate(checkpoint: str | Path, dataset: str | Path) -> dict:
    """{'splits': [per-checkpoint results], 'metrics': names} for a checkpoint file or a folder of them."""
    from bottleneck_oracle.errors import OracleError

    paths = checkpoints_in(checkpoint)
    if not paths:
        raise OracleError(f"{checkpoint}: holds no checkpoints (run `bottleneck-oracle train` first)")
    return {"dataset": str(dataset), "metrics": list(METRICS), "splits": [evaluate_checkpoint(p, dataset) for p in paths]}


def to_markdown(result: dict) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(r) + " |" for r in rows_of(result)]
    lines += [
        "",
        "What-if against re-runs of paired conditions (a slowdown in every step of a block between clean blocks, the",
        "noise floor beside every figure): docs/eval-reruns.md, written by benchmarks/reruns.py; the same on a GPU",
        "(an H200, the replay only): docs/eval-gpu.md.",
    ]
    return "\n".join(lines) + "\n"

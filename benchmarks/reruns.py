"""What-if against re-runs: each predictor's saving against the measured saving of paired conditions.

Record the conditions first (ranks pinned, interleaved clean / slowed / clean blocks):

    bottleneck-oracle generate --paired --config benchmarks/paired.yaml --out data/paired
    python benchmarks/reruns.py data/paired [data/paired_more ...] [--folds 4] [--checkpoint data/checkpoints/random.pt] [--json benchmarks/reruns_results.json]

Every condition is predicted held out: the launches are split into folds; the correction model
of a fold is fitted on the other folds' launches (three quarters of them) and its 90% interval
calibrated on the rest (split conformal). Prints one markdown table per breakdown (all
conditions, by kind, by size and layout) and the noise floor of the recordings.

Beside the replay: the pipeline / busy-rank formula (analysis.phases.formula_step), the bundled
HeteroGAT (its predicted step with the slowdown removed against its predicted step as recorded),
and with ``--checkpoint`` the pooled MLP and XGBoost of a `train` checkpoint (needs torch and
xgboost), each predicting the step with the injected ranges removed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from bottleneck_oracle.api import build
from bottleneck_oracle.models.corrections import Corrections, GraphCorrections
from bottleneck_oracle_lab.training.reruns import (
    Conditions,
    calibrate,
    conformal_halfwidth,
    corrected,
    evaluate_launch,
    fit_corrections,
    merge,
    on_median,
    read_paired,
    scores,
)

REMEASURE, REMEASURE_TRUTH = "re-measurement (noise)", "_after"
REPORT: list[str] = []


def emit(text: str) -> None:
    """Print a piece of the report (and keep it for --markdown)."""
    print(text)
    REPORT.append(text)


def baselines(c: Conditions, table, predictor, ckpt) -> dict[str, np.ndarray]:
    """Per condition the saving the formula, the bundled graph network and the pooled baselines
    predict for removing the injected ranges (their effect on the median step: ``on_median``)."""
    from bottleneck_oracle.models.predict import sample_for

    out: dict[str, list[float]] = defaultdict(list)
    for steps in c.steps:
        per: dict[str, list[float]] = defaultdict(list)
        span = [max(g.measured.values()) for g, _, _ in steps]
        for g, f, _ in steps:
            before, _ = sample_for(g, table=table)
            after, _ = sample_for(g, f.times, table)
            ref = before.scalars["ref_step"]
            per["formula"].append(ref - after.scalars["formula_step"])
            if predictor is not None:
                eff = predictor.effect(g, before, after)
                for v, d in eff.delta_us.items():
                    per[f"HeteroGAT {v}"].append(float("nan") if d is None else -d)
            if ckpt is not None:
                import torch
                import xgboost as xgb

                from bottleneck_oracle_lab.models.baselines import pooled_features
                from bottleneck_oracle_lab.models.checkpoint import mlp_from, xgb_from
                from bottleneck_oracle_lab.models.pyg import heterodata

                mlp, booster = ckpt.setdefault("_mlp", mlp_from(ckpt)), ckpt.setdefault("_xgb", xgb_from(ckpt))
                x = np.stack([pooled_features(heterodata(before)), pooled_features(heterodata(after))])
                with torch.no_grad():
                    m = ref * np.exp(mlp(torch.from_numpy(x)).numpy().astype(np.float64))
                b = ref * np.exp(booster.predict(xgb.DMatrix(x)).astype(np.float64))
                per["MLP (pooled)"].append(float(m[0] - m[1]))
                per["XGBoost (pooled)"].append(float(b[0] - b[1]))
        for k, v in per.items():
            out[k].append(on_median(span, v))
    return {k: np.array(v) for k, v in out.items()}


def held_out(model: Corrections | GraphCorrections, cal: Conditions, held: Conditions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``model`` calibrated on ``cal``: the corrected savings of the ``held`` conditions and their 90% intervals."""
    calibrate(model, cal)
    p = corrected(model, held)
    half = model.halfwidth * np.maximum(held.own, 1.0)
    return p, p - half, p + half


def table(
    title: str,
    preds: dict[str, np.ndarray],
    measured: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    intervals: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[str, dict]:
    lines = [
        f"**{title}** ({len(measured)} conditions)",
        "",
        "| predictor | answered | MAPE [90% CI] | median APE | within 25% | sign | Kendall τ | 90% interval covers |",
        "|---|---|---|---|---|---|---|---|",
    ]
    res = {}
    for name, p in preds.items():
        truth = preds[REMEASURE_TRUTH] if name == REMEASURE else measured
        if name == REMEASURE_TRUTH:
            continue
        if name == "corrected":
            s = scores(p, truth, lo, hi)
        elif intervals and name in intervals:
            s = scores(p, truth, *intervals[name])
        else:
            s = scores(p, truth)
        res[name] = s
        cov = f"{100 * s['coverage']:.0f}%" if "coverage" in s else "—"
        if not s["n"]:
            lines.append(f"| {name} | 0% | — | — | — | — | — | — |")
            continue
        lines.append(
            f"| {name} | {100 * s['answered']:.0f}% | {100 * s['mape']:.1f}% [{100 * s['mape_ci90'][0]:.1f}, {100 * s['mape_ci90'][1]:.1f}] | {100 * s['median_ape']:.1f}% | "
            f"{100 * s['within_25pct']:.0f}% | {100 * s['sign']:.0f}% | {s['kendall_tau']:.3f} | {cov} |"
        )
    return "\n".join(lines) + "\n", res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paired", nargs="+", help="folders written by generate --paired (several: their conditions together)")
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--checkpoint", default=None, help="a `train` checkpoint: add its pooled MLP and XGBoost")
    ap.add_argument("--no-gat", action="store_true", help="leave out the bundled graph network")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None, help="also write the tables to this file (docs/eval-reruns.md)")
    ap.add_argument("--graph-members", type=int, default=4, help="members of the graph network's ensemble (0: leave it out)")
    ap.add_argument("--graph-epochs", type=int, default=15)
    ap.add_argument("--graph-seed", type=int, default=0, help="seeds of the graph network's folds: 100 x this + the fold")
    ap.add_argument("--save-kind", choices=("ridge", "graph"), default="ridge", help="which corrections --save-corrections saves")
    ap.add_argument(
        "--save-corrections",
        default=None,
        metavar="NPZ",
        help="fit the corrections on every condition and save them (interval: the held-out residuals' 90%% quantile)",
    )
    a = ap.parse_args()
    predictor = ckpt = None
    if not a.no_gat:
        from bottleneck_oracle.models.predict import Predictor

        predictor = Predictor()
    if a.checkpoint:
        from bottleneck_oracle_lab.models.checkpoint import load_checkpoint

        ckpt = load_checkpoint(a.checkpoint)
    t0 = time.monotonic()
    rows = []
    for folder in a.paired:
        here = read_paired(folder)
        if {r["launch_id"] for r in here} & {r["launch_id"] for r in rows}:  # the same grid recorded twice: tell the launches apart
            here = [{**r, "launch_id": f"{Path(folder).name}/{r['launch_id']}"} for r in here]
        rows += here
    by_launch: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_launch[r["launch_id"]].append(r)
    parts = []
    extra: dict[str, list[np.ndarray]] = defaultdict(list)
    for lid, rs in sorted(by_launch.items()):
        table_, graphs = build(rs[0]["path"])
        parts.append(evaluate_launch(rs, table_, graphs))
        for k, v in baselines(parts[-1], table_, predictor, ckpt).items():
            extra[k].append(v)
        print(f"{lid}: {len(rs)} conditions, {len(graphs)} steps ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    launches = sorted(by_launch)
    fold_of = {lid: i % a.folds for i, lid in enumerate(launches)}
    allc = merge(parts)
    lid_of = [r["launch_id"] for r in allc.rows]
    corr, gcorr = np.zeros(len(allc.rows)), np.full(len(allc.rows), np.nan)
    lo, hi = np.zeros(len(allc.rows)), np.zeros(len(allc.rows))
    glo, ghi = np.full(len(allc.rows), np.nan), np.full(len(allc.rows), np.nan)
    for k in range(a.folds):
        test = [i for i, lid in enumerate(lid_of) if fold_of[lid] == k]
        rest = sorted({lid for lid in launches if fold_of[lid] != k})
        cal_l = set(rest[::4])
        fit = [i for i, lid in enumerate(lid_of) if lid in rest and lid not in cal_l]
        cal = [i for i, lid in enumerate(lid_of) if lid in cal_l]
        calib, held = allc.select(cal), allc.select(test)
        model = fit_corrections(allc.select(fit), seed=k)
        corr[test], lo[test], hi[test] = held_out(model, calib, held)
        print(
            f"fold {k}: fit on {len(fit)}, calibrated on {len(cal)} (half-width {model.halfwidth:.3f} of the removed time), "
            f"{len(test)} held out ({time.monotonic() - t0:.0f} s)",
            file=sys.stderr,
        )
        if a.graph_members:
            from bottleneck_oracle_lab.training.graph_corrections import fit_graph_corrections

            gm = fit_graph_corrections(allc.select(fit), members=a.graph_members, epochs=a.graph_epochs, seed=100 * a.graph_seed + k)
            gcorr[test], glo[test], ghi[test] = held_out(gm, calib, held)
            print(f"fold {k}: graph network, half-width {gm.halfwidth:.3f} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    if a.save_corrections:
        if a.save_kind == "graph":
            from bottleneck_oracle_lab.training.graph_corrections import fit_graph_corrections

            model = fit_graph_corrections(allc, members=max(a.graph_members, 1), epochs=a.graph_epochs, seed=a.folds)
            corr_used = gcorr
        else:
            model = fit_corrections(allc, seed=a.folds)
            corr_used = corr
        model.halfwidth = conformal_halfwidth(allc, corr_used)  # the held-out residuals of the folds
        model.trained_on = (
            f"{len(allc.rows)} paired conditions ({', '.join(sorted({r['size'] + ' ' + r['layout'] for r in allc.rows}))}; gloo, 2 ranks)"
        )
        model.save(a.save_corrections)
        print(f"corrections saved to {a.save_corrections}: half-width {model.halfwidth:.3f} of the removed time", file=sys.stderr)
    preds = {
        "own": allc.own,
        "replay": allc.replay,
        "corrected": corr,
        "blame_op": allc.blame_op,
        "blame_region": allc.blame_region,
        "blame_region_baseline": allc.blame_region_baseline,
    }
    if a.graph_members:
        preds["graph-corrected"] = gcorr
    preds.update({k: np.concatenate(v) for k, v in extra.items()})
    # the truth against itself: the saving measured with the clean block before alone, scored
    # against the one measured with the clean block after alone (what no predictor can beat by much)
    preds[REMEASURE], preds[REMEASURE_TRUTH] = allc.remeasured, allc.measured_after
    out: dict = {"conditions": len(allc.rows), "launches": len(launches), "folds": a.folds}
    cvc = [r["clean_vs_clean"] for r in allc.rows]
    spr = [r["clean_spread"] for r in allc.rows]
    per_launch = {lid: rs[0]["launch_clean_vs_clean"] for lid, rs in by_launch.items()}
    out["noise"] = {
        "median_clean_spread": statistics.median(spr),
        "median_clean_vs_clean": statistics.median(cvc),
        "median_launch_clean_vs_clean": statistics.median(per_launch.values()),
        "launches_above_bound": sum(r[0]["noisy"] for r in by_launch.values()),
        "bound": rows[0]["bound"],
    }
    emit(
        f"Noise floor: clean blocks' robust spread {100 * out['noise']['median_clean_spread']:.1f}% (median over conditions); clean vs clean "
        f"{100 * out['noise']['median_clean_vs_clean']:.1f}% (median over conditions), {out['noise']['launches_above_bound']} of {len(launches)} "
        f"launches above the {100 * out['noise']['bound']:.0f}% bound after re-recording\n"
    )
    gint = {"graph-corrected": (glo, ghi)}
    text, out["all"] = table("All conditions", preds, allc.measured, lo, hi, gint)
    emit(text)
    resolvable = [i for i in range(len(allc.rows)) if allc.noise[i] <= 0.1 * abs(allc.measured[i])]
    out["resolvable"] = {"n": len(resolvable), "rule": "the measured saving's bootstrap standard error is at most 10% of it"}
    text, out["resolvable"]["scores"] = table(
        "Resolvable conditions (the measurement's standard error at most 10% of the saving)",
        {k: v[resolvable] for k, v in preds.items()},
        allc.measured[resolvable],
        lo[resolvable],
        hi[resolvable],
        {"graph-corrected": (glo[resolvable], ghi[resolvable])},
    )
    emit(text)
    groups: dict[str, dict[str, list[int]]] = {"kind": defaultdict(list), "size, layout": defaultdict(list), "delay_ms": defaultdict(list)}
    for i, r in enumerate(allc.rows):
        groups["delay_ms"][f"{r['condition']['delay_ms']:g}"].append(i)
        groups["kind"][r["condition"]["kind"]].append(i)
        groups["size, layout"][f"{r['size']} {r['layout']}"].append(i)
    out["by"] = {}
    for by, gs in groups.items():
        for key, idx in sorted(gs.items()):
            text, out["by"][f"{by}={key}"] = table(
                f"{by} = {key}",
                {k: v[idx] for k, v in preds.items()},
                allc.measured[idx],
                lo[idx],
                hi[idx],
                {"graph-corrected": (glo[idx], ghi[idx])},
            )
            emit(text)
    out["rows"] = [
        {
            "launch_id": r["launch_id"],
            "condition": r["condition"],
            "measured_us": float(allc.measured[i]),
            "noise_us": float(allc.noise[i]),
            "interval_us": [float(lo[i]), float(hi[i])],
            "graph_interval_us": [float(glo[i]), float(ghi[i])],
            "region": allc.region_names[i],
            "baseline_region": allc.baseline_region_names[i],
            **{k: float(v[i]) for k, v in preds.items()},
        }
        for i, r in enumerate(allc.rows)
    ]
    for label, subset in (
        ("", groups["kind"].get("compute", [])),
        ("resolvable_", [i for i in groups["kind"].get("compute", []) if i in set(resolvable)]),
    ):
        region_check(allc, subset, label, out)
    out["seconds"] = time.monotonic() - t0
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(
                f"# What-if against re-runs\n\n`python benchmarks/reruns.py {' '.join(a.paired)} --folds {a.folds}"
                f"{' --checkpoint ' + a.checkpoint if a.checkpoint else ''}` ({out['conditions']} conditions in {out['launches']} launches, "
                f"{out['seconds'] / 60:.0f} min).\n\n" + "\n".join(REPORT) + "\n"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def region_check(allc: Conditions, comp: list[int], label: str, out: dict) -> None:
    """Acceptance 3 of the region blame: the top region's saving within 25% of the measured one,
    against the peers and the block's own steps, and with the clean steps as the baseline; and,
    as the reference for what the measurement allows, the replay's."""
    if comp:
        m = allc.measured[comp]

        def within(pred: np.ndarray, idx: list[int] = comp) -> float:
            return float(np.mean(np.abs(pred[idx] - allc.measured[idx]) / np.maximum(np.abs(allc.measured[idx]), 1.0) <= 0.25))

        named, named_base = [allc.region_names[i] for i in comp], [allc.baseline_region_names[i] for i in comp]
        dp = [i for i in comp if allc.rows[i]["layout"].startswith("dp")]
        out[f"{label}region_on_compute"] = rc = {
            "n": len(comp),
            "within_25pct": within(allc.blame_region),
            "baseline_within_25pct": within(allc.blame_region_baseline),
            "replay_within_25pct": within(allc.replay),
            "op_within_25pct": within(allc.blame_op),
            "dp_n": len(dp),
            "dp_within_25pct": within(allc.blame_region, dp) if dp else 0.0,
            "top_region_is_injected": float(np.mean([n.startswith("oracle_inject:") for n in named])),
            "baseline_top_region_is_injected": float(np.mean([n.startswith("oracle_inject:") for n in named_base])),
            "op_share_of_measured": float(np.median(allc.blame_op[comp] / np.maximum(m, 1.0))),
        }
        emit(
            f"Region blame on the {len(comp)} {label.rstrip('_')} extra-compute conditions: top region within 25% of the measured saving in "
            f"{100 * rc['within_25pct']:.0f}% against the peers and the block's steps ({100 * rc['dp_within_25pct']:.0f}% of the {len(dp)} "
            f"data-parallel ones: a pipeline stage has no peer), {100 * rc['baseline_within_25pct']:.0f}% with the clean steps as the "
            f"baseline (the replay of the injected range: {100 * rc['replay_within_25pct']:.0f}%; the top op row: "
            f"{100 * rc['op_within_25pct']:.0f}%, its saving {100 * rc['op_share_of_measured']:.0f}% of the measured, median); the top "
            f"region is the injected range in {100 * rc['top_region_is_injected']:.0f}% ({100 * rc['baseline_top_region_is_injected']:.0f}% "
            f"with the baseline)"
        )


if __name__ == "__main__":
    raise SystemExit(main())

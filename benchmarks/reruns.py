"""What-if against re-runs: each predictor's saving against the measured saving of paired conditions.

Record the conditions first (ranks pinned, interleaved clean / slowed / clean blocks):

    bottleneck-oracle generate --paired --config benchmarks/paired.yaml --out data/paired
    python benchmarks/reruns.py data/paired [--folds 4] [--json benchmarks/reruns_results.json]

Every condition is predicted held out: the launches are split into folds; the correction model
of a fold is fitted on the other folds' launches (three quarters of them) and its 90% interval
calibrated on the rest (split conformal). Prints one markdown table per breakdown (all
conditions, by kind, by size and layout) and the noise floor of the recordings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

import numpy as np

from bottleneck_oracle.api import build
from bottleneck_oracle.training.reruns import Conditions, calibrate, corrected, evaluate_launch, fit_corrections, merge, read_paired, scores

PREDICTORS = ("own", "replay", "corrected", "blame_op", "blame_region")


def pick(c: Conditions, idx: list[int]) -> Conditions:
    out = Conditions(rows=[c.rows[i] for i in idx], measured=c.measured[idx], own=c.own[idx], replay=c.replay[idx], blame_op=c.blame_op[idx],
                     blame_region=c.blame_region[idx], region_names=[c.region_names[i] for i in idx])  # fmt: skip
    out.steps = [c.steps[i] for i in idx]
    return out


def table(title: str, preds: dict[str, np.ndarray], measured: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[str, dict]:
    lines = [f"**{title}** ({len(measured)} conditions)", "", "| predictor | MAPE [90% CI] | median APE | within 25% | sign | Kendall τ | 90% interval covers |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    res = {}
    for name, p in preds.items():
        s = scores(p, measured, lo, hi) if name == "corrected" else scores(p, measured)
        res[name] = s
        cov = f"{100 * s['coverage']:.0f}%" if "coverage" in s else "—"
        lines.append(f"| {name} | {100 * s['mape']:.1f}% [{100 * s['mape_ci90'][0]:.1f}, {100 * s['mape_ci90'][1]:.1f}] | {100 * s['median_ape']:.1f}% | "
                     f"{100 * s['within_25pct']:.0f}% | {100 * s['sign']:.0f}% | {s['kendall_tau']:.3f} | {cov} |")  # fmt: skip
    return "\n".join(lines) + "\n", res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paired", help="folder written by generate --paired")
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    t0 = time.monotonic()
    rows = read_paired(a.paired)
    by_launch: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_launch[r["launch_id"]].append(r)
    parts = []
    for lid, rs in sorted(by_launch.items()):
        table_, graphs = build(rs[0]["path"])
        parts.append(evaluate_launch(rs, table_, graphs))
        print(f"{lid}: {len(rs)} conditions, {len(graphs)} steps ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    launches = sorted(by_launch)
    fold_of = {lid: i % a.folds for i, lid in enumerate(launches)}
    allc = merge(parts)
    lid_of = [r["launch_id"] for r in allc.rows]
    corr = np.zeros(len(allc.rows))
    lo, hi = np.zeros(len(allc.rows)), np.zeros(len(allc.rows))
    for k in range(a.folds):
        test = [i for i, lid in enumerate(lid_of) if fold_of[lid] == k]
        rest = sorted({lid for lid in launches if fold_of[lid] != k})
        cal_l = set(rest[::4])
        fit = [i for i, lid in enumerate(lid_of) if lid in rest and lid not in cal_l]
        cal = [i for i, lid in enumerate(lid_of) if lid in cal_l]
        model = fit_corrections(pick(allc, fit), seed=k)
        calibrate(model, pick(allc, cal))
        held = pick(allc, test)
        p = corrected(model, held)
        corr[test] = p
        half = model.halfwidth * np.maximum(held.own, 1.0)
        lo[test], hi[test] = p - half, p + half
        print(f"fold {k}: fit on {len(fit)}, calibrated on {len(cal)} (half-width {model.halfwidth:.3f} of the removed time), "
              f"{len(test)} held out ({time.monotonic() - t0:.0f} s)", file=sys.stderr)  # fmt: skip
    preds = {"own": allc.own, "replay": allc.replay, "corrected": corr, "blame_op": allc.blame_op, "blame_region": allc.blame_region}
    out: dict = {"conditions": len(allc.rows), "launches": len(launches), "folds": a.folds}
    cvc = [r["clean_vs_clean"] for r in allc.rows]
    spr = [r["clean_spread"] for r in allc.rows]
    per_launch = {lid: rs[0]["launch_clean_vs_clean"] for lid, rs in by_launch.items()}
    out["noise"] = {"median_clean_spread": statistics.median(spr), "median_clean_vs_clean": statistics.median(cvc),
                    "median_launch_clean_vs_clean": statistics.median(per_launch.values()), "launches_above_bound": sum(r[0]["noisy"] for r in by_launch.values()),
                    "bound": rows[0]["bound"]}  # fmt: skip
    print(f"Noise floor: clean blocks' robust spread {100 * out['noise']['median_clean_spread']:.1f}% (median over conditions); clean vs clean "
          f"{100 * out['noise']['median_clean_vs_clean']:.1f}% (median over conditions), {out['noise']['launches_above_bound']} of {len(launches)} "
          f"launches above the {100 * out['noise']['bound']:.0f}% bound after re-recording\n")  # fmt: skip
    text, out["all"] = table("All conditions", preds, allc.measured, lo, hi)
    print(text)
    groups: dict[str, dict[str, list[int]]] = {"kind": defaultdict(list), "size, layout": defaultdict(list)}
    for i, r in enumerate(allc.rows):
        groups["kind"][r["condition"]["kind"]].append(i)
        groups["size, layout"][f"{r['size']} {r['layout']}"].append(i)
    out["by"] = {}
    for by, gs in groups.items():
        for key, idx in sorted(gs.items()):
            text, out["by"][f"{by}={key}"] = table(
                f"{by} = {key}", {k: v[idx] for k, v in preds.items()}, allc.measured[idx], lo[idx], hi[idx]
            )
            print(text)
    comp = groups["kind"].get("compute", [])
    if comp:
        ape = np.abs(allc.blame_region[comp] - allc.measured[comp]) / np.maximum(np.abs(allc.measured[comp]), 1.0)
        ape_op = np.abs(allc.blame_op[comp] - allc.measured[comp]) / np.maximum(np.abs(allc.measured[comp]), 1.0)
        named = [allc.region_names[i] for i in comp]
        out["region_on_compute"] = {"n": len(comp), "within_25pct": float(np.mean(ape <= 0.25)), "op_within_25pct": float(np.mean(ape_op <= 0.25)),
                                    "top_region_is_injected": float(np.mean([n.startswith("oracle_inject:") for n in named])),
                                    "op_share_of_measured": float(np.median(allc.blame_op[comp] / np.maximum(allc.measured[comp], 1.0)))}  # fmt: skip
        rc = out["region_on_compute"]
        print(f"Region blame on the {len(comp)} extra-compute conditions: top region within 25% of the measured saving in "
              f"{100 * rc['within_25pct']:.0f}% (top op row: {100 * rc['op_within_25pct']:.0f}%; the op row's saving is "
              f"{100 * rc['op_share_of_measured']:.0f}% of the measured, median); the top region is the injected range in "
              f"{100 * rc['top_region_is_injected']:.0f}%")  # fmt: skip
    out["seconds"] = time.monotonic() - t0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The bundled corrections against recordings they were not fitted on, with a less noisy truth.

The bundled corrections (``models/corrections.npz``: the graph network, ``GraphCorrections``;
before 2026-12-04 the ridge ``Corrections``) were fitted on the 112 conditions of the paired grid
(`benchmarks/reruns.py --save-corrections`). The long launches of docs/eval-reruns.md (33 to 96
slowed blocks per condition instead of 6: clean vs clean 2.3-3.2% instead of 3.6-5.2%) are
recorded after the fit and are held out whole. Per condition: the measured saving, the replay's, the
corrected one and its 90% interval; then MAPE, sign, Kendall's tau and coverage over them. And
issue 14's region blame on the extra-compute conditions (many small ops): blame's top region
against the peers, and with the clean steps as the baseline, within 25% of the measured saving.

    python benchmarks/corrections_heldout.py data/paired_long data/paired_long_pp data/paired_xl [--json out.json]
        [--only 'GLOB']

``--baselines`` adds the formula's saving (``analysis.phases.formula_step``) and, with
``--checkpoint`` (a `train` checkpoint), the pooled MLP's and XGBoost's, predicted as in
``benchmarks/reruns.py``. ``--per-step`` keeps, in each row, every slowed step's replayed and corrected saving and the step
times of the slowed and clean steps (``per_step``), for scoring against other estimates of the
truth (``benchmarks/local_scores.py``). ``--only`` scores the launches whose id matches (``'*.c*'``: the conditions recorded again alone,
to merge over the rows they replace with ``benchmarks/heldout_merge.py``).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from collections import defaultdict

import numpy as np

from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.api import build
from bottleneck_oracle.models.corrections import load_corrections
from bottleneck_oracle_lab.training.reruns import corrected, evaluate_launch, merge, read_paired, scores


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paired", nargs="+", help="folders written by generate --paired")
    ap.add_argument("--corrections", default=None, help="a saved corrections file (default: the bundled one)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None, metavar="GLOB", help="score only the launches whose id matches")
    ap.add_argument("--per-step", action="store_true", help="keep each slowed step's savings and the step times in the rows")
    ap.add_argument("--baselines", action="store_true", help="also the formula, and with --checkpoint the pooled MLP and XGBoost")
    ap.add_argument("--checkpoint", default=None, help="a `train` checkpoint (with --baselines)")
    a = ap.parse_args()
    ckpt = None
    if a.checkpoint:
        from bottleneck_oracle_lab.models.checkpoint import load_checkpoint

        ckpt = load_checkpoint(a.checkpoint)
    if a.baselines:
        from reruns import baselines  # benchmarks/reruns.py, beside this script
    model = load_corrections(a.corrections)
    print(f"corrections: {model.trained_on}; 90% half-width {model.halfwidth:.3f} of the removed time")
    parts, preds, others = [], [], []
    per_step: dict[tuple[str, int], dict] = {}
    t0 = time.monotonic()
    for folder in a.paired:
        by: dict[str, list[dict]] = defaultdict(list)
        for r in read_paired(folder):
            if a.only is None or fnmatch.fnmatchcase(r["launch_id"], a.only):
                by[r["launch_id"]].append(r)
        for lid, rs in sorted(by.items()):
            table, graphs = build(rs[0]["path"])
            part = evaluate_launch(rs, table, graphs)
            preds.append(corrected(model, part))
            if a.baselines:
                others.append(baselines(part, table, None, ckpt))
            if a.per_step:
                span = {g.step: max(g.measured.values()) for g in graphs}
                for r, steps in zip(part.rows, part.steps, strict=True):
                    bases = [run_cpm(g) for g, _, _ in steps]
                    per_step[(r["launch_id"], r["index"])] = {
                        "steps": [g.step for g, _, _ in steps],
                        "replay_us": [b.makespan - f.times.cpm().makespan for (g, f, _), b in zip(steps, bases)],
                        "corrected_us": [model.saving(g, f, b) for (g, f, _), b in zip(steps, bases)],
                        "step_us": {str(k): span[k] for k in (*r["steps"], *r["clean_steps"]) if k in span},
                    }
            part.steps = [[] for _ in part.rows]  # the graphs are done with: a long launch holds thousands
            parts.append(part)
            del graphs
            print(f"{lid}: {len(rs)} conditions ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    c = merge(parts)
    pred = np.concatenate(preds)
    names = {"formula": "formula", "MLP (pooled)": "mlp_pooled", "XGBoost (pooled)": "xgb_pooled"}
    other = {names[k]: np.concatenate([o[k] for o in others]) for k in names if others and all(k in o for o in others)}
    half = model.halfwidth * np.maximum(c.own, 1.0)
    rows = []

    def which(
        r: dict, steps: bool = True
    ) -> dict:  # the row's place in its launch, and the row it replaces (a condition recorded again alone)
        out = {"index": r["index"], "delay_ms": r["condition"]["delay_ms"], **{k: r[k] for k in ("replaces", "local_saving_us") if k in r}}
        return out | ({"per_step": per_step[(r["launch_id"], r["index"])]} if steps and (r["launch_id"], r["index"]) in per_step else {})

    for i, r in enumerate(c.rows):
        k = r["condition"]
        rows.append(
            {
                "launch_id": r["launch_id"],
                **which(r),
                "kind": k["kind"],
                "rank": k["rank"],
                "measured_us": float(c.measured[i]),
                "replay_us": float(c.replay[i]),
                "corrected_us": float(pred[i]),
                "half_us": float(half[i]),
                "clean_vs_clean": r["clean_vs_clean"],
                "remeasured_us": float(c.remeasured[i]),
                "measured_after_us": float(c.measured_after[i]),
                **{f"{k}_us": float(v[i]) for k, v in other.items()},
            }
        )
        print(
            f"{r['launch_id']:16s} {k['kind']:10s} rank {k['rank']}: measured {c.measured[i] / 1e3:6.2f} ms, replay "
            f"{c.replay[i] / 1e3:6.2f}, corrected {pred[i] / 1e3:6.2f} ± {half[i] / 1e3:.2f}"
        )
    out = {
        "conditions": len(rows),
        "rows": rows,
        "replay": scores(c.replay, c.measured),
        "corrected": scores(pred, c.measured, pred - half, pred + half),
        "remeasured": scores(c.remeasured, c.measured_after),
        **{k: scores(v, c.measured) for k, v in other.items()},
    }
    comp = [i for i, r in enumerate(c.rows) if r["condition"]["kind"] == "compute"]
    region = []
    for i in comp:
        m = float(c.measured[i])
        row = {
            "launch_id": c.rows[i]["launch_id"],
            **which(c.rows[i], False),
            "rank": c.rows[i]["condition"]["rank"],
            "measured_us": m,
            "replay_us": float(c.replay[i]),
            "top_op_us": float(c.blame_op[i]),
            "region_us": float(c.blame_region[i]),
            "region": c.region_names[i],
            "region_baseline_us": float(c.blame_region_baseline[i]),
            "region_baseline": c.baseline_region_names[i],
        }
        region.append(row)
        print(
            f"compute, {row['launch_id']} rank {row['rank']}: measured {m / 1e3:.2f} ms; top op {row['top_op_us'] / 1e3:.2f}; top region "
            f"{row['region_us'] / 1e3:.2f} ({row['region'] or '-'}); with the baseline {row['region_baseline_us'] / 1e3:.2f} "
            f"({row['region_baseline'] or '-'})"
        )

    def within(key: str) -> float:  # the share within 25% of the measured saving, as scores() counts it
        return scores(np.array([r[key] for r in region]), np.array([r["measured_us"] for r in region]))["within_25pct"]

    out["region_on_compute"] = {
        "n": len(region),
        "rows": region,
        **{f"{k}_within_25pct": within(f"{k}_us") for k in ("region", "region_baseline", "replay", "top_op")},
    }
    print(
        "region blame on the compute conditions, within 25% of the measured saving: "
        + ", ".join(
            f"{k} {100 * out['region_on_compute'][f'{k}_within_25pct']:.0f}%" for k in ("region", "region_baseline", "replay", "top_op")
        )
        + f" (n={len(region)})"
    )
    for name in ("replay", "corrected", "remeasured", *other):
        s = out[name]
        cov = f", 90% interval covers {100 * s['coverage']:.0f}%" if "coverage" in s else ""
        print(
            f"{name:10s}: MAPE {100 * s['mape']:.1f}% [{100 * s['mape_ci90'][0]:.1f}, {100 * s['mape_ci90'][1]:.1f}], median APE "
            f"{100 * s['median_ape']:.1f}%, within 25% {100 * s['within_25pct']:.0f}%, sign {100 * s['sign']:.0f}%, "
            f"Kendall tau {s['kendall_tau']:.2f}{cov} (n={s['n']})"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

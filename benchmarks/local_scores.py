"""Predictions against a second estimate of the truth: each slowed block against its neighbours.

A condition's measured saving (``paired.measure``) pools its steps: the median of the slowed steps
minus the mean of its two clean groups' medians. A level shift of the machine that both clean
groups share (the pipeline launches of the grid have phases of 75-100 steps at 2-3x the step time)
leaves clean vs clean near 0 and still moves those medians. The local estimate takes each slowed
block against the clean blocks beside it and the median over blocks (``local_saving_us`` of newer
recordings); each prediction is taken the same way, block by block (what its per-step savings do
to the block's median step), from the per-step savings that ``corrections_heldout.py --per-step``
keeps. Prints the replay and the corrected replay against both estimates, and how far the two
estimates are apart.

    python benchmarks/local_scores.py A.json [B.json ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bottleneck_oracle_lab.systems.paired import local_saving
from bottleneck_oracle_lab.training.reruns import on_median, scores


def runs(steps: list[int]) -> list[list[int]]:
    """Consecutive step numbers, grouped (a block's steps after its dropped first one)."""
    out: list[list[int]] = []
    for s in sorted(steps):
        if out and s == out[-1][-1] + 1:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def local(row: dict) -> tuple[float, dict[str, float]]:
    """The local estimate of the row's saving, and each predictor's, block by block."""
    ps = row["per_step"]
    t = {int(k): v for k, v in ps["step_us"].items()}
    slowed = set(ps["steps"])
    clean = runs([s for s in t if s not in slowed])
    saving = {name: dict(zip(ps["steps"], ps[f"{name}_us"], strict=True)) for name in ("replay", "corrected")}
    blocks, pred = [], {name: [] for name in saving}
    for block in runs(sorted(slowed)):
        before = [c for c in clean if c[-1] < block[0]]
        after = [c for c in clean if c[0] > block[-1]]
        if not before or not after:
            continue
        tp = [t[s] for s in block]
        blocks.append([[t[s] for s in before[-1]], tp, [t[s] for s in after[0]]])
        for name, sv in saving.items():
            pred[name].append(on_median(tp, [sv[s] for s in block]))
    truth = local_saving(blocks)
    assert truth is not None, f"{row['launch_id']}: no slowed block has clean blocks on both sides"
    return truth, {name: float(np.median(v)) for name, v in pred.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="corrections_heldout.py --per-step results")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = [r for f in a.results for r in json.loads(Path(f).read_text())["rows"]]
    missing = [r["launch_id"] for r in rows if "per_step" not in r]
    if missing:
        raise SystemExit(f"{len(missing)} rows have no per-step savings (score them with corrections_heldout.py --per-step): {missing[:3]}")
    out: dict = {"n": len(rows)}
    loc = [local(r) for r in rows]
    pooled = np.array([r["measured_us"] for r in rows])
    lt = np.array([x[0] for x in loc])
    rel = np.abs(lt - pooled) / np.maximum(np.abs(pooled), 1.0)
    out["estimates_apart"] = {"median": float(np.median(rel)), "over_10pct": int((rel > 0.1).sum()), "over_25pct": int((rel > 0.25).sum())}
    print(
        f"{len(rows)} conditions; the two estimates of the truth differ by {100 * np.median(rel):.1f}% (median), "
        f"{(rel > 0.1).sum()} by more than 10%, {(rel > 0.25).sum()} by more than 25%"
    )
    for name in ("replay", "corrected"):
        for truth, label, pred in (
            ("pooled", pooled, np.array([r[f"{name}_us"] for r in rows])),
            ("local", lt, np.array([x[1][name] for x in loc])),
        ):
            s = scores(pred, label)
            out[f"{name}_{truth}"] = s
            print(
                f"  {name:9s} against the {truth:6s} truth: MAPE {100 * s['mape']:5.1f}% [{100 * s['mape_ci90'][0]:.1f}, "
                f"{100 * s['mape_ci90'][1]:.1f}], median APE {100 * s['median_ape']:.1f}%, sign {100 * s['sign']:.0f}%, tau {s['kendall_tau']:.3f}"
            )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

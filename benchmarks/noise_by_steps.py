"""How the clean-vs-clean difference of a paired recording falls with the steps per group.

Issue 14's noise floor: the two interleaved clean groups of a paired condition (7 steps each in
``generate --paired``'s default) differ by about 5% on this 2-core machine. This script reads the
clean steps a paired recording already has (every launch's clean blocks, in recorded order),
splits them into two interleaved groups of n steps — consecutive pairs of steps alternating
between the groups, as the recorder interleaves its blocks — for growing n, and reports
|median(A) - median(B)| / median(A), the median over launches and over the disjoint windows of
4n steps each launch holds. A 1/sqrt(n) fit then says how many steps per group a target needs.

With ``--score``, each condition's measured saving is also set against the replay's prediction
(removing the injected ranges) and the truth against itself (the saving measured against the
clean group before alone vs after alone): with more steps per group, how close the replay gets.

    python benchmarks/noise_by_steps.py data/paired2 [--score] [--json out.json]

The longer recording of docs/eval-reruns.md (one launch: tiny DDP, 10 ms, 33 slowed blocks per
condition instead of 6; 2 min 40 s):

    bottleneck-oracle generate --paired --config benchmarks/paired_long.yaml --out data/paired_long --repeats 33 --no-knobs
    python benchmarks/noise_by_steps.py data/paired_long --score
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

import numpy as np

from bottleneck_oracle.api import build
from bottleneck_oracle_lab.training.reruns import evaluate_launch, read_paired


def clean_times(rows: list[dict], graphs) -> list[float]:
    """The step time (µs, the slowest rank's) of each clean step of a launch, in step order."""
    t = {g.step: max(g.measured.values()) for g in graphs}
    return [t[s] for s in sorted({s for r in rows for s in r["clean_steps"]}) if s in t]


def differences(times: list[float], n: int) -> list[float]:
    """Clean vs clean of two interleaved groups of n steps, in each disjoint window of 2n steps."""
    out = []
    for w in range(len(times) // (2 * n)):
        win = times[w * 2 * n : (w + 1) * 2 * n]
        a = [x for i, x in enumerate(win) if (i // 2) % 2 == 0]
        b = [x for i, x in enumerate(win) if (i // 2) % 2 == 1]
        out.append(abs(float(np.median(a)) - float(np.median(b))) / float(np.median(a)))
    return out


def score(lid: str, rows: list[dict], table, graphs) -> list[dict]:
    """Per condition of a launch: measured saving with its bootstrap standard error, the replay's
    prediction and its APE, and the re-measurement's APE (before-group saving against the after-group one)."""
    c = evaluate_launch(rows, table, graphs, with_model_inputs=False)
    per = []
    for i, r in enumerate(c.rows):
        m = float(c.measured[i])
        ape = abs(float(c.replay[i]) - m) / max(abs(m), 1.0)
        re_ape = abs(float(c.remeasured[i] - c.measured_after[i])) / max(abs(float(c.measured_after[i])), 1.0)
        per.append(
            {
                "launch_id": lid,
                "condition": r["condition"],
                "groups": [len(x) for x in r["clean_groups"]],
                "clean_vs_clean": r["clean_vs_clean"],
                "measured_us": m,
                "noise_us": float(c.noise[i]),
                "replay_us": float(c.replay[i]),
                "replay_ape": ape,
                "remeasure_ape": re_ape,
            }
        )
    return per


def summary(per: list[dict]) -> dict:
    """Print each condition's line and the APEs summarised; the summary."""
    for p in per:
        k = p["condition"]
        print(
            f"{p['launch_id']} {k['kind']:10s} rank {k['rank']}: measured {p['measured_us'] / 1e3:6.2f} ms (se {p['noise_us'] / 1e3:.2f}), "
            f"replay {p['replay_us'] / 1e3:6.2f} ms ({100 * p['replay_ape']:.0f}%), clean vs clean {100 * p['clean_vs_clean']:.1f}%"
        )
    ape = np.array([p["replay_ape"] for p in per])
    out = {
        "conditions": len(per),
        "replay_mape": float(np.mean(ape)),
        "replay_median_ape": float(np.median(ape)),
        "replay_within_25pct": float(np.mean(ape <= 0.25)),
        "remeasure_mape": float(np.mean([p["remeasure_ape"] for p in per])),
        "median_clean_vs_clean": float(np.median([p["clean_vs_clean"] for p in per])),
    }
    print(
        f"replay: MAPE {100 * out['replay_mape']:.1f}%, median APE {100 * out['replay_median_ape']:.1f}%, within 25% "
        f"{100 * out['replay_within_25pct']:.0f}% of {len(per)}; the truth against itself: MAPE {100 * out['remeasure_mape']:.1f}%; "
        f"clean vs clean {100 * out['median_clean_vs_clean']:.1f}% (median)"
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paired", help="folder written by generate --paired")
    ap.add_argument("--score", action="store_true", help="also score the replay against each condition's measured saving")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    by: dict[str, list[dict]] = defaultdict(list)
    for r in read_paired(a.paired):
        by[r["launch_id"]].append(r)
    clean, scored = {}, []
    for lid, rs in sorted(by.items()):  # each launch built once, for both
        table, graphs = build(rs[0]["path"])
        clean[lid] = clean_times(rs, graphs)
        if a.score:
            scored += score(lid, rs, table, graphs)
    fewest = min(len(v) for v in clean.values())
    rows = []
    for n in (2, 4, 7, 14, 28, 56):
        if 2 * n > fewest:
            break
        d = [x for v in clean.values() for x in differences(v, n)]
        rows.append({"steps_per_group": n, "windows": len(d), "median_clean_vs_clean": float(np.median(d))})
        print(f"{n:3d} steps per group: clean vs clean {100 * rows[-1]['median_clean_vs_clean']:.1f}% (median of {len(d)} windows)")
    # fit c / sqrt(n) through the measured points (least squares on the log)
    ns = np.array([r["steps_per_group"] for r in rows], dtype=float)
    ds = np.array([r["median_clean_vs_clean"] for r in rows])
    c = float(np.exp(np.mean(np.log(ds) + 0.5 * np.log(ns))))
    need = {f"{p:g}%": math.ceil((c / (p / 100)) ** 2) for p in (5, 2, 1)}
    slope = float(np.polyfit(np.log(ns), np.log(ds), 1)[0])
    print(f"fit: {100 * c:.1f}% / sqrt(n) (measured slope of log difference on log n: {slope:.2f}; 1/sqrt(n) is -0.5)")
    print("steps per group for a clean-vs-clean of " + ", ".join(f"{k}: {v}" for k, v in need.items()))
    print(f"clean steps per launch: {fewest} to {max(len(v) for v in clean.values())}, {len(clean)} launches")
    out = {"rows": rows, "fit_c": c, "slope": slope, "steps_needed": need, "launches": len(clean)}
    if a.score:
        out["scores"] = {"summary": summary(scored), "conditions": scored}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

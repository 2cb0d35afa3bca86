"""Has the graph network earned its place in the user's output? Its corrected replay against the
simplest explanations of its gain, on the 112 held-out slowdowns re-run on this machine.

The rows are those of ``heldout_final_results.json`` (the two ``*_final_results.json`` files:
each slowdown's measured saving, the replay's, the corrected replay's and its 90% interval
half-width). Beside the corrected replay:

- the replay plus a constant, and the replay times a constant, each fitted on the other launches
  (leave-one-launch-out: the constant never sees the launch it predicts);
- the replay with the corrected replay's own interval half-width (does the interval cover because
  of what it is centred on, or because of its width?).

A paired Wilcoxon signed-rank test on the conditions' absolute percentage errors says whether the
corrected replay beats each baseline (one-sided, p < 0.05 to count). Held out here means recorded
later than the corrections' training recording with the same condition definitions: not held
out by condition, model size or layout.

    python benchmarks/model_earned.py [--json benchmarks/model_earned_results.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy.stats import wilcoxon

HERE = Path(__file__).resolve().parent
FILES = ("corrections_heldout_dp31_final_results.json", "corrections_heldout_pp50_final_results.json")


def rows() -> list[dict]:
    out = []
    for f in FILES:
        out += json.loads((HERE / f).read_text())["rows"]
    return out


def _ape(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    return np.abs(pred - truth) / np.maximum(np.abs(truth), 1.0)


def _loo(launch: np.ndarray, fit) -> np.ndarray:
    """Per row, the prediction of a model fitted on every other launch's rows."""
    out = np.empty(len(launch))
    for lid in np.unique(launch):
        test = launch == lid
        out[test] = fit(~test, test)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    a = p.parse_args()
    rs = rows()
    truth = np.array([r["measured_us"] for r in rs])
    replay = np.array([r["replay_us"] for r in rs])
    corrected = np.array([r["corrected_us"] for r in rs])
    half = np.array([r["half_us"] for r in rs])
    launch = np.array([r["launch_id"] for r in rs])
    plus = _loo(launch, lambda tr, te: replay[te] + float(np.median(truth[tr] - replay[tr])))
    times = _loo(launch, lambda tr, te: replay[te] * float(np.median(truth[tr] / np.maximum(replay[tr], 1.0))))
    preds = {
        "corrected replay": corrected,
        "replay": replay,
        "replay + constant (other launches)": plus,
        "replay x constant (other launches)": times,
    }
    ape = {k: _ape(v, truth) for k, v in preds.items()}
    table = {k: {"mape": float(v.mean()), "median_ape": float(np.median(v))} for k, v in ape.items()}
    tests = {}
    for base in ("replay", "replay + constant (other launches)", "replay x constant (other launches)"):
        stat = wilcoxon(ape["corrected replay"], ape[base], alternative="less")
        tests[base] = {"p_corrected_better": float(stat.pvalue), "corrected_wins": int((ape["corrected replay"] < ape[base]).sum())}
    coverage = {
        "corrected replay ± its half-width": float((np.abs(corrected - truth) <= half).mean()),
        "replay ± the same half-width": float((np.abs(replay - truth) <= half).mean()),
    }
    earned = any(t["p_corrected_better"] < 0.05 for k, t in tests.items() if k != "replay")
    doc = {
        "n": len(rs),
        "launches": int(len(np.unique(launch))),
        "scores": table,
        "paired_tests": tests,
        "coverage": coverage,
        "earned": earned,
        "held_out": "recorded later, same condition definitions (not by condition, size or layout)",
    }
    for k, v in table.items():
        print(f"{k:38s} MAPE {100 * v['mape']:5.1f}%  median APE {100 * v['median_ape']:5.1f}%")
    for k, t in tests.items():
        print(f"corrected better than {k}: p = {t['p_corrected_better']:.3f} (wins {t['corrected_wins']} of {len(rs)})")
    for k, v in coverage.items():
        print(f"{k}: covers {100 * v:.0f}%")
    print("earned its place:", earned)
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

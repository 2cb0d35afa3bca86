"""Knob changes against re-runs: what ``whatif --set`` predicts a configuration change does to
the step time, against the step time measured at the changed configuration.

The re-runs are ``benchmarks/record_knobs.py``'s: per change, launches alternating between the
base and the changed setting (ranks pinned to cores), each launch's first profiled step
dropped; ``knobs.jsonl`` holds each change's medians and its noise floor (the base launches'
two alternating groups' difference, clean vs clean).

Predictors, each from the base launches' traces only (the median over their steps after the first):

- ``set``: ``whatif --set KNOB=OLD:NEW`` (analysis/knobs.py): the graph edited to the new
  configuration and replayed. No parameter of it is fitted on any re-run.
- ``unchanged``: the base step (the change does nothing).
- ``proportional``: the whole step scaled by the work ratio (batch and sequence length new/old,
  accumulation new/old, checkpointing 4/3: a forward is about a third of a step's compute;
  bucket size and micro-batch count at the same global batch: unchanged).

Scores over the changes: the step time's absolute percentage error against the changed
launches' median (MAPE); the sign of the predicted change against the measured one; Kendall's
tau between predicted and measured relative changes; per knob kind; a paired Wilcoxon test of
``set``'s absolute errors against each baseline's.

    python benchmarks/knobs.py data/knobs --json benchmarks/knobs_results.json   # then: make figures
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
from scipy import stats

from bottleneck_oracle import api
from bottleneck_oracle.errors import OracleWarning

PREDICTORS = ("set", "unchanged", "proportional")


def spec(row: dict) -> str:
    """The ``whatif --set`` text of a recorded change."""
    k, a, b = row["knob"], row["base"], row["changed"]
    if k == "checkpoint":
        return "checkpoint=on" if b else "checkpoint=off"
    if k in ("microbatches", "accum"):
        return f"{k}={int(a)}:{int(b)}"
    return f"{k}={a:g}:{b:g}"


def work_ratio(row: dict) -> float:
    k, r = row["knob"], row["changed"] / row["base"] if row["base"] else 1.0
    if k in ("batch", "seq", "accum"):
        return r
    if k == "checkpoint":
        return 4 / 3 if row["changed"] else 3 / 4
    return 1.0


def predict(row: dict, folder: Path) -> dict:
    """Predicted step time (µs) after the change by each predictor, from the base launches."""
    after, before = [], []
    for name in row["base_paths"]:
        res = api.whatif(folder / row["launch_id"] / name, [], knobs=[spec(row)])[1:]
        after += [r.replay.step_us for r in res]
        before += [r.measured_us for r in res]
    base = float(np.median(before))
    return {"base_trace_us": base, "set": float(np.median(after)), "unchanged": base, "proportional": base * work_ratio(row)}


def score(rows: list[dict], who: str) -> dict:
    pred = np.array([r["predicted"][who] for r in rows])
    meas = np.array([r["changed_us"] for r in rows])
    base = np.array([r["predicted"]["base_trace_us"] for r in rows])
    ape = np.abs(pred - meas) / meas
    d_pred, d_meas = (pred - base) / base, (meas - base) / base
    sign = np.sign(np.round(d_pred, 6)) == np.sign(d_meas)
    tau = stats.kendalltau(d_pred, d_meas).statistic if len(rows) > 2 and np.ptp(d_pred) > 0 else float("nan")
    return {
        "n": len(rows),
        "mape": float(ape.mean()),
        "median_ape": float(np.median(ape)),
        "sign": float(sign.mean()),
        "kendall_tau": float(tau),
    }


def _quantiles(ratios: np.ndarray) -> tuple[float, float]:
    """The 5th and 95th percentiles of measured / predicted."""
    return float(np.quantile(ratios, 0.05)), float(np.quantile(ratios, 0.95))


def loo_interval(rows: list[dict]) -> dict:
    """A 90% interval for ``--set``'s step time: predicted x [q05, q95] of measured / predicted over
    the other changes (leave one change out), its coverage, and the coverage of an interval of the
    same widths around the base step (the "unchanged" baseline)."""
    ratio = np.array([r["changed_us"] / r["predicted"]["set"] for r in rows])
    inside, base_inside = [], []
    for i, r in enumerate(rows):
        lo, hi = _quantiles(np.delete(ratio, i))
        p, base, m = r["predicted"]["set"], r["predicted"]["base_trace_us"], r["changed_us"]
        inside.append(p * lo <= m <= p * hi)
        base_inside.append(base - p * (1 - lo) <= m <= base + p * (hi - 1))
    lo, hi = _quantiles(ratio)
    return {
        "coverage": float(np.mean(inside)),
        "baseline_coverage": float(np.mean(base_inside)),
        "shipped": {
            "what": "90% interval of whatif --set: the predicted step time times [low, high], the 5th and 95th percentiles "
            "of measured / predicted over recorded knob changes (benchmarks/knobs.py)",
            "low": lo,
            "high": hi,
            "changes": len(rows),
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("knobs", help="folder written by benchmarks/record_knobs.py (with knobs.jsonl)")
    ap.add_argument("--json", default=None, help="write the rows, their predictions and the scores here")
    ap.add_argument(
        "--write-interval",
        default=None,
        help="write the interval's quantiles (all changes) here: src/bottleneck_oracle/analysis/knob_errors.json is what whatif --set reads",
    )
    a = ap.parse_args()
    folder = Path(a.knobs)
    manifest = folder / "knobs.jsonl"
    if not manifest.exists():
        print(f"error: {manifest}: no knob changes recorded (benchmarks/record_knobs.py)", file=sys.stderr)
        return 2
    rows = [json.loads(x) for x in manifest.read_text().splitlines() if x.strip()]
    warnings.simplefilter("ignore", OracleWarning)
    for i, r in enumerate(rows):
        r["predicted"] = predict(r, folder)
        print(f"[{i + 1}/{len(rows)}] {r['launch_id']}", file=sys.stderr, flush=True)
    kinds = sorted({r["knob"] for r in rows})
    scores = {w: score(rows, w) for w in PREDICTORS}
    by_kind = {k: {w: score([r for r in rows if r["knob"] == k], w) for w in PREDICTORS} for k in kinds}
    by_size = {s: score([r for r in rows if r["size"] == s], "set") for s in sorted({r["size"] for r in rows})}
    by_layout = {s: score([r for r in rows if r["layout"] == s], "set") for s in sorted({r["layout"] for r in rows})}
    err = {w: np.array([abs(r["predicted"][w] - r["changed_us"]) / r["changed_us"] for r in rows]) for w in PREDICTORS}
    paired = {w: float(stats.wilcoxon(err["set"], err[w], alternative="less").pvalue) for w in PREDICTORS if w != "set"}
    quiet = [r for r in rows if r["clean_vs_clean"] <= r["bound"]]
    interval = loo_interval(rows)
    result = {
        "rows": rows,
        "scores": scores,
        "by_kind": by_kind,
        "by_size": by_size,
        "by_layout": by_layout,
        "paired_wilcoxon_p": paired,
        "quiet": {"n": len(quiet), **{w: score(quiet, w) for w in PREDICTORS}} if len(quiet) > 2 else None,
        "interval": interval,
        "noise": {
            "median_clean_vs_clean": float(np.median([r["clean_vs_clean"] for r in rows])),
            "above_bound": len(rows) - len(quiet),
        },
    }
    for k, sc in list(by_kind.items()) + [("all", scores)]:
        st = sc["set"]
        print(
            f"{k:13s} n={st['n']:2d}  --set MAPE {100 * st['mape']:5.1f}%  sign {100 * st['sign']:3.0f}%  tau {st['kendall_tau']:5.2f}  "
            f"| unchanged {100 * sc['unchanged']['mape']:5.1f}%  proportional {100 * sc['proportional']['mape']:5.1f}%"
        )
    print(f"paired Wilcoxon p: {paired}; noise: {result['noise']}")
    print(
        f"90% interval, leave one change out: covers {100 * interval['coverage']:.0f}%; the same widths around the base step: "
        f"{100 * interval['baseline_coverage']:.0f}%"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    if a.write_interval:
        Path(a.write_interval).write_text(json.dumps(interval["shipped"], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Knob changes against re-runs: what ``whatif --set`` predicts a configuration change does to
the step time, against the step time measured at the changed configuration.

The re-runs are ``benchmarks/record_knobs.py``'s: per change, launches alternating between the
base and the changed setting (ranks pinned to cores), each launch's first profiled step
dropped; ``knobs.jsonl`` holds each change's medians and its noise floor (the base launches'
two alternating groups' difference, clean vs clean).

Predictors, each from the base launches' traces only (the median over their steps after the first):

- ``set``: ``whatif --set KNOB=OLD:NEW`` (analysis/knobs.py): the graph edited to the new
  configuration and replayed. One number of it is fitted on re-runs: the fixed part of a CPU op
  (``FIXED_FACTOR`` x the trace's metadata-op median), chosen from a grid; scored as shipped,
  with the factor chosen on the other model size, on the other layout, and with no fit (1).
- ``unchanged``: the base step (the change does nothing).
- ``proportional``: the whole step scaled by the work ratio (batch and sequence length new/old,
  accumulation new/old, checkpointing 4/3: a forward is about a third of a step's compute;
  bucket size and micro-batch count at the same global batch: unchanged).

Scores over the changes: the step time's absolute percentage error against the changed
launches' median (MAPE); the sign of the predicted change against the measured one; Kendall's
tau between predicted and measured relative changes; per knob kind; a paired Wilcoxon test of
the held-out ``set``'s (factor from the other size) absolute errors against each baseline's.

    python benchmarks/knobs.py data/knobs --json benchmarks/knobs_results.json   # then: make figures

Several folders pool their changes (the interval ``whatif --set`` ships is written from all the
recordings: ``--write-interval src/bottleneck_oracle/analysis/knob_errors.json``).
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
from bottleneck_oracle.analysis import knobs as knob_model
from bottleneck_oracle.errors import OracleWarning

PREDICTORS = (
    "set",
    "set, factor from the other size",
    "set, factor from the other layout",
    "set, no fit (factor 1)",
    "unchanged",
    "proportional",
)
FACTORS = (1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0)
"""The grid the fixed-part factor (``analysis.knobs.FIXED_FACTOR``) is chosen from."""


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


def predict(row: dict, folder: Path, factor: float) -> tuple[float, float]:
    """(base step, predicted step after the change) in µs, from the base launches, the fixed part's factor ``factor``."""
    after, before = [], []
    knob_model.FIXED_FACTOR = factor
    for name in row["base_paths"]:
        res = api.whatif(folder / row["launch_id"] / name, [], knobs=[spec(row)])[1:]
        after += [r.replay.step_us for r in res]
        before += [r.measured_us for r in res]
    return float(np.median(before)), float(np.median(after))


def _mape(rows: list[dict], factor: float) -> float:
    return float(np.mean([abs(r["by_factor"][str(factor)] - r["changed_us"]) / r["changed_us"] for r in rows]))


def chosen(rows: list[dict]) -> float:
    """The factor of the grid with the lowest MAPE on ``rows`` (the smaller on a tie)."""
    return min(FACTORS, key=lambda f: (round(_mape(rows, f), 6), f))


def cross_fit(rows: list[dict], key: str, shipped: float) -> dict[str, float]:
    """Per value of ``key`` (size, layout): the factor chosen on the rows with the other values
    (the shipped one where there are no others: a recording of one layout)."""
    out = {}
    for v in sorted({r[key] for r in rows}):
        others = [r for r in rows if r[key] != v]
        out[v] = chosen(others) if others else shipped
    return out


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


def tau_ceiling(rows: list[dict], draws: int = 2000, seed: int = 0) -> float:
    """Kendall's tau of the measured relative changes against themselves measured again: each
    change's relative change redrawn with its own clean-vs-clean noise (normal, that relative
    standard deviation), the median tau over draws: what a perfect predictor could expect."""
    rng = np.random.default_rng(seed)
    base = np.array([r["base_trace_us"] for r in rows])
    d = (np.array([r["changed_us"] for r in rows]) - base) / base
    sd = np.array([r["clean_vs_clean"] for r in rows])
    return float(np.median([stats.kendalltau(d, d + rng.normal(0.0, sd)).statistic for _ in range(draws)]))


def loo_interval(rows: list[dict]) -> dict:
    """A 90% interval for ``--set``'s step time (the shipped factor): predicted x [q05, q95] of
    measured / predicted over the other changes (leave one change out), its coverage, and the
    coverage of an interval of the same widths around the base step (the "unchanged" baseline);
    where several recordings are pooled, each one's coverage by the interval of the others."""
    ratio = np.array([r["changed_us"] / r["predicted"]["set"] for r in rows])
    inside, base_inside = [], []
    for i, r in enumerate(rows):
        lo, hi = _quantiles(np.delete(ratio, i))
        p, base, m = r["predicted"]["set"], r["predicted"]["base_trace_us"], r["changed_us"]
        inside.append(p * lo <= m <= p * hi)
        base_inside.append(base - p * (1 - lo) <= m <= base + p * (hi - 1))
    # held out by recording: each recording's changes against the interval of the others' (pooled recordings only)
    recording = np.array([r.get("recording", "") for r in rows])
    by_recording = {}
    for rec in sorted(set(recording)) if len(set(recording)) > 1 else []:
        lo, hi = _quantiles(ratio[recording != rec])
        mine = ratio[recording == rec]
        by_recording[rec] = {"n": len(mine), "low": lo, "high": hi, "coverage": float(np.mean((mine >= lo) & (mine <= hi)))}
    lo, hi = _quantiles(ratio)
    return {
        "coverage": float(np.mean(inside)),
        "baseline_coverage": float(np.mean(base_inside)),
        "held_out_by_recording": by_recording,
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
    ap.add_argument(
        "knobs", nargs="+", help="folder written by benchmarks/record_knobs.py (with knobs.jsonl); several: their changes pooled"
    )
    ap.add_argument("--json", default=None, help="write the rows, their predictions and the scores here")
    ap.add_argument(
        "--write-interval",
        default=None,
        help="write the interval's quantiles (all changes) here: src/bottleneck_oracle/analysis/knob_errors.json is what whatif --set reads",
    )
    a = ap.parse_args()
    rows = []
    for folder in map(Path, a.knobs):
        manifest = folder / "knobs.jsonl"
        if not manifest.exists():
            print(f"error: {manifest}: no knob changes recorded (benchmarks/record_knobs.py)", file=sys.stderr)
            return 2
        rows += [{**json.loads(x), "recording": str(folder)} for x in manifest.read_text().splitlines() if x.strip()]
    warnings.simplefilter("ignore", OracleWarning)
    shipped = knob_model.FIXED_FACTOR
    for i, r in enumerate(rows):
        r["by_factor"] = {}
        for f in FACTORS:
            base, r["by_factor"][str(f)] = predict(r, Path(r["recording"]), f)
        r["base_trace_us"] = base
        print(f"[{i + 1}/{len(rows)}] {r['launch_id']}", file=sys.stderr, flush=True)
    knob_model.FIXED_FACTOR = shipped
    best = chosen(rows)
    by_size, by_layout = cross_fit(rows, "size", shipped), cross_fit(rows, "layout", shipped)
    for r in rows:
        b = r["base_trace_us"]
        r["predicted"] = {
            "base_trace_us": b,
            "set": r["by_factor"][str(shipped)],
            "set, factor from the other size": r["by_factor"][str(by_size[r["size"]])],
            "set, factor from the other layout": r["by_factor"][str(by_layout[r["layout"]])],
            "set, no fit (factor 1)": r["by_factor"]["1.0"],
            "unchanged": b,
            "proportional": b * work_ratio(r),
        }
    kinds = sorted({r["knob"] for r in rows})
    scores = {w: score(rows, w) for w in PREDICTORS}
    by_kind = {k: {w: score([r for r in rows if r["knob"] == k], w) for w in PREDICTORS} for k in kinds}
    per_size = {s: score([r for r in rows if r["size"] == s], "set") for s in sorted({r["size"] for r in rows})}
    per_layout = {s: score([r for r in rows if r["layout"] == s], "set") for s in sorted({r["layout"] for r in rows})}
    err = {w: np.array([abs(r["predicted"][w] - r["changed_us"]) / r["changed_us"] for r in rows]) for w in PREDICTORS}
    held = "set, factor from the other size"
    paired = {w: float(stats.wilcoxon(err[held], err[w], alternative="less").pvalue) for w in ("unchanged", "proportional")}
    quiet = [r for r in rows if r["clean_vs_clean"] <= r["bound"]]
    interval = loo_interval(rows)
    result = {
        "rows": rows,
        "scores": scores,
        "by_kind": by_kind,
        "by_size": per_size,
        "by_layout": per_layout,
        "factor": {
            "shipped": shipped,
            "best_on_all": best,
            "chosen_on_other_size": by_size,
            "chosen_on_other_layout": by_layout,
            "grid": FACTORS,
        },
        "paired_wilcoxon_p": paired,
        "quiet": {"n": len(quiet), **{w: score(quiet, w) for w in PREDICTORS}} if len(quiet) > 2 else None,
        "interval": interval,
        "kendall_tau_noise_ceiling": tau_ceiling(rows),
        "noise": {
            "median_clean_vs_clean": float(np.median([r["clean_vs_clean"] for r in rows])),
            "above_bound": len(rows) - len(quiet),
        },
    }
    for k, sc in list(by_kind.items()) + [("all", scores)]:
        print(
            f"{k:13s} n={sc['set']['n']:2d}  "
            + "  ".join(f"{w}: {100 * sc[w]['mape']:5.1f}% tau {sc[w]['kendall_tau']:.2f}" for w in PREDICTORS)
        )
    print(f"paired Wilcoxon p: {paired}; noise: {result['noise']}; tau ceiling from the noise: {result['kendall_tau_noise_ceiling']:.2f}")
    print(
        f"fixed-part factor: shipped {shipped:g}, best on all {best:g}, chosen on the other size {by_size}, on the other layout {by_layout}"
    )
    if best != shipped and a.write_interval:  # the run that fits: the shipped factor should be its best
        print(f"note: the grid's best factor ({best:g}) is not the shipped one ({shipped:g}): set FIXED_FACTOR in analysis/knobs.py")
    print(
        f"90% interval, leave one change out: covers {100 * interval['coverage']:.0f}%; the same widths around the base step: "
        f"{100 * interval['baseline_coverage']:.0f}%"
    )
    for rec, c in interval["held_out_by_recording"].items():
        print(f"  {rec}: {c['n']} changes, the others' interval [{c['low']:.3f}, {c['high']:.3f}] covers {100 * c['coverage']:.0f}%")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    if a.write_interval:
        Path(a.write_interval).write_text(json.dumps(interval["shipped"], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

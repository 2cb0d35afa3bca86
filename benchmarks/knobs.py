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

    python benchmarks/knobs.py data/knobs [--json benchmarks/knobs_results.json] [--markdown docs/figures/knobs.md]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("knobs", help="folder written by benchmarks/record_knobs.py (with knobs.jsonl)")
    ap.add_argument("--json", default=None, help="write the rows, their predictions and the scores here")
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
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
    result = {
        "rows": rows,
        "scores": scores,
        "by_kind": by_kind,
        "by_size": by_size,
        "by_layout": by_layout,
        "paired_wilcoxon_p": paired,
        "quiet": {"n": len(quiet), **{w: score(quiet, w) for w in PREDICTORS}} if len(quiet) > 2 else None,
        "noise": {
            "median_clean_vs_clean": float(np.median([r["clean_vs_clean"] for r in rows])),
            "above_bound": len(rows) - len(quiet),
        },
    }
    lines = table(result)
    print("\n".join(lines))
    if a.markdown:
        Path(a.markdown).write_text("\n".join(lines) + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def table(result: dict) -> list[str]:
    """The markdown: every change, then the scores per knob and over all."""
    rows = result["rows"]
    out = [
        "| size | layout | knob | from → to | base ms | measured ms | clean vs clean | `--set` ms | error | proportional ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["predicted"]
        out.append(
            f"| {r['size']} | {r['layout']} | {r['knob']} | {r['base']:g} → {r['changed']:g} | {p['base_trace_us'] / 1000:.2f} | "
            f"{r['changed_us'] / 1000:.2f} | {100 * r['clean_vs_clean']:.1f}% | {p['set'] / 1000:.2f} | "
            f"{100 * (p['set'] - r['changed_us']) / r['changed_us']:+.1f}% | {p['proportional'] / 1000:.2f} |"
        )
    out += [
        "",
        "| knob | changes | `--set` MAPE | sign | Kendall τ | unchanged MAPE | proportional MAPE |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, s in list(result["by_kind"].items()) + [("all", result["scores"])]:
        st = s["set"] if k != "all" else s["set"]
        out.append(
            f"| {k} | {st['n']} | {100 * st['mape']:.1f}% | {100 * st['sign']:.0f}% | {st['kendall_tau']:.2f} | "
            f"{100 * s['unchanged']['mape']:.1f}% | {100 * s['proportional']['mape']:.1f}% |"
        )
    p = result["paired_wilcoxon_p"]
    q = result["quiet"]
    out += [
        "",
        f"- paired Wilcoxon (one-sided, `--set`'s absolute error smaller): against unchanged p = {p['unchanged']:.2g}, "
        f"against proportional p = {p['proportional']:.2g}",
        "- by size: " + ", ".join(f"{k} MAPE {100 * v['mape']:.1f}% (n={v['n']})" for k, v in result["by_size"].items()),
        "- by layout: " + ", ".join(f"{k} MAPE {100 * v['mape']:.1f}% (n={v['n']})" for k, v in result["by_layout"].items()),
        f"- noise floor: the base launches' clean-vs-clean difference, median {100 * result['noise']['median_clean_vs_clean']:.1f}%; "
        f"{result['noise']['above_bound']} changes above the 5% bound after a re-recording",
    ]
    if q:
        out.append(
            f"- the {q['n']} changes within the bound: `--set` MAPE {100 * q['set']['mape']:.1f}%, sign {100 * q['set']['sign']:.0f}%, "
            f"Kendall τ {q['set']['kendall_tau']:.2f}"
        )
    return out


if __name__ == "__main__":
    raise SystemExit(main())

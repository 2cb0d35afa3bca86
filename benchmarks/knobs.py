"""Knob changes against re-runs: what the oracle predicts a real knob change does to the step
time, against the measured change of alternating launches (``generate --paired`` writes
``knobs.jsonl``: batch size, DDP bucket size, pipeline micro-batches at the same global batch).

Predictors, each from the base launches' traces only (median over their steps after the first):

- replay: batch size k -> k': the forward and backward passes' CPU ops scaled by k'/k with their
  regions' own time (``whatif --edit phase=forward,cat=cpu_op,scale=r --edit
  phase=backward,cat=cpu_op,scale=r``, the upper end of ``whatif --batch r``), the
  collectives, the optimizer and the untraced time as they were; micro-batches m -> m': the 1F1B
  formula (``whatif --microbatches``; the replay cannot restructure a graph); bucket size: no
  edit expresses it, so no prediction (the row says so);
- proportional: the whole step scaled by k'/k (batch), unchanged otherwise;
- the batch range (``whatif --batch``): the ops alone scaled, and with their regions' own time;
  scored by whether the changed launches' median step falls inside it.

Scores: the absolute error of the predicted change against the measured one, relative to the
measured change, with the measurement's own noise beside it (the base launches' two alternating
groups' difference, the clean-vs-clean figure).

    python benchmarks/knobs.py data/paired2 [--markdown docs/eval-knobs.md] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

from bottleneck_oracle import api
from bottleneck_oracle.errors import OracleWarning

LINES: list[str] = []


def emit(text: str) -> None:
    print(text)
    LINES.append(text)


def predict(row: dict, folder: Path) -> dict:
    """Predicted step time after the change (µs) by each predictor, from the base launches."""
    ratio = row["changed"] / row["base"]
    replay, before, lo, hi = [], [], [], []
    for name in row["base_paths"]:
        path = folder / row["launch_id"] / name
        if row["knob"] == "batch":  # whatif --batch: the ops alone, and with their own time (= the replay of the phase edits)
            res = api.whatif(path, [], use_model=False, batch=ratio)[1:]
            lo += [r.batch.ops_alone_step_us for r in res if r.batch is not None]
            hi += [r.batch.with_own_time_step_us for r in res if r.batch is not None]
            before += [r.measured_us for r in res]
        elif row["knob"] == "microbatches":
            res = api.whatif(path, [], use_model=False, microbatches=int(row["changed"]))[1:]
            replay += [r.microbatches.step_us for r in res if r.microbatches is not None]
            before += [r.measured_us for r in res]
        else:
            before += [s.measured for s in api.analyze(path)[1][1:]]
    replay = hi or replay  # a batch change's replay is the range's upper end
    base = float(np.median(before))
    bracket = sorted((float(np.median(lo)), float(np.median(hi)))) if lo else None
    return {
        "base_trace_us": base,
        "bracket_step_us": bracket,
        "replay": float(np.median(replay)) - base if replay else None,
        "proportional": base * (ratio - 1) if row["knob"] == "batch" else 0.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paired", help="folder written by generate --paired (with knobs.jsonl)")
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    ap.add_argument("--json", default=None, help="write every row with its predictions here")
    a = ap.parse_args()
    folder = Path(a.paired)
    manifest = folder / "knobs.jsonl"
    if not manifest.exists():
        print(f"error: {manifest}: no knob changes recorded (generate --paired --knobs)", file=sys.stderr)
        return 2
    rows = [json.loads(x) for x in manifest.read_text().splitlines() if x.strip()]
    warnings.simplefilter("ignore", OracleWarning)
    for r in rows:
        r["predicted"] = predict(r, folder)
    emit(
        f"**Knob changes against re-runs** ({len(rows)} changes, {sum(len(r['base_paths']) + len(r['changed_paths']) for r in rows)} launches)"
    )
    emit("")
    emit(
        "| size | layout | knob | from → to | base ms | measured Δ ms | noise (clean vs clean) | replay Δ ms | error | proportional Δ ms | error |"
    )
    emit("|---|---|---|---|---|---|---|---|---|---|---|")
    errs: dict[str, list[float]] = {"replay": [], "proportional": []}
    signs: dict[str, list[bool]] = {"replay": [], "proportional": []}
    for r in rows:
        m = r["measured_change_us"]
        cells = []
        for k in ("replay", "proportional"):
            p = r["predicted"][k]
            if p is None:
                cells += ["no edit expresses it", "—"]
                continue
            e = abs(p - m) / abs(m)
            errs[k].append(e)
            signs[k].append(np.sign(p) == np.sign(m))
            cells += [f"{p / 1000:+.2f}", f"{100 * e:.0f}%"]
        emit(
            f"| {r['size']} | {r['layout']} | {r['knob']} | {r['base']:g} → {r['changed']:g} | {r['base_us'] / 1000:.2f} | {m / 1000:+.2f} | "
            f"{100 * r['clean_vs_clean']:.1f}% ({r['clean_vs_clean'] * r['base_us'] / 1000:.2f} ms) | " + " | ".join(cells) + " |"
        )
    emit("")
    for k in errs:
        if errs[k]:
            emit(
                f"- {k}: MAPE {100 * np.mean(errs[k]):.0f}%, median APE {100 * np.median(errs[k]):.0f}%, "
                f"sign {100 * np.mean(signs[k]):.0f}% over {len(errs[k])} changes"
            )
    inside = [
        r["predicted"]["bracket_step_us"][0] <= r["changed_us"] <= r["predicted"]["bracket_step_us"][1]
        for r in rows
        if r["predicted"]["bracket_step_us"]
    ]
    if inside:
        emit(
            f"- whatif --batch (the ops alone to the ops with their own time): the changed launches' median step inside the range on "
            f"{sum(inside)} of {len(inside)} batch changes"
        )
    noise = [r["clean_vs_clean"] for r in rows]
    emit(f"- the base launches' clean-vs-clean difference: median {100 * np.median(noise):.1f}%")
    if a.markdown:
        Path(a.markdown).write_text("\n".join(LINES) + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

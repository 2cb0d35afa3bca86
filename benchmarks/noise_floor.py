"""The noise floor of our own recordings: how much the step time of an unchanged job moves.

Records the 2-rank gloo DDP job (no injection) several times, interleaving runs with and without
the low-noise protocol (each rank pinned to a core of its own, one thread, the warm-up step
discarded), and reports for each protocol:

- the spread of clean step times within a run: 1.4826 x MAD / median of its steps (robust
  relative spread), the median over runs;
- the clean-vs-clean difference of consecutive runs of the same protocol: |median(run k+1) -
  median(run k)| / median(run k), the median over pairs — the smallest effect a paired
  comparison of two runs can resolve on this machine.

    python benchmarks/noise_floor.py [--runs 4] [--steps 10] [--json out.json]

Run it on a quiet machine: anything else running is part of the noise it measures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import numpy as np

from bottleneck_oracle.graph_pipeline.events import load_events
from bottleneck_oracle_lab.systems.ddp import DDPRun, record
from bottleneck_oracle_lab.systems.generate import step_times


def clean_steps(folder) -> list[float]:
    """Step time (µs) of each profiled step after the first: the slowest rank's span."""
    per = step_times(load_events(folder))
    first = min(per)
    return [t for n, t in sorted(per.items()) if n != first]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="runs per protocol (interleaved)")
    ap.add_argument("--steps", type=int, default=10, help="profiled steps per run (the first is dropped too)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    runs: dict[str, list[list[float]]] = {"pinned": [], "unpinned": []}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(a.runs):
            for name in ("pinned", "unpinned"):
                folder = record(DDPRun(out=f"{tmp}/{name}-{k}", world=2, steps=a.steps, hidden=a.hidden, pin=name == "pinned"))
                runs[name].append(clean_steps(folder))
                m = float(np.median(runs[name][-1]))
                print(f"{name} run {k}: median step {m / 1000:.3f} ms over {len(runs[name][-1])} steps", file=sys.stderr)
    result: dict[str, object] = {"runs": a.runs, "steps": a.steps, "seconds": time.monotonic() - t0}
    for name, rs in runs.items():
        med = [float(np.median(r)) for r in rs]
        spread = [1.4826 * float(np.median(np.abs(np.array(r) - np.median(r)))) / float(np.median(r)) for r in rs]
        pair = [abs(med[k + 1] - med[k]) / med[k] for k in range(len(med) - 1)]
        result[name] = {
            "median_step_ms": [m / 1000 for m in med],
            "within_run_spread": spread,
            "median_within_run_spread": float(np.median(spread)),
            "clean_vs_clean": pair,
            "median_clean_vs_clean": float(np.median(pair)) if pair else None,
        }
        print(
            f"{name:9s} within-run spread (median over runs) {100 * float(np.median(spread)):.2f}%; "
            f"clean vs clean (median over consecutive pairs) {100 * float(np.median(pair)) if pair else float('nan'):.2f}%"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

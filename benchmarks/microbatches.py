"""The micro-batch what-if against re-runs: predict a pipeline step with m' micro-batches from a
trace recorded with m, by the 1F1B formula (`whatif --microbatches`), then record with m' and
compare. Same global batch: m x batch sequences per step in both runs.

    python benchmarks/microbatches.py [--size small] [--steps 6]
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

from bottleneck_oracle import api
from bottleneck_oracle.serial import to_json_object
from bottleneck_oracle_lab.systems.pipeline import PipelineRun, record


def median_step(path) -> float:
    return float(np.median([a.measured for a in api.analyze(path)[1][1:]]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    sequences = 8
    print(
        f"{'from':>4s} {'to':>4s} {'measured before':>16s} {'predicted after':>16s} {'measured after':>15s} {'pred Δ':>8s} {'meas Δ':>8s}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for m in (2, 4, 8):
            runs[m] = record(PipelineRun(out=f"{tmp}/m{m}", size=args.size, microbatches=m, batch=sequences // m, steps=args.steps))
        measured = {m: median_step(p) for m, p in runs.items()}
        for a, b in ((4, 8), (4, 2), (2, 8)):
            rows = [to_json_object(r) for r in api.whatif(runs[a], [], None, None, None, False, b)[1:]]
            pred = float(np.median([r["microbatches"]["step_us"] for r in rows]))
            print(
                f"{a:4d} {b:4d} {measured[a] / 1000:16.2f} {pred / 1000:16.2f} {measured[b] / 1000:15.2f} "
                f"{(pred - measured[a]) / 1000:8.2f} {(measured[b] - measured[a]) / 1000:8.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

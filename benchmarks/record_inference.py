"""Record a small inference loop on the CPU as a server runs one: each iteration schedules its
batch (a 2 ms wait standing for the scheduler) and runs the model under an annotation of its own
naming the batch (``execute_<batch>_iter_<i>``, as inference engines name theirs), without
``prof.step()``: the trace has no ProfilerStep markers. The trace behind
tests/data/own-cpu/inference_loop_nosteps.json.gz (tests/analysis/test_invariance.py: ``--steps-at``).

    python benchmarks/record_inference.py tests/data/own-cpu
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from record_compiled import export_gzipped

BATCHES = (8, 16, 4, 32, 8, 16, 4, 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).eval()
    with torch.no_grad():
        model(torch.randn(4, 256))  # (first-call setup outside the trace)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i, batch in enumerate(BATCHES):
                time.sleep(0.002)  # (the scheduler: Python the profiler does not see without with_stack)
                x = torch.randn(batch, 256)
                with record_function(f"execute_{batch}_iter_{i}"):
                    for _ in range(4):
                        x = model(x)
    export_gzipped(prof, a.out / "inference_loop_nosteps.json.gz")


if __name__ == "__main__":
    main()

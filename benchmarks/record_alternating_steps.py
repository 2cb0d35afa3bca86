"""Record a 2-rank gloo DDP job whose steps come in two kinds, as gradient accumulation profiled a
micro-batch a step makes them: even steps run a micro-batch under ``no_sync()`` (no all-reduce, no
optimizer step), odd steps one with the gradient all-reduce, then Adam and ``zero_grad``.
    python benchmarks/record_alternating_steps.py tests/data/own-cpu/alternating_steps_gloo
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import ddp_mlp, profiled_steps, record_gloo_job  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 12
PORT = 29550


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = ddp_mlp(512, 1024)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(i: int) -> None:
        sync = i % 2 == 1
        with contextlib.nullcontext() if sync else model.no_sync():
            model(torch.randn(32, 512)).square().mean().backward()
        if sync:
            opt.step()
            opt.zero_grad()

    return profiled_steps(step, ACTIVE, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, PORT)


if __name__ == "__main__":
    main()

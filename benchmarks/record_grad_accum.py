"""Record a 2-rank gloo DDP job with gradient accumulation, profiled per micro-batch.

Each of 16 profiled steps is one micro-batch (``prof.step()`` after each, as a loop that profiles
every batch does): forward and backward of a 512 -> 1024 -> 512 MLP with GELU under
``DistributedDataParallel``, batch 32. Gradients accumulate over ``ACCUMULATE`` micro-batches:
the first ``ACCUMULATE - 1`` run inside ``ddp.no_sync()`` (no all-reduce), the last all-reduces
the gradients and steps the optimizer (SGD) — profiled steps 3, 7, 11 and 15 (the 4th, 8th, 12th
and 16th iterations of the loop).

    python benchmarks/record_grad_accum.py tests/data/own-cpu/grad_accum_gloo
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import profiled_steps, record_gloo_job  # noqa: E402

STEPS = 16  # profiled steps (micro-batches)
WAIT, WARMUP = 1, 1
ACCUMULATE = 4  # micro-batches per optimizer step


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def step(i: int) -> None:
        x = torch.randn(32, 512, generator=torch.Generator().manual_seed(2 * i + rank))
        sync = (i + 1) % ACCUMULATE == 0
        with contextlib.nullcontext() if sync else ddp.no_sync():
            ddp(x).square().mean().backward()
        if sync:
            opt.step()
            opt.zero_grad()

    return profiled_steps(step, STEPS, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, 29571)


if __name__ == "__main__":
    main()

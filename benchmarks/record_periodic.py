"""Record a 2-rank gloo DDP job whose rank 0 evaluates the model every fourth step (a periodic stall).

Each of 12 profiled steps: forward, backward (DDP all-reduces the gradients), SGD step. Every
fourth iteration (profiled steps 4, 8 and 12, counting from 1) rank 0 then evaluates the model, as
a training script does every N steps: ``EVAL_BATCHES`` forward passes under ``torch.no_grad()``
inside ``record_function("evaluate")``, before ``prof.step()``. Rank 1 does not: it goes on to the
next step and waits for rank 0 at that step's gradient all-reduce. Nothing else differs between
the ranks.

    python benchmarks/record_periodic.py tests/data/own-cpu/periodic_eval
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import profiled_steps, record_gloo_job  # noqa: E402

STEPS = 12  # profiled steps
WAIT, WARMUP = 1, 1
EVERY = 4  # rank 0 evaluates after every EVERY-th step
EVAL_BATCHES = 12


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    held_out = torch.randn(256, 256)

    def step(i: int) -> None:
        x = torch.randn(32, 256)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (i - WAIT - WARMUP + 1) % EVERY == 0 and i >= WAIT + WARMUP:
            with record_function("evaluate"), torch.no_grad():
                for _ in range(EVAL_BATCHES):
                    model(held_out).sum().item()

    return profiled_steps(step, STEPS, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, 29533)


if __name__ == "__main__":
    main()

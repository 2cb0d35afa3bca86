"""Record a 2-rank gloo job that all-reduces its gradients by hand, asynchronously, and waits for them later.

Each of 8 profiled steps: a 1024 -> 2048 -> 1024 MLP with GELU (4.2 M parameters), batch 32,
forward and backward; then ``dist.all_reduce(p.grad, async_op=True)`` for each parameter (gloo runs
each as ``gloo:all_reduce`` on its threads), a small matmul while they run, ``work.wait()`` for
each (no op records the wait: the loop's thread has no event until the last one is done), and SGD.

    python benchmarks/record_async_allreduce.py tests/data/own-cpu/async_allreduce_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import profiled_steps, record_gloo_job  # noqa: E402

STEPS = 8  # profiled steps
WAIT, WARMUP = 1, 1


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 1024))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    a, b = torch.randn(128, 128), torch.randn(128, 128)

    def step(_: int) -> None:
        loss = model(torch.randn(32, 1024)).square().mean()
        opt.zero_grad()
        loss.backward()
        works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters() if p.grad is not None]
        a @ b  # (work of the loop's own while the all-reduces run)
        for work in works:
            work.wait()
        opt.step()

    return profiled_steps(step, STEPS, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, 29549)


if __name__ == "__main__":
    main()

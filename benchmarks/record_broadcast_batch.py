"""Record a 2-rank gloo DDP job whose rank 0 builds each batch (a Python loop of 128 sorted random
rows, then 8 ``tanh(x @ w)``) and ``dist.broadcast``s it to rank 1, which waits for it, before both
run the DDP forward, backward and SGD step: a job whose data comes from one rank.
    python benchmarks/record_broadcast_batch.py tests/data/own-cpu/broadcast_batch_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import ddp_mlp, profiled_steps, record_gloo_job, train_step  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 8
ROWS, WIDTH = 128, 512
PORT = 29549


def _prepare(g: torch.Generator) -> torch.Tensor:
    x = torch.stack([torch.sort(torch.rand(WIDTH, generator=g)).values * (i % 7) for i in range(ROWS)])
    w = torch.rand(WIDTH, WIDTH, generator=g) / WIDTH
    for _ in range(8):
        x = torch.tanh(x @ w)
    return x.contiguous()


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = ddp_mlp(WIDTH, 512)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)

    def step(i: int) -> None:
        x = _prepare(g) if rank == 0 else torch.empty(ROWS, WIDTH)
        dist.broadcast(x, src=0)
        train_step(model, opt, x)

    return profiled_steps(step, ACTIVE, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, PORT)


if __name__ == "__main__":
    main()

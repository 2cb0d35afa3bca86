"""Record a 2-rank gloo DDP job whose optimizer is ZeroRedundancyOptimizer(Adam) over parameters
that split unevenly: one 2048 x 2048 Linear (4.2 M parameters: one rank's shard) and a few small
layers (69 k: the other's). Each rank updates its shard and broadcasts it; the rank holding the
large one runs fewer, much larger Adam ops and the other waits for it.
    python benchmarks/record_zero_uneven.py tests/data/own-cpu/zero_uneven_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import profiled_steps, record_gloo_job, train_step  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 8
WIDTH = 2048
PORT = 29552


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(WIDTH, WIDTH),
            torch.nn.GELU(),
            torch.nn.Linear(WIDTH, 32),
            torch.nn.GELU(),
            torch.nn.Linear(32, 32),
            torch.nn.GELU(),
            torch.nn.Linear(32, 16),
        )
    )
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)

    def step(i: int) -> None:
        train_step(model, opt, torch.randn(32, WIDTH))

    return profiled_steps(step, ACTIVE, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, PORT)


if __name__ == "__main__":
    main()

"""Record a 2-rank gloo DDP job whose rank 1 gets slower every step: before its forward it runs
``tanh(y @ w)`` (256 x 256) three times per step index, inside ``record_function("rank1_extra")``
(none in the first recorded step, 57 in the twentieth); rank 0 waits for it at the gradient
all-reduce.
    python benchmarks/record_slowing_rank.py tests/data/own-cpu/slowing_rank_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import ddp_mlp, profiled_steps, record_gloo_job, train_step  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 20
MATMULS_PER_STEP = 3
PORT = 29551


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = ddp_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = torch.randn(256, 256) / 16

    def step(i: int) -> None:
        x = torch.randn(64, 256)
        extra = MATMULS_PER_STEP * max(0, i - WAIT - WARMUP)
        if rank == 1 and extra:
            with record_function("rank1_extra"):
                y = x.repeat(4, 1)
                for _ in range(extra):
                    y = torch.tanh(y @ w)
        train_step(model, opt, x)

    return profiled_steps(step, ACTIVE, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, PORT)


if __name__ == "__main__":
    main()

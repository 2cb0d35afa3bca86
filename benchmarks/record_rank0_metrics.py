"""Record a 2-rank gloo DDP job whose rank 0 alone computes metrics after each step's backward, as
a training script that logs on rank 0 does (``if rank == 0: metrics(...)``): ops at the step's top
level, in no module and no ``record_function`` range, that rank 1 never runs; rank 1 waits for them
at the next step's first all-reduce.
    python benchmarks/record_rank0_metrics.py tests/data/own-cpu/rank0_metrics_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import ddp_mlp, profiled_steps, record_gloo_job, train_step  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 8
METRIC_MATMULS = 12  # a metric's matmul and tanh, rank 0 only, a step
PORT = 29543


def _metrics(out: torch.Tensor, w: torch.Tensor) -> float:
    y = out.detach()
    for _ in range(METRIC_MATMULS):
        y = torch.tanh(y @ w)
    return float(y.abs().mean())


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = ddp_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = torch.randn(256, 256) / 16

    def step(i: int) -> None:
        y = train_step(model, opt, torch.randn(64, 256))
        if rank == 0:
            _metrics(y, w)

    return profiled_steps(step, ACTIVE, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, PORT)


if __name__ == "__main__":
    main()

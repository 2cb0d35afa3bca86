"""Record a 2-rank gloo job with an interleaved pipeline schedule: two stages on each rank, micro-batches received ahead.

Each of 6 profiled steps: ``torch.distributed.pipelining``'s ``ScheduleInterleaved1F1B`` over four
stages, two per rank (rank 0 holds stages 0 and 2, rank 1 stages 1 and 3), each a 512 -> 1024 ->
512 MLP with GELU; 4 micro-batches of 16 rows, SGD. The schedule posts a stage's receives
(``irecv``) ahead of the micro-batch that needs them and its sends (``isend``) without waiting: a
``gloo:recv`` / ``gloo:send`` span (on the calling thread) opens when its ``c10d::`` call posts it
and closes when the thread's wait on it returns, while the thread computes other micro-batches in
between.

    python benchmarks/record_pipeline_interleaved.py tests/data/own-cpu/pipeline_interleaved_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import profiled_steps, record_gloo_job  # noqa: E402

STEPS = 6  # profiled steps
WAIT, WARMUP = 1, 1


def _job(rank: int) -> profile:
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    torch.manual_seed(0)
    world = dist.get_world_size()
    modules = [torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)) for _ in range(2)]
    stages = [PipelineStage(m, s, 2 * world, torch.device("cpu")) for m, s in zip(modules, range(rank, 2 * world, world))]
    pipe = ScheduleInterleaved1F1B(stages, n_microbatches=4, loss_fn=lambda y, t: (y - t).square().mean())
    opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.01)

    def step(i: int) -> None:
        x = torch.randn(64, 512, generator=torch.Generator().manual_seed(i))
        target = torch.randn(64, 512, generator=torch.Generator().manual_seed(100 + i))
        opt.zero_grad()
        if rank == 0:
            pipe.step(x, target=target, losses=[])
        else:
            pipe.step(target=target, losses=[])
        opt.step()

    return profiled_steps(step, STEPS, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, 29551)


if __name__ == "__main__":
    main()

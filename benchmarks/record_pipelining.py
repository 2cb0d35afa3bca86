"""Record a 2-stage pipeline of torch.distributed.pipelining (PipelineStage, ScheduleGPipe, 4
micro-batches) on gloo: stage 0 (rank 0) holds two 256 -> 1024 -> 256 MLP blocks, stage 1 (rank 1)
one 256 -> 256 Linear and the loss, so stage 1 waits for stage 0 in its receives and sends.
    python benchmarks/record_pipelining.py tests/data/own-cpu/pipelining_gpipe_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import profiled_steps, record_gloo_job  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 8
MICROBATCHES, BATCH = 4, 64
PORT = 29547


def _block() -> list[torch.nn.Module]:
    return [torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)]


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    module = torch.nn.Sequential(*_block(), *_block()) if rank == 0 else torch.nn.Sequential(torch.nn.Linear(256, 256))
    stage = PipelineStage(module, rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)

    def step(i: int) -> None:
        opt.zero_grad()
        if rank == 0:
            schedule.step(torch.randn(BATCH, 256))
        else:
            schedule.step(target=torch.randn(BATCH, 256), losses=[])
        opt.step()

    return profiled_steps(step, ACTIVE, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, PORT)


if __name__ == "__main__":
    main()

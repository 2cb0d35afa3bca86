"""Record a 2-rank gloo DDP job that profiles two windows of its training with two profilers, one
after the other in each process (a script that profiles each epoch, or before and after a
change, with its own ``torch.profiler.profile``), each writing with ``tensorboard_trace_handler``
into one folder. Each profiler counts its steps from 0, so both windows of a rank hold
``ProfilerStep#2``-``#5`` (``schedule(wait=1, warmup=1, active=4)``); between the windows each
rank trains ``BETWEEN`` unprofiled steps.

    python benchmarks/record_two_profilers.py tests/data/own-cpu/two_profilers_gloo
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import out_folder  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 4
BETWEEN = 5  # unprofiled steps between the windows
PORT = 29541


def _rank(rank: int, out: str, world: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        loss = model(torch.randn(32, 256)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    for window in range(2):
        plan = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE)
        handler = tensorboard_trace_handler(out, worker_name=f"rank{rank}", use_gzip=True)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=plan, on_trace_ready=handler) as prof:
            for _ in range(WAIT + WARMUP + ACTIVE):
                step()
                prof.step()
        if window == 0:
            for _ in range(BETWEEN):
                step()
    dist.destroy_process_group()


def main() -> None:
    out = out_folder(__doc__)
    mp.spawn(_rank, args=(str(out), 2), nprocs=2, join=True)


if __name__ == "__main__":
    main()

"""Record a 2-rank gloo DDP job with every option of the profiler on (record_shapes, profile_memory,
with_flops, with_modules, with_stack): the Python tracer names each Python call, a built-in's with
its object's address (``<built-in method run_backward of torch._C._EngineBase object at 0x7f…>``),
which differs between the two processes.
    python benchmarks/record_ddp_with_stack.py tests/data/own-cpu/ddp_with_stack_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import ddp_mlp, record_gloo_job, train_step  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 6
PORT = 29548


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = ddp_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    every = dict(record_shapes=True, profile_memory=True, with_flops=True, with_modules=True, with_stack=True)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE), **every) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            train_step(model, opt, torch.randn(64, 256))
            prof.step()
    return prof


def main() -> None:
    record_gloo_job(_job, __doc__, PORT)


if __name__ == "__main__":
    main()

"""Record a 2-rank gloo job whose MLP is tensor-parallel (DTensor): functional collectives and their waits.

Each of 8 profiled steps: a 512 -> 2048 -> 512 MLP with GELU, its first layer split by columns and
its second by rows over the two ranks (``parallelize_module`` with ``ColwiseParallel`` and
``RowwiseParallel`` on a CPU device mesh), batch 64, forward, backward, SGD. The row-wise layer's
output is summed over the ranks by a functional all-reduce: ``_c10d_functional::all_reduce`` (which
calls ``c10d::allreduce_``; gloo runs it as ``gloo:all_reduce`` on its own thread) returns at once,
and ``_c10d_functional::wait_tensor`` blocks the calling thread until gloo's op is done.

    python benchmarks/record_tensor_parallel.py tests/data/own-cpu/tensor_parallel_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import profiled_steps, record_gloo_job  # noqa: E402

STEPS = 8  # profiled steps
WAIT, WARMUP = 1, 1


def _job(rank: int) -> profile:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2,))
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i: int) -> None:
        x = torch.randn(64, 512, generator=torch.Generator().manual_seed(i))  # (the same batch on both ranks)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return profiled_steps(step, STEPS, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, 29545)


if __name__ == "__main__":
    main()

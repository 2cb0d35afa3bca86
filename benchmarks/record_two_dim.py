"""Record a 4-rank gloo job with two parallel dimensions: FSDP2 over one, tensor parallel over the other.

Each of 6 profiled steps: a 512 -> 2048 -> 512 MLP with GELU on a 2 × 2 CPU device mesh
(``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``): its first layer split by
columns and its second by rows over the "tp" dimension (ranks 0+1, 2+3), then sharded with
``fully_shard`` over the "dp" dimension (ranks 0+2, 1+3); batch 64, a different batch on each dp
rank, forward, backward, SGD. Per step each rank makes three collectives, none of them naming its
process group in the trace: FSDP's all-gather of the parameters (``gloo:all_gather`` of 525,056
elements, dp), the row-wise layer's all-reduce of its output (``gloo:all_reduce`` of 64 × 512,
tp), FSDP's reduce-scatter of the gradients (gloo runs it as ``gloo:all_reduce`` of 1,050,112
elements, dp). Each rank's ``distributedInfo.pg_config`` lists its groups: ``default_pg`` (all
four), ``mesh_dp`` and ``mesh_tp``.

    python benchmarks/record_two_dim.py tests/data/own-cpu/fsdp_tp_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import profiled_steps, record_gloo_job  # noqa: E402

STEPS = 6  # profiled steps
WAIT, WARMUP = 1, 1


def _job(rank: int) -> profile:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    model = parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    model = fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dp = mesh["dp"].get_local_rank()

    def step(i: int) -> None:
        x = torch.randn(64, 512, generator=torch.Generator().manual_seed(10 * i + dp))  # (the tp pair shares a batch)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return profiled_steps(step, STEPS, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, 29547, world=4)


if __name__ == "__main__":
    main()

"""Record a 4-rank gloo job whose pipeline stages are also data parallel: torch.distributed.pipelining × FSDP2.

Each of 6 profiled steps: two pipeline stages (``PipelineStage``, ``ScheduleGPipe``, 4
microbatches of 16) on the "pp" dimension of a 2 × 2 CPU device mesh
(``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))``: ranks 0+1 and 2+3 are
pipelines), each stage a 512 -> 1024 -> 512 MLP with GELU sharded with ``fully_shard`` over "dp"
(ranks 0+2 hold stage 0, 1+3 stage 1); batch 64, one batch per pipeline; SGD. The stages exchange
activations and gradients with ``c10d::send`` / ``c10d::recv_`` on their pipeline's group, whose
recorded peer (the call's third concrete input) is the peer's rank in that group: rank 2 sends to
"1", rank 3. Each rank's ``distributedInfo.pg_config`` lists its groups: ``default_pg`` (all
four), ``mesh_dp`` and ``mesh_pp``.

    python benchmarks/record_pipeline_dp.py tests/data/own-cpu/pipeline_dp_gloo
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
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
    pp, dp = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    torch.manual_seed(pp)
    stage_module = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
    stage_module = fully_shard(stage_module, mesh=mesh["dp"], reshard_after_forward=False)
    stage = PipelineStage(stage_module, pp, 2, torch.device("cpu"), group=mesh["pp"].get_group())
    pipe = ScheduleGPipe(stage, n_microbatches=4, loss_fn=lambda y, t: (y - t).square().mean())
    opt = torch.optim.SGD(stage_module.parameters(), lr=0.01)

    def step(i: int) -> None:
        x = torch.randn(64, 512, generator=torch.Generator().manual_seed(10 * i + dp))
        target = torch.randn(64, 512, generator=torch.Generator().manual_seed(100 + 10 * i + dp))
        opt.zero_grad()
        if pp == 0:
            pipe.step(x)
        else:
            pipe.step(target=target, losses=[])
        opt.step()

    return profiled_steps(step, STEPS, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, 29549, world=4)


if __name__ == "__main__":
    main()

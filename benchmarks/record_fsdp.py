"""Record a 2-rank gloo job sharded with FSDP2 (``fully_shard``): all-gathers and reduce-scatters on gloo's worker threads.

A 4-layer MLP (256 → 256, GELU, each layer its own ``fully_shard`` unit, then the root), SGD,
batch 32, one intra-op thread, ``ProfilerActivity.CPU``, ``record_shapes=True``,
``schedule(wait=1, warmup=1, active=6)``: steps 2–7. Each step FSDP all-gathers every layer's
parameters before its forward and again before its backward (``c10d::_allgather_base_`` on the
main thread, run by gloo as ``gloo:all_gather`` on one of its ``pt_gloo_runloop`` threads, which
copies the shard in and the gathered tensor out around the exchange), and reduce-scatters every
layer's gradients (``c10d::_reduce_scatter_base_``, which gloo runs as ``gloo:all_reduce`` of the
whole gradient).

    python benchmarks/record_fsdp.py tests/data/own-cpu/fsdp_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import record_gloo_job  # noqa: E402

STEPS = 6
LAYERS = 4


def _job(rank: int) -> profile:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(LAYERS)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=1, warmup=1, active=STEPS)) as prof:
        for _ in range(STEPS + 2):
            x = torch.randn(32, 256)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return prof


def main() -> None:
    record_gloo_job(_job, __doc__, 29535)


if __name__ == "__main__":
    main()

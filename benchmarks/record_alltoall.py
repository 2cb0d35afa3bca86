"""Record a 2-rank gloo job whose all-to-all sends uneven splits (a mixture-of-experts' token exchange).

Each of 8 profiled steps: matmul blocks (rank 1 runs 20 more than rank 0: it arrives late), then
``all_to_all_single`` with uneven splits, so each rank's input holds another number of elements
(rank 0 sends 1,024 and 3,072 elements, rank 1 sends 2,048 and 6,144: inputs of 4,096 and 8,192),
then one all-reduce of equal size, then the sums of what it received. The profiler records shapes, so every all-to-all's message size
is in the trace and differs between the ranks.

    python benchmarks/record_alltoall.py tests/data/own-cpu/alltoall_uneven
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import record_gloo_job  # noqa: E402

SPLITS = {0: [1024, 3072], 1: [2048, 6144]}  # elements rank r sends to rank 0 and to rank 1
STEPS = 8


def _job(rank: int) -> profile:
    torch.manual_seed(rank)
    w = torch.randn(256, 256)
    send = torch.randn(sum(SPLITS[rank]))
    recv = torch.empty(SPLITS[0][rank] + SPLITS[1][rank])
    grad = torch.randn(65536)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=1, warmup=2, active=STEPS)) as prof:
        for _ in range(STEPS + 3):
            x = torch.randn(64, 256)
            for _ in range(4 + 20 * rank):
                x = torch.tanh(x @ w)
            dist.all_to_all_single(recv, send, output_split_sizes=[SPLITS[0][rank], SPLITS[1][rank]], input_split_sizes=SPLITS[rank])
            dist.all_reduce(grad)
            (recv.sum() + grad.sum()).item()  # (the step ends with ops of its own: what it received, used)
            prof.step()
    return prof


def main() -> None:
    record_gloo_job(_job, __doc__, 29531)


if __name__ == "__main__":
    main()

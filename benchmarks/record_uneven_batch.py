"""Record a 2-rank gloo DDP job whose ranks are given batches of different sizes (an uneven split of
the data: rank 0 64 rows, rank 1 160), the same model and ops on each, ``record_shapes=True``: rank
1 is the straggler because its data is larger, not its host slower.
    python benchmarks/record_uneven_batch.py tests/data/own-cpu/uneven_batch_gloo
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import ddp_mlp, profiled_steps, record_gloo_job, train_step  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 8
BATCH = (64, 160)  # rows a step, per rank
PORT = 29545


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = ddp_mlp(256, 1024)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i: int) -> None:
        train_step(model, opt, torch.randn(BATCH[rank], 256))

    return profiled_steps(step, ACTIVE, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, PORT, world=len(BATCH))


if __name__ == "__main__":
    main()

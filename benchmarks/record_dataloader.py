"""Record a 2-rank gloo DDP job whose rank 1 waits for its DataLoader's workers (a starved input pipeline).

Each rank reads its batches through a ``DataLoader`` with one worker process; each sample takes
``DECODE_S[rank]`` to prepare (a ``time.sleep`` standing in for reading and decoding it), so rank
0's worker keeps ahead of its training loop and rank 1's cannot: a batch of ``BATCH`` samples
takes rank 1's worker 20 ms, and rank 1's loop (a few ms of forward, backward and SGD step) waits
in the loader's ``__next__`` for the rest of every step. Rank 0 waits for rank 1 at every step's
gradient all-reduce. The trace is recorded without
``with_stack``: nothing in it shows the wait but the ``__next__`` range with no op inside it.

    python benchmarks/record_dataloader.py tests/data/own-cpu/dataloader_starved
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.profiler import profile
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import profiled_steps, record_gloo_job  # noqa: E402

STEPS = 12  # profiled steps
WAIT, WARMUP = 1, 1
BATCH = 8
WORKERS = 1
DECODE_S = (0.0001, 0.0025)  # per sample, rank 0 and rank 1


class _Decoded(Dataset):
    """Samples that take ``seconds`` each to prepare."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.seconds)
        return torch.full((256,), float(i % 7)), torch.full((256,), float(i % 5))


def _job(rank: int) -> profile:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loader = DataLoader(_Decoded(DECODE_S[rank]), batch_size=BATCH, num_workers=WORKERS, persistent_workers=True)
    batches = iter(loader)
    next(batches)  # (the workers started: the first batch is not the pipeline's steady state)

    def step(_: int) -> None:
        x, y = next(batches)
        loss = (ddp(x) - y).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return profiled_steps(step, STEPS, WAIT, WARMUP)


def main() -> None:
    record_gloo_job(_job, __doc__, 29537)


if __name__ == "__main__":
    main()

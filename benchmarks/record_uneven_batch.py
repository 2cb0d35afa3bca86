"""Record a 2-rank gloo DDP job whose ranks are given batches of different sizes (an uneven split of
the data: rank 0 64 rows, rank 1 160), the same model and ops on each, ``record_shapes=True``: rank
1 is the straggler because its data is larger, not its host slower.
    python benchmarks/record_uneven_batch.py tests/data/own-cpu/uneven_batch_gloo
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import out_folder  # noqa: E402

WAIT, WARMUP, ACTIVE = 1, 1, 8
BATCH = (64, 160)  # rows a step, per rank
PORT = 29545


def _rank(rank: int, out: str, world: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plan = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=plan) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            loss = model(torch.randn(BATCH[rank], 256)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    raw = Path(out) / f"rank-{rank}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(raw.with_suffix(".json.gz"), "wb") as dst:  # gzipped, bytes unchanged
        dst.write(src.read())
    raw.unlink()
    dist.destroy_process_group()


def main() -> None:
    out = out_folder(__doc__)
    mp.spawn(_rank, args=(str(out), len(BATCH)), nprocs=len(BATCH), join=True)


if __name__ == "__main__":
    main()

"""Record a 2-rank gloo DDP job whose rank 0 alone computes metrics after each step's backward, as
a training script that logs on rank 0 does (``if rank == 0: metrics(...)``): ops at the step's top
level, in no module and no ``record_function`` range, that rank 1 never runs; rank 1 waits for them
at the next step's first all-reduce.
    python benchmarks/record_rank0_metrics.py tests/data/own-cpu/rank0_metrics_gloo
"""

from __future__ import annotations

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
METRIC_MATMULS = 12  # a metric's matmul and tanh, rank 0 only, a step
PORT = 29543


def _metrics(out: torch.Tensor, w: torch.Tensor) -> float:
    y = out.detach()
    for _ in range(METRIC_MATMULS):
        y = torch.tanh(y @ w)
    return float(y.abs().mean())


def _rank(rank: int, out: str, world: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(PORT)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = torch.randn(256, 256) / 16
    plan = schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=plan) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            x = torch.randn(64, 256)
            y = model(x)
            loss = y.square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0:
                _metrics(y, w)
            prof.step()
    prof.export_chrome_trace(str(Path(out) / f"rank-{rank}.json"))
    dist.destroy_process_group()


def main() -> None:
    out = out_folder(__doc__)
    mp.spawn(_rank, args=(str(out), 2), nprocs=2, join=True)
    for r in range(2):  # gzip as the other recordings (bytes unchanged inside)
        raw = out / f"rank-{r}.json"
        import gzip

        with open(raw, "rb") as src, gzip.open(out / f"rank-{r}.json.gz", "wb") as dst:
            dst.write(src.read())
        raw.unlink()


if __name__ == "__main__":
    main()

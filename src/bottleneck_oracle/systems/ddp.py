"""A small data-parallel training run under torch.distributed (gloo on CPU), profiled per rank.

Used to record the bundled sample trace and by the tests: a 3-layer MLP trained with
DistributedDataParallel on synthetic data, one rank optionally slowed by a sleep in its
forward pass (a straggler), so the other ranks wait at the gradient all-reduce.

    python -m bottleneck_oracle.systems.ddp --out traces/ --world 2 --straggler 1 --delay-ms 20
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from bottleneck_oracle.systems.profiler import oracle_profile, phase


@dataclass(kw_only=True, slots=True)
class DDPRun:
    out: str
    """Folder for rank-N.json.gz (and run.yaml, the settings of the run)."""
    world: int = 2
    """Number of ranks (processes on this machine)."""
    steps: int = 3
    """Profiled steps (after one warm-up step)."""
    hidden: int = 512
    """Width of the MLP's hidden layer."""
    batch: int = 64
    bucket_mb: float = 0.5
    """DDP gradient bucket size (MB): smaller buckets, more all-reduces."""
    straggler: int = -1
    """Rank that sleeps in its forward pass (-1: none)."""
    delay_ms: float = 0.0
    """How long the straggler sleeps per step (ms)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.world < 1:
            raise ValueError(f"world must be >= 1 (found {self.world})")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1 (found {self.steps})")
        if self.straggler >= self.world:
            raise ValueError(f"straggler must be < world (found {self.straggler} for world {self.world})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, run: DDPRun, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=run.world)
    try:
        torch.manual_seed(run.seed)
        torch.set_num_threads(1)
        model = torch.nn.Sequential(
            torch.nn.Linear(256, run.hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(run.hidden, run.hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(run.hidden, 256),
        )
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=run.bucket_mb)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(run.seed + rank)
        x = torch.randn(run.batch, 256, generator=gen)
        with oracle_profile(run.out, steps=run.steps, warmup=1) as prof:
            for _ in range(run.steps + 1):
                with phase("forward"):
                    if rank == run.straggler and run.delay_ms > 0:
                        time.sleep(run.delay_ms / 1000)
                    loss = ddp(x).pow(2).mean()
                with phase("backward"):
                    loss.backward()
                with phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
                prof.step()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def record(run: DDPRun) -> Path:
    """Run the job on ``run.world`` local processes; returns the trace folder."""
    out = Path(run.out)
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(run, _free_port()), nprocs=run.world, join=True)
    (out / "run.yaml").write_text(yaml.safe_dump(asdict(run), sort_keys=False))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--straggler", type=int, default=-1)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--bucket-mb", type=float, default=0.5)
    a = p.parse_args()
    record(DDPRun(out=a.out, world=a.world, steps=a.steps, straggler=a.straggler, delay_ms=a.delay_ms, bucket_mb=a.bucket_mb))


if __name__ == "__main__":
    main()

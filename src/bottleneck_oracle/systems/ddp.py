"""A data-parallel training run under torch.distributed (gloo on CPU), profiled per rank.

Used to record the bundled sample trace and by the tests: a 3-layer MLP, or a GPT of one of
``model.SIZES``, trained with DistributedDataParallel on synthetic data. One rank can be a
straggler (a sleep in every forward pass), and ``injections`` slow a module, phase, collective
or rank at chosen steps (systems.inject), recorded in injections-rank-N.jsonl.

    python -m bottleneck_oracle.systems.ddp --out traces/ --world 2 --straggler 1 --delay-ms 20
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from bottleneck_oracle.systems.inject import Injection, Injector
from bottleneck_oracle.systems.model import GPT, SIZES, synthetic_batch
from bottleneck_oracle.systems.profiler import oracle_profile


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
    size: str | None = None
    """A GPT size from model.SIZES instead of the MLP (hidden is then unused)."""
    injections: tuple[Injection, ...] = ()
    """Delays to inject, each on one rank at one step (= its ProfilerStep number)."""

    def __post_init__(self) -> None:
        if self.size is not None and self.size not in SIZES:
            raise ValueError(f"size must be one of {sorted(SIZES)} (found {self.size!r})")
        if self.world < 1:
            raise ValueError(f"world must be >= 1 (found {self.world})")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1 (found {self.steps})")
        if self.straggler >= self.world:
            raise ValueError(f"straggler must be < world (found {self.straggler} for world {self.world})")


def free_port() -> int:
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
        gen = torch.Generator().manual_seed(run.seed + rank)
        if run.size is None:
            model = torch.nn.Sequential(
                torch.nn.Linear(256, run.hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(run.hidden, run.hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(run.hidden, 256),
            )
            x = torch.randn(run.batch, 256, generator=gen)

            def loss_of(m):
                return m(x).pow(2).mean()
        else:
            cfg = SIZES[run.size]
            model = GPT(cfg)
            tokens, targets = synthetic_batch(cfg, run.batch, gen)

            def loss_of(m):
                return m(tokens, targets)

        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=run.bucket_mb)
        injector = Injector(list(run.injections), rank, run.out)
        injector.attach(ddp)
        if any(i.kind == "collective" for i in run.injections):
            ddp.register_comm_hook(None, injector.ddp_comm_hook())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        with oracle_profile(run.out, steps=run.steps, warmup=1) as prof:
            for step in range(run.steps + 1):
                injector.at_step(step)
                with injector.phase("forward"):
                    if rank == run.straggler and run.delay_ms > 0:
                        time.sleep(run.delay_ms / 1000)
                    loss = loss_of(ddp)
                with injector.phase("backward"):
                    loss.backward()
                with injector.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
                prof.step()
        injector.write_manifest()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def record(run: DDPRun) -> Path:
    """Run the job on ``run.world`` local processes; returns the trace folder."""
    out = Path(run.out)
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(run, free_port()), nprocs=run.world, join=True)
    (out / "run.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(asdict(run))), sort_keys=False))
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

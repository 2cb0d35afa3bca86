"""What every reference workload shares: local process launch, process group, profiled steps."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from bottleneck_oracle.systems.inject import Injector
from bottleneck_oracle.systems.profiler import oracle_profile


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker: Callable, run, nprocs: int | None = None) -> Path:
    """Run ``worker(rank, run, port)`` on ``nprocs`` (default ``run.world``) local processes, then
    write run.yaml (the run's settings) beside the traces; returns the trace folder."""
    out = Path(run.out)
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(worker, args=(run, free_port()), nprocs=nprocs or run.world, join=True)
    (out / "run.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(asdict(run))), sort_keys=False))
    return out


def pin_to_core(rank: int) -> int | None:
    """Pin this process to one of the cores it may run on (rank modulo their number), so two
    ranks do not trade cores between steps; the core, or None where the OS cannot pin."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


@contextmanager
def process_group(rank: int, world: int, port: int, pin: bool = False) -> Iterator[None]:
    """A gloo process group on loopback for one worker, single-threaded ops (with ``pin``, on a
    core of its own: ``pin_to_core``), torn down after."""
    if pin:
        pin_to_core(rank)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def profiled_steps(run, injector: Injector) -> Iterator[int]:
    """Steps 0..run.steps (step 0 warms up), profiled, with the injector told of each step;
    the injection manifest is written at the end."""
    with oracle_profile(run.out, steps=run.steps, warmup=1) as prof:
        for step in range(run.steps + 1):
            injector.at_step(step)
            yield step
            prof.step()
    injector.write_manifest()


def train_step(injector: Injector, loss_of: Callable[[], torch.Tensor], opt: torch.optim.Optimizer) -> None:
    """forward / backward / optimizer, each a profiler phase that phase injections can slow."""
    with injector.phase("forward"):
        loss = loss_of()
    with injector.phase("backward"):
        loss.backward()
    with injector.phase("optimizer"):
        opt.step()
        opt.zero_grad()

"""What every reference workload shares: local process launch, process group, profiled steps."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from bottleneck_oracle.errors import RunError
from bottleneck_oracle_lab.systems.inject import Injector
from bottleneck_oracle_lab.systems.profiler import oracle_profile


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker: Callable, run, nprocs: int | None = None) -> Path:
    """Run ``worker(rank, run, port)`` on ``nprocs`` (default ``run.world``) local processes, then
    write run.yaml (the run's settings) beside the traces; returns the trace folder. A rank that
    raises, exits non-zero or is killed becomes one RunError line naming the folder and the rank."""
    out = Path(run.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        mp.spawn(worker, args=(run, free_port()), nprocs=nprocs or run.world, join=True)
    except mp.ProcessExitedException as exc:
        if exc.signal_name is None:
            raise RunError(f"{out}: rank {exc.error_index} exited with code {exc.exit_code}") from None
        hint = ""
        if exc.signal_name == "SIGKILL":
            hint = " (out of memory? the profiler keeps every event of a launch until it ends: record fewer steps per launch)"
        raise RunError(f"{out}: rank {exc.error_index} was killed by {exc.signal_name}{hint}") from None
    except mp.ProcessRaisedException as exc:
        raise RunError(f"{out}: rank {exc.error_index} failed: {_exception_line(str(exc))}") from None
    (out / "run.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(asdict(run))), sort_keys=False))
    return out


def _exception_line(text: str) -> str:
    """The 'Type: message' line of a child's traceback as torch.multiprocessing passes it on:
    the first unindented line after the last frame."""
    lines = text.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    for line in lines[frames[-1] + 1 if frames else 0 :]:
        if line.strip() and not line.startswith(" "):
            return line.strip()
    return "no message"


def pin_to_core(rank: int) -> int | None:
    """Pin this process to one of the cores it may run on (rank modulo their number), so two
    ranks do not trade cores between steps; the core, or None where the OS cannot pin."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


def idle_gloo_loops() -> int:
    """Run this process's gloo socket threads (``gloo_tcp_loop``) at idle priority; how many.

    A pinned rank's gloo socket thread shares the rank's core with the threads that run its
    collectives. When it finds a connection's lock held by one of them it spins (epoll reports the
    socket ready again at once) until the kernel's tick preempts it: on the 250 Hz recording
    machine an all-reduce of any size took about 0.4 ms or about 4 ms, at random (0.5 MB: 0.42 ms
    at the 10th percentile, 4.43 ms at the 90th). At idle priority the socket thread yields the
    core to any other thread that wants it: the same all-reduce takes 0.51-0.61 ms, and the tiny
    DDP step spreads 10-11% instead of 18% (``benchmarks/noise_sources.py``).

    For DDP only: a pipeline's send needs the sender's socket thread to run when the receiver
    says it is ready, and at idle priority that waits until the sender's compute blocks (the
    tiny 1F1B step: median 21.7 ms, spread 33%, against 13.9 ms and 17% without). Where the OS
    has no idle priority, nothing."""
    if not hasattr(os, "SCHED_IDLE"):
        return 0
    done = 0
    for _ in range(20):  # gloo starts its socket thread and names it a moment after the group forms
        for task in Path("/proc/self/task").glob("*"):
            try:
                if (task / "comm").read_text().strip() == "gloo_tcp_loop":
                    os.sched_setscheduler(int(task.name), os.SCHED_IDLE, os.sched_param(0))
                    done += 1
            except OSError:  # the thread ended, or the OS refused
                continue
        if done:
            break
        time.sleep(0.05)
    return done


def pin_to_share(rank: int, world: int) -> set[int] | None:
    """Pin this process to its rank's share of the cores it may run on (an equal slice each, at
    least one): a GPU rank's CUDA runtime and gloo threads need cores beside the one that
    launches its kernels (pinned to one core each with the socket thread at idle priority, the
    gradient all-reduce's exchange of the small GPT took 4-18 ms on the H200 machine); the
    cores, or None where the OS cannot pin."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    k = max(1, len(cores) // max(world, 1))
    mine = {cores[(rank * k + i) % len(cores)] for i in range(k)}
    os.sched_setaffinity(0, mine)
    return mine


@contextmanager
def process_group(rank: int, world: int, port: int, pin: bool = False, backend: str = "gloo", share: bool = False) -> Iterator[None]:
    """A process group (gloo unless ``backend`` says otherwise) on loopback for one worker,
    single-threaded ops (with ``pin``, on a core of its own: ``pin_to_core``; with ``share`` too,
    on its share of the cores: ``pin_to_share``), torn down after."""
    if pin:
        if share:
            pin_to_share(rank, world)
        else:
            pin_to_core(rank)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def profiled_steps(run, injector: Injector) -> Iterator[int]:
    """Steps 0..run.steps (step 0 warms up), profiled, with the injector told of each step;
    the injection manifest is written at the end."""
    with oracle_profile(run.out, steps=run.steps, warmup=1, window=run.window) as prof:
        for step in range(run.steps + 1):
            injector.at_step(step)
            yield step
            prof.step()
    injector.write_manifest()


def train_step(
    injector: Injector,
    loss_of: Callable[[], torch.Tensor],
    opt: torch.optim.Optimizer,
    accum: int = 1,
    no_sync: Callable[[], AbstractContextManager] | None = None,
) -> torch.Tensor:
    """forward / backward (``accum`` times, the gradients summed; all but the last under
    ``no_sync``) / optimizer, each a profiler phase that phase injections can slow; the last loss."""
    for i in range(accum):
        with no_sync() if no_sync is not None and i < accum - 1 else nullcontext():
            with injector.phase("forward"):
                loss = loss_of()
            with injector.phase("backward"):
                (loss / accum if accum > 1 else loss).backward()
    with injector.phase("optimizer"):
        opt.step()
        opt.zero_grad()
    return loss

"""A data-parallel training run under torch.distributed (gloo on CPU), profiled per rank.

Used to record the bundled sample trace and by the tests: a 3-layer MLP, or a GPT of one of
``model.SIZES``, trained with DistributedDataParallel on synthetic data. One rank can be a
straggler (a sleep in every forward pass), and ``injections`` slow a module, phase, collective
or rank at chosen steps (systems.inject), recorded in injections-rank-N.jsonl.

    python -m bottleneck_oracle_lab.systems.ddp --out traces/ --world 2 --straggler 1 --delay-ms 20
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bottleneck_oracle_lab.systems.inject import Injection, Injector
from bottleneck_oracle_lab.systems.launch import idle_gloo_loops, process_group, profiled_steps, spawn, train_step
from bottleneck_oracle_lab.systems.model import GPT, SIZES, sized, synthetic_batch


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
    seq: int | None = None
    """The GPT's sequence length (None: its size's)."""
    accum: int = 1
    """Gradient accumulation: forward and backward passes per optimizer step (the gradients
    all-reduced in the last, ``no_sync`` in the others)."""
    checkpoint: bool = False
    """Activation checkpointing of the GPT's blocks (recomputed in the backward pass)."""
    injections: tuple[Injection, ...] = ()
    """Delays to inject, each on one rank at one step (= its ProfilerStep number)."""
    pin: bool = False
    """Pin each rank to a core of its own (rank modulo the cores), its gloo socket thread at idle
    priority (``launch.idle_gloo_loops``): the low-noise recording protocol. On ``cuda``: each
    rank on its share of the cores (``launch.pin_to_share``), the socket threads as they are."""
    device: str = "cpu"
    """``cuda``: the model, its data and gradients on GPU ``rank % torch.cuda.device_count()``;
    stalls and slow collectives are then GPU-side sleeps, extra compute runs on the GPU, and every
    step ends reading the loss (``loss.item()``, as a training loop that logs it does)."""
    backend: str = "gloo"
    """The process group's backend: gloo (CPU tensors, or CUDA tensors through host memory) or
    nccl (CUDA, one GPU per rank)."""
    window: int | None = None
    """Write the trace in windows of this many steps, each as it ends (``oracle_profile``): a long
    recording's events are not all held until the last step."""

    def __post_init__(self) -> None:
        if self.size is not None and self.size not in SIZES:
            raise ValueError(f"size must be one of {sorted(SIZES)} (found {self.size!r})")
        if self.world < 1:
            raise ValueError(f"world must be >= 1 (found {self.world})")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1 (found {self.steps})")
        if self.accum < 1:
            raise ValueError(f"accum must be >= 1 (found {self.accum})")
        if (self.seq is not None or self.checkpoint) and self.size is None:
            raise ValueError("seq and checkpoint are settings of the GPT: give a size")
        if self.straggler >= self.world:
            raise ValueError(f"straggler must be < world (found {self.straggler} for world {self.world})")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda (found {self.device!r})")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl (found {self.backend!r})")
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError("the nccl backend needs device cuda")


def _device(run: DDPRun, rank: int) -> torch.device:
    if run.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("device cuda: this machine has no CUDA GPU that torch can use")
    return torch.device("cuda", rank % torch.cuda.device_count())


def _worker(rank: int, run: DDPRun, port: int) -> None:
    dev = _device(run, rank)
    gpu = dev.type == "cuda"
    if gpu:
        torch.cuda.set_device(dev)
    with process_group(rank, run.world, port, pin=run.pin, backend=run.backend, share=gpu):
        if run.pin and not gpu:
            idle_gloo_loops()
        torch.manual_seed(run.seed)
        gen = torch.Generator().manual_seed(run.seed + rank)
        if run.size is None:
            model: torch.nn.Module = torch.nn.Sequential(
                torch.nn.Linear(256, run.hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(run.hidden, run.hidden),
                torch.nn.ReLU(),
                torch.nn.Linear(run.hidden, 256),
            )
            x = torch.randn(run.batch, 256, generator=gen).to(dev)

            def forward(m):
                return m(x).pow(2).mean()
        else:
            cfg = sized(run.size, run.seq)
            model = GPT(cfg)
            model.checkpointed = run.checkpoint
            tokens, targets = (t.to(dev) for t in synthetic_batch(cfg, run.batch, gen))

            def forward(m):
                return m(tokens, targets)

        model.to(dev)
        ids = [dev.index] if gpu else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=run.bucket_mb)
        injector = Injector(list(run.injections), rank, run.out, device=dev)
        injector.attach(ddp)
        if any(i.kind == "collective" for i in run.injections):
            ddp.register_comm_hook(None, injector.ddp_comm_hook())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

        def loss_of():
            if rank == run.straggler and run.delay_ms > 0:
                time.sleep(run.delay_ms / 1000)  # the straggler: slow in every forward pass
            return forward(ddp)

        for _ in profiled_steps(run, injector):
            loss = train_step(injector, loss_of, opt, accum=run.accum, no_sync=ddp.no_sync)
            if gpu:
                loss.item()


def record(run: DDPRun) -> Path:
    """Run the job on ``run.world`` local processes; returns the trace folder."""
    return spawn(_worker, run)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--straggler", type=int, default=-1)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--bucket-mb", type=float, default=0.5)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    a = p.parse_args()
    record(
        DDPRun(
            out=a.out,
            world=a.world,
            steps=a.steps,
            straggler=a.straggler,
            delay_ms=a.delay_ms,
            bucket_mb=a.bucket_mb,
            device=a.device,
            backend=a.backend,
        )
    )


if __name__ == "__main__":
    main()

"""Pipeline-parallel training of the GPT over point-to-point send/recv (gloo on CPU), optionally
replicated data-parallel (DP x PP).

The model's layers are split evenly over the ranks (stage 0 also holds the embedding, the last
stage the head and loss). Each step runs ``microbatches`` micro-batches with one of two
schedules: AFAB (all forwards, then all backwards) or 1F1B (after a warm-up of
``stages - rank - 1`` forwards, one forward then one backward). Activations travel forward
and their gradients backward with ``isend`` (waited at the end of the step, so a send never
blocks the schedule) and blocking ``recv``.

    python -m bottleneck_oracle_lab.systems.pipeline --out traces/ --world 2 --schedule 1f1b
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from bottleneck_oracle_lab.systems.inject import Injection, Injector
from bottleneck_oracle_lab.systems.launch import process_group, profiled_steps, spawn
from bottleneck_oracle_lab.systems.model import GPT, SIZES, run_block, sized, synthetic_batch
from bottleneck_oracle_lab.systems.profiler import phase

SCHEDULES = ("afab", "1f1b")


@dataclass(kw_only=True, slots=True)
class PipelineRun:
    out: str
    """Folder for rank-N.json.gz (and run.yaml)."""
    world: int = 2
    """Pipeline stages, one rank each."""
    dp: int = 1
    """Data-parallel replicas of the whole pipeline (DP x PP on dp * world ranks; ranks
    r * world .. r * world + world - 1 are replica r's stages)."""
    size: str = "tiny"
    """GPT size from model.SIZES."""
    schedule: str = "1f1b"
    microbatches: int = 4
    batch: int = 2
    """Sequences per micro-batch."""
    seq: int | None = None
    """The GPT's sequence length (None: its size's)."""
    checkpoint: bool = False
    """Activation checkpointing of the stage's blocks (recomputed in the backward pass)."""
    steps: int = 3
    seed: int = 0
    injections: tuple[Injection, ...] = ()
    pin: bool = False
    """Pin each rank to a core of its own (rank modulo the cores): the low-noise recording protocol."""
    window: int | None = None
    """Write the trace in windows of this many steps, each as it ends (``oracle_profile``): a long
    recording's events are not all held until the last step."""

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES} (found {self.schedule!r})")
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {sorted(SIZES)} (found {self.size!r})")
        if self.world < 2 or SIZES[self.size].layers < self.world:
            raise ValueError(f"need 2 <= world <= layers ({SIZES[self.size].layers}) (found {self.world})")
        if self.dp < 1:
            raise ValueError(f"dp must be >= 1 (found {self.dp})")
        if self.microbatches < 1:
            raise ValueError(f"microbatches must be >= 1 (found {self.microbatches})")


class Stage(nn.Module):
    """The layers of one pipeline stage; the first embeds tokens, the last returns the loss."""

    def __init__(self, model: GPT, rank: int, world: int, checkpointed: bool = False) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        n = len(model.layers)
        lo, hi = rank * n // world, (rank + 1) * n // world
        self.first, self.last = rank == 0, rank == world - 1
        self.embed = model.embed if self.first else None
        self.pos = model.pos if self.first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in range(lo, hi)})  # global names: layers.<i>
        self.ln = model.ln if self.last else None
        self.head = model.head if self.last else None

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Shapes: first stage x (batch, seq) tokens, others (batch, seq, width); the last
        returns a scalar loss, the others (batch, seq, width) activations."""
        if self.embed is not None and self.pos is not None:  # the first stage
            x = self.embed(x) + self.pos[:, : x.shape[1]]
        for layer in self.layers.values():
            x = run_block(layer, x, self.checkpointed)
        if self.head is not None and self.ln is not None:  # the last stage
            if targets is None:
                raise ValueError("the last pipeline stage needs the targets")
            logits = self.head(self.ln(x))
            return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return x


def _train_step(stage: Stage, rank: int, world: int, run: PipelineRun, data, shape, base: int = 0) -> list:
    """One step of the schedule for stage ``rank`` of the replica whose first rank is ``base``;
    returns the pending isend works."""
    pending = []
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}

    def forward(mb: int) -> None:
        with phase(f"forward.mb{mb}"):
            if stage.first:
                x = data[mb][0]
            else:
                x = torch.empty(shape)
                dist.recv(x, base + rank - 1)
                x.requires_grad_(True)
            inputs[mb] = x
            out = stage(x, data[mb][1])
            outputs[mb] = out
            if not stage.last:
                pending.append(dist.isend(out.detach(), base + rank + 1))

    def backward(mb: int) -> None:
        with phase(f"backward.mb{mb}"):
            out = outputs.pop(mb)
            if stage.last:
                (out / run.microbatches).backward()
            else:
                grad = torch.empty(shape)
                dist.recv(grad, base + rank + 1)
                out.backward(grad)
            x = inputs.pop(mb)
            if not stage.first:
                if x.grad is None:
                    raise RuntimeError(f"micro-batch {mb}: the stage's input got no gradient")
                pending.append(dist.isend(x.grad, base + rank - 1))

    m = run.microbatches
    if run.schedule == "afab":
        for mb in range(m):
            forward(mb)
        for mb in range(m):
            backward(mb)
    else:
        warmup = min(world - rank - 1, m)
        for mb in range(warmup):
            forward(mb)
        for i in range(m - warmup):
            forward(i + warmup)
            backward(i)
        for mb in range(m - warmup, m):
            backward(mb)
    return pending


def _worker(rank: int, run: PipelineRun, port: int) -> None:
    with process_group(rank, run.world * run.dp, port, pin=run.pin):
        stage_rank, replica = rank % run.world, rank // run.world
        # one gradient all-reduce group per stage, over its replicas (every rank creates every group)
        groups = [dist.new_group([r * run.world + s for r in range(run.dp)]) for s in range(run.world)] if run.dp > 1 else None
        torch.manual_seed(run.seed)  # every rank builds the same model, then keeps its stage
        cfg = sized(run.size, run.seq)
        stage = Stage(GPT(cfg), stage_rank, run.world, checkpointed=run.checkpoint)
        gen = torch.Generator().manual_seed(run.seed + replica)
        data = [synthetic_batch(cfg, run.batch, gen) for _ in range(run.microbatches)]
        shape = (run.batch, cfg.seq, cfg.width)
        opt = torch.optim.SGD(stage.parameters(), lr=0.01)
        injector = Injector(list(run.injections), rank, run.out)
        injector.attach(stage)
        for _ in profiled_steps(run, injector):
            for work in _train_step(stage, stage_rank, run.world, run, data, shape, base=replica * run.world):
                work.wait()
            if groups is not None:
                with phase("dp_allreduce"):
                    grads = [p.grad for p in stage.parameters() if p.grad is not None]
                    flat = torch.cat([g.reshape(-1) for g in grads])
                    dist.all_reduce(flat, group=groups[stage_rank])
                    flat /= run.dp
                    for g, v in zip(grads, flat.split([g.numel() for g in grads])):
                        g.copy_(v.view_as(g))
            with injector.phase("optimizer"):
                opt.step()
                opt.zero_grad()


def record(run: PipelineRun) -> Path:
    """Run the pipeline on ``run.world * run.dp`` local processes; returns the trace folder."""
    return spawn(_worker, run, run.world * run.dp)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--size", default="tiny", choices=sorted(SIZES))
    p.add_argument("--schedule", default="1f1b", choices=SCHEDULES)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas of the pipeline")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    record(PipelineRun(out=a.out, world=a.world, dp=a.dp, size=a.size, schedule=a.schedule, microbatches=a.microbatches, steps=a.steps))


if __name__ == "__main__":
    main()

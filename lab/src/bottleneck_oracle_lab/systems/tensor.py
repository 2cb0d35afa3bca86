"""Tensor-parallel training of the GPT (Megatron-style, gloo on CPU).

Each block's attention heads and MLP hidden units are split over the ranks: ``qkv`` and
``fc`` are column-parallel (each rank holds a slice of the output features), ``proj`` and
``out`` row-parallel (a slice of the input features), followed by an all-reduce of the
partial sums in the forward pass; the gradient of the block input is all-reduced in the
backward pass. Embedding, layer norms and head are replicated.

    python -m bottleneck_oracle_lab.systems.tensor --out traces/ --world 2
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from bottleneck_oracle_lab.systems.inject import Injection, Injector
from bottleneck_oracle_lab.systems.launch import process_group, profiled_steps, spawn, train_step
from bottleneck_oracle_lab.systems.model import GPT, MLP, SIZES, Attention, GPTConfig, synthetic_batch


class _CopyToParallel(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (the input feeds every rank's shard)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class _ReduceFromParallel(torch.autograd.Function):
    """All-reduce of the partial sums forward; identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def _shard(linear: nn.Linear, rank: int, world: int, dim: int) -> nn.Linear:
    """A column (dim=0: output features) or row (dim=1: input features) shard of a linear."""
    w = linear.weight.detach().chunk(world, dim=dim)[rank]
    out = nn.Linear(w.shape[1], w.shape[0], bias=linear.bias is not None and dim == 0)
    with torch.no_grad():
        out.weight.copy_(w)
        if dim == 0 and linear.bias is not None:
            out.bias.copy_(linear.bias.detach().chunk(world)[rank])
    return out


class ParallelAttention(nn.Module):
    def __init__(self, attn: Attention, cfg: GPTConfig, rank: int, world: int) -> None:
        super().__init__()
        self.heads = cfg.heads // world
        w = cfg.width
        # qkv is [q; k; v] along the outputs: shard each of the three, then stack them back
        weights, biases = attn.qkv.weight.detach().split(w), attn.qkv.bias.detach().split(w)
        self.qkv = nn.Linear(w, 3 * w // world)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([x.chunk(world)[rank] for x in weights]))
            self.qkv.bias.copy_(torch.cat([x.chunk(world)[rank] for x in biases]))
        self.proj = _shard(attn.proj, rank, world, dim=1)
        self.proj_bias = attn.proj.bias  # added once, after the reduction

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: x (batch, seq, width) -> (batch, seq, width)."""
        b, t, _ = x.shape
        x = _CopyToParallel.apply(x)
        q, k, v = self.qkv(x).chunk(3, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        return _ReduceFromParallel.apply(self.proj(y)) + self.proj_bias


class ParallelMLP(nn.Module):
    def __init__(self, mlp: MLP, rank: int, world: int) -> None:
        super().__init__()
        self.fc = _shard(mlp.fc, rank, world, dim=0)
        self.out = _shard(mlp.out, rank, world, dim=1)
        self.out_bias = mlp.out.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToParallel.apply(x)
        return _ReduceFromParallel.apply(self.out(F.gelu(self.fc(x)))) + self.out_bias


def parallelize(model: GPT, rank: int, world: int) -> GPT:
    """Replace every block's attention and MLP by their tensor-parallel shards, in place."""
    for block in model.layers:
        attn, mlp = block.attn, block.mlp
        if not isinstance(attn, Attention) or not isinstance(mlp, MLP):
            raise TypeError("parallelize shards a GPT's Attention and MLP blocks, once")
        block.attn = ParallelAttention(attn, model.cfg, rank, world)
        block.mlp = ParallelMLP(mlp, rank, world)
    return model


@dataclass(kw_only=True, slots=True)
class TensorRun:
    out: str
    """Folder for rank-N.json.gz (and run.yaml)."""
    world: int = 2
    size: str = "tiny"
    batch: int = 4
    steps: int = 3
    seed: int = 0
    injections: tuple[Injection, ...] = ()
    window: int | None = None
    """Write the trace in windows of this many steps, each as it ends (``oracle_profile``)."""

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"size must be one of {sorted(SIZES)} (found {self.size!r})")
        cfg = SIZES[self.size]
        if self.world < 2 or cfg.heads % self.world or (4 * cfg.width) % self.world:
            raise ValueError(f"world must be >= 2 and divide the heads ({cfg.heads}) (found {self.world})")


def _worker(rank: int, run: TensorRun, port: int) -> None:
    with process_group(rank, run.world, port):
        torch.manual_seed(run.seed)  # the same full model on every rank, then sharded
        cfg = SIZES[run.size]
        model = parallelize(GPT(cfg), rank, run.world)
        tokens, targets = synthetic_batch(cfg, run.batch, torch.Generator().manual_seed(run.seed))  # same data on every rank
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        injector = Injector(list(run.injections), rank, run.out)
        injector.attach(model)
        for _ in profiled_steps(run, injector):
            train_step(injector, lambda: model(tokens, targets), opt)


def record(run: TensorRun) -> Path:
    """Run the tensor-parallel job on ``run.world`` local processes; returns the trace folder."""
    return spawn(_worker, run)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--size", default="tiny", choices=sorted(SIZES))
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    record(TensorRun(out=a.out, world=a.world, size=a.size, steps=a.steps))


if __name__ == "__main__":
    main()

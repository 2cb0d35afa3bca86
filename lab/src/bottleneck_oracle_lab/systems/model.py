"""A GPT-style decoder (nanoGPT's structure) in three sizes for the reference workloads.

Module names follow the usual layout (``layers.3.attn``, ``layers.3.mlp``) so delay
injection can target them by pattern. Sizes are chosen so that one step of the largest
takes a few seconds at most on 2 CPU cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True, kw_only=True, slots=True)
class GPTConfig:
    vocab: int = 512  # synthetic tokens
    seq: int = 64
    layers: int = 2
    heads: int = 2
    width: int = 64

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width ({self.width}) must be a multiple of heads ({self.heads})")


SIZES = {
    "tiny": GPTConfig(layers=2, heads=2, width=64),
    "small": GPTConfig(layers=4, heads=4, width=128),
    "medium": GPTConfig(layers=6, heads=4, width=256, seq=128),
}


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: x (batch, seq, width) -> (batch, seq, width)."""
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.width, 4 * cfg.width)
        self.out = nn.Linear(4 * cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.width), nn.LayerNorm(cfg.width)
        self.attn, self.mlp = Attention(cfg), MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Parameter(torch.zeros(1, cfg.seq, cfg.width))
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        self.checkpointed = False
        """Activation checkpointing: each block's activations are recomputed in the backward pass."""
        nn.init.normal_(self.pos, std=1 / math.sqrt(cfg.width))

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Shapes: tokens, targets (batch, seq) int64 -> scalar cross-entropy loss."""
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        for layer in self.layers:
            x = run_block(layer, x, self.checkpointed)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def run_block(block: nn.Module, x: torch.Tensor, checkpointed: bool) -> torch.Tensor:
    """``block(x)``; with ``checkpointed`` (while training) its activations are not kept but recomputed in the backward pass."""
    if checkpointed and torch.is_grad_enabled():
        return cast(torch.Tensor, checkpoint(block, x, use_reentrant=False))
    return block(x)


def sized(size: str, seq: int | None = None) -> GPTConfig:
    """The configuration of a size from ``SIZES``, its sequence length replaced by ``seq`` when given."""
    cfg = SIZES[size]
    if seq is not None:
        if seq < 1:
            raise ValueError(f"seq must be >= 1 (found {seq})")
        cfg = replace(cfg, seq=seq)
    return cfg


def synthetic_batch(cfg: GPTConfig, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens and their next-token targets."""
    data = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1), generator=generator)
    return data[:, :-1], data[:, 1:]

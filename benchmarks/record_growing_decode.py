"""Record an autoregressive decode loop whose every step costs more than the one before: two
attention + MLP blocks over a key/value cache that grows by 13 positions a step (the new token and a
12-position chunk), batch 8, width 256, ``torch.no_grad()``, one intra-op thread; each
``prof.step()`` one generated token, 36 recorded.
    python benchmarks/record_growing_decode.py tests/data/own-cpu/growing_decode.json.gz
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import export_gzipped  # noqa: E402

BATCH, WIDTH, HEADS, LAYERS, PREFILL, CHUNK = 8, 256, 4, 2, 64, 12
WAIT, WARMUP, ACTIVE = 1, 1, 36


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(WIDTH, 3 * WIDTH), torch.nn.Linear(WIDTH, WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(), torch.nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor]) -> torch.Tensor:
        q, k, v = self.qkv(x).split(WIDTH, -1)
        cache[0], cache[1] = torch.cat([cache[0], k], 1), torch.cat([cache[1], v], 1)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(BATCH, -1, HEADS, WIDTH // HEADS).transpose(1, 2)

        att = torch.softmax(heads(q) @ heads(cache[0]).transpose(-1, -2) / (WIDTH // HEADS) ** 0.5, -1)
        x = x + self.out((att @ heads(cache[1])).transpose(1, 2).reshape(BATCH, 1, WIDTH))
        return x + self.mlp(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out", type=Path)
    out = ap.parse_args().out
    torch.set_num_threads(1)
    torch.manual_seed(0)
    blocks = [Block() for _ in range(LAYERS)]
    caches = [[torch.randn(BATCH, PREFILL, WIDTH), torch.randn(BATCH, PREFILL, WIDTH)] for _ in blocks]
    x = torch.randn(BATCH, 1, WIDTH)
    with (
        torch.no_grad(),
        profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE)) as prof,
    ):
        for _ in range(WAIT + WARMUP + ACTIVE):
            h = x
            for block, cache in zip(blocks, caches):
                cache[0] = torch.cat([cache[0], torch.randn(BATCH, CHUNK, WIDTH)], 1)
                cache[1] = torch.cat([cache[1], torch.randn(BATCH, CHUNK, WIDTH)], 1)
                h = block(h, cache)
            x = h / h.norm(dim=-1, keepdim=True)
            prof.step()
    out.parent.mkdir(parents=True, exist_ok=True)
    export_gzipped(prof, out)


if __name__ == "__main__":
    main()

"""Record one small self-attention block's inference loop on the CPU twice: attention written as
matmul and softmax (as older model code and many research repos have it), and the same attention
through ``torch.nn.functional.scaled_dot_product_attention`` (what Hugging Face models run by
default). The traces behind tests/data/own-cpu/ (tests/llm/test_premises.py: the SDPA advice is
for the first only).

    python benchmarks/record_attention.py tests/data/own-cpu
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule

from record_compiled import export_gzipped, out_folder

HEADS, SEQ, DIM, BATCH = 4, 512, 256, 2


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fused: bool) -> torch.Tensor:
    if fused:
        return F.scaled_dot_product_attention(q, k, v)
    scores = torch.matmul(q, k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    return torch.matmul(scores.softmax(dim=-1), v)


def _loop(fused: bool, out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    qkv, proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
    x = torch.randn(BATCH, SEQ, DIM)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for _ in range(5):
            q, k, v = qkv(x).view(BATCH, SEQ, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
            y = _attention(q, k, v, fused).transpose(1, 2).reshape(BATCH, SEQ, DIM)
            proj(y).sum().item()
            prof.step()
    export_gzipped(prof, out)


def main() -> None:
    out = out_folder(__doc__)
    _loop(False, out / "attention_eager.json.gz")
    _loop(True, out / "attention_sdpa.json.gz")


if __name__ == "__main__":
    main()

"""Record a small MLP's training loop on the CPU three times, its optimizer (AdamW) the step's
largest part: a Python loop over the parameters (``foreach=False``), the foreach implementation,
and the fused one. The traces behind tests/data/own-cpu/ (tests/llm/test_premises.py: the
optimizer recipe for the first two, not the third).

    python benchmarks/record_optimizer.py tests/data/own-cpu
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from record_compiled import export_gzipped, out_folder

LAYERS, WIDTH, BATCH = 24, 256, 8
MODES = {"for_loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def _loop(mode: str, out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **MODES[mode])
    x = torch.randn(BATCH, WIDTH)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for _ in range(5):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    export_gzipped(prof, out)


def main() -> None:
    out = out_folder(__doc__)
    for mode in MODES:
        _loop(mode, out / f"adamw_{mode}.json.gz")


if __name__ == "__main__":
    main()

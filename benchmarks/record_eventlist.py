"""Record a small training loop on the CPU and write it the way ``prof.events().export_chrome_trace()``
does (PyTorch's EventList export, the legacy autograd profiler's format: a bare array, no
categories, one process named "CPU functions"). The file behind
tests/data/own-cpu/eventlist/eventlist_export.json.gz (tests/analysis/test_invariance.py: said
what it is, with the export to use instead).

    python benchmarks/record_eventlist.py tests/data/own-cpu/eventlist
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "events.json"
        prof.events().export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(a.out / "eventlist_export.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)


if __name__ == "__main__":
    main()

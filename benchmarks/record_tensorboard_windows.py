"""Record a one-process training loop on the CPU as the PyTorch profiler tutorial does, with
``tensorboard_trace_handler`` and a schedule that repeats: ``schedule(wait=1, warmup=1, active=3,
repeat=2)`` writes one file per cycle, ``<host>_<pid>.<time>.pt.trace.json.gz``, and no file names
a rank (a job that is not distributed has no ``distributedInfo``). The folder behind
tests/data/own-cpu/tensorboard_windows (tests/analysis/test_unseen.py: read as two windows of one
rank).

    python benchmarks/record_tensorboard_windows.py tests/data/own-cpu/tensorboard_windows
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from record_compiled import out_folder  # (benchmarks/, beside this script)


def main() -> None:
    out = out_folder(__doc__)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    plan = schedule(wait=1, warmup=1, active=3, repeat=2)
    with profile(
        activities=[ProfilerActivity.CPU], schedule=plan, on_trace_ready=tensorboard_trace_handler(str(out), use_gzip=True)
    ) as prof:
        for _ in range(12):
            model(torch.randn(64, 256)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()


if __name__ == "__main__":
    main()

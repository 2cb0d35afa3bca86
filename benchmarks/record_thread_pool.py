"""Record a one-process training loop that hands its preprocessing to a thread pool, profiled twice: as is, and with every thread's ops.

Each of 8 profiled steps: the loop submits its batch's preprocessing (30 ``tanh(x @ w)`` of a
64 x 256 batch) to a one-thread ``ThreadPoolExecutor`` and waits on ``future.result()``, then a
256 -> 512 -> 256 MLP with GELU: forward, backward, SGD. The pool's thread starts at the first
submit, in the profiler's wait step, before recording begins: ``thread_pool.json.gz`` (the
profiler's default) holds none of its ops, and the loop's thread waits with nothing in the trace
to say for what; ``thread_pool_all_threads.json.gz`` is recorded with
``_ExperimentalConfig(profile_all_threads=True)`` and holds them.

    python benchmarks/record_thread_pool.py tests/data/own-cpu
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_compiled import export_gzipped, out_folder  # noqa: E402

STEPS = 8  # profiled steps
WAIT, WARMUP = 1, 1


def _record(out: Path, all_threads: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = torch.randn(256, 256) / 16

    def prep(x: torch.Tensor) -> torch.Tensor:
        for _ in range(30):
            x = torch.tanh(x @ w)
        return x

    config = _ExperimentalConfig(profile_all_threads=True) if all_threads else None
    with ThreadPoolExecutor(1) as pool:
        sched = schedule(wait=WAIT, warmup=WARMUP, active=STEPS)
        with profile(activities=[ProfilerActivity.CPU], schedule=sched, experimental_config=config) as prof:
            for _ in range(WAIT + WARMUP + STEPS):
                x = pool.submit(prep, torch.randn(64, 256)).result()
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                prof.step()
    export_gzipped(prof, out)


def main() -> None:
    out = out_folder(__doc__)
    torch.set_num_threads(1)
    _record(out / "thread_pool.json.gz", False)
    _record(out / "thread_pool_all_threads.json.gz", True)


if __name__ == "__main__":
    main()

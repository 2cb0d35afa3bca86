"""Where the step-to-step noise of a paired recording comes from, on this machine.

Issue 14's noise floor: the clean steps of a paired launch vary by about 15-20% (robust spread),
so two groups of them differ by 2-5% at the median. This script times, without the profiler,
the pieces a recorded step is made of, each in the recording's setting (two processes pinned to a
core each, one thread each, gloo on loopback), and reports each one's median, robust relative
spread (1.4826 x MAD / median), 10th and 90th percentile:

- ``matmul``: a fixed chain of 256x256 matmul + tanh on one core: the machine's own jitter;
- ``gpt local``: a training step of the tiny (or ``--size``) GPT on each rank, no communication;
- ``gpt ddp``: the same step under DistributedDataParallel (one gradient all-reduce);
- ``all_reduce X MB``: gloo's all-reduce alone, after a barrier.

Each probe with communication runs twice: with gloo's socket thread as gloo leaves it
(``busy loop``), and at idle priority as the recording protocol runs DDP
(``launch.idle_gloo_loops``, ``idle loop``).

    python benchmarks/noise_sources.py [--steps 200] [--size tiny] [--json out.json]

It needs torch (the recording extra) and a quiet machine, like the recording itself.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bottleneck_oracle_lab.systems.launch import free_port, idle_gloo_loops, process_group
from bottleneck_oracle_lab.systems.model import GPT, SIZES, synthetic_batch

WARMUP = 10


def figures(ms: list[float]) -> dict:
    x = np.array(ms[WARMUP:])
    m = float(np.median(x))
    return {
        "median_ms": m,
        "robust_spread": float(1.4826 * np.median(np.abs(x - m)) / m),
        "p10_ms": float(np.percentile(x, 10)),
        "p90_ms": float(np.percentile(x, 90)),
        "n": int(len(x)),
    }


def _matmul(steps: int, q) -> None:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)
    x = torch.randn(256, 256)
    ms = []
    for _ in range(steps + WARMUP):
        t = time.perf_counter()
        y = x
        for _ in range(60):
            y = torch.tanh(y @ x)
        ms.append(1e3 * (time.perf_counter() - t))
    q.put(("matmul", 0, figures(ms)))


def _worker(rank: int, probe: str, size: str, steps: int, mb: float, idle: bool, port: int, q) -> None:
    with process_group(rank, 2, port, pin=True):
        loop = ", idle loop" if idle else ", busy loop"
        if idle:
            idle_gloo_loops()
        ms = []
        if probe == "all_reduce":
            x = torch.randn(int(mb * 2**20 / 4))
            for _ in range(steps + WARMUP):
                dist.barrier()
                t = time.perf_counter()
                dist.all_reduce(x)
                ms.append(1e3 * (time.perf_counter() - t))
            q.put((f"all_reduce {mb:g} MB{loop}", rank, figures(ms)))
            return
        torch.manual_seed(0)
        cfg = SIZES[size]
        model: torch.nn.Module = GPT(cfg)
        tokens, targets = synthetic_batch(cfg, 4, torch.Generator().manual_seed(rank))
        if probe == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(steps + WARMUP):
            t = time.perf_counter()
            model(tokens, targets).backward()
            opt.step()
            opt.zero_grad()
            ms.append(1e3 * (time.perf_counter() - t))
        q.put((f"{size} gpt {probe}{loop if probe == 'ddp' else ''}", rank, figures(ms)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    rows = []

    def collect(n: int) -> None:
        for _ in range(n):
            name, rank, f = q.get()
            rows.append({"probe": name, "rank": rank, **f})
            print(
                f"{name:32s} rank {rank}: median {f['median_ms']:7.2f} ms, robust spread {100 * f['robust_spread']:5.1f}%, "
                f"p10 {f['p10_ms']:7.2f}, p90 {f['p90_ms']:7.2f} ms",
                flush=True,
            )

    p = ctx.Process(target=_matmul, args=(a.steps, q))
    p.start()
    collect(1)
    p.join()
    probes = [("local", 0.0, False)] + [
        (p, mb, idle) for p, mb in (("ddp", 0.0), ("all_reduce", 0.5), ("all_reduce", 4.0)) for idle in (False, True)
    ]
    for probe, mb, idle in probes:
        mp.start_processes(_worker, args=(probe, a.size, a.steps, mb, idle, free_port(), q), nprocs=2, start_method="spawn")
        collect(2)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": a.steps, "size": a.size, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

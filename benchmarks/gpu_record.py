"""Record the reference DDP job on a CUDA GPU: small test traces and paired conditions.

What a GPU shows that the CPU recordings cannot: kernels, their streams, the CPU waiting on the
GPU (``loss.item()`` every step, gloo's copies of the gradients through host memory), and
slowdowns that happen on the GPU (a device-side sleep after a module, before the all-reduce).
Both ranks share the machine's GPUs round-robin (``DDPRun.device``); gloo carries the gradients
(NCCL needs a GPU per rank).

    PYTHONPATH=src python benchmarks/gpu_record.py OUT [--sizes tiny small medium] [--budget-s 300]

OUT/env.json: the machine; OUT/fixtures/ddp_tiny_{stall,clean}: 6 steps of the tiny GPT, a 5 ms
GPU stall after ``layers.0.mlp`` on rank 1 at step 3 and its clean re-run; OUT/paired: the
paired conditions of ``generate --paired --device cuda`` (every kind on both ranks and
``--delays``), 8 conditions to a launch, size by size until ``--budget-s`` is spent.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

from bottleneck_oracle_lab.systems.ddp import DDPRun, record
from bottleneck_oracle_lab.systems.inject import Injection
from bottleneck_oracle_lab.systems.paired import KINDS, default_launches, generate_paired


def env() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda, "gpus": torch.cuda.device_count()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    try:
        out["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        out["nvidia_smi"] = f"not run: {exc}"
    return out


def stage(name: str, fn) -> bool:
    t0 = time.monotonic()
    try:
        fn()
    except Exception:  # noqa: BLE001 - the next stage still runs; the log says what broke
        print(f"[{name}] FAILED after {time.monotonic() - t0:.1f} s\n{traceback.format_exc()}", flush=True)
        return False
    print(f"[{name}] done in {time.monotonic() - t0:.1f} s", flush=True)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small", "medium"])
    ap.add_argument(
        "--delays", type=float, nargs="+", default=[5.0], help="ms per step of the paired conditions (each kind, rank and delay)"
    )
    ap.add_argument("--no-fixtures", action="store_true", help="record the paired conditions only")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="the kinds of paired condition recorded")
    ap.add_argument("--retries", type=int, default=0, help="re-recordings of a launch, and of a condition alone, above the 5%% bound")
    ap.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the same script on a machine without a GPU"
    )
    ap.add_argument("--budget-s", type=float, default=300.0, help="no paired launch starts after this many seconds")
    a = ap.parse_args()
    t0 = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    info = env()
    (a.out / "env.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info), flush=True)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: nothing recorded", flush=True)
        return 1
    fx = a.out / "fixtures"
    stall = (Injection(kind="module", target="layers.0.mlp", rank=1, step=3, delay_ms=5.0),)
    common = dict(world=2, steps=6, size="tiny", batch=4, bucket_mb=25.0, pin=True, device=a.device)
    if a.no_fixtures:
        ok = True
    else:
        ok = stage("fixture stall", lambda: record(DDPRun(out=str(fx / "ddp_tiny_stall"), injections=stall, **common)))
        stage("fixture clean", lambda: record(DDPRun(out=str(fx / "ddp_tiny_clean"), **common)))
    if not ok:  # gloo could not carry CUDA tensors here: one rank on NCCL, so that some GPU trace comes back
        one = {**common, "world": 1, "backend": "nccl" if a.device == "cuda" else "gloo"}
        stage("fixture one rank", lambda: record(DDPRun(out=str(fx / "ddp_tiny_one_rank"), injections=(), **one)))
        return 1
    done: list = []  # generate_paired rewrites paired.jsonl from every launch it is given (those recorded are kept)
    for size in a.sizes:
        if time.monotonic() - t0 > a.budget_s:
            print(f"[paired {size}] skipped: {time.monotonic() - t0:.0f} s spent", flush=True)
            continue
        launches = default_launches([size], ["dp2"], a.delays, per_launch=10_000, repeats=a.repeats, batch=4, device=a.device)
        conds = [c for la in launches for c in la.conditions if c.kind in a.kinds]
        done.extend(
            replace(launches[0], launch_id=f"{size}-dp2-{i // 8}", conditions=tuple(conds[i : i + 8]), seed=i // 8)
            for i in range(0, len(conds), 8)
        )

        def run() -> None:
            print(json.dumps(generate_paired(done, a.out / "paired", retries=a.retries)), flush=True)

        stage(f"paired {size}", run)
    print(f"all done in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

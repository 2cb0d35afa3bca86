"""Record a small MLP under torch.compile on the CPU, twice: the whole script profiled (its first
step compiles inside the window), and steps after a warm-up (compiled before the window). The
traces behind tests/data/own-cpu/ (tests/analysis/test_unseen.py: one-time work said).

    python benchmarks/record_compiled.py tests/data/own-cpu
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule


def _loop(whole: bool, out: Path) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    compiled = torch.compile(model)
    x = torch.randn(64, 256)
    plan = None if whole else schedule(wait=1, warmup=1, active=3)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan) as prof:
        for _ in range(5):
            compiled(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    export_gzipped(prof, out)


def export_gzipped(prof: profile, out: Path) -> None:
    """The profiler's Chrome trace, unchanged, gzipped to ``out``."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)


def ddp_mlp(width: int = 256, hidden: int = 512) -> torch.nn.parallel.DistributedDataParallel:
    """The gloo recorders' model: a ``width`` -> ``hidden`` -> ``width`` MLP with GELU under
    DistributedDataParallel (the process group initialised: record_gloo_job)."""
    return torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, width))
    )


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    """One training step of the recorders' jobs: the mean square of ``model(x)`` as the loss,
    ``zero_grad``, backward, the optimizer's step; returns the model's output."""
    y = model(x)
    loss = y.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return y


def profiled_steps(step: Callable[[int], None], steps: int, wait: int = 1, warmup: int = 1) -> profile:
    """Run ``step(i)`` for ``i`` in ``range(wait + warmup + steps)`` under the profiler (the CPU
    activity, shapes recorded, ``schedule(wait=wait, warmup=warmup, active=steps)``), calling
    ``prof.step()`` after each; return the profiler (its trace holds the last ``steps`` steps)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=wait, warmup=warmup, active=steps)) as prof:
        for i in range(wait + warmup + steps):
            step(i)
            prof.step()
    return prof


def record_gloo_job(job: Callable[[int], profile], doc: str | None, port: int, world: int = 2) -> None:
    """Run ``job(rank)`` — it records its loop and returns its profiler — in ``world`` processes of
    one gloo job on this machine (one intra-op thread each, ``port`` for the rendezvous), and write
    each rank's trace, unchanged and gzipped, to ``rank-N.json.gz`` in the folder the script was
    given (out_folder, ``doc`` its help)."""
    out = out_folder(doc)
    mp.spawn(_gloo_rank, args=(job, str(out), port, world), nprocs=world, join=True)


def _gloo_rank(rank: int, job: Callable[[int], profile], out: str, port: int, world: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    export_gzipped(job(rank), Path(out) / f"rank-{rank}.json.gz")
    dist.destroy_process_group()


def out_folder(doc: str | None) -> Path:
    """The folder a recording script was given (its one argument, made if missing), with the
    script's docstring's first line as its help."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("out", type=Path)
    out: Path = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    return out


def main() -> None:
    out = out_folder(__doc__)
    _loop(True, out / "compiled_mlp_whole_script.json.gz")
    torch._dynamo.reset()
    _loop(False, out / "compiled_mlp_after_warmup.json.gz")


if __name__ == "__main__":
    main()

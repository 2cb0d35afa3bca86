"""Profiler hook usable around any training loop.

``oracle_profile`` wraps ``torch.profiler.profile`` with the schedule, the
per-rank file naming (``rank-N.json.gz``, HTA's convention) and the step
markers that the graph builder expects. Use it in a plain ``torchrun`` script::

    with oracle_profile("traces/", steps=3, warmup=1) as prof:
        for batch in loader:
            with phase("forward"):
                loss = model(batch)
            with phase("backward"):
                loss.backward()
            with phase("optimizer"):
                opt.step()
            prof.step()

Each profiled step appears as a ``ProfilerStep#N`` span in the trace.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function, schedule

from bottleneck_oracle.atomic import atomic_path


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def phase(name: str) -> contextlib.AbstractContextManager:
    """A ``record_function`` marker (forward / backward / optimizer / microbatch)."""
    return record_function(name)


def _write_trace(out_dir: Path, rank: int, prof: torch.profiler.profile) -> Path:
    """Export the trace, gzip it and move it into place atomically."""
    final = out_dir / f"rank-{rank}.json.gz"
    with tempfile.TemporaryDirectory() as tmp, atomic_path(final) as packed:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(packed, "wb", compresslevel=5) as dst:
            shutil.copyfileobj(src, dst)
    return final


@contextlib.contextmanager
def oracle_profile(
    out_dir: str | os.PathLike,
    steps: int = 3,
    warmup: int = 1,
    wait: int = 0,
    cuda: bool | None = None,
    execution_trace: bool = False,
) -> Iterator[torch.profiler.profile]:
    """Profile ``steps`` training steps after ``wait`` + ``warmup`` ones.

    Call ``prof.step()`` once per training step. The trace of this rank is
    written to ``out_dir/rank-<rank>.json.gz`` when the active steps end; with
    ``execution_trace`` the PyTorch execution trace of the same steps goes to
    ``out_dir/et/rank-<rank>.json`` (pass that folder to ``analyze --et``).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1 (found {steps})")
    activities = [ProfilerActivity.CPU]
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    out = Path(out_dir)
    rank = _rank()

    def on_ready(prof: torch.profiler.profile) -> None:
        _write_trace(out, rank, prof)

    observer = None
    if execution_trace:
        (out / "et").mkdir(parents=True, exist_ok=True)
        observer = ExecutionTraceObserver().register_callback(str(out / "et" / f"rank-{rank}.json"))
    with profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=on_ready,
        record_shapes=True,
        execution_trace_observer=observer,
    ) as prof:
        yield prof

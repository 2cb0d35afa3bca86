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
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ExecutionTraceObserver, ProfilerAction, ProfilerActivity, profile, record_function

from bottleneck_oracle.atomic import atomic_path


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def phase(name: str) -> contextlib.AbstractContextManager:
    """A ``record_function`` marker (forward / backward / optimizer / microbatch)."""
    return record_function(name)


def window_name(rank: int, window: int | None) -> str:
    """A rank's trace file: ``rank-<rank>.json.gz``, or with several profiling windows
    ``rank-<rank>.w<window>.json.gz`` (window 1, 2, ...). The loader takes a rank's windows as one
    trace of that rank."""
    return f"rank-{rank}.json.gz" if window is None else f"rank-{rank}.w{window:04d}.json.gz"


def _write_trace(out_dir: Path, rank: int, prof: torch.profiler.profile, window: int | None = None) -> Path:
    """Export the trace, gzip it and move it into place atomically."""
    final = out_dir / window_name(rank, window)
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
    window: int | None = None,
) -> Iterator[torch.profiler.profile]:
    """Profile ``steps`` training steps after ``wait`` + ``warmup`` ones.

    Call ``prof.step()`` once per training step. The trace of this rank is
    written to ``out_dir/rank-<rank>.json.gz`` when the active steps end; with
    ``execution_trace`` the PyTorch execution trace of the same steps goes to
    ``out_dir/et/rank-<rank>.json`` (pass that folder to ``analyze --et``).

    ``window``: for long recordings, write the steps in windows of this many
    (``rank-<rank>.w0001.json.gz``, ...), each as soon as it ends. The profiler
    otherwise keeps every event until the last step, which for a few thousand
    steps of a small model is several GB per rank. Consecutive windows follow
    each other with no step left out, but the step after each window's end
    carries the time its export took on this rank.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1 (found {steps})")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 (found {window})")
    if window is not None and execution_trace:
        raise ValueError("an execution trace is recorded in one window: pass window=None with execution_trace")
    if window is not None and window >= steps:
        window = None  # one window: the usual file name
    activities = [ProfilerActivity.CPU]
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    out = Path(out_dir)
    rank = _rank()

    written = [0]

    def on_ready(prof: torch.profiler.profile) -> None:
        written[0] += 1
        _write_trace(out, rank, prof, None if window is None else written[0])

    def action(step: int) -> ProfilerAction:
        """wait, warmup, then the active steps: RECORD_AND_SAVE on the last step of each window."""
        k = step - wait - warmup
        if k < 0:
            return ProfilerAction.NONE if step < wait else ProfilerAction.WARMUP
        if k >= steps:
            return ProfilerAction.NONE
        last = k == steps - 1 or (window is not None and (k + 1) % window == 0)
        return ProfilerAction.RECORD_AND_SAVE if last else ProfilerAction.RECORD

    observer = None
    if execution_trace:
        (out / "et").mkdir(parents=True, exist_ok=True)
        observer = ExecutionTraceObserver().register_callback(str(out / "et" / f"rank-{rank}.json"))
    with (
        warnings.catch_warnings(),
        profile(
            activities=activities,
            schedule=action,
            on_trace_ready=on_ready,
            record_shapes=True,
            execution_trace_observer=observer,
        ) as prof,
    ):
        # windows are meant to let each other's events go
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle")
        yield prof

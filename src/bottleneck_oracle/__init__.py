"""BottleneckOracle: critical path, slack and bottlenecks of (distributed) training steps.

The Python API (the CLI is thin over it)::

    import bottleneck_oracle as bo

    table, steps = bo.analyze("traces/")          # per step: StepAnalysis (step time, path, slack)
    answer = bo.run_answer(steps, "traces/")      # the run-level answer the CLI prints first
    rows = bo.whatif("traces/", ["name~=all_reduce,scale=0.5"])
    blamed = bo.blame("traces/", baseline="last_good_run/")
    change = bo.compare("before/", "after/")
    summary = bo.summary("traces/")
    doc = bo.to_json(rows[0])                     # any result as its command's --json prints it

Each is documented in ``bottleneck_oracle.api`` (and ``analysis.answer.run_answer``,
``serial.to_json``); the names are imported on first use, so ``import bottleneck_oracle`` stays
light.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "advise", "analyze", "blame", "build", "compare", "load", "run_answer", "summary", "to_json", "whatif"]

_API = {"advise", "analyze", "blame", "build", "compare", "load", "summary", "whatif"}


def __getattr__(name: str) -> Any:
    if name in _API:
        from bottleneck_oracle import api

        return getattr(api, name)
    if name == "run_answer":
        from bottleneck_oracle.analysis.answer import run_answer

        return run_answer
    if name == "to_json":
        from bottleneck_oracle.serial import to_json

        return to_json
    raise AttributeError(f"module 'bottleneck_oracle' has no attribute {name!r}")

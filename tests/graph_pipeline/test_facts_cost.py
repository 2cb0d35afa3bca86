"""A step's facts cost what the step holds, not what the trace holds: the per-step setup figure had
measured each step's runtime calls against every device op of the trace (sorted again per step), so
a one-rank trace of 16 M events took 290 s where it took 50 s before."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from bottleneck_oracle.graph_pipeline.events import load_events
from bottleneck_oracle.graph_pipeline.facts import index_facts, step_facts

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from synth_trace import EVENTS_PER_STEP, generate  # noqa: E402


def _median_facts_s(folder: Path, steps: int) -> float:
    generate(folder, events=steps * EVENTS_PER_STEP, ranks=1, layers=2, buckets=1)  # (steps = events / EVENTS_PER_STEP)
    table = load_events(folder)
    index_facts(table)
    middle = table.steps[len(table.steps) // 2].number
    times = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(5):
            step_facts(table, middle)
        times.append((time.perf_counter() - t) / 5)
    return statistics.median(times)


def test_a_step_s_facts_do_not_grow_with_the_trace(tmp_path):
    short = _median_facts_s(tmp_path / "short", 100)
    long = _median_facts_s(tmp_path / "long", 4000)  # 40x the steps, the device ops, the runtime calls
    assert long < 2.5 * short + 0.0003, (short, long)  # (it was 8x at 9670115: linear in the trace, once per step)

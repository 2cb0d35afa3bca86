"""Work the step's thread hands to another thread and waits for: where the trace holds that
thread's ops, the critical path runs through them; where the profiler left the thread out, the
wait is untraced and the advice says how to record it.

The oracle is the raw trace: our own loop (``benchmarks/record_thread_pool.py``) that submits its
preprocessing to a one-thread pool and waits on ``future.result()`` every step, recorded with the
profiler's defaults (``own-cpu/thread_pool.json.gz``: the pool's thread started before recording
and none of its ops are in the trace) and with ``profile_all_threads=True``
(``own-cpu/thread_pool_all_threads.json.gz``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from bottleneck_oracle.analysis.answer import run_answer
from conftest import DATA, cached_analyses

POOL = DATA / "own-cpu" / "thread_pool.json.gz"
ALL_THREADS = DATA / "own-cpu" / "thread_pool_all_threads.json.gz"


def _helper_busy(path: Path) -> dict[int, float]:
    """Per ProfilerStep number: the time (µs) threads other than the step's own were inside ops
    during its span (the union), read from the JSON."""
    ev = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
    out = {}
    for s in (e for e in ev if str(e["name"]).startswith("ProfilerStep#")):
        lo, hi = float(s["ts"]), float(s["ts"]) + float(s["dur"])
        spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev if e["tid"] != s["tid"] and lo <= float(e["ts"]) < hi)
        busy, cursor = 0.0, -float("inf")
        for a, b in spans:
            if b > cursor:
                busy += b - max(a, cursor)
                cursor = b
        out[int(str(s["name"]).split("#")[1])] = busy
    return out


def test_the_path_runs_through_the_work_another_thread_did_for_the_step():
    """Recorded with every thread's ops, the pool's thread is busy 4.0-4.3 ms of each 6.3-6.5 ms
    step while the loop waits: at least 90% of that time is on the critical path as compute on the
    pool's thread, and the run is bound by CPU compute with no untraced time to speak of."""
    busy = _helper_busy(ALL_THREADS)
    assert all(b > 3000.0 for b in busy.values())
    analyses = cached_analyses(ALL_THREADS)
    for a in analyses:
        main = {s.tid for s in a.segments() if s.name.startswith("aten::addmm")}
        on_helper = sum(s.dur for s in a.segments() if s.kind == "op" and s.tid not in main)
        assert on_helper >= 0.9 * busy[a.graph.step], (a.graph.step, on_helper, busy[a.graph.step])
        assert a.untraced_us < 0.05 * a.step_time
    ans = run_answer(list(analyses))
    assert ans.bound == "CPU compute"


def test_a_thread_the_profiler_left_out_is_untraced_and_the_advice_says_how_to_record_it():
    """The profiler's defaults leave the pool's thread out (no event of another thread): the
    loop's wait is untraced time, the run is bound by it, and the advice to see it names
    ``profile_all_threads`` and ``with_stack`` (its recipe's remedy) beside ``record_function``."""
    from bottleneck_oracle.api import advise
    from bottleneck_oracle.llm.graphrag import run_advice

    assert not any(_helper_busy(POOL).values())
    ans = run_answer(list(cached_analyses(POOL)))
    assert ans.bound == "untraced time"
    run = run_advice([r.advice for r in advise(POOL)])
    top = run[0]
    assert top.source == "untraced-host-time"
    assert "profile_all_threads=True" in top.remedy and "with_stack=True" in top.remedy

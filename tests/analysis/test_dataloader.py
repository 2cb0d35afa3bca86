"""A loop waiting for its DataLoader's workers: the wait is waiting (not untraced time), the run is
bound by data loading, the facts read the wait from the raw events, and a ``module=`` edit of the
loader's range takes its whole time, the wait before the batch's first op included.

The oracle is the raw trace: our own 2-rank gloo DDP job (tests/data/own-cpu/dataloader_starved,
``benchmarks/record_dataloader.py``, recorded without ``with_stack``) whose rank 1 reads its
batches through one DataLoader worker that takes 20 ms a batch; inside the loader's ``__next__``
range the loop's thread runs nothing but the batch's rebuild (``aten::empty``/``aten::set_``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bottleneck_oracle.analysis.answer import run_answer
from bottleneck_oracle.analysis.segments import LOADER_WAIT
from conftest import DATA, cached_analyses

STARVED = DATA / "own-cpu" / "dataloader_starved"
NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _raw(path: Path) -> dict[int, dict]:
    """Per ProfilerStep number of one rank's file: the ``__next__`` ranges' durations (µs) and the
    stretches inside them with no other event of the thread open, each 1 ms or more, read from
    the JSON."""
    ev = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
    out = {}
    for s in (e for e in ev if str(e["name"]).startswith("ProfilerStep#")):
        lo, hi = float(s["ts"]), float(s["ts"]) + float(s["dur"])
        ranges = [e for e in ev if e["name"] == NEXT and e["tid"] == s["tid"] and lo <= float(e["ts"]) < hi]
        waits = []
        for r in ranges:
            a, b = float(r["ts"]), float(r["ts"]) + float(r["dur"])
            inside = sorted(
                (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                for e in ev
                if e is not r and e["tid"] == r["tid"] and a <= float(e["ts"]) < b
            )
            cursor = a
            for x, y in [*inside, (b, b)]:
                if x - cursor >= 1000.0:
                    waits.append(x - cursor)
                cursor = max(cursor, y)
        out[int(str(s["name"]).split("#")[1])] = {"next": [float(r["dur"]) for r in ranges], "waits": waits}
    return out


def test_the_facts_read_the_wait_for_the_workers_from_the_raw_events():
    """Per rank and step, the facts' loader_waits are the stretches the raw events show: inside
    the ``__next__`` range, nothing else of the thread open, 1 ms or more."""
    for rank in (0, 1):
        raw = _raw(STARVED / f"rank-{rank}.json.gz")
        for a in cached_analyses(STARVED):
            facts = a.graph.info.facts
            assert facts is not None
            (f,) = [x for x in facts.ranks if x.rank == rank]
            got = sorted(hi - lo for lo, hi in f.loader_waits)
            assert got == pytest.approx(sorted(raw[a.graph.step]["waits"]), abs=0.01)


def test_the_wait_is_waiting_for_the_workers_not_untraced_time():
    """The stretches the facts read are, on the critical path, the loop waiting for the loader's
    workers: at least 95% of the path's time in them is that wait, none of it untraced, in every
    step; the loader_wait check holds and no warning calls the time untraced. (Before: 'untraced
    (no traced cause)' in every step, the run bound by untraced time.)"""
    analyses = cached_analyses(STARVED)
    waited = on_path = 0.0
    for a in analyses:
        facts = a.graph.info.facts
        assert facts is not None
        for f in facts.ranks:
            for lo, hi in f.loader_waits:
                for s in a.segments():
                    if s.rank == f.rank and not s.on_gpu:
                        part = max(0.0, min(s.end, hi) - max(s.start, lo))
                        on_path += part
                        waited += part if s.kind == "wait" and s.name == LOADER_WAIT else 0.0
                        assert not (part > 0 and s.kind == "untraced"), (a.graph.step, s)
        checks = [c for c in a.checks() if c.name == "loader_wait"]
        assert checks and all(c.ok for c in checks), (a.graph.step, checks)
        assert not any("untraced" in w and "DataLoader" in w for w in a.warnings())
    assert on_path > 100_000.0  # (rank 1's wait is on the path: over 100 ms of the 12 steps)
    assert waited >= 0.95 * on_path


def test_the_run_is_bound_by_data_loading_on_the_starved_rank():
    """The run answer: bound by data loading (rank 1's wait is most of every step: raw 11–18 ms
    of 17–30 ms steps), rank 1 the straggler, and its loader's ``__next__`` where it differs."""
    ans = run_answer(list(cached_analyses(STARVED)))
    assert ans.bound == "data loading"
    assert ans.input_pipeline is not None and ans.input_pipeline.median_us >= 0.5 * ans.step_time.median_us
    assert ans.straggler is not None and ans.straggler.rank == 1
    assert ans.region is not None and ans.region.rank == 1 and ans.region.name == NEXT
    assert any(line.startswith("Bound by: data loading") for line in ans.lines())


def test_a_module_edit_of_the_loader_takes_its_whole_time():
    """``module=enumerate(DataLoader)#*,scale=0`` on rank 1's file alone (the range opens its steps:
    everything after it moves up by its length) saves each step's raw ``__next__`` duration, the
    wait before the batch's first op included; ``scale=0.5`` half of it. (Before: the ops inside
    only, under 0.1 ms a step.)"""
    from bottleneck_oracle.api import whatif

    path = STARVED / "rank-1.json.gz"
    raw = _raw(path)
    for scale in (0.0, 0.5):
        rows = whatif(path, [f"module=enumerate(DataLoader)#*,scale={scale:g}"])
        assert len(rows) == len(raw)
        for row in rows:
            (dur,) = raw[row.step]["next"]
            assert -row.replay.delta_us == pytest.approx((1.0 - scale) * dur, rel=0.03, abs=30.0), row.step


def test_advise_names_data_loading_and_no_untraced_time():
    """The advice for the run: data loading first, saving most of the step; no suggestion to trace
    'untraced' time that is the wait, and the occasional-work suggestion does not take the
    loader's steps for an evaluation's."""
    from bottleneck_oracle.api import advise
    from bottleneck_oracle.llm.graphrag import SLOW_STEPS_SOURCE, run_advice

    rows = advise(STARVED)
    run = run_advice([r.advice for r in rows])
    assert run[0].source == "dataloader-stall" and run[0].steps == len(rows)
    assert run[0].share >= 0.5
    assert not any(s.source in ("untraced-host-time", SLOW_STEPS_SOURCE) for s in run)

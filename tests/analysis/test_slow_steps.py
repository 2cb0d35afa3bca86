"""Steps that are slow every so often (an evaluation, a checkpoint every N steps): the step time of
a job of several ranks adds up to the run's time, the run answer names the slow steps and what
is in them, and summary says it per outlier.

The oracle is the raw trace: our own 2-rank gloo DDP job (tests/data/own-cpu/periodic_eval,
``benchmarks/record_periodic.py``) whose rank 0 evaluates the model inside
``record_function("evaluate")`` after every fourth step; rank 1 goes on and waits for it at the
next step's all-reduce."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from bottleneck_oracle.analysis.answer import SlowCause, StepFigures, _slow_steps, named_cause, run_answer
from conftest import DATA, cached_analyses

PERIODIC = DATA / "own-cpu" / "periodic_eval"
CLEAN = DATA / "gloo_ddp_8steps_clean"
STRAGGLER = DATA / "gloo_ddp_8steps_straggler"  # rank 1 slow in every step: no step is slow against the others
INJECTED = DATA / "gloo_ddp_10steps_injected"  # rank 1 sleeps 30 ms in its forward at steps 4 and 8


def _raw(folder: Path) -> dict[int, dict]:
    """Per rank: its ProfilerStep spans {number: (start, end)} and its evaluate annotations
    {step number: µs}, read from the JSON."""
    out = {}
    for f in sorted(folder.glob("rank-*.json.gz")):
        ev = json.loads(gzip.open(f).read())["traceEvents"]
        steps = {
            int(e["name"].split("#")[1]): (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            for e in ev
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
        }
        evals = {}
        for e in ev:
            if e.get("ph") == "X" and e.get("name") == "evaluate":
                (n,) = [k for k, (a, b) in steps.items() if a <= e["ts"] < b]
                evals[n] = float(e["dur"])
        out[int(f.name.split("-")[1].split(".")[0])] = {"steps": steps, "evaluate": evals}
    return out


def test_the_steps_of_several_ranks_add_up_to_the_run_s_time():
    """From the raw spans: the job finished step N when its last rank did. Each step after the
    first is read from the last rank's end of the step before to the last rank's end of its own,
    so the step times from the second to the last add up to the time from the first step's end
    to the last one's (within 1%: a step's graph ends at its last op, a few µs before its span).
    Taking each rank's own span, the longest, counted rank 0's evaluation twice: in its step and
    in rank 1's next step, which waited for it at the all-reduce."""
    raw = _raw(PERIODIC)
    numbers = sorted(raw[0]["steps"])
    end = {n: max(r["steps"][n][1] for r in raw.values()) for n in numbers}
    analyses = {a.graph.step: a for a in cached_analyses(PERIODIC)}
    later = numbers[1:]
    total = sum(analyses[n].step_time for n in later)
    assert total == pytest.approx(end[numbers[-1]] - end[numbers[0]], rel=0.01)
    longest = sum(max(r["steps"][n][1] - r["steps"][n][0] for r in raw.values()) for n in later)
    assert longest > 1.1 * total  # (the old reading: the run's time and more)
    for n in later:  # a step read whole: span and period agree on this CPU job
        a = analyses[n]
        assert a.measured == pytest.approx(end[n] - max(r["steps"][n][0] for r in raw.values()), rel=1e-6)


def test_the_run_answer_names_the_evaluation_steps_and_the_evaluation():
    """The slow steps are the steps in which rank 0 evaluated (every fourth), their cause rank 0's
    evaluate range with its time on the critical path the raw annotations' mean (the path runs
    through all of it: rank 1 waits), and what they add to the mean step is the steps' mean less
    the others' median."""
    raw = _raw(PERIODIC)
    evals = raw[0]["evaluate"]
    assert len(evals) >= 3 and not raw[1]["evaluate"]
    answer = run_answer(list(cached_analyses(PERIODIC)))
    s = answer.slow_steps
    assert s is not None
    assert s.steps == sorted(evals) and s.every == 4
    assert s.cause is not None and (s.cause.rank, s.cause.name, s.cause.kind) == (0, "evaluate", "range")
    assert s.cause.slow_us == pytest.approx(float(np.mean(list(evals.values()))), rel=0.05)
    assert s.cause.typical_us == 0.0
    times = [a.step_time for a in cached_analyses(PERIODIC)][1:]  # (the first step: warm-up)
    others = [t for a, t in zip(cached_analyses(PERIODIC)[1:], times) if a.graph.step not in evals]
    assert s.others_us == pytest.approx(float(np.median(others)))
    assert s.added_us == pytest.approx(float(np.mean(times)) - float(np.median(others)))
    text = "\n".join(answer.lines())
    assert "Slow steps: " in text and "(every 4th)" in text and "rank 0's evaluate" in text


def test_summary_names_the_evaluation_in_each_outlier():
    from bottleneck_oracle import api

    evals = _raw(PERIODIC)[0]["evaluate"]
    s = api.summary(PERIODIC)
    for x in s.steps:
        if x.step in evals:
            assert x.outlier and x.in_it is not None and (x.in_it.rank, x.in_it.name) == (0, "evaluate")
            assert x.in_it.slow_us == pytest.approx(evals[x.step], rel=0.05)


@pytest.mark.parametrize("path", [CLEAN, STRAGGLER], ids=lambda p: p.name)
def test_runs_without_occasional_slow_steps_name_none(path):
    assert run_answer(list(cached_analyses(path))).slow_steps is None


def test_the_injected_sleeps_are_the_slow_steps_of_the_injected_run():
    """Rank 1 sleeps 30 ms in its forward at steps 4 and 8 (its run.yaml): those are the slow
    steps, and the injected range on rank 1 is what is in them."""
    s = run_answer(list(cached_analyses(INJECTED))).slow_steps
    assert s is not None and s.steps == [4, 8] and s.every is None
    assert s.cause is not None and s.cause.rank == 1 and s.cause.name.startswith("oracle_inject:")
    assert 25_000 <= s.cause.slow_us - s.cause.typical_us <= 35_000


def _fig(step: int, us: float, named=()) -> StepFigures:
    return StepFigures(step, (0,), False, us, us, {}, None, named=tuple(named))


def test_a_gradient_accumulation_loop_s_optimizer_steps_are_every_4th():
    """``own-cpu/grad_accum_gloo`` (``benchmarks/record_grad_accum.py``): profiled per micro-batch,
    every fourth step all-reduces the gradients and steps the optimizer, 1.5-3 times the others
    (raw: the steps holding an ``Optimizer.step``), and step 4 holds DDP's one-off bucket rebuild
    (a ``gloo:broadcast``). The run answer names the optimizer steps every 4th and step 4 besides
    (before: "3, 4, 11", the 9.9 and 8.2 ms optimizer steps under twice the others' median)."""
    folder = DATA / "own-cpu" / "grad_accum_gloo"
    optimizer, once = set(), set()
    for f in sorted(folder.glob("rank-*.json.gz")):
        ev = [e for e in json.loads(gzip.open(f).read())["traceEvents"] if e.get("ph") == "X"]
        steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith("ProfilerStep#")}

        def where(e: dict, steps: dict = steps) -> int:
            (n,) = [k for k, (a, b) in steps.items() if a <= e["ts"] < b]
            return n

        optimizer |= {where(e) for e in ev if e["name"].startswith("Optimizer.step#")}
        once |= {where(e) for e in ev if e["name"] == "gloo:broadcast"}
    assert optimizer == {3, 7, 11, 15} and once == {4}
    answer = run_answer(list(cached_analyses(folder)))
    s = answer.slow_steps
    assert s is not None and set(s.steps) == optimizer | once and s.every == 4
    text = "\n".join(answer.lines(width=200))
    assert "Slow steps: 3, 7, 11, 15 (every 4th) and 4 take" in text


def test_the_cause_of_a_period_s_steps_is_what_they_hold_not_a_one_off_s():
    """Every 4th step holds a 6 ms ``optimizer`` range; step 4 once a 40 ms ``rebuild``: the slow
    steps are both, and what is in the every-4th ones is the optimizer (constructed figures;
    read over all five, the rebuild's 8 ms a slow step named it)."""
    figs = []
    for k in range(2, 18):
        named = [(0, "forward", 0, 3e3)]
        us = 4.0e3
        if k % 4 == 3:
            named.append((0, "optimizer", 0, 6e3))
            us += 6e3
        if k == 4:
            named.append((0, "rebuild", 0, 40e3))
            us += 40e3
        figs.append(_fig(k, us, named))
    s = _slow_steps(figs)
    assert s is not None and s.steps == [3, 4, 7, 11, 15] and s.every == 4
    assert s.cause is not None and s.cause.name == "optimizer"


def test_slow_steps_need_enough_steps_and_must_be_a_minority():
    few = [_fig(1, 10.0e3), _fig(2, 10.0e3), _fig(3, 50.0e3)]
    assert _slow_steps(few) is None  # three steps: too few to set the others' median
    half = [_fig(k, 50.0e3 if k % 2 else 10.0e3) for k in range(1, 9)]
    assert _slow_steps(half) is None  # half the steps: that is how the run goes, not an exception
    small = [_fig(k, 10.4e3 if k == 3 else 10.0e3) for k in range(1, 9)]
    assert _slow_steps(small) is None  # 4% slower: noise
    one = [_fig(k, 30.0e3 if k == 5 else 10.0e3) for k in range(1, 9)]
    s = _slow_steps(one)
    assert s is not None and s.steps == [5] and s.every is None and s.added_us == pytest.approx(20.0e3 / 8)


def test_slow_steps_are_slow_against_the_others():
    """A gradient-accumulation loop profiled per micro-batch (a 2-rank DDP job, every 4th step
    all-reduces and steps the optimizer; its step times as analysed, in ms): step 15 at 13.2 ms is
    under twice the median of all 15 steps (6.8) but over twice the others' (6.4): it is one of
    them (it was left out, and "every 4th" named three)."""
    ms = [19.4, 6.2, 6.4, 6.0, 17.9, 5.4, 5.6, 5.8, 15.0, 7.2, 7.3, 6.4, 13.2, 9.8, 7.4]
    figures = [_fig(k, v * 1e3) for k, v in zip(range(3, 18), ms)]
    s = _slow_steps(figures)
    assert s is not None and s.steps == [3, 7, 11, 15] and s.every == 4
    assert s.others_us == pytest.approx(float(np.median([v for v in ms if v < 13]) * 1e3))


def test_the_named_cause_prefers_a_marked_range_and_needs_half_the_excess():
    slow = [[(0, "train.py(10): <module>", 1, 30e3), (0, "save_checkpoint", 0, 19e3), (0, "aten::copy_", 2, 18e3)]]
    others = [[(0, "train.py(10): <module>", 1, 10e3)]] * 3
    assert named_cause(slow, others, 20e3) == SlowCause(0, "save_checkpoint", "range", 19e3, 0.0)
    assert named_cause(slow, others, 40e3).kind == "frame"  # the range explains under half: the frame does
    assert named_cause(slow, others, 200e3) is None  # nothing explains half of it


def test_advise_puts_the_evaluation_first_and_its_replay_saves_what_it_took():
    """``advise`` on the evaluation run: its first suggestion across the run takes rank 0's evaluate
    off the slow steps (``module=evaluate,rank=0,scale=0``), in the evaluation steps only, and the
    replay saves each step the evaluation's own time (raw annotations) within 10%: rank 1 waits
    for all of it. No recipe of an op's symptoms named it before."""
    from bottleneck_oracle import api
    from bottleneck_oracle.llm.graphrag import SLOW_STEPS_SOURCE, run_advice

    evals = _raw(PERIODIC)[0]["evaluate"]
    rows = api.advise(PERIODIC)
    first = run_advice([r.advice for r in rows])[0]
    assert first.source == SLOW_STEPS_SOURCE and first.edits == ["module=evaluate,rank=0,scale=0"]
    assert first.steps == len(evals)
    for r in rows:
        mine = [s for s in r.advice.suggestions if s.source == SLOW_STEPS_SOURCE]
        assert bool(mine) == (r.advice.step in evals), r.advice.step
        if mine:
            assert mine[0].replay_saving_us == pytest.approx(evals[r.advice.step], rel=0.10)


def test_advise_names_no_occasional_work_on_a_run_without_it():
    from bottleneck_oracle import api
    from bottleneck_oracle.llm.graphrag import SLOW_STEPS_SOURCE

    assert not any(s.source == SLOW_STEPS_SOURCE for r in api.advise(CLEAN) for s in r.advice.suggestions)


def test_whatif_on_the_named_range_by_name_points_to_module():
    """The run answer names rank 0's ``evaluate``; ``name=evaluate`` selects ops, of which there is
    none of that name: the error says a range has it and ``module=evaluate`` selects its ops (which
    replays the evaluation away); a name that is nothing at all gets no such hint."""
    from bottleneck_oracle.api import whatif
    from bottleneck_oracle.errors import OracleError

    with pytest.raises(OracleError, match=r"name=evaluate selects nothing \(no op has that name; a range does: module=evaluate"):
        whatif(PERIODIC, ["name=evaluate,rank=0,scale=0"], steps=[5])
    with pytest.raises(OracleError) as exc:
        whatif(PERIODIC, ["name=evaluatex,scale=0"], steps=[5])
    assert "a range does" not in str(exc.value)
    (row,) = whatif(PERIODIC, ["module=evaluate,rank=0,scale=0"], steps=[5])
    assert -row.replay.delta_us == pytest.approx(_raw(PERIODIC)[0]["evaluate"][5], rel=0.10)


CHECKPOINT = DATA / "own-cpu" / "checkpoint_every4.json.gz"  # torch.save after every fourth step, no record_function


def _tails(path: Path) -> dict[int, float]:
    """Per ProfilerStep number: how long its span runs on after the end of the last event inside
    it on its thread (µs), read from the JSON: the checkpoint's pickling and write, no op."""
    ev = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
    out = {}
    for s in (e for e in ev if str(e["name"]).startswith("ProfilerStep#")):
        lo, hi = float(s["ts"]), float(s["ts"]) + float(s["dur"])
        last = max(float(e["ts"]) + float(e["dur"]) for e in ev if e is not s and e["tid"] == s["tid"] and lo <= float(e["ts"]) < hi)
        out[int(str(s["name"]).split("#")[1])] = hi - last
    return out


def test_a_checkpoint_no_op_records_is_what_the_slow_steps_hold():
    """A loop that writes a checkpoint (``torch.save``, no ``record_function``) after every fourth
    step: the raw spans of steps 5, 9 and 13 run on 40-73 ms past their last op, the others under
    0.1 ms. The run answer names those steps, every 4th, and what is in them: the rank's untraced
    time, as long on the path as the raw tails (within 5%), none in the other steps. The last of
    them ends the trace (its span runs 72 ms past the rank's last event) and is whole, not cut: it
    holds every op the other steps hold. (Before: no cause named, the last step left out as cut.)
    The advice across the run puts the untraced time first: it saves the run the most."""
    from bottleneck_oracle.api import advise
    from bottleneck_oracle.llm.graphrag import run_advice

    tails = _tails(CHECKPOINT)
    saved = sorted(n for n, t in tails.items() if t > 1000.0)
    assert saved == [5, 9, 13]
    analyses = list(cached_analyses(CHECKPOINT))
    assert not any(a.cut_by_trace_end() for a in analyses)
    ans = run_answer(analyses)
    assert ans.steady == len(analyses) - 1
    slow = ans.slow_steps
    assert slow is not None and slow.steps == saved and slow.every == 4
    c = slow.cause
    assert c is not None and c.kind == "untraced" and c.rank == 0 and c.typical_us < 500.0
    assert c.slow_us == pytest.approx(float(np.mean([tails[n] for n in saved])), rel=0.05)
    assert any("untraced time (no op recorded" in line for line in ans.lines())
    run = run_advice([r.advice for r in advise(CHECKPOINT)])
    assert run[0].source == "untraced-host-time" and run[0].steps == len(saved)

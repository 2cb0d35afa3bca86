"""The run answer (analysis.answer): one answer for the run, checked against what the traces say
of themselves (tests/data/README.md) and against independent per-step analyses."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest

from bottleneck_oracle.analysis.answer import estimate, run_answer
from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.api import analyze, two_step_graphs
from bottleneck_oracle.graph_pipeline.builder import build_graph
from conftest import DATA, PUBLIC, REAL, cached_analyses, cached_load, edited_run

STRAGGLER = DATA / "gloo_ddp_8steps_straggler"  # rank 1 sleeps 20 ms in its forward pass in every step
CLEAN = DATA / "gloo_ddp_8steps_clean"


def test_a_persistent_straggler_is_named_with_its_region_and_what_fixing_it_saves():
    table = cached_load(STRAGGLER)
    a = run_answer(list(cached_analyses(STRAGGLER)), str(STRAGGLER), None, two_step_graphs(table))
    assert a.straggler is not None and a.straggler.rank == 1 and a.straggler.steps >= 0.9 * a.steady
    assert a.region is not None and a.region.rank == 1 and "forward" in a.region.name
    assert 15_000 <= a.region.excess.median_us <= 25_000  # the 20 ms sleep (its own time on the rank, less the peer's)
    assert a.region.saving.median_us == pytest.approx(20_000, rel=0.25)
    assert a.region.saving.low_us is not None and a.region.saving.low_us <= a.region.saving.median_us <= a.region.saving.high_us
    lines = a.lines()
    assert lines[0].startswith("Run: 7 steady steps of 8, 2 ranks") and any(line.startswith("Straggler: rank 1") for line in lines)


def test_a_region_whose_fix_saves_nothing_is_said_not_to_set_the_step():
    """The region line and its saving as the run answer writes them: a saving under 1% of the
    step says that the region does not set the step's time (the persistent straggler's 20 ms does
    not say so), and a saving that rounds to nothing reads 0.00, not -0.00."""
    from dataclasses import replace

    from bottleneck_oracle.analysis.answer import Estimate

    table = cached_load(STRAGGLER)
    a = run_answer(list(cached_analyses(STRAGGLER)), str(STRAGGLER), None, two_step_graphs(table))
    assert a.region is not None
    said = "it does not set the step's time"
    assert not any(said in line for line in a.lines())
    a.region = replace(a.region, saving=Estimate(-0.4, -1.0, 0.3, 7))
    (line,) = [x for x in a.lines(width=400) if x.startswith("Fixing it saves")]
    assert line.startswith("Fixing it saves 0.00 ms a step [0.00, 0.00] (0%") and line.endswith(said + ", other work does")


def test_the_step_time_is_the_median_of_the_steady_steps_with_a_covering_interval():
    steps = list(cached_analyses(STRAGGLER))
    a = run_answer(steps)
    times = [s.step_time for s in steps[1:]]
    assert a.step_time.median_us == pytest.approx(float(np.median(times)))
    assert min(times) <= a.step_time.low_us <= a.step_time.median_us <= a.step_time.high_us <= max(times)


def test_a_clean_run_names_no_twenty_ms_region():
    a = run_answer(list(cached_analyses(CLEAN)))
    assert a.region is None or a.region.excess.median_us < 5_000


def test_fewer_than_three_steps_give_no_interval_and_say_so():
    e = estimate([1.0, 2.0])
    assert e.low_us is None and e.high_us is None
    a = run_answer(list(cached_analyses(DATA / "gloo_ddp_2rank")))  # 3 steps: 2 steady
    assert a.step_time.low_us is None and any("Fewer than 3 steady steps" in n for n in a.notes)


@pytest.mark.parametrize(
    "path", [STRAGGLER, PUBLIC / "train_1rank_5steps.json.gz", PUBLIC / "diff_test_rank1of2.json.gz"], ids=lambda p: p.name
)
def test_a_window_over_two_steps_lasts_their_two_periods(path):
    """Built over two consecutive steps, the graph's step time is the two steps' periods together
    (each from its own one-step graph) within 1%: the second step starts where the first ends.
    (The window counts the moment between the first step's last op and the second's start, the
    profiler's own bookkeeping, which neither one-step graph holds; on several ranks each step's
    period runs from when the last rank finished the one before, so the two add up.)"""
    table = cached_load(path)
    numbers = sorted({s.number for s in table.steps})
    for n in numbers[1:-1]:
        two = run_cpm(build_graph(table, n, span=2)).makespan
        one = sum(run_cpm(build_graph(table, k)).makespan for k in (n, n + 1))
        assert 0.99 * one <= two <= 1.01 * one, (n, two, one)


def _forty_mm(name: str, doc: dict) -> None:
    """edited_run's edit: forty aten::mm ops of 50 µs added to rank 1 just after each step starts, on
    its thread (60 µs apart); what follows moves on."""
    if name == "rank-1.json.gz":
        ev = doc["traceEvents"]
        steps = sorted((e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
        main = (steps[0]["pid"], steps[0]["tid"])
        gap = 40 * 60
        for s in steps:
            at = s["ts"] + 0.5
            for e in ev:
                if isinstance(e.get("ts"), (int, float)) and e["ts"] > at:
                    e["ts"] += gap
            ev += [
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": main[0], "tid": main[1], "ts": at + 60 * k, "dur": 50}
                for k in range(40)
            ]
            s["dur"] += gap


def test_extra_ops_a_rank_runs_are_counted_against_its_peers(tmp_path):
    """Forty aten::mm ops added to rank 1's forward pass in every step of the clean run (copies of
    one of its own, placed in an idle stretch) are reported as 40 extra aten::mm on rank 1."""

    _, steps = analyze(edited_run(CLEAN, tmp_path / "job", _forty_mm))
    a = run_answer(steps)
    mm = [x for x in a.extra_ops if x.rank == 1 and x.name == "aten::mm"]
    assert mm and mm[0].count == 40 and mm[0].dur.median_us == pytest.approx(40 * 50, rel=0.01)
    assert not [x for x in a.extra_ops if x.rank == 0]


def test_removing_the_extra_ops_saves_what_the_run_without_them_takes_less(tmp_path):
    """The same forty aten::mm ops on rank 1 (2.4 ms of its step with their framework gaps): the
    answer's replay of removing them is the clean run's own step time, whose run is the edited one
    without them. Its saving is within 25% of the edited run's median step time less the clean
    one's, each measured by the tool's step time (the ranks' spans); and the answer leads with the
    extra ops where they save far more than any region it finds."""
    from bottleneck_oracle.api import load, two_step_graphs

    job = edited_run(CLEAN, tmp_path / "job", _forty_mm)
    _, steps = analyze(job)
    _, clean = analyze(CLEAN)
    a = run_answer(steps, two_steps=two_step_graphs(load(job)))
    truth = float(np.median([x.step_time for x in steps[1:]])) - float(np.median([x.step_time for x in clean[1:]]))
    assert truth > 1000.0
    assert a.extra_saving is not None and a.extra_saving.median_us == pytest.approx(truth, rel=0.25), (a.extra_saving, truth)
    if a.region is not None:  # a region leads only where it saves about as much
        assert a.region.saving.median_us * 2.0 > a.extra_saving.median_us


def test_extra_ops_are_not_named_where_a_trace_is_sampled(tmp_path):
    """The clean run with a fifth of rank 0's events dropped at random, as a sampling exporter
    leaves a trace (its events' Ev Idx numbers then have gaps): both ranks ran the same ops, so
    rank 1 running ops 'its peers do not run' would be the sampling talking. The run answer names
    no extra ops and says why."""

    def sample(name: str, doc: dict) -> None:
        if name == "rank-0.json.gz":
            rng = random.Random(0)
            doc["traceEvents"] = [
                e
                for e in doc["traceEvents"]
                if e.get("ph") != "X" or str(e.get("name", "")).startswith("ProfilerStep#") or rng.random() >= 0.2
            ]

    _, steps = analyze(edited_run(CLEAN, tmp_path / "job", sample))
    a = run_answer(steps)
    assert a.extra_ops == []
    said = [n for n in a.notes if n.startswith("Extra ops")]
    assert len(said) == 1 and "rank 0's trace holds 8" in said[0], said


@pytest.fixture(scope="module")
def loader_trace(tmp_path_factory):
    """A real CPU profile of a training loop whose DataLoader (one process) sleeps in __getitem__."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 1000

        def __getitem__(self, i: int):
            time.sleep(0.002)  # 8 items a batch: ~16 ms of loading a step
            return torch.randn(64), torch.randn(1)

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = iter(torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers=0))
    path = tmp_path_factory.mktemp("loader") / "trace.json"
    plan = schedule(wait=0, warmup=1, active=6, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan, on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(7):
            x, y = next(loader)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    return path


def test_the_time_in_the_data_loader_is_named_as_the_input_pipeline(loader_trace):
    events = json.loads(loader_trace.read_text())["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
    loads = [e for e in events if e.get("ph") == "X" and e["name"].startswith("enumerate(DataLoader)#")]
    per_step = [sum(e["dur"] for e in loads if lo <= e["ts"] < hi) for lo, hi in steps[1:]]  # the steady steps (the first is warm-up)
    assert min(per_step) > 10_000  # the raw events: ~16 ms of loading in each step
    answer = run_answer(list(analyze(loader_trace)[1]))
    # one thread does everything: all of its loading lies on the critical path
    assert answer.input_pipeline is not None
    assert answer.input_pipeline.median_us == pytest.approx(float(np.median(per_step)), rel=0.02)
    assert any(line.startswith("Data loading (DataLoader):") for line in answer.lines())


def test_a_run_without_a_data_loader_names_no_input_pipeline():
    answer = run_answer(cached_analyses(DATA / "gloo_ddp_8steps_clean"))
    assert answer.input_pipeline is None and not any(line.startswith("Data loading") for line in answer.lines())


def _device_idle_and_host_blocked(path) -> tuple[float, float]:
    """From the raw events, over the steady steps: the median share of each step's span in which
    no device op runs, and of it the host spends in calls that block on the device (>= 1 ms)."""
    events = json.loads(gzip.open(path).read())["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#"))
    device = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset")
    )
    blocking = [
        (e["ts"], e["dur"])
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in ("cuda_runtime", "Runtime")
        and e["dur"] >= 1000
        and any(k in e["name"].lower() for k in ("synchronize", "memcpy", "query"))
    ]
    idle, blocked = [], []
    for lo, hi in steps[1:]:
        busy, end = 0.0, lo
        for a, b in device:  # the union of the device ops inside the span
            a, b = max(a, end), min(b, hi)
            if b > a:
                busy, end = busy + b - a, b
        idle.append(1 - busy / (hi - lo))
        blocked.append(sum(d for t, d in blocking if lo <= t < hi) / (hi - lo))
    return float(np.median(idle)), float(np.median(blocked))


def test_a_host_bound_loop_is_named_where_its_windows_end_with_device_time():
    """resnet50_legacy: each step's GPU work ends after its host's step, so the step windows end
    with ~70 ms of device compute; the raw events show the device idle for a fifth of each step
    and the host never waiting on it: halving the device's compute, replayed over two steps,
    saves almost nothing a step in steady state."""
    path = REAL / "resnet50_legacy_2021_1gpu.pt.trace.json.gz"
    idle, blocked = _device_idle_and_host_blocked(path)
    assert idle > 0.15 and blocked < 0.05  # the raw facts: a host-bound loop
    table = cached_load(path)
    analyses = list(cached_analyses(path))
    answer = run_answer(analyses, two_steps=two_step_graphs(table))
    assert answer.breakdown["compute"].median_us > 0.3 * answer.step_time.median_us  # the windows end with device time
    assert answer.device is not None
    assert answer.device.steady.median_us < 0.05 * answer.device.one_step.median_us
    assert any(line.startswith("Host-bound loop:") for line in answer.lines())


def test_a_device_bound_loop_is_not_called_host_bound():
    path = PUBLIC / "train_1rank_5steps.json.gz"
    idle, _ = _device_idle_and_host_blocked(path)
    assert idle < 0.05  # the raw facts: the device never waits
    answer = run_answer(list(cached_analyses(path)), two_steps=two_step_graphs(cached_load(path)))
    assert answer.device is None and not any(line.startswith("Host-bound") for line in answer.lines())

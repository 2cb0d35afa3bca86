"""Delay injection: what it slows, when, by how much, and what it records."""

from __future__ import annotations

import time

import pytest
import torch

from bottleneck_oracle_lab.systems.inject import Injection, Injector, read_manifest
from bottleneck_oracle_lab.systems.model import GPT, SIZES, synthetic_batch
from machine_load import OtherLoad


def _forward(model, cfg):
    tokens, targets = synthetic_batch(cfg, 2, torch.Generator().manual_seed(0))
    return model(tokens, targets)


@pytest.mark.parametrize(
    "kwargs,problem",
    [
        ({"kind": "bogus", "rank": 0, "step": 1, "delay_ms": 5}, "kind"),
        ({"kind": "module", "rank": 0, "step": 1, "delay_ms": 5}, "target pattern"),
        ({"kind": "phase", "target": "lunch", "rank": 0, "step": 1, "delay_ms": 5}, "phase"),
        ({"kind": "rank", "rank": 0, "step": 1}, "delay_ms > 0"),
        ({"kind": "rank", "rank": 0, "step": 1, "factor": 2.0}, "factor applies"),
    ],
)
def test_invalid_injections_are_refused(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        Injection(**kwargs)


def test_module_injection_fires_on_its_rank_and_step_only(tmp_path):
    cfg = SIZES["tiny"]
    model = GPT(cfg)
    inj = Injection(kind="module", target="layers.1.mlp", rank=1, step=3, delay_ms=30)
    mine = Injector([inj], rank=1, out_dir=tmp_path)
    other = Injector([inj], rank=0, out_dir=tmp_path)
    mine.attach(model)
    other.attach(model)
    times = {}
    for step in range(1, 6):
        mine.at_step(step)
        other.at_step(step)
        t = time.perf_counter()
        _forward(model, cfg)
        times[step] = time.perf_counter() - t
    assert [r["step"] for r in mine.records] == [3] and other.records == []
    assert mine.records[0]["where"] == "layers.1.mlp"
    assert mine.records[0]["slept_ms"] >= 30
    assert times[3] - min(times[s] for s in (1, 2, 4, 5)) >= 0.025
    mine.write_manifest()
    assert read_manifest(tmp_path) == mine.records


def test_factor_scales_the_module_own_time(tmp_path):
    cfg = SIZES["small"]
    model = GPT(cfg)
    inj = Injection(kind="module", target="layers.*.mlp", rank=0, step=1, factor=3.0)
    injector = Injector([inj], rank=0, out_dir=tmp_path)
    injector.attach(model)
    injector.at_step(1)
    _forward(model, cfg)
    assert [r["where"] for r in injector.records] == [f"layers.{i}.mlp" for i in range(cfg.layers)]


def test_phase_and_rank_injections_and_their_trace_marker(tmp_path):
    injector = Injector(
        [Injection(kind="phase", target="backward", rank=0, step=2, delay_ms=15), Injection(kind="rank", rank=0, step=2, delay_ms=10)],
        rank=0,
        out_dir=tmp_path,
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in (1, 2):
            injector.at_step(step)
            with injector.phase("forward"):
                pass
            with injector.phase("backward"):
                pass
    names = {e.name for e in prof.events()}
    assert {"oracle_inject:phase:backward", "oracle_inject:rank:rank0", "backward"} <= names
    assert sorted(r["kind"] for r in injector.records) == ["phase", "rank"]
    assert all(r["step"] == 2 for r in injector.records)


@pytest.mark.parametrize(
    "kind,target",
    [
        ("module", "layers.0.mlp"),  # issue's case, in the default run: one rank's forward of one layer
        pytest.param("collective", "", marks=pytest.mark.slow),
        pytest.param("phase", "forward", marks=pytest.mark.slow),
        pytest.param("rank", "", marks=pytest.mark.slow),
    ],
)
def test_injected_delay_raises_the_measured_step_time(tmp_path, kind, target):
    """A 20 ms delay on one rank raises the step's measured time by 20 ms +- 15% (medians over
    several injected steps against their unperturbed neighbours), and the trace shows it."""
    import numpy as np

    from bottleneck_oracle.api import load
    from bottleneck_oracle_lab.systems.ddp import DDPRun, record

    injected = list(range(3, 25, 3))  # 8 perturbed steps, each between two unperturbed ones
    run = DDPRun(
        out=str(tmp_path),
        world=2,
        steps=25,
        size="tiny",
        batch=4,
        bucket_mb=25.0,
        injections=tuple(Injection(kind=kind, target=target, rank=1, step=s, delay_ms=20) for s in injected),
    )
    with OtherLoad() as other:
        folder = record(run)
    table = load(folder)
    step_time = {}
    for s in table.steps:
        step_time[s.number] = max(step_time.get(s.number, 0.0), s.span)
    deltas = [step_time[s] - np.median([step_time[s - 1], step_time[s + 1]]) for s in injected]
    after = [step_time[s + 1] for s in injected]
    others = [t for n, t in step_time.items() if n > 1 and n not in injected and n - 1 not in injected]
    # noise-aware margins: 15% of the delay on a quiet machine, three robust sigmas of the
    # unperturbed steps when the machine is loaded (the other rank then gets the CPU while one
    # sleeps, and part of the delay is absorbed)
    sigma = 1.4826 * float(np.median(np.abs(np.array(others) - np.median(others))))
    margin = max(0.15 * 20_000, 3 * sigma)
    if other.cores is not None and other.cores > 0.25:
        # other processes held a quarter of a core or more: the sleeping rank's core goes to the
        # busy rank, which absorbs part of the delay (measured with one CPU hog beside the ranks: a
        # 20 ms delay raised the step by 12.7 ms at the median, with sigma 1.4 ms). The delay must
        # still show, and no more than in full.
        assert 0.3 * 20_000 <= np.median(deltas) <= 20_000 + margin, (deltas, sigma, other.cores)
    else:
        assert abs(np.median(deltas) - 20_000) <= margin and np.median(deltas) > 0, (deltas, sigma, other.cores)
    # the delay does not leak into the next step: it is as fast as the other unperturbed ones
    assert abs(np.median(after) - np.median(others)) < max(5_000, 3 * sigma), (after, others)
    manifest = read_manifest(tmp_path)
    assert sorted(r["step"] for r in manifest) == injected and {r["rank"] for r in manifest} == {1}
    marker = [i for i, n in enumerate(table.names) if n.startswith(f"oracle_inject:{kind}:")]
    rows = np.isin(table.cols["name"], marker)
    assert rows.sum() == len(injected) and set(table.cols["rank"][rows].tolist()) == {1}


def test_a_pinned_rank_runs_on_one_core_of_its_own():
    """The low-noise protocol's pinning: rank r gets core r modulo the cores it may use (checked in
    a child process, so the test run itself stays unpinned)."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("this OS cannot pin processes")
    cores = sorted(os.sched_getaffinity(0))
    code = (
        "import os; from bottleneck_oracle_lab.systems.launch import pin_to_core; every = os.sched_getaffinity(0)\n"
        "for r in range(3):\n"
        "    os.sched_setaffinity(0, every); c = pin_to_core(r); print(c, *sorted(os.sched_getaffinity(0)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [f"{cores[r % len(cores)]} {cores[r % len(cores)]}" for r in range(3)]


def test_a_pinned_ddp_rank_runs_its_gloo_socket_thread_at_idle_priority():
    """The low-noise protocol's other half: a gloo process group's socket thread goes to idle
    priority (it spins on a connection's lock while the lock's holder waits for the core), the
    rank's own threads keep theirs (checked in a child process with a one-rank group)."""
    import json
    import os
    import subprocess
    import sys

    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("this OS has no idle priority")
    code = (
        "import json, os, pathlib\n"
        "from bottleneck_oracle_lab.systems.launch import free_port, idle_gloo_loops, process_group\n"
        "with process_group(0, 1, free_port()):\n"
        "    n = idle_gloo_loops()\n"
        "    tasks = {int(t.name): (t / 'comm').read_text().strip() for t in pathlib.Path('/proc/self/task').iterdir()}\n"
        "    print(json.dumps([n, [(name, os.sched_getscheduler(tid)) for tid, name in tasks.items()]]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    n, policies = json.loads(out)
    assert n >= 1 and n == sum(name == "gloo_tcp_loop" for name, _ in policies), out
    assert all((p == os.SCHED_IDLE) == (name == "gloo_tcp_loop") for name, p in policies), out

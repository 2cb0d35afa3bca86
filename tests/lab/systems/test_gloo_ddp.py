"""A real 2-rank gloo DDP run with a straggler: cross-rank edges, merged makespan, slack = wait."""

from __future__ import annotations

import numpy as np
import pytest

from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.api import graphs, load
from bottleneck_oracle.graph_pipeline.schema import Category, EdgeKind
from conftest import job_step_us


@pytest.fixture(scope="module")
def analysed(recorded_ddp):
    out = []
    for g in graphs(load(recorded_ddp)):
        out.append((g, run_cpm(g)))
    return out


def test_collectives_are_synchronised_across_ranks(analysed):
    for g, _ in analysed:
        n, e = g.nodes, g.edges
        sync = e["kind"] == EdgeKind.COLLECTIVE_SYNC
        assert sync.sum() >= 2, f"step {g.step}"
        bars = e["src"][sync]
        assert (n["category"][bars] == Category.BARRIER).all()
        for b in np.unique(bars):
            assert sorted(n["rank"][e["dst"][sync & (e["src"] == b)]].tolist()) == [0, 1]


def test_merged_graph_gives_the_job_s_step_within_2_percent(analysed):
    """The step time is the job's step from its ProfilerStep spans: in the trace's first step the
    slowest rank's span; in a later one from the last rank's start (when the last of them finished
    the step before) to the last rank's end."""
    first = min(g.step for g, _ in analysed)
    for g, r in analysed:
        a = StepAnalysis(graph=g, cpm=r)
        job = job_step_us(g, g.step == first)
        assert abs(a.step_time - job) <= 0.02 * job, f"step {g.step}: {a.step_time:.0f} vs {job:.0f} µs"
        # the merged window also holds the ranks' start skew: first start to last end
        window = max(g.rank_start(k) + g.measured[k] for k in g.ranks)
        assert abs(r.window - window) <= 0.02 * window
        # and the step time is measured from the step's origin, not the window's start
        assert r.makespan <= r.window + 1e-6


def _first_allreduce_wait(g):
    """Measured wait of rank 0 at the step's gradient all-reduce: how much later rank 1
    arrived (the starts of the two participants, straight from the trace)."""
    n, e = g.nodes, g.edges
    sync = e["kind"] == EdgeKind.COLLECTIVE_SYNC
    first_barrier = min(np.unique(e["src"][sync]).tolist(), key=lambda b: n["start"][b])
    members = e["dst"][sync & (e["src"] == first_barrier)]
    start = {int(n["rank"][m]): n["start"][m] for m in members}
    return start[1] - start[0]


def test_slack_of_the_waiting_rank_equals_its_measured_wait(analysed):
    """On each step, rank 0's early ops can absorb exactly the time it waited at the all-reduce.
    A late OS wake-up on a loaded 2-core machine can move a step's slack off the wait (with a CPU
    hog beside the test, by 3-12% in 2 of 4 steps), or (seen once in a clean-clone CI run) put
    rank 0's first op on the critical path of one step, so the equality is held on the median
    over 8 steps, and all steps but a quarter must show most of the wait as slack and the
    straggler's ops on the critical path. A step where rank 0 itself was descheduled long
    enough to wait under 10 ms (seen once in CI: 8.4 ms) counts toward that quarter."""
    errors, odd = [], []
    steps = analysed[1:]  # step 1 also carries DDP's start-up broadcasts
    for g, r in steps:
        wait = _first_allreduce_wait(g)
        if wait <= 10_000:  # rank 1 sleeps 25 ms; a descheduled rank 0 can arrive late too (seen in CI: 8.4 ms)
            odd.append(f"step {g.step}: rank 0 waited only {wait:.0f} µs")
            continue
        n = g.nodes
        rank0 = np.flatnonzero((n["rank"] == 0) & (n["event"] >= 0))
        first = rank0[np.argmin(n["start"][rank0])]
        errors.append(abs(r.slack[first] - wait) / wait)
        # the straggler's ops are on the critical path: (almost) no slack
        rank1 = np.flatnonzero((n["rank"] == 1) & (n["event"] >= 0))
        if r.slack[first] <= 0.5 * wait or np.median(r.slack[rank1]) >= 0.05 * wait:
            odd.append(
                f"step {g.step}: slack {r.slack[first]:.0f} vs wait {wait:.0f} µs, rank 1 median slack {np.median(r.slack[rank1]):.0f}"
            )
    assert len(steps) >= 8 and len(odd) <= len(steps) // 4, odd
    assert np.median(errors) <= 0.05, f"relative |slack - wait| per step: {[round(e, 3) for e in errors]}"

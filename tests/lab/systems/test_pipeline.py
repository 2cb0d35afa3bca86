"""Pipeline-parallel runs (2 stages, AFAB and 1F1B over gloo send/recv): the graph pairs every
send with its recv across ranks and reproduces the measured steps."""

from __future__ import annotations

import numpy as np
import pytest

from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.api import analyze
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind
from conftest import job_step_us


@pytest.fixture(scope="module", params=["1f1b", pytest.param("afab", marks=pytest.mark.slow)])  # AFAB: same rules, another schedule
def pipeline_run(request, tmp_path_factory):
    from bottleneck_oracle_lab.systems.pipeline import PipelineRun, record

    out = tmp_path_factory.mktemp(f"pp_{request.param}")
    run = PipelineRun(out=str(out), world=2, size="tiny", schedule=request.param, microbatches=4, steps=2)
    return run, analyze(record(run))[1]


def test_every_send_pairs_with_a_recv_on_the_other_rank(pipeline_run):
    run, steps = pipeline_run
    for a in steps:
        g = a.graph
        n, e = g.nodes, g.edges
        net = np.flatnonzero(n["category"] == Category.P2P)
        assert len(net) == 4 * run.microbatches  # per micro-batch: activation and gradient, sent and received
        bars = np.flatnonzero(n["category"] == Category.BARRIER)
        assert len(bars) == 2 * run.microbatches
        waiting: set[int] = set()
        for b in bars:
            to = e["dst"][(e["src"] == b) & (e["kind"] == EdgeKind.SEND_RECV)]
            kinds = sorted(int(k) for k in n["coll_kind"][to])
            recv = to[n["coll_kind"][to] == CollectiveKind.RECV]
            assert len(recv) == 1 and kinds in ([CollectiveKind.SEND, CollectiveKind.RECV], [CollectiveKind.RECV])
            # the barrier waits for the send's own dependencies, which run on the other rank
            sources = {int(n["rank"][s]) for s in e["src"][e["dst"] == b]}
            assert 1 - int(n["rank"][recv[0]]) in sources
            for i in to[n["coll_kind"][to] == CollectiveKind.SEND]:  # still running when the receive was posted
                assert n["start"][i] + n["dur"][i] >= n["start"][b]
                waiting.add(int(i))
        # a send that had ended before its receiver arrived was buffered and waited for nobody
        buffered = [i for i in net[n["coll_kind"][net] == CollectiveKind.SEND] if int(i) not in waiting]
        assert np.allclose(n["mstart"][buffered], n["start"][buffered])


def test_cpm_step_time_matches_the_measured_step_within_2_percent(pipeline_run):
    _, steps = pipeline_run
    first = min(a.graph.step for a in steps)
    for a in steps:
        measured = job_step_us(a.graph, a.graph.step == first)
        assert abs(a.step_time - measured) <= 0.02 * measured, f"step {a.graph.step}"
        assert isinstance(a, StepAnalysis) and len(a.cpm.path) > 0


@pytest.mark.slow  # four processes on two cores: 11 s
def test_dp_x_pp_on_four_ranks(tmp_path):
    """2 replicas x 2 stages: send/recv within each replica, one gradient all-reduce per stage
    across the replicas."""
    from bottleneck_oracle_lab.systems.pipeline import PipelineRun, record

    run = PipelineRun(out=str(tmp_path), world=2, dp=2, size="tiny", schedule="1f1b", microbatches=2, steps=1)
    (a,) = analyze(record(run))[1]
    n, e = a.graph.nodes, a.graph.edges
    assert a.graph.ranks == [0, 1, 2, 3]
    bars = np.flatnonzero(n["category"] == Category.BARRIER)
    allreduce = bars[n["coll_kind"][bars] == CollectiveKind.ALL_REDUCE]
    assert len(allreduce) == 2  # one per stage
    for b in allreduce:
        ranks = sorted(n["rank"][e["dst"][(e["src"] == b) & (e["kind"] == EdgeKind.COLLECTIVE_SYNC)]].tolist())
        assert ranks in ([0, 2], [1, 3])  # the replicas of one stage
    for b in bars[n["coll_kind"][bars] != CollectiveKind.ALL_REDUCE]:
        to = e["dst"][(e["src"] == b) & (e["kind"] == EdgeKind.SEND_RECV)]
        recv = to[n["coll_kind"][to] == CollectiveKind.RECV]
        assert len(recv) == 1 and len(to) <= 2
        sources = {int(n["rank"][s]) for s in e["src"][e["dst"] == b]}
        assert all(r // 2 == int(n["rank"][recv[0]]) // 2 for r in sources)  # within one replica
    measured = max(a.graph.measured.values())
    assert abs(a.step_time - measured) <= 0.02 * measured

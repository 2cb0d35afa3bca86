"""What-if by replay: edits select the right nodes, bulk single-node edits equal a full CPM rerun."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.conftest import cached_load

from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.analysis.whatif import Edit, edited_durations, replay, single_node_makespans
from bottleneck_oracle.errors import OracleError

SAMPLE = Path(__file__).parent.parent / "data" / "gloo_ddp_2rank"


@pytest.fixture(scope="module")
def graph():
    from bottleneck_oracle.api import graphs

    return graphs(cached_load(SAMPLE))[1]


def test_bulk_single_node_edits_equal_a_cpm_rerun_each(graph):
    base = run_cpm(graph)
    rng = np.random.default_rng(0)
    ids = np.concatenate([rng.choice(graph.n_nodes, 150, replace=False), base.path[:: max(len(base.path) // 50, 1)]])
    delta = np.concatenate([rng.uniform(-3000, 8000, 150), -0.5 * graph.nodes["mdur"][base.path[:: max(len(base.path) // 50, 1)]]])
    fast = single_node_makespans(graph, ids, delta, base)
    for i, v in enumerate(ids):
        d = graph.nodes["mdur"].astype(float).copy()
        d[v] = max(d[v] + delta[i], 0.0)
        assert fast[i] == pytest.approx(run_cpm(graph, d).makespan, abs=1e-6), (v, delta[i])
    assert (fast > base.makespan + 1).any() and (fast < base.makespan - 1).any()  # both directions exercised


def test_an_edit_parses_selects_and_replays(graph):
    e = Edit.parse("name~=all_reduce,rank=1,scale=0.5")
    ids = e.select(graph)
    assert len(ids) and all("all_reduce" in graph.node_name(i) and graph.nodes["rank"][i] == 1 for i in ids)
    d, touched = edited_durations(graph, [e])
    assert np.array_equal(touched, ids) and np.allclose(d[ids], graph.nodes["mdur"][ids] * 0.5)
    base = run_cpm(graph)
    v = int(base.path[len(base.path) // 2])  # a node on the critical path: a delay shows in full
    r = replay(graph, [Edit.parse(f"id={v},delay_ms=3")], base)
    assert r.delta_us == pytest.approx(3000.0)
    slack = float(base.slack.max())
    w = int(np.argmax(base.slack))  # the node with the most slack absorbs a delay smaller than it
    assert replay(graph, [Edit(ids=(w,), delay_ms=min(slack, 10_000) / 2000)], base).delta_us == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(
    "text, message",
    [
        ("rank=1", "needs scale="),
        ("scale=2", "needs a selector"),
        ("name=x,speed=2", "unknown key 'speed'"),
        ("rank=one,scale=2", "bad value for rank"),
        ("junk", "is not key=value"),
    ],
)
def test_bad_edits_are_named(text, message):
    with pytest.raises(OracleError, match=message):
        Edit.parse(text)


def test_an_edit_that_selects_nothing_is_an_error(graph):
    with pytest.raises(OracleError, match="selects no node"):
        replay(graph, [Edit.parse("name=no_such_op,scale=2")])


def test_detaching_the_collectives_makes_the_ranks_independent(recorded_ddp):
    """Structural edit: nothing waits for the all-reduces any more (full overlap) -> rank 0's
    timeline no longer depends on rank 1's (the straggler): slowing rank 1 leaves it unchanged,
    while without the edit it moves rank 0's finish."""
    from bottleneck_oracle.api import build

    _, gs = build(recorded_ddp)
    g = gs[-1]
    rank0 = g.nodes["rank"] == 0
    detach = Edit.parse("cat=collective,detach=1")
    slow1 = Edit.parse("rank=1,gap=1,scale=2")  # doubles rank 1's untraced time: its 25 ms sleep
    before = replay(g, [slow1]).edited.eft[rank0].max() - run_cpm(g).eft[rank0].max()
    assert before > 10_000  # coupled: rank 0 waits for the slower rank 1
    a = replay(g, [detach]).edited
    b = replay(g, [detach, slow1]).edited
    assert np.allclose(a.eft[rank0], b.eft[rank0])  # decoupled
    assert a.makespan <= run_cpm(g).makespan + 1e-6

"""Exact CPM on hand-made graphs (the measured step time on every fixture: tests/analysis/test_waits.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.errors import GraphError
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import NODE_COLUMNS


def make_graph(durs, edges, release) -> ExecutionGraph:
    n = len(durs)
    nodes = {k: np.zeros(n, dtype=np.int64) for k in NODE_COLUMNS}
    nodes.update(
        start=np.zeros(n),
        dur=np.array(durs, float),
        mstart=np.zeros(n),
        mdur=np.array(durs, float),
        msg_bytes=np.full(n, np.nan),
        on_gpu=np.zeros(n, bool),
        name=np.arange(n, dtype=np.int32),
    )
    src, dst, w = (np.array(x) for x in zip(*edges)) if edges else (np.zeros(0, int),) * 3
    return ExecutionGraph(
        names=[f"op{i}" for i in range(n)],
        nodes=nodes,
        edges={
            "src": src.astype(np.int64),
            "dst": dst.astype(np.int64),
            "kind": np.zeros(len(src), np.int8),
            "weight": np.asarray(w, float),
        },
        release=np.array(release, float),
        window_start=0.0,
        step=1,
        measured={0: 0.0},
    )


def test_diamond_est_lst_slack_and_path():
    #   A(10) --2--> C(3) ; B(5) --0--> C ; A released at 0, B at 1
    g = make_graph([10, 5, 3], [(0, 2, 2.0), (1, 2, 0.0)], [0.0, 1.0, -np.inf])
    r = run_cpm(g)
    assert r.makespan == 15.0
    assert r.est.tolist() == [0.0, 1.0, 12.0]
    assert r.lst.tolist() == [0.0, 7.0, 12.0]
    assert r.slack.tolist() == [0.0, 6.0, 0.0]
    assert r.path.tolist() == [0, 2]
    assert r.path_edges.tolist() == [0]


def test_edited_durations_move_the_critical_path():
    g = make_graph([10, 5, 3], [(0, 2, 2.0), (1, 2, 0.0)], [0.0, 1.0, -np.inf])
    r = run_cpm(g, dur=np.array([2.0, 5.0, 3.0]))
    assert r.makespan == 9.0
    assert r.path.tolist() == [1, 2]


def test_negative_weight_models_overlap():
    # B starts 4 µs before A ends (a kernel that starts before its launch call returns)
    g = make_graph([10, 5], [(0, 1, -4.0)], [0.0, -np.inf])
    assert run_cpm(g).makespan == 11.0


def test_cycle_is_reported_with_the_nodes_involved():
    g = make_graph([1, 1, 1], [(0, 1, 0.0), (1, 2, 0.0), (2, 1, 0.0)], [0.0, -np.inf, -np.inf])
    with pytest.raises(GraphError, match=r"cycle.*2 nodes involved.*'op1'"):
        run_cpm(g)


def test_the_objective_is_the_slowest_ranks_own_span_not_the_merged_window():
    # rank 0: A(10) from its step start 0; rank 1 starts its step at 8: B(5) ends at 13.
    g = make_graph([10, 5], [], [0.0, 8.0])
    g.nodes["rank"] = np.array([0, 1], dtype=np.int32)
    g.meta["rank_start_us"] = {"0": 0.0, "1": 8.0}
    r = run_cpm(g)
    assert (r.makespan, r.window) == (10.0, 13.0)  # rank 0's span is the step; rank 1's is 5
    assert r.path.tolist() == [0] and r.slack.tolist() == [0.0, 5.0]  # B may grow to rank 0's span
    from bottleneck_oracle.analysis.whatif import single_node_makespans

    assert single_node_makespans(g, np.array([1, 1, 0]), np.array([4.0, 7.0, -3.0])).tolist() == [10.0, 12.0, 7.0]
    assert run_cpm(g, dur=np.array([10.0, 12.0])).makespan == 12.0 and run_cpm(g, dur=np.array([7.0, 5.0])).makespan == 7.0

"""Edge rules, each checked on a small real trace."""

from __future__ import annotations

import numpy as np
import pytest

from bottleneck_oracle.analysis.cpm import run_cpm, topological_order
from bottleneck_oracle.api import graphs, load
from bottleneck_oracle.graph_pipeline.events import EvClass
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind, NodeType, edge_relation
from conftest import KINETO_FIXTURES, PUBLIC, SAMPLE, cached_load


def _graph(name: str, i: int = 0) -> ExecutionGraph:
    return graphs(cached_load(PUBLIC / name))[i]


def _in_edges(g: ExecutionGraph, kind: EdgeKind) -> np.ndarray:
    return g.edges["dst"][g.edges["kind"] == kind]


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=lambda p: p.name)
def test_every_graph_is_acyclic_and_valid(path):
    for g in graphs(cached_load(path)):
        g.validate()
        assert len(topological_order(g.n_nodes, g.edges["src"], g.edges["dst"])) == g.n_nodes


def test_leaves_on_a_thread_never_overlap():
    g = _graph("train_1rank_5steps.json.gz", 2)
    n = g.nodes
    cpu = np.flatnonzero(~n["on_gpu"] & (n["event"] >= 0))
    for tid in np.unique(n["tid"][cpu]):
        m = cpu[n["tid"][cpu] == tid]
        m = m[np.argsort(n["start"][m])]
        assert (n["start"][m][1:] >= (n["start"][m] + n["dur"][m])[:-1] - 1e-6).all()


def test_program_order_is_a_chain_per_thread_and_stream():
    g = _graph("simple_add_1gpu.json.gz")
    e = g.edges
    po = e["kind"] == EdgeKind.PROGRAM_ORDER
    src, dst = e["src"][po], e["dst"][po]
    n = g.nodes
    assert (n["tid"][src] == n["tid"][dst]).all() and (n["on_gpu"][src] == n["on_gpu"][dst]).all()
    assert (n["start"][dst] >= n["start"][src]).all()
    # one successor and one predecessor per node along program order
    assert len(np.unique(src)) == len(src) and len(np.unique(dst)) == len(dst)
    lanes = len({(t, gpu) for t, gpu in zip(n["tid"].tolist(), n["on_gpu"].tolist())})
    assert po.sum() == g.n_nodes - lanes


def test_every_kernel_has_exactly_one_launch_edge_from_its_runtime_call():
    table = load(PUBLIC / "simple_add_1gpu.json.gz")
    g = graphs(table)[0]
    n, e, c = g.nodes, g.edges, table.cols
    gpu = np.flatnonzero(n["on_gpu"])
    launch = e["kind"] == EdgeKind.LAUNCH
    counts = np.bincount(e["dst"][launch], minlength=g.n_nodes)
    assert (counts[gpu] == 1).all()
    src, dst = e["src"][launch], e["dst"][launch]
    src_ev, dst_ev = n["event"][src], n["event"][dst]
    # a blocking copy (its call returns after its copy op ended, in the raw events) is launched by
    # what ran before the call, and the call waits for the op; every other launch comes from the
    # runtime call with the op's correlation id
    rt = {(int(c["correlation"][i])): i for i in np.flatnonzero(c["cls"] == EvClass.RUNTIME)}
    call_ev = np.array([rt.get(int(c["correlation"][d]), -1) for d in dst_ev])
    ends = c["ts"] + c["dur"]
    copy = np.array(
        [i >= 0 and ("memcpy" in table.names[c["name"][i]].lower() or "memset" in table.names[c["name"][i]].lower()) for i in call_ev]
    )
    blocking = copy & (ends[dst_ev] <= ends[np.maximum(call_ev, 0)]) & (c["ts"][dst_ev] >= c["ts"][np.maximum(call_ev, 0)])
    assert (src_ev[~blocking] == call_ev[~blocking]).all()
    node_of = {int(ev): i for i, ev in enumerate(n["event"])}
    for d, call in zip(dst[blocking], call_ev[blocking]):
        waits = (e["src"] == d) & (e["dst"] == node_of[int(call)]) & (e["kind"] == EdgeKind.SYNC)
        assert waits.sum() == 1
    assert (c["ts"][src_ev[blocking]] < c["ts"][call_ev[blocking]]).all()  # the op before the call


def test_context_and_stream_syncs_wait_for_the_gpu():
    g = _graph("simple_add_1gpu.json.gz")
    e, n = g.edges, g.nodes
    sync = e["kind"] == EdgeKind.SYNC
    assert sync.sum() > 0
    into_cpu = sync & ~n["on_gpu"][e["dst"]]
    names = {g.node_name(i) for i in e["dst"][into_cpu]}
    assert names <= {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync", "cudaMemcpy"}
    assert "cudaDeviceSynchronize" in names and "cudaStreamSynchronize" in names
    assert (n["on_gpu"][e["src"][sync]]).all()
    # a blocking call's modelled start: when the GPU op it waits for ended, within the call
    d = e["dst"][into_cpu]
    gpu_end = (n["start"] + n["dur"])[e["src"][into_cpu]]
    expected = np.clip(np.maximum(n["start"][d], gpu_end), n["start"][d], n["start"][d] + n["dur"][d])
    assert np.allclose(n["mstart"][d], expected)
    assert (n["mstart"][d] > n["start"][d] + 1).any()  # some syncs really waited


def test_stream_wait_event_orders_two_streams():
    g = _graph("cuda_event_sync_multistream_1gpu.json.gz")
    e, n = g.edges, g.nodes
    cross = (e["kind"] == EdgeKind.SYNC) & n["on_gpu"][e["src"]] & n["on_gpu"][e["dst"]]
    assert cross.sum() >= 1
    assert (n["tid"][e["src"][cross]] != n["tid"][e["dst"][cross]]).all()
    assert (n["start"][e["dst"][cross]] >= n["start"][e["src"][cross]] + n["dur"][e["src"][cross]] - 1).all()


def test_forward_to_backward_edges_run_forward_in_time():
    g = _graph("nccl_2rank_rank0.json.gz")
    e, n = g.edges, g.nodes
    fb = e["kind"] == EdgeKind.FWD_BWD
    assert fb.sum() > 100
    assert (n["start"][e["dst"][fb]] >= n["start"][e["src"][fb]]).all()
    # backward ops run on the autograd thread, their forward ops on the main thread
    assert (n["tid"][e["src"][fb]] != n["tid"][e["dst"][fb]]).any()


def test_nccl_kernels_are_network_nodes_triggered_by_their_launch():
    g = _graph("nccl_2rank_rank0.json.gz")
    n, e = g.nodes, g.edges
    net = np.flatnonzero(n["node_type"] == NodeType.NETWORK)
    assert len(net) == 7 and all(g.node_name(i).startswith("ncclKernel") for i in net)
    assert (n["coll_kind"][net] >= 0).all()
    launch = e["kind"] == EdgeKind.LAUNCH
    assert set(net.tolist()) <= set(e["dst"][launch].tolist())
    assert edge_relation(NodeType.COMPUTE, NodeType.NETWORK) == ("compute", "triggers", "network")


def test_gloo_backend_collective_sync_and_feeds_on_two_ranks():
    g = graphs(load(SAMPLE))[1]
    n, e = g.nodes, g.edges
    bars = np.flatnonzero(n["category"] == Category.BARRIER)
    net = np.flatnonzero((n["node_type"] == NodeType.NETWORK) & (n["category"] != Category.BARRIER))
    assert len(bars) == 3 and len(net) == 6
    for b in bars:
        out = e["dst"][(e["src"] == b) & (e["kind"] == EdgeKind.COLLECTIVE_SYNC)]
        assert sorted(n["rank"][out].tolist()) == [0, 1]  # one participant per rank
        assert len(set(n["coll_kind"][out].tolist())) == 1 and n["coll_kind"][out][0] == CollectiveKind.ALL_REDUCE
        assert len(set(n["msg_bytes"][out].tolist())) == 1
        backend_in = e["src"][(e["dst"] == b) & (e["kind"] == EdgeKind.BACKEND)]
        assert sorted(n["rank"][backend_in].tolist()) == [0, 1]  # each rank's c10d call leads to it
        assert {g.node_name(i) for i in backend_in} <= {"c10d::allreduce_", "aten::copy_", "aten::view", "detach", "aten::as_strided"}
        # the barrier stands at the last arrival; every participant starts there
        assert n["start"][b] == pytest.approx(n["start"][out].max())
        assert np.allclose(n["mstart"][out], n["start"][b])
    feeds = e["kind"] == EdgeKind.FEEDS
    assert feeds.sum() >= 1
    assert (n["node_type"][e["src"][feeds]] == NodeType.NETWORK).all()
    assert (n["node_type"][e["dst"][feeds]] == NodeType.COMPUTE).all()


@pytest.mark.parametrize("path", KINETO_FIXTURES, ids=lambda p: p.name)
def test_longest_path_reproduces_every_modelled_start(path):
    for g in graphs(cached_load(path)):
        r = run_cpm(g)
        assert np.allclose(r.est, g.nodes["mstart"], atol=1e-3)
        assert (r.slack >= 0).all()


def test_to_networkx_round_trip_and_longest_path_agrees():
    import networkx as nx

    g = _graph("cuda_event_sync_1gpu.json.gz")
    G = g.to_networkx()
    assert G.number_of_nodes() == g.n_nodes and G.number_of_edges() == g.n_edges
    H = nx.DiGraph()
    d = g.nodes["mdur"]
    for s, t, w in zip(g.edges["src"].tolist(), g.edges["dst"].tolist(), g.edges["weight"].tolist()):
        H.add_edge(s, t, weight=d[s] + w)
    for v in range(g.n_nodes):
        H.add_edge(v, "sink", weight=d[v])
        if np.isfinite(g.release[v]):
            H.add_edge("source", v, weight=g.release[v])
    length = nx.dag_longest_path_length(H, weight="weight")
    assert length == pytest.approx(run_cpm(g).makespan, rel=1e-9)


def test_save_and_load_round_trip(tmp_path):
    g = graphs(load(SAMPLE))[0]
    g.save(tmp_path / "g.npz")
    h = ExecutionGraph.load(tmp_path / "g.npz")
    assert h.names == g.names and h.measured == g.measured and h.step == g.step
    for k in g.nodes:
        assert np.array_equal(h.nodes[k], g.nodes[k], equal_nan=True)
    assert run_cpm(h).makespan == run_cpm(g).makespan


def test_parallel_build_equals_sequential(monkeypatch):
    from bottleneck_oracle.graph_pipeline import builder

    table = cached_load(PUBLIC / "diff_control_rank3of8.json.gz")
    seq = graphs(table)
    monkeypatch.setattr(builder, "PARALLEL_EVENTS", 1)
    par = graphs(table)
    assert [g.step for g in par] == [g.step for g in seq]
    for a, b in zip(seq, par):
        for k in a.nodes:
            assert np.array_equal(a.nodes[k], b.nodes[k], equal_nan=True), k
        for k in a.edges:
            assert np.array_equal(a.edges[k], b.edges[k]), k


def test_a_send_pair_ends_when_its_transfer_did_unless_the_send_was_buffered():
    """An isend whose span closes when the program waits on it (late) ends with its receive; a
    send that ended before the receive was posted keeps its own end (it waited for nobody)."""
    from bottleneck_oracle.graph_pipeline.collectives import modelled_ends
    from bottleneck_oracle.graph_pipeline.schema import CollectiveKind as K

    start = np.array([0.0, 10.0, 20.0, 40.0, 50.0])
    end = np.array([100.0, 12.0, 25.0, 45.0, 200.0])  # pair 0: send closed late; pair 1: buffered; 4: compute
    ckind = np.array([K.SEND, K.RECV, K.SEND, K.RECV, -1])
    inst = np.array([0, 0, 1, 1, -1])
    out = modelled_ends(start, end, ckind, inst)
    assert out.tolist() == [12.0, 12.0, 25.0, 45.0, 200.0]


def test_edge_set_arrays_keep_each_pair_once_with_its_lowest_kind_and_let_the_lists_go():
    from bottleneck_oracle.graph_pipeline.edges import EdgeSet

    rng = np.random.default_rng(7)
    E = EdgeSet()
    added = []
    for i in range(12):  # rules add overlapping edges, some waits, some self loops and -1s (dropped)
        n = int(rng.integers(0, 400))
        src, dst = rng.integers(-1, 60, n), rng.integers(-1, 60, n)
        kind, wait = EdgeKind(int(rng.integers(0, 6))), bool(i % 3 == 0)
        E.add(src, dst, kind, wait=wait)
        added += [(int(s), int(d), int(kind), wait) for s, d in zip(src, dst) if s >= 0 and d >= 0 and s != d]
    best: dict[tuple[int, int], int] = {}
    waits = {(s, d) for s, d, _, w in added if w}
    for s, d, k, _ in added:  # the oracle: a dict of pairs, the lowest kind kept
        best[(s, d)] = min(k, best.get((s, d), k))
    src, dst, kind, is_wait = E.arrays(release=True)
    assert list(zip(src.tolist(), dst.tolist())) == sorted(best)
    assert kind.tolist() == [best[p] for p in sorted(best)]
    assert is_wait.tolist() == [p in waits for p in sorted(best)]
    assert not E.src and not E.dst and not E.kind and not E.waits
    assert all(len(a) == 0 for a in E.arrays())


def test_edge_set_lanes_joined_are_the_pairs_of_lanes_its_edges_cross():
    from bottleneck_oracle.graph_pipeline.edges import EdgeSet

    rng = np.random.default_rng(3)
    lane = rng.integers(0, 9, 200)
    E = EdgeSet()
    for _ in range(5):
        E.add(rng.integers(0, 200, 300), rng.integers(0, 200, 300), EdgeKind.PROGRAM_ORDER)
    expected = sorted({(int(lane[s]), int(lane[d])) for a, b in zip(E.src, E.dst) for s, d in zip(a, b) if lane[s] != lane[d]})
    got = E.lanes_joined(lane)
    n = int(lane.max()) + 1
    assert [(int(x // n), int(x % n)) for x in got] == expected


def test_a_window_let_go_keeps_what_the_graph_copies_and_drops_the_rules_look_ups():
    from bottleneck_oracle.graph_pipeline.window import make_window

    table = cached_load(SAMPLE)
    w = make_window(table, table.steps[0].number if table.steps else None)
    rank, cls, nodes = w.c["rank"].copy(), w.c["cls"].copy(), w.node_rows.copy()
    category, n_bytes = w.node_category(), w.msg_bytes()
    w.let_go()
    assert len(w.ev2node) == len(w.leaf_rows) == len(w.ts) == 0  # the rules' look-ups are gone
    assert np.array_equal(w.node_rows, nodes) and np.array_equal(w.c["rank"], rank) and np.array_equal(w.c["cls"], cls)
    assert np.array_equal(w.node_category(), category) and np.array_equal(w.msg_bytes(), n_bytes, equal_nan=True)
    assert "ts" not in w.c._got and np.array_equal(w.c["ts"][: len(w.rows)][w.rows >= 0], table.cols["ts"][w.rows[w.rows >= 0]])

"""Chakra ET (protobuf) and PyTorch execution-trace (JSON) ingestion."""

from __future__ import annotations

import io

import numpy as np
import pytest

from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.api import graphs, load
from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline.chakra import chakra_graph, read_chakra
from bottleneck_oracle.graph_pipeline.et import load_execution_trace
from bottleneck_oracle.graph_pipeline.schema import Category, EdgeKind
from bottleneck_oracle.graph_pipeline.vendor import et_def_pb2 as pb
from conftest import PUBLIC


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def write_et(path, nodes: list[pb.Node]) -> None:
    buf = io.BytesIO()
    for m in [pb.GlobalMetadata(version="0.0.4"), *nodes]:
        data = m.SerializeToString()
        buf.write(_varint(len(data)) + data)
    path.write_bytes(buf.getvalue())


def node(i, name, t, start, dur, deps=(), **attrs) -> pb.Node:
    n = pb.Node(id=i, name=name, type=t, start_time_micros=start, duration_micros=dur)
    n.data_deps.extend(deps)
    for k, v in attrs.items():
        a = n.attr.add(name=k)
        if isinstance(v, bool):
            a.bool_val = v
        else:
            a.int64_val = v
    return n


@pytest.fixture
def two_ranks(tmp_path):
    """Rank 0 computes 100 µs, rank 1 300 µs, then a 20 µs all-reduce and 50 µs of compute."""
    for rank, work in ((0, 100), (1, 300)):
        write_et(
            tmp_path / f"trace.{rank}.et",
            [
                node(1, "fwd", pb.COMP_NODE, 1000, work),
                node(2, "all_reduce", pb.COMM_COLL_NODE, 1000 + work, 320 - work, deps=[1], comm_type=pb.ALL_REDUCE, comm_size=1 << 20),
                node(3, "opt", pb.COMP_NODE, 1320, 50, deps=[2]),
            ],
        )
    return tmp_path


def test_chakra_two_ranks_barrier_and_slack(two_ranks):
    g = chakra_graph(two_ranks)
    r = run_cpm(g)
    n = g.nodes
    assert r.makespan == pytest.approx(370.0)
    assert (n["category"] == Category.BARRIER).sum() == 1
    fwd0 = np.flatnonzero((n["rank"] == 0) & (n["start"] == 0))[0]
    assert r.slack[fwd0] == pytest.approx(200.0)  # rank 0 waits 200 µs at the all-reduce
    assert n["msg_bytes"][n["category"] == Category.COLLECTIVE].tolist() == [1 << 20, 1 << 20]
    assert (g.edges["kind"] == EdgeKind.DATA).sum() >= 2


def test_chakra_without_start_times_is_scheduled_from_dependencies(tmp_path):
    write_et(tmp_path / "a.0.et", [node(1, "a", pb.COMP_NODE, 0, 10), node(2, "b", pb.COMP_NODE, 0, 5, deps=[1])])
    g = chakra_graph(tmp_path / "a.0.et")
    assert run_cpm(g).makespan == 15.0 and g.nodes["start"].tolist() == [0.0, 10.0]


def test_chakra_bad_files(tmp_path):
    good = tmp_path / "g.0.et"
    write_et(good, [node(1, "a", pb.COMP_NODE, 0, 10)])
    cut = tmp_path / "cut.0.et"
    cut.write_bytes(good.read_bytes()[:-3])
    with pytest.raises(TraceError, match="truncated"):
        read_chakra(cut)
    junk = tmp_path / "junk.0.et"
    junk.write_bytes(b"\x05hello\x03abc")
    with pytest.raises(TraceError, match="not a Chakra ET"):
        read_chakra(junk)
    dangling = tmp_path / "d.0.et"
    write_et(dangling, [node(1, "a", pb.COMP_NODE, 0, 10, deps=[7])])
    with pytest.raises(TraceError, match="depends on node 7"):
        chakra_graph(dangling)


def test_execution_trace_adds_data_dependencies():
    et = load_execution_trace(PUBLIC / "simple_add.pytorch_et.json.gz")
    assert len(et.names) == 38 and len(et.deps) > 0
    table = load(PUBLIC / "simple_add.kineto_for_et.json.gz", et=PUBLIC / "simple_add.pytorch_et.json.gz")
    assert len(table.data_deps) > 0
    # every joined op pair is the same op name in both traces, producer before consumer
    c = table.cols
    assert (c["ts"][table.data_deps[:, 0]] <= c["ts"][table.data_deps[:, 1]]).all()
    g = graphs(table)[0]
    assert (g.edges["kind"] == EdgeKind.DATA).sum() >= 1
    plain = graphs(load(PUBLIC / "simple_add.kineto_for_et.json.gz"))[0]
    assert run_cpm(g).makespan == pytest.approx(run_cpm(plain).makespan)  # same measured run


def test_execution_trace_from_another_run_is_refused(tmp_path):
    with pytest.raises(TraceError, match="no op matches"):
        load(PUBLIC / "cuda_event_sync_1gpu.json.gz", et=PUBLIC / "simple_add.pytorch_et.json.gz")
    with pytest.raises(TraceError, match="not a PyTorch execution trace"):
        load_execution_trace(PUBLIC / "cuda_event_sync_1gpu.json.gz")


def test_chakra_through_the_cli(two_ranks, tmp_path, capsys):
    """analyze walks Chakra input (one window, no event table) like Kineto input: terminal and JSON."""
    import json as _json

    from conftest import run_cli

    code, out, _ = run_cli(["analyze", str(two_ranks)], capsys)
    assert code == 0 and "Step (whole trace)" in out
    code, out, _ = run_cli(["analyze", str(two_ranks), "--json"], capsys)
    assert code == 0 and _json.loads(out)["ranks"] == [] and len(_json.loads(out)["steps"]) == 1
    out = tmp_path.parent / f"{tmp_path.name}-o.json"  # (not in the input folder: a trace-like name there is refused first)
    code, _, err = run_cli(["analyze", str(two_ranks), "--perfetto", str(out)], capsys)
    assert code == 2 and "Chakra ET input has none to annotate" in err and not out.exists()

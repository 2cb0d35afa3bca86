"""The same answers wherever parsing and graph building run: this machine's processes, a Dask
LocalCluster (real scheduler and worker processes, over its real protocol), any Executor."""

from __future__ import annotations

import json
import operator
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bottleneck_oracle import api
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.graph_pipeline import builder, events
from bottleneck_oracle.graph_pipeline.engine import DaskEngine, LocalEngine, make_engine
from conftest import REAL, SAMPLE, run_cli

distributed = pytest.importorskip("distributed")
CASES = [SAMPLE, REAL / "dlrm_v100_8rank"]


def _answers(path, executor) -> str:
    _, analyses = api.analyze(path, None, None, None, executor)
    return json.dumps([a.to_dict(20) for a in analyses], sort_keys=True)


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_dask_cluster_gives_the_local_answers(path, client, monkeypatch):
    local = _answers(path, "local")
    ran_on = set()
    original = events._parse_task

    def parse_and_say_where(single, f):  # proof the work ran in the cluster's worker processes
        return original(single, f), os.getpid()

    monkeypatch.setattr(builder, "PARALLEL_EVENTS", 0)  # build steps through the engine even for small tables
    engine = make_engine(client)
    where = engine.map(parse_and_say_where, list(events.trace_files(path)), shared=False)
    ran_on.update(pid for _, pid in where)
    workers = set(client.run(os.getpid).values())
    assert ran_on and ran_on <= workers and os.getpid() not in ran_on
    assert _answers(path, client) == local


def test_any_executor_gives_the_local_answers():
    with ThreadPoolExecutor(2) as pool:
        assert _answers(REAL / "dlrm_v100_8rank", pool) == _answers(REAL / "dlrm_v100_8rank", None)


def test_local_engine_keeps_input_order():
    assert LocalEngine(2).map(operator.add, range(20), shared=100) == list(range(100, 120))


def test_executor_errors_are_one_line(capsys):
    with pytest.raises(OracleError, match="unknown executor"):
        make_engine("spark")
    code, _, err = run_cli(["analyze", str(SAMPLE), "--executor", "spark"], capsys)
    assert code == 2 and err.strip().count("\n") == 0 and "unknown executor 'spark'" in err
    with pytest.raises(OracleError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:1"):
        DaskEngine(address="tcp://127.0.0.1:1", timeout=2)


def test_cli_executor_dask(capsys):
    code, out, _ = run_cli(["analyze", str(SAMPLE), "--executor", "dask", "--json"], capsys, seconds=120)
    assert code == 0
    assert json.dumps(json.loads(out)["steps"], sort_keys=True) == json.dumps(json.loads(_cli_local(capsys))["steps"], sort_keys=True)


def test_a_full_temporary_folder_sends_the_table_to_each_worker_instead(capsys, monkeypatch):
    """The LocalCluster's workers map the event table from a temporary file; where it cannot be
    written (a full disk), the table is sent to them as before and the answers are the same."""
    from bottleneck_oracle.graph_pipeline import engine as engine_module

    written: list[str] = []

    def full(obj, path):
        written.append(path)
        with open(path, "wb") as fh:
            fh.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(engine_module, "dump_shared", full)
    code, out, _ = run_cli(["analyze", str(SAMPLE), "--executor", "dask", "--json"], capsys, seconds=120)
    assert code == 0 and written and not any(os.path.exists(p) for p in written)
    assert json.dumps(json.loads(out)["steps"], sort_keys=True) == json.dumps(json.loads(_cli_local(capsys))["steps"], sort_keys=True)


def _cli_local(capsys) -> str:
    code, out, _ = run_cli(["analyze", str(SAMPLE), "--json"], capsys)
    assert code == 0
    return out


def test_forked_build_hands_back_the_same_graphs(monkeypatch):
    """Large tables build their steps in forked workers that hand the graphs back as files."""
    in_process = _answers(SAMPLE, None)
    monkeypatch.setattr(builder, "PARALLEL_EVENTS", 0)
    monkeypatch.setattr(builder.os, "cpu_count", lambda: 2)
    assert _answers(SAMPLE, None) == in_process


def test_steps_are_built_as_they_are_consumed(monkeypatch):
    """analyze --json walks the steps one at a time: a step's graph is built when reached."""
    built = []
    original = builder.build_graph
    monkeypatch.setattr(builder, "build_graph", lambda t, s, o=None: built.append(s) or original(t, s, o))
    table, stream = api.analyze_stream(SAMPLE)
    assert built == []
    first = next(stream)
    assert built == [first.graph.step] == [1]
    assert [a.graph.step for a in stream] == [2, 3] and built == [1, 2, 3]
    with pytest.raises(Exception, match="no ProfilerStep#9"):  # a bad selection fails before any step is built
        api.analyze_stream(SAMPLE, [9])


def test_shared_data_written_for_local_workers_comes_back_whole_and_writable(tmp_path):
    """A LocalCluster's workers map the shared data (the event table) from one file instead of
    each being sent it: every array comes back equal, of its dtype, writable without touching the
    file, and the objects around them as they were."""
    from bottleneck_oracle.graph_pipeline.engine import dump_shared, load_shared

    rng = np.random.default_rng(3)
    obj = {
        "ts": rng.random(100_003),
        "rank": rng.integers(0, 4096, 5_001).astype(np.int32),
        "flag": rng.random(7) > 0.5,
        "every_other": np.arange(20, dtype=np.int64)[::2],  # not contiguous: pickled in band
        "names": ["aten::mm", "ncclKernel"],
        "empty": np.zeros(0, dtype=np.float32),
        "nested": ({"x": np.arange(3, dtype=np.int8)}, 2.5, None),
    }
    path = tmp_path / "shared.bin"
    dump_shared(obj, str(path))
    back = load_shared(str(path))
    assert back.keys() == obj.keys() and back["names"] == obj["names"] and back["nested"][1:] == (2.5, None)
    for k in ("ts", "rank", "flag", "every_other", "empty"):
        assert back[k].dtype == obj[k].dtype and np.array_equal(back[k], obj[k]), k
    assert np.array_equal(back["nested"][0]["x"], [0, 1, 2])
    before = path.read_bytes()
    back["ts"][:10] = -1.0  # a worker's change stays its own
    assert path.read_bytes() == before and load_shared(str(path))["ts"][0] == obj["ts"][0]

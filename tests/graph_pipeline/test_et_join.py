"""Execution traces of a multi-rank job: each file on its own rank, joined to the Kineto ops.

The DLRM set (8 V100 ranks, facebookresearch/param) is the real case: the ET files are named
dlrm_eg_N.json with no rank field, and their rf_ids are numbered differently from Kineto's
External ids once the forward and autograd threads interleave (a plain id join finds 79 of
1,672 ops per rank)."""

from __future__ import annotations

import gzip
import json
import re
import warnings

import numpy as np
import pytest

from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.api import graphs, load
from bottleneck_oracle.errors import OracleWarning, TraceError
from bottleneck_oracle.graph_pipeline.events import EvClass
from bottleneck_oracle.graph_pipeline.schema import EdgeKind
from conftest import REAL, run_cli

KINETO = REAL / "dlrm_v100_8rank"
ETS = REAL / "dlrm_v100_8rank_et"


def _et_doc(rank: int) -> dict:
    return json.loads(gzip.decompress((ETS / f"dlrm_eg_{rank}.json.gz").read_bytes()))


def test_each_execution_trace_joins_its_own_rank():
    table = load(KINETO, et=ETS)
    ets = table.execution_traces
    assert len(ets) == 8
    for e in ets:
        assert e["rank"] == int(re.search(r"_(\d+)\.json", e["path"]).group(1))  # dlrm_eg_N is rank N
        assert e["rank_from"] == "process id" and e["join_rule"] == "thread order"
        assert e["op_nodes"] == 1672 and e["joined"] >= 0.99 * e["op_nodes"]
    assert sorted(e["rank"] for e in ets) == list(range(8))
    # a wrong join would pair ops of different times: every tensor dependency must run forward,
    # the producer ending before its consumer starts, and some cross the forward/autograd threads
    c, d = table.cols, table.data_deps
    assert len(d) > 8 * 1000
    assert (c["ts"][d[:, 0]] + c["dur"][d[:, 0]] <= c["ts"][d[:, 1]] + 1.0).all()
    assert (c["rank"][d[:, 0]] == c["rank"][d[:, 1]]).all()
    assert (c["tid"][d[:, 0]] != c["tid"][d[:, 1]]).sum() > 8 * 50
    assert (c["cls"][d.ravel()] == EvClass.CPU).all()
    # the same measured run: the dependencies add edges, not time
    with_et, plain = graphs(table)[0], graphs(load(KINETO))[0]
    assert (with_et.edges["kind"] == EdgeKind.DATA).sum() > 8 * 50 and not (plain.edges["kind"] == EdgeKind.DATA).any()
    assert run_cpm(with_et).makespan == pytest.approx(run_cpm(plain).makespan, abs=1.0)


def test_rank_from_the_file_name_when_the_trace_has_no_pid(tmp_path):
    for rank, name in ((3, "et_rank3.json"), (5, "dlrm-5.json")):
        doc = _et_doc(rank)
        del doc["pid"]
        (tmp_path / name).write_text(json.dumps(doc))
    table = load(KINETO, et=tmp_path)
    got = {e["path"].rsplit("/", 1)[-1]: (e["rank"], e["rank_from"]) for e in table.execution_traces}
    assert got == {"et_rank3.json": (3, "file name"), "dlrm-5.json": (5, "file name")}
    assert all(e["joined"] == e["op_nodes"] for e in table.execution_traces)


def test_execution_traces_whose_rank_cannot_be_told_are_refused(tmp_path):
    doc = _et_doc(2)
    del doc["pid"]
    (tmp_path / "trace.json").write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="cannot tell which rank"):
        load(KINETO, et=tmp_path / "trace.json")
    twice = tmp_path / "twice"
    twice.mkdir()
    for name in ("a.json", "b.json"):
        (twice / name).write_text(json.dumps(_et_doc(4)))  # the same process twice
    with pytest.raises(TraceError, match="rank 4 .* already has an execution trace"):
        load(KINETO, et=twice)
    doc = _et_doc(1)
    del doc["pid"]
    (tmp_path / "et_9.json").write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="rank 9 .* has no Kineto trace"):
        load(KINETO, et=tmp_path / "et_9.json")


def test_a_low_join_rate_is_warned_about(tmp_path):
    doc = _et_doc(6)
    renamed = 0
    for n in doc["nodes"]:
        if not n["name"].startswith("[pytorch") and n["id"] % 5 != 0:  # 4 ops in 5 unknown to Kineto
            n["name"] = f"custom::op_{n['id']}"
            renamed += 1
    (tmp_path / "dlrm_eg_6.json").write_text(json.dumps(doc))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OracleWarning)
        table = load(KINETO, et=tmp_path)
    [e] = table.execution_traces
    assert e["rank"] == 6 and e["joined"] < e["op_nodes"] / 2
    assert e["unjoined"]["not in the Kineto trace"] == renamed
    msg = [str(w.message) for w in caught if issubclass(w.category, OracleWarning)]
    assert any(f"only {e['joined']} of {e['op_nodes']}" in m and "names the Kineto trace lacks" in m for m in msg)


def test_analyze_reports_the_join(capsys):
    code, stdout, _ = run_cli(["analyze", str(KINETO), "--et", str(ETS), "--json"], capsys)
    assert code == 0
    doc = json.loads(stdout)
    assert [e["rank"] for e in sorted(doc["execution_traces"], key=lambda e: e["rank"])] == list(range(8))
    assert sum(e["joined"] for e in doc["execution_traces"]) == 8 * 1672
    code, stdout, _ = run_cli(["analyze", str(KINETO), "--et", str(ETS)], capsys)
    assert code == 0 and "13376 of 13376 ops joined" in stdout.replace("\n", " ")
    assert np.isfinite(doc["steps"][0]["makespan_us"])

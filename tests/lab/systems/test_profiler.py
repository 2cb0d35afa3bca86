"""The profiler hook in a plain loop: per-rank trace, step markers, optional execution trace."""

from __future__ import annotations

import gzip
import json
import os

import pytest
import torch

from bottleneck_oracle.api import analyze
from bottleneck_oracle.errors import OracleWarning, TraceError
from bottleneck_oracle.graph_pipeline.schema import EdgeKind
from bottleneck_oracle_lab.systems.profiler import oracle_profile, phase


def _loop(prof, model, opt, x, steps):
    """``steps`` training steps, each phase marked, then prof.step()."""
    for _ in range(steps):
        with phase("forward"):
            loss = model(x).pow(2).mean()
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            opt.step()
            opt.zero_grad()
        prof.step()


def test_hook_writes_trace_and_execution_trace(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    with oracle_profile(tmp_path, steps=2, warmup=1, execution_trace=True) as prof:
        _loop(prof, model, opt, x, 3)
    assert (tmp_path / "rank-0.json.gz").exists() and (tmp_path / "et" / "rank-0.json").exists()
    table, steps = analyze(tmp_path, et=tmp_path / "et")
    assert [s.graph.step for s in steps] == [1, 2]
    assert len(table.data_deps) > 0  # the execution trace joined the Kineto ops
    assert sum(int((s.graph.edges["kind"] == EdgeKind.DATA).sum()) for s in steps) > 0


def test_windows_are_written_as_they_end_and_load_as_one_trace(tmp_path):
    """A long recording in windows: one file per window, each written when its window ends, and
    the loader takes them as one rank with every profiled step."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    with oracle_profile(tmp_path, steps=7, warmup=1, window=3) as prof:
        _loop(prof, model, opt, x, 4)  # the warm-up step and the first window of 3
        assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.w0001.json.gz"]
        _loop(prof, model, opt, x, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.w0001.json.gz", "rank-0.w0002.json.gz", "rank-0.w0003.json.gz"]
    with pytest.warns(OracleWarning, match="steps 4, 7 open a new profiling window"):  # each holds the export before it
        table, steps = analyze(tmp_path)
    assert [s.graph.step for s in steps] == list(range(1, 8))
    assert set(table.files) == {0}
    # no step is lost between windows: each starts where the one before ended, give or take the step boundary
    spans = sorted((s.start, s.end) for s in table.steps)
    assert all(b[0] >= a[1] - 1 for a, b in zip(spans, spans[1:]))


def test_a_window_that_overlaps_another_of_its_rank_is_refused(tmp_path):
    """Windows of one rank follow each other; the same window twice, or another process's window
    with the same step numbers (another run), is two traces of one rank. A second profiler's
    window in the same process counts its steps from 0 again: numbered on after the first's."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 32)
    for run in ("a", "b"):
        with oracle_profile(tmp_path / run, steps=2, warmup=1) as prof:
            _loop(prof, model, opt, x, 3)
    both = tmp_path / "both"
    both.mkdir()
    (both / "rank-0.json.gz").write_bytes((tmp_path / "a" / "rank-0.json.gz").read_bytes())
    (both / "rank-0.later.json.gz").write_bytes((tmp_path / "b" / "rank-0.json.gz").read_bytes())
    with pytest.warns(OracleWarning, match=r"ProfilerStep numbers \(1–2\) start again .* numbered on from there \(3–4\)"):
        steps = sorted(s.graph.step for s in analyze(both)[1])
    assert steps == [1, 2, 3, 4]
    doc = json.loads(gzip.open(tmp_path / "b" / "rank-0.json.gz").read())
    for e in doc["traceEvents"]:  # the later window from another process: another run
        if e.get("pid") == os.getpid():
            e["pid"] += 1
    with gzip.open(both / "rank-0.later.json.gz", "wt") as fh:
        json.dump(doc, fh)
    with pytest.raises(TraceError, match=r"rank 0 appears twice .*ProfilerStep#1 in both"):
        analyze(both)
    (both / "rank-0.later.json.gz").write_bytes((tmp_path / "a" / "rank-0.json.gz").read_bytes())
    with pytest.raises(TraceError, match="rank 0 appears twice .*over the same time"):
        analyze(both)

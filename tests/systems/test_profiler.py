"""The profiler hook in a plain loop: per-rank trace, step markers, optional execution trace."""

from __future__ import annotations

import torch

from bottleneck_oracle.api import analyze
from bottleneck_oracle.graph_pipeline.schema import EdgeKind
from bottleneck_oracle.systems.profiler import oracle_profile, phase


def test_hook_writes_trace_and_execution_trace(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 32)
    with oracle_profile(tmp_path, steps=2, warmup=1, execution_trace=True) as prof:
        for _ in range(3):
            with phase("forward"):
                loss = model(x).pow(2).mean()
            with phase("backward"):
                loss.backward()
            with phase("optimizer"):
                opt.step()
                opt.zero_grad()
            prof.step()
    assert (tmp_path / "rank-0.json.gz").exists() and (tmp_path / "et" / "rank-0.json").exists()
    table, steps = analyze(tmp_path, et=tmp_path / "et")
    assert [s.graph.step for s in steps] == [1, 2]
    assert len(table.data_deps) > 0  # the execution trace joined the Kineto ops
    assert sum(int((s.graph.edges["kind"] == EdgeKind.DATA).sum()) for s in steps) > 0

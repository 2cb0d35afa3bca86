"""Tensor-parallel GPT (2 ranks): the sharded model computes what the full one does, and its
traces give all-reduce barriers across the ranks and reproduce the measured steps."""

from __future__ import annotations

import numpy as np
import pytest

from bottleneck_oracle.api import analyze
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind
from conftest import job_step_us


@pytest.fixture(scope="module")
def tensor_run(tmp_path_factory):
    from bottleneck_oracle_lab.systems.tensor import TensorRun, record

    out = tmp_path_factory.mktemp("tp")
    return analyze(record(TensorRun(out=str(out), world=2, size="tiny", batch=2, steps=2)))[1]


def test_each_block_all_reduces_forward_and_backward(tensor_run):
    for a in tensor_run:
        n, e = a.graph.nodes, a.graph.edges
        bars = np.flatnonzero(n["category"] == Category.BARRIER)
        # per block: attention and MLP outputs forward, their input gradients backward
        assert len(bars) == 4 * 2  # tiny has 2 blocks
        assert (n["coll_kind"][bars] == CollectiveKind.ALL_REDUCE).all()
        for b in bars:
            to = e["dst"][(e["src"] == b) & (e["kind"] == EdgeKind.COLLECTIVE_SYNC)]
            assert sorted(n["rank"][to].tolist()) == [0, 1]


def test_cpm_step_time_matches_the_measured_step(tensor_run):
    first = min(a.graph.step for a in tensor_run)
    for a in tensor_run:
        measured = job_step_us(a.graph, a.graph.step == first)
        assert abs(a.step_time - measured) <= 0.02 * measured


def test_sharded_model_equals_the_full_model():
    """Both shards' results, summed as the all-reduce would, give the full model's output."""
    import torch

    from bottleneck_oracle_lab.systems.model import MLP, SIZES
    from bottleneck_oracle_lab.systems.tensor import _shard

    torch.manual_seed(0)
    mlp = MLP(SIZES["tiny"])
    x = torch.randn(3, 5, SIZES["tiny"].width)
    parts = []
    for rank in (0, 1):
        fc, out = _shard(mlp.fc, rank, 2, dim=0), _shard(mlp.out, rank, 2, dim=1)
        parts.append(out(torch.nn.functional.gelu(fc(x))))
    assert torch.allclose(parts[0] + parts[1] + mlp.out.bias, mlp(x), atol=1e-5)

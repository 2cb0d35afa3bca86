"""The graph network that corrects the replay: its numpy forward is the PyTorch Geometric
module's, it learns nothing where nothing changes, and it refuses what it was not trained on.

The launches are the synthetic 2-rank traces of tests/training/test_reruns.py: rank 1 runs extra
small ops in a block of steps; the clean steps around the block are the re-run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_reruns import _launch

from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.models.corrections import GraphCorrections, graph_inputs, load_corrections
from bottleneck_oracle_lab.training.graph_corrections import CorrectionNet, fit_graph_corrections
from bottleneck_oracle_lab.training.reruns import calibrate, corrected, merge


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph_corrections")
    return [_launch(root / f"r{k}", pairs=20 + 20 * k, seed=k)[0] for k in range(4)]


def test_the_numpy_forward_is_the_torch_modules(launches):
    g, f, _ = launches[0].steps[0][0]
    x, ei, attr = graph_inputs(g, f)
    torch.manual_seed(3)
    net = CorrectionNet(hidden=16, layers=2, heads=2)
    for p in net.head[2].parameters():  # away from its zero start, so the whole network counts
        torch.nn.init.normal_(p, std=0.5)
    mean, std = x.mean(axis=0).astype(np.float64), np.maximum(x.std(axis=0), 1e-3).astype(np.float64)
    with torch.no_grad():
        want = net(torch.from_numpy(((x - mean) / std).astype(np.float32)), torch.from_numpy(ei), torch.from_numpy(attr)).numpy()
    state = {k: v.numpy() for k, v in net.state_dict().items()}
    model = GraphCorrections([state], mean, std, x.min(axis=0), x.max(axis=0), hidden=16, layers=2, heads=2)
    got = model.member_log_factors(state, x, ei, attr)
    assert np.abs(want).max() > 0.05  # the outputs differ from node to node
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_it_stays_at_the_replay_where_nothing_else_changes_and_round_trips(launches, tmp_path):
    allc = merge(launches)
    model = fit_graph_corrections(merge(launches[:3]), members=2, epochs=4, hidden=16)
    calibrate(model, merge(launches[2:3]))
    pred = corrected(model, allc)
    assert np.all(np.abs(pred - allc.replay) <= 0.1 * allc.replay), (pred, allc.replay)
    g, f, _ = launches[3].steps[0][0]
    factors = model.factors(g, f)
    assert factors.shape == (2, g.n_nodes) and np.median(np.abs(np.log(factors))) < 0.05
    assert 0 <= model.halfwidth < 1.0
    model.trained_on = "three synthetic launches"
    g, f, _ = launches[1].steps[0][0]  # inside the training range (launch 3 removes more than any training launch)
    model.save(tmp_path / "g.npz")
    back = load_corrections(tmp_path / "g.npz")
    assert isinstance(back, GraphCorrections) and back.trained_on == "three synthetic launches"
    assert back.saving(g, f) == pytest.approx(model.saving(g, f)) and back.refusal(f) is None
    assert back.interval(100.0, f) == pytest.approx(model.interval(100.0, f))
    # a node far outside the training range (a 1000x longer op) is out of domain
    f.x = f.x.copy()
    f.x[:, 0] += 7.0
    assert "out of domain: node feature log_dur" in back.refusal(f)


def test_a_damaged_graph_corrections_file_is_one_clear_error(launches, tmp_path):
    model = fit_graph_corrections(merge(launches[:1]), members=1, epochs=1, hidden=8)
    model.save(tmp_path / "g.npz")
    with np.load(tmp_path / "g.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["m0/encode.weight"] = arrays["m0/encode.weight"][:, :3]
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(OracleError, match=r"bad.npz: not a corrections file \(member weights do not match"):
        load_corrections(tmp_path / "bad.npz")
    arrays.pop("m0/encode.weight")
    arrays["m0/encode.weight"] = np.full((8, 10), np.nan, dtype=np.float32)
    np.savez(tmp_path / "nan.npz", **arrays)
    with pytest.raises(OracleError, match="weights not finite"):
        load_corrections(tmp_path / "nan.npz")

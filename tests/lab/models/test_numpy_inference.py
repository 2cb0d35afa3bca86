"""Inference without torch: the numpy HeteroGAT (models.gat_numpy) against the PyTorch Geometric
module it reproduces (the lab's), on real graphs of the bundled traces and on what-if edits of
them; the Predictor's answers against the lab's TorchPredictor; the checkpoint's .npz companion;
and the advice path importing neither torch nor torch_geometric."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch

from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.analysis.phases import node_phases
from bottleneck_oracle.analysis.whatif import EditedTimes
from bottleneck_oracle.api import graphs
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.models import checkpoint as core
from bottleneck_oracle.models.gat_numpy import NODE_TYPES, GATConfig, NumpyGAT, model_inputs
from bottleneck_oracle.models.predict import Predictor, pretrained_path, sample_for
from bottleneck_oracle_lab.models import checkpoint as C
from bottleneck_oracle_lab.models.checkpoint import pretrained_checkpoint
from bottleneck_oracle_lab.models.hetero_gat import prepare
from bottleneck_oracle_lab.models.pyg import heterodata
from bottleneck_oracle_lab.models.reference import TorchPredictor
from conftest import PUBLIC, REAL, SAMPLE, cached_load

# in-domain CPU (gloo) runs, GPU traces with collectives, and a trace without any network node
TRACES = [
    SAMPLE,
    SAMPLE.parent / "gloo_ddp_10steps_injected",
    PUBLIC / "nccl_2rank_rank0.json.gz",
    REAL / "ddp_v100_rank1of2_5steps.json.gz",
    PUBLIC / "simple_add_1gpu.json.gz",
]


@pytest.fixture(scope="module")
def shipped():
    return C.load_checkpoint(pretrained_checkpoint())


def _edits(g, seed: int):
    """A what-if: a seeded third of the ops 0.3-3x as long, some latencies changed, some edges detached."""
    rng = np.random.default_rng(seed)
    d = g.nodes["mdur"].astype(np.float64).copy()
    pick = rng.random(g.n_nodes) < 0.33
    d[pick] *= rng.uniform(0.3, 3.0, int(pick.sum()))
    w = g.edges["weight"].astype(np.float64).copy()
    move = rng.random(g.n_edges) < 0.1
    w[move] = np.abs(w[move]) * rng.uniform(0.0, 2.0, int(move.sum()))
    w[rng.random(g.n_edges) < 0.02] = np.inf
    return d, w


def _samples(path, steps: int = 2):
    """(graph, unedited sample, edited sample) of the first ``steps`` steps of a trace."""
    table = cached_load(path)
    out = []
    for i, g in enumerate(graphs(table)[:steps]):
        base = run_cpm(g)
        phases = node_phases(table, g)
        d, w = _edits(g, i)
        times = EditedTimes(g, d, w, g.release.astype(np.float64))
        out.append((g, sample_for(g, None, table, base, phases)[0], sample_for(g, times, table, base, phases)[0]))
    return out


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_the_numpy_forward_equals_pyg_for_every_shipped_variant(path, shipped):
    checked = 0
    for _, unedited, edited in _samples(path):
        for data in (unedited, edited):
            for variant, entry in shipped["gat"].items():
                pyg = C.gat_from(shipped, variant)
                with torch.no_grad():
                    want = pyg(Batch.from_data_list([prepare(heterodata(data), variant)]))
                got = NumpyGAT(GATConfig.from_dict(entry["config"]), C.inference_part(shipped)["gat"][variant]["state"])(
                    model_inputs(data, variant)
                )
                assert set(got) == set(want)
                for key, value in want.items():
                    assert got[key].shape == tuple(value.shape), key
                    np.testing.assert_allclose(got[key], value.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{variant} {key}")
                checked += 1
    assert checked >= 6


def test_the_inputs_are_the_documented_transforms():
    (g, data, _), *_ = _samples(SAMPLE, 1)
    ref = data.scalars["ref_step"]
    corr, bidi = model_inputs(data, "correction"), model_inputs(data, "bidirectional")
    for t in NODE_TYPES:
        store = data.nodes[t]
        x = corr.x[t]
        assert x.shape == (len(store["x"]), store["x"].shape[1] + 3)
        np.testing.assert_allclose(x[:, -3:], np.column_stack([store["est"] / ref, store["slack"] / ref, store["critical"]]), rtol=1e-6)
        np.testing.assert_array_equal(bidi.x[t], store["x"])
    for (s, r, d), e in data.edges.items():
        ms = torch.from_numpy(e["edge_attr"][:, 0]).double()
        np.testing.assert_allclose(bidi.edge_in[(s, r, d)][:, 0], (torch.sign(ms) * torch.log1p(ms.abs())).numpy(), rtol=1e-6)
        np.testing.assert_array_equal(bidi.edge_index[(d, f"rev_{r}", s)], e["edge_index"][::-1])
        assert (d, f"rev_{r}", s) not in corr.edge_index
    assert corr.g_in.shape == (4,) and bidi.g_in.shape == (2,)
    assert corr.g_in[0] == pytest.approx(np.log(ref / 1000.0), rel=1e-6)
    # the reverse edges are PyG's ToUndirected(merge=False): the same rev_<rel> types, flipped, same attributes
    # (built in numpy, as inference runs without PyG)
    from torch_geometric.transforms import ToUndirected

    und = ToUndirected(merge=False)(heterodata(data))
    rev = [et for et in und.edge_types if et[1].startswith("rev_")]
    assert sorted(rev) == sorted(et for et in bidi.edge_index if et[1].startswith("rev_"))
    for s, r, d in rev:
        np.testing.assert_array_equal(und[(s, r, d)].edge_index.numpy(), bidi.edge_index[(s, r, d)])
        np.testing.assert_array_equal(und[(s, r, d)].edge_attr.numpy(), data.edges[(d, r[4:], s)]["edge_attr"])


@pytest.mark.parametrize(
    "path", [SAMPLE, SAMPLE.parent / "gloo_ddp_10steps_injected", PUBLIC / "nccl_2rank_rank0.json.gz"], ids=lambda p: p.name
)
def test_the_predictor_answers_as_the_torch_engine_does(path):
    fast, reference = Predictor(), TorchPredictor(pretrained_checkpoint())
    assert fast.variants == reference.variants
    answered = 0
    for g, unedited, edited in _samples(path, 3):
        for data in (unedited, edited):
            assert fast.refusal(g, data) == reference.refusal(g, data)
        want, got = reference.effect(g, unedited, edited), fast.effect(g, unedited, edited)
        assert got.out_of_domain == want.out_of_domain
        for key in ("step_us", "delta_us"):
            g_, w_ = getattr(got, key), getattr(want, key)
            assert list(g_) == list(w_)
            for v, x in w_.items():
                assert (g_[v] is None) == (x is None)
                if x is not None:
                    assert g_[v] == pytest.approx(x, abs=1e-5 * unedited.scalars["ref_step"])
        answered += want.out_of_domain is None
    if path == SAMPLE:
        assert answered  # the shipped model answers for its own kind of trace


def test_the_shipped_inference_file_is_the_lab_checkpoint(shipped):
    pt = pretrained_checkpoint()
    assert pretrained_path().name == "pretrained.npz" and not pretrained_path().with_suffix(".pt").exists()  # the weights ship once
    part = core.read_companion(pretrained_path(), source=pt)
    assert part is not None, "pretrained.npz was written from another pretrained.pt: run the lab's models.checkpoint.write_companion"
    want = C.inference_part(shipped)
    assert list(part["gat"]) == list(want["gat"])
    for v, entry in want["gat"].items():
        assert part["gat"][v]["config"] == entry["config"]
        assert set(part["gat"][v]["state"]) == set(entry["state"])
        for k, a in entry["state"].items():
            np.testing.assert_array_equal(part["gat"][v]["state"][k], a)
    for t, r in want["feature_ranges"].items():
        np.testing.assert_array_equal(part["feature_ranges"][t], r)
    assert {k: part[k] for k in C.META_KEYS} == {k: shipped[k] for k in C.META_KEYS}


def test_a_stale_or_missing_companion_is_refused_by_the_product_and_converted_by_the_lab(shipped, tmp_path):
    pt = tmp_path / "mine.pt"
    shutil.copy(pretrained_checkpoint(), pt)
    shutil.copy(pretrained_path(), C.companion_path(pt))
    ckpt = torch.load(pt, weights_only=True)
    ckpt["gat"]["directed"]["state"]["step_head.2.bias"] += 1.0  # retrained: the .npz beside it is now stale
    torch.save(ckpt, pt)
    key = "step_head.2.bias"
    with pytest.raises(OracleError, match="mine.pt: inference reads its mine.npz beside it, and it was written from another .pt"):
        core.load_inference(pt)
    loaded = C.load_inference(pt)  # the lab: converted in memory
    np.testing.assert_array_equal(loaded["gat"]["directed"]["state"][key], ckpt["gat"]["directed"]["state"][key].numpy())
    C.companion_path(pt).unlink()
    with pytest.raises(OracleError, match="mine.pt: inference reads its mine.npz beside it, and there is none"):
        core.load_inference(pt)
    np.testing.assert_array_equal(C.load_inference(pt)["gat"]["directed"]["state"][key], ckpt["gat"]["directed"]["state"][key].numpy())
    fresh = C.write_companion(pt)
    assert core.read_companion(fresh, source=pt)["gat"]["directed"]["state"][key] == pytest.approx(
        float(ckpt["gat"]["directed"]["state"][key])
    )
    assert core.load_inference(pt)["gat"]["directed"]["state"][key] == pytest.approx(float(ckpt["gat"]["directed"]["state"][key]))
    direct = Predictor(fresh)  # an .npz given directly
    (g, unedited, edited), *_ = _samples(SAMPLE, 1)
    assert direct.step_times(unedited)["directed"] == pytest.approx(TorchPredictor(pt).step_times(unedited)["directed"], rel=1e-5)


def test_foreign_and_incompatible_companions_are_refused(shipped, tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(OracleError, match="junk.npz: not a readable inference file"):
        core.load_inference(tmp_path / "junk.npz")
    np.savez(tmp_path / "foreign.npz", weights=np.zeros(2))
    with pytest.raises(OracleError, match="foreign.npz: not a readable inference file"):
        core.load_inference(tmp_path / "foreign.npz")
    np.savez(tmp_path / "pickled.npz", meta=np.array([{"companion_format": core.COMPANION_FORMAT}], dtype=object))
    with pytest.raises(OracleError, match="pickled.npz: not a readable inference file"):  # object arrays need pickle: refused
        core.load_inference(tmp_path / "pickled.npz")
    meta = {"companion_format": core.COMPANION_FORMAT, "arrays": [["gat/directed/x", "|O", [1], 0]]}
    np.savez(tmp_path / "objects.npz", meta=np.array(json.dumps(meta)), arrays=np.zeros(8, dtype=np.uint8))
    with pytest.raises(OracleError, match="objects.npz: not a readable inference file .*holds objects"):
        core.load_inference(tmp_path / "objects.npz")
    pt = tmp_path / "old.pt"
    torch.save(dict(shipped, feature_version=shipped["feature_version"] - 1), pt)
    with pytest.raises(OracleError, match="feature schema .* rebuild the dataset and retrain"):
        core.load_inference(C.write_companion(pt, dict(shipped, feature_version=shipped["feature_version"] - 1)))


def test_weights_the_numpy_forward_does_not_know_are_refused(shipped):
    entry = C.inference_part(shipped)["gat"]["directed"]
    with pytest.raises(ValueError, match="does not use: extra.weight"):
        NumpyGAT(GATConfig.from_dict(entry["config"]), dict(entry["state"], **{"extra.weight": np.zeros(1)}))
    state = dict(entry["state"])
    del state["norms.1.compute.weight"]
    with pytest.raises(ValueError, match="lack norms.1.compute.weight"):
        NumpyGAT(GATConfig.from_dict(entry["config"]), state)


def test_advise_with_the_model_imports_no_torch():
    code = (
        "import sys; from bottleneck_oracle import cli; "
        f"sys.argv = ['bottleneck-oracle', 'analyze', {str(SAMPLE)!r}, '--advise', '--model', '--json']\n"
        "try:\n    cli.main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "bad = sorted(m for m in ('torch', 'torch_geometric') if m in sys.modules)\n"
        "print('IMPORTED', ','.join(bad), file=sys.stderr); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    suggestions = [s for step in json.loads(r.stdout)["steps"] for s in step["advice"]["suggestions"]]
    assert any(v is not None for s in suggestions for v in s["model_saving_us"].values())  # the model did answer

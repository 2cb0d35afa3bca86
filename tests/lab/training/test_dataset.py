"""build-dataset on the CI grid: samples round-trip to valid HeteroData with consistent labels."""

from __future__ import annotations

import json

import pytest
import torch

from bottleneck_oracle.api import build
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle_lab.training.dataset import build_dataset, load_sample


def test_dataset_round_trips_and_culprits_match_the_manifest(generated_grid, tmp_path):
    raw, grid = generated_grid
    summary = build_dataset(raw, tmp_path)
    samples = [json.loads(line) for line in (tmp_path / "dataset.jsonl").read_text().splitlines()]
    assert summary["samples"] == len(samples) == 2 * grid.steps
    graphs = {}
    for s in samples:
        data = load_sample(s["path"])  # torch.load(weights_only=True), then HeteroData.validate
        for t in ("compute", "network"):
            n = data[t].x.shape[0]
            assert data[t].slack.shape == (n,) and data[t].critical.shape == (n,) and data[t].node_id.shape == (n,)
            assert (data[t].slack >= 0).all()
        assert float(data.y_step) == s["step_time_us"] or abs(float(data.y_step) - s["step_time_us"]) < 1.0
        assert data.culprit.tolist() == s["culprit_ids"]
        if s["injection"]:
            assert s["culprit_ids"], s["id"]
            if s["run_id"] not in graphs:
                graphs[s["run_id"]] = {g.step: g for g in build(raw / s["run_id"])[1]}
            g = graphs[s["run_id"]][s["step"]]
            for i in s["culprit_ids"]:  # the culprit node is the injected range on the injected rank
                assert g.nodes["rank"][i] == s["injection"]["rank"]
                assert g.node_name(i).startswith(f"oracle_inject:{s['injection']['kind']}:")
                assert s["injection"]["where"] in g.node_name(i)
            assert s["baseline"] == f"{s['run_id']}/step-{s['step'] - 1}"
        else:
            assert data.culprit.numel() == 0
    assert set(summary["splits"]["split_random"]) <= {"train", "val", "test"}
    assert summary["splits"]["split_ood_layout"] == {"test": grid.steps, "train": grid.steps}
    # a saved sample is plain tensors: nothing to unpickle
    raw_tensors = torch.load(samples[0]["path"], weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in raw_tensors.values())
    # the same samples as a PyG Dataset: indexable, split like `train` splits them, batched by PyG's DataLoader
    from torch_geometric.loader import DataLoader

    from bottleneck_oracle_lab.training.train import graph_dataset, parts, read_rows

    ds = graph_dataset(tmp_path)
    assert len(ds) == len(samples) and float(ds[3].y_step) == float(load_sample(samples[3]["path"]).y_step)
    test = graph_dataset(tmp_path, "ood_layout", "test")
    assert len(test) == len(parts(read_rows(tmp_path), "ood_layout", 0)["test"]) == grid.steps
    batch = next(iter(DataLoader(test, batch_size=3)))
    assert batch.num_graphs == 3 and batch["compute"].x.shape[0] == sum(test[i]["compute"].x.shape[0] for i in range(3))
    with pytest.raises(OracleError, match="part must be"):
        graph_dataset(tmp_path, "random", "holdout")


def test_whatif_samples_lengthen_the_op_the_delay_follows(generated_grid, tmp_path):
    raw, grid = generated_grid
    build_dataset(raw, tmp_path)
    samples = [json.loads(line) for line in (tmp_path / "dataset.jsonl").read_text().splitlines()]
    whatifs = [s for s in samples if s["whatif"]]
    assert len(whatifs) == 2 * len(range(3, grid.steps + 1, 3))  # every injected step has its what-if
    for s in whatifs:
        w = s["whatif"]
        data = load_sample(w["path"])
        base = load_sample(next(x["path"] for x in samples if x["id"] == s["baseline"]))
        assert len(w["sites"]) == len(s["culprit_ids"])  # one lengthened op per injected range (per micro-batch call)
        assert float(data.edit_us) == w["delta_us"] * len(w["sites"])
        assert float(data.ref_step) == float(base.y_step) and float(data.y_step) == pytest.approx(s["step_time_us"], abs=0.01)
        assert float(data.replay_step) == pytest.approx(float(data.ref_step) + w["replay_dt_us"], abs=1.0)
        # the injected rank's ops: the baseline's graph with the sites lengthened
        x_edit, x_base = data["compute"].x, base["compute"].x
        changed = (x_edit[:, 0] != x_base[:, 0]).nonzero().flatten()
        assert 1 <= len(changed) <= len(w["sites"])
        assert 0 < w["replay_dt_us"] <= w["delta_us"] * len(w["sites"]) + 1

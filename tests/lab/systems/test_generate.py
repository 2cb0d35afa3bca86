"""`generate` on the CI grid: real runs, a manifest per profiled step, resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bottleneck_oracle.config import ConfigError, GridConfig
from bottleneck_oracle_lab.systems.generate import cells, generate

GRID = Path(__file__).parents[2] / "data" / "grid-tiny.yaml"


def test_grid_cells_skip_collective_injections_on_pipelines():
    grid = GridConfig(sizes=["tiny"], layouts=["dp2", "pp2-afab"], injection_kinds=["collective", "rank"])
    assert [c["run_id"] for c in cells(grid)] == ["tiny-dp2-collective", "tiny-dp2-rank", "tiny-pp2-afab-rank"]


@pytest.mark.parametrize(
    "kwargs,problem", [({"layouts": ["xp2"]}, "grid.layouts"), ({"sizes": ["huge"]}, "grid.sizes"), ({"steps": 2}, "grid.steps")]
)
def test_bad_grid_is_named(kwargs, problem):
    with pytest.raises(ConfigError, match=problem):
        GridConfig(**kwargs)


def test_generate_records_the_grid_and_resumes(generated_grid):
    out, grid = generated_grid
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * grid.steps
    perturbed = [r for r in rows if r["injection"]]
    assert {r["step"] for r in perturbed} == set(range(3, grid.steps + 1, 3))  # every third step from 3 on
    for r in perturbed:
        assert r["baseline_step"] == r["step"] - 1 and r["injection"]["slept_ms"] >= r["injection"]["delay_ms"]
        assert r["step_time_us"] > 0 and Path(r["path"], "DONE").exists()
    # the manifest's step time is the slowest rank's ProfilerStep span of that run
    # (the delay's effect on it is measured with medians in test_inject.py: one step pair is noise)
    from bottleneck_oracle.graph_pipeline.events import load_events

    for run_id in {r["run_id"] for r in rows}:
        table = load_events(out / run_id)
        spans: dict[int, float] = {}
        for st in table.steps:
            spans[st.number] = max(spans.get(st.number, 0.0), st.span)
        assert {r["step"]: r["step_time_us"] for r in rows if r["run_id"] == run_id} == pytest.approx(spans)
    again = generate(grid, out)
    assert again["recorded"] == 0 and again["skipped"] == 2 and again["steps"] == len(rows)

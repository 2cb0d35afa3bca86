"""blame and the naive culprit finders on the CI grid's injected steps."""

from __future__ import annotations

import json

from bottleneck_oracle.analysis.blame import blame, largest_rank_deviation
from bottleneck_oracle.api import build


def test_the_injected_op_is_found_on_a_dp_run(generated_grid):
    raw, _ = generated_grid
    run = next(p for p in raw.iterdir() if "dp2" in p.name and p.is_dir())
    rows = [json.loads(line) for line in (raw / "manifest.jsonl").read_text().splitlines()]
    injected = [r for r in rows if r["run_id"] == run.name and r["injection"]]
    _, graphs = build(run)
    by_step = {g.step: g for g in graphs}
    for r in injected:
        g = by_step[r["step"]]
        culprit = {
            i for i in range(g.n_nodes) if g.node_name(i).startswith("oracle_inject:") and g.nodes["rank"][i] == r["injection"]["rank"]
        }
        refs = [h for s, h in by_step.items() if s not in (r["step"], min(by_step))]
        b = blame(g, refs, top=3)
        assert b.nodes[0]["id"] in culprit, (r["step"], b.nodes[0])
        assert b.nodes[0]["saving_us"] > 0.5 * r["injection"]["delay_ms"] * 1000
        # an op no other rank runs deviates by its whole duration
        assert largest_rank_deviation(g, 1)[0] in culprit
    assert injected

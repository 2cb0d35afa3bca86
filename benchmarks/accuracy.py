"""Accuracy report on the bundled real traces: the CPM step time against the period the raw
events show (graph_pipeline.facts) and the ProfilerStep span against that period, per step; the
self-check's invariants; and the critical path against HTA's overlay of simple_add_1gpu.

    python benchmarks/accuracy.py [--json]
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from bottleneck_oracle.analysis.compare import hta_agreement
from bottleneck_oracle.api import analyze, graphs, load
from bottleneck_oracle.serial import to_json_object

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    inputs = sorted(f for f in (DATA / "public-gpu").glob("*.json.gz") if "pytorch_et" not in f.name and "overlay" not in f.name)
    inputs += [DATA / "public-gpu" / "sampled_128rank"]
    inputs += sorted((DATA / "real-gpu").glob("*.json.gz")) + [DATA / "real-gpu" / "dlrm_v100_8rank"]
    inputs += sorted((DATA / "more-gpu").glob("*.json.gz")) + [DATA / "gloo_ddp_2rank"]
    rows = []
    for path in inputs:
        _, steps = analyze(path)
        vs_period = [100 * (s.cpm.makespan - s.period) / s.period for s in steps]
        span_off = [100 * (s.measured - s.period) / s.period for s in steps]
        checks = [c for s in steps for c in s.checks()]
        rows.append(
            {
                "trace": path.name,
                "ranks": len(steps[0].graph.ranks),
                "steps": len(steps),
                "nodes": steps[0].graph.n_nodes,
                "max_abs_error_pct": max(abs(e) for e in vs_period),
                "max_abs_span_vs_period_pct": max(abs(e) for e in span_off),
                "checks": len(checks),
                "checks_failed": sum(not c.ok for c in checks),
            }
        )
    table = load(DATA / "public-gpu" / "simple_add_1gpu.json.gz")
    from bottleneck_oracle.analysis.cpm import run_cpm

    g = graphs(table)[0]
    hta = hta_agreement(table, g, run_cpm(g), DATA / "public-gpu" / "simple_add_1gpu.hta_critical_path_overlay.json.gz")
    if a.json:
        print(
            json.dumps(
                {
                    "makespan": rows,
                    "hta": {k: v for k, v in to_json_object(hta).items() if not k.startswith("only_") or k.endswith("_all")},
                },
                indent=1,
            )
        )
        return
    print("| trace | ranks | steps | nodes (first step) | max abs(CPM - period) | max abs(span - period) | checks failed |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['trace']} | {r['ranks']} | {r['steps']} | {r['nodes']:,} | {r['max_abs_error_pct']:.2f}% | "
            f"{r['max_abs_span_vs_period_pct']:.1f}% | {r['checks_failed']} of {r['checks']} |"
        )
    print(
        f"\nHTA agreement on simple_add_1gpu: Jaccard {hta.jaccard:.3f} on the events HTA models "
        f"({hta.shared} shared, {len(hta.only_ours)} only ours, {len(hta.only_hta)} only HTA); "
        f"{hta.jaccard_all_events:.3f} on all events"
    )
    for k in hta.only_ours:
        print("  only ours:", k)
    for k in hta.only_hta:
        print("  only HTA: ", (k[0], k[1], k[2][:70]))


if __name__ == "__main__":
    main()

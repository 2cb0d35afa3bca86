"""Culprit recovery on the generated dataset: does `blame` name the injected delay?

For every injected step of the dataset (`build-dataset` output), rank its nodes with the
counterfactual blame (typical durations from the run's other steps) and with two naive finders
(the longest ops on the critical path; the ops most slower than the same op on the other ranks),
and count how often the injected range (the culprit node: the injected rank's
``oracle_inject:*`` op) is first, or among the first three. Reported for all injected steps and
split by what the re-run measured: steps whose measured time grew by at least half the injected
total over their paired unperturbed step ("lengthened"), and the others ("absorbed": the delay
overlapped waiting, or moved into the next step, or drowned in noise), where the causal blame
rightly gives the injection little or no saving.

    python benchmarks/culprits.py [--dataset data/graphs] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from bottleneck_oracle.analysis.blame import blame
from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.analysis.naive import largest_rank_deviation, longest_on_critical_path
from bottleneck_oracle.api import build


def _rates(hits: dict[str, list[tuple[bool, bool]]]) -> dict[str, dict]:
    """Per method: number of steps, top-1 and top-3 hit rates."""
    return {m: {"n": len(v), "top1": float(np.mean([x[0] for x in v])), "top3": float(np.mean([x[1] for x in v]))} for m, v in hits.items()}


def _line(rates: dict[str, dict]) -> str:
    return "  ".join(f"{m.split(' (')[0]} {100 * v['top1']:.0f}/{100 * v['top3']:.0f}%" for m, v in rates.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="data/graphs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = [json.loads(line) for line in (Path(args.dataset) / "dataset.jsonl").read_text().splitlines()]
    runs: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        runs[r["run_id"]].append(r)
    methods = (
        "blame (counterfactual replay)",
        "blame, clean baseline (unperturbed steps)",
        "blame anomalies (excess over typical)",
        "longest op on the critical path",
        "largest deviation from other ranks",
    )
    hits = {m: [] for m in methods}
    per_layout: dict[str, dict[str, list]] = defaultdict(lambda: {m: [] for m in methods})
    by_effect: dict[str, dict[str, list]] = defaultdict(lambda: {m: [] for m in methods})
    step_time = {r["id"]: r["step_time_us"] for r in rows}
    seconds = []
    for run_id, rs in runs.items():
        _, graphs = build(rs[0]["trace"])
        by_step = {g.step: g for g in graphs}
        clean = {r["step"] for r in rs if not r["culprit_ids"]}
        for r in rs:
            if not r["culprit_ids"]:
                continue
            g = by_step[r["step"]]
            refs = [h for s, h in by_step.items() if s != r["step"] and s != min(by_step)]
            cpm = run_cpm(g)
            t0 = time.perf_counter()
            b = blame(g, refs, top=3, cpm=cpm)
            seconds.append(time.perf_counter() - t0)
            # as with --baseline: references from steps without an injection (the run injects the
            # same range every third step, so its other steps make a 5 ms injection look usual)
            b_clean = blame(g, [h for s, h in by_step.items() if s in clean and s != min(by_step)], top=3, cpm=cpm)
            ranked = {
                methods[0]: [x.id if x.kind == "op" else -1 for x in b.nodes],  # the injected range itself, not the time after it
                methods[1]: [x.id if x.kind == "op" else -1 for x in b_clean.nodes],
                methods[2]: [x.id if x.kind == "op" else -1 for x in b.anomalies],
                methods[3]: longest_on_critical_path(g, cpm),
                methods[4]: largest_rank_deviation(g),
            }
            culprit = set(r["culprit_ids"])
            inj = r["injection"]
            grew = r["step_time_us"] - step_time.get(r["baseline"], np.inf)
            effect = "lengthened" if grew >= 0.5 * 1000 * inj["delay_ms"] * inj.get("calls", 1) else "absorbed"
            for m, ids in ranked.items():
                h = (bool(ids) and ids[0] in culprit, bool(culprit & set(ids[:3])))
                hits[m].append(h)
                per_layout[r["layout"]][m].append(h)
                by_effect[effect][m].append(h)
        print(f"{run_id}: {sum(1 for r in rs if r['culprit_ids'])} injected steps", file=sys.stderr)
    n = len(hits[methods[0]])
    result = {"steps": n, "blame_seconds_per_step": float(np.mean(seconds))}
    result["methods"] = {m: {k: v for k, v in r.items() if k != "n"} for m, r in _rates(hits).items()}
    result["per_layout"] = {layout: _rates(d) for layout, d in sorted(per_layout.items())}
    result["by_effect"] = {effect: _rates(d) for effect, d in sorted(by_effect.items())}
    print(f"{n} injected steps; blame {result['blame_seconds_per_step'] * 1000:.0f} ms per step")
    print(f"{'method':40s} {'top-1':>7s} {'top-3':>7s}")
    for m, v in result["methods"].items():
        print(f"{m:40s} {100 * v['top1']:6.1f}% {100 * v['top3']:6.1f}%")
    for layout, d in result["per_layout"].items():
        print(f"  {layout:10s} {_line(d)}")
    for effect, d in result["by_effect"].items():
        print(f"  {effect:10s} ({next(iter(d.values()))['n']} steps) {_line(d)}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

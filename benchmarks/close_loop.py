"""Closing the loop: apply `advise`'s top suggestion for real, re-run, compare the saving.

Each scenario is a real 2-rank gloo DDP run (tiny GPT) with a problem built in through a knob
the workload exposes: an untraced straggler sleep, a slow module, a slow optimizer phase, a
delayed gradient all-reduce, tiny gradient buckets. The script records it, asks `advise`
(offline recipe engine, replay + pretrained model) for suggestions, takes the top one, applies
the change its what-if edit describes through the same knob (an edit that scales the injected
ops by F -> the injected delay times F; "restore rank 1 to typical" -> no straggler; "rank 1's
untraced time x 0.5" -> the straggler's sleep halved; fewer all-reduces -> bucket_cap_mb 25),
re-runs, and reports the predicted saving (median over
the steps of the replay's and the model's) beside the measured one (median step before - after).
If the top suggestion's recipe is not one this workload has a knob for, that is reported.

    python benchmarks/close_loop.py [--steps 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from bottleneck_oracle import api
from bottleneck_oracle.serial import to_json_object
from bottleneck_oracle_lab.systems.ddp import DDPRun, record
from bottleneck_oracle_lab.systems.inject import Injection


def _every(kind: str, steps: int, **kw) -> tuple[Injection, ...]:
    return tuple(Injection(kind=kind, step=s, **kw) for s in range(1, steps + 1))


def _scale_of(edits: list[str], default: float = 1.0) -> float:
    for e in edits:
        m = re.search(r"scale=([0-9.]+)", e)
        if m:
            return float(m.group(1))
    return default


def scenarios(steps: int) -> list[dict]:
    base = {"world": 2, "steps": steps, "size": "tiny", "batch": 4, "bucket_mb": 25.0}
    return [
        {"name": "untraced straggler sleep (rank 1, 30 ms per forward)", "run": {**base, "straggler": 1, "delay_ms": 30.0}},
        {
            "name": "slow module (rank 1 layers.0.mlp +20 ms)",
            "run": {**base, "injections": _every("module", steps, rank=1, target="layers.0.mlp", delay_ms=20.0)},
        },
        {
            "name": "slow optimizer phase (rank 0 +15 ms)",
            "run": {**base, "injections": _every("phase", steps, rank=0, target="optimizer", delay_ms=15.0)},
        },
        {
            "name": "slow optimizer phase on both ranks (+15 ms)",
            "run": {
                **base,
                "injections": _every("phase", steps, rank=0, target="optimizer", delay_ms=15.0)
                + _every("phase", steps, rank=1, target="optimizer", delay_ms=15.0),
            },
        },
        {
            "name": "delayed gradient all-reduce (rank 1 +20 ms)",
            "run": {**base, "injections": _every("collective", steps, rank=1, delay_ms=20.0)},
        },
        {"name": "slow rank at step start (rank 0 +25 ms)", "run": {**base, "injections": _every("rank", steps, rank=0, delay_ms=25.0)}},
        {"name": "tiny gradient buckets (0.01 MB)", "run": {**base, "bucket_mb": 0.01}},
        {"name": "untraced straggler sleep (rank 0, 15 ms per forward)", "run": {**base, "straggler": 0, "delay_ms": 15.0}},
    ]


def touches_injection(edits: list[str], trace: Path) -> float | None:
    """The scale an edit applies to the injected ops (``oracle_inject:*``) of the trace, or None."""
    from bottleneck_oracle.analysis.phases import node_phases
    from bottleneck_oracle.analysis.whatif import Edit

    table, graphs = api.build(trace)
    g = graphs[min(1, len(graphs) - 1)]
    phases = node_phases(table, g)[0]
    for text in edits:
        e = Edit.parse(text)
        if e.gap:
            continue
        if any(g.node_name(i).startswith("oracle_inject:") for i in e.select(g, phases)):
            return e.scale
    return None


def apply(suggestion: dict, run: dict, trace: Path) -> tuple[dict | None, str]:
    """The real change that implements a suggestion's what-if in this workload, or None."""
    rid, edits = suggestion["source"], suggestion["edits"]
    if rid == "dp-bucket-size" or rid == "dp-allreduce-overlap" and run.get("bucket_mb", 25) < 1:
        return {**run, "bucket_mb": 25.0}, "bucket_cap_mb 25"
    if run.get("straggler", -1) >= 0:
        if rid == "straggler-rank":
            return {**run, "straggler": -1, "delay_ms": 0.0}, "straggler removed"
        if rid in ("untraced-host-time",):
            k = _scale_of(edits)
            return {**run, "delay_ms": run["delay_ms"] * k}, f"straggler sleep x {k}"
    injections = run.get("injections", ())
    if injections:  # the edit scales the injected ops: scale the real delay the same way
        k = 0.0 if rid == "straggler-rank" else touches_injection(edits, trace)
        if k is not None:
            new = tuple(replace(i, delay_ms=i.delay_ms * k) for i in injections if i.delay_ms * k > 0)
            return {**run, "injections": new}, f"injected delay x {k:g}"
    return None, f"no knob for {rid} in this workload"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, sc in enumerate(scenarios(args.steps)):
            before = record(DDPRun(out=f"{tmp}/{k}-before", **sc["run"]))
            advice = [to_json_object(a) for a in api.advise(before)]  # the --json shape
            per_step = [a["suggestions"][0] for a in advice[1:] if a["suggestions"]]
            if not per_step:
                results.append({"scenario": sc["name"], "top": None, "note": "no suggestion survived validation"})
                print(f"{sc['name']}: no suggestion", file=sys.stderr)
                continue
            ids = [s["source"] for s in per_step]
            top_id = max(set(ids), key=ids.count)
            top = next(s for s in per_step if s["source"] == top_id)
            predicted = float(np.median([s["replay_saving_us"] for s in per_step if s["source"] == top_id]))
            model = {
                v: float(np.median([s["model_saving_us"].get(v, np.nan) for s in per_step if s["source"] == top_id]))
                for v in top["model_saving_us"]
            }
            changed, how = apply(top, sc["run"], before)
            row = {
                "scenario": sc["name"],
                "top": top_id,
                "edits": top["edits"],
                "change": how,
                "predicted_replay_ms": predicted / 1000,
                "predicted_model_ms": {v: x / 1000 for v, x in model.items()},
            }
            rows_before = api.analyze(before)[1]
            t_before = float(np.median([a.measured for a in rows_before[1:]]))
            row["before_ms"] = t_before / 1000
            if changed is not None:
                after = record(DDPRun(out=f"{tmp}/{k}-after", **changed))
                t_after = float(np.median([a.measured for a in api.analyze(after)[1][1:]]))
                row["after_ms"] = t_after / 1000
                row["measured_ms"] = (t_before - t_after) / 1000
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    print(f"{'scenario':55s} {'top suggestion':28s} {'change':26s} {'pred replay':>11s} {'pred model':>11s} {'measured':>9s}")
    for r in results:
        if r.get("top") is None:
            print(f"{r['scenario']:55s} (none)")
            continue
        model = r["predicted_model_ms"].get("correction", float("nan"))
        meas = f"{r['measured_ms']:9.2f}" if "measured_ms" in r else "        —"
        print(f"{r['scenario']:55s} {r['top']:28s} {r['change']:26s} {r['predicted_replay_ms']:11.2f} {model:11.2f} {meas}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

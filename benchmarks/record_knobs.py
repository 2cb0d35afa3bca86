"""Record the knob changes of ``paired.default_knobs`` as alternating launches (base, changed,
base, ...), ranks pinned to cores: the re-runs ``benchmarks/knobs.py`` scores the knob what-if
against. Resumes: a change whose ``knob.json`` exists is kept.

    python benchmarks/record_knobs.py data/knobs [--sizes tiny small] [--pairs 2] [--only ID ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from bottleneck_oracle_lab.systems.paired import default_knobs, generate_knobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for the launches and knobs.jsonl")
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--layouts", nargs="+", default=["dp2", "pp2-1f1b"])
    ap.add_argument("--pairs", type=int, default=2, help="launches of each setting")
    ap.add_argument("--steps", type=int, default=7, help="profiled steps per launch (the first is dropped)")
    ap.add_argument("--bound", type=float, default=0.05, help="re-record a change whose base launches differ by more than this")
    ap.add_argument("--retries", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="record only these launch ids")
    ap.add_argument(
        "--change",
        action="append",
        default=None,
        metavar="KNOB:BASE:CHANGED",
        help="record this change (for every size and layout) instead of the default ten, e.g. microbatches:2:8; repeatable",
    )
    a = ap.parse_args()
    only = [(k, float(x), float(y)) for k, x, y in (c.split(":") for c in a.change)] if a.change else None
    changes = [replace(k, pairs=a.pairs, steps=a.steps) for k in default_knobs(a.sizes, a.layouts, only=only)]
    if a.only:
        changes = [k for k in changes if k.launch_id in a.only]
    t0 = time.perf_counter()

    def progress(now: str, i: int, n: int) -> None:
        print(f"[{time.perf_counter() - t0:6.0f} s] {i}/{n} {now}", file=sys.stderr, flush=True)

    summary = generate_knobs(changes, a.out, bound=a.bound, retries=a.retries, progress=progress)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`analyze --json` of the same traces by two source trees, runs interleaved on one machine: wall
time and peak RSS of each run, the medians, and each tree's commit. For "did this change make
analysis slower": a worktree of the commit before (``git worktree add /tmp/before <commit>``)
against this checkout.

    python benchmarks/ab_speed.py --before /tmp/before TRACE [TRACE ...] [--repeat 2]
        [--json benchmarks/ab_speed_results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _commit(tree: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _run(src: Path, trace: Path) -> dict:
    """One ``analyze --json`` of ``trace`` with ``src`` first on the path: seconds, and the peak RSS
    of the command in MB where GNU time is there to read it (None otherwise)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    timer = ["/usr/bin/time", "-f", "%M"] if Path("/usr/bin/time").exists() else []
    t = time.perf_counter()
    r = subprocess.run(
        [*timer, sys.executable, "-m", "bottleneck_oracle", "analyze", str(trace), "--json"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - t
    last = r.stderr.strip().splitlines()[-1] if timer and r.stderr.strip() else ""
    return {"wall_s": wall, "peak_mb": int(last) / 1024 if last.isdigit() else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+", type=Path)
    p.add_argument("--before", type=Path, required=True, help="the other tree (a git worktree), its src/ is used")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", type=Path, default=HERE / "ab_speed_results.json")
    a = p.parse_args()
    trees = {"before": a.before.resolve(), "after": ROOT}
    doc: dict = {
        "command": "python benchmarks/ab_speed.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "cores": os.cpu_count(),
        "commits": {k: _commit(v) for k, v in trees.items()},
        "traces": [],
    }
    for trace in a.traces:
        runs: dict[str, list[dict]] = {k: [] for k in trees}
        _run(ROOT / "src", trace)  # (a first run warms the page cache and numba's cache: not counted)
        _run(trees["before"] / "src", trace)
        for _ in range(a.repeat):
            for k, tree in trees.items():  # interleaved: drift on the machine falls on both
                runs[k].append(_run(tree / "src", trace))
        row = {"trace": str(trace), "runs": runs}
        for k in trees:
            row[f"{k}_median_s"] = statistics.median(r["wall_s"] for r in runs[k])
        doc["traces"].append(row)
        print(f"{trace}: before {row['before_median_s']:.2f} s, after {row['after_median_s']:.2f} s", flush=True)
    a.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

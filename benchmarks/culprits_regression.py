"""Does the culprit benchmark regress? benchmarks/culprits.py on one recording, run with an earlier
commit's code and with this checkout's, side by side.

The committed culprit figures (benchmarks/culprits_results.json) were measured on a recording
that is not bundled (a grid recorded with `make data`, hours of 2-rank runs on the machine of the
day). A later change is checked against them by running both codes on the same new recording:
the same steps, the same hits, or the difference said.

    python benchmarks/culprits_regression.py --previous 0e9081f [--dataset data/graphs] [--json out.json]

The earlier commit's code is checked out into a temporary git worktree and run from there
(its own benchmarks/culprits.py, its own package), then removed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(src: Path, script: Path, dataset: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, str(script), "--dataset", str(dataset), "--json", str(out)], check=True, env=env, cwd=ROOT)
    return json.loads(out.read_text())


def _recording(dataset: Path) -> str:
    """What the dataset is: its graphs, its steps with injected culprits, the day it was built
    (its dataset.jsonl's modification date, UTC), on which machine (this script does not record)."""
    rows = [json.loads(line) for line in (dataset / "dataset.jsonl").read_text().splitlines() if line.strip()]
    day = time.strftime("%Y-%m-%d", time.gmtime((dataset / "dataset.jsonl").stat().st_mtime))
    injected = sum(1 for r in rows if r.get("culprit_ids"))
    return f"{dataset.name}/ built on {day} (`make data`): {len(rows)} step graphs, {injected} with injected culprits"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--previous", required=True, help="the commit whose code wrote the committed figures")
    ap.add_argument("--dataset", type=Path, default=ROOT / "data/graphs")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--short", a.previous], check=True, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    this = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "previous"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev], check=True, cwd=ROOT)
        try:
            before = _run(tree / "src", tree / "benchmarks/culprits.py", a.dataset.resolve(), Path(tmp) / "before.json")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=False, cwd=ROOT)
        after = _run(ROOT / "src", ROOT / "benchmarks/culprits.py", a.dataset.resolve(), Path(tmp) / "after.json")
    result = {
        "what": f"benchmarks/culprits.py on one recording, run with the code of {rev} and with the code of {this} (uncommitted changes included)",
        "dataset": str(a.dataset),
        "identical": {k: before.get(k) == after.get(k) for k in ("steps", "methods", "per_layout", "by_effect")},
        "steps": after["steps"],
        "methods_previous_code": before["methods"],
        "methods_this_code": after["methods"],
        "blame_seconds_per_step": {"previous": before["blame_seconds_per_step"], "this": after["blame_seconds_per_step"]},
        "recording": _recording(a.dataset),
        "command": "python benchmarks/culprits_regression.py " + " ".join(sys.argv[1:]),
    }
    for m in after["methods"]:
        b, t = before["methods"].get(m, {}), after["methods"][m]
        print(
            f"{m:42s} top-1 {100 * b.get('top1', float('nan')):5.1f}% -> {100 * t['top1']:5.1f}%   top-3 {100 * b.get('top3', float('nan')):5.1f}% -> {100 * t['top3']:5.1f}%"
        )
    print("identical:", result["identical"])
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

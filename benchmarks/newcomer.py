"""The newcomer's job: a 2-rank DDP run (the tiny GPT, gloo) in which rank 1 runs extra matmuls
in its forward pass in every step — a code path its peer does not take, named by nothing in the
trace — recorded clean and slow, then read the way a new user reads it: the first 20 lines of
`analyze` at 80 columns, and `whatif --edit "name=aten::mm,rank=1,scale=0"`.

    python benchmarks/newcomer.py --out data/newcomer [--ms 16] [--steps 12] [--json benchmarks/newcomer_results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from bottleneck_oracle.api import analyze
from bottleneck_oracle_lab.systems.ddp import DDPRun, record
from bottleneck_oracle_lab.systems.inject import Injection


def _record(out: Path, steps: int, ms: float) -> Path:
    if out.exists():
        shutil.rmtree(out)
    inj = (
        tuple(Injection(kind="compute", rank=1, step=s, target="layers.0.mlp", delay_ms=ms, label=False) for s in range(steps + 1))
        if ms
        else ()
    )
    return record(DDPRun(out=str(out), world=2, steps=steps, size="tiny", batch=8, injections=inj, pin=True))


def _cli(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "bottleneck_oracle", *args], capture_output=True, text=True, env=env, timeout=600)
    return r.stdout + r.stderr


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="data/newcomer")
    p.add_argument("--ms", type=float, default=16.0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    root = Path(a.out)
    clean, slow = _record(root / "clean", a.steps, 0.0), _record(root / "slow", a.steps, a.ms)

    def median(folder: Path) -> float:
        _, steps = analyze(folder)
        return statistics.median(s.step_time for s in steps[1:])

    first = _cli("analyze", str(slow)).splitlines()[:20]
    whatif = _cli("whatif", str(slow), "--step", str(a.steps // 2 + 1), "--edit", "name=aten::mm,rank=1,scale=0")
    doc = {
        "extra_ms": a.ms,
        "clean_median_us": median(clean),
        "slow_median_us": median(slow),
        "analyze_first_20_lines": first,
        "whatif": whatif.splitlines(),
    }
    print("\n".join(first))
    print(whatif)
    print(f"clean {doc['clean_median_us'] / 1000:.1f} ms, slow {doc['slow_median_us'] / 1000:.1f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""How much of each injected delay reached the step time: dT / injected delay per injection kind.

    python benchmarks/absorption.py data/raw [--plot docs/injection_absorption.png]

dT is the measured step time of a perturbed step minus its unperturbed baseline step (the one
before it), both from the traces `generate` recorded; the injected delay is what the injector
actually slept (summed over calls: a module runs once per micro-batch). 1 means none of the
delay was absorbed by slack; below 1, slack absorbed part of it.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def ratios(manifest: Path) -> dict[tuple[str, str], list[float]]:
    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    by = {(r["run_id"], r["step"]): r for r in rows}
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        inj = r["injection"]
        if inj and (r["run_id"], r["baseline_step"]) in by:
            dt = r["step_time_us"] - by[(r["run_id"], r["baseline_step"])]["step_time_us"]
            out[(inj["kind"], r["layout"].split("-")[0])].append(dt / (1000 * inj["slept_ms"]))
    return dict(sorted(out.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--plot", type=Path)
    a = p.parse_args()
    data = ratios(a.folder / "manifest.jsonl")
    print("| injection kind | layout | perturbed steps | median dT/delay | p25 | p75 |")
    print("|---|---|---|---|---|---|")
    for (kind, layout), v in data.items():
        print(f"| {kind} | {layout} | {len(v)} | {np.median(v):.2f} | {np.percentile(v, 25):.2f} | {np.percentile(v, 75):.2f} |")
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        ax.boxplot(list(data.values()), showfliers=True)
        ax.set_xticks(range(1, len(data) + 1), [f"{k}\n{lay}" for k, lay in data], fontsize=8)
        ax.axhline(1.0, color="#d62728", lw=1, ls="--")
        lo, hi = -1.0, 3.0  # outliers come from step-time noise on small delays: counted, not drawn
        outside = sum(int(((np.array(v) < lo) | (np.array(v) > hi)).sum()) for v in data.values())
        ax.set_ylim(lo, hi)
        ax.text(0.99, 0.97, f"{outside} steps outside [{lo:g}, {hi:g}]", transform=ax.transAxes, ha="right", va="top", fontsize=8)
        ax.set_ylabel("dT / injected delay")
        ax.set_title(f"Injected delay that reached the step time ({sum(map(len, data.values()))} perturbed steps)")
        a.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(a.plot, dpi=110, bbox_inches="tight")
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()

"""The replay against paired re-runs on a GPU: every condition's measured and predicted saving.

Reads what ``benchmarks/corrections_heldout.py`` wrote for paired GPU recordings (``--json``,
one file per recording or per launch) with the conditions they scored (a ``paired.jsonl`` or a
launch's ``conditions.jsonl``: the delay of each condition), and reports the replay's errors over
all of them, by kind and by delay. The savings of GPU-side stalls the GPU catches up on are near
zero, where a relative error says little: the table gives the absolute error in ms too, and MAPE
over the conditions that measure at least 1 ms. The corrected replay is left out: its corrections
were learned on CPU runs, and ``whatif`` refuses them on a GPU trace (out of domain).

    python benchmarks/gpu_reruns.py SCORES.json:CONDITIONS.jsonl ... [--label NAME] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from bottleneck_oracle_lab.training.reruns import scores


def _rows(pair: str) -> list[dict]:
    result, _, conditions = pair.partition(":")
    if not conditions:
        raise SystemExit(f"{pair}: expected SCORES.json:CONDITIONS.jsonl")
    rows = json.loads(Path(result).read_text())["rows"]
    cond = [json.loads(x) for x in Path(conditions).read_text().splitlines() if x.strip()]
    delay = {(c["launch_id"], c["condition"]["kind"], c["condition"]["rank"]): c["condition"]["delay_ms"] for c in cond}
    spread = {(c["launch_id"], c["condition"]["kind"], c["condition"]["rank"]): c["clean_spread"] for c in cond}
    out = []
    for r in rows:
        key = (r["launch_id"], r["kind"], r["rank"])
        if key not in delay:
            raise SystemExit(f"{pair}: {key} is not among the conditions")
        out.append({**r, "delay_ms": delay[key], "clean_spread": spread[key], "source": result})
    return out


def summary(rows: list[dict]) -> dict:
    m = np.array([r["measured_us"] for r in rows])
    p = np.array([r["replay_us"] for r in rows])
    big = np.abs(m) >= 1000.0
    out = scores(p, m)
    out["mean_abs_error_ms"] = float(np.mean(np.abs(p - m)) / 1000)
    out["mape_measured_1ms_up"] = float(np.mean(np.abs(p[big] - m[big]) / np.abs(m[big]))) if big.any() else float("nan")
    out["n_measured_1ms_up"] = int(big.sum())
    return out


def _line(name: str, s: dict) -> str:
    return (
        f"{name:<22} n={s['n']:>3}  MAPE {100 * s['mape']:6.1f}% [{100 * s['mape_ci90'][0]:.1f}, {100 * s['mape_ci90'][1]:.1f}]  "
        f"median APE {100 * s['median_ape']:5.1f}%  MAPE (>= 1 ms) {100 * s['mape_measured_1ms_up']:5.1f}% (n={s['n_measured_1ms_up']})  "
        f"mean |error| {s['mean_abs_error_ms']:.2f} ms  sign {100 * s['sign']:.0f}%  tau {s['kendall_tau']:.2f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="+", metavar="SCORES.json:CONDITIONS.jsonl")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = [r for pair in a.pairs for r in _rows(pair)]
    groups: dict[str, dict] = {"all": summary(rows)}
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[f"kind {r['kind']}"].append(r)
        by[f"delay {r['delay_ms']:g} ms"].append(r)
    for name in sorted(by):
        groups[name] = summary(by[name])
    for name, s in groups.items():
        print(_line(name, s))
    if a.json:
        Path(a.json).write_text(json.dumps({"summary": groups, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

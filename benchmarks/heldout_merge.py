"""Several results of ``benchmarks/corrections_heldout.py`` scored as one set of conditions.

A half of the grid recorded again (the pipeline half with more repeats, say) is scored alone, then
merged with the other half's earlier result: the replay and the corrected replay over all the
conditions and per layout (data-parallel launches ``*-dp2-*``, pipelines ``*-pp2-*``), the
clean-vs-clean noise floor of their truth (median over conditions), and region blame on the
extra-compute conditions.

    python benchmarks/heldout_merge.py A.json[:dp|:pp] B.json ... [--json merged.json]

``:dp`` or ``:pp`` after a file takes only its data-parallel or pipeline conditions (the DP half of
one result with the pipeline half recorded again, say). A row that says it ``replaces`` another (a
condition recorded again alone by ``generate --paired``, scored with ``corrections_heldout.py
--only '*.c*'``) takes the place of the row of an earlier file with that launch and measured saving.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bottleneck_oracle_lab.training.reruns import scores


def _summary(rows: list[dict]) -> dict:
    m = np.array([r["measured_us"] for r in rows])
    rep = np.array([r["replay_us"] for r in rows])
    cor = np.array([r["corrected_us"] for r in rows])
    half = np.array([r["half_us"] for r in rows])
    out = {
        "n": len(rows),
        "clean_vs_clean_median": float(np.median([r["clean_vs_clean"] for r in rows])),
        "replay": scores(rep, m),
        "corrected": scores(cor, m, cor - half, cor + half),
    }
    for k in ("formula", "mlp_pooled", "xgb_pooled"):
        if all(f"{k}_us" in r for r in rows):
            out[k] = scores(np.array([r[f"{k}_us"] for r in rows]), m)
    if all("remeasured_us" in r for r in rows):
        out["remeasured"] = scores(np.array([r["remeasured_us"] for r in rows]), np.array([r["measured_after_us"] for r in rows]))
    return out


def _line(name: str, s: dict) -> str:
    cov = f", covers {100 * s['coverage']:.0f}%" if "coverage" in s else ""
    return (
        f"  {name:10s} MAPE {100 * s['mape']:5.1f}% [{100 * s['mape_ci90'][0]:.1f}, {100 * s['mape_ci90'][1]:.1f}], median APE "
        f"{100 * s['median_ape']:.1f}%, sign {100 * s['sign']:.0f}%, tau {s['kendall_tau']:.3f}{cov}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows: list[dict] = []
    region: list[dict] = []
    replaced = 0

    def drop(into: list[dict], new: list[dict]) -> list[dict]:
        gone = {(r["replaces"]["launch_id"], r["replaces"]["measured_saving_us"]) for r in new if "replaces" in r}
        return [r for r in into if (r["launch_id"], r["measured_us"]) not in gone]

    for spec in a.results:
        path, _, part = spec.partition(":")
        if part not in ("", "dp", "pp"):
            raise SystemExit(f"{spec}: the part after ':' must be dp or pp")
        doc = json.loads(Path(path).read_text())
        keep = (lambda r: True) if not part else (lambda r, p=part: f"-{p}" in r["launch_id"])
        new = [r for r in doc["rows"] if keep(r)]
        before = len(rows)
        rows = drop(rows, new)
        if (
            0 < before - len(rows) != sum("replaces" in r for r in new)
        ):  # none found: a set scored with its lone recordings already in place
            raise SystemExit(
                f"{path}: {sum('replaces' in r for r in new)} rows replace others, {before - len(rows)} found in the files before it"
            )
        replaced += before - len(rows)
        rows += new
        new_region = [r for r in doc["region_on_compute"]["rows"] if keep(r)]
        region = drop(region, new_region) + new_region
    groups = {"all": rows, "dp": [r for r in rows if "-dp" in r["launch_id"]], "pp": [r for r in rows if "-pp" in r["launch_id"]]}
    out: dict = {"replaced": replaced}
    if replaced:
        print(f"{replaced} conditions recorded again alone replace their first recordings")
    for name, rs in groups.items():
        if not rs:
            continue
        out[name] = _summary(rs)
        s = out[name]
        print(f"{name}: {s['n']} conditions, clean vs clean {100 * s['clean_vs_clean_median']:.2f}% (median)")
        for k in ("replay", "corrected", "formula", "mlp_pooled", "xgb_pooled", "remeasured"):
            if k in s:
                print(_line(k, s[k]))

    def within(key: str) -> float:  # the share within 25% of the measured saving, as scores() counts it
        return scores(np.array([r[key] for r in region]), np.array([r["measured_us"] for r in region]))["within_25pct"]

    if region:
        out["region_on_compute"] = {
            "n": len(region),
            **{f"{k}_within_25pct": within(f"{k}_us") for k in ("region", "region_baseline", "replay")},
        }
        print(
            "region blame on the compute conditions, within 25% of the measured saving: "
            + ", ".join(f"{k} {100 * out['region_on_compute'][f'{k}_within_25pct']:.0f}%" for k in ("region", "region_baseline", "replay"))
            + f" (n={len(region)})"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"inputs": a.results, **out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

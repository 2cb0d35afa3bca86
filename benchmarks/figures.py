"""Every figure the README and the documentation quote, rendered from committed results.

The documentation never copies a number by hand: each table or figure line is a Markdown snippet
in ``docs/figures/`` (included into the pages with ``pymdownx.snippets``), and the README's
figures sit between ``<!-- figure:NAME -->`` and ``<!-- /figure:NAME -->`` markers. This script
writes all of them from the result files committed beside it (``benchmarks/*.json``,
``benchmarks/RESULTS.md``, ``docs/eval.json``, the bundled corrections), and the quickstart from a
real run of ``analyze`` on the bundled trace. ``tests/test_docs.py`` checks the committed files
equal what it renders.

    python benchmarks/figures.py           # make figures: write docs/figures/*.md and the README's blocks
    python benchmarks/figures.py --check   # exit 1, naming the files, if any differs from what is committed
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bottleneck_oracle_lab.training.eval_table import HEAD, rows_of
from bottleneck_oracle_lab.training.eval_table import fmt as eval_fmt

ROOT = Path(__file__).resolve().parents[1]
FIGURES = Path("docs/figures")
README = Path("README.md")
SAMPLE = "tests/data/gloo_ddp_2rank"  # the bundled trace of the quickstart (relative: it is printed)
WIDTH = "100"  # terminal columns of the quickstart's output

Doc = dict[str, Any]


def _load(root: Path, name: str) -> Any:
    return json.loads((root / name).read_text())


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:.{digits}f}%"


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _score_cells(s: Doc, coverage: bool = True) -> list[str]:
    """MAPE [90% CI], median APE, sign, Kendall τ (and the interval's coverage) of training.reruns.scores."""
    ci = s.get("mape_ci90")
    mape = _pct(s["mape"]) + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")
    cells = [mape, _pct(s["median_ape"]), _pct(s["sign"], 0), f"{s['kendall_tau']:.3f}"]
    return cells + ([_pct(s["coverage"], 0) if "coverage" in s else "—"] if coverage else [])


SCORE_HEAD = ["MAPE [90% CI]", "median APE", "sign", "Kendall τ", "90% interval covers"]


def _rows_of(root: Path, merged: Doc) -> list[Doc]:
    """The condition rows behind a result of heldout_merge.py (its inputs, ``:dp`` / ``:pp`` parts
    taken as it takes them); only for merges whose inputs hold each condition once."""
    rows: list[Doc] = []
    for spec in merged["inputs"]:
        path, _, part = spec.partition(":")
        rows += [r for r in _load(root, path)["rows"] if not part or f"-{part}" in r["launch_id"]]
    if len(rows) != merged["all"]["n"]:
        raise SystemExit(f"the rows of {merged['inputs']} are not the {merged['all']['n']} conditions of the merge")
    return rows


# ------------------------------------------------------------------ the quickstart


def quickstart(root: Path) -> str:
    """``analyze`` on the bundled 2-rank trace, as a terminal shows it: the steps table and the
    first step's summary, its tables left out."""
    env = {**os.environ, "COLUMNS": WIDTH, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-m", "bottleneck_oracle", "analyze", SAMPLE], cwd=root, env=env, capture_output=True, text=True, check=True
    ).stdout
    blocks = [b for b in out.rstrip().split("\n\n") if b.strip()]
    first = blocks[1].splitlines() if len(blocks) > 1 else []
    prose = []
    for line in first:  # the step's lines up to its first table (a centred title, or the table's top)
        if line.startswith((" ", "┌")):
            break
        prose.append(line)
    tail = next((i for i, line in enumerate(first) if line.startswith("Straggler")), len(first))
    shown = [f"$ bottleneck-oracle analyze {SAMPLE}", blocks[0], "", *prose]
    shown += ["  ... (where the critical path's time goes, the lowest-slack communication, the ranks)", *first[tail:]]
    if len(blocks) > 2:
        shown += ["", f"  ... ({len(blocks) - 2} more step(s) alike)"]
    return "```text\n" + "\n".join(line.rstrip() for line in shown) + "\n```\n"


# ------------------------------------------------------------------ the step time and HTA


def step_time(root: Path) -> str:
    d = _load(root, "benchmarks/accuracy_results.json")
    rows = [
        [
            f"`{r['trace']}`",
            str(r["ranks"]),
            str(r["steps"]),
            f"{r['nodes']:,}",
            f"{r['max_abs_error_pct']:.2f}%",
            f"{r['max_abs_span_vs_period_pct']:.1f}%",
            f"{r['checks_failed']} of {r['checks']}",
        ]
        for r in d["makespan"]
    ]
    h = d["hta"]
    return (
        _table(
            [
                "trace",
                "ranks",
                "steps",
                "nodes (first step)",
                "max abs(CPM step time − period)",
                "max abs(span − period)",
                "self-checks failed",
            ],
            rows,
        )
        + f"\n\nAgainst HTA's critical-path overlay of `simple_add_1gpu`: Jaccard overlap of the critical events "
        f"**{h['jaccard']:.3f}** on the events HTA's graph models ({h['shared']} shared, {h['ours'] - h['shared']} only ours, "
        f"{h['hta'] - h['shared']} only HTA's), {h['jaccard_all_events']:.3f} on all events.\n"
    )


# ------------------------------------------------------------------ the step-time models (make eval)


def eval_table(root: Path) -> str:
    d = _load(root, "docs/eval.json")
    return _table(HEAD, rows_of(d)) + "\n"


def eval_best(root: Path) -> str:
    """Per split, which model is best on each what-if metric (lowest error, highest sign accuracy)."""
    d = _load(root, "docs/eval.json")
    metrics = [
        ("step_mape", "step MAPE %", min),
        ("dt_mape", "ΔT MAPE %", min),
        ("dt_median_ape", "ΔT median APE %", min),
        ("dt_mae_ms", "ΔT MAE ms", min),
        ("sign_acc", "sign acc", max),
    ]
    rows = []
    for s in d["splits"]:
        replay = s["models"]["replay (CPM)"]
        cells = [s["split"]]
        for key, _, pick in metrics:
            best = pick(s["models"], key=lambda name, key=key: s["models"][name][key])
            cell = f"{best}: {eval_fmt(s['models'][best][key], key != 'sign_acc')}"
            cells.append(cell if best == "replay (CPM)" else f"{cell} (replay {eval_fmt(replay[key], key != 'sign_acc')})")
        rows.append(cells)

    gats = [(s["models"]["replay (CPM)"], [m for name, m in s["models"].items() if name.startswith("HeteroGAT")]) for s in d["splits"]]
    beats = sum(any(m["dt_mape"] < rep["dt_mape"] for m in ms) for rep, ms in gats)
    replay_ms = [rep["ms_per_graph"] for rep, _ in gats]
    gat_ms = [m["ms_per_graph"] for _, ms in gats for m in ms]

    def span(key: str, pick: Callable[..., float]) -> str:
        best = [pick(m[key] for m in s["models"].values() if m.get(key) is not None) for s in d["splits"]]
        return f"{eval_fmt(min(best), key != 'sign_acc')}–{eval_fmt(max(best), key != 'sign_acc')}"

    return (
        _table(["split"] + [m[1] for m in metrics], rows)
        + f"\n\nThe best model per split against the targets: step MAPE {span('step_mape', min)}% (target ≤ 3%), "
        f"ΔT MAPE {span('dt_mape', min)}% (target ≤ 10%), sign accuracy {span('sign_acc', max)} (target ≥ 0.95). "
        f"A graph network's ΔT MAPE is below the replay's on {beats} of {len(d['splits'])} splits. Inference per graph: the replay "
        f"{eval_fmt(min(replay_ms), False)}–{eval_fmt(max(replay_ms), False)} ms, the graph networks "
        f"{eval_fmt(min(gat_ms), False)}–{eval_fmt(max(gat_ms), False)} ms.\n"
    )


# ------------------------------------------------------------------ what-if against re-runs

PREDICTORS = [
    ("replay", "replay"),
    ("corrected", "corrected replay"),
    ("formula", "1F1B / busy-rank formula"),
    ("mlp_pooled", "MLP (pooled)"),
    ("xgb_pooled", "XGBoost (pooled)"),
    ("remeasured", "the truth against itself"),
]


def reruns_final(root: Path) -> str:
    d = _load(root, "benchmarks/heldout_final_results.json")
    rows = []
    for group, label in (("all", "all"), ("dp", "data-parallel"), ("pp", "pipeline")):
        g = d[group]
        for key, name in PREDICTORS:
            if key in g:
                rows.append([f"{label} {g['n']}", _pct(g["clean_vs_clean_median"], 2), name, *_score_cells(g[key])])
    r = d["region_on_compute"]
    return (
        _table(["conditions", "clean vs clean", "predictor", *SCORE_HEAD], rows)
        + f"\n\nRegion blame on the {r['n']} extra-compute conditions: the top region is within 25% of the measured saving in "
        f"**{_pct(r['region_baseline_within_25pct'], 0)}** with the clean steps as the baseline (`blame --baseline`), "
        f"{_pct(r['region_within_25pct'], 0)} against the peer ranks and the block's own steps; the replay of the injected "
        f"ranges: {_pct(r['replay_within_25pct'], 0)}.\n"
    )


def reruns_by_kind(root: Path) -> str:
    from bottleneck_oracle_lab.training.reruns import scores

    rows_all = _rows_of(root, _load(root, "benchmarks/heldout_final_results.json"))
    out = []
    for kind in sorted({r["kind"] for r in rows_all}):
        rs = [r for r in rows_all if r["kind"] == kind]
        m = np.array([r["measured_us"] for r in rs])
        rep, cor = (scores(np.array([r[k] for r in rs]), m) for k in ("replay_us", "corrected_us"))
        out.append([kind, str(len(rs)), _pct(rep["mape"]), _pct(cor["mape"]), f"{rep['kendall_tau']:.3f}", f"{cor['kendall_tau']:.3f}"])
    return _table(["kind", "conditions", "replay MAPE", "corrected MAPE", "replay τ", "corrected τ"], out) + "\n"


def _clean_vs_clean(rows: list[Doc]) -> tuple[float, int]:
    cvc = [r["clean_vs_clean"] for r in rows]
    return float(np.median(cvc)), int(sum(c > 0.05 for c in cvc))


def reruns_history(root: Path) -> str:
    """The recordings of the 112-condition grid in order, and what each did to the figures."""
    rows = []
    for name, what in [
        ("reruns_results.json", "6 slowed blocks per condition, gloo as it is; ridge corrections; 4 folds by launch"),
        ("reruns_graph_results.json", "recorded again; graph-network corrections with median targets; 4 folds"),
        ("reruns_idle_results.json", "DDP ranks' gloo socket thread at idle priority; 4 folds"),
        ("reruns_idle_median_results.json", "the same, each prediction scored on the block's median step"),
    ]:
        d = _load(root, f"benchmarks/{name}")
        corr = "graph-corrected" if "graph-corrected" in d["all"] else "corrected"
        res = d["resolvable"]
        rows.append(
            [
                what,
                f"`{name}`",
                _pct(d["noise"]["median_clean_vs_clean"]),
                f"{d['noise']['launches_above_bound']} launches",
                _pct(d["all"]["replay"]["mape"]),
                _pct(d["all"][corr]["mape"]),
                _pct(d["all"]["re-measurement (noise)"]["mape"]),
                f"{res['n']}: {_pct(res['scores']['replay']['mape'])} / {_pct(res['scores'][corr]['mape'])}",
            ]
        )
    h31 = _load(root, "benchmarks/corrections_heldout_31_results.json")
    cvc, above = _clean_vs_clean(h31["rows"])
    rows.append(
        [
            "31 slowed blocks per condition; the bundled corrections, all held out",
            "`corrections_heldout_31_results.json`",
            _pct(cvc),
            f"{above} conditions",
            _pct(h31["replay"]["mape"]),
            _pct(h31["corrected"]["mape"]),
            _pct(h31["remeasured"]["mape"]),
            "—",
        ]
    )
    for name, what in [
        ("heldout_dp31_pp50_results.json", "the pipeline half at 50 blocks per condition"),
        ("heldout_final_results.json", "each condition whose clean groups differ by more than 5% recorded again alone"),
    ]:
        d = _load(root, f"benchmarks/{name}")
        _, above = _clean_vs_clean(_rows_of(root, d))
        rem = _pct(d["all"]["remeasured"]["mape"]) if "remeasured" in d["all"] else f"pipeline: {_pct(d['pp']['remeasured']['mape'])}"
        rows.append(
            [
                what,
                f"`{name}`",
                _pct(d["all"]["clean_vs_clean_median"]),
                f"{above} conditions",
                _pct(d["all"]["replay"]["mape"]),
                _pct(d["all"]["corrected"]["mape"]),
                rem,
                "—",
            ]
        )
    head = [
        "recording",
        "result",
        "clean vs clean",
        "above the 5% bound",
        "replay MAPE",
        "corrected MAPE",
        "truth against itself",
        "resolvable: replay / corrected",
    ]
    return _table(head, rows) + "\n"


def rerecorded(root: Path) -> str:
    """The conditions recorded again alone: their clean-vs-clean before and after, and their errors."""
    from bottleneck_oracle_lab.training.reruns import scores

    lone = _load(root, "benchmarks/corrections_heldout_requiet_results.json")["rows"]
    first = [r["replaces"]["clean_vs_clean"] for r in lone]
    after = [r["clean_vs_clean"] for r in lone]
    m = np.array([r["measured_us"] for r in lone])
    rep, cor = (scores(np.array([r[k] for r in lone]), m)["mape"] for k in ("replay_us", "corrected_us"))
    return (
        f"{len(lone)} conditions were recorded again alone: their clean groups differed by a median "
        f"{_pct(float(np.median(first)))} in their first recordings and {_pct(float(np.median(after)))} alone "
        f"({sum(a > 0.05 for a in after)} still above 5%); on the lone recordings the replay's MAPE over them is {_pct(rep)}, "
        f"the corrected replay's {_pct(cor)}.\n"
    )


LABELS = {
    "own": "the removed time (the injected ranges' own)",
    "corrected": "ridge-corrected replay",
    "blame_op": "blame: top op",
    "blame_region": "blame: top region (peers)",
    "blame_region_baseline": "blame: top region (clean baseline)",
    "formula": "1F1B / busy-rank formula",
    "re-measurement (noise)": "the truth against itself",
}


def reruns_earlier(root: Path) -> str:
    """Every predictor on the earlier recording, learned step-time models included."""
    d = _load(root, "benchmarks/reruns_results.json")
    res = d["resolvable"]
    rows = [
        [
            LABELS.get(name, name),
            _pct(s["answered"], 0),
            *_score_cells(s)[:4],
            _pct(res["scores"][name]["mape"]),
            _pct(res["scores"][name]["answered"], 0),
        ]
        for name, s in d["all"].items()
    ]
    head = ["predictor", "answered", "MAPE [90% CI]", "median APE", "sign", "Kendall τ", f"resolvable {res['n']}: MAPE", "answered"]
    return _table(head, rows) + f"\n\n{d['conditions']} conditions; resolvable: {res['rule']}.\n"


def local_scores(root: Path) -> str:
    d = _load(root, "benchmarks/local_scores_results.json")
    rows = [
        [truth, name, *_score_cells(d[f"{key}_{truth}"], coverage=False)]
        for truth in ("pooled", "local")
        for key, name in (("replay", "replay"), ("corrected", "corrected replay"))
    ]
    a = d["estimates_apart"]
    return (
        _table(["truth", "predictor", *SCORE_HEAD[:-1]], rows)
        + f"\n\nThe two estimates of the saving agree to {_pct(a['median'])} (median over the {d['n']} conditions); "
        f"{a['over_10pct']} differ by more than 10%, {a['over_25pct']} by more than 25%.\n"
    )


def heldout_in_time(root: Path) -> str:
    """The bundled corrections on launches recorded after they were fitted."""
    rows = []
    for name, what in [
        ("corrections_heldout_results.json", "three long launches (tiny DDP and 1F1B, 10 ms), ridge corrections of the earlier grid"),
        ("corrections_heldout_graph_results.json", "one long tiny DDP launch, gloo as it is, graph corrections"),
        ("corrections_heldout_idle_results.json", "one long tiny DDP launch, socket thread idle, the bundled graph corrections"),
        ("corrections_heldout_dp31_results.json", "the DP half at 31 blocks per condition, the bundled graph corrections"),
    ]:
        d = _load(root, f"benchmarks/{name}")
        rows.append(
            [
                what,
                f"`{name}`",
                str(d["conditions"]),
                _pct(d["replay"]["mape"]),
                _pct(d["corrected"]["mape"]),
                _pct(d["corrected"].get("coverage"), 0),
                _pct(d["remeasured"]["mape"]),
            ]
        )
    return (
        _table(["launches", "result", "conditions", "replay MAPE", "corrected MAPE", "interval covers", "truth against itself"], rows)
        + "\n"
    )


def noise_steps(root: Path) -> str:
    cols = [2, 4, 7, 14, 28, 56]
    rows = []
    for name, what in [
        ("noise_by_steps_results.json", "the grid, gloo as it is"),
        ("noise_by_steps_idle_results.json", "the grid, socket thread idle"),
        ("noise_by_steps_long_results.json", "one long tiny DDP launch, gloo as it is"),
        ("noise_by_steps_long_idle_results.json", "one long tiny DDP launch, socket thread idle"),
        ("noise_by_steps_long_pp_results.json", "one long tiny 1F1B launch"),
        ("noise_by_steps_xl_results.json", "the longest launch (profiling windows), gloo as it is"),
    ]:
        d = _load(root, f"benchmarks/{name}")
        at = {r["steps_per_group"]: r["median_clean_vs_clean"] for r in d["rows"]}
        rows.append([what, *(_pct(at.get(n)) for n in cols), f"{100 * d['fit_c']:.1f}% · n^{d['slope']:.2f}", str(d["steps_needed"]["2%"])])
    head = ["recording", *(f"{n} steps" for n in cols), "fit", "steps per group for 2%"]
    return _table(head, rows) + "\n"


def noise_sources(root: Path) -> str:
    d = _load(root, "benchmarks/noise_sources_results.json")
    rows = [
        [r["probe"], str(r["rank"]), f"{r['median_ms']:.2f}", _pct(r["robust_spread"]), f"{r['p10_ms']:.2f}–{r['p90_ms']:.2f}"]
        for r in d["rows"]
    ]
    return (
        _table(["probe (no profiler)", "rank", "median ms", "robust spread", "p10–p90 ms"], rows) + f"\n\n{d['steps']} calls per probe.\n"
    )


def _knobs_bench() -> Any:
    """benchmarks/knobs.py, imported once (its scoring, not a copy of it)."""
    import importlib.util

    if "knobs_bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location("knobs_bench", Path(__file__).resolve().parent / "knobs.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["knobs_bench"] = module
        spec.loader.exec_module(module)
    return sys.modules["knobs_bench"]


def _knob_score(rows: list[dict]) -> dict:
    """MAPE, sign and Kendall τ of ``whatif --set`` as shipped over ``rows``: benchmarks/knobs.py's score."""
    out: dict = _knobs_bench().score(rows, "set")
    return out


def _covered(root: Path, again: dict) -> float:
    """The share of the other recordings' changes inside the interval of the 40 (the quantiles of
    ``knobs_results.json``: what shipped before the recordings were pooled)."""
    forty = _load(root, "benchmarks/knobs_results.json")["rows"]
    lo, hi = _knobs_bench()._quantiles(np.array([r["changed_us"] / r["predicted"]["set"] for r in forty]))
    ratio = np.array([r["changed_us"] / r["predicted"]["set"] for a in again.values() for r in a[1]["rows"]])
    return float(np.mean((ratio >= lo) & (ratio <= hi)))


def knobs(root: Path) -> str:
    d = _load(root, "benchmarks/knobs_results.json")
    held = "set, factor from the other size"
    rows = []
    for r in d["rows"]:  # as benchmarks/knobs.py scores them
        p, m = r["predicted"], r["changed_us"]
        rows.append(
            [
                r["size"],
                r["layout"],
                r["knob"],
                f"{r['base']:g} → {r['changed']:g}",
                f"{p['base_trace_us'] / 1000:.2f}",
                f"{m / 1000:.2f}",
                _pct(r["clean_vs_clean"]),
                f"{p['set'] / 1000:.2f} ({100 * (p['set'] - m) / m:+.1f}%)",
                f"{p[held] / 1000:.2f} ({100 * (p[held] - m) / m:+.1f}%)",
                f"{p['proportional'] / 1000:.2f}",
            ]
        )
    head = [
        "size",
        "layout",
        "knob",
        "from → to",
        "base ms",
        "measured ms",
        "clean vs clean",
        "`--set` ms (error)",
        "factor from the other size",
        "proportional ms",
    ]
    names = {
        "set": "`--set` as shipped",
        held: "factor from the other size",
        "set, factor from the other layout": "factor from the other layout",
        "set, no fit (factor 1)": "no fit (factor 1)",
        "unchanged": "unchanged",
        "proportional": "proportional",
    }
    kinds = []
    for k, sc in list(d["by_kind"].items()) + [("**all**", d["scores"])]:
        kinds.append(
            [k, str(sc["set"]["n"]), *(_pct(sc[w]["mape"]) for w in names), _pct(sc[held]["sign"], 0), f"{sc[held]['kendall_tau']:.2f}"]
        )
    p, f, iv = d["paired_wilcoxon_p"], d["factor"], d["interval"]
    lines = [
        f"- the fixed part's factor: {f['shipped']:g} as shipped (the grid's best on all {len(d['rows'])}); chosen on the other "
        f"size: {', '.join(f'{k} {v:g}' for k, v in f['chosen_on_other_size'].items())}; on the other layout: "
        f"{', '.join(f'{k} {v:g}' for k, v in f['chosen_on_other_layout'].items())}",
        f"- paired Wilcoxon test (one-sided: the held-out `--set`'s absolute error smaller): against unchanged p = {p['unchanged']:.2g}, "
        f"against proportional p = {p['proportional']:.2g}",
        f"- Kendall τ a perfect predictor could expect from the measurement's own noise: {d['kendall_tau_noise_ceiling']:.2f}",
        f"- the 90% interval (measured / predicted over the other changes): covers {_pct(iv['coverage'], 0)} of the changes; the same "
        f"widths around the base step: {_pct(iv['baseline_coverage'], 0)}",
        f"- noise floor: the base launches' clean-vs-clean difference, median {_pct(d['noise']['median_clean_vs_clean'])}; "
        f"{d['noise']['above_bound']} changes still above the 5% bound after two re-recordings",
    ]
    first = _load(root, "benchmarks/knobs_first_results.json")
    fs = first["scores"][held]
    lines.append(
        f"- **The same {fs['n']} changes recorded before** (an earlier session, the machine busier: clean vs clean median "
        f"{_pct(first['noise']['median_clean_vs_clean'])}; `benchmarks/knobs_first_results.json`, the same command on that "
        f"recording): factor from the other size MAPE {_pct(fs['mape'])}, sign {_pct(fs['sign'], 0)}, Kendall τ "
        f"{fs['kendall_tau']:.2f} (the noise's ceiling there {first['kendall_tau_noise_ceiling']:.2f})"
    )
    af = _load(root, "benchmarks/knobs_afab_results.json")
    a = af["scores"]
    lines.append(
        f"- **Another layout**: {a['set']['n']} changes of the AFAB pipeline schedule (tiny and small), recorded after the first "
        f"version of the rules was fixed, scored as shipped (nothing was chosen on them): MAPE {_pct(a['set']['mape'])}, "
        f"sign {_pct(a['set']['sign'], 0)}, "
        f"Kendall τ {a['set']['kendall_tau']:.2f} (the noise's ceiling there {af['kendall_tau_noise_ceiling']:.2f}); unfitted "
        f"{_pct(a['set, no fit (factor 1)']['mape'])}; unchanged {_pct(a['unchanged']['mape'])}, proportional {_pct(a['proportional']['mape'])} "
        f"(per knob: " + ", ".join(f"{k} {_pct(v['set']['mape'])}" for k, v in af["by_kind"].items()) + f"; the factor best there: "
        f"{af['factor']['best_on_all']:g})"
    )
    mb, mb0 = _load(root, "benchmarks/knobs_mb_results.json")["scores"], _load(root, "benchmarks/knobs_mb_before_results.json")["scores"]
    lines.append(
        f"- **Micro-batch re-splits from other counts**: {mb['set']['n']} changes (from 2 and from 8 micro-batches, both schedules, "
        f"both sizes), recorded after the rule that untraced time right after a send or receive is waiting was written, and used only "
        f"to check it: before the rule {_pct(mb0['set']['mape'])}, after {_pct(mb['set']['mape'])} (sign {_pct(mb['set']['sign'], 0)}, "
        f"Kendall τ {mb['set']['kendall_tau']:.2f}); unchanged {_pct(mb['unchanged']['mape'])}"
    )
    formula = _load(root, "benchmarks/knobs_formula_results.json")["scores"][held]
    fresh = {  # recording: (scored at 941c6d0, scored now)
        "mb": ("knobs_mb_again_formula_results", "knobs_mb_again_results"),
        "afab": ("knobs_afab_again_formula_results", "knobs_afab_again_results"),
        "mb2": ("knobs_mb2_formula_results", "knobs_mb2_results"),
    }
    again = {k: (_load(root, f"benchmarks/{b}.json"), _load(root, f"benchmarks/{a}.json")) for k, (b, a) in fresh.items()}
    pooled = [r for f in ("knobs_results", *(a for _, a in fresh.values())) for r in _load(root, f"benchmarks/{f}.json")["rows"]]
    pooled_before = [
        r for f in ("knobs_formula_results", *(b for b, _ in fresh.values())) for r in _load(root, f"benchmarks/{f}.json")["rows"]
    ]
    ps, pb = _knob_score(pooled), _knob_score(pooled_before)

    def before_after(k: str, what: str) -> str:
        b, a = again[k][0]["scores"]["set"], again[k][1]["scores"]["set"]
        return (
            f"{what} ({a['n']}): MAPE {_pct(b['mape'])} → {_pct(a['mape'])}, sign {_pct(b['sign'], 0)} → {_pct(a['sign'], 0)}, "
            f"τ {b['kendall_tau']:.2f} → {a['kendall_tau']:.2f} (the noise's ceiling {again[k][1]['kendall_tau_noise_ceiling']:.2f}; "
            f"clean vs clean median {_pct(again[k][1]['noise']['median_clean_vs_clean'])})"
        )

    lines.insert(
        0,
        f"- **The pipeline's schedule replayed stage by stage** (`analysis.knobs.pipeline_makespan`) in place of the 1F1B formula "
        f"of the slowest stage, `(m + p − 1) max t`, **and each stage's send and receive calls counted as fixed per micro-batch** "
        f"(this version): on these {formula['n']} changes the code before them (941c6d0) scored MAPE {_pct(formula['mape'])}, sign "
        f"{_pct(formula['sign'], 0)}, τ {formula['kendall_tau']:.2f} (`benchmarks/knobs_formula_results.json`). Both were written "
        f"after reading these changes' micro-batch misses, and the second after the first two recordings below as well, so those "
        f"do not hold it out; the third (`data/knobs_mb2`: re-splits from 1, 2 and 8 to counts not recorded before) was recorded "
        f"after both were written. Each scored at 941c6d0 (`*_formula_results.json`) and now: "
        + before_after("mb", "re-splits from 2 and 8")
        + "; "
        + before_after("afab", "the AFAB schedule's ten changes per size")
        + "; "
        + before_after("mb2", "**held out:** re-splits from 1, 2 and 8 to 2, 1, 8 and 4")
        + f". All {ps['n']} changes of the four recordings pooled: MAPE {_pct(pb['mape'])} → {_pct(ps['mape'])}, sign "
        f"{_pct(pb['sign'], 0)} → {_pct(ps['sign'], 0)}, τ {pb['kendall_tau']:.2f} → {ps['kendall_tau']:.2f}.",
    )
    pool = _load(root, "benchmarks/knobs_pooled_results.json")
    piv, shipped_iv = pool["interval"], pool["interval"]["shipped"]
    lines.insert(
        1,
        f"- **The interval `whatif --set` ships** is from all {shipped_iv['changes']} changes of the four recordings "
        f"(`python benchmarks/knobs.py data/knobs data/knobs_mb data/knobs_afab data/knobs_mb2 --json "
        f"benchmarks/knobs_pooled_results.json --write-interval src/bottleneck_oracle/analysis/knob_errors.json`): the prediction "
        f"× [{shipped_iv['low']:.3f}, {shipped_iv['high']:.3f}]; leave one change out it covers {_pct(piv['coverage'], 0)} (the same "
        f"widths around the base step {_pct(piv['baseline_coverage'], 0)}); each recording against the interval of the others: "
        + ", ".join(f"`{k}` {_pct(v['coverage'], 0)} of {v['n']}" for k, v in piv["held_out_by_recording"].items())
        + f". The interval of the 40 alone (what shipped before the recordings were pooled) covers {_pct(_covered(root, again), 0)} "
        f"of the other {sum(len(a[1]['rows']) for a in again.values())} changes. The fixed part's factor chosen on all "
        f"{shipped_iv['changes']} is {pool['factor']['best_on_all']:g} (shipped: {pool['factor']['shipped']:g}).",
    )
    fr = _load(root, "benchmarks/knobs_fresh_results.json")
    fs = fr["scores"][held]
    ff = _load(root, "benchmarks/knobs_fresh_formula_results.json")["scores"][held]
    ratio = np.array([r["changed_us"] / r["predicted"]["set"] for r in fr["rows"]])
    inside = float(np.mean((ratio >= shipped_iv["low"]) & (ratio <= shipped_iv["high"])))
    lines.insert(
        0,
        f"- **Held out in time for this version's code**: the same {fs['n']} changes recorded again after this version's changes (the next lines) were written "
        f"and the interval fixed (`python benchmarks/record_knobs.py data/knobs_fresh`; `python "
        f"benchmarks/knobs.py data/knobs_fresh --json benchmarks/knobs_fresh_results.json`), nothing chosen on them: factor "
        f"from the other size MAPE {_pct(fs['mape'])}, sign {_pct(fs['sign'], 0)}, Kendall τ {fs['kendall_tau']:.2f} (the "
        f"noise's ceiling {fr['kendall_tau_noise_ceiling']:.2f}; clean vs clean median "
        f"{_pct(fr['noise']['median_clean_vs_clean'])}, {fr['noise']['above_bound']} changes above the 5% bound); per knob "
        + ", ".join(f"{k} {_pct(v[held]['mape'])}" for k, v in fr["by_kind"].items())
        + f"; unchanged {_pct(fr['scores']['unchanged']['mape'])}, proportional {_pct(fr['scores']['proportional']['mape'])}; "
        f"the shipped interval covers {_pct(inside, 0)} of them. The code before this version's changes on the same recording "
        f"(`benchmarks/knobs_fresh_formula_results.json`, 941c6d0): MAPE {_pct(ff['mape'])}, sign {_pct(ff['sign'], 0)}, τ "
        f"{ff['kendall_tau']:.2f}. They are the 40 condition definitions the changes were made with, recorded again: other "
        "definitions are the recordings below.",
    )
    return (
        _table(head, rows)
        + "\n\nMAPE of the step time after the change, per knob; sign and τ (of the relative change) for the factor from the other size:\n\n"
        + _table(["knob", "changes", *names.values(), "sign", "Kendall τ"], kinds)
        + "\n\n"
        + "\n".join(lines)
        + "\n"
    )


def culprits(root: Path) -> str:
    d = _load(root, "benchmarks/culprits_results.json")
    eff, lay = d["by_effect"], d["per_layout"]
    layouts = sorted(lay)
    rows = []
    for name, s in d["methods"].items():
        by_effect = [f"{_pct(eff[e][name]['top1'], 0)} / {_pct(eff[e][name]['top3'], 0)}" for e in ("lengthened", "absorbed")]
        rows.append(
            [
                name,
                f"**{_pct(s['top1'])}**",
                _pct(s["top3"]),
                *by_effect,
                *(f"{_pct(lay[x][name]['top1'], 0)} / {_pct(lay[x][name]['top3'], 0)}" for x in layouts),
            ]
        )
    n_len, n_abs = (next(iter(eff[e].values()))["n"] for e in ("lengthened", "absorbed"))
    head = [
        "method",
        "top-1",
        "top-3",
        f"lengthened ({n_len})",
        f"absorbed ({n_abs})",
        *(f"{x} ({next(iter(lay[x].values()))['n']})" for x in layouts),
    ]
    return (
        _table(head, rows)
        + f"\n\n{d['steps']} injected steps; blame took {d['blame_seconds_per_step']:.2f} s per step. Per-group cells are top-1 / top-3.\n"
        + "\nAgainst the targets (top-1 ≥ 90%, top-3 ≥ 98%): "
        + "; ".join(
            f"{name}: {_meets(s['top1'] >= 0.9, s['top3'] >= 0.98)}" for name, s in d["methods"].items() if name.startswith("blame")
        )
        + ".\n"
    )


def _meets(top1: bool, top3: bool) -> str:
    return "meets both" if top1 and top3 else "meets top-1, not top-3" if top1 else "meets top-3, not top-1" if top3 else "meets neither"


def close_loop(root: Path) -> str:
    rows, wrong = [], {"bidirectional": 0, "directed": 0}
    data = _load(root, "benchmarks/close_loop_results.json")
    for r in data:
        model = r["predicted_model_ms"]
        for v in wrong:
            wrong[v] += model[v] < 0 < r["predicted_replay_ms"]
        measured = r.get("measured_ms")
        rows.append(
            [
                r["scenario"],
                f"`{r['top']}`",
                r["change"],
                f"{r['predicted_replay_ms']:.2f}",
                f"{model['correction']:.2f}",
                "— (not applied)" if measured is None else f"{measured:.2f}",
            ]
        )
    return (
        _table(["scenario", "top suggestion", "applied", "predicted saving: replay ms", "correction variant ms", "measured ms"], rows)
        + "\n\nThe bidirectional and directed variants predicted a negative saving (the step getting slower) in "
        + (
            f"every one of these {len(data)} scenarios"
            if set(wrong.values()) == {len(data)}
            else f"{wrong['bidirectional']} and {wrong['directed']} of these {len(data)} scenarios"
        )
        + ".\n"
    )


def gpu(root: Path) -> str:
    rows, floors = [], []
    for name, note in (("gpu_reruns_results.json", "runs 2 and 3"), ("gpu_reruns_pinned_results.json", "run 1, the CPU protocol")):
        d = _load(root, f"benchmarks/{name}")
        floors.append(f"{note}: clean vs clean {_pct(float(np.median([r['clean_vs_clean'] for r in d['rows']])))} (median)")
        for group, s in d["summary"].items():
            rows.append(
                [
                    note,
                    group,
                    str(s["n"]),
                    _pct(s["mape"]),
                    _pct(s["median_ape"]),
                    f"{_pct(s['mape_measured_1ms_up'])} (n={s['n_measured_1ms_up']})",
                    f"{s['mean_abs_error_ms']:.2f} ms",
                    _pct(s["sign"], 0),
                    f"{s['kendall_tau']:.2f}",
                ]
            )
    stalls = []
    for delay in sorted({r["delay_ms"] for r in _load(root, "benchmarks/gpu_reruns_results.json")["rows"]}):
        rs = [r for r in _load(root, "benchmarks/gpu_reruns_results.json")["rows"] if r["kind"] == "stall" and r["delay_ms"] == delay]
        if rs:
            m, p = [r["measured_us"] / 1000 for r in rs], [r["replay_us"] / 1000 for r in rs]
            stalls.append([f"{delay:g} ms", str(len(rs)), f"{min(m):.2f} to {max(m):.2f}", f"{min(p):.2f} to {max(p):.2f}"])
    return (
        _table(["run", "conditions", "n", "MAPE", "median APE", "MAPE (measured ≥ 1 ms)", "mean abs. error", "sign", "Kendall τ"], rows)
        + "\n\n"
        + "; ".join(floors)
        + ".\n\nDevice-side stalls (runs 2 and 3), the measured saving against the replay's:\n\n"
        + _table(["stall", "conditions", "measured saving ms", "replay ms"], stalls)
        + "\n"
    )


def scale(root: Path) -> str:
    text = (root / "benchmarks/RESULTS.md").read_text().split("\n## Huge traces")[0]  # bench_scale.py's part
    lines = text.splitlines()
    return "\n".join(lines[1:] if lines and lines[0].startswith("# ") else lines).strip() + "\n"


def _walls(r: dict) -> str:
    """A timing: the median of its runs, every run beside it when there were several."""
    walls = r.get("walls_s") or [r["wall_s"]]
    return f"{r['wall_s']:.1f}" + (f" ({', '.join(f'{w:.1f}' for w in walls)})" if len(walls) > 1 else "")


def huge_traces(root: Path) -> str:
    """Issue 32's figures: benchmarks/ranks_results.json (bench_ranks.py) and scanner_results.json (bench_scanner.py)."""
    d = _load(root, "benchmarks/ranks_results.json")
    rows = []
    for r in d["runs"]:
        what = (
            f"one rank, {r['json_gib']:.2f} GiB, `analyze --json{' ' + ' '.join(r['options']) if r.get('options') else ''}`"
            if r["ranks"] == 1
            else f"{r['ranks']:,} ranks x 2 steps, {r['json_gib']:.2f} GiB, `analyze --json --executor {r['executor']}`"
        )
        rows.append([what, f"{r['events']:,}", _walls(r), f"{r['peak_main_mb']:,.0f}", f"{r['peak_worker_mb']:,.0f}"])
    if "blame" in d:
        b = d["blame"]
        rows.append([f"2 ranks x {b['steps']:,} steps, `blame`", f"{b['events']:,}", _walls(b), f"{b['peak_main_mb']:,.0f}", "—"])
    text = f"`{d['command']}` on {d['date']}, {d['cores']} cores:\n\n" + _table(
        ["run", "events", "seconds (median; each run)", "peak RSS, main (MB)", "largest worker (MB)"], rows
    )
    dask = [r for r in d["runs"] if r.get("executor") == "dask"]
    local = {r["ranks"]: r for r in d["runs"] if r.get("executor") == "local" and r["ranks"] > 1}
    for r in dask:
        if r["ranks"] in local:
            same = "the same" if r["answer_sha"] == local[r["ranks"]]["answer_sha"] else "**different**"
            text += f"\n\nDask LocalCluster (2 workers) at {r['ranks']:,} ranks: {r['wall_s'] / local[r['ranks']]['wall_s']:.2f}x the local engine's time (medians); {same} step answers."
    if "json_size" in d:
        j = d["json_size"]
        text += (
            f"\n\n`analyze --json` of `{j['trace']}`: {j['default_bytes']:,} bytes by default, {_pct(j['default_share'], 2)} of the "
            f"uncompressed trace ({j['trace_bytes']:,} bytes); with `--full-path` {_pct(j['full_path_share'])}."
        )
    if (root / "benchmarks/growth_results.json").exists():
        gr = _load(root, "benchmarks/growth_results.json")
        grows = [
            [
                r["shape"],
                f"{r['ranks']:,}",
                f"{r['events']:,}",
                f"{r['wall_s']:.1f}",
                f"{r['us_per_event']:.2f}",
                f"{r['peak_main_mb']:,.0f}",
            ]
            for r in gr["runs"]
        ]
        text += f"\n\nGrowth (`{gr['command']}`, {gr['date']}; `analyze --json`, local engine):\n\n" + _table(
            ["trace", "ranks", "events", "seconds", "µs an event", "peak RSS, main (MB)"], grows
        )
    sc = _load(root, "benchmarks/scanner_results.json")
    srows = []
    for f in sc["files"]:
        r = f["readers"]
        srows.append([f"`{Path(f['file']).name}`", f"{f['mb']:,.0f}"] + [f"{v['mb_per_s']:,.0f}" for v in r.values()])
    names = list(sc["files"][0]["readers"]) if sc["files"] else []
    text += (
        f"\n\nReading the events (`python benchmarks/bench_scanner.py`, {sc['date']}; MB/s of JSON, median of repeats, from the same "
        f"bytes in memory; orjson {sc['versions']['orjson']}, msgspec {sc['versions']['msgspec']}):\n\n"
        + _table(["trace", "MB", *names], srows)
        + "\n"
    )
    return text


def corrections_interval(root: Path) -> str:
    with np.load(root / "src/bottleneck_oracle/models/corrections.npz", allow_pickle=False) as z:
        half, trained = float(z["halfwidth"]), str(z["trained_on"])
    return f"The bundled corrections' 90% interval is ±{half:.2f}× the time the edit removes; they were trained on: {trained}.\n"


def model_earned(root: Path) -> str:
    d = _load(root, "benchmarks/model_earned_results.json")
    rows = [[k, _pct(v["mape"]), _pct(v["median_ape"])] for k, v in d["scores"].items()]
    tests = "; ".join(
        f"than {k}: p = {t['p_corrected_better']:.3f} ({t['corrected_wins']} of {d['n']} better)" for k, t in d["paired_tests"].items()
    )
    cov = "; ".join(f"{k}: {_pct(v, 0)}" for k, v in d["coverage"].items())
    return (
        _table(["predictor", "MAPE", "median APE"], rows)
        + f"\n\nPaired Wilcoxon test (one-sided), the corrected replay better {tests}. Interval coverage: {cov}. "
        f"Earned its place: **{'yes' if d['earned'] else 'no'}** ({d['n']} conditions, {d['launches']} launches; held out: {d['held_out']}).\n"
    )


def compare_verdicts(root: Path) -> str:
    d = _load(root, "benchmarks/compare_verdicts_results.json")
    acc = d["acceptance"]
    loads = [v[k] for v in d["recordings"].values() for k in ("load_before", "load_after")]
    meds = [v["median_step_us"] / 1000 for v in d["recordings"].values()]
    eligible = [r for r in d["slowed"] if r["true_in_se"] >= 2 and r["true_share"] >= 0.01]

    def frac(k: int, m: int) -> str:
        return f"{k} of {m} ({_pct(k / m if m else None, 0)})"

    by_n = "; ".join(
        f"{n} steps a side: "
        + frac(sum(r["slower"] for r in eligible if r["n"] == n), sum(r["conditions"] for r in eligible if r["n"] == n))
        for n in sorted({r["n"] for r in eligible})
    )
    bins = "; ".join(
        f"{b['true_in_se'][0]}–{b['true_in_se'][1] or '∞'} SE: {frac(b['called_slower'], b['conditions'])}"
        for b in acc["slower_by_size_in_se"]
        if b["conditions"]
    )
    clean = {}
    for r in d["clean"]:
        k, m = clean.get(r["design"], (0, 0))
        clean[r["design"]] = (k + r["called"], m + r["conditions"])
    alike = sum(r.get("called_and_ops_said_alike", 0) for r in d["clean"])
    alike_slowed = sum(r["called_and_ops_said_alike"] for r in d["separate_recordings_slowed"])
    sep = d["separate_recordings_slowed"]
    ok = acc["slower_when_at_least_2se_and_1pct"]
    slowed = ", ".join(
        f"{r['delay_ms']:g} ms: {100 * r['true_share']:+.1f}%" for r in d["slowed"] if r["n"] == min(x["n"] for x in d["slowed"])
    )
    return (
        f"Recordings of {d['steps_per_recording']} steps of a 2-rank gloo DDP job on a 2-core machine shared with other work "
        f"(load average {min(loads):.1f} to {max(loads):.1f}; median step {min(meds):.0f} to {max(meds):.0f} ms between recordings); "
        f"conditions are disjoint windows of 5, 10 or 20 steps a side (the windows of different sizes reuse the same steps). "
        f"True slowdowns (all slowed against all clean steps of a recording): {slowed}.\n\n"
        f"| | called |\n|---|---|\n"
        f"| slower, where the slowdown is ≥ 2 standard errors of the median difference and ≥ 1% | {frac(ok['called_slower'], ok['conditions'])}; {by_n} |\n"
        f"| the same, by the slowdown's size | {bins} |\n"
        f"| different, clean against clean, interleaved in one recording | {frac(*clean['interleaved'])} |\n"
        f"| different, clean against clean, back to back in one recording | {frac(*clean['back to back, one recording'])} |\n"
        f"| different, clean against clean, two recordings minutes apart | {frac(*clean['two recordings'])}; of those, "
        f"{alike} with the warning that the ops themselves ran longer or shorter like the step |\n"
        f"| slower, a separate recording slowed by {d['recordings'][sep[0]['recording'].split()[-1]]['delay_ms']:g} ms a step against clean | "
        + "; ".join(f"{r['n']} steps a side: {frac(r['called'], r['conditions'])}" for r in sep)
        + f"; of those, {alike_slowed} with that warning too |\n"
        + _compare_verdicts_again(root)
    )


def _compare_verdicts_again(root: Path) -> str:
    """The same design recorded again, later, on a quiet machine (benchmarks/compare_verdicts_again_results.json)."""
    d = _load(root, "benchmarks/compare_verdicts_again_results.json")
    acc = d["acceptance"]
    loads = [v[k] for v in d["recordings"].values() for k in ("load_before", "load_after")]
    ok, cc = acc["slower_when_at_least_2se_and_1pct"], acc["clean_called_different_interleaved"]
    bins = "; ".join(
        f"{b['true_in_se'][0]}–{b['true_in_se'][1] or '∞'} SE: {b['called_slower']} of {b['conditions']}"
        for b in acc["slower_by_size_in_se"]
        if b["conditions"]
    )
    return (
        f"\nRecorded again in a later session with nothing else running (load average {min(loads):.1f} to {max(loads):.1f}; "
        "`python benchmarks/compare_verdicts.py --out benchmarks/compare_verdicts_again_results.json`): slower where the "
        f"slowdown is ≥ 2 standard errors and ≥ 1%: {ok['called_slower']} of {ok['conditions']} ({_pct(ok['fraction'], 0)}); by size: "
        f"{bins}; clean against clean, interleaved, called different: {cc['called']} of {cc['conditions']}.\n"
    )


def persistent(root: Path) -> str:
    d = _load(root, "benchmarks/persistent_results.json")
    sm = d["summary"]
    rows = []
    for lay, name in (("dp", "data-parallel (no baseline)"), ("pp", "1F1B pipeline (with --baseline)")):
        mine = [r for r in d["rows"] if r["layout"] == lay]
        n = len(mine)
        rows.append(
            [
                name,
                str(n),
                f"{sum(r['rank_ok'] for r in mine)} of {n}",
                f"{sum(r['region_ok'] for r in mine)} of {n}",
                f"{sum(r['saving_ok'] for r in mine)} of {n}",
                f"{sum(r['saving_vs_injected_ok'] for r in mine)} of {n}",
            ]
        )
    n = sm["conditions"]
    rows.append(
        [
            "all",
            str(n),
            _pct(sm["rank_named"], 0),
            _pct(sm["region_named"], 0),
            _pct(sm["saving_within_25pct"], 0),
            _pct(sm["saving_within_25pct_of_injected"], 0),
        ]
    )
    spread = ", ".join(f"{lay} {_pct(v, 0)}" for lay, v in sm["clean_spread"].items() if v is not None)
    return (
        _table(
            [
                "layout",
                "conditions",
                "slowed rank named",
                "its region named",
                "saving within 25% of the measured difference",
                "saving within 25% of the injected time",
            ],
            rows,
        )
        + f"\n\n{sm['steps']} profiled steps per recording; the clean recordings of a layout spread {spread} (largest minus smallest "
        "median, over their median): the measured difference holds that drift of the machine as well as the slowdown.\n"
        + _persistent_again(root)
    )


PERSISTENT_RECORDINGS = (
    ("benchmarks/persistent_first_results.json", "first (others' work on the machine)", "data/persistent"),
    ("benchmarks/persistent_rerecorded_results.json", "again, nothing else of ours running", "data/persistent_quiet"),
    ("benchmarks/persistent_again_results.json", "a later session, nothing else running", "data/persistent"),
    ("benchmarks/persistent_results.json", "right after it (the table above)", "data/persistent2"),
    (
        "benchmarks/persistent_period_results.json",
        "a later session, after a step's period across ranks began where the last rank finished the step before",
        "data/persistent_period",
    ),
    (
        "benchmarks/persistent_feeds_results.json",
        "a later session, after a collective's completion was tied to the thread that waited for it "
        "(asynchronous calls, DDP's buckets); `--rescore` (which takes each condition's clean runs as recorded "
        "before it, not the last one) gives 78% (25 of 32) with the code before that change "
        "(5cacfc6, persistent_feeds_previous_code_results.json), with the session's final code "
        "(persistent_feeds_final_code_results.json) and with a later session's, after its process-group and "
        "send/recv changes (persistent_feeds_groups_code_results.json: `python benchmarks/persistent.py --out "
        "data/persistent_feeds --rescore --json benchmarks/persistent_feeds_groups_code_results.json`) alike",
        "data/persistent_feeds",
    ),
    (
        "benchmarks/persistent_s60_results.json",
        "a later session, after extra ops (ops one rank runs and its peers do not) were made an answer of their own; "
        "recorded and scored with that change's first cut, which read a backward hook only the slowed rank registers "
        "as extra ops and named no region in the 10 data-parallel backward conditions (rank 100%, region 69%, saving "
        "66%: persistent_s60_first_cut_results.json), then scored with the final code by `--rescore` (the row; the "
        "one saving outside 25%: a condition whose measured difference, 106 ms for 30 ms injected, holds a stall of "
        "the machine)",
        "data/persistent_s60",
    ),
)


def _persistent_again(root: Path) -> str:
    """Every recording of the same 32 conditions, one row each: the clean runs' spread beside the scores."""
    rows = []
    for path, what, out in PERSISTENT_RECORDINGS:
        sm = _load(root, path)["summary"]
        spread = ", ".join(f"{lay} {_pct(v, 0)}" for lay, v in sm["clean_spread"].items() if v is not None)
        rows.append(
            [
                f"{what}: `python benchmarks/persistent.py --out {out} --json {path}`",
                spread,
                _pct(sm["rank_named"], 0),
                _pct(sm["region_named"], 0),
                _pct(sm["saving_within_25pct"], 0),
                _pct(sm["saving_within_25pct_of_injected"], 0),
            ]
        )
    return (
        "\nEvery recording of the 32 conditions:\n\n"
        + _table(
            [
                "recording",
                "clean runs' spread",
                "rank named",
                "region named",
                "saving within 25% of the measured difference",
                "of the injected time",
            ],
            rows,
        )
        + "\n\nThe measured difference holds the machine's drift between the clean and the slowed recordings (a shared 2-core VM) "
        "as well as the slowdown: read the savings column beside the clean runs' spread. The injected time is a sleep's or a "
        "count of matmuls': a matmul's time is the machine's, so a compute condition misses it where the machine runs the "
        "matmuls slower than when they were sized.\n"
    )


def headline(root: Path) -> str:
    acc = _load(root, "benchmarks/accuracy_results.json")["makespan"]
    within = [r for r in acc if r["max_abs_error_pct"] <= 1.0]
    span = [r for r in acc if r["max_abs_span_vs_period_pct"] > 5.0]
    checks, failed = sum(r["checks"] for r in acc), sum(r["checks_failed"] for r in acc)
    fin = _load(root, "benchmarks/heldout_final_results.json")["all"]
    cul = _load(root, "benchmarks/culprits_results.json")
    blame, clean = cul["methods"]["blame (counterfactual replay)"], cul["methods"]["blame, clean baseline (unperturbed steps)"]
    g = _load(root, "benchmarks/gpu_reruns_results.json")["summary"]["all"]
    me = _load(root, "benchmarks/model_earned_results.json")
    kn = _load(root, "benchmarks/knobs_results.json")
    ks, held = kn["scores"], "set, factor from the other size"
    kf = _load(root, "benchmarks/knobs_fresh_results.json")["scores"][held]
    kp = _load(root, "benchmarks/knobs_pooled_results.json")["scores"]["set"]
    return (
        f"- **Step time**: the critical path's step time equals the step's period read from the raw events within 1% on "
        f"{len(within)} of {len(acc)} bundled traces; on {len(span)} of them the host's `ProfilerStep` span is more than 5% off "
        f"that period (the device runs behind the host). The self-check's invariants hold {checks - failed} times of {checks}.\n"
        f"- **What-if against re-runs**: on {fin['n']} slowdowns measured on a 2-core CPU machine (clean vs clean "
        f"{_pct(fin['clean_vs_clean_median'], 2)}), the replay's predicted saving has a MAPE of {_pct(fin['replay']['mape'])} "
        f"(Kendall τ {fin['replay']['kendall_tau']:.2f}); the measurement against itself: {_pct(fin['remeasured']['mape'])}. "
        f"On {g['n']} GPU conditions (one H200): {_pct(g['mape_measured_1ms_up'])} where the saving is at least 1 ms.\n"
        f"- **Configuration changes** (`whatif --set`): on {ks[held]['n']} re-runs at a changed setting ({len(kn['by_kind'])} knobs, "
        f"{len(kn['by_size'])} model sizes, DDP and a pipeline; CPU), the predicted step time has a MAPE of {_pct(ks[held]['mape'])} "
        f"with its one fitted number chosen on the other model size, the sign of the change right in {_pct(ks[held]['sign'], 0)} "
        f"(Kendall τ {ks[held]['kendall_tau']:.2f}); assuming no change: {_pct(ks['unchanged']['mape'])}, scaling the whole step: "
        f"{_pct(ks['proportional']['mape'])}; the same changes recorded again after this version's code: {_pct(kf['mape'])}, sign "
        f"{_pct(kf['sign'], 0)}, τ {kf['kendall_tau']:.2f}; {kp['n']} changes of four recordings pooled (other micro-batch "
        f"counts and the AFAB schedule among them): {_pct(kp['mape'])}, sign {_pct(kp['sign'], 0)}, τ {kp['kendall_tau']:.2f}.\n"
        f"- **The graph network** is off by default: its corrected replay ({_pct(fin['corrected']['mape'])}) beats the replay, "
        f"but not the replay times a constant fitted on other launches ({_pct(me['scores']['replay x constant (other launches)']['mape'])}, "
        f"paired test p = {me['paired_tests']['replay x constant (other launches)']['p_corrected_better']:.2f}); `--model` shows it.\n"
        f"- **Culprits**: on {cul['steps']} steps with an injected delay, `blame`'s first row is the injected op in "
        f"{_pct(blame['top1'])} ({_pct(clean['top1'])} with a clean baseline).\n"
    )


def collective_alignment(root: Path) -> str:
    """benchmarks/collective_alignment.py: collectives matched across ranks where a rank's trace lacks some."""
    d = _load(root, "benchmarks/collective_alignment_results.json")
    rows = []
    for r in d["synthetic"]:
        t, o = r["tool"], r["kth_of_kind_and_size"]
        rows.append(
            [
                str(r["ranks"]),
                f"{100 * r['drop']:.0f}%",
                r["clock"],
                f"{t['collectives_held']:,}",
                f"{t['wrong']:,} / {o['wrong']:,}",
                f"{t['missed']:,} / {o['missed']:,}",
            ]
        )
    out = _table(["ranks", "ops dropped", "clocks", "collectives", "wrong: tool / k-th", "missed: tool / k-th"], rows) + "\n"
    rows = []
    for r in d["pipeline"]:
        t, o = r["tool"], r["kth_of_kind_and_size"]
        rows.append(
            [
                f"{100 * r['drop']:.0f}%",
                f"{t['collectives_held']:,}",
                f"{t['wrong']:,} / {o['wrong']:,}",
                f"{t['missed']:,} / {o['missed']:,}",
            ]
        )
    out += "\nSends and receives between two pipeline stages (80 transfers a job, 100 jobs a row):\n\n"
    out += _table(["ops dropped", "transfers", "wrong: tool / k-th", "missed: tool / k-th"], rows) + "\n"
    rows = []
    for r in d.get("sampled", []):
        t, o = r["tool"], r["kth_of_kind_and_size"]
        rows.append(
            [
                f"`{r['trace']}`",
                str(r["trials"]),
                f"{t['collectives_held']:,}",
                f"{t['wrong']:,} / {o['wrong']:,}",
                f"{t['missed']:,} / {o['missed']:,}",
                str(t["runs_refused"]),
            ]
        )
    if rows:
        out += "\nReal traces with 5% of every rank's events dropped at random (the trace as recorded is the truth):\n\n"
        out += _table(["trace", "copies", "collectives", "wrong: tool / k-th", "missed: tool / k-th", "runs refused"], rows) + "\n"
    g = d["dlrm"]
    if g:
        t, o = g["tool"], g["kth_of_kind_and_size"]
        out += (
            f"\n`dlrm_v100_8rank` with one NCCL kernel removed from one rank's file ({g['trials']} trials, seed {g['seed']}): of "
            f"{t['collectives_held']} collectives two or more ranks hold, {t['wrong']} instances pair different ones and "
            f"{t['missed']} are not one instance (the k-th rule: {o['wrong']} and {o['missed']}); steps refused: {t['steps_refused']}.\n"
        )
    return out


FIGURES_OF: dict[str, Callable[[Path], str]] = {
    "quickstart": quickstart,
    "headline": headline,
    "step-time": step_time,
    "eval-table": eval_table,
    "eval-best": eval_best,
    "reruns-final": reruns_final,
    "reruns-by-kind": reruns_by_kind,
    "reruns-history": reruns_history,
    "rerecorded": rerecorded,
    "reruns-earlier": reruns_earlier,
    "local-scores": local_scores,
    "heldout-in-time": heldout_in_time,
    "noise-steps": noise_steps,
    "noise-sources": noise_sources,
    "knobs": knobs,
    "culprits": culprits,
    "close-loop": close_loop,
    "gpu": gpu,
    "scale": scale,
    "huge-traces": huge_traces,
    "corrections-interval": corrections_interval,
    "model-earned": model_earned,
    "compare-verdicts": compare_verdicts,
    "persistent": persistent,
    "collective-alignment": collective_alignment,
}
README_BLOCKS = ("quickstart", "headline")  # figures the README also shows, between its markers


def _readme_with(text: str, figures: dict[str, str]) -> str:
    for name in README_BLOCKS:
        start, end = f"<!-- figure:{name} -->", f"<!-- /figure:{name} -->"
        if start not in text or end not in text:
            raise SystemExit(f"README.md: no {start} ... {end} block")
        block = f"{start}\n{figures[name]}{end}"
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _m, block=block: block, text, count=1, flags=re.S)
    return text


RESULTS = Path("benchmarks/RESULTS.md")
RESULTS_BLOCK = "huge-traces"  # RESULTS.md: bench_scale.py's block, then this one (kept by bench_scale.py)


def _results_with(text: str, figures: dict[str, str]) -> str:
    start, end = f"<!-- figure:{RESULTS_BLOCK} -->", f"<!-- /figure:{RESULTS_BLOCK} -->"
    head = text.split("\n## Huge traces")[0].rstrip("\n")
    return f"{head}\n\n## Huge traces\n\n{start}\n{figures[RESULTS_BLOCK]}{end}\n"


def render(root: Path = ROOT) -> dict[Path, str]:
    """Every generated file (relative path -> text): docs/figures/NAME.md, the README and benchmarks/RESULTS.md."""
    figures = {name: fn(root) for name, fn in FIGURES_OF.items()}
    out = {FIGURES / f"{name}.md": text for name, text in figures.items()}
    out[README] = _readme_with((root / README).read_text(), figures)
    out[RESULTS] = _results_with((root / RESULTS).read_text(), figures)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing them")
    a = ap.parse_args()
    stale = []
    for rel, text in render().items():
        path = ROOT / rel
        if a.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(rel))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {rel}")
    if stale:
        print("out of date (run `make figures`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What-if against re-runs: predicted vs measured saving of the paired conditions.

``generate --paired`` (systems.paired) records persistent slowdowns, each in a block of steps
between two clean blocks, and measures what removing one saves: median(block) - mean(medians of
the clean blocks around it). This module predicts that saving from the perturbed steps alone and
scores the predictors against the measurement:

- ``own``: the slowdown's own measured time (the injected ranges on the slowed rank: a sleep's
  range, or the span of the extra ops), what a per-op profile view shows;
- ``replay``: the exact replay (analysis.whatif) with the injected ranges removed: their ops take
  no time and the untraced time after them goes too;
- ``blame_op`` / ``blame_region``: blame's first op row and first region row, the perturbed step
  compared with its peer ranks and the other steps of its block (which all carry the slowdown:
  a persistent slowdown has to be found against peers);
- ``blame_region_baseline``: blame's first region row with the clean steps as the reference
  (``blame --baseline`` given the job as it normally runs): the only way to see a slowdown in
  every step on a rank that has no peer, a pipeline stage;
- ``corrected``: the replay with per-node duration corrections from a model trained on other
  conditions (see ``fit_corrections``), and a 90% interval.

Each predictor's figure for a condition is measured the way the saving is: it predicts every
step of the block without the slowdown (the step as recorded less that step's predicted saving),
and its saving is median(the block as recorded) - median(the block as predicted)
(``on_median``). The median of the per-step savings is another quantity: step times on a busy
machine come in modes a few milliseconds apart, and a median of differences and a difference of
medians then part by up to half the saving (docs/eval-reruns.md).
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bottleneck_oracle.analysis.blame import Blame, KeyMemo, blame
from bottleneck_oracle.analysis.cpm import CPMResult, run_cpm
from bottleneck_oracle.analysis.whatif import Edit, apply_edits
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.models.corrections import Corrections, EditFeatures, edit_features, terms

PREFIX = "oracle_inject:"


def read_paired(path: str | Path) -> list[dict]:
    """The rows of a paired.jsonl (or of a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "paired.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def removal_edits(rank: int) -> list[Edit]:
    """Remove the injected ranges of one rank: their ops, and the untraced time after them."""
    return [Edit(module=f"{PREFIX}*", rank=rank, scale=0.0), Edit(module=f"{PREFIX}*", rank=rank, scale=0.0, gap=True)]


def step_features(g: ExecutionGraph, table, rank: int, base: CPMResult | None = None) -> EditFeatures:
    """The correction model's inputs for removing the injected ranges of ``rank`` from ``g``."""
    return edit_features(apply_edits(g, removal_edits(rank), table=table), base)


def on_median(steps: np.ndarray | list[float], savings: np.ndarray | list[float]) -> float:
    """What per-step savings do to the block's median step: median(steps) - median(steps -
    savings), the estimator of the measured saving (NaN savings are left out; NaN if none is left)."""
    t, s = np.asarray(steps, dtype=np.float64), np.asarray(savings, dtype=np.float64)
    ok = np.isfinite(s)
    return float(np.median(t[ok]) - np.median(t[ok] - s[ok])) if ok.any() else float("nan")


def _empty() -> np.ndarray:
    return np.zeros(0)


@dataclass(slots=True)
class Conditions:
    """Per condition: measured and predicted savings (µs), and the per-step inputs of the model."""

    rows: list[dict] = field(default_factory=list)
    measured: np.ndarray = field(default_factory=_empty)
    own: np.ndarray = field(default_factory=_empty)
    replay: np.ndarray = field(default_factory=_empty)
    blame_op: np.ndarray = field(default_factory=_empty)
    blame_region: np.ndarray = field(default_factory=_empty)
    blame_region_baseline: np.ndarray = field(default_factory=_empty)
    region_names: list[str] = field(default_factory=list)
    baseline_region_names: list[str] = field(default_factory=list)
    noise: np.ndarray = field(default_factory=_empty)
    """the measured saving's standard error (µs): bootstrap over the steps of its three blocks"""
    remeasured: np.ndarray = field(default_factory=_empty)
    """the saving measured against the clean block before alone, and (``measured_after``) after alone"""
    measured_after: np.ndarray = field(default_factory=_empty)
    steps: list[list[tuple[ExecutionGraph, EditFeatures, np.ndarray]]] = field(default_factory=list)
    """per condition, per perturbed step: the graph, its features, and the target (log of the
    node's median duration in the clean steps over its median in the perturbed steps; NaN where
    unmatched)"""

    def select(self, idx: list[int]) -> Conditions:
        """The conditions ``idx``, in that order."""
        out = Conditions(
            rows=[self.rows[i] for i in idx],
            region_names=[self.region_names[i] for i in idx],
            baseline_region_names=[self.baseline_region_names[i] for i in idx],
            steps=[self.steps[i] for i in idx],
        )
        for name in ARRAYS:
            setattr(out, name, getattr(self, name)[idx])
        return out


ARRAYS = ("measured", "own", "replay", "blame_op", "blame_region", "blame_region_baseline", "noise", "remeasured", "measured_after")
"""The per-condition arrays of ``Conditions``."""


def _keys(g: ExecutionGraph) -> list[tuple]:
    """A node's identity across steps: rank, thread, name, occurrence on that thread."""
    n = g.nodes
    seen: dict[tuple, int] = {}
    out = []
    for i in range(g.n_nodes):
        k = (int(n["rank"][i]), int(n["tid"][i]), int(n["name"][i]))
        c = seen.get(k, 0)
        seen[k] = c + 1
        out.append((*k, c))
    return out


def evaluate_launch(rows: list[dict], table, graphs: list[ExecutionGraph], with_model_inputs: bool = True) -> Conditions:
    """Predictions for the conditions of one launch (its rows of paired.jsonl), from its graphs."""
    by_step = {g.step: g for g in graphs}
    step_time = {g.step: max(g.measured.values()) for g in graphs}
    out = Conditions()
    vals: dict[str, list[float]] = {name: [] for name in ARRAYS}
    rng = np.random.default_rng(0)
    memo = KeyMemo()
    identities: dict[int | None, list[tuple]] = {}  # by step: a clean step serves the conditions on both sides of it

    def identity(g: ExecutionGraph) -> list[tuple]:
        if g.step not in identities:
            identities[g.step] = [(k[0], k[1], g.names[k[2]], k[3]) for k in _keys(g)]
        return identities[g.step]

    for r in rows:
        c = r["condition"]
        gs = [by_step[s] for s in r["steps"] if s in by_step]
        clean = [by_step[s] for s in r["clean_steps"] if s in by_step]
        if not gs or not clean:
            continue
        per: dict[str, list[float]] = defaultdict(list)  # the step-wise predictions, by ARRAYS name
        names: dict[str, list[str]] = defaultdict(list)  # the top region's label, by reference
        per_step = []
        clean_dur: dict[tuple, list[float]] = {}
        pert_dur: dict[tuple, list[float]] = {}
        typical: dict[tuple, tuple[float, float]] = {}  # per node identity: median clean and perturbed durations
        if with_model_inputs:
            for h in clean:
                for k, v in zip(identity(h), h.nodes["mdur"]):
                    clean_dur.setdefault(k, []).append(float(v))
            for h in gs:
                for k, v in zip(identity(h), h.nodes["mdur"]):
                    pert_dur.setdefault(k, []).append(float(v))
            typical = {k: (float(np.median(v)), float(np.median(pert_dur[k]))) for k, v in clean_dur.items() if k in pert_dur}
        for g in gs:
            base = run_cpm(g)
            feats = step_features(g, table, c["rank"], base)
            edited = feats.times.cpm()
            per["replay"].append(base.makespan - edited.makespan)
            per["own"].append(feats.removed_us)
            b = blame(g, [h for h in gs if h is not g], top=3, cpm=base, memo=memo)
            per["blame_op"].append(b.nodes[0].saving_us if b.nodes else 0.0)
            _top_region(per, names, "blame_region", b)
            _top_region(per, names, "blame_region_baseline", blame(g, clean, top=3, cpm=base, memo=memo))
            if with_model_inputs:
                # the node's typical clean duration over its typical perturbed one (medians on both
                # sides: against this step's own duration, the right tail of one step's noise --
                # a tick-long wake-up -- would read as a node that gets faster, biasing every saving up)
                y = np.full(g.n_nodes, np.nan)
                for i, k in enumerate(identity(g)):
                    both = typical.get(k)
                    if both and float(g.nodes["mdur"][i]) > 0 and not feats.edited[i]:
                        y[i] = math.log(max(both[0], 0.01) / max(both[1], 0.01))
                per_step.append((g, feats, y))
        out.rows.append(r)
        t = step_time
        tp = np.array([t[s] for s in r["steps"] if s in t])
        half = len(r["clean_steps"]) // 2
        first, second = r.get("clean_groups") or (r["clean_steps"][:half], r["clean_steps"][half:])
        tb = np.array([t[s] for s in first if s in t])
        ta = np.array([t[s] for s in second if s in t])
        vals["measured"].append(r["measured_saving_us"])
        vals["noise"].append(_bootstrap_se(tp, tb, ta, rng))
        vals["remeasured"].append(float(np.median(tp) - np.median(tb)))
        vals["measured_after"].append(float(np.median(tp) - np.median(ta)))
        for name, xs in per.items():
            vals[name].append(on_median(tp, xs))  # tp: the block's steps as recorded, in the order of gs
        for labels, into in ((names["blame_region"], out.region_names), (names["blame_region_baseline"], out.baseline_region_names)):
            into.append(Counter(labels).most_common(1)[0][0])  # the most frequent; a tie goes to the first seen, the same in every process
        out.steps.append(per_step)
    for name in ARRAYS:
        setattr(out, name, np.array(vals[name], dtype=np.float64))
    return out


def _top_region(per: dict[str, list[float]], names: dict[str, list[str]], name: str, b: Blame) -> None:
    """Note blame's first region row (its saving and label) under ``name``."""
    per[name].append(b.regions[0].saving_us if b.regions else 0.0)
    names[name].append(b.regions[0].label if b.regions else "")


def _bootstrap_se(tp: np.ndarray, tb: np.ndarray, ta: np.ndarray, rng: np.random.Generator, n: int = 400) -> float:
    """Standard error of median(perturbed) - (median(before) + median(after)) / 2, resampling each block's steps."""
    if not (len(tp) and len(tb) and len(ta)):
        return float("nan")
    draws = [
        np.median(rng.choice(tp, len(tp))) - (np.median(rng.choice(tb, len(tb))) + np.median(rng.choice(ta, len(ta)))) / 2 for _ in range(n)
    ]
    return float(np.std(draws))


def merge(parts: list[Conditions]) -> Conditions:
    out = Conditions()
    for p in parts:
        out.rows += p.rows
        out.region_names += p.region_names
        out.baseline_region_names += p.baseline_region_names
        out.steps += p.steps
    for name in ARRAYS:
        setattr(out, name, np.concatenate([getattr(p, name) for p in parts]) if parts else np.zeros(0))
    return out


# -- the correction model -------------------------------------------------------------------


def fit_corrections(train: Conditions, members: int = 20, seed: int = 0, ridge: float = 10.0) -> Corrections:
    """Fit the ensemble on the matched nodes of the training conditions (targets clipped to
    [-1, 1]: a node at most e times faster or slower); uncalibrated (see ``calibrate``)."""
    rng = np.random.default_rng(seed)
    per_cond = []
    for steps in train.steps:
        xs = [terms(f.x[np.isfinite(y)]) for _, f, y in steps]
        ys = [np.clip(y[np.isfinite(y)], -1.0, 1.0) for _, _, y in steps]
        if xs:
            per_cond.append((np.concatenate(xs), np.concatenate(ys)))
    if not per_cond:
        raise ValueError("no training conditions with matched nodes")
    allx = np.concatenate([x for x, _ in per_cond])
    every = np.concatenate([terms(f.x) for steps in train.steps for _, f, _ in steps])  # the range inference sees: every node
    mean, std = allx.mean(axis=0), allx.std(axis=0)
    std[std == 0] = 1.0
    # the normal equations of each condition, summed over a bootstrap resample
    grams = []
    for x, y in per_cond:
        z = np.column_stack([(x - mean) / std, np.ones(len(x))])
        grams.append((z.T @ z, z.T @ y))
    k = grams[0][0].shape[0]
    reg = ridge * np.eye(k)
    reg[-1, -1] = 0.0
    coef = []
    for _ in range(members):
        pick = rng.integers(0, len(grams), len(grams))
        coef.append(np.linalg.solve(sum(grams[i][0] for i in pick) + reg, sum(grams[i][1] for i in pick)))
    return Corrections(np.array(coef), mean, std, every.min(axis=0), every.max(axis=0), trained_on=f"{len(per_cond)} paired conditions")


def corrected(model: Corrections, c: Conditions) -> np.ndarray:
    """The corrected saving of each condition: its effect on the median step (``on_median``)."""
    out = []
    for steps in c.steps:
        bases = [run_cpm(g) for g, _, _ in steps]
        out.append(on_median([b.makespan for b in bases], [model.saving(g, f, b) for (g, f, _), b in zip(steps, bases)]))
    return np.array(out)


def calibrate(model: Corrections, cal: Conditions, level: float = 0.9) -> None:
    """Split conformal: the ``level`` quantile of |measured - corrected| / removed time over the
    calibration conditions (the ceil((n + 1) level)-th smallest) becomes the interval's relative
    half-width."""
    model.halfwidth = conformal_halfwidth(cal, corrected(model, cal), level)


def conformal_halfwidth(c: Conditions, pred: np.ndarray, level: float = 0.9) -> float:
    """The ``level`` quantile (the ceil((n + 1) level)-th smallest) of |measured - predicted| /
    removed time over the conditions ``c`` (inf if there are none)."""
    scale = np.array([max(float(np.median([f.removed_us for _, f, _ in steps])), 1.0) for steps in c.steps])
    score = np.abs(c.measured - pred) / scale
    k = min(len(score) - 1, int(math.ceil((len(score) + 1) * level)) - 1)
    return float(np.sort(score)[k]) if len(score) else float("inf")


# -- scores ---------------------------------------------------------------------------------


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b of two rankings."""
    n = len(a)
    conc = disc = ta = tb = 0
    for i in range(n):
        da, db = np.sign(a[i + 1 :] - a[i]), np.sign(b[i + 1 :] - b[i])
        conc += int(np.sum(da * db > 0))
        disc += int(np.sum(da * db < 0))
        ta += int(np.sum((da == 0) & (db != 0)))
        tb += int(np.sum((db == 0) & (da != 0)))
    den = math.sqrt((conc + disc + ta) * (conc + disc + tb))
    return (conc - disc) / den if den else float("nan")


def scores(
    pred: np.ndarray, measured: np.ndarray, lo: np.ndarray | None = None, hi: np.ndarray | None = None, boot: int = 1000, seed: int = 0
) -> dict:
    """MAPE (with a bootstrap 90% interval over conditions), sign accuracy, Kendall's tau, share
    within 25%, and the coverage of [lo, hi] when given; over the conditions the predictor
    answered (a finite prediction: a model refuses inputs outside its domain), ``answered`` their share."""
    answered = np.isfinite(pred)
    n_all = len(pred)
    pred, measured = pred[answered], measured[answered]
    if lo is not None and hi is not None:
        lo, hi = lo[answered], hi[answered]
    ape = np.abs(pred - measured) / np.maximum(np.abs(measured), 1.0)
    rng = np.random.default_rng(seed)
    means = [float(np.mean(ape[rng.integers(0, len(ape), len(ape))])) for _ in range(boot)] if len(ape) else [float("nan")]
    out = {
        "n": int(len(ape)),
        "answered": float(len(ape) / n_all) if n_all else float("nan"),
        "mape": float(np.mean(ape)) if len(ape) else float("nan"),
        "mape_ci90": [float(np.quantile(means, 0.05)), float(np.quantile(means, 0.95))],
        "median_ape": float(np.median(ape)) if len(ape) else float("nan"),
        "within_25pct": float(np.mean(ape <= 0.25)) if len(ape) else float("nan"),
        "sign": float(np.mean(np.sign(pred) == np.sign(measured))) if len(ape) else float("nan"),
        "kendall_tau": kendall_tau(pred, measured) if len(ape) > 1 else float("nan"),
    }
    if lo is not None and hi is not None:
        out["coverage"] = float(np.mean((measured >= lo) & (measured <= hi)))
    return out

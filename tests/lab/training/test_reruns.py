"""What-if against re-runs (training.reruns) on synthetic 2-rank traces with a known slowdown.

Rank 1 runs extra small ops inside an ``oracle_inject:compute:`` range in a block of steps
(tests/analysis/test_regions.py writes the traces event by event); the clean steps around the
block are the re-run. Every prediction of what removing the range saves is checked against the
time the construction put there and against the measured step times.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kendalltau

from bottleneck_oracle.api import build
from bottleneck_oracle_lab.training.reruns import (
    _keys,
    calibrate,
    corrected,
    evaluate_launch,
    fit_corrections,
    kendall_tau,
    merge,
    on_median,
    scores,
)
from synthetic_ranks import write_run

PERTURBED, CLEAN = (5, 6, 7, 8), (2, 3, 4, 10, 11, 12)


def _launch(folder, pairs: int, seed: int):
    extra = write_run(
        folder, steps=12, extra_pairs=pairs, extra_steps=PERTURBED, seed=seed, extra_range="oracle_inject:compute:layers.0.mlp"
    )
    table, graphs = build(folder)
    t = {g.step: max(g.measured.values()) for g in graphs}
    measured = float(np.median([t[s] for s in PERTURBED]) - np.median([t[s] for s in CLEAN]))
    row = {
        "launch_id": folder.name,
        "size": "synthetic",
        "layout": "dp2",
        "steps": list(PERTURBED),
        "clean_steps": list(CLEAN),
        "condition": {"kind": "compute", "rank": 1, "delay_ms": 0.0, "target": "layers.0.mlp"},
        "measured_saving_us": measured,
    }
    return evaluate_launch([row], table, graphs), float(np.median([extra[s] for s in PERTURBED]))


def test_the_replay_and_the_region_row_recover_a_persistent_slowdown_the_op_rows_miss(tmp_path):
    c, extra = _launch(tmp_path / "a", pairs=60, seed=1)
    assert len(c.rows) == 1
    measured = c.measured[0]
    assert measured == pytest.approx(extra, rel=0.1)  # the peer waited for it at the all-reduce
    assert c.own[0] == pytest.approx(extra, rel=0.05)
    assert c.replay[0] == pytest.approx(measured, rel=0.1)
    # every other step of the block carries the slowdown too: only the peer rank shows it as extra
    assert c.blame_region[0] == pytest.approx(measured, rel=0.25)
    assert c.region_names[0] == "oracle_inject:compute:layers.0.mlp"
    # with the clean steps as the baseline, too
    assert c.blame_region_baseline[0] == pytest.approx(measured, rel=0.25)
    assert c.baseline_region_names[0] == "oracle_inject:compute:layers.0.mlp"
    assert c.blame_op[0] < 0.2 * measured  # 120 small ops: no single one explains it
    # per-node targets: the nodes left after the removal, matched to the clean steps by identity
    g, f, y = c.steps[0][0]
    # the 120 ops, and the op after the range: the range's time after its last op (its exit) is
    # the lead before that op, which removing the range shortens
    assert f.edited.sum() == 121 and np.isfinite(y).sum() > 0.5 * (~f.edited).sum()
    assert f.removed_us == pytest.approx(extra, rel=0.1)
    # a node's target is one per condition (median clean over median perturbed duration), not
    # each step's own duration against the clean median: every perturbed step gives it the same
    per_step = [
        {(k[0], k[1], h.names[k[2]], k[3]): (v, float(d)) for k, v, d in zip(_keys(h), yh, h.nodes["mdur"]) if np.isfinite(v)}
        for h, _, yh in c.steps[0]
    ]
    common = set(per_step[0]).intersection(*per_step[1:])
    assert len(common) > 50
    assert all(len({s[k][0] for s in per_step}) == 1 for k in common)
    assert sum(len({s[k][1] for s in per_step}) > 1 for k in common) > 0.5 * len(common)  # while the steps' own durations differ


def test_the_correction_model_stays_at_the_replay_where_nothing_else_changes(tmp_path):
    """On traces whose op durations do not depend on the schedule, the fitted corrections are
    near 1 and the corrected saving near the replay's; the conformal interval is finite."""
    parts = [_launch(tmp_path / f"r{k}", pairs=20 + 20 * k, seed=k)[0] for k in range(4)]
    allc = merge(parts)
    model = fit_corrections(merge(parts[:3]), members=5)
    calibrate(model, merge(parts[2:3]))
    pred = corrected(model, allc)
    assert np.all(np.abs(pred - allc.replay) <= 0.1 * allc.replay), (pred, allc.replay)
    factors = model.node_factors(parts[3].steps[0][0][1].x)
    assert factors.shape[0] == 5 and np.median(np.abs(np.log(factors))) < 0.05
    assert 0 <= model.halfwidth < 1.0


def test_a_predicted_saving_is_scored_on_the_median_step_as_the_measured_one_is():
    """Step times that come in two modes: every step of the block predicted 1 or 5 ms faster.
    The median of those savings (5) is not what the block's median step loses (4): the slow
    steps the slowdown made slow fall back among the fast ones."""
    steps, savings = [10.0, 11.0, 14.0, 15.0, 16.0], [1.0, 1.0, 5.0, 5.0, 5.0]
    assert np.median(savings) == 5.0
    assert on_median(steps, savings) == pytest.approx(14.0 - 10.0)
    # a predictor that refused a step (NaN) is scored on the steps it answered
    assert on_median(steps + [99.0], savings + [float("nan")]) == pytest.approx(4.0)
    assert np.isnan(on_median([1.0], [float("nan")]))
    # the same saving in every step: both agree
    assert on_median(steps, [2.0] * 5) == pytest.approx(2.0)


def test_scores_and_kendall_tau():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=40), rng.normal(size=40)
    b[:5] = a[:5]  # some ties would not matter; equal values across arrays are not ties
    assert kendall_tau(a, b) == pytest.approx(kendalltau(a, b).statistic)
    s = scores(np.array([10.0, 20.0, -5.0]), np.array([10.0, 25.0, 5.0]), lo=np.array([9.0, 10.0, -10.0]), hi=np.array([11.0, 22.0, 0.0]))
    assert s["mape"] == pytest.approx((0 + 0.2 + 2.0) / 3)
    assert s["sign"] == pytest.approx(2 / 3) and s["coverage"] == pytest.approx(1 / 3) and s["within_25pct"] == pytest.approx(2 / 3)


def test_corrections_round_trip_and_refuse_what_they_were_not_trained_on(tmp_path):
    from bottleneck_oracle.analysis.whatif import Edit, apply_edits
    from bottleneck_oracle.errors import OracleError
    from bottleneck_oracle.models.corrections import edit_features, load_corrections

    parts = [_launch(tmp_path / f"r{k}", pairs=30 + 10 * k, seed=k)[0] for k in range(2)]
    model = fit_corrections(merge(parts), members=3)
    model.halfwidth, model.trained_on = 0.2, "two synthetic launches"
    model.save(tmp_path / "c.npz")
    back = load_corrections(tmp_path / "c.npz")
    g, f, _ = parts[1].steps[0][0]
    assert back.trained_on == "two synthetic launches" and back.refusal(f) is None
    assert back.saving(g, f) == pytest.approx(model.saving(g, f))
    lo, hi = back.interval(100.0, f)
    assert hi - lo == pytest.approx(2 * 0.2 * f.removed_us)
    # an edit that lengthens work is outside what paired removals taught it
    assert "lengthens" in back.refusal(edit_features(apply_edits(g, [Edit(name="aten::mm", rank=0, delay_ms=1.0)])))
    # so is a node far outside the training range (a 1000x longer op)
    x = f.x.copy()
    x[:, 0] += 7.0
    f.x = x
    assert "out of domain: node term log_dur" in back.refusal(f)
    (tmp_path / "junk.npz").write_bytes(b"not an archive")
    with pytest.raises(OracleError, match="not a corrections file"):
        load_corrections(tmp_path / "junk.npz")

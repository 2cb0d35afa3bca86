"""Paired conditions (systems.paired): the block schedule, the measurement, the extra-compute
injection, and (slow) one real recorded launch."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
import yaml

from bottleneck_oracle_lab.systems.inject import Injection, Injector
from bottleneck_oracle_lab.systems.model import GPT, SIZES, synthetic_batch
from bottleneck_oracle_lab.systems.paired import (
    CONDITIONS,
    KNOB_CHANGES,
    WINDOW_STEPS,
    Condition,
    KnobChange,
    Launch,
    alone,
    default_knobs,
    default_launches,
    generate_knobs,
    measure,
    measure_knob,
    record_launch,
    requiet,
    spread,
)


def test_conditions_sit_in_every_step_of_their_block_between_clean_blocks():
    conds = (Condition(kind="stall", rank=1, delay_ms=20, target="layers.0.mlp"), Condition(kind="rank", rank=0, delay_ms=10))
    dp = Launch(launch_id="a", layout="dp2", size="tiny", conditions=conds, block=4, repeats=1)
    assert dp.steps == 20 and dp.block_steps(0) == [1, 2, 3, 4] and dp.block_steps(3) == [13, 14, 15, 16]
    inj = dp.injections()
    assert [i.step for i in inj if i.kind == "module"] == dp.block_steps(1) and {i.delay_ms for i in inj if i.kind == "module"} == {20}
    assert [i.step for i in inj if i.kind == "rank"] == dp.block_steps(3) and {i.rank for i in inj if i.kind == "rank"} == {0}
    # a pipeline runs a module once per micro-batch: the step carries the whole delay
    pp = Launch(launch_id="b", layout="pp2-1f1b", size="tiny", conditions=conds, block=4, microbatches=4)
    # interleaved: clean, slowed, clean, slowed, ... per condition, the clean blocks in two alternating groups
    fine = Launch(launch_id="c", layout="dp2", size="tiny", conditions=conds, block=3, repeats=3)
    assert fine.steps == 3 * (2 * 2 * 3 + 1) and fine.slowed_blocks(0) == [1, 3, 5] and fine.slowed_blocks(1) == [7, 9, 11]
    assert fine.clean_blocks(1) == ([6, 10], [8, 12])
    assert sorted(i.step for i in fine.injections() if i.kind == "rank") == [s for b in (7, 9, 11) for s in fine.block_steps(b)]
    assert {i.delay_ms for i in pp.injections() if i.kind == "module"} == {5.0}
    with pytest.raises(ValueError, match="target module"):
        Condition(kind="compute", rank=0, delay_ms=5)


def test_the_default_grid_covers_every_kind_rank_and_delay():
    launches = default_launches(["tiny"], ["dp2", "pp2-1f1b"], [5.0, 20.0], per_launch=8)
    conds = [(launch.layout, c) for launch in launches for c in launch.conditions]
    assert sum(layout == "dp2" for layout, _ in conds) == 2 * 2 * 4 and sum(layout == "pp2-1f1b" for layout, _ in conds) == 2 * 2 * 3
    assert all(len(launch.conditions) <= 8 for launch in launches)
    # a pipeline stage's module: the first layer it holds
    assert {c.target for layout, c in conds if layout == "pp2-1f1b" and c.kind == "stall" and c.rank == 1} == {"layers.1.mlp"}


def test_a_gpu_launch_is_data_parallel_and_says_so_in_its_rows():
    conds = (Condition(kind="rank", rank=0, delay_ms=10),)
    gpu = Launch(launch_id="g", layout="dp2", size="tiny", conditions=conds, device="cuda")
    assert measure(gpu, {s: 1000.0 for s in range(1, gpu.steps + 1)})[0]["device"] == "cuda"
    assert {la.device for la in default_launches(["tiny"], ["dp2"], [5.0], device="cuda")} == {"cuda"}
    with pytest.raises(ValueError, match="pipeline runs on CPU only"):
        Launch(launch_id="p", layout="pp2-1f1b", size="tiny", conditions=conds, device="cuda")
    with pytest.raises(ValueError, match="device must be cpu or cuda"):
        Launch(launch_id="x", layout="dp2", size="tiny", conditions=conds, device="tpu")
    from bottleneck_oracle_lab.systems.ddp import DDPRun

    with pytest.raises(ValueError, match="nccl backend needs device cuda"):
        DDPRun(out="x", backend="nccl")
    with pytest.raises(ValueError, match="device must be cpu or cuda"):
        DDPRun(out="x", device="gpu")


def test_a_long_launch_is_written_in_windows_of_whole_blocks():
    """The default grid (291 steps a launch) is one window; 33 slowed blocks per condition (1,587
    steps) are written in windows of whole blocks, so each window's export falls on a block's
    first step, which ``measure`` drops."""
    assert all(x.window is None for x in default_launches(["tiny", "small"], ["dp2", "pp2-1f1b"], [5.0]))
    long = default_launches(["small"], ["dp2"], [10.0], repeats=33)[0]
    assert long.steps == 1587 and long.window == WINDOW_STEPS
    assert long.window % long.block == 0
    odd = Launch(launch_id="o", layout="dp2", size="tiny", conditions=long.conditions, block=7, repeats=33)
    assert odd.window is not None and odd.window % 7 == 0 and odd.window >= WINDOW_STEPS > odd.window - 7
    # the step after each window's end opens a block
    assert all(
        1 + k * odd.window in [b[0] for b in (odd.block_steps(i) for i in range(odd.steps // 7))] for k in range(1, odd.steps // odd.window)
    )


def test_measure_takes_block_medians_without_the_transition_steps():
    launch = Launch(launch_id="m", layout="dp2", size="tiny", conditions=(Condition(kind="rank", rank=0, delay_ms=10),), block=4, repeats=1)
    times = {s: 100.0 for s in range(1, 13)}
    times.update({1: 999.0, 5: 999.0, 9: 999.0})  # each block's first step is dropped
    times.update({6: 130.0, 7: 131.0, 8: 129.0, 10: 104.0, 11: 104.0, 12: 104.0})
    (row,) = measure(launch, times)
    assert row["perturbed_us"] == 130.0 and row["measured_saving_us"] == pytest.approx(130.0 - 102.0)
    assert row["clean_vs_clean"] == pytest.approx(0.04) and row["steps"] == [6, 7, 8] and row["clean_steps"] == [2, 3, 4, 10, 11, 12]
    assert spread([1.0, 1.0, 1.0]) == 0.0 and spread([1.0, 2.0, 3.0]) == pytest.approx(1.4826 / 2)


def test_a_level_shift_both_clean_groups_share_moves_the_pooled_saving_not_the_local_one():
    """The machine gets 60 us slower from block 3 on, in the middle of a 10 us condition: the two
    clean groups shift alike (clean vs clean 0), the pooled medians land on either side of the
    shift (a saving of 40), and each slowed block against its neighbours says 10 but for the one
    that straddles the shift."""
    launch = Launch(launch_id="m", layout="dp2", size="tiny", conditions=(Condition(kind="rank", rank=0, delay_ms=10),), block=2, repeats=3)
    times = {s: 100.0 + 10.0 * (b % 2) + 60.0 * (b >= 3) for b in range(7) for s in launch.block_steps(b)}
    (row,) = measure(launch, times)
    assert row["clean_vs_clean"] == 0.0 and row["measured_saving_us"] == pytest.approx(40.0)
    assert row["local_saving_us"] == pytest.approx(10.0)


def test_knob_changes_alternate_with_their_base_and_keep_the_global_batch():
    mb = KnobChange(launch_id="k", layout="pp2-1f1b", size="tiny", knob="microbatches", base=4, changed=8, pairs=2)
    assert [n for n, _ in mb.order()] == ["base-0", "changed-0", "base-1", "changed-1"]
    # 4 micro-batches of 2 sequences -> 8 of 1: the same 8 sequences per step
    same = {"seq": None, "accum": 1, "checkpoint": False}
    assert mb.settings(4) == {"batch": 2, "microbatches": 4, "bucket_mb": 25.0, **same} and mb.settings(8)["batch"] * 8 == 8
    bucket = KnobChange(launch_id="b", layout="dp2", size="tiny", knob="bucket_mb", base=25, changed=0.05)
    assert bucket.settings(0.05) == {"batch": 4, "microbatches": 4, "bucket_mb": 0.05, **same}
    ckpt = KnobChange(launch_id="c", layout="pp2-1f1b", size="tiny", knob="checkpoint", base=0, changed=1)
    assert ckpt.settings(1)["checkpoint"] is True and ckpt.settings(0)["checkpoint"] is False
    assert KnobChange(launch_id="s", layout="dp2", size="tiny", knob="seq", base=64, changed=32).settings(32)["seq"] == 32
    with pytest.raises(ValueError, match="DP knob"):
        KnobChange(launch_id="x", layout="pp2-1f1b", size="tiny", knob="accum", base=1, changed=2)
    with pytest.raises(ValueError, match="0 \\(off\\) to 1"):
        KnobChange(launch_id="x", layout="dp2", size="tiny", knob="checkpoint", base=1, changed=2)
    with pytest.raises(ValueError, match="pipeline knob"):
        KnobChange(launch_id="x", layout="dp2", size="tiny", knob="microbatches", base=4, changed=2)
    with pytest.raises(ValueError, match="DP knob"):
        KnobChange(launch_id="x", layout="pp2-1f1b", size="tiny", knob="bucket_mb", base=25, changed=1)
    knobs = default_knobs(["tiny", "small"], ["dp2", "pp2-1f1b"])
    assert len(knobs) == 40 and {k.knob for k in knobs} == {"batch", "bucket_mb", "microbatches", "seq", "accum", "checkpoint"}
    assert len({k.launch_id for k in knobs}) == 40


def test_measure_knob_takes_medians_without_each_launch_warm_up():
    change = KnobChange(launch_id="k", layout="dp2", size="tiny", knob="batch", base=4, changed=8, pairs=2)
    times = {
        "base-0": {1: 999.0, 2: 100.0, 3: 100.0},
        "base-1": {1: 999.0, 2: 104.0, 3: 104.0},
        "changed-0": {1: 5.0, 2: 150.0, 3: 150.0},
        "changed-1": {1: 5.0, 2: 152.0, 3: 152.0},
    }
    row = measure_knob(change, times)
    assert row["base_us"] == pytest.approx(102.0) and row["changed_us"] == pytest.approx(151.0)
    assert row["measured_change_us"] == pytest.approx(49.0) and row["clean_vs_clean"] == pytest.approx(0.04)


@pytest.mark.slow
def test_a_recorded_knob_change_runs_each_setting(tmp_path):
    """One pair of launches of the tiny DDP job, 1 bucket against 0.05 MB buckets: each launch
    ran its own setting (run.yaml), more all-reduces with small buckets, and the row is written."""
    change = KnobChange(launch_id="bucket", layout="dp2", size="tiny", knob="bucket_mb", base=25, changed=0.05, pairs=1, steps=3)
    summary = generate_knobs([change], tmp_path, bound=1.0, retries=0)
    assert summary["knob_changes"] == 1 and (tmp_path / KNOB_CHANGES).exists()
    (row,) = [json.loads(x) for x in (tmp_path / KNOB_CHANGES).read_text().splitlines()]
    assert row["base_us"] > 0 and row["changed_us"] > 0 and row["base_paths"] == ["base-0"]
    counts = {}
    for name, value in change.order():
        folder = tmp_path / "bucket" / name
        assert yaml.safe_load((folder / "run.yaml").read_text())["bucket_mb"] == value
        events = json.loads(gzip.open(folder / "rank-0.json.gz").read())["traceEvents"]
        counts[name] = sum("all_reduce" in str(e.get("name", "")) for e in events)
    assert counts["changed-0"] > counts["base-0"], counts
    # a second call finds it recorded
    assert generate_knobs([change], tmp_path, bound=1.0, retries=0)["skipped"] == 1


def test_extra_compute_is_real_small_ops_inside_its_range(tmp_path):
    cfg = SIZES["tiny"]
    model = GPT(cfg)
    injector = Injector([Injection(kind="compute", target="layers.0.mlp", rank=0, step=1, delay_ms=10)], rank=0, out_dir=tmp_path)
    injector.attach(model)
    injector.at_step(1)
    tokens, targets = synthetic_batch(cfg, 2, torch.Generator().manual_seed(0))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(tokens, targets)
    (rec,) = injector.records
    assert rec["kind"] == "compute" and rec["pairs"] > 10
    events = prof.events()
    (rng,) = [e for e in events if e.name == "oracle_inject:compute:layers.0.mlp"]
    inside = [e for e in events if e.time_range.start >= rng.time_range.start and e.time_range.end <= rng.time_range.end]
    assert sum(e.name == "aten::tanh" for e in inside) == rec["pairs"]
    assert sum(e.name in ("aten::mm", "aten::matmul") for e in inside) >= rec["pairs"]
    assert rec["slept_ms"] >= 3  # the pairs were timed without the profiler: at least a third of the target under it


@pytest.mark.slow
def test_a_recorded_launch_measures_its_stall(tmp_path):
    """A 30 ms stall and 30 ms of extra compute on one rank of a 2-rank DDP job, each in three
    blocks of 3 steps interleaved with clean ones: the measured saving is the delay, within a noise-aware margin."""
    conds = (
        Condition(kind="stall", rank=1, delay_ms=30, target="layers.0.mlp"),
        Condition(kind="compute", rank=0, delay_ms=30, target="layers.0.mlp"),
    )
    launch = Launch(launch_id="one", layout="dp2", size="tiny", conditions=conds, block=3, repeats=3)
    rows = record_launch(launch, tmp_path, bound=0.05, retries=1)
    assert [json.loads(x)["index"] for x in (tmp_path / "one" / CONDITIONS).read_text().splitlines()] == [0, 1]
    for r in rows:
        noise = 3 * max(r["clean_spread"], r["clean_vs_clean"]) * r["clean_before_us"]
        assert abs(r["measured_saving_us"] - 30_000) <= max(0.3 * 30_000, noise), r


def _rows(launch: Launch, noise: list[float]) -> list[dict]:
    return [
        {
            "launch_id": launch.launch_id,
            "index": k,
            "condition": {"kind": c.kind},
            "clean_vs_clean": x,
            "measured_saving_us": 1000.0 * (k + 1),
        }
        for k, (c, x) in enumerate(zip(launch.conditions, noise, strict=True))
    ]


def test_a_condition_whose_clean_blocks_drift_is_recorded_again_alone(tmp_path):
    """Only the conditions above the bound are recorded again, each in a launch of its own with
    every other setting the same; their rows take the originals' places and say what they replace;
    a folder that already holds the lone recording is not recorded again (a resumed run)."""
    conds = tuple(Condition(kind="rank", rank=r, delay_ms=d) for r, d in ((0, 5.0), (1, 5.0), (0, 10.0)))
    launch = Launch(launch_id="tiny-dp2-0", layout="dp2", size="tiny", conditions=conds, block=3, repeats=31, seed=7)
    calls = []

    lone = {"tiny-dp2-0.c1": 0.01, "tiny-dp2-0.c2": 0.04}  # the clean-vs-clean of each lone recording

    def record(solo, out, bound, retries, extra):
        calls.append((solo, retries))
        (row,) = _rows(solo, [lone[solo.launch_id]])
        row.update(path=str(out / solo.launch_id), attempts=1, tried_clean_vs_clean=[lone[solo.launch_id]], **extra)
        (out / solo.launch_id).mkdir(exist_ok=True)
        (out / solo.launch_id / CONDITIONS).write_text(json.dumps(row) + "\n")
        return [row]

    rows = requiet(launch, _rows(launch, [0.01, 0.08, 0.2]), tmp_path, 0.05, 2, record=record)
    assert [s.launch_id for s, _ in calls] == ["tiny-dp2-0.c1", "tiny-dp2-0.c2"]
    assert [s.conditions for s, _ in calls] == [(conds[1],), (conds[2],)]
    assert all((s.block, s.repeats, s.seed, s.layout, s.size) == (3, 31, 7, "dp2", "tiny") for s, _ in calls)
    assert [r for _, r in calls] == [1, 1]  # the lone launch gets the retries left
    assert [r["launch_id"] for r in rows] == ["tiny-dp2-0", "tiny-dp2-0.c1", "tiny-dp2-0.c2"]
    assert rows[1]["replaces"] == {"launch_id": "tiny-dp2-0", "index": 1, "clean_vs_clean": 0.08, "measured_saving_us": 2000.0}
    assert rows[2]["attempts"] == 1 and rows[2]["earlier_attempts"] == 0
    assert alone(launch, 2).steps == 3 * (2 * 31 + 1)
    calls.clear()
    again = requiet(launch, _rows(launch, [0.01, 0.08, 0.2]), tmp_path, 0.05, 2, record=record)
    assert calls == [] and again == rows
    assert requiet(launch, _rows(launch, [0.01, 0.08, 0.2]), tmp_path / "none", 0.05, 0, record=record) == _rows(launch, [0.01, 0.08, 0.2])
    # a tighter bound: the lone recording above it is recorded again while it has recordings left
    assert requiet(launch, _rows(launch, [0.01, 0.08, 0.2]), tmp_path, 0.03, 1, record=record) == rows and calls == []
    tight = requiet(launch, _rows(launch, [0.01, 0.08, 0.2]), tmp_path, 0.03, 3, record=record)
    assert [(s.launch_id, r) for s, r in calls] == [("tiny-dp2-0.c2", 1)]
    assert tight[2]["attempts"] == 2 and tight[2]["earlier_attempts"] == 1 and tight[2]["tried_clean_vs_clean"] == [0.04, 0.04]
    assert json.loads((tmp_path / "tiny-dp2-0.c2" / CONDITIONS).read_text())["attempts"] == 2


@pytest.mark.slow
def test_a_drifting_condition_is_really_recorded_again(tmp_path):
    """With a bound of 0 every condition is above it: the one condition of a real 2-rank launch is
    recorded again alone, and paired.jsonl holds that recording, its trace beside it."""
    from bottleneck_oracle_lab.systems.paired import PAIRED, generate_paired

    launch = Launch(launch_id="l", layout="dp2", size="tiny", conditions=(Condition(kind="rank", rank=1, delay_ms=20),), block=2, repeats=2)
    summary = generate_paired([launch], tmp_path, bound=0.0, retries=1)
    (row,) = [json.loads(x) for x in (tmp_path / PAIRED).read_text().splitlines()]
    assert row["launch_id"] == "l.c0" and row["replaces"]["launch_id"] == "l" and row["path"] == str(tmp_path / "l.c0")
    assert list((tmp_path / "l.c0").glob("*.json*")) != []
    assert summary["rerecorded_conditions"] == 1 and summary["noisy_conditions"] == (row["clean_vs_clean"] > 0)
    assert len((tmp_path / "l" / CONDITIONS).read_text().splitlines()) == 1  # the launch keeps its first recording
    assert len(row["tried_clean_vs_clean"]) == row["attempts"] and row["tried_clean_vs_clean"][-1] == row["clean_vs_clean"]


def test_checkpointing_recomputes_each_block_forward_in_the_backward_and_seq_resizes():
    """The knobs the recorder turns: with ``checkpointed`` every block's attention runs again in
    the backward pass (counted in the profiler's events); ``sized`` changes the sequence length."""
    from torch.profiler import ProfilerActivity, profile

    from bottleneck_oracle_lab.systems.model import sized

    cfg = sized("tiny", seq=32)
    assert cfg.seq == 32 and cfg.width == SIZES["tiny"].width
    counts = {}
    for on in (False, True):
        torch.manual_seed(0)
        model = GPT(cfg)
        model.checkpointed = on
        tokens, targets = synthetic_batch(cfg, 2, torch.Generator().manual_seed(0))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(tokens, targets).backward()
        counts[on] = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product") and "backward" not in e.key)
    assert counts == {False: cfg.layers, True: 2 * cfg.layers}


def test_accumulation_runs_the_passes_with_gradients_synced_in_the_last():
    from contextlib import contextmanager

    from bottleneck_oracle_lab.systems.launch import train_step

    calls, synced = [], []

    @contextmanager
    def no_sync():
        synced.append(False)
        yield

    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.0)

    def loss_of():
        calls.append(1)
        return (w * 2).sum()

    injector = Injector([], 0, "unused")
    train_step(injector, loss_of, opt, accum=3, no_sync=no_sync)
    assert len(calls) == 3 and synced == [False, False]  # the last pass outside no_sync: its backward all-reduces

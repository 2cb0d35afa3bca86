"""Configuration what-if (``whatif --set``): each knob's edit of the graph, checked against a
trace built event by event whose answer is known from the construction, and the syntax."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from bottleneck_oracle import api
from bottleneck_oracle.analysis.knobs import FIXED_FACTOR, GLOO_LATENCY_US, Knob, fixed_costs
from bottleneck_oracle.errors import OracleError

GAP = 2.0  # untraced time before every op but a step's first
FORWARD = [("aten::view", 1.0), ("aten::mm", 101.0), ("aten::view", 1.0)]
BACKWARD = [("aten::mm", 201.0), ("aten::view", 1.0)]
OPTIMIZER = [("aten::add_", 50.0)]


def _x(name: str, cat: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": {}}


def _trace(path, steps: int = 3) -> None:
    """One CPU rank, one thread: per step a forward, backward and optimizer range of leaf ops,
    ``GAP`` µs of untraced time before each op but the first."""
    events, t = [], 0.0
    for s in range(steps):
        start = t
        for phase, ops in (("forward", FORWARD), ("backward", BACKWARD), ("optimizer", OPTIMIZER)):
            p0 = t
            for i, (name, dur) in enumerate(ops):
                if i or phase != "forward":
                    t += GAP
                events.append(_x(name, "cpu_op", t, dur))
                t += dur
            events.append(_x(phase, "user_annotation", p0, t - p0))
        events.append(_x(f"ProfilerStep#{s}", "user_annotation", start, t - start))
        t += 50.0
    path.write_text(json.dumps({"traceEvents": events}))


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    p = tmp_path_factory.mktemp("knobs") / "rank-0.json"
    _trace(p)
    return p


def _deltas(trace, knob: str) -> list[float]:
    return [r.replay.delta_us for r in api.whatif(trace, [], knobs=[knob])]


def test_batch_and_seq_scale_the_work_of_the_passes_above_the_fixed_part(trace):
    # fixed part: FIXED_FACTOR x the median view (1 µs); each mm's work above it doubles; views
    # (shorter than the fixed part), gaps and the optimizer stay
    fixed = FIXED_FACTOR * 1.0
    assert fixed < 101.0
    work = sum(d - fixed for n, d in FORWARD + BACKWARD if n == "aten::mm")
    assert _deltas(trace, "batch=4:8") == pytest.approx([work] * 3, abs=0.01)
    assert _deltas(trace, "seq=x0.5") == pytest.approx([-work / 2] * 3, abs=0.01)


def test_accumulation_repeats_the_passes_with_their_untraced_time(trace):
    passes = sum(d for _, d in FORWARD + BACKWARD) + GAP * (len(FORWARD) - 1 + len(BACKWARD))
    assert _deltas(trace, "accum=3") == pytest.approx([2 * passes] * 3, abs=0.01)


def test_checkpointing_re_runs_the_forward_in_the_backward(trace):
    forward = sum(d for _, d in FORWARD) + GAP * (len(FORWARD) - 1)
    assert _deltas(trace, "checkpoint=on") == pytest.approx([forward] * 3, abs=0.01)


def test_a_knob_the_step_cannot_take_is_an_error_naming_it(trace):
    with pytest.raises(OracleError, match="no gradient all-reduce"):
        api.whatif(trace, [], knobs=["bucket_mb=25:1"])
    with pytest.raises(OracleError, match="not a pipeline-parallel step"):
        api.whatif(trace, [], knobs=["microbatches=8"])


@pytest.mark.parametrize(
    "text, name, old, new",
    [
        ("batch=4:8", "batch", 4, 8),
        ("batch=x2", "batch", 1, 2),
        ("seq=512:1024", "seq", 512, 1024),
        ("accum=4", "accum", None, 4),
        ("microbatches=4:8", "microbatches", 4, 8),
        ("checkpoint=on", "checkpoint", 0, 1),
        ("checkpoint=off", "checkpoint", 1, 0),
        ("bucket_mb=25:0.5", "bucket_mb", 25, 0.5),
    ],
)
def test_knob_syntax(text, name, old, new):
    k = Knob.parse(text)
    assert (k.name, k.old, k.new) == (name, old, new)


@pytest.mark.parametrize(
    "text, message",
    [
        ("speed=2", "unknown knob 'speed'"),
        ("batch=8", "give batch as old:new"),
        ("batch", "not knob=value"),
        ("batch=4:-8", "numbers > 0"),
        ("accum=2.5", "whole number"),
        ("checkpoint=maybe", "checkpoint"),
        ("seq=1:1e9", "at most 100000x"),
        ("batch=four:8", "--set 'batch=four:8'"),
    ],
)
def test_a_bad_knob_is_one_clear_error(text, message):
    with pytest.raises(OracleError, match=message):
        Knob.parse(text)


DDP = Path(__file__).parent.parent / "data" / "gloo_ddp_2rank"


def _raw_allreduces(folder) -> list[tuple[float, float]]:
    """(duration µs, bytes) of rank 0's gradient all-reduces inside ProfilerStep#1, read from the raw JSON."""
    path = sorted(folder.glob("rank-0.json*"))[0]
    data = json.loads((gzip.open(path) if path.suffix == ".gz" else open(path)).read())
    ev = data["traceEvents"]
    step = next(e for e in ev if e.get("name") == "ProfilerStep#1")
    lo, hi = step["ts"], step["ts"] + step["dur"]
    out = []
    for e in ev:
        if e.get("name") == "gloo:all_reduce" and e.get("ph") == "X" and lo <= e["ts"] < hi:
            dims = e["args"]["Input Dims"]  # gloo ops give their tensors' shapes, float32 here
            out.append((float(e["dur"]), 4.0 * sum(math.prod(d) for d in dims if d)))
    return out


def test_bucket_changes_add_or_remove_one_latency_per_bucket():
    ar = _raw_allreduces(DDP)
    mib = sum(b for _, b in ar) / 2**20
    assert len(ar) == 3 and 1.9 < mib < 2.1
    steps = api.whatif(DDP, [], knobs=[f"bucket_mb=0.5:{mib / 2.5:.3f}"], steps=[1])  # ceil(2.5) = 3 buckets, as now: nothing moves
    assert steps[0].replay.delta_us == 0.0
    (one,) = api.whatif(DDP, [], knobs=["bucket_mb=0.5:100"], steps=[1])  # all in one bucket: two latencies fewer per rank
    # at most two of the gloo latency prior, and two issuing calls' fixed parts on each rank (the
    # fixed part is the step's own, fixed_costs; the replay's path runs through all three of a
    # rank's buckets, the loop's thread waiting for each)
    g = api.graphs(api.load(DDP), [1])[0]
    fixed = fixed_costs(g)[0]
    assert -2 * GLOO_LATENCY_US - 2 * fixed * len(g.ranks) <= one.replay.delta_us < -2 * GLOO_LATENCY_US / 3


GPU = Path(__file__).parent.parent / "data" / "public-gpu" / "train_1rank_5steps.json.gz"


def test_a_batch_change_on_a_gpu_bound_step_scales_its_kernels():
    """Kernels run outside the CPU's phase ranges: they take the phase of the call that launched
    them, so doubling the batch of this GPU-bound step (the device ~99% busy) adds about its
    kernel time, read from the raw events; no CPU-calibrated interval is shown on a GPU step."""
    ev = json.loads(gzip.open(GPU).read())["traceEvents"]
    step = next(e for e in ev if e.get("name") == "ProfilerStep#103")
    lo, hi = step["ts"], step["ts"] + step["dur"]
    kernels = sum(e["dur"] for e in ev if e.get("cat") == "kernel" and e.get("ph") == "X" and lo <= e["ts"] < hi)
    assert kernels > 0.9 * step["dur"]
    (r,) = api.whatif(GPU, [], knobs=["batch=x2"], steps=[103])
    assert 0.8 * kernels <= r.replay.delta_us <= 1.2 * kernels, (r.replay.delta_us, kernels)
    assert r.knobs_interval_us is None


def test_a_step_without_edges_takes_a_knob():
    """cpu_only_rank34 keeps 15 of its rank's 7,479 events (sampled): its step's graph has ops and
    no edges at all. Its ops are gloo all-reduces (read from the raw events): a batch change moves
    none of them."""
    path = Path(__file__).parent.parent / "data" / "public-gpu" / "cpu_only_rank34.json.gz"
    ev = json.loads(gzip.open(path).read())["traceEvents"]
    step = next(e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    lo, hi = step["ts"], step["ts"] + step["dur"]
    inside = {e["name"] for e in ev if e.get("ph") == "X" and e.get("cat") == "cpu_op" and lo <= e["ts"] < hi}
    assert inside <= {"gloo:all_reduce", "aten::empty"}, inside
    (r,) = api.whatif(path, [], knobs=["batch=x2"])
    assert r.replay.delta_us == 0.0


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_the_pipeline_replay_gives_the_textbook_makespans(m):
    """``pipeline_makespan`` against the closed forms a pipeline schedule is known by: equal
    stages, 1F1B or all-forward-all-backward, ``(m + p - 1)(f + b)``; one micro-batch, the sum of
    the stages' times; 1F1B with the last stage the slowest, one micro-batch through the stages
    before it plus ``m`` on it (``sum_{s<p-1} t_s + m t_{p-1}``, the others keep ahead of it); and
    with two stages, the second's forward and backward no longer than the first's forward, ``m``
    micro-batches on the first alone from two on (the second is done with each before the first
    needs it). A formula of the slowest stage alone,
    ``(m + p - 1) max t``, misses the unequal ones by up to half the step."""
    from bottleneck_oracle.analysis.knobs import pipeline_makespan

    for p in (2, 4):
        for schedule in ("1f1b", "afab"):
            assert pipeline_makespan([1.0] * p, [2.0] * p, m, schedule) == pytest.approx((m + p - 1) * 3.0)
    fwd, bwd = [1.0, 2.0, 0.5, 3.0], [2.0, 4.0, 1.0, 6.0]
    t = [f + b for f, b in zip(fwd, bwd, strict=True)]
    assert pipeline_makespan(fwd, bwd, 1) == pytest.approx(sum(t))
    assert pipeline_makespan([1.0, 1.0, 1.0, 2.0], [2.0, 2.0, 2.0, 4.0], m) == pytest.approx(9.0 + m * 6.0)
    assert pipeline_makespan([3.0, 1.0], [6.0, 2.0], m) == pytest.approx(m * 9.0 if m >= 2 else 12.0)
    assert pipeline_makespan([1.0, 3.0], [2.0, 6.0], m) == pytest.approx(3.0 + m * 9.0)


@pytest.mark.parametrize(("world", "dp", "schedule", "size"), [(3, 1, "1f1b", "small"), (2, 2, "afab", "tiny")])
def test_the_resplit_reads_the_schedule_and_the_stages_a_pipeline_ran(tmp_path, world, dp, schedule, size):
    """A recorded pipeline (gloo send/recv; the lab's rank r * world + s is replica r's stage s)
    re-split by ``--set microbatches``: the schedule is the one it ran, the stages are in the
    order they ran (a later stage posts its receive before the first stage starts: that is not
    its forward), and each data-parallel replica is a pipeline of its own. The calls that send
    and receive a micro-batch repeat per micro-batch: a microsecond more on each of them is a
    microsecond more of each stage's fixed part per call (the calls counted in the raw trace)."""
    pytest.importorskip("bottleneck_oracle_lab", reason="recording is the lab's (pip install -e lab/)")
    from bottleneck_oracle.analysis import knobs as knob_model
    from bottleneck_oracle_lab.systems.pipeline import PipelineRun, record

    run = PipelineRun(out=str(tmp_path), world=world, dp=dp, size=size, schedule=schedule, microbatches=2, steps=2)
    seen = []
    real = knob_model.microbatch_parts

    grown = []

    def keep(g, p, dur):
        seen.append(real(g, p, dur))
        calls = np.array([s in ("c10d::send", "c10d::recv_") for s in g.names], dtype=bool)[g.nodes["name"]]
        grown.append(real(g, p, dur + np.where(calls, 1.0, 0.0)))
        return seen[-1]

    try:
        knob_model.microbatch_parts = keep
        rows = api.whatif(record(run), [], knobs=["microbatches=4"])
    finally:
        knob_model.microbatch_parts = real
    assert rows and len(seen) == len(rows)
    replicas = tuple(tuple(r * world + s for s in range(world)) for r in range(dp))
    for parts, row in zip(seen, rows, strict=True):
        assert parts.schedule == schedule and parts.stages == world
        assert tuple(sorted(parts.pipelines)) == replicas
        assert row.microbatches is not None and row.microbatches.schedule == schedule
    # per rank and step: its send and receive calls inside the micro-batch ranges of the raw trace
    per_rank = {}
    for rank in range(world * dp):
        raw = json.loads(gzip.decompress((tmp_path / f"rank-{rank}.json.gz").read_bytes()))["traceEvents"]
        ranges = [
            e for e in raw if e.get("ph") == "X" and e.get("name", "").split(".mb")[0] in ("forward", "backward") and ".mb" in e["name"]
        ]
        steps = {
            int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"])
            for e in raw
            if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")
        }
        inside = [
            e for e in raw
            if e.get("ph") == "X" and e.get("name") in ("c10d::send", "c10d::recv_")
            and any(r["ts"] <= e["ts"] < r["ts"] + r["dur"] and r["tid"] == e["tid"] for r in ranges)
        ]  # fmt: skip
        per_rank[rank] = {n: sum(a <= e["ts"] < b for e in inside) for n, (a, b) in steps.items()}
    for row, parts, more in zip(rows, seen, grown, strict=True):
        step = row.step
        for rank, counts in per_rank.items():
            added = (more.fixed_fwd[rank] + more.fixed_bwd[rank] - parts.fixed_fwd[rank] - parts.fixed_bwd[rank]) * parts.microbatches
            assert added == pytest.approx(counts[step]), (rank, step)


def test_a_bigger_batch_leaves_the_optimizers_update_as_it_is():
    """Our AdamW loop (tests/data/own-cpu) has no forward/backward ranges of ours, only PyTorch's
    ``Optimizer.step#AdamW.step`` around the update (raw JSON). ``batch=x2`` scales the passes'
    work; the optimizer's update does not grow with the batch, and it was scaled with them (no
    range of ours: everything was the passes'); now PyTorch's range is the optimizer phase."""
    from bottleneck_oracle.analysis.knobs import knob_times, pieces
    from bottleneck_oracle.analysis.phases import node_phases

    path = Path(__file__).parents[1] / "data" / "own-cpu" / "adamw_for_loop.json.gz"
    with gzip.open(path, "rt") as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    table = api.load(path)
    a = api.step_analysis(table, 3)
    g = a.graph
    step = next(e for e in ev if e["name"] == "ProfilerStep#3")
    (opt,) = [e for e in ev if e["name"] == "Optimizer.step#AdamW.step" and step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
    lo = opt["ts"] - table.t0 - (g.window_start - table.t0)  # (the window's clock)
    inside = (g.nodes["start"] >= lo) & (g.nodes["start"] < lo + opt["dur"]) & ~g.nodes["on_gpu"]
    assert inside.sum() >= 48 * 5  # lerp_, addcmul_, sqrt, addcdiv_, mul_ per parameter
    phase, mb = node_phases(table, g)
    times = knob_times(g, pieces(g, phase, mb), Knob("batch", 2.0, 1.0, relative=True))
    assert np.allclose(times.dur[inside], g.nodes["mdur"][inside])

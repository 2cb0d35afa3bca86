"""Every wait explained: invariants over every fixture, and facts read from the raw events of
real GPU traces (tests/data/real-gpu/README.md) that the critical path must reproduce."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from bottleneck_oracle.analysis.segments import BREAKDOWN_KEYS, SEGMENT_KINDS
from bottleneck_oracle.api import analyze, load
from bottleneck_oracle.graph_pipeline.builder import BuildOptions, build_graph
from bottleneck_oracle.graph_pipeline.schema import EdgeKind
from conftest import ALL_FIXTURES, PUBLIC, REAL, SAMPLE, cached_analyses, cached_load

CLOCK_TOL = BuildOptions().clock_tolerance_us
# The share of a step's critical path that may be untraced, per fixture (stated, not fitted:
# above it the graph missed a dependency). Where a trace really shows nothing, the bound says why.
UNTRACED_BOUND = {
    "cpu_only_rank34.json.gz": 1.0,  # the main thread runs no op in its step: only gloo threads are traced
    "cuda_event_sync_multistream_1gpu.json.gz": 0.95,  # one 18.6 ms stretch with no op open between two syncs
    "sampled_128rank": 0.45,  # events were sampled out of this trace: what is left has holes
    "gloo_ddp_2rank": 0.8,  # rank 1 sleeps 20 ms (untraced Python) in every forward: the straggler
    # the host blocks 493 ms in a copy whose stream waits on an event the trace does not hold (its README)
    "sglang_qwen3_8b_prefilldecode_mi300.json.gz": 0.55,
    # the trace opens on 101 ms of device work whose host calls are not in it
    "mtia_inference_rank0.json.gz": 0.35,
    # read whole: seven 2.2 ms scheduler waits (untraced Python) between its eight iterations (its README)
    "inference_loop_nosteps.json.gz": 0.6,
    # step 5: 7.3 ms on rank 0's main thread inside FSDP::pre_forward (1) with no event at all (its raw trace)
    "fsdp_gloo": 0.3,
    # step 5: 1.56 ms on rank 0's main thread with no event, while both of its gloo threads run an all-reduce
    # that closes after the thread went on (its raw trace): two processes' four busy threads on two cores
    "alternating_steps_gloo": 0.15,
    # step 3: rank 1's DistributedDataParallel.forward runs no op for 2.9 ms after its extra matmuls (its raw trace)
    "slowing_rank_gloo": 0.35,
    # step 2: 4.2 ms on rank 0's main thread with no op open before its optimizer step (its raw trace;
    # two ranks and four gloo threads on two cores)
    "two_profilers_gloo": 0.3,
    # steps 5, 9, 13: a checkpoint written with no op, 40-73 ms past the step's last op (its raw trace)
    "checkpoint_every4.json.gz": 0.995,
    # the loop waits ~4 ms a step for a pool thread the profiler did not record (its README)
    "thread_pool.json.gz": 0.7,
    # step 3: 8.3 ms on rank 0's loop thread inside its forward with no event (its raw trace; two
    # ranks and four gloo threads on two cores), step 9: 4.6 ms between two queued all-reduces on
    # one of rank 1's gloo threads
    "async_allreduce_gloo": 0.25,
    # four ranks on two cores, recorded beside other work: step 5, rank 2's main thread resumed
    # 7.5 ms after its reduce-scatter's gloo op ended (raw: 80.1-88.8 ms, next op at 96.4 ms), too
    # late to be read as its wait; steps 2 and 4: 8-12 ms of rank 3's main thread in FSDP's ranges with no op open
    "fsdp_tp_gloo": 0.4,
    # four ranks on two cores, recorded beside other work: 6-12 ms stretches with no op open
    # between a stage's backward and FSDP's callback (rank 0, step 6: 76.8-88.4 ms of its raw step)
    "pipeline_dp_gloo": 0.2,
    # step 4: 4.2 ms of rank 1's main thread inside DistributedDataParallel.forward with no event
    # at all, between aten::linear and aten::square (raw: 5.28-9.52 ms into the step; two ranks
    # and their gloo threads on two cores)
    "grad_accum_gloo": 0.4,
    # steps 7 and 9: 2.3 and 3.3 ms of rank 1's main thread with no event open at all (raw: 8.92-11.22 ms
    # and 2.72-6.01 ms into the step; two ranks and their gloo threads on two cores)
    "uneven_batch_gloo": 0.35,
}
DEFAULT_UNTRACED_BOUND = 0.10


def _ids(p):
    return p.name


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=_ids)
def test_breakdown_is_never_negative_and_adds_up_to_the_makespan(path):
    for a in cached_analyses(path):
        b = a.breakdown()
        assert set(b) == set(BREAKDOWN_KEYS)
        assert min(b.values()) >= 0.0, (a.graph.step, b)
        assert sum(b.values()) == pytest.approx(a.cpm.makespan, rel=1e-9, abs=1e-3), (a.graph.step, b)


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=_ids)
def test_segments_tile_the_step_in_time_order(path):
    for a in cached_analyses(path):
        segs = a.segments()
        assert segs, a.graph.step
        assert {s.kind for s in segs} <= set(SEGMENT_KINDS)
        assert segs[0].start == pytest.approx(a.cpm.path_origin, abs=1e-6)
        for x, y in zip(segs, segs[1:]):
            assert y.start == pytest.approx(x.end, abs=1e-6), (x, y)
        assert segs[-1].end - a.cpm.path_origin == pytest.approx(a.cpm.makespan, abs=1e-3)
        assert all(s.dur > 0 for s in segs)


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=_ids)
def test_no_binding_edge_runs_back_in_time(path):
    """The edge that decides a node's start comes from a node that started no later (beyond the
    clock tolerance); and no edge of the graph makes an op wait for one that started after it."""
    for a in cached_analyses(path):
        g, r = a.graph, a.cpm
        e = g.edges
        bound = np.flatnonzero(r.pred >= 0)
        src = e["src"][r.pred[bound]]
        # a receive that completed before its send's span began (recorded late, or a pair matched
        # by size and order only) waited all along: counted by the builder, the one exception
        kind = e["kind"][r.pred[bound]]
        # (a transfer found done by both sides is done when the later side posted: a zero-length
        # participant that started no later than its recorded end, no late peer)
        n0 = g.nodes
        late_peer = (
            np.isin(kind, (EdgeKind.SEND_RECV, EdgeKind.COLLECTIVE_SYNC))
            & (n0["mdur"][bound] <= 1e-6)
            & (n0["mstart"][bound] >= n0["start"][bound] + n0["dur"][bound] - 1e-6)
        )
        late = (r.est[src] > r.est[bound] + CLOCK_TOL) & ~late_peer
        assert late_peer.sum() <= g.meta["late_peers"]
        assert not late.any(), f"step {g.step}: {int(late.sum())} binding edges run back in time, e.g. {g.node_name(int(src[late][0]))}"
        n = g.nodes
        real = (n["rank"][e["src"]] >= 0) & (n["rank"][e["dst"]] >= 0)  # barriers sit at the last arrival
        back = real & (n["start"][e["src"]] > n["mstart"][e["dst"]] + CLOCK_TOL) & (e["kind"] != EdgeKind.SYNC)
        assert not back.any(), f"step {g.step}: {int(back.sum())} edges from an op that started after its destination"


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=_ids)
def test_untraced_time_stays_within_the_stated_bound(path):
    bound = UNTRACED_BOUND.get(path.name, DEFAULT_UNTRACED_BOUND)
    for a in cached_analyses(path):
        assert a.untraced_us <= bound * a.cpm.makespan + 1e-6, (a.graph.step, a.untraced_us, a.cpm.makespan)
        d = a.to_dict(5)
        assert d["untraced_us"] == pytest.approx(d["breakdown_us"]["untraced"])
        assert bool(a.untraced_warning()) == (a.untraced_us > 0.10 * a.cpm.makespan)


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=_ids)
def test_step_time_is_the_period_the_raw_events_show(path):
    """The step time is the step's period, computed here from the event table with plain loops
    (not facts.py, not the graph): per rank, from the later of its step start and the end of the
    device work launched before it to the later of its step end and the end of the device work it
    launched; the longest over ranks, or, for a step of several ranks each of whose trace holds a
    step before it, from the latest of their starts so computed to the latest of their ends (the
    others' work before the last rank finished the step before is that step's time). Within 1%
    (collectives' modelled ends may end a step earlier than its recorded spans); where no rank had
    device work queued past its step start, that is the ProfilerStep spans' (the CPU-bound case:
    unchanged)."""
    table = cached_load(path)
    c = table.cols
    ends = c["ts"] + c["dur"]
    device = np.isin(c["cls"], (2, 3, 4))
    runtime = {(int(r), int(k)): float(t) for r, k, t, cl in zip(c["rank"], c["correlation"], c["ts"], c["cls"]) if cl == 1 and k >= 0}
    launched = np.array([dev and (int(r), int(k)) in runtime for r, k, dev in zip(c["rank"], c["correlation"], device)])
    anchor = np.array(
        [runtime.get((int(r), int(k)), float(t)) if dev else float(t) for r, k, t, dev in zip(c["rank"], c["correlation"], c["ts"], device)]
    )
    for r in np.unique(c["rank"]):
        # device work that ran before the first traced launch's, or whose correlation id is below every
        # traced runtime call's (launched before the first of them), was queued before the profile
        first = c["ts"][launched & (c["rank"] == r)].min() if (launched & (c["rank"] == r)).any() else np.inf
        first_call = min((k for (q, k) in runtime if q == r and k > 0), default=-1)
        early = (c["ts"] < first) | ((c["correlation"] > 0) & (c["correlation"] < first_call))
        anchor[device & ~launched & (c["rank"] == r) & early] = -np.inf
    for a in cached_analyses(path):
        g = a.graph
        if g.step is None:
            continue
        period, from_start, queued = 0.0, 0.0, False
        here = [s for s in table.steps if s.number == g.step]
        follows = len(here) > 1 and all(any(t.rank == s.rank and t.number < s.number for t in table.steps) for s in here)
        origins, step_ends, starts = [], [], []
        for s in here:
            mine = (c["rank"] == s.rank) & device
            before = mine & (anchor < s.start)
            own = mine & (anchor >= s.start) & (anchor < s.end)
            prev = ends[before].max() if before.any() else -np.inf
            queued |= prev > s.start
            end = max(s.end, ends[own].max() if own.any() else -np.inf)
            period = max(period, end - max(s.start, prev))
            from_start = max(from_start, end - s.start)
            origins.append(max(s.start, prev))
            step_ends.append(end)
            starts.append(s.start)
        if follows:
            period, from_start = max(step_ends) - max(origins), max(step_ends) - max(starts)
        assert a.step_time == pytest.approx(period, rel=0.01), g.step
        assert a.period == pytest.approx(period, rel=1e-9), g.step
        if not queued:  # as before the period: from the step start to the end of its work (a device tail included)
            assert a.period == pytest.approx(from_start, rel=1e-9), g.step


@pytest.mark.parametrize(
    "path,tid,at_least_ms",
    [(PUBLIC / "nccl_2rank_rank0.json.gz", 2919752, 60.0), (REAL / "ddp_v100_rank1of2_5steps.json.gz", 785244, 100.0)],
    ids=["nccl_2rank", "ddp_v100"],
)
def test_the_backward_on_the_autograd_thread_is_on_the_critical_path(path, tid, at_least_ms):
    """The main thread waits inside loss.backward() while the autograd thread runs the backward:
    the path must enter that thread (or the GPU), not jump over the wait as CPU overhead."""
    for a in cached_analyses(path):
        rows = a.critical_path()
        there = sum(s.dur_us for s in rows if s.tid == tid or s.stream is not None)
        assert there >= at_least_ms * 1000, (a.graph.step, there)
        handed = [s for s in rows if s.kind == "wait" and s.cause and s.cause.thread and "wake-up" in s.name]
        assert {s.tid for s in handed} >= {tid}  # into the autograd thread ...
        assert any(s.tid != tid for s in handed)  # ... and back to the thread that called backward()
        g = a.graph
        assert (g.edges["kind"] == EdgeKind.THREAD).sum() >= 2
        assert a.breakdown()["cpu_overhead"] > 0.5 * a.cpm.makespan  # both traces are CPU-bound steps


def test_dlrm_the_late_rank_is_the_straggler_and_what_if_it_came_later():
    """Rank 1's first all-to-all waits for rank 7, which enters the step 7.5 ms after rank 1:
    straggler 7 (not the victim), the wait is a wait (not launch latency), and delaying rank 7's
    first op by 5 ms costs the step 4-5.5 ms."""
    from bottleneck_oracle.api import whatif

    path = REAL / "dlrm_v100_8rank"
    (a,) = cached_analyses(path)
    assert a.straggler().rank in (7, 2, 6)
    rows = a.critical_path()
    launch = [s for s in rows if s.kind == "launch"]
    assert max(s.dur_us for s in launch) < 100.0  # no wait disguised as launch latency
    late = [s for s in rows if s.kind == "wait" and s.rank == 7 and "late step start" in s.name]
    # the README: rank 7 enters at 7513 µs (from rank 1's start); the wait ends there
    assert late and late[0].start_us + late[0].dur_us == pytest.approx(a.graph.rank_start(1) + 7513.0, abs=1.0)
    assert a.breakdown()["idle"] >= 5000.0
    first7 = next(s.node for s in rows if s.rank == 7 and s.kind == "op")
    (row,) = whatif(path, [f"id={first7},delay_ms=5"], use_model=False)
    assert 4000.0 <= row.replay.delta_us <= 5500.0
    # the compute stream's kernel after the all-to-all waited for the NCCL stream (no cuda_sync events: inferred)
    g, n = a.graph, a.graph.nodes
    e = g.edges
    sync = np.flatnonzero((e["kind"] == EdgeKind.SYNC) & n["on_gpu"][e["src"]] & n["on_gpu"][e["dst"]])
    assert any(
        g.node_name(int(s)).startswith("ncclKernel_SendRecv") and "CatArrayBatchedCopy" in g.node_name(int(d))
        for s, d in zip(e["src"][sync], e["dst"][sync])
        if n["rank"][s] == 1
    )


def test_gpu_work_belongs_to_the_step_whose_cpu_launched_it():
    """The MI300 trace's GPU runs 21-38 ms behind its CPU: a step's graph holds exactly the GPU ops
    its CPU launched (none launched before the profile), and says that the queue is deep."""
    path = REAL / "mi300_resnet_actckpt_rank0of8.json.gz"
    table = cached_load(path)
    launcher = table.launchers()
    for a in cached_analyses(path):
        g = a.graph
        step = next(s for s in table.steps if s.number == g.step)
        gpu_rows = g.nodes["event"][g.nodes["on_gpu"]]
        assert len(gpu_rows) and (launcher[gpu_rows] >= 0).all()
        launch_ts = table.cols["ts"][launcher[gpu_rows]]
        assert ((launch_ts >= step.start) & (launch_ts < step.end)).all()
        q = a.gpu_queue()
        assert q.ranks[0].lag_us > 15_000 and q.ranks[0].gpu_after_step_us > 15_000
        assert a.queue_warning() and "behind its host" in a.queue_warning()
        # the step's time starts where the device finished the earlier steps' work: no "idle" lead-in
        assert a.segments()[0].on_gpu and a.breakdown()["idle"] < 0.01 * a.step_time


def _write_trace(path, events):
    doc = {"schemaVersion": 1, "traceEvents": events}
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    return path


def _x(name, cat, ts, dur, tid, pid=100, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def test_a_sync_never_waits_for_an_op_that_ended_after_it_returned(tmp_path):
    """No cuda_sync events: cudaStreamSynchronize returned at 1.2 ms, after kernel A (stream 7)
    ended; kernel B (stream 20), launched before it, ran 40 ms later. The sync waited for A, not
    B (an edge from B would run back in time and make the breakdown negative)."""
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 100_000, 1),
        _x("cudaLaunchKernel", "cuda_runtime", 100, 10, 1, correlation=1),
        _x("kernel_A", "kernel", 120, 1000, 7, pid=0, correlation=1, stream=7),
        _x("cudaLaunchKernel", "cuda_runtime", 200, 10, 1, correlation=2),
        _x("kernel_B", "kernel", 41_000, 9000, 20, pid=0, correlation=2, stream=20),
        _x("cudaStreamSynchronize", "cuda_runtime", 300, 900, 1, correlation=3),
        _x("aten::add", "cpu_op", 1300, 50, 1),
    ]
    table = load(_write_trace(tmp_path / "t.json.gz", events))
    g = build_graph(table, 1)
    n, e = g.nodes, g.edges
    names = [g.node_name(i) for i in range(g.n_nodes)]
    sync = names.index("cudaStreamSynchronize")
    waits = e["src"][(e["dst"] == sync) & (e["kind"] == EdgeKind.SYNC)]
    assert [names[i] for i in waits] == ["kernel_A"]
    assert n["mstart"][sync] == pytest.approx(1120.0)  # it waited until A ended
    _, (a,) = analyze(tmp_path / "t.json.gz")
    assert min(a.breakdown().values()) >= 0


def test_a_thread_hand_over_becomes_an_edge_only_when_the_other_thread_went_idle(tmp_path):
    """Thread 1 runs a, then waits 5 ms; thread 2 starts b 90 µs after a ended (thread 1 went idle:
    a hand-over) and ends it 100 µs before thread 1 resumes with c. If thread 2 goes idle after b,
    it handed back (b -> c); if it keeps running (d), nothing ties c to it, and thread 2, which the
    step's thread only leads to, is a bystander: it cannot hold the step up (left out of the graph)."""

    def trace(keeps_running: bool):
        events = [
            _x("ProfilerStep#1", "user_annotation", 0, 10_000, 1),
            _x("aten::a", "cpu_op", 10, 100, 1),
            _x("aten::b", "cpu_op", 200, 4700, 2),
            _x("aten::c", "cpu_op", 5000, 100, 1),
        ]
        if keeps_running:
            events.append(_x("aten::d", "cpu_op", 4950, 2000, 2))
        return build_graph(load(_write_trace(tmp_path / f"h{keeps_running}.json.gz", events)), 1)

    g = trace(False)
    e = g.edges
    thread = np.flatnonzero(e["kind"] == EdgeKind.THREAD)
    assert sorted((g.node_name(int(e["src"][i])), g.node_name(int(e["dst"][i]))) for i in thread) == [
        ("aten::a", "aten::b"),
        ("aten::b", "aten::c"),
    ]
    g = trace(True)
    assert not (g.edges["kind"] == EdgeKind.THREAD).any()
    assert [(b["tid"], b["ops"], b["polls"]) for b in g.meta["bystanders"]] == [(2, 2, False)]
    assert not {"aten::b", "aten::d"} & {g.node_name(i) for i in range(g.n_nodes)}


def test_a_thread_that_only_polls_hands_nothing_over_and_carries_nothing(tmp_path):
    """A monitor thread (NCCL's watchdog: cudaEventQuery, cudaPointerGetAttributes every few ms,
    no launch) polls right before the step's thread resumes from a wait, then sleeps 40 ms past the
    step's end. Its poll is not a hand-over (no THREAD edge), and with no dependency into the step
    it is a bystander: the step ends with its own work (the kernel), whatever the watchdog does."""
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 10_000, 1),
        _x("cudaLaunchKernel", "cuda_runtime", 10, 20, 1, correlation=7),
        _x("kernel_A", "kernel", 40, 6000, 7, pid=0, correlation=7, stream=7, device=0),
        _x("aten::idle_wait_then_c", "cpu_op", 5000, 100, 1),
        _x("cudaEventQuery", "cuda_runtime", 4800, 5, 3, correlation=8),
        _x("cudaPointerGetAttributes", "cuda_runtime", 4810, 5, 3, correlation=9),
        _x("cudaEventQuery", "cuda_runtime", 50_000, 5, 3, correlation=10),
    ]
    g = build_graph(load(_write_trace(tmp_path / "w.json.gz", events)), 1)
    assert not (g.edges["kind"] == EdgeKind.THREAD).any()
    assert [(b["tid"], b["polls"]) for b in g.meta["bystanders"]] == [(3, True)]
    _, (a,) = analyze(tmp_path / "w.json.gz")
    assert not [s for s in a.segments() if s.tid == 3]  # none of the path on the watchdog


def test_the_straggler_sleep_of_the_bundled_run_is_untraced_time_on_rank_1():
    for a in cached_analyses(SAMPLE):
        untraced = [s for s in a.segments() if s.kind == "untraced"]
        assert sum(s.dur for s in untraced if s.rank == 1) >= 18_000  # rank 1 sleeps 20 ms in its forward
        assert a.straggler().rank == 1


def test_a_thread_that_synchronizes_may_still_hand_over(tmp_path):
    """A completion thread (only runtime calls, but a synchronize among them) waits for the device
    and then wakes the step's thread, which resumes 60 µs after its synchronize returned: that is
    a hand-over, polling or not (the MTIA runtime's submission queues synchronize so)."""
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 10_000, 1),
        _x("cudaLaunchKernel", "cuda_runtime", 10, 20, 1, correlation=7),
        _x("kernel_A", "kernel", 40, 4000, 7, pid=0, correlation=7, stream=7, device=0),
        _x("cudaStreamSynchronize", "cuda_runtime", 100, 3950, 3, correlation=8),
        _x("aten::after_the_wait", "cpu_op", 4110, 100, 1),
    ]
    g = build_graph(load(_write_trace(tmp_path / "s.json.gz", events)), 1)
    e = g.edges
    thread = np.flatnonzero(e["kind"] == EdgeKind.THREAD)
    assert ("cudaStreamSynchronize", "aten::after_the_wait") in [
        (g.node_name(int(e["src"][i])), g.node_name(int(e["dst"][i]))) for i in thread
    ]
    assert not g.meta["bystanders"]

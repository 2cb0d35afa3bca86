"""A functional collective's wait (``_c10d_functional::wait_tensor``: DTensor's tensor parallelism,
torch.compile's collectives) blocks its thread until the collective is done: on the critical
path it is waiting, through the backend's op, never work; and the asynchronous call before it is
no wait of its own.

The oracle is the raw trace: our own 2-rank gloo job whose MLP is tensor-parallel
(tests/data/own-cpu/tensor_parallel_gloo, ``benchmarks/record_tensor_parallel.py``): per step one
``_c10d_functional::all_reduce`` (``c10d::allreduce_`` inside it, ``gloo:all_reduce`` on gloo's
thread), then ``_c10d_functional::wait_tensor`` with no event inside it."""

from __future__ import annotations

import gzip
import json

import pytest

from bottleneck_oracle.graph_pipeline.schema import EdgeKind
from conftest import DATA, cached_analyses

TP = DATA / "own-cpu" / "tensor_parallel_gloo"
WAIT = "_c10d_functional::wait_tensor"


def _raw_waits() -> dict[tuple[int, int], float]:
    """(rank, ProfilerStep number) -> the step thread's time in wait_tensor calls and collectives'
    own calls (``c10d::allreduce_``, held on a loaded machine) of 1 ms or more with no event inside
    them, read from the JSON."""
    out = {}
    for rank in (0, 1):
        ev = [e for e in json.loads(gzip.open(TP / f"rank-{rank}.json.gz").read())["traceEvents"] if e.get("ph") == "X"]
        for s in (e for e in ev if str(e["name"]).startswith("ProfilerStep#")):
            lo, hi = float(s["ts"]), float(s["ts"]) + float(s["dur"])
            total = 0.0
            held = (e for e in ev if (e["name"] == WAIT or (e["name"].startswith("c10d::") and "wait" not in e["name"])))
            for w in (e for e in held if e["tid"] == s["tid"] and lo <= float(e["ts"]) < hi):
                a, b = float(w["ts"]), float(w["ts"]) + float(w["dur"])
                inside = [e for e in ev if e is not w and e["tid"] == w["tid"] and a < float(e["ts"]) < b]
                if b - a >= 1000.0 and not inside:
                    total += b - a
            out[rank, int(str(s["name"]).split("#")[1])] = total
    return out


def test_a_functional_collective_s_wait_waits_on_the_backend_op():
    """Every wait_tensor waits on its rank's gloo:all_reduce (an edge the wait's modelled start
    follows); none of its time is on the critical path as an op's work, and the facts count the
    raw waits of 1 ms or more as the thread blocked (the host_blocked check holds). Before: 3-10 ms
    waits read as CPU compute (the run 94% compute, communication ~0)."""
    raw = _raw_waits()
    assert sum(raw.values()) > 20_000.0  # (the waits are most of the job's communication: 3-10 ms in most steps)
    for a in cached_analyses(TP):
        g = a.graph
        n, e = g.nodes, g.edges
        waits = [i for i in range(g.n_nodes) if g.node_name(i) == WAIT]
        assert len(waits) == 2, g.step  # one per rank
        for i in waits:
            into = (e["dst"] == i) & (e["kind"] == EdgeKind.FEEDS)
            (src,) = e["src"][into]
            assert g.node_name(int(src)) == "gloo:all_reduce" and n["rank"][src] == n["rank"][i]
        assert not [s for s in a.segments() if s.kind == "op" and s.name == WAIT], g.step
        facts = g.info.facts
        assert facts is not None
        for f in facts.ranks:
            assert f.host_blocked_us == pytest.approx(raw[f.rank, g.step], abs=1.0)
        assert all(c.ok for c in a.checks() if c.name == "host_blocked")


def test_the_asynchronous_call_does_not_end_the_collective():
    """``_c10d_functional::all_reduce`` returns at once and its thread goes on: the op it runs
    next is no resume after the collective, so the collective's modelled end is not cut there (it
    was: a 6-10 ms all-reduce modelled as 0.3 ms, ending at the caller's next op). Where both
    ranks' waits return after both gloo ops' recorded ends (the recorded times: no thread shows
    the collective done earlier), each gloo op's modelled end is at least the earlier of those
    recorded ends."""
    checked = 0
    for a in cached_analyses(TP):
        g = a.graph
        n = g.nodes
        gloo = [i for i in range(g.n_nodes) if g.node_name(i) == "gloo:all_reduce"]
        waits = [i for i in range(g.n_nodes) if g.node_name(i) == WAIT]
        first_end = min(float(n["start"][i] + n["dur"][i]) for i in gloo)
        if min(float(n["start"][i] + n["dur"][i]) for i in waits) < first_end:
            continue
        checked += 1
        for i in gloo:
            assert float(n["mstart"][i] + n["mdur"][i]) >= first_end - 1.0, (g.step, i)
    assert checked >= 4


ASYNC = DATA / "own-cpu" / "async_allreduce_gloo"


def _raw_async_waits(rank: int) -> dict[int, tuple[float, float, float, int]]:
    """Per ProfilerStep number of ``rank``: the stretch in which its loop's thread had no event
    open before ``Optimizer.step`` (start, end; µs as the trace gives them) and the end of the
    rank's last ``gloo:all_reduce`` that began in the step, and the loop thread's id, read from the
    JSON."""
    ev = [
        e
        for e in json.loads(gzip.open(ASYNC / f"rank-{rank}.json.gz").read())["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") != "Trace"
    ]
    out = {}
    for s in (e for e in ev if str(e["name"]).startswith("ProfilerStep#")):
        lo, hi = float(s["ts"]), float(s["ts"]) + float(s["dur"])
        (opt,) = [e for e in ev if str(e["name"]).startswith("Optimizer.step#") and e["tid"] == s["tid"] and lo <= float(e["ts"]) < hi]
        resume = float(opt["ts"])
        before = [float(e["ts"]) + float(e["dur"]) for e in ev if e is not s and e["tid"] == s["tid"] and lo <= float(e["ts"]) < resume]
        gloo = [float(e["ts"]) + float(e["dur"]) for e in ev if e["name"] == "gloo:all_reduce" and lo <= float(e["ts"]) < resume]
        out[int(str(s["name"]).split("#")[1])] = (max(before), resume, max(gloo), int(s["tid"]))
    return out


def test_a_thread_that_waits_later_for_an_asynchronous_collective_waits_on_its_own_backend_op():
    """``dist.all_reduce(..., async_op=True)`` then ``work.wait()`` (no op records the wait): the
    loop's thread has no event from its last op until ``Optimizer.step``, which it starts within
    1 ms after its rank's last ``gloo:all_reduce`` ended (raw). The critical path shows none of
    that stretch on the loop's thread as untraced: it runs through the gloo op (the thread could not go on before its
    own backend op was done, even where the other rank's op of the collective ended earlier) and
    the wake-up after it. Before: the stretch untraced (8% of the run's path)."""
    checked = 0
    for rank in (0, 1):
        raw = _raw_async_waits(rank)
        for a in cached_analyses(ASYNC):
            lo, hi, done, tid = raw[a.graph.step]
            if not (lo < done <= hi <= done + 1000.0) or hi - lo < 1000.0:
                continue
            shift = a.graph.window_start  # (raw µs -> the window's)
            lo, hi = lo - shift, hi - shift
            on_path = [s for s in a.segments() if s.rank == rank and s.tid == tid and s.end > lo + 1.0 and s.start < hi - 1.0]
            if not on_path:
                continue  # (the other rank's wait held the step)
            checked += 1
            assert not [s for s in on_path if s.kind == "untraced"], (a.graph.step, rank)
    assert checked >= 4

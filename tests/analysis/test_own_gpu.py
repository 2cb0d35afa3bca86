"""Our own DDP job recorded on a GPU (tests/data/own-gpu/README.md): facts read from the raw
events that the graph and the replay must reproduce."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from bottleneck_oracle.api import whatif
from bottleneck_oracle.graph_pipeline.schema import EdgeKind
from conftest import OWN_GPU, OWN_GPU_FIXTURES, cached_analyses

CLEAN = [OWN_GPU / "gloo_cuda_ddp_tiny_clean", OWN_GPU / "gloo_cuda_ddp_tiny_pinned"]


def _exchanges(path) -> list[tuple[int, float, float]]:
    """From the raw events: (rank, start, end) in absolute µs of the longest stretch inside each
    CPU ``gloo:all_reduce`` with no other event of its thread open: the exchange with the peer,
    between the copy to host memory and the copy back."""
    out = []
    for rank in (0, 1):
        with gzip.open(path / f"rank-{rank}.json.gz", "rt") as fh:
            ev = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
        for g in (e for e in ev if e["name"] == "gloo:all_reduce" and e.get("cat") != "gpu_user_annotation"):
            inside = sorted(
                (e for e in ev if e is not g and e["tid"] == g["tid"] and g["ts"] <= e["ts"] and e["ts"] + e["dur"] <= g["ts"] + g["dur"]),
                key=lambda e: e["ts"],
            )
            bounds = [g["ts"], *[x for e in inside for x in (e["ts"], e["ts"] + e["dur"])], g["ts"] + g["dur"]]
            stretches = [(bounds[2 * i], bounds[2 * i + 1]) for i in range(len(inside) + 1)]
            out.append((rank, *max(stretches, key=lambda s: s[1] - s[0])))
    return out


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.name)
def test_the_gloo_exchange_of_cuda_tensors_is_the_collective_and_the_thread_runs_through_it(path):
    """gloo all-reduces CUDA tensors through host memory: copy, synchronise, exchange (untraced),
    copy back, all inside gloo:all_reduce on its thread. The collective node is the exchange, and
    the thread's next op starts from it (not from a fixed gap that holds the wait for the peer:
    4-18 ms in the pinned recording, reported as untraced time before)."""
    want = sorted(_exchanges(path))
    got = []
    for a in cached_analyses(path):
        g = a.graph
        n, e = g.nodes, g.edges
        for i in (i for i in range(g.n_nodes) if g.node_name(i) == "gloo:all_reduce" and not n["on_gpu"][i]):
            got.append((int(n["rank"][i]), g.window_start + n["start"][i], g.window_start + n["start"][i] + n["dur"][i]))
            nxt = e["dst"][(e["src"] == i) & (e["kind"] == EdgeKind.PROGRAM_ORDER)]
            assert len(nxt) == 1 and n["tid"][nxt[0]] == n["tid"][i], (g.step, g.node_name(int(i)))
            assert 0.0 <= n["start"][nxt[0]] - (n["start"][i] + n["dur"][i]) <= 100.0  # aten::copy_ opens the copy back
        assert a.untraced_us <= 0.02 * a.cpm.makespan, (g.step, a.untraced_us)
    assert len(got) == len(want) == 12
    for (r1, s1, e1), (r2, s2, e2) in zip(sorted(got), want):
        assert r1 == r2 and s1 == pytest.approx(s2, abs=1.0) and e1 == pytest.approx(e2, abs=1.0)


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.name)
def test_speeding_up_the_late_rank_saves_the_wait_it_imposed(path):
    """Each step, the rank that reaches the all-reduce last makes the other wait. Halving its
    forward and backward brings it in earlier: the step shrinks by at least half that wait (it
    shrank by nothing when the early rank's exchange was a fixed gap in its thread's program)."""
    steps = {a.graph.step: a.straggler() for a in cached_analyses(path)}
    late = {s: x for s, x in steps.items() if s != 1 and x is not None and x.imposed_wait_us > 500}  # step 1 warms up
    assert len(late) >= 4
    for s, x in late.items():
        (w,) = whatif(
            path, [f"phase=forward,rank={x.rank},scale=0.5", f"phase=backward,rank={x.rank},scale=0.5"], steps=[s], use_model=False
        )
        assert -w.replay.delta_us >= 0.5 * x.imposed_wait_us, (s, x, w.replay.delta_us)


def test_a_gpu_stall_the_gpu_catches_up_on_saves_nothing():
    """Step 3 of rank 1: a 3.9 ms device-side sleep (spin_kernel, 1.835-5.747 ms into the step)
    after layers.0.mlp. The kernels launched meanwhile queue behind it and run back to back
    until 5.96 ms; from 6.37 ms on, kernels start about 0.3 ms after their launch again (the GPU
    waits for the CPU), and the step ends at 12.86 ms. The sleep is off the critical path and
    removing it saves next to nothing (paired re-runs of the same stall: 0.05 ms,
    docs/eval-gpu.md); the kernels behind it are modelled as waiting for it."""
    path = OWN_GPU / "gloo_cuda_ddp_tiny_stall"
    (a,) = [a for a in cached_analyses(path) if a.graph.step == 3]
    g = a.graph
    n = g.nodes
    names = np.array([g.node_name(i) for i in range(g.n_nodes)])
    spin = np.flatnonzero(np.char.find(names.astype(str), "spin_kernel") >= 0)
    assert len(spin) == 1 and n["rank"][spin[0]] == 1 and n["dur"][spin[0]] == pytest.approx(3912, abs=5)
    assert not a.cpm.critical[spin[0]]
    behind = np.flatnonzero((n["tid"] == n["tid"][spin[0]]) & (n["rank"] == 1) & (n["start"] > n["start"][spin[0]]))
    first = behind[np.argmin(n["start"][behind])]
    assert a.cpm.est[first] >= a.cpm.est[spin[0]] + n["dur"][spin[0]] - 1.0  # queued behind the sleep
    (w,) = whatif(path, ["module=oracle_inject*,rank=1,scale=0", "module=oracle_inject*,rank=1,scale=0,gap=1"], steps=[3], use_model=False)
    assert w.edited_nodes >= 2  # the range on the CPU and the sleep it launched
    assert -300.0 <= w.replay.delta_us <= 0.0


def test_own_gpu_fixtures_are_the_three_recordings():
    assert [p.name for p in OWN_GPU_FIXTURES] == ["gloo_cuda_ddp_tiny_clean", "gloo_cuda_ddp_tiny_pinned", "gloo_cuda_ddp_tiny_stall"]

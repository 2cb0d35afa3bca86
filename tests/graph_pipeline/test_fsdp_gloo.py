"""FSDP2 on gloo (tests/data/own-cpu/fsdp_gloo, ``benchmarks/record_fsdp.py``): the main thread's
c10d calls are run by gloo's worker threads, whose ops differ from the calls in size (an
all-gather's c10d call reads as its gathered output, the backend op as the shard) and in kind (a
reduce-scatter runs as an all-reduce of the whole gradient), and an all-gather's backend op
copies the shard in and the gathered tensor out around its exchange on the worker's thread.

The oracle is the raw JSON: a rank's c10d collective calls and its ``gloo:*`` ops in time order,
one op per call, and each backend op's children on its own thread."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from bottleneck_oracle.graph_pipeline.schema import EdgeKind
from conftest import DATA, cached_analyses

FSDP = DATA / "own-cpu" / "fsdp_gloo"
CALLS = ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_")


def _raw(rank: int) -> list[dict]:
    return [e for e in json.loads(gzip.open(FSDP / f"rank-{rank}.json.gz").read())["traceEvents"] if e.get("ph") == "X"]


def test_the_trace_is_what_the_oracle_expects():
    """One gloo op per c10d call, each after its call; the calls on the main thread, the ops on
    other threads; all-gather ops hold child ops, the reduce-scatters run as all-reduces."""
    for rank in (0, 1):
        ev = _raw(rank)
        calls = sorted((e for e in ev if e["name"] in CALLS), key=lambda e: e["ts"])
        ops = sorted((e for e in ev if e["name"].startswith("gloo:")), key=lambda e: e["ts"])
        assert len(calls) == len(ops) > 0
        assert all(c["ts"] <= o["ts"] for c, o in zip(calls, ops))
        assert {c["tid"] for c in calls}.isdisjoint({o["tid"] for o in ops})
        assert [c["name"] for c in calls].count("c10d::_reduce_scatter_base_") == [o["name"] for o in ops].count("gloo:all_reduce")


def test_every_c10d_call_is_tied_to_the_gloo_op_that_ran_it():
    """Per step and rank, the BACKEND edges pair the k-th c10d call with the k-th gloo op (the raw
    events' order, checked above), every one of them: before, size and kind kept them all apart."""
    for a in cached_analyses(FSDP):
        g = a.graph
        n, e, reg = g.nodes, g.edges, g.regions
        names = np.array([g.names[k] for k in reg["name"]])
        for rank in g.ranks:
            calls = np.flatnonzero(np.isin(names, CALLS) & (reg["rank"] == rank))
            calls = calls[np.argsort(reg["start"][calls])]
            ops = np.flatnonzero(np.array([g.node_name(i).startswith("gloo:") for i in range(g.n_nodes)]) & (n["rank"] == rank))
            ops = ops[np.argsort(n["start"][ops])]
            assert len(calls) == len(ops) > 0, (g.step, rank)
            # (a call's edge lands on its collective's barrier, the moment all arrived: its op is that barrier's member on the rank)
            sync = e["kind"] == EdgeKind.COLLECTIVE_SYNC
            back = np.flatnonzero((e["kind"] == EdgeKind.BACKEND) & (n["rank"][e["src"]] == rank))
            got = {}
            for j in back.tolist():
                src = int(e["src"][j])
                (k,) = [
                    k for k, c in enumerate(calls.tolist()) if reg["first"][c] <= src <= reg["last"][c] and reg["tid"][c] == n["tid"][src]
                ]
                (got[k],) = [int(d) for d in e["dst"][sync & (e["src"] == e["dst"][j])] if n["rank"][d] == rank]
            assert got == dict(enumerate(ops.tolist())), (g.step, rank)


def _exchanges(rank: int) -> list[tuple[float, float]]:
    """Per gloo all-gather of a rank, in time order: the longest stretch of its span with no child
    op open that ends at a child (the copy out follows the exchange), from the raw JSON."""
    ev = _raw(rank)
    out = []
    for o in sorted((e for e in ev if e["name"] == "gloo:all_gather"), key=lambda e: e["ts"]):
        kids = sorted(
            (e for e in ev if e["tid"] == o["tid"] and e is not o and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]),
            key=lambda e: e["ts"],
        )
        assert kids  # (copies in and out)
        busy, best = o["ts"], (-1.0, 0.0, 0.0)
        for k in kids:
            best, busy = max(best, (k["ts"] - busy, busy, k["ts"])), max(busy, k["ts"] + k["dur"])
        out.append((best[1], best[2]))
    return out


def test_the_two_ranks_exchanges_overlap():
    """The oracle's exchanges are one exchange: the k-th all-gather's stretch on rank 0 overlaps the
    k-th's on rank 1 (the ranks share a clock). The stretch after an op's last child, which the
    longest-stretch rule took where a descheduled worker closed its span late, did not: rank 1's
    all-gather of step 2 then began after rank 0's had ended."""
    for (a0, a1), (b0, b1) in zip(_exchanges(0), _exchanges(1), strict=True):
        assert max(a0, b0) < min(a1, b1) + 50.0


def test_an_all_gather_s_exchange_is_its_op_and_its_copies_follow_it():
    """A gloo all-gather on a worker thread: the op is its exchange (the oracle's: the k-th of a rank
    against the graphs' k-th), and the first op after it on its thread has the op as its binding
    in-edge, so the critical path runs from the exchange into the copy out, not through a gap on
    the worker's thread."""
    for rank in (0, 1):
        want = [b - a for a, b in _exchanges(rank)]
        got = []
        for a in cached_analyses(FSDP):
            g, r = a.graph, a.cpm
            n, e = g.nodes, g.edges
            mine = [i for i in range(g.n_nodes) if g.node_name(i) == "gloo:all_gather" and n["rank"][i] == rank]
            for i in sorted(mine, key=lambda i: n["start"][i]):
                got.append(float(n["dur"][i]))
                after = e["dst"][(e["src"] == i) & (e["kind"] == EdgeKind.PROGRAM_ORDER)]
                after = after[n["rank"][after] >= 0]  # (not the next backend op's barrier: the worker runs them in turn)
                assert len(after) == 1 and r.pred[after[0]] >= 0 and e["src"][r.pred[after[0]]] == i, (g.step, rank)
        assert len(got) == len(want) >= 24
        assert got == pytest.approx(want, abs=1.0)


def test_fsdp_communication_is_on_the_critical_path():
    """Before, every step read 0 ms of communication and 45% untraced (the path ran through gaps
    on gloo's worker threads)."""
    for a in cached_analyses(FSDP):
        b = a.breakdown()
        assert b["communication"] > 0.0, a.graph.step
    untraced = np.median([a.breakdown()["untraced"] / a.step_time for a in cached_analyses(FSDP)])
    assert untraced < 0.25

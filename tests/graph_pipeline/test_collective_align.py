"""Collectives without sequence numbers, where a rank's trace lacks some (events sampled, a trace
trimmed or cut): ranks issue a process group's collectives in one order, so the ranks' sequences
are aligned and one missing op shifts no other pairing. Matching the k-th op of a kind and size on
every rank paired the later ones of that kind with the wrong instance, and where two such
instances crossed (each waiting for the other's participants) the step's graph had a dependency
cycle and the step was refused. Instances that still cross are left unmatched, and said so.

Oracles: the construction (which collective each op is), and networkx for "no cycle"."""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from bottleneck_oracle import api
from bottleneck_oracle.graph_pipeline.builder import RawGraph, finalize
from bottleneck_oracle.graph_pipeline.collectives import match_instances
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind, NodeType
from conftest import DATA, REAL, run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from collective_alignment import pipeline_job  # noqa: E402  (the benchmark's pipeline, scored here against its truth)

ALL_REDUCE, ALL_GATHER = int(CollectiveKind.ALL_REDUCE), int(CollectiveKind.ALL_GATHER)


def _job(seed: int, ranks: int, n: int, drop: float):
    """A group's collectives (kind, size) issued in one order on every rank, 100 µs apart with a
    little jitter and a clock offset per rank; each op dropped from a rank's trace with
    probability ``drop``. Returns the columns match_instances takes and the truth per op."""
    rng = random.Random(seed)
    calls = [(rng.choice((ALL_REDUCE, ALL_GATHER)), rng.choice((1024, 4096))) for _ in range(n)]
    cols: dict[str, list] = {"rank": [], "start": [], "ckind": [], "size": [], "truth": []}
    for r in range(ranks):
        offset = rng.uniform(-5000, 5000)
        for j, (k, m) in enumerate(calls):
            if rng.random() < drop:
                continue
            cols["rank"].append(r)
            cols["start"].append(offset + 100.0 * j + rng.uniform(-10, 10))
            cols["ckind"].append(k)
            cols["size"].append(m)
            cols["truth"].append(j)
    return {k: np.array(v) for k, v in cols.items()}


def _paired_as_built(inst: np.ndarray, c: dict[str, np.ndarray]) -> None:
    """Against the construction: every instance is one collective (or transfer), and every one
    two or more ranks hold is one instance."""
    matched = inst >= 0
    for i in np.unique(inst[matched]).tolist():
        assert len(set(c["truth"][inst == i].tolist())) == 1, f"instance {i} pairs different collectives"
    held = {j: int((c["truth"] == j).sum()) for j in np.unique(c["truth"]).tolist()}
    assert len(np.unique(inst[matched])) == sum(v >= 2 for v in held.values())


@pytest.mark.parametrize("seed", range(6))
def test_every_instance_is_one_collective_when_ranks_lack_some(seed):
    c = _job(seed, ranks=4, n=60, drop=0.08)
    inst = match_instances(
        c["rank"].astype(np.int32), c["start"], c["ckind"].astype(np.int8), np.zeros(len(c["rank"]), np.int64), c["size"].astype(float)
    )
    _paired_as_built(inst, c)


def test_the_same_sequence_on_every_rank_pairs_by_place():
    c = _job(0, ranks=3, n=40, drop=0.0)
    stats: dict = {}
    inst = match_instances(
        c["rank"].astype(np.int32),
        c["start"],
        c["ckind"].astype(np.int8),
        np.zeros(len(c["rank"]), np.int64),
        c["size"].astype(float),
        stats=stats,
    )
    assert stats == {"aligned": 0}
    assert all(len(set(c["truth"][inst == i].tolist())) == 1 for i in range(40))


def _two_ranks(seed: int, drop: float, late_us: float, skew_us: float = 0.0):
    """Two ranks' collectives (two kinds, two sizes) 100 µs apart on aligned clocks, each rank
    arriving at its own time (starts apart) and every collective ending together, except that
    rank 1's spans close late by up to ``late_us`` (a descheduled backend thread) and its clock
    runs ``skew_us`` ahead; each op dropped at random. Returns the columns and the truth."""
    rng = random.Random(seed)
    cols: dict[str, list] = {"rank": [], "start": [], "end": [], "ckind": [], "size": [], "truth": []}
    calls = [(rng.choice((ALL_REDUCE, ALL_GATHER)), rng.choice((1024, 4096))) for _ in range(60)]
    for r in (0, 1):
        for j, (k, m) in enumerate(calls):
            if rng.random() < drop:
                continue
            cols["rank"].append(r)
            cols["start"].append(100.0 * j - rng.uniform(0, 40) + skew_us * r)
            cols["end"].append(100.0 * j + rng.uniform(-5, 5) + (rng.uniform(0, late_us) + skew_us if r == 1 else 0.0))
            cols["ckind"].append(k)
            cols["size"].append(m)
            cols["truth"].append(j)
    return {k: np.array(v) for k, v in cols.items()}


def _match_two(c):
    n = len(c["rank"])
    return match_instances(
        c["rank"].astype(np.int32),
        c["start"],
        c["ckind"].astype(np.int8),
        np.zeros(n, np.int64),
        c["size"].astype(float),
        end=c["end"],
        tight=np.ones(n, bool),  # (device kernels, in a window: the ranks' clocks aligned)
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("skew_us", [0.0, 400.0])
def test_two_ranks_each_lacking_different_collectives_pair_by_time(seed, skew_us):
    """With two ranks, one lacking op i and the other op j of a run of like ops, the longest
    common subsequence pairs every op between i and j with its neighbour (one pair more than
    leaving both gaps); their ends, a spacing apart, say they are not one collective — also where
    the two clocks are 400 µs apart (four spacings: what an imperfect alignment of two hosts'
    clocks could leave), which a veto on the times as they are would take for no pair at all."""
    c = _two_ranks(seed, drop=0.08, late_us=0.0, skew_us=skew_us)
    inst = _match_two(c)
    _paired_as_built(inst, c)


@pytest.mark.parametrize("seed", range(6))
def test_spans_closed_late_leave_alike_sequences_paired_by_place(seed):
    """Nothing missing, rank 1's spans closing up to 90 µs late (the collectives 100 µs apart):
    every collective is one instance, as its place in the sequence says."""
    c = _two_ranks(seed, drop=0.0, late_us=90.0)
    inst = _match_two(c)
    assert all((inst[c["truth"] == j] == inst[c["truth"] == j][0]).all() and inst[c["truth"] == j][0] >= 0 for j in range(60))


@pytest.mark.parametrize("seed", range(6))
def test_every_send_pairs_its_own_receive_when_ranks_lack_some(seed):
    """Two pipeline stages: activations (two sizes) sent forward from rank 0 to rank 1, gradients
    sent back; each send and receive dropped from its rank's trace at random. Every pair the tool
    makes is one transfer, and every transfer both ranks hold is a pair (by the k-th send of a
    size, one missing send paired every later one of that size with the wrong receive; by order
    alone, a send and a receive missing on either side of a run of like transfers paired every
    transfer between them with its neighbour)."""
    c = pipeline_job(seed, 80, 0.05)
    inst = match_instances(
        c["rank"].astype(np.int32),
        c["start"],
        c["ckind"].astype(np.int8),
        np.zeros(len(c["rank"]), np.int64),
        c["size"].astype(float),
        c["peer"].astype(np.int64),
        tight=np.ones(len(c["rank"]), bool),  # (NCCL's send and receive kernels, in a window: the ranks' clocks aligned)
    )
    _paired_as_built(inst, c)


def _x(name, cat, ts, dur, tid, pid, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def _crossing_job(folder):
    """Two gloo ranks, each step all-reducing sizes 1000, 5000, 1000, 5000 (the gloo op on a backend
    thread ending when the last rank arrived; the main thread waits for it); rank 0's trace lacks
    the first all-reduce of step 2. Returns per rank the end of each of its gloo ops (µs), by the
    collective it is: (step, place)."""
    folder.mkdir(parents=True)
    evs: dict[int, list] = {0: [], 1: []}
    ends: dict[tuple[int, int], float] = {}
    t = 1000.0
    for step in range(1, 5):
        s0 = t
        cur = {0: t, 1: t}
        for k, size in enumerate((1000, 5000, 1000, 5000)):
            arrive = {}
            for r in (0, 1):
                cur[r] += 100 + 30 * r
                evs[r].append(_x("aten::mm", "cpu_op", cur[r], 90, 1, 100 + r))
                cur[r] += 100
                if (r, step, k) == (0, 2, 0):
                    continue
                evs[r].append(_x("c10d::allreduce_", "cpu_op", cur[r], 20, 1, 100 + r, **{"Input Dims": [[[size]]]}))
                arrive[r] = cur[r] + 25
            done = max(arrive.values()) + 200
            ends[(step, k)] = done
            for r in arrive:
                evs[r].append(_x("gloo:all_reduce", "user_annotation", arrive[r], done - arrive[r], 2, 100 + r, **{"Input Dims": [[size]]}))
                evs[r].append(_x("aten::wait", "cpu_op", arrive[r], done - arrive[r] + 5, 1, 100 + r))
                cur[r] = done + 10
        end = max(cur.values()) + 20
        for r in (0, 1):
            evs[r].append(_x(f"ProfilerStep#{step}", "user_annotation", s0, end - s0, 1, 100 + r))
        t = end + 100
    for r in (0, 1):
        doc = {"distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2}, "traceEvents": sorted(evs[r], key=lambda e: e["ts"])}
        with gzip.open(folder / f"rank-{r}.json.gz", "wt") as fh:
            json.dump(doc, fh)
    return ends


def test_a_collective_missing_on_one_rank_leaves_the_others_paired_and_the_step_analysed(tmp_path):
    """Step 2: by kind and size alone, rank 0's second 1000-element all-reduce paired with rank 1's
    first, which crosses the 5000-element one between them: a dependency cycle, and the step was
    refused ("dependency cycle while building the graph of step 2")."""
    _crossing_job(tmp_path / "job")
    _, analyses = api.analyze(tmp_path / "job")  # (before: GraphError, a dependency cycle in step 2)
    said = [w for a in analyses for w in a.warnings() if "that some ranks' traces lack" in w]
    assert len(said) == 1 and said[0].startswith("step 2:")
    table, graphs = api.build(tmp_path / "job", [2])
    g = graphs[0]
    sync = g.edges["kind"] == EdgeKind.COLLECTIVE_SYNC
    rows = g.nodes["event"][g.edges["dst"][sync]]
    ends = table.cols["ts"][rows] + table.cols["dur"][rows]
    pairs: dict[int, list[float]] = {}
    for b, e in zip(g.edges["src"][sync].tolist(), ends.tolist()):
        pairs.setdefault(b, []).append(round(e, 3))
    assert len(pairs) == 3  # the three all-reduces both ranks hold
    assert all(len(v) == 2 and v[0] == v[1] for v in pairs.values())  # each pairs the two ops of one collective
    assert g.meta["collectives"] == {"by_seq": 0, "by_order": 3, "unmatched_ops": 1, "aligned": 1, "in_a_cycle": 0}


def _crossed_raw() -> RawGraph:
    """Two ranks, two matched instances that cross: on rank 0 op 0 (instance 0) runs before op 1
    (instance 1), on rank 1 op 3 (instance 1) before op 2 (instance 0)."""
    n = 4
    nodes = {
        "rank": np.array([0, 0, 1, 1], np.int32),
        "tid": np.array([1, 1, 1, 1], np.int64),
        "on_gpu": np.zeros(n, bool),
        "name": np.arange(n, dtype=np.int32),
        "node_type": np.full(n, int(NodeType.NETWORK), np.int8),
        "category": np.full(n, int(Category.COLLECTIVE), np.int8),
        "start": np.array([0.0, 20.0, 20.0, 0.0]),
        "dur": np.full(n, 10.0),
        "event": np.arange(n, dtype=np.int64),
        "msg_bytes": np.full(n, 4096.0),
        "group_size": np.full(n, -1, np.int32),
        "coll_kind": np.full(n, ALL_REDUCE, np.int8),
    }
    return RawGraph(
        names=["a0", "b0", "a1", "b1"],
        nodes=nodes,
        end=nodes["start"] + nodes["dur"],
        inst=np.array([0, 1, 0, 1], np.int64),
        src=np.array([0, 3], np.int64),
        dst=np.array([1, 2], np.int64),
        kind=np.full(2, int(EdgeKind.PROGRAM_ORDER), np.int8),
        is_wait=np.zeros(2, bool),
        window_start=0.0,
        step=1,
        measured={0: 30.0, 1: 30.0},
        meta={"collectives": {}},
        seq=np.full(n, -1, np.int64),
    )


def test_crossing_instances_are_left_unmatched_not_the_step_refused():
    g = finalize(_crossed_raw())
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(g.nodes["start"])))
    dag.add_edges_from(zip(g.edges["src"].tolist(), g.edges["dst"].tolist()))
    assert nx.is_directed_acyclic_graph(dag)
    assert (g.nodes["category"] == Category.BARRIER).sum() == 1  # one instance kept, the other given up
    assert g.meta["collectives"] == {"by_seq": 0, "by_order": 1, "unmatched_ops": 2, "aligned": 0, "in_a_cycle": 1}
    # both program-order edges are kept: what was wrong was the matching, not the ranks' order
    assert (g.edges["kind"] == EdgeKind.PROGRAM_ORDER).sum() == 2


def _dlrm_instances(path) -> dict[tuple[int, int], frozenset]:
    """Per NCCL kernel of step 10, as (rank, correlation id): the set of kernels its instance pairs it with."""
    table, graphs = api.build(path, [10])
    g = graphs[0]
    barrier = g.nodes["category"] == Category.BARRIER
    sync = barrier[g.edges["src"]]
    rows = g.nodes["event"][g.edges["dst"][sync]]
    ids = list(zip(table.cols["rank"][rows].tolist(), table.cols["correlation"][rows].tolist()))
    members: dict[int, set] = {}
    for b, k in zip(g.edges["src"][sync].tolist(), ids):
        members.setdefault(b, set()).add(k)
    return {k: frozenset(v) for v in members.values() for k in v}


def test_a_real_job_missing_one_kernel_on_one_rank_keeps_every_other_pairing(tmp_path):
    """The 8-rank DLRM job (5 NCCL SendRecv and 3 all-reduce kernels per rank and step, with
    neither message sizes nor sequence numbers) with rank 3's second SendRecv kernel of step 10
    removed from its file: every other kernel pairs with the kernels it pairs with in the file as
    recorded (by the k-th SendRecv kernel alone, rank 3's last three paired with the wrong ones)."""
    full = _dlrm_instances(REAL / "dlrm_v100_8rank")
    job = tmp_path / "dlrm"
    job.mkdir()
    gone = None
    for f in sorted((REAL / "dlrm_v100_8rank").glob("*.json.gz")):
        doc = json.loads(gzip.open(f).read())
        if doc["distributedInfo"]["rank"] == 3:
            lo, hi = next((e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#10")
            sendrecv = sorted(
                (e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "SendRecv" in e["name"] and lo <= e["ts"] < hi + 50_000),
                key=lambda e: e["ts"],
            )
            gone = sendrecv[1]
            doc["traceEvents"] = [e for e in doc["traceEvents"] if e is not gone]
        with gzip.open(job / f.name, "wt") as fh:
            json.dump(doc, fh)
    assert gone is not None
    missing = (3, gone["args"]["correlation"])
    assert missing in full
    cut = _dlrm_instances(job)
    assert set(cut) == set(full) - {missing}
    assert all(cut[k] == full[k] - {missing} for k in cut)


def _gloo_instances(path) -> tuple[dict[tuple[int, float], frozenset], set]:
    """Per gloo op of every step, as (rank, its start in µs since the epoch): the ops its instance
    pairs it with; and every gloo op of the steps."""
    table, graphs = api.build(path, None)
    out: dict[tuple[int, float], frozenset] = {}
    ops: set = set()
    for g in graphs:
        net = g.nodes["event"][(g.nodes["coll_kind"] >= 0) & (g.nodes["rank"] >= 0)]
        ops.update((int(r), round(float(table.t0 + t), 1)) for r, t in zip(table.cols["rank"][net], table.cols["ts"][net]))
        barrier = g.nodes["category"] == Category.BARRIER
        sync = barrier[g.edges["src"]]
        rows = g.nodes["event"][g.edges["dst"][sync]]
        ids = [(int(r), round(float(table.t0 + t), 1)) for r, t in zip(table.cols["rank"][rows], table.cols["ts"][rows])]
        members: dict[int, set] = {}
        for b, k in zip(g.edges["src"][sync].tolist(), ids):
            members.setdefault(b, set()).add(k)
        out.update({k: frozenset(v) for v in members.values() for k in v})
    return out, ops


def test_a_rank_whose_trace_starts_later_is_paired_and_analysed(tmp_path, capsys):
    """Our 8-step gloo DDP job recorded without prof.step() (its steps cut at the optimizer's
    steps), rank 0's profiler started half-way through the second iteration: its first step's
    all-reduces are not in its trace. Before, the k-th all-reduce on rank 0 paired with the k-th on
    rank 1 across the cut in the two-step window the run answer replays, and analyze refused the
    run (a dependency cycle in step 2); now the run is analysed, and every pair is two ops of one
    all-reduce in the trace as recorded."""
    src = DATA / "gloo_ddp_8steps_clean"
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        doc = json.loads(gzip.open(src / f"rank-{r}.json.gz").read())
        steps = sorted((e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
        kept = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
        if r == 0:
            cut = steps[1]["ts"] + steps[1]["dur"] / 2
            kept = [e for e in kept if e.get("ph") != "X" or e["ts"] >= cut]
        with gzip.open(job / f"rank-{r}.json.gz", "wt") as fh:
            json.dump(dict(doc, traceEvents=kept), fh)
    code, out, err = run_cli(["analyze", str(job), "--json"], capsys)  # (before: a dependency cycle in step 2's two-step window)
    assert code == 0, err
    assert len(json.loads(out)["steps"]) >= 7
    (truth, _), (cut_pairs, held) = _gloo_instances(src), _gloo_instances(job)
    # (the same op's time, read through two tables with another origin, can differ in its last digit)
    known = sorted(truth)

    def same(k: tuple[int, float]) -> tuple[int, float]:
        near = [t for t in known if t[0] == k[0] and abs(t[1] - k[1]) < 1.0]
        return near[0] if near else k

    cut_pairs = {same(k): frozenset(map(same, v)) for k, v in cut_pairs.items()}
    held = set(map(same, held))
    # no pair of two different all-reduces (of those inside the recorded ProfilerStep spans: the
    # trace as recorded has no step around the others)
    assert all(v <= truth[k] for k, v in cut_pairs.items() if k in truth)
    assert sum(k in truth for k in cut_pairs) >= 0.9 * len(cut_pairs)
    whole = {k for k, v in truth.items() if v <= held}  # the all-reduces both ranks' traces hold
    assert len(whole) >= 30 and whole <= set(cut_pairs)


def test_an_all_to_all_with_uneven_splits_is_one_collective_and_its_wait_a_wait():
    """Our 2-rank gloo job whose all_to_all_single sends uneven splits (rank 0's input holds 4,096
    elements, rank 1's 8,192: a mixture-of-experts' token exchange), rank 1 arriving late. Each
    step's two all-to-alls are one instance (by kind and size they were none: the sizes differ by
    design), the c10d call that issued each is tied to it, and rank 0's wait for rank 1 is a wait
    — as long as the raw starts say — not communication."""
    job = DATA / "own-cpu" / "alltoall_uneven"
    raw: dict[int, dict[int, tuple[float, float]]] = {}  # step -> rank -> the all-to-all's (start, end), µs since the epoch
    for r in (0, 1):
        ev = json.loads(gzip.open(job / f"rank-{r}.json.gz").read())["traceEvents"]
        for s in (e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")):
            mine = [e for e in ev if e.get("name") == "gloo:all_to_all" and s["ts"] <= e["ts"] < s["ts"] + s["dur"]]
            assert len(mine) == 1
            raw.setdefault(int(s["name"].split("#")[1]), {})[r] = (mine[0]["ts"], mine[0]["ts"] + mine[0]["dur"])
    table, graphs = api.build(job, None)
    assert len(graphs) == len(raw) == 8
    for g in graphs:
        n, e = g.nodes, g.edges
        a2a = [i for i in range(len(n["start"])) if g.names[n["name"][i]] == "gloo:all_to_all"]
        assert len(a2a) == 2
        barrier = {int(b) for b, d in zip(e["src"], e["dst"]) if d in a2a and n["category"][b] == Category.BARRIER}
        assert len(barrier) == 1, g.step  # one instance of the two
        # each rank's c10d call issued its op (the barrier takes its participants' dependencies)
        issued = e["src"][(e["dst"] == next(iter(barrier))) & (e["kind"] == EdgeKind.BACKEND)]
        assert sorted(g.names[n["name"][i]] + f"@{n['rank'][i]}" for i in issued) == ["c10d::alltoall_base_@0", "c10d::alltoall_base_@1"]
        (s0, _), (s1, _) = raw[g.step][0], raw[g.step][1]
        early = next(i for i in a2a if n["rank"][i] == (0 if s0 < s1 else 1))
        assert n["mstart"][early] - n["start"][early] == pytest.approx(abs(s1 - s0), abs=1.0), g.step  # it waited for its peer
    # the run's answer: rank 1 the straggler in every steady step, rank 0's wait for it as long as the
    # raw starts say (matched by kind and size, the all-to-alls were none: 4 of 7 steps, 0.2 ms waited)
    from bottleneck_oracle.analysis.answer import run_answer

    _, steps = api.analyze(job)
    a = run_answer(steps)
    lags = sorted(raw[k][1][0] - raw[k][0][0] for k in raw)
    assert a.straggler is not None and a.straggler.rank == 1 and a.straggler.steps == a.steady
    assert 0.9 * lags[0] <= a.straggler.wait.median_us <= 1.1 * lags[-1]

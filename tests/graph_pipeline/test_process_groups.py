"""Collectives whose trace names no process group (gloo's ops, the kernels of older traces) are
matched within the group the raw events allow, not across every rank that makes them.

The oracle is the raw trace of our own 4-rank gloo job with two parallel dimensions
(tests/data/own-cpu/fsdp_tp_gloo, ``benchmarks/record_two_dim.py``): FSDP2 over the "dp"
dimension (ranks 0+2, 1+3), tensor parallel over "tp" (ranks 0+1, 2+3), each rank's groups listed
in its ``distributedInfo.pg_config``. By construction FSDP's all-gather and reduce-scatter (a
``gloo:all_reduce`` of 1,050,112 elements) run on dp and the row-wise layer's all-reduce (64 × 512)
on tp; and a collective cannot end on one participant before another began it (read from the
JSON: in some steps each kind's calls on one pair of ranks ended before the other pair's began)."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from bottleneck_oracle.graph_pipeline.schema import Category, EdgeKind
from conftest import DATA, cached_analyses

TWO_DIM = DATA / "own-cpu" / "fsdp_tp_gloo"
RANKS = range(4)


def _raw(folder: Path) -> tuple[dict[str, set[frozenset[int]]], dict[tuple[str, str], dict[int, list[tuple[float, float]]]]]:
    """From the JSON: the groups of each description (pg_config of every rank), and per (backend
    op, Input Dims) each rank's calls (start, end) in time order."""
    groups: dict[str, set[frozenset[int]]] = {}
    calls: dict[tuple[str, str], dict[int, list[tuple[float, float]]]] = {}
    for r in RANKS:
        doc = json.loads(gzip.open(folder / f"rank-{r}.json.gz").read())
        for g in doc["distributedInfo"]["pg_config"]:
            groups.setdefault(g["pg_desc"], set()).add(frozenset(g["ranks"]))
        for e in sorted(
            (e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e["name"]).startswith("gloo:")), key=lambda e: e["ts"]
        ):
            key = (e["name"], json.dumps(e["args"]["Input Dims"]))
            calls.setdefault(key, {}).setdefault(r, []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return groups, calls


def test_the_raw_events_rule_out_one_group_of_all_ranks():
    """The premise, from the JSON alone: for the all-gather and the tensor-parallel all-reduce, in
    some step one pair's calls all ended before the other pair's began — four ranks cannot have
    been one collective there."""
    groups, calls = _raw(TWO_DIM)
    assert groups["mesh_dp"] == {frozenset({0, 2}), frozenset({1, 3})}
    assert groups["mesh_tp"] == {frozenset({0, 1}), frozenset({2, 3})}
    for key in (("gloo:all_gather", "[[525056]]"), ("gloo:all_reduce", "[[64, 512]]")):
        per = calls[key]
        n = len(per[0])
        assert all(len(per[r]) == n for r in RANKS)
        impossible = [k for k in range(n) if min(per[r][k][1] for r in RANKS) < max(per[r][k][0] for r in RANKS)]
        assert impossible, key


def test_two_dimensional_collectives_meet_within_their_groups():
    """Every barrier joins one group of the dimension the collective runs on, its members' raw
    times are possible for one collective, and each step has the all-gather and the tensor-parallel
    all-reduce of both groups (the reduce-scatter's gloo op of a pair can fall outside the step's
    window). Before: three barriers of all four ranks a step, ranks 1 and 3 made to wait for an
    all-gather of ranks 0 and 2 they never exchanged data with (the straggler "rank 0, the others
    waited up to 13 ms for it")."""
    groups, _ = _raw(TWO_DIM)
    want = {"gloo:all_gather": groups["mesh_dp"], "gloo:all_reduce": None}
    size_group = {64 * 512: groups["mesh_tp"], 1050112: groups["mesh_dp"]}
    analyses = cached_analyses(TWO_DIM)
    assert len(analyses) >= 5
    for a in analyses:
        g = a.graph
        n, e = g.nodes, g.edges
        barriers = np.flatnonzero(n["category"] == Category.BARRIER)
        seen: dict[tuple[str, int], int] = {}
        for b in barriers.tolist():
            members = e["dst"][(e["src"] == b) & (e["kind"] == EdgeKind.COLLECTIVE_SYNC)].tolist()
            ranks = frozenset(int(n["rank"][m]) for m in members)
            name = g.node_name(members[0])
            elems = int(g.nodes["msg_bytes"][members[0]] / 4)
            allowed = want[name] or size_group[elems]
            assert ranks in allowed, (g.step, name, elems, sorted(ranks))
            seen[name, elems] = seen.get((name, elems), 0) + 1
            ends = [float(n["start"][m] + n["dur"][m]) for m in members]
            starts = [float(n["start"][m]) for m in members]
            assert min(ends) >= max(starts) - 20.0, (g.step, name)
        assert seen["gloo:all_gather", 525056] == 2 and seen["gloo:all_reduce", 64 * 512] == 2, g.step


def test_a_layout_no_group_list_explains_is_said(tmp_path):
    """The same job with the groups taken out of its files: the four ranks still cannot be one
    collective, nothing in the trace says which groups they were, and loading it says so, once
    per kind and size, naming it."""
    from bottleneck_oracle import api
    from bottleneck_oracle.errors import OracleWarning

    for r in RANKS:
        doc = json.loads(gzip.open(TWO_DIM / f"rank-{r}.json.gz").read())
        del doc["distributedInfo"]["pg_config"]
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(doc))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OracleWarning)
        api.load(tmp_path)
    said = [str(w.message) for w in caught if "cannot all be one collective" in str(w.message)]
    assert any("all-gathers of 525056 elements" in s for s in said), said
    assert any("all-reduces of 32768 elements" in s for s in said), said
    assert all("no split into the trace's process groups allows them" in s for s in said)
    # and each step whose matching is impossible fails its self-check (with the groups, every step holds)
    from bottleneck_oracle.analysis.summary import StepAnalysis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        failed = [
            c for g in api.graphs(api.load(tmp_path)) for c in StepAnalysis.of(g).checks() if c.name == "collectives_meet" and not c.ok
        ]
    assert len(failed) == 6 and "before rank" in failed[0].detail, [c.detail for c in failed]  # (every step)


@pytest.mark.parametrize("folder", [DATA / "own-cpu" / "fsdp_gloo", DATA / "gloo_ddp_2rank", DATA / "own-cpu" / "tensor_parallel_gloo"])
def test_one_dimensional_jobs_are_matched_as_before(folder):
    """Jobs with one group of every rank (DDP, FSDP, tensor parallel alone): no collective is
    moved to another group, and nothing is said."""
    from bottleneck_oracle import api
    from bottleneck_oracle.errors import OracleWarning
    from bottleneck_oracle.graph_pipeline import groups

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OracleWarning)
        table = api.load(folder)
    assert not [w for w in caught if "cannot all be one collective" in str(w.message)]
    assert groups.assign(table).placed == {}


def test_a_backend_thread_is_never_a_bystander():
    """Every gloo op that starts inside its rank's ProfilerStep (read from the JSON) is a node of
    that step's graph. Before: in step 5, ranks 0 and 2 ran nothing on the thread of their
    reduce-scatter's ``gloo:all_reduce`` but the division after it (two ``aten::div_``), that
    thread was left out as a bystander, and the collective with it: the pair's reduce-scatter was
    missing, and rank 2's 9 ms wait for it read as untraced."""
    raw: dict[tuple[int, int], int] = {}
    for r in RANKS:
        ev = [e for e in json.loads(gzip.open(TWO_DIM / f"rank-{r}.json.gz").read())["traceEvents"] if e.get("ph") == "X"]
        for s in (e for e in ev if str(e["name"]).startswith("ProfilerStep#")):
            lo, hi = float(s["ts"]), float(s["ts"]) + float(s["dur"])
            raw[r, int(str(s["name"]).split("#")[1])] = sum(
                1 for e in ev if str(e["name"]).startswith("gloo:") and lo <= float(e["ts"]) < hi
            )
    checked = 0
    for a in cached_analyses(TWO_DIM):
        g = a.graph
        for r in RANKS:
            nodes = sum(1 for i in range(g.n_nodes) if g.nodes["rank"][i] == r and g.node_name(i).startswith("gloo:"))
            assert nodes == raw[r, g.step], (g.step, r)
            checked += 1
    assert checked >= 20


def test_groups_without_descriptions_are_told_apart_by_time(tmp_path):
    """The same job with every group's description "undefined" (``new_group`` without
    ``group_desc``): the dp and tp groups are one family of four overlapping pairs, which split the
    four ranks two ways; the times still allow only one split for each kind and size, the same as
    with the descriptions."""
    from bottleneck_oracle import api

    for r in RANKS:
        doc = json.loads(gzip.open(TWO_DIM / f"rank-{r}.json.gz").read())
        for g in doc["distributedInfo"]["pg_config"]:
            g["pg_desc"] = "undefined"
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = api.load(tmp_path)
    # what loading placed: the pg codes of each kind's calls split the ranks as the raw layout says
    dp, tp = {frozenset({0, 2}), frozenset({1, 3})}, {frozenset({0, 1}), frozenset({2, 3})}
    c = table.cols
    for name, elems, want in (("gloo:all_gather", 525056, dp), ("gloo:all_reduce", 64 * 512, tp), ("gloo:all_reduce", 1050112, dp)):
        rows = np.flatnonzero((np.array(table.names)[c["name"]] == name) & (c["msg_nelems"] == elems))
        by_code: dict[int, set[int]] = {}
        for row in rows.tolist():
            by_code.setdefault(int(c["pg"][row]), set()).add(int(c["rank"][row]))
        assert {frozenset(v) for v in by_code.values()} == want, (name, elems)


PIPE_DP = DATA / "own-cpu" / "pipeline_dp_gloo"


def test_a_send_s_peer_is_read_in_its_group():
    """A pipeline whose stages are also data parallel (tests/data/own-cpu/pipeline_dp_gloo,
    ``benchmarks/record_pipeline_dp.py``): ranks 0+1 and 2+3 are pipelines (``mesh_pp``), and the
    peer a ``c10d::send`` / ``c10d::recv_`` records is the peer's rank in its pipeline's group (read
    from the JSON: ranks 2 and 3 name "1" and "0"). Loaded, every call points at the other rank of
    its ``mesh_pp`` group; in every step each send pairs with a receive (a barrier per raw send)
    and none is left unmatched. Before: the 16 sends and receives of pipeline 2+3 each step were
    unmatched (read as aimed at ranks 1 and 0), ops seen on one rank only (in another recording of
    the job, the run then named "rank 1's Forward 0, 28 ms a step against 5 on its peers": stage 0)."""
    from bottleneck_oracle import api

    pipes: dict[int, list[int]] = {}
    sends: dict[int, int] = {}  # ProfilerStep number -> the sends of every rank in it (raw)
    for r in RANKS:
        doc = json.loads(gzip.open(PIPE_DP / f"rank-{r}.json.gz").read())
        (pipe,) = [g["ranks"] for g in doc["distributedInfo"]["pg_config"] if g["pg_desc"] == "mesh_pp"]
        pipes[r] = pipe
        ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        written = {e["args"]["Concrete Inputs"][2] for e in ev if e["name"] in ("c10d::send", "c10d::recv_")}
        assert written == {str(pipe.index(next(q for q in pipe if q != r)))}  # the peer's place in its group
        for s in (e for e in ev if str(e["name"]).startswith("ProfilerStep#")):
            n = int(str(s["name"]).split("#")[1])
            sends[n] = sends.get(n, 0) + sum(1 for e in ev if e["name"] == "c10d::send" and s["ts"] <= e["ts"] < s["ts"] + s["dur"])
    assert pipes[2] == [2, 3] and pipes[3] == [2, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = api.load(PIPE_DP)
    c = table.cols
    calls = np.flatnonzero(c["peer"] >= 0)
    assert len(calls) == 4 * 2 * 4 * 6  # (ranks, sends and receives, microbatches, steps)
    for row in calls.tolist():
        r = int(c["rank"][row])
        assert int(c["peer"][row]) == next(q for q in pipes[r] if q != r), row
    for a in cached_analyses(PIPE_DP):
        g = a.graph
        assert g.meta["collectives"]["unmatched_ops"] == 0, g.step
        pairs = sum(
            1 for i in np.flatnonzero(g.nodes["category"] == Category.BARRIER).tolist() if g.node_name(i).startswith("barrier:send_recv")
        )
        assert pairs == sends[g.step] == 16, g.step


def test_a_gloo_send_arrives_when_its_call_posts_it():
    """gloo posts a send's buffer inside ``c10d::send``, before the span of its ``gloo:send``
    begins (at the call's end, read from the JSON: the calls last up to 8 ms on this loaded
    machine, their gloo:send starting within 20 µs of the call's end), and the receive can be
    over by then. Every send and receive starts with its call, so no receive is modelled as
    waiting for a send that began after it ended, and the receiving thread resumes from it.
    Before: in step 2, rank 1's 37 ms receive ended 3.2 ms before rank 0's gloo:send began; it was
    modelled as waiting until then (a late peer), and 27 ms of rank 1's wait read as untraced."""
    lags = []
    for r in RANKS:
        ev = [e for e in json.loads(gzip.open(PIPE_DP / f"rank-{r}.json.gz").read())["traceEvents"] if e.get("ph") == "X"]
        calls = sorted((e for e in ev if e["name"] == "c10d::send"), key=lambda e: e["ts"])
        spans = sorted((e for e in ev if e["name"] == "gloo:send"), key=lambda e: e["ts"])
        assert len(calls) == len(spans)
        lags += [float(s["ts"]) - float(c["ts"]) - float(c["dur"]) for c, s in zip(calls, spans)]
    assert -20.0 <= min(lags) and max(lags) <= 0.0
    for a in cached_analyses(PIPE_DP):
        g = a.graph
        n = g.nodes
        for i in range(g.n_nodes):
            if g.node_name(i) in ("gloo:send", "gloo:recv"):
                assert n["mstart"][i] <= n["start"][i] + n["dur"][i] + 1e-6, (g.step, g.node_name(i), int(n["rank"][i]))
        assert g.meta["late_peers"] == 0, g.step


def test_a_receiving_thread_s_wait_is_the_receive():
    """The time a stage's thread spends in its own ``gloo:recv`` spans (read from the JSON) is on
    the critical path as the receive's wait, not as untraced time: an isend's thread that goes on
    computing (its ``gloo:send`` span open until the schedule waits for it) does not mark the pair's
    transfer done, so the receiver's resume after the recorded end counts. Summed over the six
    steps, under 15 ms of such untraced time remains (four ranks on two cores: a thread woken late).
    Before: 99 ms (29 ms in step 4: rank 1 went on 0.2 ms after posting its send, which cut the
    transfer's end 6.5 ms before rank 0's receive ended, and rank 0's resume read as 7 ms late)."""
    spans: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in RANKS:
        for e in json.loads(gzip.open(PIPE_DP / f"rank-{r}.json.gz").read())["traceEvents"]:
            if e.get("name") == "gloo:recv":
                spans.setdefault((r, int(e["tid"])), []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    inside = 0.0
    for a in cached_analyses(PIPE_DP):
        w0 = a.graph.window_start
        for s in a.segments():
            if s.kind == "untraced" and s.rank >= 0:
                lo, hi = s.start + w0, s.start + s.dur + w0
                inside += sum(max(0.0, min(hi, b) - max(lo, a_)) for a_, b in spans.get((s.rank, s.tid), []))
    assert inside < 15_000.0, inside


def _write_pairs(folder: Path, ends: dict[int, float], starts: dict[int, float], steps: int = 5) -> None:
    """Four ranks (groups: ``mesh_dp`` 0+2, 1+3; ``mesh_tp`` 0+1, 2+3), each step one all-reduce
    of 1024 floats whose gloo op starts ``starts[rank]`` and ends ``ends[rank]`` µs into the step
    (every call possible as one collective of all four: the earliest end is after the latest
    start), between two ops of the rank's main thread."""
    layout = {0: ([0, 2], [0, 1]), 1: ([1, 3], [0, 1]), 2: ([0, 2], [2, 3]), 3: ([1, 3], [2, 3])}
    for r in RANKS:
        dp, tp = layout[r]
        ev: list[dict] = []
        for k in range(steps):
            t = 1000.0 + 10_000.0 * k
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}", "pid": r, "tid": r, "ts": t, "dur": 9000.0})
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": r, "tid": r, "ts": t + 10.0, "dur": 50.0})
            call = {"Input Dims": [[[1024]], [], [], [], [], []], "Concrete Inputs": ["", "", "", "", "True", "-1"]}
            ev.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "c10d::allreduce_",
                    "pid": r,
                    "tid": r,
                    "ts": t + starts[r] - 40.0,
                    "dur": 30.0,
                    "args": call,
                }
            )
            ev.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "gloo:all_reduce",
                    "pid": r,
                    "tid": 100 + r,
                    "ts": t + starts[r],
                    "dur": ends[r] - starts[r],
                    "args": {"Input Dims": [[1024]]},
                }
            )
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": r, "tid": r, "ts": t + ends[r] + 30.0, "dur": 50.0})
        groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]}]
        groups += [
            {"pg_name": "1", "pg_desc": "mesh_dp", "pg_size": 2, "ranks": dp},
            {"pg_name": "2", "pg_desc": "mesh_tp", "pg_size": 2, "ranks": tp},
        ]
        doc = {"traceEvents": ev, "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 4, "pg_config": groups}}
        (folder / f"rank-{r}.json").write_text(json.dumps(doc))


def test_groups_whose_ends_cluster_apart_are_split():
    """Every call possible as one collective of all four ranks, but ranks 0 and 2 end together 4 ms
    before ranks 1 and 3 do, which end together too (constructed): two collectives, one per
    ``mesh_dp`` pair — ends 10 µs apart inside each pair, 4 ms across. Four ranks ending within
    300 µs of each other (a slow rank among them), or pairs as far apart inside as across, stay one
    collective of all four."""
    import tempfile

    from bottleneck_oracle import api
    from bottleneck_oracle.graph_pipeline import groups

    starts = {0: 100.0, 1: 1500.0, 2: 300.0, 3: 1700.0}
    cases = {
        "two pairs": (
            {0: 2000.0, 1: 6000.0, 2: 2010.0, 3: 6010.0},
            {"all-reduces of 1024 elements": ("mesh_dp (2 ranks)", [[0, 2], [1, 3]])},
        ),
        "one group, a slow rank": ({0: 6000.0, 1: 6010.0, 2: 6020.0, 3: 6300.0}, {}),
        "pairs apart inside": ({0: 2000.0, 1: 6000.0, 2: 6000.0, 3: 2010.0}, {}),
    }
    for name, (ends, want) in cases.items():
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _write_pairs(Path(tmp), ends, starts)
            from bottleneck_oracle.graph_pipeline.events import load_events

            table = load_events(tmp)
            assert groups.assign(table).placed == want, name
            if want:  # and the graph meets within the pairs
                bars = {frozenset(v) for v in _barrier_ranks(api.graphs(api.load(tmp))).values()}
                assert bars == {frozenset({0, 2}), frozenset({1, 3})}, name


def _barrier_ranks(graphs) -> dict[tuple[int, int], set[int]]:
    out: dict[tuple[int, int], set[int]] = {}
    for g in graphs:
        n, e = g.nodes, g.edges
        for b in np.flatnonzero(n["category"] == Category.BARRIER).tolist():
            out[g.step, b] = {int(n["rank"][m]) for m in e["dst"][(e["src"] == b) & (e["kind"] == EdgeKind.COLLECTIVE_SYNC)].tolist()}
    return out


def test_a_wait_tensor_waits_for_the_functional_collective():
    """In the FSDP × TP job only the tensor-parallel all-reduce is a functional collective (read
    from the JSON: every ``c10d::allreduce_`` of 64 × 512 lies inside a ``_c10d_functional::all_reduce``,
    no ``c10d::_allgather_base_`` inside any ``_c10d_functional::`` op): each
    ``_c10d_functional::wait_tensor`` waits on its rank's gloo all-reduce of 64 × 512. Before: on
    FSDP's all-gather, called earlier by the same thread and waited with ``work.wait()``; rank 3's
    26.6 ms wait for rank 2 in step 2 read as "host blocked in wait_tensor", its cause (rank 2 late
    at the all-reduce) off the path."""
    for r in RANKS:
        ev = [e for e in json.loads(gzip.open(TWO_DIM / f"rank-{r}.json.gz").read())["traceEvents"] if e.get("ph") == "X"]
        functional = [(e["ts"], e["ts"] + e["dur"], e["tid"]) for e in ev if str(e["name"]).startswith("_c10d_functional::all_reduce")]

        def inside(e: dict, spans: list = functional) -> bool:
            return any(a <= e["ts"] and e["ts"] + e["dur"] <= b and t == e["tid"] for a, b, t in spans)

        assert all(inside(e) for e in ev if e["name"] == "c10d::allreduce_")
        assert not any(inside(e) for e in ev if e["name"] == "c10d::_allgather_base_")
    for a in cached_analyses(TWO_DIM):
        g = a.graph
        n, e = g.nodes, g.edges
        for i in (i for i in range(g.n_nodes) if g.node_name(i) == "_c10d_functional::wait_tensor"):
            (src,) = e["src"][(e["dst"] == i) & (e["kind"] == EdgeKind.FEEDS)]
            assert g.node_name(int(src)) == "gloo:all_reduce" and n["msg_bytes"][src] == 64 * 512 * 4, (g.step, g.node_name(int(src)))
            assert n["rank"][src] == n["rank"][i]


INTERLEAVED = DATA / "own-cpu" / "pipeline_interleaved_gloo"


def test_a_receive_posted_ahead_is_no_communication_while_its_thread_computes():
    """An interleaved pipeline schedule posts a stage's receives ahead of the micro-batch that needs
    them (tests/data/own-cpu/pipeline_interleaved_gloo, ``benchmarks/record_pipeline_interleaved.py``):
    a ``gloo:recv`` span runs from its post to the thread's wait, the thread computing in between.
    Summed over the six steps, the path's send/recv time that overlaps its own thread's ops (read
    from the JSON: the thread's ``cpu_op`` events) is under 2 ms: the transfer is on the path only
    where a side sat waiting for it. Before (with each gloo op starting at its call and resumes
    read after its span, this session's first change): 57 ms, 11-16 ms of communication a step on
    the path while the threads computed; the code before both: 1.8 ms."""
    busy: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in range(2):
        for e in json.loads(gzip.open(INTERLEAVED / f"rank-{r}.json.gz").read())["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "cpu_op":
                busy.setdefault((r, int(e["tid"])), []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    overlap = 0.0
    for a in cached_analyses(INTERLEAVED):
        w0 = a.graph.window_start
        for s in a.segments():
            if s.kind == "op" and s.name in ("gloo:recv", "gloo:send"):
                lo, hi = s.start + w0, s.end + w0
                covered, reach = 0.0, lo
                for x, y in sorted(busy.get((s.rank, s.tid), [])):
                    x, y = max(x, reach), min(y, hi)
                    if y > x:
                        covered += y - x
                        reach = y
                overlap += covered
    assert overlap < 2_000.0, overlap


def test_a_large_layout_splits_without_a_search():
    """4096 ranks whose pg_config lists tensor-parallel pairs and a default group: the pairs split
    all 4096 ranks one way, read off directly (a search one group at a time went 2048 calls deep:
    past Python's recursion limit); a family of overlapping groups is searched only for small
    collectives (64 ranks or fewer), and four ranks with two overlapping pair layouts split two ways."""
    from bottleneck_oracle.graph_pipeline import groups

    n = 4096
    meta = {
        r: {"pg_config": [{"pg_desc": "default_pg", "ranks": list(range(n))}, {"pg_desc": "tp", "ranks": [r - r % 2, r - r % 2 + 1]}]}
        for r in range(n)
    }
    fams = groups.families(meta)
    assert set(fams) == {"tp (2 ranks)", "default_pg (4096 ranks)"}
    splits = groups._splits(frozenset(range(n)), fams)
    assert splits is not None and [(name, len(parts)) for name, parts in splits] == [("tp (2 ranks)", 2048)]
    small = {r: {"pg_config": [{"pg_desc": "undefined", "ranks": g} for g in ([0, 1], [2, 3], [0, 2], [1, 3]) if r in g]} for r in range(4)}
    ways = groups._splits(frozenset(range(4)), groups.families(small))
    assert ways is not None and sorted(parts for _, parts in ways) == sorted(
        [(frozenset({0, 1}), frozenset({2, 3})), (frozenset({0, 2}), frozenset({1, 3}))]
    )


def test_a_malformed_group_list_is_ignored():
    """pg_config entries that are not groups of integer ranks (nested lists, strings, booleans,
    a non-list config, a non-mapping distributedInfo) are left out, never an error."""
    from bottleneck_oracle.graph_pipeline import groups

    meta = {
        0: {"pg_config": [{"ranks": [[1], [2]]}, {"ranks": "x"}, 5, {"ranks": [True, 1]}, {"ranks": [0, 1], "pg_desc": {"a": 1}}]},
        1: {"pg_config": "nope"},
        2: "bad",
    }
    assert groups.families(meta) == {"{'a': 1} (2 ranks)": [frozenset({0, 1})]}

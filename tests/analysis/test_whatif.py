"""What-if by replay: edits select the right nodes, bulk single-node edits equal a full CPM rerun."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tests.conftest import cached_load

from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.analysis.whatif import Edit, EditedTimes, apply_edits, edited_durations, replay, single_node_makespans
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.graph_pipeline.schema import Category, EdgeKind

SAMPLE = Path(__file__).parent.parent / "data" / "gloo_ddp_2rank"


@pytest.fixture(scope="module")
def graph():
    from bottleneck_oracle.api import graphs

    return graphs(cached_load(SAMPLE))[1]


def test_bulk_single_node_edits_equal_a_cpm_rerun_each(graph):
    base = run_cpm(graph)
    rng = np.random.default_rng(0)
    ids = np.concatenate([rng.choice(graph.n_nodes, 150, replace=False), base.path[:: max(len(base.path) // 50, 1)]])
    delta = np.concatenate([rng.uniform(-3000, 8000, 150), -0.5 * graph.nodes["mdur"][base.path[:: max(len(base.path) // 50, 1)]]])
    fast = single_node_makespans(graph, ids, delta, base)
    for i, v in enumerate(ids):
        d = graph.nodes["mdur"].astype(float).copy()
        d[v] = max(d[v] + delta[i], 0.0)
        assert fast[i] == pytest.approx(run_cpm(graph, d).makespan, abs=1e-6), (v, delta[i])
    assert (fast > base.makespan + 1).any() and (fast < base.makespan - 1).any()  # both directions exercised


def test_an_edit_parses_selects_and_replays(graph):
    e = Edit.parse("name~=all_reduce,rank=1,scale=0.5")
    ids = e.select(graph)
    assert len(ids) and all("all_reduce" in graph.node_name(i) and graph.nodes["rank"][i] == 1 for i in ids)
    d, touched = edited_durations(graph, [e])
    assert np.array_equal(touched, ids) and np.allclose(d[ids], graph.nodes["mdur"][ids] * 0.5)
    base = run_cpm(graph)
    v = int(base.path[len(base.path) // 2])  # a node on the critical path: a delay shows in full
    r = replay(graph, [Edit.parse(f"id={v},delay_ms=3")], base)
    assert r.delta_us == pytest.approx(3000.0)
    slack = float(base.slack.max())
    w = int(np.argmax(base.slack))  # the node with the most slack absorbs a delay smaller than it
    assert replay(graph, [Edit(ids=(w,), delay_ms=min(slack, 10_000) / 2000)], base).delta_us == pytest.approx(0.0, abs=1e-6)


def test_an_edits_times_travel_together_and_say_what_changed(graph):
    """apply_edits gives one EditedTimes: its delta() is what the edit added (whatif's added_us),
    how large it is (the graph network's edit size), what it removed and whether it lengthens
    anything (the corrections' refusal), from one subtraction."""
    times = apply_edits(graph, [Edit.parse("name~=all_reduce,rank=1,scale=0.5"), Edit.parse("rank=0,gap=1,scale=0.0")])
    d = times.delta()
    removed = float((graph.nodes["mdur"] - times.dur).sum())
    assert removed > 0 and len(times.nodes) and len(times.edges)
    assert d.added_us == pytest.approx(-d.removed_us) and d.removed_us > removed  # the rank-0 gaps count too
    assert d.size_us == pytest.approx(d.removed_us) and not d.lengthens
    assert times.cpm().makespan <= run_cpm(graph).makespan
    changed = d.changed_nodes(graph.edges["src"])
    assert set(np.flatnonzero(changed)) >= set(times.nodes.tolist())
    unedited = EditedTimes.unedited(graph).delta()
    assert unedited.added_us == unedited.size_us == unedited.removed_us == 0.0 and not unedited.changed_nodes(graph.edges["src"]).any()
    longer = apply_edits(graph, [Edit.parse("name~=all_reduce,delay_ms=1")]).delta()
    assert longer.lengthens and longer.added_us > 0 and longer.removed_us == 0.0


@pytest.mark.parametrize(
    "text, message",
    [
        ("rank=1", "needs scale="),
        ("scale=2", "needs a selector"),
        ("name=x,speed=2", "unknown key 'speed'"),
        ("rank=one,scale=2", "bad value for rank"),
        ("junk", "is not key=value"),
    ],
)
def test_bad_edits_are_named(text, message):
    with pytest.raises(OracleError, match=message):
        Edit.parse(text)


def test_an_edit_that_selects_nothing_is_an_error(graph):
    with pytest.raises(OracleError, match="selects no node"):
        replay(graph, [Edit.parse("name=no_such_op,scale=2")])


def test_detaching_the_collectives_makes_the_ranks_independent(recorded_ddp):
    """Structural edit: nothing waits for the all-reduces any more (full overlap) -> rank 0's
    timeline no longer depends on rank 1's (the straggler): slowing rank 1 leaves it unchanged,
    while without the edit it moves rank 0's finish."""
    from bottleneck_oracle.api import build

    _, gs = build(recorded_ddp)
    g = gs[-1]
    rank0 = g.nodes["rank"] == 0
    detach = Edit.parse("cat=collective,detach=1")
    slow1 = Edit.parse("rank=1,gap=1,scale=2")  # doubles rank 1's untraced time: its 25 ms sleep
    before = replay(g, [slow1]).edited.eft[rank0].max() - run_cpm(g).eft[rank0].max()
    assert before > 10_000  # coupled: rank 0 waits for the slower rank 1
    a = replay(g, [detach]).edited
    b = replay(g, [detach, slow1]).edited
    assert np.allclose(a.eft[rank0], b.eft[rank0])  # decoupled
    assert a.makespan <= run_cpm(g).makespan + 1e-6


@pytest.fixture(scope="module")
def module_trace(tmp_path_factory) -> Path:
    """A CPU profile taken with with_stack=True: nn.Module ranges (Heavy_0, Light_0, Heavy_1) in the trace."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile

    class Heavy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 256)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    class Light(nn.Module):
        def forward(self, x):
            return x * 2

    model, x = nn.Sequential(Heavy(), Light(), Heavy()), torch.randn(64, 256)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(2):
            model(x)
    path = tmp_path_factory.mktemp("modules") / "trace.json"
    prof.export_chrome_trace(str(path))
    return path


def test_module_edits_select_the_ops_run_inside_the_module(module_trace):
    import json

    from bottleneck_oracle.api import build

    table, (g,) = build(module_trace)
    events = json.loads(module_trace.read_text())["traceEvents"]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e["name"] == "nn.Module: Heavy_1"]
    assert len(spans) == 2  # one per forward pass
    start = g.window_start + g.nodes["start"]
    end = start + g.nodes["dur"]
    inside = np.zeros(g.n_nodes, dtype=bool)
    for lo, hi in spans:
        inside |= (start >= lo - 0.5) & (end <= hi + 0.5)
    inside &= g.nodes["category"] != Category.BARRIER
    ids = Edit.parse("module=Heavy_1,scale=0").select(g, table=table)
    assert len(ids) >= 10 and np.array_equal(ids, np.flatnonzero(inside))
    assert any(g.node_name(i).startswith("aten::") for i in ids)
    assert np.array_equal(Edit.parse("module=nn.Module: Heavy_1,scale=0").select(g, table=table), ids)  # the prefix is optional
    both = Edit.parse("module=Heavy_*,scale=0").select(g, table=table)
    heavy0 = Edit.parse("module=Heavy_0,scale=0").select(g, table=table)
    assert set(both.tolist()) == set(ids.tolist()) | set(heavy0.tolist()) and not set(ids.tolist()) & set(heavy0.tolist())
    assert not set(Edit.parse("module=Light_0,scale=0").select(g, table=table).tolist()) & set(both.tolist())
    # one thread, nothing overlaps: removing the module saves its whole time as the trace records
    # it (the spans of its two forward passes): its ops, the time between two of them (its ops' and
    # ranges' own time) and the time in it before its first op and after its last
    e = g.edges
    sel = np.zeros(g.n_nodes, dtype=bool)
    sel[ids] = True
    within = sel[e["src"]] & sel[e["dst"]] & (e["kind"] == EdgeKind.PROGRAM_ORDER) & (e["weight"] > 0)
    r = replay(g, [Edit.parse("module=Heavy_1,scale=0")], table=table)
    inner = float(g.nodes["mdur"][ids].sum() + e["weight"][within].sum())
    assert within.any() and r.delta_us == pytest.approx(-sum(hi - lo for lo, hi in spans), abs=1.0)
    assert -r.delta_us > inner  # (the range's time around its ops counts too)
    half = replay(g, [Edit.parse("module=Heavy_1,scale=0.5")], table=table)
    assert half.delta_us == pytest.approx(r.delta_us / 2, abs=1.0)
    with pytest.raises(OracleError, match="module= needs the trace's ranges"):
        Edit.parse("module=Heavy_1,scale=0").select(g)


def test_whatif_command_takes_a_module_edit(module_trace, capsys):
    import json

    from tests.test_cli import run

    code, out, _ = run(["whatif", str(module_trace), "--edit", "module=Heavy_*,scale=0.5", "--no-model", "--json"], capsys)
    assert code == 0
    (row,) = json.loads(out)["steps"]
    assert row["edited_nodes"] >= 20 and row["replay"]["delta_us"] < 0
    code, _, err = run(["whatif", str(module_trace), "--edit", "module=NoSuchModule,scale=0.5", "--no-model"], capsys)
    assert code != 0 and "module=NoSuchModule selects nothing" in err and "Traceback" not in err


STRAGGLER = Path(__file__).parent.parent / "data" / "gloo_ddp_8steps_straggler"


def _own_time_from_raw(path: Path, rank: int, step: int, name: str) -> float:
    """Total own time (µs) of the ``name`` ops of a rank in a step, from the raw JSON: each op's
    duration less its direct children's on its thread (the json module, not the tool's parser)."""
    import gzip
    import json

    doc = json.load(gzip.open(path / f"rank-{rank}.json.gz"))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]
    (span,) = [e for e in ev if e["name"] == f"ProfilerStep#{step}"]
    total = 0.0
    for op in ev:
        if op["name"] != name or not span["ts"] <= op["ts"] < span["ts"] + span["dur"]:
            continue
        inside = [
            e
            for e in ev
            if e is not op
            and e["tid"] == op["tid"]
            and e.get("cat") == op.get("cat")
            and op["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= op["ts"] + op["dur"]
        ]
        direct = [
            e for e in inside if not any(p is not e and p["ts"] <= e["ts"] and e["ts"] + e["dur"] <= p["ts"] + p["dur"] for p in inside)
        ]
        total += op["dur"] - sum(e["dur"] for e in direct)
    return total


def test_a_name_edit_selects_an_enclosing_ops_own_time_as_analyze_lists_it():
    """aten::mm on a CPU run encloses other ops: analyze lists its own time between its children
    under its name. name=aten::mm,rank=1 selects exactly that time (read from the raw JSON), and
    removing it saves at most what analyze shows of it on the critical path, and something."""
    from bottleneck_oracle.analysis.segments import label
    from bottleneck_oracle.analysis.summary import StepAnalysis
    from bottleneck_oracle.analysis.whatif import own_time
    from bottleneck_oracle.api import graphs

    e = Edit.parse("name=aten::mm,rank=1,scale=0")
    for g in graphs(cached_load(STRAGGLER))[1:4]:
        assert not len(e.select(g))  # no leaf op of that name: only its own time
        own = own_time(g, e)
        assert own.instances > 0 and (g.nodes["rank"][own.nodes] == 1).all()
        assert own.own_us.sum() == pytest.approx(_own_time_from_raw(STRAGGLER, 1, g.step, "aten::mm"), abs=1.0 * own.instances)
        a = StepAnalysis.of(g)
        listed = sum(s.dur for s in a.segments() if label(s) == "aten::mm" and s.rank == 1)
        saving = -replay(g, [e]).delta_us
        assert 0 < saving <= listed + 1e-6, (g.step, saving, listed)


def test_every_edit_that_selects_nothing_is_an_error_alone_or_combined(capsys):
    from tests.conftest import run_cli

    s = str(STRAGGLER)
    code, out, err = run_cli(["whatif", s, "--edit", "name=aten::mm,rank=1,scale=0", "--no-model", "--json"], capsys)
    assert code == 0
    rows = __import__("json").loads(out)["steps"]
    assert all(r["edited_own"] > 0 and r["replay"]["delta_us"] < 0 for r in rows)
    cases = {
        "name=aten::mmm,scale=0": "name=aten::mmm selects nothing",
        "name=aten::mm,rank=7,scale=0": "rank=7 selects nothing",
        "name=gloo:all_reduce,phase=forward,scale=0": "no op matches them all",
    }
    for bad, why in cases.items():
        for edits in ([bad], ["name=aten::mm,rank=1,scale=0", bad], [bad, "rank=0,scale=0.5"]):
            code, _, err = run_cli(["whatif", s, *[x for t in edits for x in ("--edit", t)], "--no-model"], capsys)
            assert code == 2 and err.count("error:") == 1 and repr(bad) in err and why in err, (edits, err)


def test_coll_selects_the_collectives_of_a_kind_whatever_their_names():
    """``coll=all_reduce`` selects a step's all-reduces: NCCL's ``ncclKernel_AllReduce_*`` (whose
    name holds no "all_reduce": the advisor's ``name~=all_reduce`` selected none of them, and its
    all-reduce recipes were dropped on every NCCL trace), the generic kernel that names its
    collective in its args, gloo's ``gloo:all_reduce`` as ``name~=all_reduce`` does. Counted
    from the raw JSON."""
    import gzip
    import json

    from bottleneck_oracle.api import graphs, load

    path = Path(__file__).parent.parent / "data" / "real-gpu" / "ddp_v100_rank1of2_5steps.json.gz"
    ev = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]
    launch = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith("ProfilerStep#")}
    table = load(path)
    for g in graphs(table):
        lo, hi = steps[g.step]
        want = sum(
            1 for e in ev if e["name"].startswith("ncclKernel_AllReduce") and lo <= launch.get(e["args"].get("correlation"), -1) < hi
        )
        got = Edit.parse("coll=all_reduce,scale=0.5").select(g)
        assert want > 100 and len(got) == want
        assert all(g.node_name(int(i)).startswith("ncclKernel_AllReduce") for i in got)
        assert not len(Edit.parse("name~=all_reduce,scale=0.5").select(g))
    with pytest.raises(OracleError, match="coll must be one of"):
        Edit.parse("coll=allreduces,scale=0.5")
    (g,) = graphs(load(Path(__file__).parent.parent / "data" / "gloo_ddp_2rank"))[:1]
    by_kind, by_name = Edit.parse("coll=allreduce,scale=0.5").select(g), Edit.parse("name~=all_reduce,scale=0.5").select(g)
    assert len(by_kind) and list(by_kind) == list(by_name)


PIPELINING = Path(__file__).resolve().parents[1] / "data" / "own-cpu" / "pipelining_gpipe_gloo"


def _raw_parent_ops_own_us(path: Path, rank: int, step: int) -> tuple[float, float]:
    """(own time of every ``cpu_op`` of the rank in the step that has ``cpu_op`` children: its
    duration less its direct children's; the time of its ``aten::mm`` and ``aten::addmm`` ops,
    whole), from the raw JSON with the json module."""
    import gzip
    import json

    doc = json.load(gzip.open(path / f"rank-{rank}.json.gz"))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    (span,) = [e for e in doc["traceEvents"] if e.get("name") == f"ProfilerStep#{step}"]
    ev = [e for e in ev if span["ts"] <= e["ts"] < span["ts"] + span["dur"]]
    by_tid: dict = {}
    for e in ev:
        by_tid.setdefault(e["tid"], []).append(e)
    own = 0.0
    for events in by_tid.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        for k, op in enumerate(events):
            end = op["ts"] + op["dur"]
            inside = [e for e in events[k + 1 :] if e["ts"] < end and e["ts"] + e["dur"] <= end]
            direct = [
                e for e in inside if not any(p is not e and p["ts"] <= e["ts"] and e["ts"] + e["dur"] <= p["ts"] + p["dur"] for p in inside)
            ]
            if direct:
                own += op["dur"] - sum(e["dur"] for e in direct)
    matmuls = sum(e["dur"] for e in ev if e["name"] in ("aten::mm", "aten::addmm"))
    return own, matmuls


def test_a_whole_rank_edit_takes_its_parent_ops_own_time_too():
    """pipelining_gpipe_gloo (torch.distributed.pipelining, GPipe, two stages): stage 0's matmuls are
    mostly ``aten::mm`` whose own time surrounds an ``aten::resolve_conj`` child (not a leaf, so
    its time is the op's own, between its children). ``rank=0,scale=0`` (every op of rank 0) edited
    the leaves alone: it saved 1.5 of the 11.7 ms step where rank 0's matmuls take 7 ms of it and
    rank 1 waits for them. Now it takes the rank's parent ops' own time with them (the raw JSON's
    own time of every op with children, to a µs an op), and the step then saves at least 80% of
    the matmuls' time, as the raw events give it; beside a ``gap=1`` edit of the same rank (the
    straggler suggestion's pair) the own time is the gap edit's, scaled once."""
    from bottleneck_oracle.analysis.whatif import own_time, own_time_edits
    from bottleneck_oracle.api import graphs

    whole = Edit.parse("rank=0,scale=0")
    pair = [Edit.parse("rank=0,scale=0.5"), Edit.parse("rank=0,gap=1,scale=0.5")]
    for g in graphs(cached_load(PIPELINING))[1:]:
        own_raw, matmuls = _raw_parent_ops_own_us(PIPELINING, 0, g.step)
        own = own_time(g, whole)
        assert own.instances > 0 and own.own_us.sum() == pytest.approx(own_raw, abs=1.0 * own.instances), g.step
        saving = -replay(g, [whole]).delta_us
        assert saving >= 0.8 * matmuls, (g.step, saving, matmuls)
        assert own_time_edits(g, pair)[0] == 0  # (the gap edit holds it)


def test_min_bytes_leaves_small_collectives_out_of_the_compression_edit():
    """async_allreduce_gloo all-reduces four gradients a step: two weights of 8 MB and two biases of
    4 and 8 KB (the raw JSON's ``c10d::allreduce_`` Input Dims, float32). The gradient-compression
    recipe's edit halved all four, though a 4 KB all-reduce's time is its latency; its
    ``min_bytes=65536`` now selects the two the raw sizes put at 64 KiB or more in every step, and
    ``coll=all_reduce`` alone still all four; an edit giving min_bytes a bad value is an error."""
    import gzip
    import json

    from bottleneck_oracle.api import graphs
    from bottleneck_oracle.llm.retrieve import load_recipes

    path = Path(__file__).resolve().parents[1] / "data" / "own-cpu" / "async_allreduce_gloo"
    big: dict[tuple[int, int], int] = {}
    every: dict[tuple[int, int], int] = {}
    for f in sorted(path.glob("rank-*.json.gz")):
        doc = json.load(gzip.open(f))
        rank = doc["distributedInfo"]["rank"]
        ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        for s in (e for e in ev if e["name"].startswith("ProfilerStep#")):
            calls = [e for e in ev if e["name"] == "c10d::allreduce_" and s["ts"] <= e["ts"] < s["ts"] + s["dur"]]
            sizes = [4 * int(np.prod(e["args"]["Input Dims"][0][0])) for e in calls]
            key = (rank, int(s["name"].split("#")[1]))
            big[key], every[key] = sum(b >= 65536 for b in sizes), len(sizes)
    assert set(big.values()) == {2} and set(every.values()) == {4}
    (recipe,) = [r for r in load_recipes() if r.id == "dp-gradient-compression"]
    (edit,) = [Edit.parse(e) for e in recipe.edits]
    for g in graphs(cached_load(path)):
        for rank in g.ranks:
            picked = edit.select(g)
            assert int((g.nodes["rank"][picked] == rank).sum()) == big[rank, g.step], (g.step, rank)
            assert int((g.nodes["rank"][Edit.parse("coll=all_reduce,scale=0.5").select(g)] == rank).sum()) == every[rank, g.step]
    with pytest.raises(OracleError, match="min_bytes"):
        Edit.parse("coll=all_reduce,min_bytes=-1,scale=0.5")

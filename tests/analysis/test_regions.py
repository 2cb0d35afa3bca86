"""Region blame: a slowdown made of many small ops inside one range is blamed on the range.

Synthetic 2-rank CPU (gloo-style) traces written event by event: each step, both ranks run a
``forward`` range holding an inner ``block`` range of small ``aten::mm`` / ``aten::tanh`` ops,
then all-reduce (a c10d call, the gloo op on a backend thread that ends after the last rank
arrived) and resume. Rank 1 can run extra small ops inside ``block``: the step takes that much
longer (rank 0 waits at the all-reduce), and that extra time is known from the construction.
"""

from __future__ import annotations

import pytest

from bottleneck_oracle.analysis.blame import region_labels
from bottleneck_oracle.api import blame, build
from bottleneck_oracle.serial import to_json
from conftest import DATA
from synthetic_ranks import EXTRA_MM_US, EXTRA_TANH_US, MM_US, TANH_US, write_run  # noqa: F401


def _by_step(folder):
    return {r.step: r for r in blame(folder, use_model=False)}


def test_the_synthetic_ranks_are_peers_and_the_extra_ops_cost_the_step(tmp_path):
    extra = write_run(tmp_path / "run", extra_pairs=100, extra_steps=(4,))
    _, graphs = build(tmp_path / "run")
    by_step = {g.step: g for g in graphs}
    slow, normal = max(by_step[4].measured.values()), max(by_step[3].measured.values())
    assert slow - normal == pytest.approx(extra[4], rel=0.1)  # rank 0 waited for rank 1 at the all-reduce
    names = {by_step[4].names[int(i)] for i in by_step[4].regions["name"]}
    assert {"forward", "block"} <= names


@pytest.mark.parametrize("persistent", [True, False], ids=["every-step", "one-step"])
def test_extra_small_ops_in_one_range_are_blamed_on_the_range(tmp_path, persistent):
    """200 extra small ops inside ``block`` on rank 1, in every step (only the peer rank shows
    them as extra: every reference step has them too) or in step 4 alone: the top region is
    ``block`` on rank 1 (not ``forward``, which encloses it and saves the same), its saving within
    25% of the extra time, while no single op saves a fifth of it."""
    steps = tuple(range(1, 7)) if persistent else (4,)
    extra = write_run(tmp_path / "run", extra_pairs=100, extra_steps=steps)
    rows = _by_step(tmp_path / "run")
    for s in steps if persistent else (4,):
        if s == 1:
            continue  # the warm-up step: nothing special here, but not what references are made of
        b = rows[s].blame
        assert b.regions, s
        top = b.regions[0]
        assert (top.name, top.rank, top.kind) == ("block", 1, "range"), (s, b.regions[:3])
        assert top.saving_us == pytest.approx(extra[s], rel=0.25), (s, top, extra[s])
        if persistent:  # every reference step has the extra ops: only the peer rank shows the typical time
            assert top.typical_from == "peer ranks"
        assert top.dur_us - top.typical_us == pytest.approx(extra[s], rel=0.25)
        assert top.nodes >= 220
        assert "forward" not in [x.name for x in b.regions if x.rank == 1]  # the innermost of the two is reported
        best_op = max((x.saving_us for x in b.nodes), default=0.0)
        assert best_op < 0.2 * extra[s], (s, b.nodes[:3])
        d = to_json(top)
        assert {"rank", "tid", "name", "saving_us", "typical_us", "share"} <= set(d)
        assert to_json(rows[s])["regions"][0]["name"] == "block"
    if not persistent:  # the other steps have nothing to blame on a region
        for s in (2, 3, 5, 6):
            assert all(x.share < 0.03 for x in rows[s].blame.regions), (s, rows[s].blame.regions[:3])


def test_a_range_run_several_times_a_little_slower_each_time_is_one_region(tmp_path):
    """``block`` runs 4 times per step (as a stage runs once per micro-batch), 3 extra op pairs
    inside each on rank 1, in every step: each occurrence alone saves about a quarter of the extra
    time; the top region is ``block ×4`` on rank 1, saving the whole extra time within 25%, and
    neither ``forward`` (which encloses all four and saves the same) nor a single occurrence
    outranks it."""
    extra = write_run(tmp_path / "run", extra_pairs=3, extra_steps=tuple(range(1, 7)), repeats=4)
    rows = _by_step(tmp_path / "run")
    for s in (2, 3, 4, 5, 6):
        b = rows[s].blame
        top = b.regions[0]
        assert (top.name, top.rank, top.occurrences, top.typical_from) == ("block", 1, 4, "peer ranks"), (s, b.regions[:3])
        assert top.saving_us == pytest.approx(extra[s], rel=0.25), (s, top, extra[s])
        assert top.label == "block ×4" and to_json(top)["occurrences"] == 4
        labels = region_labels(b.regions)  # what the tables show: the occurrences listed too are told apart
        assert labels[0] == "block ×4" and {x for x in labels[1:] if x.startswith("block")} <= {f"block #{k}" for k in range(1, 5)}
        singles = [x.saving_us for x in b.regions if x.name == "block" and x.occurrences == 1]
        assert all(v < 0.5 * top.saving_us for v in singles), (s, b.regions[:5])
        assert "forward" not in [x.name for x in b.regions if x.rank == 1], (s, b.regions[:5])


def test_a_range_numbered_per_micro_batch_is_one_region(tmp_path):
    """The same with the range named per micro-batch as torch.distributed.pipelining names it
    (``Forward 0`` … ``Forward 3``: the number after a space): the top region is the family
    ``Forward *`` on rank 1, its four occurrences, saving the whole extra time within 25% (before:
    the space was no separator, the four were four regions, the top one saving about a quarter)."""
    extra = write_run(tmp_path / "run", extra_pairs=3, extra_steps=tuple(range(1, 7)), repeats=4, block="Forward {i}")
    rows = _by_step(tmp_path / "run")
    for s in (2, 3, 4, 5, 6):
        top = rows[s].blame.regions[0]
        assert (top.name, top.rank, top.occurrences) == ("Forward *", 1, 4), (s, rows[s].blame.regions[:3])
        assert top.saving_us == pytest.approx(extra[s], rel=0.25), (s, top, extra[s])


def test_a_range_only_one_rank_runs_is_typically_absent(tmp_path):
    """Rank 1 runs a ``log_metrics`` range of extra ops in every step that rank 0 never runs: its
    typical time is 0 (absent on the peer), so it is blamed with its whole time."""
    extra = write_run(tmp_path / "run", extra_pairs=60, extra_steps=tuple(range(1, 7)), extra_range="log_metrics")
    rows = _by_step(tmp_path / "run")
    for s in (3, 5):
        top = rows[s].blame.regions[0]
        assert (top.name, top.rank, top.typical_us, top.typical_from) == ("log_metrics", 1, 0.0, "peer ranks"), rows[s].blame.regions[:3]
        assert top.saving_us == pytest.approx(extra[s], rel=0.25)


def test_no_region_is_blamed_on_a_clean_run(tmp_path):
    """Both ranks run the same ops (3% noise per op): no region saves more than 2% of the step."""
    write_run(tmp_path / "run", steps=8, seed=3)
    rows = _by_step(tmp_path / "run")
    assert len(rows) == 8
    for s, r in rows.items():
        assert all(x.share < 0.02 for x in r.blame.regions), (s, r.blame.regions[:3])


def test_the_recorded_straggler_is_blamed_on_its_forward_range():
    """gloo_ddp_8steps_straggler: rank 1 sleeps 20 ms inside ``forward`` in every step (untraced
    Python, tests/data/README.md). Every step's top region is ``forward`` on rank 1, typical time
    from the peer rank (every step has the sleep), and it saves most of the sleep."""
    rows = blame(DATA / "gloo_ddp_8steps_straggler", use_model=False)
    assert len(rows) == 8
    for r in rows:
        top = r.blame.regions[0]
        assert (top.name, top.rank, top.typical_from) == ("forward", 1, "peer ranks"), (r.step, r.blame.regions[:3])
        assert 8_000 < top.saving_us < 22_000, (r.step, top)


def test_a_region_holds_the_ops_inside_it_and_survives_save_and_load(tmp_path):
    """The graph's regions: ``block`` on rank 1 holds its 20 regular and 200 extra ops (the
    consecutive leaves of its thread between its start and end) and nothing else; saved and
    loaded, the regions are the same."""
    from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph

    write_run(tmp_path / "run", steps=3, extra_pairs=100, extra_steps=(2,))
    _, graphs = build(tmp_path / "run")
    g = next(h for h in graphs if h.step == 2)
    rg, n = g.regions, g.nodes
    (j,) = [i for i in range(len(rg["name"])) if g.names[rg["name"][i]] == "block" and rg["rank"][i] == 1]
    inside = range(int(rg["first"][j]), int(rg["last"][j]) + 1)
    assert len(inside) == 220 and rg["is_range"][j]
    assert {g.node_name(i) for i in inside} == {"aten::mm", "aten::tanh"}
    assert all(rg["start"][j] <= n["start"][i] and n["start"][i] + n["dur"][i] <= rg["end"][j] + 1e-6 for i in inside)
    on_thread = (n["rank"] == 1) & (n["tid"] == rg["tid"][j]) & ~n["on_gpu"]
    within = (n["start"] >= rg["start"][j]) & (n["start"] < rg["end"][j])
    assert int((on_thread & within).sum()) == 220
    g.save(tmp_path / "g.npz")
    h = ExecutionGraph.load(tmp_path / "g.npz")
    assert set(h.regions) == set(rg) and all((h.regions[k] == rg[k]).all() for k in rg)

"""EventTable.share: the table moved into memory shared with forked step workers, its rows laid out
step by step. The oracle is the same table as loaded (not shared): every graph, every fact and
the whole ``analyze --json`` must come out the same; and a forked worker must read only its own
step's part of the table (counted from the kernel's page table, /proc/self/pagemap)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from bottleneck_oracle.analysis import stepwise
from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.api import load
from bottleneck_oracle.graph_pipeline.builder import build_graph, checked_steps
from bottleneck_oracle.graph_pipeline.facts import step_facts
from bottleneck_oracle.graph_pipeline.window import select_window
from conftest import DATA, PUBLIC, run_cli

TRACES = [DATA / "gloo_ddp_10steps_injected", PUBLIC / "sampled_128rank", PUBLIC / "diff_control_rank3of8.json.gz"]


def _same_graph(a, b, layout: np.ndarray) -> None:
    for k in a.nodes:
        got = b.nodes[k]
        if k == "event":  # rows of the shared table: the row each had as read
            got = np.where(got >= 0, layout[np.maximum(got, 0)], -1)
        assert np.array_equal(a.nodes[k], got, equal_nan=True), k
    for k in a.edges:
        assert np.array_equal(a.edges[k], b.edges[k]), k
    ca, cb = run_cpm(a), run_cpm(b)
    assert ca.makespan == cb.makespan
    assert np.array_equal(ca.path, cb.path)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_a_shared_table_builds_the_same_graphs_and_facts(path):
    plain, shared = load(path), load(path)
    shared.share()
    steps = checked_steps(plain, None)
    assert steps and shared.layout is not None
    assert sorted(shared.layout.tolist()) == list(range(len(plain)))  # a permutation of the rows
    assert not np.array_equal(shared.layout, np.arange(len(plain)))  # (the rows did move: the test tests something)
    shared.drop_caches()
    shared.share()  # a second time (another command over the same table): the look-ups made again move, the rows stay
    if len(plain.flows["ts"]):  # the flow endpoints laid out step by step too, the order read kept
        layout = shared.flow_layout
        assert layout is not None
        assert sorted(layout.tolist()) == list(range(len(plain.flows["ts"])))
        for k, v in plain.flows.items():
            assert np.array_equal(shared.flows[k], v[layout])
    for n in steps:
        rows = select_window(shared, n)[0]
        assert rows.max() - rows.min() + 1 == len(rows)  # one step's rows: one run of the table
        for span in (1, 2) if n != steps[-1] else (1,):  # a window over two steps: rows of two runs, in the order read
            _same_graph(build_graph(plain, n, None, span), build_graph(shared, n, None, span), shared.layout)
        assert step_facts(plain, n).to_dict() == step_facts(shared, n).to_dict()
        assert np.array_equal(shared.layout[rows], select_window(plain, n)[0])  # the same events, in the same order
        for c in ("ts", "dur", "name", "correlation"):
            assert np.array_equal(shared.cols[c][rows], plain.cols[c][shared.layout[rows]], equal_nan=True)
    shared.drop_caches()  # look-ups made again on the new layout break ties in the order read, as before
    for n in steps[:2]:
        _same_graph(build_graph(plain, n), build_graph(shared, n), shared.layout)


def test_the_comparison_above_reaches_forward_backward_edges():
    """(The graphs compared above have fwdbwd edges: the flows' layout is exercised.)"""
    from bottleneck_oracle.graph_pipeline.schema import EdgeKind

    table = load(TRACES[0])
    table.share()
    g = build_graph(table, checked_steps(table, None)[1])
    assert int((g.edges["kind"] == EdgeKind.FWD_BWD).sum()) > 10


def test_forked_workers_over_a_shared_table_answer_as_one_process(monkeypatch, capsys, tmp_path):
    path = str(DATA / "gloo_ddp_10steps_injected")
    code, alone, _ = run_cli(["analyze", path, "--json", "--perfetto", str(tmp_path / "alone.json")], capsys)
    assert code == 0
    shared = []
    original = stepwise.EventTable.share

    def share(table):
        shared.append(len(table))
        original(table)

    monkeypatch.setattr(stepwise, "PARALLEL_EVENTS", 0)  # fork the steps' workers even for a small table
    monkeypatch.setattr(stepwise.EventTable, "share", share)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    code, forked, _ = run_cli(["analyze", path, "--json", "--perfetto", str(tmp_path / "forked.json")], capsys)
    assert code == 0 and shared  # (it did go through share)
    assert forked.replace("forked.json", "alone.json") == alone
    # the critical path marked in the trace: the shared table's rows map back to the events read
    assert (tmp_path / "forked.json").read_bytes() == (tmp_path / "alone.json").read_bytes()


def _present_share(a: np.ndarray) -> float:
    """The share of ``a``'s pages present in this process's page table."""
    start = a.__array_interface__["data"][0] // 4096
    n = (a.nbytes + 4095) // 4096
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(start * 8)
        entries = np.frombuffer(f.read(n * 8), dtype=np.uint64)
    return float(((entries >> np.uint64(63)) & np.uint64(1)).mean())


def _worker_reads(table, step: int) -> dict[str, float]:
    """In a forked child: build one step's graph, then the share of each column's pages it holds."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            build_graph(table, step)
            out = ",".join(f"{k}={_present_share(table.cols[k]):.4f}" for k in ("ts", "rank", "tid"))
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        text = fh.read()
    os.waitpid(pid, 0)
    return {k: float(v) for k, v in (x.split("=") for x in text.split(","))}


@pytest.mark.skipif(not Path("/proc/self/pagemap").exists() or sys.platform != "linux", reason="needs Linux's pagemap")
def test_a_forked_worker_of_a_shared_table_reads_only_its_steps_pages(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from synth_trace import generate

    info = generate(tmp_path, events=300_000, ranks=32)  # 4 steps; a rank's step is far less than the kernel's 16-page read
    assert info["steps"] == 4
    table = load(tmp_path)
    step = checked_steps(table, None)[1]
    inherited = _worker_reads(table, step)  # control: fork copies the page table of private memory, every page present
    assert min(inherited.values()) > 0.95
    table.share()
    own = _worker_reads(table, step)
    # columns read at the window's rows: about a quarter, its own step's (a rank's rows of one step,
    # 17 kB, are fewer than the kernel maps at a time, 64 kB: laid out rank by rank they would all
    # be read); ``ts`` is also read at a few rows of every step (each rank's long host ops, the
    # device work queued before the step), 64 kB each time
    assert own["rank"] < 0.45 and own["tid"] < 0.45, own
    assert own["ts"] < 0.75, own


def test_the_arena_copies_values_once_each_in_places_of_their_own():
    from concurrent.futures import ThreadPoolExecutor

    from bottleneck_oracle.graph_pipeline.arrays import SharedArena

    rng = np.random.default_rng(0)
    cols = {k: rng.random(50_000) for k in "abcdefgh"}
    expect = {k: v.copy() for k, v in cols.items()}
    perm = rng.permutation(50_000)
    arena = SharedArena(2 * SharedArena.size_of(cols))
    with ThreadPoolExecutor(4) as pool:  # takes from several threads: each gets a place of its own
        taken = dict(zip(cols, pool.map(lambda k: arena.take(cols[k], perm), list(cols))))
    for k, v in taken.items():
        assert np.array_equal(v, expect[k][perm])
    tree = {"x": (cols["a"], np.arange(10)), "y": [taken["b"]]}
    moved = arena.move(tree)
    assert moved is tree and np.array_equal(tree["x"][0], expect["a"])
    assert tree["y"][0] is taken["b"]  # already in the arena: not copied again
    assert tree["x"][1].base is None  # too small to be worth a move: left where it was
    tree["x"][0][0] = -1.0  # a copy: the original is untouched
    assert cols["a"][0] == expect["a"][0]


def test_span_positions_and_read_order_against_plain_loops():
    from bottleneck_oracle.graph_pipeline.arrays import in_read_order, span_positions

    rng = np.random.default_rng(1)
    group = rng.integers(0, 5, 3000).astype(np.int32)
    value = np.round(rng.random(3000) * 100, 1)  # (ties, and values on the spans' edges)
    order = np.lexsort((value, group))
    g_s, v_s = group[order], value[order]
    spans = [(int(rng.integers(0, 6)), float(lo), float(lo + rng.integers(0, 30))) for lo in np.round(rng.random(200) * 90, 1)]
    for side in ("left", "right"):
        for (g, lo, hi), (a, b) in zip(spans, span_positions(g_s, v_s, spans, end_side=side)):
            inside = (g_s == g) & (v_s >= lo) & ((v_s < hi) if side == "left" else (v_s <= hi))
            assert set(range(a, b)) == set(np.flatnonzero(inside).tolist())
    layout = rng.permutation(3000)
    idx = rng.choice(3000, 400, replace=False)
    assert in_read_order(idx, None).tolist() == sorted(idx.tolist())
    assert in_read_order(idx, layout).tolist() == sorted(idx.tolist(), key=lambda i: layout[i])

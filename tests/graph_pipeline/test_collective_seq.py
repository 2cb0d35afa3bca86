"""Collectives matched across ranks by (process group, sequence number) where the trace has
them: one collective missing from one rank's trace leaves the others matched right; so does
matching by order, which aligns the ranks' sequences. The rule used is reported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from bottleneck_oracle import api
from bottleneck_oracle.graph_pipeline.schema import EdgeKind

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from synth_trace import generate  # noqa: E402

DROP_RANK, DROP_STEP = 2, 1


def _write(src: Path, dst: Path, with_seq: bool) -> dict[tuple[int, int], int]:
    """Copy the synthetic job with the true sequence number of each collective (per rank, in
    issue order) on its record_param_comms op and NCCL kernel when ``with_seq``; rank 2's trace
    loses the second collective of step 1 (both events). Returns (rank, External id) -> seq."""
    dst.mkdir(parents=True)
    truth = {}
    for f in sorted(src.glob("rank-*.json")):
        doc = json.loads(f.read_text())
        rank = doc["distributedInfo"]["rank"]
        steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
        comms = sorted((e for e in doc["traceEvents"] if e.get("name") == "record_param_comms"), key=lambda e: e["ts"])
        seq_of = {e["args"]["External id"]: k for k, e in enumerate(comms)}
        truth.update({(rank, x): k for x, k in seq_of.items()})
        lo, hi = steps[DROP_STEP]
        dropped = [e["args"]["External id"] for e in comms if lo <= e["ts"] < hi][1] if rank == DROP_RANK else None
        kept = []
        for e in doc["traceEvents"]:
            x = e.get("args", {}).get("External id")
            if x in seq_of and "Collective name" in e["args"]:
                if x == dropped:
                    continue
                if with_seq:
                    e["args"]["Seq"] = seq_of[x]
            kept.append(e)
        doc["traceEvents"] = kept
        (dst / f.name).write_text(json.dumps(doc))
    return truth


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq")
    generate(root / "src", events=30_000, ranks=4)
    truth = _write(root / "src", root / "seq", True)
    _write(root / "src", root / "order", False)
    return root, truth


def _instances(path: Path, truth: dict) -> tuple[list[list[int]], dict]:
    """Per barrier of step 1, the true sequence numbers of its participants; the step's report."""
    table, graphs = api.build(path, [DROP_STEP])
    g = graphs[0]
    e = g.edges
    sync = e["kind"] == EdgeKind.COLLECTIVE_SYNC
    out: dict[int, list[int]] = {}
    for b, n in zip(e["src"][sync].tolist(), e["dst"][sync].tolist()):
        row = int(g.nodes["event"][n])
        out.setdefault(b, []).append(truth[(int(table.cols["rank"][row]), int(table.cols["ext_id"][row]))])
    return [sorted(v) for v in out.values()], g.meta["collectives"]


def test_sequence_numbers_match_exactly(job):
    root, truth = job
    groups, report = _instances(root / "seq", truth)
    assert all(len(set(seqs)) == 1 for seqs in groups)  # every instance is one collective
    assert sorted(len(s) for s in groups) == [3, 4, 4, 4]  # the one rank 2 lacks has 3 participants
    assert report == {"by_seq": 4, "by_order": 0, "unmatched_ops": 0, "aligned": 0, "in_a_cycle": 0}


def test_order_matching_aligns_the_ranks_sequences_and_says_so(job):
    """Without sequence numbers, the ranks' sequences are aligned: rank 2's missing collective
    leaves a gap in its sequence and every other op pairs with its own instance (matching the
    k-th op of a kind and size on every rank paired rank 2's later ops with the wrong one)."""
    root, truth = job
    groups, report = _instances(root / "order", truth)
    assert all(len(set(seqs)) == 1 for seqs in groups)
    assert sorted(len(s) for s in groups) == [3, 4, 4, 4]
    assert report == {"by_seq": 0, "by_order": 4, "unmatched_ops": 0, "aligned": 1, "in_a_cycle": 0}


def test_report_in_json_and_terminal(job, capsys):
    from conftest import run_cli

    root, _ = job
    code, out, _ = run_cli(["analyze", str(root / "seq"), "--step", str(DROP_STEP), "--json"], capsys)
    assert code == 0 and json.loads(out)["steps"][0]["collective_matching"] == {
        "by_seq": 4,
        "by_order": 0,
        "unmatched_ops": 0,
        "aligned": 0,
        "in_a_cycle": 0,
    }
    code, out, _ = run_cli(["analyze", str(root / "seq"), "--step", str(DROP_STEP)], capsys)
    assert "matched 4 by sequence number, 0 by order, 0 ops unmatched" in " ".join(out.split())


def test_seq_read_from_string_and_number():
    from bottleneck_oracle.graph_pipeline.events import _Builder

    b = _Builder()
    sparse = {k: ([], []) for k in ("peer", "msg_nelems", "group_size", "pg", "elem_bytes", "seq")}
    for row, v in enumerate([7, "12", "x", -1, True, 2**70]):
        b._comm_args(sparse, row, {"Seq": v}, "record_param_comms")
    assert sparse["seq"] == ([0, 1], [7, 12])
    assert np.all(np.array(sparse["seq"][1]) >= 0)

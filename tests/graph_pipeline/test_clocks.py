"""Clocks of different hosts aligned from collective ends: a known offset is recovered and
the analysis of the shifted set equals the unshifted one's; no false alarm on one-host runs."""

from __future__ import annotations

import gzip
import json
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from bottleneck_oracle import api
from bottleneck_oracle.config import Config, GraphConfig
from bottleneck_oracle.errors import ConfigError, OracleWarning
from bottleneck_oracle.graph_pipeline import clocks
from bottleneck_oracle.graph_pipeline.events import load_events
from conftest import DATA, PUBLIC, REAL, run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from synth_trace import generate  # noqa: E402

OFFSET_US = 3000.0


def _shift_copy(src: Path, dst: Path, ranks: set[int], offset: float) -> Path:
    """The traces of ``src`` with every timestamp of ``ranks`` moved by ``offset`` µs: what a
    host whose clock runs ``offset`` ahead would have recorded."""
    dst.mkdir(parents=True)
    for f in sorted(src.glob("*.json*")):
        doc = json.loads(gzip.open(f).read() if f.name.endswith(".gz") else f.read_bytes())
        info = doc.get("distributedInfo") or {"rank": int(f.name.split(".")[0].split("-")[-1])}
        rank = info["rank"]
        if rank in ranks:
            for e in doc["traceEvents"]:
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = e["ts"] + offset
        (dst / f.name.removesuffix(".gz")).write_text(json.dumps(doc))
    return dst


def _answers(path: Path, ranks_per_host: int) -> list[tuple]:
    cfg = Config(graph=GraphConfig(ranks_per_host=ranks_per_host))
    _, analyses = api.analyze(path, None, cfg)
    out = []
    for a in analyses:
        d = a.to_dict(5)
        out.append((d["step"], d["measured_us"], d["step_time_us"], (d["straggler"] or {}).get("rank")))
    return out


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory) -> tuple[Path, Path]:
    """A synthetic 4-rank GPU job (rank 3 the straggler), ranks 2-3 on a second host whose
    clock runs 3 ms ahead."""
    root = tmp_path_factory.mktemp("hosts")
    generate(root / "one_clock", events=30_000, ranks=4)
    return root / "one_clock", _shift_copy(root / "one_clock", root / "two_clocks", {2, 3}, OFFSET_US)


def test_offset_between_hosts_recovered(two_hosts):
    _, shifted = two_hosts
    table = load_events(shifted)
    report = clocks.align(table, clocks.hosts_by_block(table.ranks, 2))
    assert [h.ranks for h in report.hosts] == [[0, 1], [2, 3]]
    assert report.hosts[0].offset_us == 0.0
    assert abs(report.hosts[1].offset_us - OFFSET_US) < 50.0
    assert report.hosts[1].instances >= 4
    assert min(table.cols["ts"]) == 0.0  # times stay relative to the earliest event


def test_aligned_answers_equal_the_one_clock_answers(two_hosts):
    one_clock, shifted = two_hosts
    truth = _answers(one_clock, 0)
    assert len(truth) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OracleWarning)
        skewed = _answers(shifted, 0)
    assert [s[2:] for s in skewed] != [s[2:] for s in truth]  # the offset does harm (a step time that is not)...
    aligned = _answers(shifted, 2)
    for a, t in zip(aligned, truth, strict=True):  # ...and aligning undoes it
        assert a[0] == t[0] and a[1] == pytest.approx(t[1], abs=1.0) and a[3] == t[3]
        assert a[2] == pytest.approx(t[2], abs=50.0)


def test_unaligned_offset_is_named_in_a_warning(two_hosts):
    _, shifted = two_hosts
    with pytest.warns(OracleWarning, match=r"rank 2 \+3\.00 ms, rank 3 \+3\.00 ms.*--ranks-per-host"):
        table = api.load(shifted)
    assert table.clocks is not None and table.clocks.hosts == []


def test_real_dlrm_with_a_second_host(tmp_path):
    """The real 8-rank DLRM job, ranks 4-7 moved 3 ms: recovered from its 3 NCCL collectives;
    step time and straggler (rank 7) as recorded."""
    src = REAL / "dlrm_v100_8rank"
    shifted = _shift_copy(src, tmp_path / "dlrm", {4, 5, 6, 7}, OFFSET_US)
    table = api.load(shifted, ranks_per_host=4)
    host = table.clocks.hosts[1]
    assert host.ranks == [4, 5, 6, 7] and abs(host.offset_us - OFFSET_US) < 50.0
    truth, aligned = _answers(src, 0), _answers(shifted, 4)
    assert truth[0][3] == aligned[0][3] == 7
    assert aligned[0][2] == pytest.approx(truth[0][2], abs=50.0)


def test_cli_reports_the_offsets(two_hosts, capsys):
    _, shifted = two_hosts
    code, out, _ = run_cli(["analyze", str(shifted), "--ranks-per-host", "2"], capsys)
    assert code == 0 and re.search(r"Clocks: 2 host\(s\), aligned to host 0: host 1 \(ranks 2-3\) \+3\.0\d\d ms", out)
    code, out, _ = run_cli(["analyze", str(shifted), "--ranks-per-host", "2", "--json"], capsys)
    hosts = json.loads(out)["clocks"]["hosts"]
    assert code == 0 and [h["ranks"] for h in hosts] == [[0, 1], [2, 3]] and abs(hosts[1]["offset_us"] - OFFSET_US) < 50


@pytest.mark.parametrize(
    "folder",
    ["gloo_ddp_2rank", "gloo_ddp_8steps_clean", "gloo_ddp_8steps_straggler", "gloo_ddp_10steps_injected", "real-gpu/dlrm_v100_8rank"],
)
def test_no_false_alarm_on_one_host(folder):
    """Every multi-rank fixture was recorded on one host: no clock warning."""
    table = load_events(DATA / folder)
    assert clocks.align(table).warnings == []


def test_ranks_per_host_is_validated():
    with pytest.raises(ConfigError, match="ranks_per_host"):
        GraphConfig(ranks_per_host=-1)


def test_a_host_with_no_shared_collective_is_left_as_recorded():
    """Two ranks that ran only send/recv (no symmetric collective): nothing to align from; said so."""
    table = load_events(PUBLIC / "sampled_128rank")
    before = table.cols["ts"].copy()
    report = clocks.align(table, clocks.hosts_by_block(table.ranks, 1))
    assert [h.offset_us for h in report.hosts] == [0.0, 0.0] and report.hosts[1].instances == 0
    assert any("shares no collective" in w for w in report.warnings)
    assert np.array_equal(table.cols["ts"], before)

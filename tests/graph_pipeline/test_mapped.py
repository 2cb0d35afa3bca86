"""Large traces are read through a file mapping and scanned a block at a time, giving scanned
pages back: the table is the one the in-memory read gives, plain or gzip, and bad input is the
same one-line error."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline import events, scan
from bottleneck_oracle.graph_pipeline.events import load_events
from conftest import PUBLIC, REAL, SAMPLE


def _same(a, b) -> None:
    assert a.names == b.names and a.ranks == b.ranks and len(a) == len(b)
    for k in a.cols:
        assert np.array_equal(a.cols[k], b.cols[k], equal_nan=a.cols[k].dtype.kind == "f"), k
    assert [(s.rank, s.number, s.start, s.end) for s in a.steps] == [(s.rank, s.number, s.start, s.end) for s in b.steps]
    assert a.thread_names == b.thread_names


@pytest.mark.parametrize(
    "path", [SAMPLE, REAL / "dlrm_v100_8rank", PUBLIC / "cuda_event_sync_multistream_1gpu.json.gz"], ids=lambda p: p.name
)
def test_mapped_read_gives_the_same_table(path, tmp_path, monkeypatch):
    in_memory = load_events(path)
    released = []
    monkeypatch.setattr(events, "MAP_BYTES", 0)
    monkeypatch.setattr(scan, "SCAN_BLOCK", 97)  # many blocks, boundaries everywhere
    original = events.MappedTrace.release
    monkeypatch.setattr(events.MappedTrace, "release", lambda self, end: released.append(end) or original(self, end))
    _same(load_events(path), in_memory)
    assert released  # pages were given back block by block
    if path.is_file():  # the same trace uncompressed: mapped as it is
        plain = tmp_path / "plain.json"
        plain.write_bytes(gzip.open(path).read())
        _same(load_events(plain), in_memory)


def test_mapped_bad_input_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "MAP_BYTES", 0)
    monkeypatch.setattr(scan, "SCAN_BLOCK", 50)
    good = gzip.open(SAMPLE / "rank-0.json.gz").read()
    for name, data in {"cut.json.gz": gzip.compress(good)[:-2000], "cut.json": good[: len(good) // 2]}.items():
        f = tmp_path / name  # (cut short: read up to the last whole event, and said, on the mapped road too)
        f.write_bytes(data)
        with pytest.warns(match="ends inside its events"):
            assert len(load_events(f)) > 0, name
    cases = {
        "cut_before_any_event.json": good[:40],
        "empty.json.gz": gzip.compress(b""),
        "garbage.json.gz": b"\x1f\x8b" + b"\x00" * 100,
    }
    for name, data in cases.items():
        f = tmp_path / name
        f.write_bytes(data)
        with pytest.raises(TraceError) as exc:
            load_events(f)
        assert str(f) in str(exc.value) and "\n" not in str(exc.value), name


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("mapped", [False, True], ids=["in-memory", "mapped"])
@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut"])
def test_a_tail_of_zero_bytes_is_read_past_and_said(cut, mapped, packed, tmp_path, monkeypatch, recwarn, capsys):
    """A file system that failed (a node lost, a full disk) can leave the end of a file it had
    grown as zeros: ddp_v100's trace, whole or cut at 70% of its bytes as a job killed while
    writing it leaves it, followed by 1 MiB and 7 bytes of zeros, plain or gzip (the stream cut).
    It was refused ('not valid JSON', or of a whole plain one 'nested too deep'; gzip inflated the
    zeros after a cut stream into garbage); it reads as the same bytes without the zeros do, with
    a warning that counts them, and --perfetto copies its events (a cut trace's too: refused
    before as 'changed since it was analysed')."""
    import json

    from conftest import run_cli

    text = gzip.open(REAL / "ddp_v100_rank1of2_5steps.json.gz").read()
    if packed:  # a gzip file: its stream cut (gzip inflated the zeros after the cut into garbage)
        data = gzip.compress(text, mtime=0)
        data = data[: int(len(data) * 0.7)] if cut else data
    else:
        data = text[: int(len(text) * 0.7)] if cut else text
    (tmp_path / "plain.json").write_bytes(data)
    (tmp_path / "zeros.json").write_bytes(data + bytes(2**20 + 7))
    if mapped:
        monkeypatch.setattr(events, "MAP_BYTES", 0)
    _same(load_events(tmp_path / "zeros.json"), load_events(tmp_path / "plain.json"))
    said = [str(w.message) for w in recwarn if "zero bytes" in str(w.message)]
    assert len(said) == 1 and f"{2**20 + 7:,} zero bytes" in said[0] and "zeros.json" in said[0]
    out = tmp_path / "out.perfetto.json"
    code, _, err = run_cli(["analyze", str(tmp_path / "zeros.json"), "--perfetto", str(out)], capsys)
    assert code == 0, err
    steps = {e["name"] for e in json.loads(out.read_text())["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")}
    marks = {f"ProfilerStep#{s.number}" for s in load_events(tmp_path / "plain.json").steps}
    assert marks <= steps  # (a cut trace's steps past the cut are left out of the analysis, not of the copy)

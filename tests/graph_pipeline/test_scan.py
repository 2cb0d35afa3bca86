"""The compiled traceEvents scanner against orjson's decoding of the same bytes."""

from __future__ import annotations

import gzip
import json

import numpy as np
import orjson
import pytest

from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline import scan
from bottleneck_oracle.graph_pipeline.events import load_events
from conftest import KINETO_FIXTURES, PUBLIC


def _scan(raw: bytes):
    buf = np.frombuffer(raw, dtype=np.uint8)
    lo, hi, is_obj, _, _, err = scan.find_events(buf)
    assert err == scan.OK and lo >= 0
    err, pos, cols = scan.scan(buf, lo, hi)
    assert err == scan.OK, (err, pos)
    return cols


def _files():
    for p in KINETO_FIXTURES:
        yield from ([p] if p.is_file() else sorted(p.glob("*.json.gz")))


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: p.name)
def test_scanner_agrees_with_orjson_on_every_fixture(path):
    raw = gzip.decompress(path.read_bytes())
    events = orjson.loads(raw)["traceEvents"]
    cols = _scan(raw)
    assert len(cols["ph"]) == len(events)
    for i in range(0, len(events), max(1, len(events) // 3000)):  # a spread sample of events
        e = events[i]
        assert chr(cols["ph"][i]) == e.get("ph", "\0")[:1]
        if isinstance(e.get("ts"), (int, float)):
            assert cols["ts_i"][i] + cols["ts_f"][i] == pytest.approx(e["ts"], abs=0.5)
            assert cols["dur_i"][i] + cols["dur_f"][i] == pytest.approx(e.get("dur", 0), abs=1e-6)
        if isinstance(e.get("name"), str):
            assert orjson.loads(b'"' + raw[cols["name_lo"][i] : cols["name_hi"][i]] + b'"') == e["name"]
        for key, col in (("pid", "pid"), ("tid", "tid")):
            if isinstance(e.get(key), int):
                assert cols[col][i] == e[key]
            elif isinstance(e.get(key), str):
                assert cols[col + "_str"][i] == scan.fnv1a(json.dumps(e[key])[1:-1].encode())
        args = e.get("args") or {}
        assert cols["corr"][i] == (args["correlation"] if isinstance(args.get("correlation"), int) else -1)
        assert cols["ext"][i] == (args["External id"] if isinstance(args.get("External id"), int) else -1)
        assert orjson.loads(raw[cols["obj_lo"][i] : cols["obj_hi"][i]]) == e  # the event's byte span


def test_tricky_json(tmp_path):
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": 'caf\u00e9 "quoted" {[}]',
            "pid": "proc one",
            "tid": -3,
            "ts": 1.5e3,
            "dur": 2e-1,
            "args": {"nested": {"a": [1, {"b": "]}"}]}, "correlation": 7, "s": "\\\\", "External id": 12},
        },
        {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 1600.25, "dur": 0, "args": {}},
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 4}}, indent=2, ensure_ascii=True))
    t = load_events(p)
    assert t.ranks == [4]
    names = [t.names[c] for c in t.cols["name"]]
    assert names == ['caf\u00e9 "quoted" {[}]', "b"]
    assert t.cols["ts"].tolist() == [0.0, 100.25] and t.cols["dur"].tolist() == [0.2, 0.0]
    assert t.cols["tid"].tolist() == [-3, 1] and t.cols["pid"][0] < 0  # a string pid gets a code
    assert t.cols["correlation"][0] == 7 and t.cols["ext_id"][0] == 12


def test_array_form_trace(tmp_path):
    p = tmp_path / "a.json"
    p.write_text(json.dumps([{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 5, "dur": 1}]))
    assert len(load_events(p)) == 1


@pytest.mark.parametrize(
    "text,problem",
    [
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}, 7]}', "not an object"),
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "1", "dur": 2}]}', "no numeric ts"),
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 2}', "truncated"),
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op" "name": "a"}]}', "JSON"),
    ],
)
def test_scanner_errors_name_the_problem(tmp_path, text, problem):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(TraceError, match=problem):
        load_events(p)


def test_real_kineto_layout_parses_like_the_compact_one(tmp_path):
    doc = orjson.loads(gzip.decompress((PUBLIC / "cuda_event_sync_1gpu.json.gz").read_bytes()))
    (tmp_path / "compact.json").write_bytes(orjson.dumps(doc))
    (tmp_path / "spaced.json").write_text(json.dumps(doc, indent=4))
    a, b = load_events(tmp_path / "compact.json"), load_events(tmp_path / "spaced.json")
    assert a.names == b.names
    for k in a.cols:
        if k != "src_idx":
            assert np.array_equal(a.cols[k], b.cols[k], equal_nan=True), k


def test_a_cold_scanner_cache_is_told_at_a_terminal(tmp_path, monkeypatch):
    """The first trace command after an install compiles the scanner (about 10 s): at a terminal
    it says so; with the scanner's machine code cached, and off a terminal, it says nothing."""
    import os

    from bottleneck_oracle import cli
    from bottleneck_oracle.graph_pipeline import scan as S

    assert S.cache_is_cold(tmp_path)
    index = tmp_path / "scan.scan_events-250.py311.nbi"
    index.write_bytes(b"")
    assert not S.cache_is_cold(tmp_path)
    source = os.stat(S.__file__).st_mtime
    os.utime(index, (source - 60, source - 60))  # left by an earlier install: numba compiles again
    assert S.cache_is_cold(tmp_path)
    said: list[str] = []
    monkeypatch.setattr(cli.err, "print", lambda text, **_: said.append(str(text)))
    monkeypatch.setattr(S, "cache_is_cold", lambda folder=None: True)
    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: True, raising=False)
    cli._first_run_notice(["version"])
    cli._first_run_notice(["analyze"])
    assert len(said) == 1 and "compiling the trace scanner" in said[0]
    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: False, raising=False)
    cli._first_run_notice(["analyze"])
    assert len(said) == 1

"""The streamed Perfetto overlay equals the overlay built by decoding every event (the
reference below, written the obvious way), on one-rank and multi-rank inputs; text a strict
JSON reader refuses is refused, not copied."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from bottleneck_oracle import api
from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline.events import ancestors_of, cpu_parents
from bottleneck_oracle.report.perfetto import _pid, write_overlay
from conftest import PUBLIC, REAL, SAMPLE


def _reference(table, analyses) -> dict:
    """Every event decoded, marked, flows added: what the overlay must hold."""
    rows_cp, slack_of, flows = [], {}, []
    for a in analyses:
        ev = a.graph.nodes["event"][a.cpm.path]
        for node in a.cpm.path[ev >= 0].tolist():
            slack_of[int(a.graph.nodes["event"][node])] = float(a.cpm.slack[node])
        ev = ev[ev >= 0]
        rows_cp.append(ev)
        flows.extend(zip(ev[:-1].tolist(), ev[1:].tolist()))
    crit = ancestors_of(cpu_parents(table), np.concatenate(rows_cp))
    rank, idx = table.cols["rank"], table.cols["src_idx"]
    multi = len(table.files) > 1
    located, merged = {}, []
    marks = {(int(rank[r]), int(idx[r])) for r in crit.tolist()}
    for r, path in sorted(table.files.items()):
        raw = Path(path).read_bytes()
        doc = orjson.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)
        for i, e in enumerate(doc["traceEvents"] if isinstance(doc, dict) else doc):
            if "pid" in e:
                e["pid"] = _pid(r, e["pid"], multi)
            if e.get("ph") == "M" and e.get("name") == "process_name" and multi:
                e.setdefault("args", {})["name"] = f"rank {r}: {e.get('args', {}).get('name', '')}"
            if (r, i) in marks:
                e.setdefault("args", {})["critical"] = 1
            located[(r, i)] = e
            merged.append(e)
    for row, s in slack_of.items():
        located[(int(rank[row]), int(idx[row]))].setdefault("args", {})["slack_us"] = round(s, 3)
    for k, (a, b) in enumerate(flows):
        ea, eb = located[(int(rank[a]), int(idx[a]))], located[(int(rank[b]), int(idx[b]))]
        common = {"cat": "critical_path", "name": "critical_path", "id": 900_000_000 + k}
        merged.append({**common, "ph": "s", "pid": ea["pid"], "tid": ea["tid"], "ts": ea["ts"] + ea.get("dur", 0)})
        merged.append({**common, "ph": "f", "bp": "e", "pid": eb["pid"], "tid": eb["tid"], "ts": eb["ts"]})
    return {"traceEvents": merged, "displayTimeUnit": "ms", "bottleneckOracle": {"critical_events": int(len(crit))}}


@pytest.mark.parametrize(
    "path", [PUBLIC / "cuda_event_sync_multistream_1gpu.json.gz", SAMPLE, REAL / "dlrm_v100_8rank"], ids=lambda p: p.name
)
def test_streamed_overlay_equals_the_decoded_one(path, tmp_path):
    table, analyses = api.analyze(path)
    for gz in (False, True):
        out = write_overlay(table, analyses, tmp_path / f"o.json{'.gz' if gz else ''}")
        data = gzip.decompress(out.read_bytes()) if gz else out.read_bytes()
        got = json.loads(data)  # the strict reader Perfetto's importer resembles: valid JSON
        assert got == _reference(table, analyses)
        assert sum(1 for e in got["traceEvents"] if e.get("args", {}).get("critical") == 1) == got["bottleneckOracle"]["critical_events"]


def test_text_a_strict_reader_refuses_is_refused(tmp_path):
    doc = json.loads(gzip.open(PUBLIC / "cuda_event_sync_1gpu.json.gz").read())
    text = json.dumps(doc)
    for bad in (b'"\\ud800 lone"', b'"\xff\xfe not utf-8"'):
        raw = text.replace(
            '"traceEvents": [', '"traceEvents": [{"ph": "i", "name": ' + "X" * 4 + ', "ts": 0, "pid": 0, "tid": 0},', 1
        ).encode()
        raw = raw.replace(b'"XXXX"' if b'"XXXX"' in raw else b"XXXX", bad, 1)
        f = tmp_path / "t.json"
        f.write_bytes(raw)
        table, analyses = api.analyze(f)
        with pytest.raises(TraceError, match="not valid JSON"):
            write_overlay(table, analyses, tmp_path / "o.json")


def test_json_and_terminal_runs_write_the_same_overlay(tmp_path, capsys):
    """analyze --json --perfetto keeps only each step's critical events (its graphs are not all
    held); the overlay is the one the terminal run writes from the full analyses."""
    from conftest import run_cli

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run_cli(["analyze", str(REAL / "dlrm_v100_8rank"), "--perfetto", str(a)], capsys)[0] == 0
    code, out, _ = run_cli(["analyze", str(REAL / "dlrm_v100_8rank"), "--perfetto", str(b), "--json"], capsys)
    assert code == 0 and json.loads(out)["steps"]
    assert json.loads(a.read_bytes()) == json.loads(b.read_bytes())


def test_mapped_overlay_equals_the_decoded_one(tmp_path, monkeypatch):
    """Large traces are mapped and copied a block at a time, pages given back behind the writer."""
    from bottleneck_oracle.graph_pipeline import events
    from bottleneck_oracle.report import perfetto

    for path in (PUBLIC / "cuda_event_sync_multistream_1gpu.json.gz", REAL / "dlrm_v100_8rank"):
        table, analyses = api.analyze(path)
        monkeypatch.setattr(events, "MAP_BYTES", 0)
        monkeypatch.setattr(perfetto, "_BLOCK", 4096)
        out = write_overlay(table, analyses, tmp_path / "m.json")
        assert json.loads(out.read_bytes()) == _reference(table, analyses)
        monkeypatch.undo()


def test_the_writer_thread_hands_a_failed_write_to_the_caller():
    """_Chunks compresses and writes in a thread of its own: a write that fails there (a full
    disk) is raised in the caller's thread, and the thread is gone once the block is left."""
    from bottleneck_oracle.report.perfetto import _CHUNK, _Chunks

    class Full:
        def __init__(self) -> None:
            self.written = 0

        def write(self, b: bytes) -> int:
            if self.written:
                raise OSError(28, "No space left on device")
            self.written += len(b)
            return len(b)

    sink = Full()
    with pytest.raises(OSError, match="No space left"), _Chunks(sink) as fh:
        for _ in range(64):  # far more than the chunks queued
            fh.write(b"x" * (_CHUNK // 4))
        fh.flush()
    assert sink.written == _CHUNK and not fh._thread.is_alive()
    ok = io.BytesIO()
    with _Chunks(ok) as fh:  # in order, whole
        for i in range(3000):
            fh.write(b"%d," % i)
        fh.flush()
    assert ok.getvalue() == b"".join(b"%d," % i for i in range(3000))

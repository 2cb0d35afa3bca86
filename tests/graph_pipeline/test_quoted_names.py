"""A trace whose event names hold double quotes the profiler did not escape is read, its names as
written (events.mend_names).

PyTorch's profiler writes a Python frame's name (``with_stack=True``) as its file name, line and
function without escaping them (pytorch/pytorch#146900; still so in 2.13), so a frame of code
generated under a file name with quotes makes the whole file invalid JSON. The trace here is the
profiler's own (benchmarks/record_quoted_names.py, tests/data/own-cpu/README.md). The oracle is
its text read line by line — the ProfilerStep spans and the quoted names as the profiler wrote
them — not a JSON parse, and the name the recording script gave its code."""

from __future__ import annotations

import gzip
import hashlib
import json
import re

import numpy as np
import pytest

from bottleneck_oracle.graph_pipeline import events as E
from bottleneck_oracle.graph_pipeline.events import load_events
from conftest import DATA, run_cli

TRACE = DATA / "own-cpu" / "quoted_names_stack.json.gz"
# the recording's code, compiled under json.dumps(LOSS_CONFIG), defines loss_fn on its line 1
NAME = json.dumps({"reduction": "mean", "label_smoothing": 0.1}) + "(1): loss_fn"


def _raw_lines() -> list[str]:
    return gzip.open(TRACE, "rt").read().splitlines()


def _raw_step_spans() -> dict[int, float]:
    """Each ProfilerStep's dur, from the lines Kineto writes after its name (ts, then dur)."""
    lines, out = _raw_lines(), {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r'\s*"name": "ProfilerStep#(\d+)",', line)
        if m:
            dur = next(float(x.group(1)) for x in map(re.compile(r'\s*"dur": ([0-9.]+)').match, lines[i : i + 8]) if x)
            out[int(m.group(1))] = dur
    return out


def _raw_quoted_names() -> list[str]:
    """The names on their own line that hold a quote no backslash escapes."""
    out = []
    for line in _raw_lines():
        m = re.fullmatch(r'\s*"name": "(.*)",', line)
        if m and re.search(r'(?<!\\)"', m.group(1)):
            out.append(m.group(1))
    return out


def test_the_recording_is_the_class_a_strict_reader_refuses():
    with pytest.raises(json.JSONDecodeError):
        json.loads(gzip.open(TRACE).read())
    assert _raw_quoted_names() == [NAME] * 5  # one loss_fn frame in each of the five steps


@pytest.mark.parametrize("mapped", [False, True], ids=["in-memory", "mapped"])
def test_its_names_are_read_as_written_and_its_steps_are_the_profilers(mapped, monkeypatch):
    if mapped:  # the path of a trace of MAP_BYTES or more, mended a few KiB at a time
        monkeypatch.setattr(E, "MAP_BYTES", 1)
        monkeypatch.setattr(E, "MEND_CHUNK", 4096)
    table = load_events(TRACE)
    names = [table.names[n] for n in table.cols["name"]]
    assert names.count(NAME) == 5
    assert not any(n.startswith("{") and n != NAME for n in names)  # no name cut at its first quote
    spans = {s.number: s.span for s in table.steps}
    raw = _raw_step_spans()
    assert sorted(spans) == sorted(raw) == [2, 3, 4, 5, 6]
    for n in raw:
        assert spans[n] == pytest.approx(raw[n], abs=0.01)


def test_analyze_reads_it_says_so_and_leaves_the_file_as_it_was(tmp_path, capsys):
    before = hashlib.sha256(TRACE.read_bytes()).hexdigest()
    out = tmp_path / "trace.perfetto.json"
    code, stdout, stderr = run_cli(["analyze", str(TRACE), "--json", "--perfetto", str(out)], capsys)
    assert code == 0, stderr
    doc = json.loads(stdout)
    raw = _raw_step_spans()
    assert {s["step"]: s["measured_us"] for s in doc["steps"]} == pytest.approx(raw, abs=0.01)
    said = [w for w in doc["warnings"] if "unescaped" in w]
    assert len(said) == 1 and "5 event names" in said[0] and str(TRACE) in said[0]
    assert hashlib.sha256(TRACE.read_bytes()).hexdigest() == before
    written = json.loads(out.read_text())  # the export is strict JSON, the names in it as written
    assert sum(e.get("name") == NAME for e in written["traceEvents"]) == 5


def test_a_name_is_mended_only_between_name_and_pid_on_one_line():
    ok = b'{"ph": "X", "cat": "cpu_op", "name": "a\\"b", "pid": 1, "tid": 1, "ts": 0, "dur": 1}'
    assert E._mend_part(ok) == (ok, 0)  # an escaped quote is no stray one
    other_order = b'{"name": "a", "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0, "dur": 1}'
    assert E._mend_part(other_order) == (other_order, 0)  # keys between name and pid: not one name
    bad = b'{"ph": "X", "cat": "python_function", "name": "{"k": "v"}(3): f", "pid": 1, "tid": 1, "ts": 0, "dur": 1}'
    fixed, count = E._mend_part(bad)
    assert count == 1 and json.loads(fixed)["name"] == '{"k": "v"}(3): f'
    escaped_backslash = b'{"ph": "X", "cat": "cpu_op", "name": "a\\\\"b", "pid": 1, "tid": 1, "ts": 0, "dur": 1}'
    fixed, count = E._mend_part(escaped_backslash)  # a\\"b: the backslash is escaped, the quote is not
    assert count == 1 and json.loads(fixed)["name"] == 'a\\"b'


@pytest.mark.parametrize("where", ["before", "after"])
def test_json_bad_another_way_is_still_one_line_and_exit_2(where, tmp_path, capsys):
    """A colon missing before the quoted names or after them: one line naming the file and the
    line of the file where the colon is missing (the names' quotes escaped, that line is the
    first error wherever it lies)."""
    text = gzip.open(TRACE, "rt").read()
    first, last = text.index("loss_fn"), text.rindex("loss_fn")
    at = text.index('"ph": "X"', text.index("ProfilerStep#3") if where == "before" else last)
    line = text.count("\n", 0, at) + 1
    broken = tmp_path / "broken.json"
    broken.write_text(text[:at] + '"ph" "X"' + text[at + len('"ph": "X"') :])
    assert (at < first) == (where == "before")
    code, stdout, stderr = run_cli(["analyze", str(broken)], capsys)
    assert code == 2 and stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and str(broken) in lines[0] and "not valid JSON" in lines[0]
    assert f"line {line} " in lines[0]
    assert "unescaped quotes of 5 event names escaped" in lines[0]  # (what the line was read with)


def test_each_file_of_a_rank_folder_is_mended_as_its_own(tmp_path):
    # two ranks in a folder, each the recording: each rank's names mended as its own
    for r in (0, 1):
        (tmp_path / f"rank-{r}.json.gz").write_bytes(TRACE.read_bytes())
    table = load_events(tmp_path)
    names = np.array([table.names[n] for n in table.cols["name"]])
    for r in (0, 1):
        assert int(((names == NAME) & (table.cols["rank"] == r)).sum()) == 5
    assert sorted(table.inputs[r]["mended"][str(tmp_path / f"rank-{r}.json.gz")] for r in (0, 1)) == [5, 5]

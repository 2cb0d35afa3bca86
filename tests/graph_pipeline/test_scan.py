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
from conftest import DATA, KINETO_FIXTURES, PUBLIC


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
        # (a string of a number is that number: Ascend's msprof writes "ts": "1699529623106750.125")
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "1 µs", "dur": 2}]}', "no numeric ts"),
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "", "dur": 2}]}', "no numeric ts"),
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": " 5", "dur": 2}]}', "no numeric ts"),
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "NaN", "dur": 2}]}', "no numeric ts"),
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur"', "truncated"),  # (cut inside its first event)
        ('{"traceEvents": [{"ph": "X", "cat": "cpu_op" "name": "a"}]}', "JSON"),
    ],
)
def test_scanner_errors_name_the_problem(tmp_path, text, problem):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(TraceError, match=problem):
        load_events(p)


def test_a_ts_or_dur_written_as_a_string_of_a_number_is_that_number(tmp_path):
    """Ascend's msprof writes its timeline's times as strings to keep the ns; Perfetto reads them."""
    p = tmp_path / "strings.json"
    p.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": "1699529623106750.125", "dur": "2.5"},'
        ' {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 1699529623106753, "dur": 1}]}'
    )
    t = load_events(p)
    order = np.argsort(t.cols["ts"])
    assert [t.names[c] for c in t.cols["name"][order]] == ["a", "b"]
    assert np.diff(t.cols["ts"][order]).tolist() == [pytest.approx(2.875, abs=1e-6)]
    assert t.cols["dur"][order].tolist() == [2.5, 1.0]
    p.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": "1.5e3", "dur": "-0"},'
        ' {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 1600, "dur": 1}]}'
    )
    t = load_events(p)
    order = np.argsort(t.cols["ts"])
    assert t.cols["dur"][order].tolist() == [0.0, 1.0] and np.diff(t.cols["ts"][order]).tolist() == [100.0]


def test_a_document_cut_after_a_whole_event_keeps_its_events(tmp_path):
    p = tmp_path / "cut.json"
    p.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}, {"ph": "X", "ca')
    with pytest.warns(match="ends inside its events"):
        t = load_events(p)
    assert [t.names[c] for c in t.cols["name"]] == ["a"] and t.cols["dur"].tolist() == [2.0]


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


def _cols_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("path", [PUBLIC / "diff_test_rank1of2.json.gz", PUBLIC / "nccl_2rank_rank0.json.gz"], ids=lambda p: p.name)
def test_a_trace_scanned_in_parts_is_the_trace_scanned_in_one(path):
    """count_events splits the events array at events (found by the walk that counts them); the
    parts are scanned and walked in threads; every column and every event's bytes are those of
    the one-thread scan, and each part starts where the walk said."""
    raw = gzip.decompress(path.read_bytes())
    buf = np.frombuffer(raw, dtype=np.uint8)
    lo, hi, _, _, _, err, count, none = scan.count_events(buf)
    assert err == scan.OK and none == []
    err, _, whole = scan.scan(buf, lo, hi, events=count)
    err_b, _, starts, ends, _ = scan.object_bounds(buf, lo, hi)
    assert err == err_b == scan.OK
    for parts in (2, 3, 7):
        *_, splits = scan.count_events(buf, parts)
        assert 1 <= len(splits) <= parts - 1
        for at, before in splits:  # an event starts there, after `before` events
            assert raw[at : at + 1] == b"{" and starts[before] == at
        err, _, cols = scan.scan(buf, lo, hi, events=count, splits=splits)
        assert err == scan.OK and _cols_equal(cols, whole)
        err, _, s2, e2, _ = scan.object_bounds(buf, lo, hi, count, splits)
        assert err == scan.OK and np.array_equal(s2, starts) and np.array_equal(e2, ends)


def test_a_split_that_is_not_an_event_start_falls_back_to_one_scan(tmp_path):
    """A part that does not end cleanly where the next begins (a split inside a string here) is
    scanned again in one thread: the same columns, and a bad trace's error as one scan names it."""
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op {i} }},{{ x", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(50)]
    raw = json.dumps({"traceEvents": events}).encode()
    buf = np.frombuffer(raw, dtype=np.uint8)
    lo, hi, _, _, _, _, count, splits = scan.count_events(buf, 2)
    _, _, whole = scan.scan(buf, lo, hi, events=count)
    inside = raw.index(b"},{ x", raw.index(b'"op 25 ')) + 2  # a '{' inside a name
    bogus = [(inside, 25)]
    err, _, cols = scan.scan(buf, lo, hi, events=count, splits=bogus)
    assert err == scan.OK and _cols_equal(cols, whole)
    err, _, starts, _, _ = scan.object_bounds(buf, lo, hi, count, bogus)
    assert err == scan.OK and len(starts) == 50
    cut = raw.index(b'"ts": 40')
    bad = raw[:cut] + b'"ts": -x' + raw[cut + 8 :]  # a ts that is no number, in the second part
    b2 = np.frombuffer(bad, dtype=np.uint8)
    lo, hi, _, _, _, _, count, splits = scan.count_events(b2, 2)
    assert splits and splits[0][1] < 40
    one = scan.scan(b2, lo, hi, events=count)
    parted = scan.scan(b2, lo, hi, events=count, splits=splits)
    assert one[0] != scan.OK and (one[0], one[1]) == (parted[0], parted[1])


def _strict_problem(text: bytes) -> int:
    """The oracle: Python's own UTF-8 decoder, and a JSON string's escapes decoded by the json
    module must encode back to UTF-8 (a lone surrogate cannot)."""
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        return scan.NOT_UTF8
    try:
        json.loads('"' + decoded + '"').encode("utf-8")
    except UnicodeEncodeError:
        return scan.LONE_SURROGATE
    return scan.TEXT_OK


def test_the_text_check_agrees_with_pythons_decoders():
    rng = np.random.default_rng(7)
    pieces = [
        b"a",
        b"Z",
        b" ",
        b"\\n",
        b"\\\\",
        b'\\"',
        b"\\u00e9",
        b"\\ud83d\\ude00",
        b"\\ud800",
        b"\\udc00",
        b"\\uDBFF\\uDFFF",
        "é".encode(),
        "€".encode(),
        "😀".encode(),
        b"\xff",
        b"\xc0\xaf",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xe2\x82",
        b"\\\\ud800",
    ]
    seen = set()
    for _ in range(3000):
        text = b"".join(pieces[k] for k in rng.integers(0, len(pieces), size=int(rng.integers(0, 8))))
        want = _strict_problem(text)
        buf = np.frombuffer(text, dtype=np.uint8)
        kind, at = scan.text_problem(buf, 0, len(text))
        if want == scan.NOT_UTF8:  # (a text may hold both problems; its first is the one found)
            assert kind != scan.TEXT_OK, text
            if kind == scan.NOT_UTF8:
                with pytest.raises(UnicodeDecodeError) as exc:
                    text.decode("utf-8")
                assert at == exc.value.start, text
        else:
            assert kind == want, text
        seen.add(want)
    assert seen == {scan.TEXT_OK, scan.NOT_UTF8, scan.LONE_SURROGATE}


def test_counting_in_parts_agrees_with_one_walk_even_where_strings_look_like_events():
    """count_events in parts guesses each part's start from the bytes ('}', ',' then '{'); names
    full of such bytes put guesses inside strings: the count, the array's span and every split
    are still those of one walk, and each split is an event's start."""
    names = [f'op {i} }}, {{"ph": "X"}}, {{ }},{{' * (i % 7) for i in range(3000)]
    events = [{"ph": "X", "cat": "cpu_op", "name": nm, "pid": 1, "tid": 1, "ts": i, "dur": 1} for i, nm in enumerate(names)]
    for text in (json.dumps({"traceEvents": events, "after": {"a": [1, 2]}}), json.dumps(events, indent=1)):
        raw = text.encode()
        buf = np.frombuffer(raw, dtype=np.uint8)
        lo, hi, obj, _, _, err, count, _ = scan.count_events(buf)
        _, _, starts, _, _ = scan.object_bounds(buf, lo, hi)
        assert err == scan.OK and count == 3000
        for parts in (2, 3, 5, 8, 13):
            p_lo, p_hi, p_obj, _, _, p_err, p_count, splits = scan.count_events(buf, parts)
            assert (p_lo, p_hi, p_obj, p_err, p_count) == (lo, hi, obj, err, count)
            assert all(starts[before] == at for at, before in splits)
    bad = json.dumps({"traceEvents": events[:50]}).encode()[:-30]  # truncated inside the array
    b = np.frombuffer(bad, dtype=np.uint8)
    assert scan.count_events(b, 4)[5] == scan.count_events(b)[5] != scan.OK


@pytest.mark.parametrize("path", [DATA / "gloo_ddp_2rank" / "rank-0.json.gz", PUBLIC / "amd_mi250_minitoy.json.gz"], ids=lambda p: p.name)
def test_ids_written_as_unsigned_64_bit_values_give_the_same_analysis(tmp_path, path):
    """Every host pid and tid moved up by 2^63 and every flow id by 2^63 (as a profiler writing
    them as uint64 would: a pointer, a hash), one tid made 2^64 - 1: the trace reads (it was
    refused as beyond the signed range) and its analysis is the original's: the ids still tell
    threads and flows apart (read from the raw JSON: the same counts of distinct threads and
    flow ids)."""
    from bottleneck_oracle import api

    doc = json.loads(gzip.open(path).read())
    host = {e["pid"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op"}
    first_tid = min(e["tid"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and isinstance(e.get("tid"), int))
    for e in doc["traceEvents"]:
        if e.get("pid") in host:
            e["pid"] += 2**63
            if isinstance(e.get("tid"), int):
                e["tid"] = 2**64 - 1 if e["tid"] == first_tid else e["tid"] + 2**63
        if isinstance(e.get("id"), int):
            e["id"] += 2**63
    assert max(e["pid"] for e in doc["traceEvents"] if isinstance(e.get("pid"), int)) >= 2**63
    moved = tmp_path / path.name.replace(".gz", "")
    moved.write_bytes(orjson.dumps(doc))
    threads = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e.get("cat") in ("cpu_op", "user_annotation", "python_function")}
    flows = {e["id"] for e in doc["traceEvents"] if e.get("cat") == "fwdbwd"}
    table = load_events(moved)
    c = table.cols
    cpu = c["cls"] == 0
    assert len({(p, t) for p, t in zip(c["pid"][cpu].tolist(), c["tid"][cpu].tolist())}) == len(threads)
    assert len(set(table.flows["id"].tolist())) == len(flows) > 0
    before = [(a.step_time, a.breakdown(), a.graph.n_edges) for a in api.analyze(path)[1]]
    after = [(a.step_time, a.breakdown(), a.graph.n_edges) for a in api.analyze(moved)[1]]
    assert after == before

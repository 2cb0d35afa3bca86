"""Ingestion: the event table, ranks, and a clear error for each kind of bad input."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline.events import EvClass, cpu_parents, load_events
from conftest import PUBLIC, SAMPLE


def test_folder_of_ranks_reads_rank_from_distributed_info():
    t = load_events(SAMPLE)
    assert t.ranks == [0, 1]
    assert {s.rank for s in t.steps} == {0, 1}
    assert sorted({s.number for s in t.steps}) == [1, 2, 3]


def test_times_are_relative_and_microseconds():
    t = load_events(PUBLIC / "train_1rank_5steps.json.gz")
    assert t.cols["ts"].min() >= 0
    spans = [s.span for s in t.steps]
    assert all(30_000 < s < 100_000 for s in spans)  # the steps of this trace are 35-96 ms


def test_rank_from_file_name_when_no_distributed_info(tmp_path):
    doc = json.loads(gzip.open(PUBLIC / "amd_mi250_minitoy.json.gz").read())
    assert "distributedInfo" not in doc
    (tmp_path / "rank-3.json").write_text(json.dumps(doc))
    (tmp_path / "rank-5.json").write_text(json.dumps(doc))
    assert load_events(tmp_path).ranks == [3, 5]


def test_one_subfolder_per_rank(tmp_path):
    """rank3/trace.json or 3/trace.json: the rank from the folder when the file does not say."""
    doc = json.loads(gzip.open(PUBLIC / "amd_mi250_minitoy.json.gz").read())
    for folder in ("rank3", "5"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "trace.json").write_text(json.dumps(doc))
    (tmp_path / "notes").mkdir()  # a folder that is not a rank, without traces
    assert load_events(tmp_path).ranks == [3, 5]
    flat = load_events(SAMPLE)  # distributedInfo wins over the folder's name
    nested = tmp_path / "nested"
    for i, f in enumerate(sorted(SAMPLE.glob("*.json.gz"))):
        (nested / f"rank{1 - i}").mkdir(parents=True)
        (nested / f"rank{1 - i}" / "trace.json.gz").write_bytes(f.read_bytes())
    t = load_events(nested)
    assert t.ranks == flat.ranks and len(t) == len(flat)
    for r in flat.ranks:  # the same events on each rank, whatever order the files were read in
        a, b = t.cols["rank"] == r, flat.cols["rank"] == r
        assert np.array_equal(np.sort(t.cols["ts"][a]), np.sort(flat.cols["ts"][b]))


def test_gpu_kernels_carry_correlation_and_stream():
    t = load_events(PUBLIC / "simple_add_1gpu.json.gz")
    k = t.cols["cls"] == EvClass.KERNEL
    assert k.sum() == 79
    assert (t.cols["correlation"][k] >= 0).all()
    assert (t.cols["stream"][k] >= 0).all()


def test_gloo_message_size_from_input_dims():
    t = load_events(PUBLIC / "cpu_only_rank34.json.gz")
    gloo = [i for i, n in enumerate(t.cols["name"]) if t.names[n] == "gloo:all_reduce"]
    assert sorted(set(t.cols["msg_nelems"][gloo].tolist())) == [321271.0, 2082411.0]
    assert (t.cols["elem_bytes"][gloo] == 4).all()


def test_parents_follow_nesting():
    t = load_events(PUBLIC / "cuda_event_sync_multistream_1gpu.json.gz")
    parent = cpu_parents(t)
    names = np.array(t.names)[t.cols["name"]]
    mm = np.flatnonzero(names == "aten::mm")
    assert len(mm) and all(names[parent[i]] == "aten::matmul" for i in mm)


@pytest.mark.parametrize("trace", ["diff_test_rank1of2.json.gz", "nccl_2rank_rank0.json.gz"])
def test_every_parent_is_the_innermost_enclosing_op_of_its_thread(trace):
    """cpu_parents (a compiled stack walk) against a search of each thread's events: an event's
    parent is the shortest CPU event of its thread that encloses it (ties in start and length,
    which either side may break its own way, are left out)."""
    t = load_events(PUBLIC / trace)
    c = t.cols
    parent = cpu_parents(t)
    cpu = np.flatnonzero((c["cls"] == EvClass.CPU) | (c["cls"] == EvClass.RUNTIME))
    assert (parent[np.setdiff1d(np.arange(len(t)), cpu)] == -1).all()
    checked = 0
    for key in {(int(r), int(p), int(d)) for r, p, d in zip(c["rank"][cpu], c["pid"][cpu], c["tid"][cpu])}:
        mine = cpu[(c["rank"][cpu] == key[0]) & (c["pid"][cpu] == key[1]) & (c["tid"][cpu] == key[2])]
        ts, dur = c["ts"][mine], c["dur"][mine]
        end = ts + dur
        for i in range(len(mine)):
            if dur[i] <= 0 or ((ts == ts[i]) & (dur == dur[i])).sum() > 1:
                continue  # zero-length, or twins: which encloses which is a convention
            open_at = (ts <= ts[i]) & (end > ts[i]) & (np.arange(len(mine)) != i)
            around = open_at & (end + 1e-6 >= end[i])
            if (open_at & ~around).any() or len(set(dur[around].tolist())) < around.sum():
                continue  # an event overlapping it without enclosing it, or two enclosing ones alike
            want = mine[around][np.argmin(dur[around])] if around.any() else -1
            assert parent[mine[i]] == want, (key, i)
            checked += 1
    assert checked > 1000


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "name,data,problem",
    [
        ("empty.json", b"", "file is empty"),
        ("garbage.json", b"this is not json", "not a JSON trace: text that starts with 'this is not '"),
        ("truncated.json", b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1', "JSON"),
        ("list.json", b'{"foo": 1}', "not a profiler trace"),
        ("noevents.json", b'{"traceEvents": []}', "no events"),
        ("onlymeta.json", b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}', "no CPU or GPU op events"),
        (
            "neg.json",
            b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": -3}]}',
            "negative duration",
        ),
        ("bad.json.gz", b"\x1f\x8b\x08\x00garbage-not-deflate", "gzip"),
    ],
)
def test_bad_input_names_the_file_and_the_problem(tmp_path, name, data, problem):
    p = _write(tmp_path / name, data)
    with pytest.raises(TraceError) as exc:
        load_events(p)
    assert str(p) in str(exc.value)
    assert problem in str(exc.value)


def test_truncated_gzip(tmp_path):
    """A gzip trace cut short (a job killed while writing it) is read up to its last whole event,
    with a warning: every op it holds is an op of the whole trace. Cut before its first event, it
    is refused as truncated."""
    import warnings

    full = (PUBLIC / "cuda_event_sync_1gpu.json.gz").read_bytes()
    p = _write(tmp_path / "cut.json.gz", full[: len(full) // 2])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        cut = load_events(p)
    assert any("the file ends inside its events" in str(w.message) for w in said)
    whole = load_events(PUBLIC / "cuda_event_sync_1gpu.json.gz")
    assert 0 < len(cut) < len(whole)
    ops = {(whole.names[n], round(t, 3)) for n, t in zip(whole.cols["name"], whole.cols["ts"] + whole.t0)}
    assert all((cut.names[n], round(t, 3)) in ops for n, t in zip(cut.cols["name"], cut.cols["ts"] + cut.t0))
    early = _write(tmp_path / "early.json.gz", gzip.compress(gzip.decompress(full)[:300])[:-8])  # (no trailer)
    with pytest.raises(TraceError, match="truncated"):
        load_events(early)


def test_a_large_gzip_trace_cut_short_is_copied_as_far_as_it_goes(tmp_path):
    """The road of traces of 256 MiB or more (decompressed into a temporary file, then mapped):
    a stream cut short leaves in the copy everything it holds, a prefix of the whole JSON."""
    import tempfile

    from bottleneck_oracle.graph_pipeline.events import _copy_gunzipped

    full = (PUBLIC / "cuda_event_sync_1gpu.json.gz").read_bytes()
    text = gzip.decompress(full)
    p = _write(tmp_path / "cut.json.gz", full[: len(full) // 2])
    with open(p, "rb") as src, tempfile.TemporaryFile() as tmp:
        n = _copy_gunzipped(p, src, tmp)
        tmp.seek(0)
        copied = tmp.read()
    assert n == len(copied) > len(text) // 4 and text.startswith(copied)


def test_execution_trace_given_as_kineto_is_named(tmp_path):
    with pytest.raises(TraceError, match="execution trace"):
        load_events(PUBLIC / "simple_add.pytorch_et.json.gz")


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        load_events(tmp_path / "nope.json")
    with pytest.raises(TraceError, match="no .json"):
        load_events(tmp_path)


@pytest.mark.parametrize(
    "name,data",
    [
        ("config.json", b'{"lr": 0.1, "batch": 32}'),
        ("losses.json", b"[0.52, 0.48, 0.47]"),
        ("history.json", b'[{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.4}]'),
        ("empty_list.json", b"[]"),
    ],
)
def test_a_results_file_in_a_folder_of_traces_is_skipped_and_said(tmp_path, name, data):
    """A job's log folder holds its traces beside other JSON (a config, a loss history: an object,
    or an array of numbers or of records). Such a file is skipped with a warning naming it; the
    ranks' traces read as without it. (An array of numbers or of records stopped the whole job:
    "traceEvents holds an element that is not an object", "no CPU or GPU op events".) Alone, it is
    refused naming it as not a trace."""
    import warnings

    for f in SAMPLE.glob("*.json.gz"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    foreign = _write(tmp_path / name, data)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        t = load_events(tmp_path)
    alone = load_events(SAMPLE)
    assert t.ranks == alone.ranks and len(t) == len(alone)
    mine = [str(w.message) for w in said if name in str(w.message)]
    assert len(mine) == 1 and "skipped, JSON but not a profiler trace" in mine[0]
    with pytest.raises(TraceError, match="not a profiler trace") as exc:
        load_events(foreign)
    assert str(foreign) in str(exc.value)


def test_duplicate_rank_in_folder(tmp_path):
    raw = gzip.open(SAMPLE / "rank-0.json.gz").read()
    (tmp_path / "a.json").write_bytes(raw)
    (tmp_path / "b.json").write_bytes(raw)
    with pytest.raises(TraceError, match="rank 0 appears twice"):
        load_events(tmp_path)


def test_parallel_parse_equals_sequential(tmp_path):
    seq = load_events(SAMPLE, workers=1)
    par = load_events(SAMPLE, workers=2)
    assert par.names == seq.names and par.t0 == seq.t0
    for k in seq.cols:
        assert np.array_equal(par.cols[k], seq.cols[k], equal_nan=True), k
    assert [(s.rank, s.number) for s in par.steps] == [(s.rank, s.number) for s in seq.steps]


def test_parallel_parse_reports_the_bad_file(tmp_path):
    (tmp_path / "rank-0.json.gz").write_bytes((SAMPLE / "rank-0.json.gz").read_bytes())
    (tmp_path / "rank-1.json").write_bytes(b'{"traceEvents": [')
    with pytest.raises(TraceError, match="rank-1.json"):
        load_events(tmp_path, workers=2)


def test_the_window_index_sorts_as_lexsort_does():
    """The table's (rank, anchor) order, sorted rank by rank: the same permutation as one
    np.lexsort, ties (equal anchors of a rank) kept in table order; ranks in blocks or not."""
    from bottleneck_oracle.graph_pipeline.events import _by_group_then

    rng = np.random.default_rng(11)
    for n, ranks, shuffled in ((0, 1, 0), (1, 1, 0), (5_000, 1, 0), (40_000, 64, 0), (40_000, 64, 15_000), (3_000, 3_000, 3_000)):
        group = np.repeat(np.arange(ranks, dtype=np.int32), -(-n // ranks))[:n]
        rng.shuffle(group[:shuffled])
        value = rng.integers(0, 50, n).astype(np.float64)  # many ties
        value[rng.random(n) < 0.01] = -np.inf  # anchors of orphaned device ops
        assert np.array_equal(_by_group_then(group, value), np.lexsort((value, group)))


def test_a_category_hash_maps_to_its_class_and_an_unknown_one_to_none():
    from bottleneck_oracle.graph_pipeline import scan
    from bottleneck_oracle.graph_pipeline.events import _CAT_BY_HASH, _CAT_CLASS

    cats = [*_CAT_CLASS, "not a category", ""]
    hashes = np.array([scan.fnv1a(c.encode()) for c in cats] * 3, dtype=np.uint64)
    want = [int(_CAT_CLASS[c]) if c in _CAT_CLASS else -1 for c in cats] * 3
    assert _CAT_BY_HASH.lookup(hashes).tolist() == want
    assert _CAT_BY_HASH.lookup(np.zeros(0, dtype=np.uint64)).tolist() == []


def _as_begin_end(events: list[dict]) -> list[dict]:
    """The complete events of the host threads rewritten as begin/end pairs, in an order that
    nests them (at one time: ends before begins, inner ends first, outer begins first)."""
    out, marks = [], []
    for i, e in enumerate(events):
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime"):
            b = {k: v for k, v in e.items() if k != "dur"} | {"ph": "B"}
            end = {"ph": "E", "pid": e["pid"], "tid": e["tid"], "ts": e["ts"] + e["dur"]}
            marks.append((e["ts"], 1, -e["dur"], i, b))
            marks.append((e["ts"] + e["dur"], 0, -e["ts"], i, end))
        else:
            out.append(e)
    return out + [m[-1] for m in sorted(marks, key=lambda m: m[:4])]


def test_begin_end_pairs_read_as_the_complete_events_they_stand_for(tmp_path):
    src = sorted(SAMPLE.iterdir())[0]
    doc = json.loads(gzip.open(src).read() if src.suffix == ".gz" else src.read_text())
    (tmp_path / "x.json").write_text(json.dumps(doc))
    paired = dict(doc, traceEvents=_as_begin_end(doc["traceEvents"]))
    assert sum(e.get("ph") == "B" for e in paired["traceEvents"]) > 100
    (tmp_path / "be.json").write_text(json.dumps(paired))
    a, b = load_events(tmp_path / "x.json"), load_events(tmp_path / "be.json")

    def ops(t):
        c = t.cols
        key = np.lexsort((c["dur"], c["ts"], c["tid"], c["cls"]))
        return [(int(c["cls"][i]), int(c["tid"][i]), round(float(c["ts"][i] + t.t0), 3), t.names[c["name"][i]]) for i in key], c["dur"][key]

    (oa, da), (ob, db) = ops(a), ops(b)
    assert oa == ob and np.allclose(da, db, atol=1e-3)
    assert [s.number for s in a.steps] == [s.number for s in b.steps]
    assert np.allclose([s.span for s in a.steps], [s.span for s in b.steps], atol=1e-3)


def test_a_begin_without_its_end_is_dropped_and_said(tmp_path):
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
        {"ph": "B", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10},
        {"ph": "B", "cat": "cpu_op", "name": "aten::bmm", "pid": 1, "tid": 2, "ts": 10},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 30},
        {"ph": "E", "pid": 1, "tid": 3, "ts": 40},
    ]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": ev}))
    with pytest.warns(UserWarning, match="2 begin/end events"):
        t = load_events(tmp_path / "t.json")
    got = sorted((t.names[n], d) for n, d in zip(t.cols["name"], t.cols["dur"]))
    assert got == [("aten::add", 5.0), ("aten::bmm", 20.0)]


@pytest.mark.parametrize("mapped", [False, True])
def test_a_byte_order_mark_is_read_past(tmp_path, monkeypatch, mapped):
    """A trace re-saved by an editor that writes UTF-8's byte order mark (JSON readers may skip
    it): the same events, plain or gzip, object or bare array, read whole or through a mapping
    (large files), as the file without it."""
    from bottleneck_oracle.graph_pipeline import events

    raw = gzip.decompress((SAMPLE / "rank-0.json.gz").read_bytes())
    listed = json.loads(raw)["traceEvents"]
    bom = b"\xef\xbb\xbf"
    variants = {
        "object.json": bom + raw,
        "array.json": bom + json.dumps(listed).encode(),
        "object.json.gz": gzip.compress(bom + raw),
    }
    want = load_events(SAMPLE / "rank-0.json.gz")
    if mapped:
        monkeypatch.setattr(events, "MAP_BYTES", 0)
    for name, data in variants.items():
        (tmp_path / name).write_bytes(data)
        got = load_events(tmp_path / name)
        assert len(got.cols["ts"]) == len(want.cols["ts"]), name
        assert [(s.number, s.span) for s in got.steps] == [(s.number, s.span) for s in want.steps], name


def test_a_file_of_another_format_is_named(tmp_path):
    """Files a user may be handed instead of a trace-event JSON are refused with what they look
    like, written here by the libraries that make them (a pickle is written, never read)."""
    import bz2
    import lzma
    import pickle
    import sqlite3
    import zipfile

    db = tmp_path / "report.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("create table CUPTI_ACTIVITY_KIND_KERNEL (start int, end int)")
    con.close()
    with zipfile.ZipFile(tmp_path / "traces.zip", "w") as z:
        z.writestr("rank-0.json", "{}")
    trace = gzip.decompress((SAMPLE / "rank-0.json.gz").read_bytes())
    (tmp_path / "t.json.bz2").write_bytes(bz2.compress(trace))
    (tmp_path / "t.json.xz").write_bytes(lzma.compress(trace))
    (tmp_path / "t.pkl").write_bytes(pickle.dumps({"traceEvents": []}))
    (tmp_path / "t16.json").write_bytes(trace.decode().encode("utf-16"))  # what PowerShell's > writes
    (tmp_path / "t.pb").write_bytes(bytes([0x0A, 0x84, 0x01, 0x12, 0x00, 0xFF, 0x00]) * 40)  # length-delimited fields, NULs
    expect = {
        "report.sqlite": "SQLite",
        "traces.zip": "zip archive",
        "t.json.bz2": "bzip2",
        "t.json.xz": "xz",
        "t.pkl": "pickle",
        "t16.json": "UTF-16",
        "t.pb": "binary file",
    }
    for name, what in expect.items():
        with pytest.raises(TraceError) as exc:
            load_events(tmp_path / name)
        assert str(exc.value).startswith(str(tmp_path / name)) and what in str(exc.value) and "trace-event JSON" in str(exc.value), name
    assert db.read_bytes().startswith(b"SQLite format 3\x00")  # nothing was written to the input


def test_an_event_without_its_end_is_dropped_not_the_trace(tmp_path):
    """Kineto once wrote an op whose end it missed with an end of 0 (a duration of minus its start;
    it guards against that since 2022). One such op in a real trace is dropped with a warning: the
    table is the one of the trace without that event. A file of such events is still refused
    (test_bad_input_names_the_file_and_the_problem)."""
    import warnings

    doc = json.loads(gzip.open(PUBLIC / "cuda_event_sync_1gpu.json.gz").read())
    ops = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    broken = ops[5]
    without = {**doc, "traceEvents": [e for e in doc["traceEvents"] if e is not broken]}
    broken["dur"] = -broken["ts"]
    (tmp_path / "broken.json").write_text(json.dumps(doc))
    (tmp_path / "without.json").write_text(json.dumps(without))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        table = load_events(tmp_path / "broken.json")
    assert any("1 events with a negative duration" in str(w.message) for w in said)
    clean = load_events(tmp_path / "without.json")
    assert len(table) == len(clean)
    for k in ("ts", "dur", "name", "cls"):
        assert np.array_equal(table.cols[k], clean.cols[k]), k


def test_text_after_the_document_and_a_comma_after_the_last_event_are_named_where_they_are(tmp_path, capsys):
    """A log line appended to a trace, a second trace appended to it, a writer's comma after the
    last event: each one line naming the file, the problem and its byte (read here from the bytes
    the test wrote). They were said as metadata 'nested too deep' and 'an element that is not an
    object'."""
    from conftest import DATA, run_cli

    good = gzip.open(DATA / "own-cpu" / "compiled_mlp_after_warmup.json.gz").read()
    cases = {
        "log_line.json": (good + b"\nINFO: profiler done\n", f"more after its JSON document ends, at byte {len(good) + 1:,}: 'INFO"),
        "two_documents.json": (
            good + b"\n" + good,
            f"more after its JSON document ends, at byte {len(good) + 1 + good.index(b'{'):,}: '{{",
        ),
    }
    note = '"note": "héllo wörld ✓",'.encode()  # (metadata with multi-byte characters before the fault: bytes, not characters)
    at = good.index(b'"schemaVersion"')
    noted = good[:at] + note + good[at:]
    cases["noted_log_line.json"] = (noted + b"\nINFO\n", f"more after its JSON document ends, at byte {len(noted) + 1:,}: 'INFO")
    close = good.rindex(b"]", 0, good.index(b'"traceName"') if b'"traceName"' in good else len(good))
    last = good.rindex(b"}", 0, close) + 1
    with_comma = good[:last] + b"," + good[last:]
    cases["comma.json"] = (with_comma, f"a comma after the last event, before the closing bracket at byte {close + 1:,}")
    for name, (data, problem) in cases.items():
        (tmp_path / name).write_bytes(data)
        code, out, err = run_cli(["analyze", str(tmp_path / name)], capsys)
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1, (name, err)
        assert str(tmp_path / name) in lines[0] and problem in lines[0], (name, lines[0])


def test_the_work_an_op_is_given_by_its_input_sizes():
    """events.shape_flops, against the textbook counts: a matmul [M, K] x [K, N] is 2MKN
    (``aten::addmm``'s bias first), a batched one 2BMKN, attention 4BHLSD (queries, keys), a
    convolution 2 x input elements x weight elements / input channels (stride 1); ops that only
    hold those (``aten::linear``), scalars, lists of tensors, negative or non-integer sizes: 0."""
    from bottleneck_oracle.graph_pipeline.events import shape_flops

    assert shape_flops("aten::mm", [[64, 256], [256, 1024]]) == 2 * 64 * 256 * 1024
    assert shape_flops("aten::addmm", [[1024], [160, 256], [256, 1024], [], []]) == 2 * 160 * 256 * 1024
    assert shape_flops("aten::bmm", [[8, 32, 64], [8, 64, 16]]) == 2 * 8 * 32 * 64 * 16
    assert shape_flops("aten::_scaled_dot_product_flash_attention", [[2, 8, 128, 64], [2, 8, 256, 64], [2, 8, 256, 64]]) == (
        4 * 2 * 8 * 128 * 256 * 64
    )
    assert shape_flops("aten::convolution", [[4, 3, 32, 32], [16, 3, 3, 3], [16]]) == 2 * (4 * 3 * 32 * 32) * (16 * 3 * 3 * 3) / 3
    for name, dims in (
        ("aten::linear", [[64, 256], [1024, 256], [1024]]),
        ("aten::mm", [[64, -1], [256, 1024]]),
        ("aten::mm", [[64, 2.5], [256, 1024]]),
        ("aten::mm", [[[64, 256]], [256, 1024]]),
        ("aten::mm", "[[64, 256], [256, 1024]]"),
        ("aten::mm", [[64, 256]]),
        ("aten::bmm", [[8, 32], [8, 64, 16]]),
    ):
        assert shape_flops(name, dims) == 0.0, (name, dims)

"""Bad and hostile inputs, derived from the bundled traces: every command answers with exit 0 or 2,
no traceback, at most one error line naming the file and the problem, and leaves no output
behind when it fails. The corpus is generated here (nothing hostile is committed); the cases
that need a real memory limit (decompression bombs) run in a subprocess under the slow marker.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from conftest import PUBLIC, SAMPLE, run_cli

SMALL = PUBLIC / "cuda_event_sync_1gpu.json.gz"  # 1 GPU, one step: fast to analyse


def _doc() -> dict:
    return json.loads(gzip.open(SMALL).read())


def _events_with(fn) -> dict:
    doc = _doc()
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("name") == "aten::empty":
            fn(e)
            break
    return doc


def _step_doc(fn) -> dict:
    doc = _doc()
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    fn(doc, steps[0])
    return doc


def corpus(root: Path) -> list[tuple[str, list[str], Path | None]]:
    """(case, command-line arguments, the output path that must not be left behind)."""
    cases: list[tuple[str, list[str], Path | None]] = []

    def write(name: str, data: bytes | str, gz: bool = False) -> Path:
        p = root / name
        raw = data.encode() if isinstance(data, str) else data
        p.write_bytes(gzip.compress(raw) if gz else raw)
        return p

    def trace(name: str, doc: object) -> Path:
        return write(name, json.dumps(doc))

    good = SMALL.read_bytes()
    raw = gzip.decompress(good)
    files = {
        "empty": write("empty.json", b""),
        "blank": write("blank.json", "  \n\t "),
        "truncated_json": write("trunc.json", raw[: len(raw) // 2]),
        "truncated_gzip": write("trunc.json.gz", good[: len(good) // 2]),
        "gzip_of_junk": write("junk.json.gz", os.urandom(4000), gz=True),
        "not_json": write("text.json", "hello, this is not a trace"),
        "binary_junk": write("bin.json", os.urandom(3000)),
        "array_of_numbers": trace("numbers.json", list(range(1000))),
        "object_without_events": trace("noevents.json", {"schemaVersion": 1, "foo": [1, 2]}),
        "events_not_a_list": trace("notlist.json", {"traceEvents": {"a": 1}}),
        "events_empty": trace("noev.json", {"traceEvents": []}),
        "events_not_objects": trace("strs.json", {"traceEvents": ["a", 1, None]}),
        "only_metadata": trace("meta.json", {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}]}),
        "ts_missing": trace("nots.json", _events_with(lambda e: e.pop("ts"))),
        "ts_string": trace("tsstr.json", _events_with(lambda e: e.update(ts="12.5"))),
        "dur_string": trace("durstr.json", _events_with(lambda e: e.update(dur="100"))),
        "dur_negative": trace("durneg.json", _events_with(lambda e: e.update(dur=-5))),
        "dur_huge": trace("durhuge.json", _events_with(lambda e: e.update(dur=1e300))),
        "ts_huge": trace("tshuge.json", _events_with(lambda e: e.update(ts=1e300))),
        "dur_inf": write("durinf.json", json.dumps(_events_with(lambda e: e.update(dur=12345.678))).replace("12345.678", "1e309")),
        "name_number": trace("namenum.json", _events_with(lambda e: e.update(name=42))),
        "name_missing": trace("noname.json", _events_with(lambda e: e.pop("name"))),
        "lone_surrogate": write("surrogate.json", json.dumps(_events_with(lambda e: e.update(name="XSURX"))).replace("XSURX", "\\ud800")),
        "non_utf8_name": write(
            "latin1.json", json.dumps(_events_with(lambda e: e.update(name="XBADX"))).encode().replace(b"XBADX", b"\xff\xfe")
        ),
        "control_chars": trace("ctrl.json", _events_with(lambda e: e.update(name="evil\x1b[2J\x07\x9b"))),
        "markup_name": trace("markup.json", _events_with(lambda e: e.update(name="[/bold][link=file:///etc/passwd]x"))),
        "long_name": trace("longname.json", _events_with(lambda e: e.update(name="n" * 200_000))),
        "zero_length_step": trace("zerostep.json", _step_doc(lambda d, s: s.update(dur=0))),
        "nested_step": trace("nested.json", _step_doc(lambda d, s: d["traceEvents"].append({**s, "ts": s["ts"] + 1, "dur": s["dur"] / 2}))),
        "duplicated_events": trace("dups.json", (lambda d: {**d, "traceEvents": d["traceEvents"] * 2})(_doc())),
        "pid_tid_strings": trace("strids.json", _events_with(lambda e: e.update(pid="proc", tid="thr"))),
    }
    folder_junk = root / "with_truth"
    folder_junk.mkdir()
    (folder_junk / "rank-0.json.gz").write_bytes((SAMPLE / "rank-0.json.gz").read_bytes())
    (folder_junk / "rank-1.json.gz").write_bytes((SAMPLE / "rank-1.json.gz").read_bytes())
    (folder_junk / "truth.json").write_text(json.dumps({"straggler": 1}))
    files["folder_with_truth_json"] = folder_junk
    empty_dir = root / "emptydir"
    empty_dir.mkdir()
    files["empty_folder"] = empty_dir
    same_rank = root / "same_rank"
    same_rank.mkdir()
    (same_rank / "rank-0.json.gz").write_bytes((SAMPLE / "rank-0.json.gz").read_bytes())
    (same_rank / "rank-00.json.gz").write_bytes((SAMPLE / "rank-0.json.gz").read_bytes())
    files["rank_twice"] = same_rank
    two_runs = root / "two_runs"
    two_runs.mkdir()
    (two_runs / "rank-0.json.gz").write_bytes((SAMPLE / "rank-0.json.gz").read_bytes())
    late = json.loads(gzip.open(SAMPLE / "rank-1.json.gz").read())
    for e in late["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += 3_600_000_000  # recorded an hour later: another run
    (two_runs / "rank-1.json.gz").write_bytes(gzip.compress(json.dumps(late).encode()))
    files["ranks_from_two_runs"] = two_runs
    files["et_as_trace"] = PUBLIC / "simple_add.pytorch_et.json.gz"
    files["missing"] = root / "nope.json"
    files["dir_named_json"] = root / "adir.json"
    files["dir_named_json"].mkdir()
    fifo = root / "fifo.json"
    os.mkfifo(fifo)
    files["fifo"] = fifo
    files["device"] = Path("/dev/zero")
    for case, path in files.items():
        cases.append((f"analyze:{case}", ["analyze", str(path)], None))
        cases.append(
            (f"analyze-json:{case}", ["analyze", str(path), "--json", "--html", str(root / f"{case}.html")], root / f"{case}.html")
        )

    # command-line values
    s = str(SAMPLE)
    for case, args in {
        "step_missing": ["analyze", s, "--step", "99"],
        "step_negative": ["analyze", s, "--step", "-1"],
        "top_zero": ["analyze", s, "--top", "0"],
        "edit_not_key_value": ["whatif", s, "--edit", "blah", "--no-model"],
        "edit_unknown_key": ["whatif", s, "--edit", "speed=2", "--no-model"],
        "edit_huge_id": ["whatif", s, "--edit", "id=99999999999999999999,scale=2", "--no-model"],
        "edit_id_out_of_range": ["whatif", s, "--edit", "id=999999,scale=2", "--no-model"],
        "edit_scale_nan": ["whatif", s, "--edit", "rank=1,scale=nan", "--no-model", "--json"],
        "edit_scale_inf": ["whatif", s, "--edit", "rank=1,scale=inf", "--no-model", "--json"],
        "edit_delay_nan": ["whatif", s, "--edit", "rank=1,delay_ms=nan", "--no-model", "--json"],
        "edit_delay_huge_negative": ["whatif", s, "--edit", "rank=1,delay_ms=-1e12", "--no-model", "--json"],
        "edit_scale_negative": ["whatif", s, "--edit", "rank=1,scale=-1", "--no-model"],
        "edit_selects_nothing": ["whatif", s, "--edit", "name=no_such_op,scale=2", "--no-model"],
        "edit_phase_unknown": ["whatif", s, "--edit", "phase=lunch,scale=2", "--no-model"],
        "whatif_no_edit": ["whatif", s, "--no-model"],
        "checkpoint_missing": ["whatif", s, "--edit", "rank=1,scale=0.5", "--checkpoint", str(root / "none.pt")],
        "checkpoint_junk": ["whatif", s, "--edit", "rank=1,scale=0.5", "--checkpoint", str(write("junk.pt", os.urandom(500)))],
        "config_missing": ["analyze", s, "--config", str(root / "none.yaml")],
        "config_not_yaml": ["analyze", s, "--config", str(write("bad.yaml", "graph: [unclosed"))],
        "config_unknown_key": ["analyze", s, "--config", str(write("unk.yaml", "graph:\n  nope: 1\n"))],
        "config_wrong_type": ["analyze", s, "--config", str(write("type.yaml", "analysis:\n  top_k: [1, [2]]\n"))],
        "config_nan": ["analyze", s, "--config", str(write("nan.yaml", "graph:\n  feeds_resume_us: .nan\n"))],
        "config_string": ["analyze", s, "--config", str(write("str.yaml", "graph:\n  idle_gap_us: fifty\n"))],
        "config_list_section": ["analyze", s, "--config", str(write("list.yaml", "- 1\n- 2\n"))],
        "config_non_utf8": ["analyze", s, "--config", str(write("latin.yaml", b"analysis:\n  top_k: \xff\n"))],
        "recipes_missing_keys": ["advise", s, "--no-model", "--recipes", str(write("recipes.yaml", "- id: x\n  title: y\n"))],
        "recipes_fifo": ["advise", s, "--no-model", "--recipes", str(fifo)],
        "html_to_folder": ["analyze", s, "--html", str(root)],
        "html_to_device": ["analyze", s, "--html", "/dev/null"],
        "perfetto_to_fifo": ["analyze", s, "--perfetto", str(fifo)],
        "html_under_a_file": ["analyze", s, "--html", str(root / "empty.json" / "r.html")],
        "parse_output_is_file": ["parse", s, "--output", str(root / "empty.json")],
        "parse_no_path": ["parse"],
        "compare_missing_candidate": ["compare", s, str(root / "nope")],
        "summary_fifo": ["summary", str(fifo)],
        "et_junk": ["analyze", s, "--et", str(write("et.json", '{"nodes": 5}'))],
        "blame_zero_length_step": ["blame", str(files["zero_length_step"]), "--no-model"],
        "advise_zero_length_step": ["advise", str(files["zero_length_step"]), "--no-model"],
        "blame_baseline_missing": ["blame", s, "--no-model", "--baseline", str(root / "nope")],
        "unknown_option": ["analyze", s, "--bogus"],
        "unknown_command": ["frobnicate", s],
    }.items():
        cases.append((case, args, None))
    return cases


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> list:
    return corpus(tmp_path_factory.mktemp("corpus"))


def run(args: list[str], capsys) -> tuple[int, str, str]:
    return run_cli(args, capsys, seconds=30)  # a hang (reading a FIFO) becomes a failure, not a stuck test run


# inputs that used to be accepted silently: each now gets a warning (and a sane result) or an error
NOT_SILENT = {
    "nested_step": "warning", "duplicated_events": "warning", "dur_string": "warning", "zero_length_step": "warning",
    "ts_huge": "warning", "dur_huge": "warning", "folder_with_truth_json": "warning", "ranks_from_two_runs": "error",
    "dur_inf": "warning", "edit_scale_nan": "error", "edit_delay_nan": "error", "edit_delay_huge_negative": "error",
}  # fmt: skip


def test_the_corpus_is_large_enough(cases):
    assert len(cases) >= 60


def test_every_bad_input_gets_a_clean_answer(cases, capsys):
    """Exit 0 (a warning and a sane result) or 2 (one error line naming the thing), never a
    traceback or another code; JSON output stays valid JSON; a failed run leaves nothing."""
    problems = []
    for case, args, output in cases:
        try:
            code, out, err = run(args, capsys)
        except Exception as exc:  # noqa: BLE001 - the point: nothing may escape the CLI
            problems.append(f"{case}: raised {exc.__class__.__name__}: {str(exc)[:200]}")
            continue
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        expect = NOT_SILENT.get(case.split(":")[-1])
        if expect and not any(line.startswith(f"{expect}:") for line in err.splitlines()):
            problems.append(f"{case}: accepted without a {expect} (exit {code})")
        if code not in (0, 2):
            problems.append(f"{case}: exit {code}")
        if "Traceback" in err or "Traceback" in out:
            problems.append(f"{case}: traceback")
        if code == 2 and len(errors) != 1:
            problems.append(f"{case}: {len(errors)} error lines: {err[:300]!r}")
        if code == 2 and output is not None and output.exists():
            problems.append(f"{case}: left {output.name} behind")
        if code == 0 and "--json" in args:
            try:
                json.loads(out, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
            except ValueError as exc:
                problems.append(f"{case}: --json printed invalid JSON ({str(exc)[:80]})")
    assert not problems, "\n".join(problems)

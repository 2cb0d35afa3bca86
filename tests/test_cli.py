"""The command line: help for every command, clean errors, the outputs a user reads."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bottleneck_oracle import cli
from conftest import DATA, MORE, PUBLIC, SAMPLE, run_cli

COMMANDS = ["analyze", "parse", "generate", "build-dataset", "train", "eval", "whatif", "blame", "advise", "summary", "compare", "version"]


run = run_cli


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    code, out, _ = run([command, "--help"], capsys)
    assert code == 0
    assert "Usage" in out and len(out.strip().splitlines()) >= 3
    registered = {c.name or c.callback.__name__: c.callback for c in cli.app.registered_commands}
    assert registered[command].__doc__, f"{command} has no help text"
    import re

    tags = re.findall(r"<[a-z]+>|\{[A-Z_]+\}", out)  # typer's <path>/<str> type tags, {PATH} in the usage line
    assert not tags, f"{command} --help shows {tags}"


def test_top_level_help_lists_all_commands(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for c in COMMANDS:
        assert c in out


def test_help_groups_the_users_commands_apart_from_the_developers(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    users, developers = out.index(f"{cli.ANALYSIS}:"), out.index(f"{cli.DEVELOPER}:")
    assert users < developers
    listed = {m.group(1): m.start() for m in re.finditer(r"^  ([a-z-]+)  ", out, re.MULTILINE)}
    for c in ("generate", "build-dataset", "train", "eval"):
        assert listed[c] > developers, c
    for c in ("analyze", "parse", "whatif", "blame", "advise", "summary", "compare", "version"):
        assert users < listed[c] < developers, c


@pytest.mark.parametrize("command", [["generate"], ["build-dataset"], ["train"], ["eval", "--checkpoint", "x.pt"]])
def test_a_developer_command_without_the_lab_says_how_to_install_it(command, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in [m for m in sys.modules if m.split(".")[0] == "bottleneck_oracle_lab"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "bottleneck_oracle_lab", None)  # as if not installed: importing it fails
    code, out, err = run(command, capsys)
    assert code == 2 and out == "" and err.strip().splitlines() == [f"error: {cli.LAB_MISSING}"]


def test_analyze_prints_the_run_answer_first_and_the_steps_on_request(capsys):
    code, out, _ = run(["analyze", str(SAMPLE)], capsys)
    assert code == 0
    assert out.splitlines()[1].startswith("Run: ") and "Straggler: rank 1" in out and "Steps (ms)" in out
    assert "Where the critical path's time goes" not in out and "--detail" in out
    code, out, _ = run(["analyze", str(SAMPLE), "--detail"], capsys)
    assert code == 0
    for text in (
        "Run: ",
        "Steps (ms)",
        "Where the critical path's time goes",
        "Lowest-slack communication",
        "Ranks",
        "Straggler: rank 1",
        "critical path: rank",
    ):
        assert text in out


def test_analyze_json_schema(capsys):
    code, out, _ = run(["analyze", str(SAMPLE), "--json", "--step", "2", "--full-path"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["ranks"] == [0, 1] and [s["step"] for s in doc["steps"]] == [2]
    step = doc["steps"][0]
    for key in (
        "makespan_us",
        "measured_us",
        "step_time_us",
        "step_time_error",
        "breakdown_us",
        "top_ops",
        "lowest_slack_comm",
        "per_rank",
        "straggler",
        "counts",
        "untraced_us",
        "critical_path",
        "gpu_queue",
        "warnings",
        "dropped_edges",
    ):
        assert key in step
    assert abs(step["step_time_error"]) < 0.01
    assert sum(step["breakdown_us"].values()) == pytest.approx(step["makespan_us"], rel=1e-6)
    assert set(step["breakdown_us"]) == {"compute", "communication", "cpu_overhead", "idle", "untraced"}
    assert min(step["breakdown_us"].values()) >= 0 and step["untraced_us"] == step["breakdown_us"]["untraced"]
    assert step["straggler"]["rank"] == 1
    assert all({"name", "kind", "critical_us", "share", "count"} <= set(o) for o in step["top_ops"])
    assert sum(o["share"] for o in step["top_ops"]) <= 1.0 + 1e-9
    path = step["critical_path"]
    keys = {"kind", "rank", "tid", "thread", "stream", "name", "start_us", "dur_us", "node", "cause"}
    assert path and all(keys <= set(s) for s in path)
    assert sum(s["dur_us"] for s in path) == pytest.approx(step["makespan_us"], rel=1e-6)
    assert all(b["start_us"] >= a["start_us"] for a, b in zip(path, path[1:]))
    assert step["gpu_queue"] is None  # a CPU run
    assert any("untraced" in w for w in step["warnings"])  # rank 1's 20 ms sleep is untraced Python
    # by default: the path's longest segments, in time order, the rest of the step as with --full-path
    code, out, _ = run(["analyze", str(SAMPLE), "--json", "--step", "2", "--top", "3"], capsys)
    short = json.loads(out)["steps"][0]
    top = short.pop("critical_path_top")
    assert "critical_path" not in short and len(top) == 3 and all(b["start_us"] >= a["start_us"] for a, b in zip(top, top[1:]))
    assert sorted(s["dur_us"] for s in top) == sorted(s["dur_us"] for s in path)[-3:]
    assert short == {**{k: v for k, v in step.items() if k != "critical_path"}, "top_ops": step["top_ops"][:3]}


def test_unknown_step_is_a_clean_error(capsys):
    code, _, err = run(["analyze", str(SAMPLE), "--step", "99"], capsys)
    assert code == 2 and "ProfilerStep#99" in err and "Traceback" not in err


def test_no_step_markers_warns_and_analyses_the_window(capsys):
    code, out, err = run(["analyze", str(PUBLIC / "alexnet_1gpu.json.gz"), "--json"], capsys)
    assert code == 0 and "warning:" in err and "no ProfilerStep" in err
    assert json.loads(out)["steps"][0]["step"] is None


@pytest.mark.parametrize(
    "content,problem",
    [(b"", "empty"), (b"{not json", "JSON"), (b'{"a": 1}', "not a profiler trace"), (b"\x1f\x8b\x08\x00\x00", "gzip")],
)
def test_bad_input_one_line_error_nonzero_exit_no_output_file(tmp_path, capsys, content, problem):
    bad = tmp_path / "trace.json"
    bad.write_bytes(content)
    html = tmp_path / "report.html"
    code, out, err = run(["analyze", str(bad), "--html", str(html)], capsys)
    assert code == 2
    assert err.strip().startswith("error:") and str(bad) in err and problem in err
    assert len(err.strip().splitlines()) <= 2 and "Traceback" not in err
    assert not html.exists() and not list(tmp_path.glob("*.tmp"))


def test_generate_paired_names_a_device_it_cannot_use(tmp_path, capsys):
    import torch

    out = tmp_path / "paired"
    code, _, err = run(
        [
            "generate",
            "--paired",
            "--device",
            "tpu",
            "--config",
            str(Path(__file__).parents[1] / "benchmarks" / "paired.yaml"),
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 2 and "--device must be cpu or cuda" in err and not out.exists()
    if not torch.cuda.is_available():
        code, _, err = run(
            [
                "generate",
                "--paired",
                "--device",
                "cuda",
                "--config",
                str(Path(__file__).parents[1] / "benchmarks" / "paired.yaml"),
                "--out",
                str(out),
            ],
            capsys,
        )
        assert code == 2 and "no CUDA GPU" in err and "Traceback" not in err and not out.exists()


def test_bad_config_is_named(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("analysis:\n  top_k: 0\n")
    code, _, err = run(["analyze", str(SAMPLE), "--config", str(cfg)], capsys)
    assert code == 2 and "analysis.top_k" in err
    cfg.write_text("grpah:\n  x: 1\n")
    code, _, err = run(["analyze", str(SAMPLE), "--config", str(cfg)], capsys)
    assert code == 2 and "unknown section 'grpah'" in err


def test_html_report_is_self_contained_and_escapes_trace_strings(tmp_path, capsys):
    doc = json.loads(gzip.open(PUBLIC / "cuda_event_sync_1gpu.json.gz").read())
    for e in doc["traceEvents"]:
        if e.get("name") == "cudaLaunchKernel":
            e["name"] = "<script>alert('x')</script>"
    src = tmp_path / "evil.json"
    src.write_text(json.dumps(doc))
    html = tmp_path / "r.html"
    code, _, _ = run(["analyze", str(src), "--html", str(html), "--top", "50"], capsys)
    assert code == 0
    text = html.read_text()
    assert "<script>alert" not in text and "&lt;script&gt;alert" in text  # the trace string is data, escaped
    assert not re.search(r"<(script|img|link|iframe)[^>]*(src|href)=", text)  # nothing loaded from outside: plotly.js is inline
    assert text.count("Plotly.newPlot") >= 3  # breakdown, timeline, slack: interactive figures
    assert "thread 948300 (python3.10)" in text  # lanes are named as the trace names its threads


def test_html_report_shortens_long_names_and_keeps_them_whole_as_tooltips(tmp_path, capsys):
    """A kernel's C++ signature runs past 1,000 characters (diff_test's embedding kernels, read
    from the raw events): its cell shows at most 100, the whole name (escaped) is its tooltip."""
    import html as html_mod

    doc = json.loads(gzip.open(PUBLIC / "diff_test_rank1of2.json.gz").read())
    long_names = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and len(e.get("name", "")) > 1000}
    out = tmp_path / "r.html"
    code, _, err = run(["analyze", str(PUBLIC / "diff_test_rank1of2.json.gz"), "--step", "1010", "--html", str(out)], capsys)
    assert code == 0, err
    text = out.read_text()
    cells = re.findall(r"<td title='([^']*)'>([^<]*)</td>", text)
    shown = {html_mod.unescape(full) for full, _ in cells}
    assert long_names & shown  # the long kernels on the path are there, whole, as tooltips
    assert all(len(html_mod.unescape(short)) <= 100 for _, short in cells)
    for name in long_names & shown:
        assert f">{html_mod.escape(name)}<" not in text  # never a cell of its own


def test_html_advice_has_no_empty_model_column_and_fits_its_long_edits(tmp_path, capsys):
    """With the graph network off (the default), the suggestions table has no model column (it was
    an empty one); a what-if edit naming a Python frame by its path runs past 100 characters
    without a space, and its cell may break inside it so that the table fits the page."""
    out = tmp_path / "r.html"
    code, _, err = run(["analyze", str(MORE / "timesformer_h100_1step.json.gz"), "--advise", "--html", str(out)], capsys)
    assert code == 0, err
    text = out.read_text()
    head = text[text.index("<h3>Suggestions</h3>") :]
    head = head[: head.index("</thead>")]
    assert "replay saving (ms)" in head and "model" not in head
    cells = re.findall(r"<td class='long'>([^<]*)</td>", text)
    assert any("module=transformers/" in c for c in cells)
    assert "td.long{overflow-wrap:anywhere" in text


def test_perfetto_overlay_marks_the_critical_path(tmp_path, capsys):
    out = tmp_path / "cp.json.gz"
    code, _, _ = run(["analyze", str(SAMPLE), "--perfetto", str(out), "--step", "1"], capsys)  # its critical path crosses ranks
    assert code == 0
    doc = json.loads(gzip.open(out).read())
    events = doc["traceEvents"]
    crit = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("critical") == 1]
    flows = [e for e in events if e.get("cat") == "critical_path"]
    assert len(crit) > 10 and len(flows) >= 2 and len(flows) % 2 == 0
    pids = {e["pid"] for e in crit}
    assert len({p // 10_000_000 for p in pids if isinstance(p, int)}) == 2  # both ranks, kept apart
    names = [e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
    assert any(n.startswith("rank 0:") for n in names) and any(n.startswith("rank 1:") for n in names)


def test_parse_writes_graphs_that_load(tmp_path, capsys):
    from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph

    code, out, _ = run(["parse", str(SAMPLE), "--output", str(tmp_path), "--json"], capsys)
    assert code == 0
    manifest = json.loads(out)
    assert [g["step"] for g in manifest["graphs"]] == [1, 2, 3]
    g = ExecutionGraph.load(tmp_path / "step-2.npz")
    assert g.ranks == [0, 1] and g.n_nodes == manifest["graphs"][1]["nodes"]
    assert manifest.pop("warnings") == []  # (--json's own: what the terminal warned about)
    assert json.loads((tmp_path / "graphs.json").read_text()) == manifest


def test_train_and_eval_name_what_is_missing(capsys, tmp_path):
    code, out, err = run(["train", "--config", "config.yaml", "--dataset", str(tmp_path / "none")], capsys)
    assert code == 2 and "no dataset" in err and str(tmp_path / "none") in err and out == ""
    (tmp_path / "x.pt").write_bytes(b"garbage")
    code, out, err = run(["eval", "--checkpoint", str(tmp_path / "x.pt")], capsys)
    assert code == 2 and "x.pt: not a checkpoint" in err and len(err.strip().splitlines()) == 1 and out == ""


def test_whatif_json_has_replay_and_the_pretrained_model(capsys):
    code, out, _ = run(["whatif", str(SAMPLE), "--step", "2", "--edit", "name~=all_reduce,scale=2", "--json", "--model"], capsys)
    assert code == 0
    (row,) = json.loads(out)["steps"]
    assert row["edited_nodes"] > 0 and row["replay"]["delta_us"] >= 0
    assert set(row["model"]["step_us"]) == {"bidirectional", "directed", "correction"} and row["model"]["checkpoint"].endswith(
        "pretrained.npz"
    )
    # in its domain (a CPU gloo run) the model answers; its effect is edited - unedited prediction
    assert row["model"]["out_of_domain"] is None
    for v, d in row["model"]["delta_us"].items():
        assert abs(d) < row["measured_us"] and row["model"]["step_us"][v] == pytest.approx(row["measured_us"] + d)
    code, out, err = run(["whatif", str(SAMPLE), "--edit", "name~=all_reduce,speed=2"], capsys)
    assert code == 2 and "unknown key 'speed'" in err and out == ""


def test_the_graph_network_says_out_of_domain_on_gpu_traces(capsys):
    """Trained on CPU gloo runs, the model gives no number on a GPU trace (it used to answer
    2e41 µs, or savings of the wrong sign): the column says "out of domain", the replay answers."""
    dlrm = Path(__file__).parent / "data" / "real-gpu" / "dlrm_v100_8rank"
    code, out, _ = run(["whatif", str(dlrm), "--edit", "name~=nccl,scale=0.5", "--json", "--model"], capsys)
    assert code == 0
    (row,) = json.loads(out)["steps"]
    assert row["model"]["out_of_domain"].startswith("out of domain") and "GPU" in row["model"]["out_of_domain"]
    assert set(row["model"]["delta_us"].values()) == {None} and set(row["model"]["step_us"].values()) == {None}
    assert row["replay"]["delta_us"] < 0  # the replay still answers
    code, out, _ = run(["whatif", str(dlrm), "--edit", "name~=nccl,scale=0.5", "--model"], capsys)
    assert code == 0 and "out of domain" in out and "e+" not in out


def test_blame_and_advise_json(capsys):
    code, out, _ = run(["blame", str(SAMPLE), "--step", "2", "--no-model", "--json"], capsys)
    assert code == 0
    (row,) = json.loads(out)["steps"]
    assert row["nodes"] and row["ranks"] and row["references"]
    code, out, _ = run(["advise", str(SAMPLE), "--step", "2", "--no-model", "--json"], capsys)
    assert code == 0
    (row,) = json.loads(out)["steps"]
    assert row["generator"].startswith("recipe engine") and all(s["replay_saving_us"] > 0 for s in row["suggestions"])
    code, out, _ = run(["analyze", str(SAMPLE), "--step", "2", "--advise", "--no-model", "--json"], capsys)
    assert code == 0
    (step,) = json.loads(out)["steps"]
    assert "blame" in step and "suggestions" in step["advice"]


def test_module_and_console_script_entry_points():
    r = subprocess.run([sys.executable, "-m", "bottleneck_oracle", "version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == cli.__version__


def test_whatif_microbatches_on_a_pipeline_step(generated_grid, capsys):
    raw, _ = generated_grid
    pp = next(p for p in raw.iterdir() if "pp2-1f1b" in p.name)
    code, out, _ = run(["whatif", str(pp), "--step", "4", "--microbatches", "8", "--no-model", "--json"], capsys)
    assert code == 0
    (row,) = json.loads(out)["steps"]
    mb = row["microbatches"]
    assert mb["from"] == 2 and mb["to"] == 8 and mb["stages"] == 2 and mb["schedule"] == "1f1b"
    assert row["replay"]["step_us"] == mb["step_us"] == pytest.approx(row["measured_us"] + mb["formula_delta_us"])
    code, out, _ = run(["whatif", str(pp), "--step", "4", "--set", "microbatches=2:2", "--json"], capsys)
    assert code == 0 and json.loads(out)["steps"][0]["microbatches"]["formula_delta_us"] == 0.0  # the same split changes nothing
    code, _, err = run(["whatif", str(pp), "--set", "microbatches=4:8"], capsys)
    assert code == 2 and "has 2 micro-batches, not 4" in err
    code, _, err = run(["whatif", str(SAMPLE), "--microbatches", "8", "--no-model"], capsys)
    assert code == 2 and "not a pipeline-parallel step" in err


def test_whatif_batch_is_the_batch_knob(capsys):
    """--batch R is --set batch=xR: the same replay; a ratio out of range is one clear error."""
    code, out, _ = run(["whatif", str(SAMPLE), "--batch", "2", "--json"], capsys)
    code2, out2, _ = run(["whatif", str(SAMPLE), "--set", "batch=x2", "--json"], capsys)
    assert code == code2 == 0
    a, b = json.loads(out)["steps"], json.loads(out2)["steps"]
    assert [r["replay"] for r in a] == [r["replay"] for r in b] and all(r["replay"]["delta_us"] > 0 for r in a)
    assert a[0]["knobs"] == ["batch x2"]
    code, _, err = run(["whatif", str(SAMPLE), "--batch", "0", "--no-model"], capsys)
    assert code == 2 and "ratio > 0" in err


def test_terminal_summary_walked_step_by_step_is_the_full_one(tmp_path, capsys, monkeypatch):
    """The terminal run keeps only the 20 slowest steps' analyses; its output equals the one
    printed from every step's analysis (the --html path holds them all)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synth_trace import generate

    generate(tmp_path / "job", events=60_000, ranks=1)  # 27 steps: more than the 20 detailed
    monkeypatch.setenv("COLUMNS", "120")
    code, streamed, _ = run(["analyze", str(tmp_path / "job"), "--detail"], capsys)
    code2, held, _ = run(["analyze", str(tmp_path / "job"), "--detail", "--html", str(tmp_path / "r.html")], capsys)
    assert code == code2 == 0 and "details below for the 20 slowest" in streamed
    assert streamed == held.replace(f"HTML report: {tmp_path / 'r.html'}\n", "")


def test_whatif_shows_the_corrected_replay_with_its_interval_beside_the_replay(capsys):
    """The bundled corrections (trained on paired re-runs) answer an edit that removes work with a
    corrected delta inside its 90% interval, refuse one that adds work, and --no-model leaves them out."""
    straggler = DATA / "gloo_ddp_8steps_straggler"  # rank 1 sleeps 20 ms inside forward in every step
    args = ["whatif", str(straggler), "--step", "4", "--edit", "module=forward,rank=1,gap=1,scale=0", "--json", "--model"]
    code, out, _ = run(args, capsys)
    assert code == 0
    (row,) = json.loads(out)["steps"]
    c = row["corrected"]
    assert c["out_of_domain"] is None, c
    lo, hi = c["interval_us"]
    assert lo <= c["delta_us"] <= hi and c["delta_us"] < 0 and c["step_us"] == pytest.approx(row["measured_us"] + c["delta_us"])
    from bottleneck_oracle.models.corrections import load_corrections

    # the conformal half-width is a share of the time the edit removes (here all of the added time)
    assert hi - lo == pytest.approx(2 * load_corrections().halfwidth * abs(row["added_us"]), rel=1e-6)
    assert "paired conditions" in c["trained_on"]
    code, out, _ = run(["whatif", str(straggler), "--step", "4", "--edit", "rank=1,name~=copy_,delay_ms=5", "--json", "--model"], capsys)
    (row,) = json.loads(out)["steps"]
    assert code == 0 and row["corrected"]["delta_us"] is None and "lengthens" in row["corrected"]["out_of_domain"]
    code, out, _ = run(["whatif", str(straggler), "--step", "4", "--edit", "rank=1,name~=copy_,delay_ms=5", "--model"], capsys)
    assert code == 0 and "corrections out of domain" in out and "the replay is the answer" in out
    for off in ([], ["--no-model"]):  # off by default: it has not earned a place beside the replay
        code, out, _ = run([*args[:-2], *off, "--json"], capsys)
        assert "corrected" not in json.loads(out)["steps"][0] and "model" not in json.loads(out)["steps"][0]
    # trained on CPU (gloo) runs: a GPU trace is refused in words a user can act on
    gpu = ["whatif", str(PUBLIC / "nccl_2rank_rank0.json.gz"), "--edit", "cat=kernel,scale=0.5", "--json", "--model"]
    code, out, _ = run(gpu, capsys)
    assert code == 0
    assert all("a GPU trace" in s["corrected"]["out_of_domain"] for s in json.loads(out)["steps"])


def test_blame_shows_the_corrected_saving_of_its_top_rows(capsys):
    straggler = DATA / "gloo_ddp_8steps_straggler"
    code, out, _ = run(["blame", str(straggler), "--step", "4", "--json", "--model"], capsys)
    assert code == 0
    (step,) = json.loads(out)["steps"]
    asked = [x for x in step["nodes"] if "corrected_saving_us" in x]
    assert asked and len(asked) <= 5
    for x in asked:
        if x["corrected_saving_us"] is not None:  # restoring an op to typical shortens it: in the corrections' domain
            lo, hi = x["corrected_interval_us"]
            assert lo <= x["corrected_saving_us"] <= hi
    assert any(x["corrected_saving_us"] is not None for x in asked)
    code, out, _ = run(["blame", str(straggler), "--step", "4", "--model"], capsys)
    assert code == 0 and "corrected [90%]" in out
    code, out, _ = run(["blame", str(straggler), "--step", "4", "--json", "--no-model"], capsys)
    assert all("corrected_saving_us" not in x for x in json.loads(out)["steps"][0]["nodes"])


def test_a_long_run_prints_its_slowest_steps_not_every_step(tmp_path, capsys, monkeypatch):
    """Past MAX_STEP_ROWS steps the terminal's steps table holds the 20 slowest (by the graph's
    step time, the --json figures), in step order; --detail prints every step."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synth_trace import generate

    generate(tmp_path / "job", events=110_000, ranks=1)
    monkeypatch.setenv("COLUMNS", "120")
    code, out, _ = run(["analyze", str(tmp_path / "job"), "--json"], capsys)
    times = {s["step"]: s["step_time_us"] for s in json.loads(out)["steps"]}
    assert code == 0 and len(times) > 40
    slowest = sorted(sorted(times, key=lambda s: -times[s])[:20])
    code, out, _ = run(["analyze", str(tmp_path / "job")], capsys)
    rows = [int(line.split("│")[1]) for line in out.splitlines() if line.startswith("│") and line.split("│")[1].strip().isdigit()]
    assert code == 0 and f"the 20 slowest of {len(times)} steps (every step: --detail)" in out
    assert rows == slowest
    code, out, _ = run(["analyze", str(tmp_path / "job"), "--detail"], capsys)
    assert code == 0 and "slowest of" not in out.split("\n\n")[0]
    steps_table = out[out.index("Steps (ms)") : out.index("└")]
    assert sorted(
        int(line.split("│")[1]) for line in steps_table.splitlines() if line.startswith("│") and line.split("│")[1].strip().isdigit()
    ) == sorted(times)


def test_analyze_advise_says_the_advice_once_for_the_run_and_no_culprit_that_saves_nothing(capsys):
    """train_1rank_5steps: five steps, one rank, no baseline. The advice comes once, across the
    steps, as `advise` gives it (its --json 'run'); each step's advice only with --detail; a blame
    culprit whose saving rounds to 0.000 ms is not shown as one."""
    trace = str(PUBLIC / "train_1rank_5steps.json.gz")
    code, out, err = run(["advise", trace, "--json"], capsys)
    assert code == 0, err
    run_doc = json.loads(out)["run"]
    titles = [x["title"] for x in run_doc[:3]]
    assert run_doc[0]["of"] == 4  # the steady steps: all but the first of the five
    code, out, err = run(["analyze", trace, "--advise"], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert text.count("Across 4 steps (the steady ones of 5)") == 1 and "advice:" not in text
    assert [t for t in titles if f"- {t}: in " in text] == titles
    assert not re.search(r"\(rank \d+\) 0\.000 ms", text)
    code, out, _ = run(["analyze", trace, "--advise", "--detail"], capsys)
    assert sum(f"Step {n} advice:" in out for n in range(101, 106)) == 5


def test_blame_shows_no_culprit_that_saves_less_than_the_step_s_noise(capsys):
    """Step 103 of train_1rank_5steps is as fast as its neighbours (blame --json: no node saves 1%
    of the step): the terminal says there is no culprit instead of a table of 0.000 ms rows; a
    straggler step still gets its table, every row above the floor."""
    trace = str(PUBLIC / "train_1rank_5steps.json.gz")
    code, out, err = run(["blame", trace, "--step", "103", "--json"], capsys)
    assert code == 0, err
    (step,) = json.loads(out)["steps"]
    floor = 0.01 * step["makespan_us"]
    assert step["nodes"] and max(x["saving_us"] for x in step["nodes"]) < floor
    code, out, _ = run(["blame", trace, "--step", "103"], capsys)
    assert "No culprit op" in out and "Culprit ops" not in out
    straggler = str(DATA / "gloo_ddp_8steps_straggler")
    code, out, _ = run(["blame", straggler, "--step", "5", "--json"], capsys)
    (step,) = json.loads(out)["steps"]
    above = [x for x in step["nodes"] if x["saving_us"] >= 0.01 * step["makespan_us"]]
    code, out, _ = run(["blame", straggler, "--step", "5"], capsys)
    rows = re.findall(r"^│ (\d+) +│", out, re.M)
    assert above and len(rows) == len(above)


def test_compare_keeps_the_change_column_at_80_columns_and_it_adds_up(capsys):
    """diff_control -> diff_test at 80 columns: the table that explains the change shows the
    change column (the narrow terminal leaves out ranks and kind instead), and its rows add up to
    compare --json's change of the medians."""
    a, b = str(PUBLIC / "diff_control_rank3of8.json.gz"), str(PUBLIC / "diff_test_rank1of2.json.gz")
    code, out, err = run(["compare", a, b, "--json"], capsys)
    assert code == 0, err
    delta_ms = json.loads(out)["delta_us"] / 1000
    code, out, _ = run(["compare", a, b], capsys)
    table = out[out.index("What moved") : out.index("By kind")]
    header = next(line for line in table.splitlines() if "what" in line)
    assert "change" in header and max(len(line) for line in table.splitlines()) <= 80
    rows = [line for line in table.splitlines() if line.startswith("│") and "what" not in line]
    changes = [float(line.split("│")[2]) for line in rows]
    assert changes[-1] == pytest.approx(delta_ms, abs=0.001)  # the total row
    assert sum(changes[:-1]) == pytest.approx(delta_ms, abs=0.002 * len(changes))


def test_advise_gives_a_run_s_advice_once_and_each_step_s_with_detail(capsys):
    """train_1rank_5steps: `advise` prints the suggestions across the steady four of the five steps, each with the
    what-if edits of advise --json's run, and each step's section only with --detail (a single
    step is shown whole)."""
    trace = str(PUBLIC / "train_1rank_5steps.json.gz")
    code, out, err = run(["advise", trace, "--json"], capsys)
    assert code == 0, err
    top = json.loads(out)["run"][:3]
    code, out, _ = run(["advise", trace], capsys)
    text = " ".join(out.split())
    assert "Across 4 steps (the steady ones of 5)" in text and not re.search(r"Step 10\d:", text)
    assert all(" ".join("; ".join(x["edits"]).split()) in text for x in top)
    code, out, _ = run(["advise", trace, "--detail"], capsys)
    assert len(re.findall(r"^Step 10\d:", out, re.M)) == 5
    code, out, _ = run(["advise", trace, "-s", "103"], capsys)
    assert re.findall(r"^Step 103:", out, re.M) and "Across" not in out

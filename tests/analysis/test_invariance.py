"""What must not change the answer: the order of a trace's events in its file, and the vendor's
names for the same runtime calls.

Real traces reach users in more shapes than the ones recorded here: exporters and trace tools
(splitters, mergers, converters) write events in time order or in any order, and ROCm's PyTorch
writes ``hipLaunchKernel``/``hipMemcpyAsync``/``hipStreamSynchronize`` where CUDA's writes
``cudaLaunchKernel``/``cudaMemcpyAsync``/``cudaStreamSynchronize``. A rule that leans on file order
or on one vendor's spelling would be right on the traces at hand and wrong on the twin a user
brings. The oracle is the analysis of the trace as recorded: each variant must give the same
figures, checks and warnings (the vendor's names aside).
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from orjson import OPT_SORT_KEYS

from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.api import graphs, load
from bottleneck_oracle.graph_pipeline.schema import CollectiveKind, NodeType
from bottleneck_oracle.serial import dumps
from conftest import DATA, MORE, PUBLIC, REAL, raw_optimizer_steps

# a blocking copy behind a GPU-bound forward pass (cuLaunchKernel too), a 5-step DDP rank on
# V100, event synchronisation across streams
FIXTURES = (
    MORE / "timesformer_h100_1step.json.gz",
    REAL / "ddp_v100_rank1of2_5steps.json.gz",
    PUBLIC / "cuda_event_sync_multistream_1gpu.json.gz",
)


def _unseen():
    """benchmarks/unseen.py: the rewrites of a trace that tools make (trimming, merging, lanes)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import unseen

    return unseen


def _analysis(path: Path) -> str:
    """Every step's analysis as JSON text, the input's path left out."""
    steps = [StepAnalysis.of(g).to_dict() for g in graphs(load(path))]
    return dumps(steps, OPT_SORT_KEYS).decode().replace(str(path), "<trace>")


def _document(path: Path) -> dict:
    return json.loads(gzip.open(path).read())


def _written(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name.split(".")[0])
def test_the_order_of_events_in_the_file_does_not_change_the_analysis(fixture, tmp_path):
    # the recorded document written back as it is, against the same events shuffled and sorted by
    # time: json's float text is the same in all three, so only the order differs
    doc = _document(fixture)
    as_recorded = _analysis(_written(doc, tmp_path / "recorded.json"))
    events = doc["traceEvents"]
    random.Random(7).shuffle(events)
    assert _analysis(_written(doc, tmp_path / "shuffled.json")) == as_recorded
    events.sort(key=lambda e: e.get("ts", 0) if isinstance(e.get("ts", 0), (int, float)) else 0)
    assert _analysis(_written(doc, tmp_path / "sorted.json")) == as_recorded


_CUDA_NAME = re.compile(r'"name":\s*"(cu(?:da)?)([A-Z][A-Za-z0-9_]*)"')


def _hip_name(m: re.Match) -> str:
    prefix, rest = m.group(1), m.group(2)
    if prefix == "cu" and rest.startswith("LaunchKernel"):
        return '"name": "hipModuleLaunchKernel"'  # the driver API's launch, as ROCm names it
    return f'"name": "hip{rest}"'


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name.split(".")[0])
def test_rocm_names_for_the_same_runtime_calls_give_the_same_analysis(fixture, tmp_path):
    text = gzip.open(fixture).read().decode()
    hip_text, renamed = _CUDA_NAME.subn(_hip_name, text)
    assert renamed >= 30 and "hipLaunchKernel" in hip_text
    original = tmp_path / "cuda.json"
    original.write_text(text)
    hip = tmp_path / "hip.json"
    hip.write_text(hip_text)
    on_cuda = _analysis(original).replace("<trace>", "")
    on_hip = _analysis(hip).replace("<trace>", "")
    # the analysis of the ROCm spelling, its names spelt back, is the analysis of the CUDA one
    back = on_hip.replace("hipModuleLaunchKernel", "cuLaunchKernel").replace("hip", "cuda")
    assert "hip" not in on_cuda
    assert back == on_cuda


@pytest.mark.parametrize("token", ["inf", "-inf", "nan", "NaN", "Infinity", "-Infinity", "N/A"])
def test_bare_non_json_tokens_in_args_are_read_past(token, tmp_path):
    """Kineto once wrote a zero-length copy's bandwidth as a bare ``inf`` (pytorch/kineto#105) and
    ``N/A`` unquoted (#128); Python's json writes ``NaN`` and ``Infinity``. JSON has none of them,
    but a trace holding one in args the analysis does not read is the same trace: every step's
    analysis equals the clean one's, for copies, kernels and the NCCL kernels whose args are
    decoded in full (nccl_2rank). Before, the file was refused as not valid JSON."""
    path = PUBLIC / "nccl_2rank_rank0.json.gz"
    text = gzip.open(path).read().decode()
    dirty, n = re.subn(r'("cat": "(?:kernel|gpu_memcpy)",[^{]*?"args": \{)', lambda m: m.group(1) + f'"bandwidth": {token}, ', text)
    assert n > 100 and "ncclKernel" in text
    (tmp_path / "clean.json").write_text(text)
    (tmp_path / "dirty.json").write_text(dirty)
    assert _analysis(tmp_path / "dirty.json").replace("dirty.json", "") == _analysis(tmp_path / "clean.json").replace("clean.json", "")


def test_a_rank_on_another_host_counting_from_its_own_base_reads_as_on_one_clock(tmp_path):
    """Recent Kineto writes each event's ts from the file's ``baseTimeNanoseconds`` (a host's boot
    time: every file of our own gloo recordings has the same one, recorded on one host). A rank on
    a host booted 3 days later counts from a base 3 days later, so its raw ts are 3 days smaller.
    Read on one clock (the bases' difference added), the job analyses as recorded; read raw, its
    ranks were 259,200 s apart and the job was refused as two runs."""
    src = DATA / "gloo_ddp_8steps_straggler"
    later = 3 * 86_400 * 10**6
    for r in (0, 1):
        doc = json.loads(gzip.open(src / f"rank-{r}.json.gz").read())
        assert isinstance(doc.get("baseTimeNanoseconds"), int)
        if r == 1:
            for e in doc["traceEvents"]:
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] -= later
            doc["baseTimeNanoseconds"] += later * 1000
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(doc))
    assert _analysis(tmp_path) == _analysis(src)


def test_host_ops_rounded_a_nanosecond_apart_read_as_recorded(tmp_path):
    """PyTorch once rounded an op's start and end apart to the ns (pytorch#122425: events of one
    thread overlapping by a ns). ddp_v100 with every host op's start and duration moved by -1, 0 or
    +1 ns: each step's breakdown is within 0.1% of the step time of the recorded one's. With a leaf
    that had to end before its next op started, 1.9-2.1 ms a step (0.6%) moved from untraced to
    CPU overhead."""
    import random

    path = REAL / "ddp_v100_rank1of2_5steps.json.gz"
    doc = json.loads(gzip.open(path).read())
    rng = random.Random(3)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "python_function", "cuda_runtime"):
            e["dur"] = max(0.0, round(e["dur"] + rng.choice((-0.001, 0.0, 0.001)), 3))
            e["ts"] = round(e["ts"] + rng.choice((-0.001, 0.0, 0.001)), 3)
    (tmp_path / "jittered.json").write_text(json.dumps(doc))
    jittered = [StepAnalysis.of(g) for g in graphs(load(tmp_path / "jittered.json"))]
    recorded = [StepAnalysis.of(g) for g in graphs(load(path))]
    assert [a.graph.step for a in jittered] == [a.graph.step for a in recorded]
    for a, b in zip(jittered, recorded):
        for k, v in a.breakdown().items():
            assert v == pytest.approx(b.breakdown()[k], abs=0.001 * b.step_time), (a.graph.step, k)


def test_an_accelerator_without_its_process_name_is_still_read(tmp_path):
    """A trace whose metadata events were filtered out (``jq 'select(.ph == "X")'`` to shrink it)
    has no process names: the MTIA's device events, in a category this tool does not know, were read
    as device ops only on a process named like an accelerator ("MTIA 17"), so without the name
    they were left out and the step read as host only (349.5 ms against 450.8 ms, untraced-bound).
    A process with no host op whose events name a stream is the accelerator: the step, its
    breakdown and the device's op count read as recorded."""
    path = MORE / "mtia_inference_rank0.json.gz"
    doc = _document(path)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    unnamed = [StepAnalysis.of(g) for g in graphs(load(_written(doc, tmp_path / "unnamed.json")))]
    recorded = [StepAnalysis.of(g) for g in graphs(load(path))]
    assert len(unnamed) == len(recorded) == 1
    a, b = unnamed[0], recorded[0]
    assert b.graph.nodes["on_gpu"].sum() > 1000  # the device's ops, as recorded
    assert int(a.graph.nodes["on_gpu"].sum()) == int(b.graph.nodes["on_gpu"].sum())
    assert a.step_time == pytest.approx(b.step_time, rel=1e-9)
    assert a.breakdown() == pytest.approx(b.breakdown(), abs=1e-3)


@pytest.mark.parametrize(
    "path", [PUBLIC / "train_1rank_5steps.json.gz", REAL / "ddp_v100_rank1of2_5steps.json.gz"], ids=lambda p: p.name.split("_")[0]
)
def test_steps_a_trimmed_trace_ends_inside_are_said_and_left_out(path, tmp_path, capsys):
    """A trace trimmed to a time ends inside a step: that step's device work (and, past its
    launches, its host ops) are gone, and it read as a short step without a word (train_1rank_5steps
    cut at 80%: step 104 84.6 ms where it runs 95.7, step 105 17.2 ms; the run's step time 84.6 ms
    against 95.6 recorded). From the raw events: a step is cut where a kernel launched in its span
    starts after the cut, or its span ends more than 1 ms and 5% of it after the cut. Those steps
    are said and left out of the run's figures; the others read as recorded, and so does the run
    (ddp_v100 cut so: its last step's host ops stop 17.6 ms before its span ends)."""
    from conftest import run_cli

    whole = _document(path)["traceEvents"]
    stop = _unseen().trimmed(path, 0.8, tmp_path / "trimmed.json")
    kernels = {e["args"]["correlation"]: e["ts"] for e in whole if e.get("cat") == "kernel"}
    marks = [e for e in whole if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    cut = set()
    for m in marks:
        launches = [
            e
            for e in whole
            if e.get("cat") == "cuda_runtime" and "Launch" in e["name"] and m["ts"] <= e["ts"] <= m["ts"] + m["dur"] and e["ts"] <= stop
        ]
        late = any(kernels.get(e["args"]["correlation"], 0) > stop for e in launches)
        past = m["ts"] + m["dur"] - stop
        if m["ts"] <= stop and (late or past > max(1000.0, 0.05 * m["dur"])):
            cut.add(int(m["name"].removeprefix("ProfilerStep#")))
    assert cut and cut == ({104, 105} if "train" in path.name else cut)
    code, out, err = run_cli(["analyze", str(tmp_path / "trimmed.json"), "--json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    said = {s["step"] for s in res["steps"] if any("the trace ends inside this step" in w for w in s["warnings"])}
    assert said == cut
    assert any("the trace ends inside" in n and ", ".join(map(str, sorted(cut))) in n for n in res["run"]["notes"])
    code, out, _ = run_cli(["analyze", str(tmp_path / "trimmed.json")], capsys)  # the steps table marks them
    assert code == 0 and all(f"{n} (cut)" in out for n in cut) and out.count(" (cut) ") == len(cut)
    as_written = _written(_document(path), tmp_path / "recorded.json")  # (json's float text, as in the trimmed file)
    recorded = {s["step"]: s for s in json.loads(run_cli(["analyze", str(as_written), "--json"], capsys)[1])["steps"]}
    for s in res["steps"]:
        if s["step"] not in cut:
            assert s["step_time_us"] == pytest.approx(recorded[s["step"]]["step_time_us"], rel=1e-9)
    held = sorted(s["step"] for s in res["steps"])
    kept = [recorded[s]["step_time_us"] for s in held[1:] if s not in cut]  # (the first: warm-up)
    assert res["run"]["step_time"]["median_us"] == pytest.approx(float(np.median(kept)), rel=1e-9)


def test_a_last_step_that_ends_with_untraced_work_is_whole(tmp_path):
    """A loop that writes a checkpoint after its last step's ops (``torch.save`` before the last
    ``prof.step()``: pickling and the file write are no ops) ends that step's span long after its
    rank's last event, as a trace trimmed inside the step does; it was said to be cut and left out
    of the run's figures (a real recording: its 104 ms last step, 60 ms of it the save). It holds
    every op the rank's other steps hold, as a trimmed step does not: it is whole, and its time is
    its span. Oracle: own-cpu/adamw_foreach with its last span made 30 ms longer reads that step 30
    ms longer and not cut; the same trace with the last step's second half of events removed is
    still cut."""
    from bottleneck_oracle.analysis.answer import run_answer

    path = DATA / "own-cpu" / "adamw_foreach.json.gz"
    doc = _document(path)
    marks = sorted(
        (e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )
    last = marks[-1]
    recorded = {a.graph.step: a.step_time for a in (StepAnalysis.of(g) for g in graphs(load(path)))}
    number = int(last["name"].removeprefix("ProfilerStep#"))
    start, end = float(last["ts"]), float(last["ts"]) + float(last["dur"])
    last["dur"] = float(last["dur"]) + 30_000.0
    saved = [StepAnalysis.of(g) for g in graphs(load(_written(doc, tmp_path / "saved.json")))]
    (a,) = [x for x in saved if x.graph.step == number]
    assert not a.cut_by_trace_end()
    assert a.step_time == pytest.approx(recorded[number] + 30_000.0, rel=0.01)
    assert run_answer(saved).steady == len(saved) - 1  # (all but the warm-up)
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if e is last or not (e.get("ph") == "X" and float(e.get("ts", 0)) > (start + end) / 2)
    ]
    trimmed = [StepAnalysis.of(g) for g in graphs(load(_written(doc, tmp_path / "trimmed.json")))]
    (b,) = [x for x in trimmed if x.graph.step == number]
    assert b.cut_by_trace_end()


@pytest.mark.parametrize("style", ["sglang", "tracefuse", "one_pid"])
def test_ranks_merged_into_one_file_read_as_the_ranks(style, tmp_path):
    """Scripts that merge a job's per-rank traces into one file for viewing them together (in
    Perfetto, chrome://tracing) leave each rank's processes told apart in their own way
    (benchmarks/unseen.py merged_ranks).
    dlrm's 8 workers merged so read as one rank whose launches were tied to other ranks' device ops
    (each process counts its correlation ids from 1; in SGLang's style a 20.7 ms step, all
    untraced, a failed self-check). Split by what the merge left, each step reads as the folder of
    the 8 files does."""
    folder = REAL / "dlrm_v100_8rank"
    unseen = _unseen()
    path = _written(unseen.merged_ranks(unseen.rank_documents(folder), style), tmp_path / "merged.json")
    with pytest.warns(Warning, match=r"holds 8 ranks' traces merged into one file"):
        got = [StepAnalysis.of(g) for g in graphs(load(path))]
    want = [StepAnalysis.of(g) for g in graphs(load(folder))]
    assert [a.graph.step for a in got] == [a.graph.step for a in want]
    for a, b in zip(got, want):
        assert sorted(a.graph.ranks) == sorted(b.graph.ranks) == list(range(8))
        assert a.step_time == pytest.approx(b.step_time, rel=1e-9)
        assert a.breakdown() == pytest.approx(b.breakdown(), abs=1e-6)
        assert a.straggler().rank == b.straggler().rank
        assert [c.ok for c in a.checks()] == [c.ok for c in b.checks()]


def test_a_streams_ops_split_onto_lanes_of_their_own_read_on_their_stream(tmp_path):
    """A rewrite for trace viewers that cannot draw overlapping slices on one track (the sglang
    community's "perfetto-compatible" script) moves each kernel that starts before the previous
    one on its lane ended onto a lane of its own (tid ``"7_hack"``), its ``args.stream`` unchanged.
    Read by lane, the stream's order was lost: diff_control's steps traded 0.4 ms of compute for
    CPU overhead. Read by the stream its args name, each step reads as recorded."""
    path = PUBLIC / "diff_control_rank3of8.json.gz"
    doc = _document(path)
    assert _unseen().viewer_lanes(doc) > 100
    with pytest.warns(Warning, match="device ops on lanes split from their stream"):
        split = [StepAnalysis.of(g) for g in graphs(load(_written(doc, tmp_path / "split.json")))]
    recorded = [StepAnalysis.of(g) for g in graphs(load(_written(_document(path), tmp_path / "recorded.json")))]
    assert [a.graph.step for a in split] == [a.graph.step for a in recorded]
    for a, b in zip(split, recorded):
        assert a.step_time == pytest.approx(b.step_time, rel=1e-9)
        assert a.breakdown() == pytest.approx(b.breakdown(), abs=1e-6)


def test_ranks_merged_into_one_file_without_steps_read_as_the_ranks(tmp_path):
    """An inference server's traces have no ProfilerStep (SGLang's): merged by SGLang's script, a
    tensor-parallel job's ranks were read as one, each process's launches tied to the other's
    device ops by their colliding correlation ids, without a word. Here the one SGLang trace we
    have twice, as two ranks: the processes that call the device's runtime are the ranks, and the
    window reads as the one file does, every self-check holding. Merged without a name that tells
    the ranks apart (the pids as they are), it is read as one rank, and said."""
    path = MORE / "sglang_qwen3_8b_prefilldecode_mi300.json.gz"
    unseen = _unseen()
    merged = _written(unseen.merged_ranks([_document(path), _document(path)], "sglang"), tmp_path / "merged.json")
    with pytest.warns(Warning) as said:
        (got,) = [StepAnalysis.of(g) for g in graphs(load(merged))]
    said_text = [str(w.message) for w in said]
    assert any("holds 2 ranks' traces merged into one file (processes that each call the device runtime" in t for t in said_text)
    with pytest.warns(Warning) as alone:
        (want,) = [StepAnalysis.of(g) for g in graphs(load(path))]
    sampled = next(str(w.message).split(": ", 1)[1] for w in alone if "events its profiler numbered" in str(w.message))
    assert sum(t.endswith(sampled.replace("rank 0", f"rank {r}")) for t in said_text for r in (0, 1)) == 2  # each rank its share
    assert sorted(got.graph.ranks) == [0, 1]
    assert got.step_time == pytest.approx(want.step_time, rel=1e-9)
    assert got.breakdown() == pytest.approx(want.breakdown(), abs=1e-6)
    assert all(c.ok for c in got.checks())
    plain = _document(path)
    other = _document(path)
    for e in other["traceEvents"]:
        if isinstance(e.get("pid"), int) and e["pid"] > 100:  # (the host's pid; the device's stays 0 or 1)
            e["pid"] += 1
    plain["traceEvents"] += other["traceEvents"]
    with pytest.warns(Warning, match=r"2 processes call the device's runtime .*give each rank its own file"):
        load(_written(plain, tmp_path / "plain.json"))


@pytest.mark.parametrize("step", [103, 104])
def test_a_step_split_into_a_file_of_its_own_reads_as_in_the_whole_trace(step, tmp_path):
    """TraceLens' trace splitter writes one step's file with the step's host events and the device
    ops they launched, not the work queued before it. train_1rank_5steps is device-bound (its
    device runs a step behind its host), so the step's first kernel waited 88.7 ms for that
    unseen work, and the file alone read as a 185.2 ms step, 48% untraced: the queued work read as
    idle. The first device op of a rank that starts a millisecond or more after its launch, the
    device busy from then on, marks the end of work queued before the trace: the step is measured
    from there and reads as it does in the whole trace (its period), and a warning says so."""
    path = PUBLIC / "train_1rank_5steps.json.gz"
    whole = _document(path)
    recorded = {a.graph.step: a for a in (StepAnalysis.of(g) for g in graphs(load(_written(whole, tmp_path / "whole.json"))))}
    with pytest.warns(Warning) as said:
        (alone,) = [StepAnalysis.of(g) for g in graphs(load(_written(_unseen().split_step(_document(path), step), tmp_path / "one.json")))]
    assert alone.graph.step == step
    assert alone.step_time == pytest.approx(recorded[step].step_time, rel=1e-3)
    assert alone.breakdown()["untraced"] <= 0.01 * alone.step_time
    assert alone.graph.info.facts.ranks[0].queued_before_trace_us > 50_000
    assert any("work queued before the trace began held it" in w for w in alone.warnings())
    assert not any("queued before the trace" in str(w.message) for w in said)  # (said per step, not at load)


def test_a_window_without_steps_after_work_queued_before_the_trace_reads_as_its_period(tmp_path):
    """The same as a file without ProfilerStep markers (an inference server's iteration split into a
    file of its own has none): the whole trace is one window, measured from where the unseen work
    queued before it ended, and reads as the step does in the whole trace."""
    path = PUBLIC / "train_1rank_5steps.json.gz"
    whole = _document(path)
    (recorded,) = [a for a in (StepAnalysis.of(g) for g in graphs(load(_written(whole, tmp_path / "whole.json")))) if a.graph.step == 103]
    one = _unseen().split_step(_document(path), 103)
    one["traceEvents"] = [e for e in one["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    (alone,) = [StepAnalysis.of(g) for g in graphs(load(_written(one, tmp_path / "one.json")))]
    assert alone.graph.step is None
    assert alone.step_time == pytest.approx(recorded.step_time, rel=1e-3)
    assert alone.breakdown()["untraced"] <= 0.01 * alone.step_time
    assert any("work queued before the trace began held it" in w for w in alone.warnings())


def test_a_late_first_op_is_not_taken_for_queued_work_where_its_host_ran_far_longer():
    """HTA's backward_thread test file keeps 7 events of a real trace: a 413.5 ms ProfilerStep, and
    one 45 µs kernel that started 64.1 ms after its launch returned, nothing on the device before
    it. Work the loop queued before the trace would have held it only if the step, measured from
    there, kept its host's pace: 18.1 ms against the host's 413.5 ms does not. The step was read
    as 18.1 ms, measured from the kernel; it is its span (read here from the raw JSON), the late
    start an untraced wait, and a warning says why (not that queued work held it)."""
    path = PUBLIC / "backward_thread_excerpt.json"
    events = json.loads(path.read_text())["traceEvents"]
    (step,) = [e for e in events if e["name"].startswith("ProfilerStep#")]
    (kernel,) = [e for e in events if e["cat"] == "kernel"]
    (launch,) = [e for e in events if e["cat"] == "cuda_runtime"]
    lag_ms = (kernel["ts"] - launch["ts"] - launch["dur"]) / 1000
    (a,) = [StepAnalysis.of(g) for g in graphs(load(path))]
    assert a.step_time == pytest.approx(step["dur"], rel=1e-3)
    f = a.graph.info.facts.ranks[0]
    assert f.queued_before_trace_us == 0 and f.first_op_held_us == pytest.approx(lag_ms * 1000, abs=1)
    said = a.warnings()
    assert not any("work queued before the trace began held it" in w for w in said)
    assert any(f"first op {lag_ms:,.1f} ms after its launch" in w and "untraced wait on the device" in w for w in said)


def test_a_thread_filtered_out_leaves_its_kernels_in_their_step(tmp_path):
    """Scripts that slim a trace for a viewer keep the main thread and the streams and drop the
    other threads (``slim_trace.py -t=auto``): train_1rank_5steps without its autograd thread keeps
    the backward's kernels but not their launches. The device runs a step behind its host, so
    those kernels, placed by their own start, fell in the next step: each step read 99% untraced
    ("device idle") and 1% compute. A device op without a traced launch was launched no later
    than the next op on its stream whose launch is traced: placed so, each step reads as recorded
    (compute within 1% of the step), and the self-check still says its launches are missing."""
    path = PUBLIC / "train_1rank_5steps.json.gz"
    doc = _document(path)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"}
    gone = {k for k, v in names.items() if "autograd" in v}
    assert len(gone) == 1
    doc["traceEvents"] = [e for e in doc["traceEvents"] if (e.get("pid"), e.get("tid")) not in gone]
    slim = {a.graph.step: a for a in (StepAnalysis.of(g) for g in graphs(load(_written(doc, tmp_path / "slim.json"))))}
    recorded = {a.graph.step: a for a in (StepAnalysis.of(g) for g in graphs(load(_written(_document(path), tmp_path / "r.json"))))}
    for n in (102, 103, 104, 105):
        a, b = slim[n], recorded[n]
        assert a.step_time == pytest.approx(b.step_time, rel=1e-6)
        assert a.breakdown()["compute"] == pytest.approx(b.breakdown()["compute"], abs=0.01 * b.step_time)
        assert [c.ok for c in a.checks() if c.name == "linked"] == [False]


def _without_step_markers(doc: dict) -> dict:
    """``doc`` as its profiler writes it when the loop never calls its ``step()``: no ProfilerStep
    spans (on the host, nor their projections on the device)."""
    return {**doc, "traceEvents": [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]}


@pytest.mark.parametrize(
    "path",
    [
        PUBLIC / "train_1rank_5steps.json.gz",
        REAL / "ddp_v100_rank1of2_5steps.json.gz",
        PUBLIC / "diff_test_rank1of2.json.gz",
        PUBLIC / "sampled_128rank",
        DATA / "gloo_ddp_8steps_straggler",
        DATA / "gloo_ddp_10steps_injected",  # (two slow steps of 44 ms among 10-17 ms ones: still cut)
    ],
    ids=lambda p: "_".join(p.name.split("_")[:2]).split(".")[0],
)
def test_a_loop_that_never_calls_the_profilers_step_reads_its_iterations(path, tmp_path):
    """The commonest way to record a loop, ``with profile() as prof:`` around it without
    ``prof.step()``, leaves no ProfilerStep markers, and the whole trace read as one step (five
    iterations of train_1rank_5steps as one 480 ms "step"). PyTorch's optimizers record
    ``Optimizer.step#<class>.step`` around each step they take, once an iteration: the ends of
    those cut the iterations (the last optimizer to step where there are several, sampled_128rank's
    Shampoo and EMA). The steps are where the raw annotations end, there are as many as the recorded
    ProfilerSteps, and the run reads as it does with the markers: its step time within 2%, its
    straggler the same rank, what bounds it the same."""
    from bottleneck_oracle.analysis.answer import run_answer
    from bottleneck_oracle.api import analyze

    files = sorted(path.glob("*.json.gz")) if path.is_dir() else [path]
    bare, recorded = tmp_path / "bare", tmp_path / "recorded"
    bare.mkdir()
    recorded.mkdir()
    ends, counts = [], []
    for f in files:
        doc = _document(f)
        counts.append(sum(1 for e in doc["traceEvents"] if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")))
        _written(doc, recorded / f.name.removesuffix(".gz"))
        stripped = _without_step_markers(doc)
        cut = raw_optimizer_steps(stripped)
        (thread_steps,) = [v for v in cut.values() if len(v) == max(map(len, cut.values()))]
        ends.append([e for _, e in thread_steps])
        _written(stripped, bare / f.name.removesuffix(".gz"))
    with pytest.warns(Warning, match=r"no ProfilerStep markers \(the loop does not call the profiler's step\(\)\); its \d+ steps are cut"):
        table = load(bare)
    for rank, (want, n) in enumerate(zip(ends, counts)):
        mine = sorted((s for s in table.steps if s.rank == table.ranks[rank]), key=lambda s: s.number)
        assert [s.number for s in mine] == list(range(1, n + 1))
        assert [s.end - mine[0].end for s in mine] == pytest.approx(
            [e - want[0] for e in want], abs=0.5
        )  # (µs: the raw floats hold 0.25 at these clocks)
        assert all(a.end == pytest.approx(b.start, abs=1e-6) for a, b in zip(mine, mine[1:]))
    got, want = run_answer(analyze(bare)[1]), run_answer(analyze(recorded)[1])
    assert got.steps == want.steps and got.steady == want.steady
    assert got.step_time.median_us == pytest.approx(want.step_time.median_us, rel=0.02)
    assert got.bound == want.bound
    assert (got.straggler.rank if got.straggler else None) == (want.straggler.rank if want.straggler else None)


def test_two_optimizers_of_one_class_leave_the_trace_one_window(tmp_path):
    """Two optimizers of one class stepping once an iteration each (a GAN's generator and
    discriminator) record the same name twice an iteration: cutting at every end would halve the
    iterations, so the intervals between them, irregular, leave the whole trace one window, said."""
    doc = _without_step_markers(_document(PUBLIC / "train_1rank_5steps.json.gz"))
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#")]
    doc["traceEvents"] += [{**e, "ts": e["ts"] - 20_000, "dur": 100} for e in steps]  # a second one, 20 ms before each
    with pytest.warns(Warning, match=r"10 Optimizer.step#SGD.step annotations come at intervals that alternate short and long"):
        table = load(_written(doc, tmp_path / "two.json"))
    assert table.steps == []


INFERENCE_LOOP = DATA / "own-cpu" / "inference_loop_nosteps.json.gz"


def test_steps_at_cuts_an_inference_loop_at_its_own_annotations(capsys):
    """Our own inference loop (benchmarks/record_inference.py): eight iterations, each a 2 ms
    untraced scheduler wait then the model under ``execute_<batch>_iter_<i>``, no ProfilerStep
    markers and no optimizer. Read whole it is one 26 ms window, and the warning names the way out;
    with ``--steps-at 'execute_*'`` each annotation starts a step: eight steps, each as long as
    the raw interval from its annotation's start to the next one's (the last to its own end), the
    scheduler's wait in the step it precedes."""
    from conftest import run_cli

    raw = sorted(
        (e for e in _document(INFERENCE_LOOP)["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("execute_")),
        key=lambda e: e["ts"],
    )
    assert len(raw) == 8
    want = [b["ts"] - a["ts"] for a, b in zip(raw, raw[1:])] + [raw[-1]["dur"]]
    code, out, err = run_cli(["analyze", str(INFERENCE_LOOP), "--json"], capsys)
    assert code == 0 and [s["step"] for s in json.loads(out)["steps"]] == [None]
    assert "no ProfilerStep markers; analysing the whole trace as one window (--steps-at NAME" in err
    assert "e.g. --steps-at 'execute_*_iter_*': 8 such annotations at the top of a thread" in err  # (the hint)
    code, out, _ = run_cli(["analyze", str(INFERENCE_LOOP), "--steps-at", "execute_*_iter_*", "--json"], capsys)
    assert code == 0 and len(json.loads(out)["steps"]) == 8
    code, out, err = run_cli(["analyze", str(INFERENCE_LOOP), "--steps-at", "execute_*", "--json"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert [s["step"] for s in res["steps"]] == list(range(1, 9))
    got = [s["measured_us"] for s in res["steps"]]
    assert got == pytest.approx(want, abs=0.01)
    assert res["run_facts"]["steps_from"] == {"0": {"name": "execute_*", "at": "start"}}
    assert "8 steps cut where the host ops matching --steps-at 'execute_*' start" in err
    for s in res["steps"][:-1]:  # the 2 ms wait before the next iteration is untraced time of this one
        assert s["breakdown_us"]["untraced"] > 1500


def test_steps_at_matches_the_markers_where_an_annotation_starts_each_step(tmp_path):
    """diff_test's loop opens each iteration with its optimizer's ``zero_grad``: cut there
    (``--steps-at 'Optimizer.zero_grad#*'``) its six steps read as its ProfilerStep markers give
    them, step for step (the step time within 0.5%), numbered from 1."""
    from bottleneck_oracle.api import analyze
    from bottleneck_oracle.config import Config

    path = PUBLIC / "diff_test_rank1of2.json.gz"
    cfg = Config()
    cfg.graph.steps_at = "Optimizer.zero_grad#*"
    with pytest.warns(Warning, match=r"6 steps cut where the host ops matching --steps-at"):
        got = analyze(path, config=cfg)[1]
    want = analyze(path)[1]
    assert [a.graph.step for a in got] == list(range(1, 7))
    assert [a.step_time for a in got] == pytest.approx([a.step_time for a in want], rel=5e-3)


@pytest.mark.parametrize("command", ["analyze", "blame", "advise", "summary", "parse", "whatif", "compare"])
def test_steps_at_is_an_option_of_every_command_that_reads_steps(command, tmp_path, capsys):
    from conftest import run_cli

    args = [command, str(INFERENCE_LOOP)] + ([str(INFERENCE_LOOP)] if command == "compare" else [])
    args += ["--edit", "name=aten::addmm,scale=0.5"] if command == "whatif" else []
    args += ["-o", str(tmp_path / "out")] if command == "parse" else []
    code, out, err = run_cli([*args, "--steps-at", "execute_*", "--json"], capsys)
    assert code == 0, err
    assert "8 steps cut where the host ops matching --steps-at 'execute_*' start" in err


@pytest.mark.parametrize(
    ("pattern", "said"),
    [("nothing*", f"{INFERENCE_LOOP}: no host op matches --steps-at 'nothing*'"), (" ", "--steps-at needs a name")],
)
def test_steps_at_that_names_nothing_is_one_line_and_exit_2(pattern, said, capsys):
    from conftest import run_cli

    code, out, err = run_cli(["analyze", str(INFERENCE_LOOP), "--steps-at", pattern], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and said in err and "Traceback" not in err


def test_steps_at_numbers_a_ranks_later_files_on(tmp_path):
    """A rank recorded in two files one after the other (profiling windows): ``--steps-at`` numbers
    the second file's steps on from the first's, 1 to 8 as in the one file; each step but the
    first file's last (which ends with its file) as long as there."""
    doc = _document(INFERENCE_LOOP)
    starts = sorted(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("execute_"))
    cut = starts[4] - 1.0
    folder = tmp_path / "windows"
    folder.mkdir()
    for k, keep in enumerate((lambda e: e.get("ts", 0) < cut, lambda e: e.get("ts", 0) >= cut)):
        part = {**doc, "traceEvents": [e for e in doc["traceEvents"] if e.get("ph") == "M" or keep(e)]}
        _written(part, folder / f"rank-0.w{k + 1:04d}.json")
    with pytest.warns(Warning, match=r"steps cut where the host ops matching --steps-at"):
        two = load(folder, steps_at="execute_*")
        one = load(INFERENCE_LOOP, steps_at="execute_*")
    assert [s.number for s in two.steps] == [s.number for s in one.steps] == list(range(1, 9))
    for a, b in zip(two.steps, one.steps):
        if a.number != 4:
            assert a.span == pytest.approx(b.span, abs=0.01)


def test_a_step_that_ends_under_earlier_device_work_adds_nothing(tmp_path, capsys):
    """train_1rank_5steps is device-bound: its device runs ~77 ms behind its host. A last step of
    a few host ops and no launch (logging after the loop, the profiler's stop; here ProfilerStep#106
    of 1 ms with one op) ends, on the host, before the device work queued in step 105 does: its
    period, from the end of that work to the end of its own, was negative (-88.2 ms) and pulled
    the run's interval below zero. Such a step adds nothing to the loop's time: its time is its
    host's span, it is said and left out, and the run reads as the recorded trace does."""
    from bottleneck_oracle.analysis.answer import run_answer
    from bottleneck_oracle.api import analyze

    doc = _document(PUBLIC / "train_1rank_5steps.json.gz")
    ev = doc["traceEvents"]
    (last,) = [e for e in ev if e.get("name") == "ProfilerStep#105" and e.get("cat") == "user_annotation"]
    t = last["ts"] + last["dur"] + 5
    ev.append({**last, "name": "ProfilerStep#106", "ts": t, "dur": 1000})
    ev.append(
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": last["pid"], "tid": last["tid"], "ts": t + 100, "dur": 50, "args": {}}
    )
    device_end = max(e["ts"] + e["dur"] for e in ev if e.get("cat") == "kernel")
    assert t + 1000 < device_end  # (from the raw events: step 106 ends on its host before the queued work does)
    _, got = analyze(_written(doc, tmp_path / "after.json"))
    (extra,) = [a for a in got if a.graph.step == 106]
    assert extra.adds_nothing() and extra.step_time == pytest.approx(1000.0, abs=1.0)
    assert any("adds nothing to the loop's time" in w for w in extra.warnings())
    want = run_answer(analyze(_written(_document(PUBLIC / "train_1rank_5steps.json.gz"), tmp_path / "as.json"))[1])
    run = run_answer(got)
    assert run.steady == want.steady and run.step_time.median_us == pytest.approx(want.step_time.median_us, rel=1e-9)
    assert run.step_time.low_us == pytest.approx(want.step_time.low_us, rel=1e-9)
    assert any("Step 106" in n and "left out" in n for n in run.notes)
    assert not any(a.adds_nothing() for a in analyze(PUBLIC / "train_1rank_5steps.json.gz")[1])
    from conftest import run_cli

    code, out, _ = run_cli(["analyze", str(tmp_path / "after.json")], capsys)  # the steps table marks it, the caption says why
    assert code == 0 and "106 (hidden)" in out and out.count(" (hidden) ") == 1 and "(hidden): its host" in " ".join(out.split())


def test_pytorchs_eventlist_export_is_said_for_what_it_is(capsys):
    """``prof.events().export_chrome_trace()`` (PyTorch's EventList export, the legacy autograd
    profiler's format; our own loop written so, benchmarks/record_eventlist.py) writes no category
    on any event, one process named "CPU functions", no device events nor ids: refused in one
    line that names the export to use instead."""
    from conftest import run_cli

    path = DATA / "own-cpu" / "eventlist" / "eventlist_export.json.gz"
    events = json.loads(gzip.open(path).read())
    assert isinstance(events, list) and not any("cat" in e for e in events)
    code, out, err = run_cli(["analyze", str(path)], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{path}: none of its {len(events):,} events has a category" in err
    assert "EventList export" in err and "prof.export_chrome_trace()" in err


def test_cut_steps_of_a_rank_whose_trace_starts_an_iteration_later_are_numbered_alike(tmp_path):
    """Steps this tool cuts itself are numbered from 1 on each rank: where rank 1's trace starts an
    iteration after rank 0's (its first optimizer step left out), its step k ran beside rank 0's
    step k+1, and each step paired different iterations (the straggler folder read 62.9 ms a step
    where its iterations take 34.4). They are renumbered by when they ran, said, and the run reads
    as the two whole traces do."""
    from bottleneck_oracle.analysis.answer import run_answer
    from bottleneck_oracle.api import analyze

    folder = DATA / "gloo_ddp_8steps_straggler"
    whole, late = tmp_path / "whole", tmp_path / "late"
    whole.mkdir()
    late.mkdir()
    for r in (0, 1):
        doc = _without_step_markers(_document(folder / f"rank-{r}.json.gz"))
        _written(doc, whole / f"rank-{r}.json")
        if r == 1:  # from the raw events: everything up to the end of its first optimizer step left out
            first = min(e["ts"] + e["dur"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("Optimizer.step#"))
            doc = {**doc, "traceEvents": [e for e in doc["traceEvents"] if e.get("ph") == "M" or e.get("ts", 0) > first]}
        _written(doc, late / f"rank-{r}.json")
    with pytest.warns(Warning, match=r"rank 1's steps \(cut without ProfilerStep markers\) renumbered by \+1"):
        table, got = analyze(late)
    assert sorted(s.number for s in table.steps if s.rank == 1) == list(range(2, 9))
    want = run_answer(analyze(whole)[1])
    assert run_answer(got).step_time.median_us == pytest.approx(want.step_time.median_us, rel=0.02)


@pytest.mark.parametrize("path", [PUBLIC / "train_1rank_5steps.json.gz", REAL / "ddp_v100_rank1of2_5steps.json.gz"])
def test_a_job_written_as_torch_npu_writes_an_npus_trace_reads_as_the_job(path, tmp_path):
    """Ascend's torch_npu writes an NPU job's trace (trace_view.json) its own way
    (benchmarks/unseen.py as_torch_npu): the device's process named "Ascend Hardware", its tasks
    without a category, their times as strings, no correlation id; the runtime's calls in a
    process of their own ("CANN", no category); ``torch_to_npu`` flows from each torch op to the
    tasks it launched; a derived lane ("Overlap Analysis"). A CUDA job's trace written so (device-bound train_1rank, host-bound
    ddp_v100) was refused ("no numeric ts"), and with string times read its tasks were dropped
    (the step 81% untraced): each step now reads as the job's, every self-check as recorded."""
    unseen = _unseen()
    npu = _written(unseen.as_torch_npu(_document(path)), tmp_path / "trace_view.json")
    with pytest.warns(Warning) as said:
        got = [StepAnalysis.of(g) for g in graphs(load(npu))]
    said_text = " | ".join(str(w.message) for w in said)
    assert "tied to the host ops that launched them by flow events" in said_text
    assert 'left out, in "Overlap Analysis"' in said_text  # (its derived lane: no work of its own)
    want = [StepAnalysis.of(g) for g in graphs(load(_written(_document(path), tmp_path / "recorded.json")))]
    assert [a.graph.step for a in got] == [a.graph.step for a in want]
    for a, b in zip(got, want):
        assert int(a.graph.nodes["on_gpu"].sum()) == int(b.graph.nodes["on_gpu"].sum()) > 0
        assert a.step_time == pytest.approx(b.step_time, rel=1e-6)
        # (each task tied to its torch op's start, not to its launch call inside the op: in the first step,
        # 16 µs of the path's CPU overhead reads as compute)
        assert a.breakdown() == pytest.approx(b.breakdown(), abs=2e-4 * b.step_time)
        checks, recorded = {c.name: c.ok for c in a.checks()}, {c.name: c.ok for c in b.checks()}
        assert checks.items() <= recorded.items()
        # (no launch call with a correlation id: launches_found has none to count; ddp_v100's path
        # holds no compute, where the recorded one holds 2-6 µs of it, checked by 'compute')
        assert set(recorded) - set(checks) <= {"launches_found", "compute"}


def test_times_written_as_strings_read_as_the_numbers(tmp_path):
    """Ascend's msprof writes its timeline's ts and dur as strings of µs, to keep the ns
    (``"ts": "1699529623106750.125"``), and Perfetto reads them so. diff_test written that way
    was refused ("event at byte ... has no numeric ts"); it reads as recorded."""
    path = PUBLIC / "diff_test_rank1of2.json.gz"
    text = _written(_unseen().times_as_strings(_document(path)), tmp_path / "strings.json")
    got = [StepAnalysis.of(g) for g in graphs(load(text))]
    want = [StepAnalysis.of(g) for g in graphs(load(_written(_document(path), tmp_path / "recorded.json")))]
    assert [a.graph.step for a in got] == [a.graph.step for a in want]
    for a, b in zip(got, want):
        assert a.step_time == b.step_time
        assert a.breakdown() == pytest.approx(b.breakdown(), abs=1e-6)


def test_collectives_in_kernels_of_their_own_are_communication(tmp_path):
    """Inference servers all-reduce over NVLink in kernels of their own (vLLM's and SGLang's
    ``cross_device_reduce_1stage``), MoE jobs exchange tokens in DeepEP's, PyTorch's symmetric
    memory in ``multimem_all_reduce_kernel`` (b200_eager holds 74 of them): no NCCL name. diff_test
    with its NCCL kernels so named (benchmarks/unseen.py collectives_outside_nccl) read their
    18 ms a step of communication as compute; it reads as recorded."""
    path = PUBLIC / "diff_test_rank1of2.json.gz"
    doc = _document(path)
    assert _unseen().collectives_outside_nccl(doc) > 50
    got = [StepAnalysis.of(g) for g in graphs(load(_written(doc, tmp_path / "custom.json")))]
    want = [StepAnalysis.of(g) for g in graphs(load(_written(_document(path), tmp_path / "recorded.json")))]
    assert [a.graph.step for a in got] == [a.graph.step for a in want]
    for a, b in zip(got, want):
        assert b.breakdown()["communication"] > 10_000
        assert a.step_time == b.step_time
        assert a.breakdown() == pytest.approx(b.breakdown(), abs=1e-6)
        # the kernel families say so too
        ours, recorded = (next(f for f in x.to_dict()["kernel_families"]["families"] if f["family"] == "communication") for x in (a, b))
        assert ours["count"] == recorded["count"] and ours["total_us"] == pytest.approx(recorded["total_us"])
        # and the raw facts' compute kernels leave them out (the self-check's kernel time, precision)
        assert [f["kernel_us"] for f in a.graph.meta["facts"]["ranks"]] == [f["kernel_us"] for f in b.graph.meta["facts"]["ranks"]]


def test_nccl_generic_kernels_are_the_collective_their_args_name(tmp_path):
    """NCCL 2.19 and later run every collective in one kernel, ``ncclDevKernel_Generic``; recent
    PyTorch names the collective in the kernel's args ("Collective name", as the MI300 ResNet's
    kernels do). The 8-rank DLRM job written so (benchmarks/unseen.py nccl_generic_kernels) had
    no collective matched across ranks (0 barriers, no straggler, the others' wait for rank 7 read
    as communication); it reads as recorded."""
    folder = REAL / "dlrm_v100_8rank"
    (tmp_path / "generic").mkdir()
    for f in sorted(folder.glob("*.json.gz")):
        doc = _document(f)
        assert _unseen().nccl_generic_kernels(doc) == 8
        _written(doc, tmp_path / "generic" / f.name.removesuffix(".gz"))
    got = [StepAnalysis.of(g) for g in graphs(load(tmp_path / "generic"))]
    want = [StepAnalysis.of(g) for g in graphs(load(folder))]
    assert [a.graph.step for a in got] == [a.graph.step for a in want]
    for a, b in zip(got, want):
        assert b.graph.summary_counts()["barriers"] == 8
        assert a.graph.summary_counts()["barriers"] == b.graph.summary_counts()["barriers"]
        assert a.step_time == pytest.approx(b.step_time, rel=1e-9)
        assert a.breakdown() == pytest.approx(b.breakdown(), abs=1e-6)
        assert b.straggler() is not None and a.straggler() is not None and a.straggler().rank == b.straggler().rank


def test_a_generic_kernel_without_the_name_takes_its_launching_ops(tmp_path):
    """Where the kernel's args do not name the collective, the record_param_comms that launched it
    (the CPU op of its rank with the same External id) does: the MI300 ResNet's kernels with their
    "Collective name" dropped are the same all-reduces and broadcasts (read from the raw JSON)."""
    doc = _document(REAL / "mi300_resnet_actckpt_rank0of8.json.gz")
    named = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_Generic") and "Collective name" in e.get("args", {}):
            named[e["args"]["correlation"]] = e["args"].pop("Collective name")
    assert set(named.values()) == {"allreduce", "broadcast"}
    kinds = {"allreduce": CollectiveKind.ALL_REDUCE, "broadcast": CollectiveKind.BROADCAST}
    table = load(_written(doc, tmp_path / "unnamed.json"))
    seen = []
    for g in graphs(table):
        for i in np.flatnonzero(g.nodes["node_type"] == NodeType.NETWORK).tolist():
            corr = int(table.cols["correlation"][g.nodes["event"][i]])
            seen.append((int(g.nodes["coll_kind"][i]), int(kinds[named[corr]])))
    assert len(seen) >= 6 and {k for k, _ in seen} == {int(kinds["allreduce"]), int(kinds["broadcast"])}
    assert all(got == want for got, want in seen), seen


@pytest.mark.parametrize("prefix", ["mpi:", "ucc:"])
def test_a_cpu_job_on_another_collective_backend_reads_as_on_gloo(prefix, tmp_path):
    """ProcessGroupMPI and ProcessGroupUCC record their collectives as gloo does (``mpi:all_reduce``
    on the worker thread that runs them). The gloo straggler job with its ops so named
    (benchmarks/unseen.py other_cpu_backend) read them as CPU compute: bound by CPU compute, no
    straggler, 27 ms of a step's breakdown elsewhere; it reads as on gloo."""
    folder = DATA / "gloo_ddp_8steps_straggler"
    unseen = _unseen()
    (tmp_path / "other").mkdir()
    for f in sorted(folder.glob("*.json.gz")):
        doc = _document(f)
        assert unseen.other_cpu_backend(doc, prefix) > 10
        _written(doc, tmp_path / "other" / f.name.removesuffix(".gz"))
    got = [StepAnalysis.of(g) for g in graphs(load(tmp_path / "other"))]
    want = [StepAnalysis.of(g) for g in graphs(load(folder))]
    assert [a.graph.step for a in got] == [a.graph.step for a in want]
    for a, b in zip(got, want):
        assert a.step_time == pytest.approx(b.step_time, rel=1e-9)
        assert a.breakdown() == pytest.approx(b.breakdown(), abs=1e-6)
        assert (a.straggler().rank if a.straggler() else None) == (b.straggler().rank if b.straggler() else None)


def test_a_trace_whose_args_were_stripped_says_its_launches_are_lost(tmp_path):
    """A trace slimmed by dropping every event's args has no correlation ids: no kernel is tied to
    its launch. Launches without an id are not lost where a rank's device ops are tied another way
    (Ascend's flows), but here none is: both self-checks on launches say so."""
    doc = _document(PUBLIC / "train_1rank_5steps.json.gz")
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            e.pop("args", None)
    with pytest.warns(Warning):
        got = [StepAnalysis.of(g) for g in graphs(load(_written(doc, tmp_path / "stripped.json")))]
    for a in got:
        checks = {c.name: c.ok for c in a.checks()}
        assert checks["linked"] is False and checks["launches_found"] is False

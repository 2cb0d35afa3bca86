"""The pictures of the traces that were read wrong before (issue 27), as figures: per step the step
time against its period and the host's span, the share of the path that is compute and
communication, what the blocking copies and bystander threads became, and the device busy time
read from the raw events (json, not our scanner) beside the breakdown's compute; and a host its
device's full launch queue paced (``launch_queue``): the launches in flight from the raw events,
the host's wait, the run answer's line, and ``whatif`` in steady state against the host's own pace
(the span of the step before the queue filled), with why a host the queue did not pace keeps its
step's own window (``diff_test``: its edit replayed in windows of one, two and three steps); and
a device clock behind its host's (``device_clock_behind``: ddp_v100 with its device events 300 µs
early, moved back) or ahead of it (``device_clock_ahead``: every GPU trace file with its device
events 300 µs late, and the raw facts that show it: blocking calls returning before their work
ended, launches to an idle device starting late); a GPU trace cut to its host's or its device's events, as ``ProfilerActivity.CPU``
or ``.CUDA`` alone writes it (``one_side_profiled``); a loop whose launches wait for their kernels,
as ``CUDA_LAUNCH_BLOCKING=1`` makes them (``synchronous_launches``); a step thread that blocks in
Python calls, a sleep and a wait for a helper thread (``host_waits``); an accelerator's queue
waits (``mtia``); the advisor's premises against the raw input types (``advice_premises``); and
traces rewritten as tools leave them (``rewritten_files``: trimmed to a time, split into one step's
file as TraceLens' splitter does, ranks merged into one file three ways, a stream's ops split onto
lanes for a viewer, process names or a thread filtered out, a loop recorded without
``prof.step()``), each against the analysis of what it was made from.

    python benchmarks/unseen.py [--json benchmarks/unseen_results.json]
"""

from __future__ import annotations

import argparse
import bisect
import functools
import gzip
import json
import re
import statistics
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from bottleneck_oracle import api
from bottleneck_oracle.analysis.answer import RunAnswer, run_answer
from bottleneck_oracle.graph_pipeline.facts import run_facts

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _plain(x: object) -> object:
    """JSON for what json does not know: numpy numbers as floats, dataclasses as dicts."""
    from dataclasses import asdict, is_dataclass

    if is_dataclass(x) and not isinstance(x, type):
        return asdict(x)
    return float(x)  # type: ignore[arg-type]


def _union(iv: list[tuple[float, float]]) -> float:
    tot, cur = 0.0, None
    for s, t in sorted(iv):
        if cur is None or s > cur[1]:
            if cur is not None:
                tot += cur[1] - cur[0]
            cur = [s, t]
        else:
            cur[1] = max(cur[1], t)
    return tot + (cur[1] - cur[0] if cur is not None else 0.0)


def raw_device_busy(path: Path) -> dict[int, dict[str, float]]:
    """Per step (from the second on): the period between the ends of consecutive steps' device
    work (kernels by the step their launch falls in) and the device's busy time in it, all
    kernels and non-NCCL kernels, from the raw JSON."""
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = sorted((e["ts"], int(e["name"].split("#")[1])) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    launch = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    dev = [e for e in ev if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    starts = [s for s, _ in steps]
    end: dict[int, float] = {}
    for k in dev:
        t = launch.get(k.get("args", {}).get("correlation"))
        i = bisect.bisect_right(starts, t) - 1 if t is not None else -1
        if i >= 0:
            end[i] = max(end.get(i, 0.0), k["ts"] + k["dur"])
    out = {}
    for i in range(1, len(steps)):
        a, b = end[i - 1], end[i]

        def busy(pred: object, a: float = a, b: float = b) -> float:
            return _union(
                [(max(k["ts"], a), min(k["ts"] + k["dur"], b)) for k in dev if k["ts"] + k["dur"] > a and k["ts"] < b and pred(k)]
            )  # type: ignore[operator]

        out[steps[i][1]] = {
            "period_us": b - a,
            "busy_us": busy(lambda k: True),
            "busy_non_nccl_us": busy(lambda k: "nccl" not in k["name"].lower()),
        }
    return out


def raw_launch_queue(path: Path) -> dict:
    """From the raw JSON: per ProfilerStep its host span; the most launches (runtime calls whose
    device work is in the trace) the device held not yet done at any launch; and, for every launch
    of 50 µs or more that returned within 15 µs after a device op ended while its own work started
    1 ms or more later, how many launches the device held when it began."""
    ev = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    spans = {int(e["name"].split("#")[1]): e["dur"] for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")}
    runtime, device = ("cuda_runtime", "Runtime"), (*DEVICE_CATS, "Kernel", "Memcpy", "Memset")  # (and the 2021 profiler's names)
    calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") in runtime and "correlation" in e.get("args", {})}
    dev = [e for e in ev if e.get("cat") in device]
    first: dict = {}
    done: dict = {}
    for k in dev:
        c = k.get("args", {}).get("correlation")
        if c in calls:
            first[c] = min(first.get(c, float("inf")), k["ts"])
            done[c] = max(done.get(c, 0.0), k["ts"] + k["dur"])
    launched = sorted(calls[c]["ts"] for c in first)
    finished = sorted(done.values())

    def held(t: float) -> int:
        return bisect.bisect_left(launched, t) - bisect.bisect_right(finished, t)

    most = max((held(t) for t in launched), default=0)
    ends = sorted(k["ts"] + k["dur"] for k in dev)
    slow = []
    for c, t0 in first.items():
        e = calls[c]
        back = e["ts"] + e["dur"]
        i = bisect.bisect_right(ends, back) - 1
        if e["dur"] >= 50 and t0 >= back + 1000 and i >= 0 and back - ends[i] <= 15 and ends[i] >= e["ts"]:
            slow.append(held(e["ts"]))
    return {"span_us": spans, "most_in_flight": most, "in_flight_at_slow_launches": sorted(slow)}


def host_paced(path: Path, edit: str) -> dict:
    """What the tool says of a host its device's launch queue paced: per step the host's wait,
    the run answer's line, and ``whatif`` with ``edit`` (the replayed step, in steady state where
    it is one, and in the step's own window)."""
    from bottleneck_oracle.analysis.answer import run_answer

    table, analyses = api.analyze(path)
    run = run_answer(analyses, str(path), None, api.two_step_graphs(table))
    hp = run.host_paced
    rows = []
    for a, w in zip(analyses, api.whatif(path, [edit])):
        q = a.gpu_queue()
        rows.append(
            {
                "step": a.graph.step,
                "step_time_us": a.step_time,
                "host_queue_wait_us": max((r.host_queue_wait_us for r in q.ranks), default=0.0) if q else 0.0,
                "whatif_us": w.replay.step_us,
                "whatif_steady": None if w.steady is None else {"first": w.steady.first, "steps": w.steady.steps},
                "whatif_one_window_us": w.steady.one_step_us if w.steady is not None else w.replay.step_us,
            }
        )
    return {
        "edit": edit,
        "run_host_paced": None if hp is None else {"waited": hp.waited, "own": hp.own},
        "steps": rows,
    }


def windows_of_several_steps(path: Path, edit: str) -> list[dict]:
    """Per step, ``edit`` replayed in the step's own window and in windows of two and three steps
    ending with it (the step's period the window's makespan with it less without it): why a
    device-bound step whose host the queue did not pace keeps its own window."""
    from bottleneck_oracle.analysis.cpm import makespan_of
    from bottleneck_oracle.analysis.whatif import Edit, apply_edits

    table = api.load(path)
    windows = api.two_step_graphs(table)
    e = [Edit.parse(edit)]
    out = []
    for n in sorted({s.number for s in table.steps}):
        row: dict = {"step": n}
        for k in (0, 1, 2):
            with_it, without = windows(n - k, k + 1), (windows(n - k, k) if k else None)
            if with_it is None or (k and without is None):
                continue
            delta = apply_edits(with_it, e).cpm().makespan - makespan_of(with_it)
            if without is not None:
                delta -= apply_edits(without, e).cpm().makespan - makespan_of(without)
            row[f"delta_us_{k + 1}_steps"] = delta
        out.append(row)
    return out


def device_clock_behind(path: Path, early_us: float) -> dict:
    """``path`` with its device events moved ``early_us`` earlier (a device clock behind its
    host's): how many launched ops then start before their call (raw JSON), what the tool moved
    back and said, and each step's time and breakdown against the unmoved trace's."""
    import tempfile

    doc = json.loads(gzip.decompress(path.read_bytes()))
    cats = (*DEVICE_CATS, "gpu_user_annotation")
    for e in doc["traceEvents"]:
        if e.get("cat") in cats and "ts" in e:
            e["ts"] -= early_us
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    launch = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    lags = [e["ts"] - launch[c] for e in ev if e.get("cat") in DEVICE_CATS and (c := e.get("args", {}).get("correlation")) in launch]
    with tempfile.TemporaryDirectory() as tmp:
        moved_path = Path(tmp) / path.name.replace(".gz", "")
        moved_path.write_text(json.dumps(doc))
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            moved = step_rows(moved_path)
    return {
        "early_us": early_us,
        "launched_ops": len(lags),
        "ops_before_their_call": sum(x < -5.0 for x in lags),
        "said": [str(w.message).split(": ", 1)[1] for w in said if "were moved" in str(w.message)],
        "moved": moved,
        "as_recorded": step_rows(path),
    }


ANY_DEVICE_CATS = (*DEVICE_CATS, "Kernel", "Memcpy", "Memset")  # (and the 2021 exporter's names)


def raw_clock_facts(doc: dict) -> dict:
    """From the raw JSON, the two facts a device clock ahead of its host's breaks: how long after
    the device work it had to wait for each blocking call of 50 µs or more returned (a synchronous
    copy: its own copy op; a device synchronize: every op launched before it; negative: before),
    and how long after its launch call returned each op launched to a device that had run nothing
    for at most 1 ms started (device: the op's pid)."""
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e and "dur" in e]
    calls = {
        (e.get("pid"), e["args"]["correlation"]): e
        for e in ev
        if str(e.get("cat", "")).lower().endswith(("runtime", "driver")) and "correlation" in e.get("args", {})
    }
    by_corr = {c: e for (_, c), e in calls.items()}
    ops = [e for e in ev if e.get("cat") in ANY_DEVICE_CATS and e.get("args", {}).get("correlation") in by_corr]
    late = []
    for o in ops:
        c = by_corr[o["args"]["correlation"]]
        sync_copy = re.match(r"^(cuda|hip)Memcpy(WithStream)?$", c["name"]) or (
            "memcpy" in c["name"].lower() and re.search(r"dtoh.*pageable", o["name"], re.I)
        )
        if c["dur"] >= 50.0 and sync_copy:
            late.append(o["ts"] + o["dur"] - (c["ts"] + c["dur"]))
    for s in (e for e in ev if re.search(r"devicesynchroni[sz]e", e["name"], re.I) and e["dur"] >= 50.0):
        before = [
            o["ts"] + o["dur"] for o in ops if by_corr[o["args"]["correlation"]]["ts"] + by_corr[o["args"]["correlation"]]["dur"] < s["ts"]
        ]
        if before:
            late.append(max(before) - (s["ts"] + s["dur"]))
    idle = []
    for pid in {o.get("pid") for o in ops}:
        mine = sorted((e for e in ev if e.get("cat") in ANY_DEVICE_CATS and e.get("pid") == pid), key=lambda e: e["ts"])
        running = float("-inf")
        for e in mine:
            c = by_corr.get(e.get("args", {}).get("correlation"))
            if c is not None and 0.0 <= c["ts"] - running <= 1000.0:  # (idle for at most 1 ms: clocks not dropped)
                idle.append(e["ts"] - (c["ts"] + c["dur"]))
            running = max(running, e["ts"] + e["dur"])
    return {
        "blocking_calls": len(late),
        "latest_return_before_its_work_us": max(late) if late else None,  # > 0: returned before the work ended
        "launches_to_an_idle_device": len(idle),
        "least_idle_launch_lag_us": min(idle) if idle else None,
    }


def device_clock_ahead(late_us: float) -> dict:
    """Every GPU trace file of the fixtures, as recorded and with its device events ``late_us``
    later (a device clock ahead of its host's): the raw facts (raw_clock_facts) and what the tool
    moved and said; for three of them, each step's time and breakdown moved against as recorded."""
    import tempfile

    files = sorted(
        [
            *(DATA / "public-gpu").glob("*.json.gz"),
            *(DATA / "public-gpu/sampled_128rank").glob("*.json.gz"),
            *(DATA / "real-gpu").glob("*.json.gz"),
            *(DATA / "real-gpu/dlrm_v100_8rank").glob("*.json.gz"),
            *(DATA / "more-gpu").glob("*.json.gz"),
            *(DATA / "own-gpu").glob("*/*.json.gz"),
        ]
    )
    rows = {}
    steps = {}
    for path in files:
        if "pytorch_et" in path.name or "overlay" in path.name:
            continue
        doc = json.loads(gzip.decompress(path.read_bytes()))
        if not any(e.get("cat") in ANY_DEVICE_CATS for e in doc["traceEvents"]):
            continue
        name = str(path.relative_to(DATA))
        row = {"as_recorded": raw_clock_facts(doc)}
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            api.load(path)
        row["as_recorded"]["said"] = [str(w.message).split(": ", 1)[1] for w in said if "clock runs ahead" in str(w.message)]
        for e in doc["traceEvents"]:
            if e.get("cat") in (*ANY_DEVICE_CATS, "gpu_user_annotation") and "ts" in e:
                e["ts"] += late_us
        row["moved"] = raw_clock_facts(doc)
        with tempfile.TemporaryDirectory() as tmp:
            moved_path = Path(tmp) / path.name.replace(".gz", "")
            moved_path.write_text(json.dumps(doc))
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                if name in (
                    "real-gpu/ddp_v100_rank1of2_5steps.json.gz",
                    "real-gpu/resnet50_legacy_2021_1gpu.pt.trace.json.gz",
                    "more-gpu/timesformer_h100_1step.json.gz",
                ):
                    steps[name] = {"moved": step_rows(moved_path), "as_recorded": step_rows(path)}
                else:
                    api.load(moved_path)
        row["moved"]["said"] = [
            str(w.message).split(": ", 1)[1] for w in said if "clock runs ahead" in str(w.message) or "no offset explains" in str(w.message)
        ]
        by = [float(x.split("moved ")[1].split(" µs")[0]) for x in row["moved"]["said"] if "were moved" in x]
        row["moved"]["moved_back_us"] = by[0] if by else None
        rows[name] = row
    back = [r["moved"]["moved_back_us"] for r in rows.values() if r["moved"]["moved_back_us"] is not None]
    late = [r["as_recorded"]["latest_return_before_its_work_us"] for r in rows.values()]
    lag = [r["as_recorded"]["least_idle_launch_lag_us"] for r in rows.values() if r["as_recorded"]["launches_to_an_idle_device"] >= 5]
    return {
        "as_recorded_latest_return_before_its_work_us": max(x for x in late if x is not None),
        "as_recorded_largest_least_idle_launch_lag_us": max(lag),
        "late_us": late_us,
        "files": rows,
        "moved_back": f"{len(back)} of {len(rows)}",
        "moved_back_range_us": [min(back), max(back)] if back else None,
        "said_as_recorded": sum(bool(r["as_recorded"]["said"]) for r in rows.values()),
        "steps": steps,
    }


HOST_CATS = ("cpu_op", "user_annotation", "python_function", "Trace")
DEVICE_LIBRARY_RAW = ("cudnn", "miopen", "nccl:")  # (a few of the names the rule reads: counted here from the raw JSON)


def one_side(path: Path, keep_host: bool, tmp: Path) -> Path:
    """``path`` as its profiler would have written it with only the host's activity (no device
    event, no runtime call) or only the device's (no host op, no runtime call, no flow)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = doc["traceEvents"]
    if keep_host:
        kept = [e for e in ev if e.get("cat") in HOST_CATS or (e.get("ph") == "M" and e.get("pid") != 0)]
    else:
        kept = [e for e in ev if e.get("cat") in DEVICE_CATS or (e.get("ph") == "M" and e.get("pid") == 0)]
    out = tmp / (path.name.replace(".json.gz", "") + ("_host_only.json" if keep_host else "_device_only.json"))
    out.write_text(json.dumps({**{k: v for k, v in doc.items() if k != "traceEvents"}, "traceEvents": kept}))
    return out


def one_side_profiled(path: Path) -> dict:
    """A GPU trace cut to one side (ProfilerActivity.CPU or .CUDA alone): what the raw JSON holds,
    what the tool says (warning, run_facts.unprofiled, the run answer's lines)."""
    import tempfile

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for keep_host in (True, False):
            cut = one_side(path, keep_host, Path(tmp))
            ev = json.loads(cut.read_text())["traceEvents"]
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                table, analyses = api.analyze(cut)
            from bottleneck_oracle.analysis.answer import run_answer
            from bottleneck_oracle.graph_pipeline.facts import unprofiled

            out["host_only" if keep_host else "device_only"] = {
                "raw": {
                    "device_events": sum(e.get("cat") in DEVICE_CATS for e in ev),
                    "host_ops": sum(e.get("cat") == "cpu_op" for e in ev),
                    "host_ops_naming_cudnn_miopen_nccl": sum(
                        e.get("cat") == "cpu_op" and any(k in e["name"].lower() for k in DEVICE_LIBRARY_RAW) for e in ev
                    ),
                },
                "unprofiled": unprofiled(table) if table is not None else None,
                "said": [str(w.message).split(": ", 1)[1] for w in said if "device event" in str(w.message)],
                "run_answer": run_answer(analyses, str(cut)).lines(),
            }
    return out


def launch_loop(path: Path, blocking: bool) -> Path:
    """Three steps of 60 host ops, each launching one 40-100 µs kernel on one stream. With
    ``blocking`` each launch call returns 2 µs after its kernel ends (CUDA_LAUNCH_BLOCKING=1: host
    and device in series); without, it returns after 6 µs and the kernels queue."""
    host = 4242
    ev: list[dict] = [{"name": "process_name", "ph": "M", "pid": host, "tid": 0, "args": {"name": "python3"}}]
    t, dev_free, corr = 1_000_000.0, 0.0, 1000
    for s in range(3):
        t0, items = t, []
        for i in range(60):
            corr += 1
            k_ts = max(t + 12.0, dev_free)
            dev_free = k_ts + 40.0 + (i % 7) * 10.0
            call = dev_free + 2.0 - (t + 8.0) if blocking else 6.0
            args = {"correlation": corr, "External id": corr}
            items += [
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::mul",
                    "pid": host,
                    "tid": host,
                    "ts": t,
                    "dur": call + 14.0,
                    "args": {"External id": corr},
                },
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": host,
                    "tid": host,
                    "ts": t + 8.0,
                    "dur": call,
                    "args": args,
                },
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"mul_kernel_{i % 7}",
                    "pid": 0,
                    "tid": 7,
                    "ts": k_ts,
                    "dur": dev_free - k_ts,
                    "args": {**args, "stream": 7, "device": 0},
                },
            ]
            t += call + 18.0
        ev += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s + 1}",
                "pid": host,
                "tid": host,
                "ts": t0,
                "dur": t - t0 + 1.0,
                "args": {},
            },
            *items,
        ]
        t += 2.0
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    return path


def synchronous_launches() -> dict:
    """The launch loop with synchronous launches: the kernels' time in step 2 (raw), every kernel
    halved as the tool replays it, the path's compute, what it says; the asynchronous twin."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = launch_loop(Path(tmp) / "blocking.json", True)
        ev = json.loads(path.read_text())["traceEvents"]
        calls = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
        (st,) = [e for e in ev if e.get("name") == "ProfilerStep#2"]
        kernels = [e for e in ev if e.get("cat") == "kernel"]
        in_step = sum(k["dur"] for k in kernels if st["ts"] <= calls[k["args"]["correlation"]]["ts"] < st["ts"] + st["dur"])
        (res,) = api.whatif(path, ["cat=kernel,scale=0.5"], steps=[2])
        (row,) = step_rows(path, [2])
        table = api.load(path)
        from bottleneck_oracle.graph_pipeline.facts import synchronous_launches as sync

        twin = api.load(launch_loop(Path(tmp) / "async.json", False))
        return {
            "raw": {
                "launches": len(calls),
                "returned_after_their_kernel": sum(
                    k["ts"] + k["dur"] <= calls[k["args"]["correlation"]]["ts"] + calls[k["args"]["correlation"]]["dur"] for k in kernels
                ),
                "step2_kernel_us": in_step,
            },
            "synchronous": sync(table),
            "step2": row,
            "halving_every_kernel_saves_us": res.step_us - res.replay.step_us,
            "asynchronous_twin_synchronous": sync(twin),
        }


def runtime_setup() -> dict:
    """Windows that hold one-time work (facts.setup_calls), per bundled trace that has any and our
    own torch.compile'd loop, beside what the same rule reads from the raw JSON: CUDA/HIP runtime
    calls of 1 ms or more, neither a wait nor a copy, while no device op ran, and the union of
    torch.compile's dynamo_timed ranges; and the advisor's first suggestion."""
    from bottleneck_oracle.graph_pipeline.facts import run_facts

    out: dict = {}
    names = ("alexnet_1gpu.json.gz", "simple_add_1gpu.json.gz", "amd_mi250_minitoy.json.gz", "train_1rank_5steps.json.gz")
    own = ("compiled_mlp_whole_script.json.gz", "compiled_mlp_after_warmup.json.gz")
    for path in [DATA / "public-gpu" / n for n in names] + [DATA / "own-cpu" / n for n in own]:
        name = path.name
        ev = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X" and "dur" in e]
        compiling, end = 0.0, -float("inf")  # the union of torch.compile's timed ranges
        for a, b in sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].endswith(" (dynamo_timed)")):
            compiling += max(0.0, b - max(a, end))
            end = max(end, b)
        device = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        raw = 0.0
        for e in ev:
            if e.get("cat") not in ("cuda_runtime", "cuda_driver") or e["dur"] < 1000:
                continue
            if re.search(r"synchron|mem(cpy|set)|query|wait|finish", e["name"], re.IGNORECASE):
                continue
            a, b = e["ts"], e["ts"] + e["dur"]
            if sum(max(0.0, min(b, y) - max(a, x)) for x, y in device) < 0.1 * e["dur"]:
                raw += e["dur"]
        advice = api.advise(path)
        first = next((s.title for st in advice for s in st.advice.suggestions), None)
        out[name] = {
            "tool": run_facts(api.load(path)).setup,
            "raw_setup_calls_us": raw,
            "raw_compiling_us": compiling,
            "advisor_first": first,
        }
    return out


def host_waits() -> dict:
    """Our own loop whose step thread blocks in Python calls (with_stack=True): per step, the time
    the raw JSON shows it in ``time.sleep`` and in a lock's ``acquire`` (50 µs or longer), beside
    what the path makes of them: waiting (idle), the path's time on the helper thread the
    acquire waited for, and the step time against the span."""
    path = DATA / "own-cpu" / "host_waits_stack.json.gz"
    ev = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    out = []
    for a in api.analyze(path)[1]:
        (s,) = [e for e in ev if e["name"] == f"ProfilerStep#{a.graph.step}"]
        lo, hi = s["ts"], s["ts"] + s["dur"]
        mine = [e for e in ev if e["tid"] == s["tid"] and lo <= e["ts"] < hi and e["dur"] >= 50]
        b = a.breakdown()
        out.append(
            {
                "step": a.graph.step,
                "span_us": a.measured,
                "step_time_us": a.step_time,
                "raw_sleep_us": sum(e["dur"] for e in mine if e["name"] == "<built-in function sleep>"),
                "raw_lock_wait_us": sum(e["dur"] for e in mine if e["name"].startswith("<built-in method acquire")),
                "idle_us": b["idle"],
                "compute_us": b["compute"],
                "cpu_overhead_us": b["cpu_overhead"],
                "path_on_other_threads_us": sum(x.dur for x in a.segments() if not x.on_gpu and x.tid != s["tid"]),
            }
        )
    return {"steps": out}


PREMISED = (
    "gpu-mixed-precision",
    "matmul-precision",
    "conv-channels-last",
    "cpu-matmul-bf16",
    "backward-compute-bound",
    "zero-grad-set-to-none",
    "small-ops-fusion",
    "elementwise-fusion",
    "gpu-compile",
    "launch-bound-cuda-graphs",
    "attention-sdpa",
    "optimizer-foreach-fused",
    "host-code-on-path",
    "dataloader-stall",
    "cpu-framework-overhead",
    "h2d-copies",
    "pp-p2p-latency",
)
"""The recipes whose premise the trace can contradict: reduced precision for a step in 16 bits
already (on the device, on the CPU), channels last for convolutions that run channels last,
checkpointing fewer layers for a step that recomputes nothing, set_to_none for a zero_grad that
writes nothing, fusing or compiling what Inductor compiled, CUDA graphs for kernels replayed from
one, SDPA for attention that runs fused, a fused optimizer for one that is, and framework overhead
("compile the model") for host code that calls no PyTorch op or for data loading, pinning for
copies that are pinned or device to device, a pipeline's sends for an all-to-all."""


def _raw_events(path: Path) -> list[list[dict]]:
    """The raw JSON's events, one list per file (a folder: one file per rank), read once for the
    raw_* counts below."""
    files = sorted(path.glob("*.json*")) if path.is_dir() else [path]
    docs = [_json_as_written((gzip.open(f, "rt") if f.name.endswith(".gz") else open(f)).read()) for f in files]
    return [doc["traceEvents"] if isinstance(doc, dict) else doc for doc in docs]


_BARE_QUOTED_NAME = re.compile(r'(?m)^(\s*"name": )"(.*(?<!\\)".*)",$')


def _json_as_written(text: str) -> object:
    """A trace's JSON; one whose names the profiler wrote with bare quotes (quoted_names_stack:
    each such name on its own line) read with them escaped, line by line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_BARE_QUOTED_NAME.sub(lambda m: m.group(1) + json.dumps(m.group(2)) + ",", text))


def _raw_input_types(events: list[list[dict]]) -> dict[str, int]:
    """How many matmul, convolution and attention ops of the raw JSON (_raw_events) have each first
    floating-point input type (``record_shapes=True``), and how many have none."""
    out: dict[str, int] = {}
    for e in (x for file in events for x in file):
        if e.get("ph") != "X" or not re.match(
            r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|_?conv\w*|cudnn_convolution\w*|_?scaled_dot\w*)$", str(e.get("name"))
        ):
            continue
        types = [t for t in (e.get("args") or {}).get("Input type", []) if re.search(r"(?i)float|half|double", str(t))]
        key = str(types[0]) if types else "(none)"
        out[key] = out.get(key, 0) + 1
    return out


def _raw_checkpoint_names(events: list[list[dict]]) -> int:
    """How many complete events of the raw JSON (_raw_events) have "checkpoint" in their name
    (activation checkpointing's frames and ops: the premise of the recipe that checkpoints fewer
    layers)."""
    return sum(1 for file in events for e in file if e.get("ph") == "X" and "checkpoint" in str(e.get("name", "")).lower())


def _raw_compiled(events: list[list[dict]]) -> dict[str, int]:
    """From the raw JSON (_raw_events): how many kernels Inductor generated (``triton_...``), calls
    of Inductor's graphs (``## Call CompiledFxGraph ##``), AOTAutograd's forwards
    (``CompiledFunction``), and device ops replayed by a graph launch (their correlation id a
    ``*GraphLaunch`` call's; per file: a rank's ids)."""
    out = {"inductor_kernels": 0, "inductor_graph_calls": 0, "aot_forwards": 0, "graph_replayed_device_ops": 0}
    for file in events:
        complete = [e for e in file if e.get("ph") == "X"]
        launches = {(e.get("args") or {}).get("correlation") for e in complete if re.search(r"(?i)graph_?launch", str(e.get("name")))}
        for e in complete:
            name, cat = str(e.get("name", "")), e.get("cat")
            out["inductor_kernels"] += cat == "kernel" and name.startswith("triton_")
            out["inductor_graph_calls"] += "CompiledFxGraph" in name
            out["aot_forwards"] += name == "CompiledFunction"
            dev = cat in ("kernel", "gpu_memcpy", "gpu_memset")
            out["graph_replayed_device_ops"] += dev and (e.get("args") or {}).get("correlation") in launches - {None}
    return out


def advice_premises() -> dict:
    """Per bundled trace (the GPU ones, our CPU recordings of compiled code, attention and
    optimizers, a gloo job): the raw input types of its matmuls and convolutions and its events
    named for checkpointing and its compiled code beside the advisor's evidence (its metrics:
    precision, layout, recomputation, compiled and graph-replayed shares, attention, optimizer,
    host code, data loading, framework overhead, per step), the steps in which each premised
    recipe was offered (suggested or rejected by replay), and how the CPU-overhead recipe's
    remedies begin."""
    from bottleneck_oracle.analysis.phases import node_phases
    from bottleneck_oracle.llm.graphrag import advise

    out = {}
    paths = (
        sorted((DATA / "more-gpu").glob("*.json.gz"))
        + sorted((DATA / "public-gpu").glob("*.json.gz"))
        + sorted((DATA / "real-gpu").glob("*.json.gz"))
        + sorted((DATA / "own-cpu").glob("*.json.gz"))  # (ours: compiled, attention eager and SDPA, AdamW three ways)
    )
    paths.append(DATA / "gloo_ddp_2rank")  # (a CPU job of ours, fp32)
    for path in paths:
        if "pytorch_et" in path.name:
            continue
        table, analyses = api.analyze(path)
        offered = {r: 0 for r in PREMISED}
        metrics, remedies = [], set()
        for a in analyses:
            phases, _ = node_phases(table, a.graph)
            adv = advise(a, None, phases, table)  # (no blame: the premised recipes do not read it)
            m = adv.metrics
            metrics.append(
                {
                    k: round(m[k], 3)
                    for k in (
                        "full_precision_share",
                        "nchw_share",
                        "host_full_precision_share",
                        "gpu_present",
                        "recompute_present",
                        "uncompiled_share",
                        "ungraphed_share",
                        "attention_share",
                        "optimizer_share",
                        "optimizer_unfused",
                        "host_code_share",
                        "dataloader_share",
                        "framework_overhead_share",
                        "memcpy_share",
                        "p2p_share",
                    )
                }
            )
            ids = {x.source for x in adv.suggestions} | {x.source for x in adv.rejected}
            for r in PREMISED:
                offered[r] += r in ids
            remedies |= {x.remedy.split(" (")[0] for x in adv.suggestions if x.source == "cpu-framework-overhead"}
        raw = _raw_events(path)
        out[path.name] = {
            "raw_input_types": _raw_input_types(raw),
            "raw_checkpoint_names": _raw_checkpoint_names(raw),
            "raw_compiled": _raw_compiled(raw),
            "cpu_overhead_remedies": sorted(remedies),
            "steps": len(analyses),
            "evidence": metrics,
            "offered_in_steps": offered,
        }
    return out


def trimmed(path: Path, keep: float, out: Path) -> float:
    """``path`` with only the events that start in the first ``keep`` of its time (what a trace
    tool's "export the selection" or a trimming script leaves) written to ``out``; the time it stops."""
    doc = json.loads(gzip.open(path).read())
    ts = [e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X"]
    stop = min(ts) + keep * (max(ts) - min(ts))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") == "M" or e.get("ts", 0) <= stop]
    out.write_text(json.dumps(doc))
    return stop


def rank_documents(folder: Path) -> list[dict]:
    """The documents of a folder's ``worker<N>...`` files, in rank order."""
    files = sorted(folder.glob("*.json.gz"), key=lambda f: int(re.search(r"worker(\d+)", f.name).group(1)))  # type: ignore[union-attr]
    return [json.loads(gzip.open(f).read()) for f in files]


def merged_ranks(docs: list[dict], style: str) -> dict:
    """The ranks' documents ``docs`` (in rank order) merged into one as the merge scripts in use
    write it: ``sglang`` (each rank's processes renamed ``"[TP03] 59994"``, its device
    ``"[TP03] 0"``, the first file's metadata kept), ``tracefuse`` (TraceLens' TraceFuse: pids,
    correlation and flow ids offset by rank times a power of ten, ``args.rank`` on every event, its
    own trace span left out, no metadata), ``one_pid`` (every event of rank r on pid r + 1, a "Rank r"
    process name: Megatron-LM-AutoTuner's script)."""
    merged: dict = {"traceEvents": []}
    top = {k: max((e.get(k) for d in docs for e in d["traceEvents"] if isinstance(e.get(k), int)), default=1) for k in ("pid", "id")}
    top["correlation"] = max(e["args"]["correlation"] for d in docs for e in d["traceEvents"] if "correlation" in e.get("args", {}))
    step = {k: 10 ** (len(str(v)) + 1) for k, v in top.items()}
    for rank, doc in enumerate(docs):
        if style == "sglang":
            merged.update({k: v for k, v in doc.items() if k != "traceEvents" and k not in merged})
        for e in doc["traceEvents"]:
            if style == "sglang":
                e["pid"] = f"[TP{rank:02d}] {e['pid']}"
            elif style == "tracefuse":
                if e.get("cat") == "Trace":
                    continue
                args = e.setdefault("args", {})
                args["rank"] = rank
                for k in ("pid", "id"):
                    if isinstance(e.get(k), int):
                        e[k] += rank * step[k]
                if "correlation" in args:
                    args["correlation"] += rank * step["correlation"]
            else:
                e["pid"] = rank + 1
            merged["traceEvents"].append(e)
        if style == "one_pid":
            merged["traceEvents"].append({"name": "process_name", "ph": "M", "pid": rank + 1, "tid": 0, "args": {"name": f"Rank {rank}"}})
    return merged


def split_step(doc: dict, step: int) -> dict:
    """``doc`` cut to one ProfilerStep as TraceLens' trace splitter writes a single iteration
    (``split_inference_trace_annotation --store-single-iteration``): the host events that start
    between the step's start and the next step's and last no longer than that, the device events
    those events launched (by correlation id, wherever they run), the flows of those ids, the
    events without a time; no time changed. The device work queued before the step is not in it."""
    ev = doc["traceEvents"]
    marks = sorted(
        (
            e
            for e in ev
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") in ("user_annotation", "cpu_op")
        ),
        key=lambda e: e["ts"],
    )
    at = [int(m["name"].split("#")[1]) for m in marks].index(step)
    lo = marks[at]["ts"]
    hi = marks[at + 1]["ts"] if at + 1 < len(marks) else marks[at]["ts"] + marks[at]["dur"]
    device = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
    host = [e for e in ev if "ts" in e and "dur" in e and e.get("cat") not in device and lo <= e["ts"] < hi and e["dur"] <= hi - lo]
    ids = {e["args"]["correlation"] for e in host if "correlation" in e.get("args", {})}
    launched = [e for e in ev if e.get("cat") in device and e.get("args", {}).get("correlation") in ids]
    flows = [e for e in ev if e.get("ph") in ("s", "f") and e.get("id") in ids]
    return {**doc, "traceEvents": host + flows + launched + [e for e in ev if "ts" not in e]}


def viewer_lanes(doc: dict) -> int:
    """``doc`` rewritten in place as the sglang community's "perfetto-compatible" script does for
    viewers that cannot draw overlapping slices on one track: each kernel that starts before the
    previous one on its lane ended moves to a lane of its own (tid ``"7_hack"``), its
    ``args.stream`` unchanged. Returns how many moved."""
    last: dict = {}
    moved = 0
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and "registers per thread" in e.get("args", {}):
            while e["ts"] < last.get((e["pid"], e["tid"]), -1):
                e["tid"] = str(e["tid"]) + "_hack"
                moved += 1
            last[(e["pid"], e["tid"])] = e["ts"] + e["dur"]
    return moved


def as_torch_npu(doc: dict) -> dict:
    """``doc`` (a CUDA job's Kineto trace) laid out as Ascend's torch_npu writes an NPU job's
    ``trace_view.json`` (torch_npu/profiler/analysis: _trace_event_manager.py, _fwk_file_parser.py,
    _trace_view_parser.py; the CANN timeline it merges in): the torch ops as they are (category
    ``cpu_op``); the device's process named "Ascend Hardware", its tasks without a category, their
    times written as strings of µs, args ``Task Type``, ``Stream Id``, ``Task Id`` and no correlation
    id; the runtime's calls in a process of their own, "CANN" (``AscendCL@...``, no category); a
    ``torch_to_npu`` flow (category ``async_npu``) from the start of the torch op a task was launched
    in to the task's start; and the derived lane torch_npu adds, a process "Overlap Analysis" with a
    "Computing" event over each task. No time changed."""
    ev = doc["traceEvents"]
    device_cats = ("kernel", "gpu_memcpy", "gpu_memset")
    device_pids = {e["pid"] for e in ev if e.get("cat") in device_cats}
    ops: dict = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops.setdefault((e["pid"], e["tid"]), []).append(e)
    for lane in ops.values():
        lane.sort(key=lambda e: e["ts"])
    starts = {k: [e["ts"] for e in lane] for k, lane in ops.items()}
    calls = {
        e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    cann = 1 + max(e["pid"] for e in ev if isinstance(e.get("pid"), int))
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": cann, "tid": 0, "args": {"name": "CANN"}},
        {"ph": "M", "name": "process_name", "pid": cann + 1, "tid": 0, "args": {"name": "Overlap Analysis"}},
    ]
    flow = 0
    for e in ev:
        cat = e.get("cat")
        if e.get("ph") == "M" and e.get("pid") in device_pids:
            if e.get("name") == "process_name":
                out.append({**e, "args": {"name": "Ascend Hardware"}})
            elif e.get("name") != "process_labels":
                out.append(e)
        elif cat in ("cuda_runtime", "cuda_driver"):
            out.append(
                {"ph": "X", "name": "AscendCL@" + e["name"], "pid": cann, "tid": e["tid"], "ts": e["ts"], "dur": e["dur"], "args": {}}
            )
        elif cat in device_cats:
            args = e.get("args", {})
            task = {"ph": "X", "name": e["name"], "pid": e["pid"], "tid": e["tid"], "ts": f"{e['ts']:.3f}", "dur": f"{e['dur']:.3f}"}
            out.append(
                {**task, "args": {"Task Type": "AI_CORE", "Stream Id": args.get("stream", e["tid"]), "Task Id": args.get("correlation", 0)}}
            )
            out.append({**task, "name": "Computing", "pid": cann + 1, "tid": 0, "args": {}})
            call = calls.get(args.get("correlation"))
            lane = ops.get((call["pid"], call["tid"]), []) if call else []
            i = bisect.bisect_right(starts.get((call["pid"], call["tid"]), []), call["ts"]) - 1 if call else -1
            while i >= 0 and lane[i]["ts"] + lane[i]["dur"] < call["ts"] + call["dur"]:  # type: ignore[index]
                i -= 1  # the innermost torch op the call ran in
            if i >= 0:
                flow += 1
                op = lane[i]
                out.append(
                    {
                        "ph": "s",
                        "bp": "e",
                        "name": "torch_to_npu",
                        "id": flow,
                        "pid": op["pid"],
                        "tid": op["tid"],
                        "ts": op["ts"],
                        "cat": "async_npu",
                    }
                )
                out.append(
                    {
                        "ph": "f",
                        "bp": "e",
                        "name": "torch_to_npu",
                        "id": flow,
                        "pid": e["pid"],
                        "tid": e["tid"],
                        "ts": task["ts"],
                        "cat": "async_npu",
                    }
                )
        elif cat != "ac2g":
            out.append(e)
    return {"traceEvents": out}


def collectives_outside_nccl(doc: dict) -> int:
    """``doc`` rewritten in place as a job whose collectives run in kernels of their own, not
    NCCL's: each NCCL all-reduce kernel named as vLLM's (and SGLang's) custom all-reduce names its
    kernel, each NCCL send/recv kernel as DeepEP's dispatch. No time changed. Returns how many
    kernels were renamed."""
    names = {
        "ncclKernel_AllReduce": "void vllm::cross_device_reduce_1stage<float, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, float*, int, int)",
        "ncclKernel_SendRecv": "void deep_ep::intranode::dispatch<8, 768>(int4*, float*, int*, long*, int const*, int)",
    }
    renamed = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            for prefix, name in names.items():
                if e["name"].startswith(prefix):
                    e["name"] = name
                    renamed += 1
    return renamed


def nccl_generic_kernels(doc: dict) -> int:
    """``doc`` rewritten in place as NCCL 2.19 and later write it with recent PyTorch: every NCCL
    kernel is ``ncclDevKernel_Generic``, whatever collective it runs, and says which in its args
    ("Collective name", as the MI300 ResNet's kernels do): all-reduce kernels "allreduce", the
    all-to-all's send/recv kernels "all_to_all". No time changed. Returns how many kernels were
    renamed."""
    renamed = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_"):
            e["args"]["Collective name"] = "allreduce" if "AllReduce" in e["name"] else "all_to_all"
            e["name"] = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
            renamed += 1
    return renamed


def other_cpu_backend(doc: dict, prefix: str) -> int:
    """``doc`` (a gloo job's trace) rewritten in place as the same job on another CPU collective
    backend: every ``gloo:`` op named as ProcessGroupMPI (``mpi:``) or ProcessGroupUCC (``ucc:``)
    records its work, on its own worker thread as gloo does. Returns how many ops were renamed."""
    renamed = 0
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith("gloo:"):
            e["name"] = prefix + e["name"][len("gloo:") :]
            renamed += 1
    return renamed


def times_as_strings(doc: dict) -> dict:
    """``doc`` with every event's ts and dur written as a string of µs (``"ts": "1712195495505583.000"``),
    as Ascend's msprof writes its timeline to keep the ns; Perfetto reads such a file."""
    for e in doc["traceEvents"]:
        for k in ("ts", "dur"):
            if isinstance(e.get(k), (int, float)):
                e[k] = f"{e[k]:.3f}"
    return doc


def rewritten_files(tmp: Path) -> dict:
    """Traces as tools rewrite them, each against the analysis of what it was made from."""
    out: dict = {"trimmed_at_80pct": {}, "merged_dlrm_8_workers": {}}
    for path in (DATA / "public-gpu/train_1rank_5steps.json.gz", DATA / "real-gpu/ddp_v100_rank1of2_5steps.json.gz"):
        stop = trimmed(path, 0.8, tmp / "trimmed.json")
        whole = json.loads(gzip.open(path).read())
        (tmp / "recorded.json").write_text(json.dumps(whole))  # (json's float text, as in the trimmed file)
        analyses = api.analyze(tmp / "trimmed.json")[1]
        got, rec = rows_of(analyses), {r["step"]: r for r in step_rows(tmp / "recorded.json")}
        held = sorted(r["step"] for r in got)
        whole_steps = [rec[n]["step_time_us"] for n in held[1:] if n not in {a.graph.step for a in analyses if a.cut_by_trace_end()}]
        out["trimmed_at_80pct"][path.name] = {
            "stops_at_us_from_start": stop - min(e["ts"] for e in whole["traceEvents"] if e.get("ph") == "X"),
            "steps_said_cut": [a.graph.step for a in analyses if a.cut_by_trace_end()],
            "run_step_time_us": run_answer(analyses).step_time.median_us,
            "recorded_median_of_the_whole_steps_us": float(statistics.median(whole_steps)),
            "steps": [
                {"step": r["step"], "step_time_us": r["step_time_us"], "recorded_step_time_us": rec[r["step"]]["step_time_us"]} for r in got
            ],
        }
    folder = DATA / "real-gpu/dlrm_v100_8rank"
    want = step_rows(folder)
    for style in ("sglang", "tracefuse", "one_pid"):
        (tmp / "merged.json").write_text(json.dumps(merged_ranks(rank_documents(folder), style)))
        got_a = api.analyze(tmp / "merged.json")[1]
        got = rows_of(got_a)
        out["merged_dlrm_8_workers"][style] = {
            "ranks": sorted({r for a in got_a for r in a.graph.ranks}),
            "step_time_us": [r["step_time_us"] for r in got],
            "folder_step_time_us": [r["step_time_us"] for r in want],
            "largest_breakdown_difference_us": _largest_difference(got, want),
        }
    out["split_per_step"] = {}
    for path, steps in (
        (DATA / "public-gpu/train_1rank_5steps.json.gz", (103, 104)),
        (DATA / "public-gpu/diff_test_rank1of2.json.gz", (1012,)),
    ):
        whole = json.loads(gzip.open(path).read())
        (tmp / "recorded.json").write_text(json.dumps(whole))
        rec = {r["step"]: r for r in step_rows(tmp / "recorded.json")}
        for n in steps:
            (tmp / "split.json").write_text(json.dumps(split_step(whole, n)))
            (one,) = api.analyze(tmp / "split.json")[1]
            out["split_per_step"][f"{path.name} step {n}"] = {
                "step_time_us": one.step_time,
                "recorded_step_time_us": rec[n]["step_time_us"],
                "queued_before_trace_us": [f.queued_before_trace_us for f in one.graph.info.facts.ranks],  # type: ignore[union-attr]
                "untraced_us": one.breakdown()["untraced"],
            }
    one = split_step(json.loads(gzip.open(DATA / "public-gpu/train_1rank_5steps.json.gz").read()), 103)
    one["traceEvents"] = [e for e in one["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    (tmp / "split.json").write_text(json.dumps(one))
    (alone,) = api.analyze(tmp / "split.json")[1]
    out["split_per_step"]["train_1rank_5steps.json.gz step 103, its ProfilerStep marker left out"] = {
        "step_time_us": alone.step_time,
        "queued_before_trace_us": [f.queued_before_trace_us for f in alone.graph.info.facts.ranks],  # type: ignore[union-attr]
        "untraced_us": alone.breakdown()["untraced"],
    }
    path = DATA / "public-gpu/train_1rank_5steps.json.gz"  # its autograd thread filtered out (slim_trace.py -t=auto)
    doc = json.loads(gzip.open(path).read())
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if "autograd" not in names.get((e.get("pid"), e.get("tid")), "")]
    (tmp / "slim.json").write_text(json.dumps(doc))
    (tmp / "recorded.json").write_text(json.dumps(json.loads(gzip.open(path).read())))
    got, want = step_rows(tmp / "slim.json"), {r["step"]: r for r in step_rows(tmp / "recorded.json")}
    out["autograd_thread_filtered_out_train_1rank"] = [
        {
            "step": r["step"],
            "step_time_us": r["step_time_us"],
            "compute_us": r["compute_us"],
            "recorded_step_time_us": want[r["step"]]["step_time_us"],
            "recorded_compute_us": want[r["step"]]["compute_us"],
        }
        for r in got
    ]
    path = DATA / "more-gpu/sglang_qwen3_8b_prefilldecode_mi300.json.gz"  # (no ProfilerStep: one window)
    (tmp / "merged.json").write_text(json.dumps(merged_ranks([json.loads(gzip.open(path).read()) for _ in range(2)], "sglang")))
    (got,), (want,) = api.analyze(tmp / "merged.json")[1], api.analyze(path)[1]
    out["merged_sglang_twice_no_steps"] = {
        "ranks": sorted(got.graph.ranks),
        "step_time_us": got.step_time,
        "one_file_step_time_us": want.step_time,
        "failed_checks": [c.name for c in got.checks() if not c.ok],
    }
    moved, got, want = _rewritten_file(DATA / "public-gpu/diff_control_rank3of8.json.gz", viewer_lanes, tmp / "lanes.json")
    out["viewer_lanes_diff_control"] = {
        "ops_moved": moved,
        "largest_breakdown_difference_us": _largest_difference(got, want),
    }
    path = DATA / "more-gpu/mtia_inference_rank0.json.gz"
    doc = json.loads(gzip.open(path).read())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    (tmp / "unnamed.json").write_text(json.dumps(doc))
    (un,), (rec,) = api.analyze(tmp / "unnamed.json")[1], api.analyze(path)[1]
    out["mtia_without_process_names"] = {
        "device_nodes": int(un.graph.nodes["on_gpu"].sum()),
        "recorded_device_nodes": int(rec.graph.nodes["on_gpu"].sum()),
        "step_time_us": un.step_time,
        "recorded_step_time_us": rec.step_time,
    }
    out["torch_npu_layout"] = {}  # an NPU job's trace as torch_npu writes it, made from a CUDA job's
    for path in (DATA / "public-gpu/train_1rank_5steps.json.gz", DATA / "real-gpu/ddp_v100_rank1of2_5steps.json.gz"):
        (tmp / "npu.json").write_text(json.dumps(as_torch_npu(json.loads(gzip.open(path).read()))))
        (tmp / "recorded.json").write_text(json.dumps(json.loads(gzip.open(path).read())))
        analyses, recorded = api.analyze(tmp / "npu.json")[1], api.analyze(tmp / "recorded.json")[1]
        got, want = rows_of(analyses), {r["step"]: r for r in rows_of(recorded)}
        got_run, want_run = run_answer(analyses), run_answer(recorded)
        out["torch_npu_layout"][path.name] = {
            "device_nodes": sum(int(a.graph.nodes["on_gpu"].sum()) for a in analyses),
            "recorded_device_nodes": sum(int(a.graph.nodes["on_gpu"].sum()) for a in recorded),
            "run_step_time_us": got_run.step_time.median_us,
            "recorded_run_step_time_us": want_run.step_time.median_us,
            "bound": got_run.bound,
            "recorded_bound": want_run.bound,
            "steps": [
                {
                    "step": r["step"],
                    "step_time_us": r["step_time_us"],
                    "compute_us": r["compute_us"],
                    "recorded_step_time_us": want[r["step"]]["step_time_us"],
                    "recorded_compute_us": want[r["step"]]["compute_us"],
                }
                for r in got
            ],
        }
    out["other_cpu_backends_gloo_straggler"] = {}
    folder = DATA / "gloo_ddp_8steps_straggler"
    for prefix in ("mpi:", "ucc:"):
        renamed, analyses, recorded_analyses = _rewritten_folder(
            folder, functools.partial(other_cpu_backend, prefix=prefix), tmp / prefix[:3]
        )
        got, want = run_answer(analyses), run_answer(recorded_analyses)
        rows, recorded = rows_of(analyses), rows_of(recorded_analyses)
        out["other_cpu_backends_gloo_straggler"][prefix] = {
            "ops_renamed": renamed,
            **_run_against(got, want),
            "largest_breakdown_difference_us": _largest_difference(rows, recorded),
        }
    renamed, analyses, recorded_analyses = _rewritten_folder(DATA / "real-gpu/dlrm_v100_8rank", nccl_generic_kernels, tmp / "generic")
    out["nccl_generic_kernels_dlrm"] = {
        "kernels_renamed": renamed,
        **_run_against(run_answer(analyses), run_answer(recorded_analyses)),
        "barriers": [a.graph.summary_counts()["barriers"] for a in analyses],
        "recorded_barriers": [a.graph.summary_counts()["barriers"] for a in recorded_analyses],
        "largest_breakdown_difference_us": _largest_difference(rows_of(analyses), rows_of(recorded_analyses)),
    }
    path = DATA / "public-gpu/diff_test_rank1of2.json.gz"
    renamed, got, want = _rewritten_file(path, collectives_outside_nccl, tmp / "custom.json")
    out["collectives_outside_nccl_diff_test"] = {
        "kernels_renamed": renamed,
        "communication_us": [r["breakdown_us"]["communication"] for r in got],
        "recorded_communication_us": [r["breakdown_us"]["communication"] for r in want],
        "largest_breakdown_difference_us": _largest_difference(got, want),
    }
    (tmp / "strings.json").write_text(json.dumps(times_as_strings(json.loads(gzip.open(path).read()))))
    (tmp / "recorded.json").write_text(json.dumps(json.loads(gzip.open(path).read())))
    got, want = step_rows(tmp / "strings.json"), step_rows(tmp / "recorded.json")
    out["times_as_strings_diff_test"] = {
        "step_time_us": [r["step_time_us"] for r in got],
        "recorded_step_time_us": [r["step_time_us"] for r in want],
        "largest_breakdown_difference_us": _largest_difference(got, want),
    }
    out["without_profiler_step"] = {}  # a loop recorded without prof.step(): steps cut at its optimizer's steps
    for path in (  # every fixture of two steps or more whose optimizer records its steps
        DATA / "public-gpu/train_1rank_5steps.json.gz",
        DATA / "real-gpu/ddp_v100_rank1of2_5steps.json.gz",
        DATA / "public-gpu/diff_test_rank1of2.json.gz",
        DATA / "public-gpu/sampled_128rank",
        DATA / "gloo_ddp_8steps_straggler",
        DATA / "gloo_ddp_2rank",
        DATA / "gloo_ddp_8steps_clean",
        DATA / "gloo_ddp_8steps_straggler_rerun",
        DATA / "gloo_ddp_10steps_injected",
        DATA / "own-gpu/gloo_cuda_ddp_tiny_clean",
        DATA / "own-gpu/gloo_cuda_ddp_tiny_pinned",
        DATA / "own-gpu/gloo_cuda_ddp_tiny_stall",
        DATA / "public-gpu/nccl_2rank_rank0.json.gz",
        DATA / "real-gpu/mi300_resnet_actckpt_rank0of8.json.gz",
        DATA / "public-gpu/diff_control_rank3of8.json.gz",
        DATA / "public-gpu/amd_mi250_minitoy.json.gz",
        DATA / "own-cpu/host_waits_stack.json.gz",
        DATA / "own-cpu/compiled_mlp_after_warmup.json.gz",
    ):
        bare, recorded = tmp / f"bare-{path.name}", tmp / f"recorded-{path.name}"
        bare.mkdir()
        recorded.mkdir()
        for f in sorted(path.glob("*.json.gz")) if path.is_dir() else [path]:
            doc = json.loads(gzip.open(f).read())
            (recorded / f.name.removesuffix(".gz")).write_text(json.dumps(doc))
            doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
            (bare / f.name.removesuffix(".gz")).write_text(json.dumps(doc))
        table, got = api.analyze(bare)
        got_run, want_run = run_answer(got), run_answer(api.analyze(recorded)[1])
        out["without_profiler_step"][path.name] = {
            "steps_from": sorted({v["name"] for v in run_facts(table).steps_from.values()}) if table is not None else [],
            "steps": got_run.steps,
            "recorded_steps": want_run.steps,
            **_run_against(got_run, want_run),
        }
    return out


def _rewritten_file(path: Path, rewrite: Callable[[dict], int], out: Path) -> tuple[int, list[dict], list[dict]]:
    """The trace ``path`` rewritten in place by ``rewrite`` (which returns how many events it
    changed) and written to ``out``, beside it as recorded (``recorded.json`` next to ``out``):
    (that count, the step rows of the rewritten, of the recorded)."""
    doc = json.loads(gzip.open(path).read())
    recorded = out.parent / "recorded.json"
    recorded.write_text(json.dumps(doc))
    changed = rewrite(doc)
    out.write_text(json.dumps(doc))
    return changed, step_rows(out), step_rows(recorded)


def _rewritten_folder(folder: Path, rewrite: Callable[[dict], int], out: Path) -> tuple[int, list, list]:
    """Every rank file of ``folder`` written to ``out`` rewritten in place by ``rewrite`` (which
    returns how many events it changed) and to ``out``-recorded as recorded: (the changes summed,
    the analyses of the rewritten folder, of the recorded one)."""
    recorded = out.with_name(f"{out.name}-recorded")
    out.mkdir()
    recorded.mkdir()
    changed = 0
    for f in sorted(folder.glob("*.json.gz")):
        doc = json.loads(gzip.open(f).read())
        (recorded / f.name.removesuffix(".gz")).write_text(json.dumps(doc))
        changed += rewrite(doc)
        (out / f.name.removesuffix(".gz")).write_text(json.dumps(doc))
    return changed, api.analyze(out)[1], api.analyze(recorded)[1]


def _run_against(got: RunAnswer, want: RunAnswer) -> dict:
    """The run answer ``got`` beside the recorded trace's ``want``: step time, bound, straggler."""
    return {
        "run_step_time_us": got.step_time.median_us,
        "recorded_run_step_time_us": want.step_time.median_us,
        "bound": got.bound,
        "recorded_bound": want.bound,
        "straggler_rank": got.straggler.rank if got.straggler else None,
        "recorded_straggler_rank": want.straggler.rank if want.straggler else None,
    }


def _largest_difference(got: list[dict], want: list[dict]) -> float:
    """The largest difference in µs between two step_rows' breakdowns, step for step."""
    return max(abs(x["breakdown_us"][k] - y["breakdown_us"][k]) for x, y in zip(got, want) for k in y["breakdown_us"])


def step_rows(path: Path, steps: list[int] | None = None) -> list[dict]:
    return rows_of(api.analyze(path, steps)[1])


def rows_of(analyses: list) -> list[dict]:
    """Per step analysed: its step time, period, span, compute and breakdown."""
    rows = []
    for a in analyses:
        b = a.breakdown()
        total = sum(b.values()) or 1.0
        rows.append(
            {
                "step": a.graph.step,
                "step_time_us": a.step_time,
                "period_us": a.period,
                "span_us": a.measured,
                "compute_us": b["compute"],
                "compute_share": b["compute"] / total,
                "compute_communication_share": (b["compute"] + b["communication"]) / total,
                "breakdown_us": b,
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "unseen_results.json")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    doc: dict = {"command": "python benchmarks/unseen.py"}
    doc["train_1rank_5steps"] = step_rows(DATA / "public-gpu/train_1rank_5steps.json.gz", [103, 104, 105])
    doc["mi300_resnet"] = step_rows(DATA / "real-gpu/mi300_resnet_actckpt_rank0of8.json.gz", [16, 17])
    diff = step_rows(DATA / "public-gpu/diff_test_rank1of2.json.gz")
    raw = raw_device_busy(DATA / "public-gpu/diff_test_rank1of2.json.gz")
    for r in diff:
        r["raw"] = raw.get(r["step"])
    doc["diff_test_rank1of2"] = diff
    more = DATA / "more-gpu"
    (ts,) = api.analyze(more / "timesformer_h100_1step.json.gz")[1]
    seg = ts.segments()
    big = max((s for s in seg if s.name == "cudaMemcpyAsync" or "cudaMemcpyAsync" in s.name), key=lambda s: s.dur, default=None)
    doc["timesformer"] = {
        **rows_of([ts])[0],
        "device_op_us_on_path": sum(s.dur for s in seg if s.on_gpu and s.kind == "op"),
        "longest_copy_segment": None if big is None else {"kind": big.kind, "dur_us": big.dur},
        "wait_us_on_path": sum(s.dur for s in seg if s.kind == "wait"),
    }
    (ow,) = api.analyze(more / "owlv2_h100_1step.json.gz")[1]
    by = ow.bystanders()
    doc["owlv2"] = {
        "bystanders": [{"tid": b.tid, "thread": b.thread} for b in by],
        "share_on_bystander_threads": sum(s.dur for s in ow.segments() if not s.on_gpu and s.tid in {b.tid for b in by}) / ow.step_time,
        "compute_communication_share": rows_of([ow])[0]["compute_communication_share"],
    }
    (sg,) = api.analyze(more / "sglang_qwen3_8b_prefilldecode_mi300.json.gz")[1]
    doc["sglang"] = {"longest_untraced_us": max((s.dur for s in sg.segments() if s.kind == "untraced"), default=0.0)}
    (mt,) = api.analyze(more / "mtia_inference_rank0.json.gz")[1]
    raw_mt = [e for e in json.load(gzip.open(more / "mtia_inference_rank0.json.gz"))["traceEvents"] if e.get("ph") == "X"]
    waits = [e for e in raw_mt if e.get("cat") == "mtia_ccp_events" and e["name"] == "event_wait"]
    doc["mtia"] = {
        "device_nodes": int(mt.graph.nodes["on_gpu"].sum()),
        "raw_event_waits": len(waits),
        "raw_event_wait_us": sum(e["dur"] for e in waits),
        "event_wait_as_op_on_path_us": sum(s.dur for s in mt.segments() if s.kind == "op" and mt.graph.node_name(s.node) == "event_wait"),
        "breakdown_us": mt.breakdown(),
        "step_time_us": mt.step_time,
    }
    doc["launch_queue"] = {
        "train_1rank_5steps": {
            "raw": raw_launch_queue(DATA / "public-gpu/train_1rank_5steps.json.gz"),
            "tool": host_paced(DATA / "public-gpu/train_1rank_5steps.json.gz", "cat=kernel,scale=0.2"),
        },
        "resnet50_legacy": {
            "raw": raw_launch_queue(DATA / "real-gpu/resnet50_legacy_2021_1gpu.pt.trace.json.gz"),
            "queue_waits": int((api.load(DATA / "real-gpu/resnet50_legacy_2021_1gpu.pt.trace.json.gz").queue_waits() >= 0).sum()),
        },
        "diff_test_rank1of2": {
            "tool": host_paced(DATA / "public-gpu/diff_test_rank1of2.json.gz", "cat=kernel,scale=0.5"),
            "windows_of_several_steps": windows_of_several_steps(DATA / "public-gpu/diff_test_rank1of2.json.gz", "cat=kernel,scale=0.5"),
        },
    }
    doc["device_clock_behind"] = device_clock_behind(DATA / "real-gpu/ddp_v100_rank1of2_5steps.json.gz", 300.0)
    doc["device_clock_ahead"] = device_clock_ahead(300.0)
    doc["one_side_profiled"] = {
        "train_1rank_5steps": one_side_profiled(DATA / "public-gpu/train_1rank_5steps.json.gz"),
        "timesformer": one_side_profiled(more / "timesformer_h100_1step.json.gz"),
    }
    doc["synchronous_launches"] = synchronous_launches()
    doc["runtime_setup"] = runtime_setup()
    doc["host_waits"] = host_waits()
    doc["advice_premises"] = advice_premises()
    with tempfile.TemporaryDirectory() as tmp:
        doc["rewritten_files"] = rewritten_files(Path(tmp))
    a.json.write_text(json.dumps(doc, indent=1, default=_plain) + "\n")
    for k, v in doc.items():
        print(k, json.dumps(v, default=_plain)[:400])


if __name__ == "__main__":
    main()

"""One process that drives two GPUs: each device's streams are its own.

A model split across GPUs in one process (``device_map="auto"``, naive model parallelism,
``nn.DataParallel``) writes one trace whose device ops sit on two device processes (pid 0 and 1).
CUPTI numbers streams within a device's context, so both devices' default streams are "stream 7"
(the same numeric stream on several devices is what a real 4-GPU profile shows: nsys-ai issue 142).
PyTorch's copy between devices makes the destination's stream wait for the source's under that
same number; Kineto's ``cuda_sync`` record of the wait names the waited-for stream by its number
alone. Read as one lane, the wait was a stream waiting on itself: dropped, and the second device's
work read as 8 ms of "device idle after the launch, no traced cause" a step (49% of the path).

No multi-GPU trace is bundled (no GPU here): the traces are constructed in Kineto's format (the
categories, names and args ``public-gpu/alexnet_1gpu`` writes, its ``Stream Wait Event`` records
included) from the schedule PyTorch's cross-device copy makes: four 2 ms kernels on GPU 0, the
copy on GPU 0's stream, GPU 1's stream waiting for the copy, four 2 ms kernels on GPU 1, then an
``.item()``. The oracle is the raw events written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

KERNEL_US, STEPS = 2000.0, 5


def _write(path: Path, stream1: int, with_sync: bool, synchronize: bool = False) -> None:
    """The trace; ``stream1``: GPU 1's stream number (GPU 0's is 7). ``synchronize``: the step ends
    in ``torch.cuda.synchronize(1)`` (its Context Sync record on GPU 1) instead of an ``.item()``,
    while GPU 0 runs a prefetch kernel that ends 3 µs after GPU 1's last op."""
    ev: list[dict] = []
    corr = 0

    def x(cat: str, name: str, ts: float, dur: float, args: dict | None = None, pid: int = 100, tid: int = 1) -> None:
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args or {}})

    def rt(name: str, ts: float, dur: float = 5.0) -> int:
        nonlocal corr
        corr += 1
        x("cuda_runtime", name, ts, dur, {"correlation": corr, "External id": corr})
        return corr

    t = 1000.0
    for step in range(1, STEPS + 1):
        t0, h, free0 = t, t + 10.0, t + 20.0
        for _ in range(4):
            x("cpu_op", "aten::mm", h, 20.0)
            c = rt("cudaLaunchKernel", h + 5)
            start = max(free0, h + 10)
            x("kernel", "sm80_gemm_stage0", start, KERNEL_US, {"correlation": c, "device": 0, "stream": 7}, pid=0, tid=7)
            free0, h = start + KERNEL_US + 2, h + 30
        # PyTorch's copy_device_to_device: source stream waits for the destination's, copies, destination waits back
        x("cpu_op", "aten::copy_", h, 40.0)
        rt("cudaEventRecord", h + 2, 3)
        rt("cudaStreamWaitEvent", h + 6, 3)
        c = rt("cudaMemcpyAsync", h + 10, 8)
        x(
            "gpu_memcpy",
            "Memcpy PtoP (Device -> Device)",
            free0,
            100.0,
            {"correlation": c, "device": 0, "stream": 7, "bytes": 1 << 24},
            pid=0,
            tid=7,
        )
        record = rt("cudaEventRecord", h + 20, 3)
        wait = rt("cudaStreamWaitEvent", h + 25, 3)
        if with_sync:
            args = {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": 7, "wait_on_cuda_event_record_corr_id": record}
            x(
                "cuda_sync",
                "Stream Wait Event",
                h + 30,
                1,
                {**args, "stream": stream1, "correlation": wait, "device": 1},
                pid=1,
                tid=stream1,
            )
        copied, free1, h = free0 + 100, free0 + 100 + 3, h + 45
        for _ in range(4):
            x("cpu_op", "aten::mm", h, 20.0)
            c = rt("cudaLaunchKernel", h + 5)
            start = max(free1, h + 10)
            x("kernel", "sm80_gemm_stage1", start, KERNEL_US, {"correlation": c, "device": 1, "stream": stream1}, pid=1, tid=stream1)
            free1, h = start + KERNEL_US + 2, h + 30
        if synchronize:
            x("cpu_op", "aten::mm", h, 20.0)
            c = rt("cudaLaunchKernel", h + 5)
            x("kernel", "sm80_prefetch", copied + 2, free1 + 1 - (copied + 2), {"correlation": c, "device": 0, "stream": 7}, pid=0, tid=7)
            c = rt("cudaDeviceSynchronize", h + 30, free1 + 8 - (h + 30))
            if with_sync:
                args = {"cuda_sync_kind": "Context Sync", "stream": -1, "correlation": c, "device": 1}
                x("cuda_sync", "Context Sync", free1 + 2, 1, args, pid=1, tid=-1)
        else:
            x("cpu_op", "aten::item", h, free1 + 12 - h)  # a copy to pageable host memory: returns when GPU 1 is done
            c = rt("cudaMemcpyAsync", h + 2, free1 + 8 - (h + 2))
            x(
                "gpu_memcpy",
                "Memcpy DtoH (Device -> Pageable)",
                free1,
                3.0,
                {"correlation": c, "device": 1, "stream": stream1, "bytes": 4},
                pid=1,
                tid=stream1,
            )
        x("user_annotation", f"ProfilerStep#{step}", t0, free1 + 16 - t0)
        t = free1 + 21
    meta = []
    for dev, stream in ((0, 7), (1, stream1)):
        meta += [
            {"ph": "M", "name": "process_name", "pid": dev, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "process_labels", "pid": dev, "tid": 0, "args": {"labels": f"GPU {dev}"}},
            {"ph": "M", "name": "thread_name", "pid": dev, "tid": stream, "args": {"name": f"stream {stream} "}},
        ]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": meta + ev}))


def _analyze(path: Path):
    from bottleneck_oracle import api

    return api.analyze(path)


CASES = [(7, True), (7, False), (13, True)]
IDS = ["same stream number, sync records", "same stream number, no sync records", "own stream numbers"]


@pytest.mark.parametrize(("stream1", "with_sync"), CASES, ids=IDS)
def test_the_second_device_waits_for_the_first_s_copy_not_for_nothing(tmp_path, stream1, with_sync):
    """Every step's path runs GPU 0's four kernels, the copy, GPU 1's four kernels: compute is the
    raw kernels' and copies' time (16.1 ms), nothing of it untraced; the step time is the raw
    ProfilerStep within 0.5%. Before: with the sync records and one stream number, 7.9 ms of every
    step (49%) untraced."""
    path = tmp_path / "two_gpus.json"
    _write(path, stream1, with_sync)
    raw = json.loads(path.read_text())["traceEvents"]
    spans = sorted(e["dur"] for e in raw if e["name"].startswith("ProfilerStep#"))
    device_us = sum(e["dur"] for e in raw if e.get("cat") in ("kernel", "gpu_memcpy")) / STEPS
    _, analyses = _analyze(path)
    assert len(analyses) == STEPS
    for a, span in zip(sorted(analyses, key=lambda a: a.graph.step), spans):
        b = a.breakdown()
        assert a.step_time == pytest.approx(span, rel=0.005), a.graph.step
        assert b["untraced"] < 0.01 * a.step_time, (a.graph.step, b)
        assert b["compute"] == pytest.approx(device_us, rel=0.01), (a.graph.step, b)


@pytest.mark.parametrize(("stream1", "with_sync"), CASES, ids=IDS)
def test_each_device_lane_holds_one_device_s_ops_and_says_which(tmp_path, stream1, with_sync):
    """The graph's device lanes: each holds the ops of one device of the raw trace (its kernels are
    named by stage here), never overlapping; named by the trace's device label where two devices
    share a stream number."""
    path = tmp_path / "two_gpus.json"
    _write(path, stream1, with_sync)
    raw = json.loads(path.read_text())["traceEvents"]
    device_of = {e["name"]: e["pid"] for e in raw if e.get("cat") in ("kernel", "gpu_memcpy")}
    _, analyses = _analyze(path)
    for a in analyses:
        g, n = a.graph, a.graph.nodes
        lanes: dict[tuple[int, int], set[int]] = {}
        for i in np.flatnonzero(n["on_gpu"]).tolist():
            name = g.node_name(i)
            if name in device_of:
                lanes.setdefault((int(n["rank"][i]), int(n["tid"][i])), set()).add(device_of[name])
        assert len(lanes) == 2 and all(len(d) == 1 for d in lanes.values()), lanes
        for lane in lanes:
            mine = np.flatnonzero(n["on_gpu"] & (n["rank"] == lane[0]) & (n["tid"] == lane[1]))
            order = mine[np.argsort(n["start"][mine])]
            assert (n["start"][order[1:]] >= n["start"][order[:-1]] + n["dur"][order[:-1]] - 1e-6).all(), lane
        names = {g.info.lane_name(r, t, True) for r, t in lanes}
        if stream1 == 7:
            assert names == {"GPU 0 stream 7", "GPU 1 stream 7"}, names


def _raw_busy(raw: list[dict]) -> tuple[dict[int, float], float]:
    """From the JSON: each device's median share of its step busy (its ops' time over the raw
    ProfilerStep span: the constructed ops never overlap on a device), and the time ops of the two
    devices overlap, over all steps."""
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in raw if e["name"].startswith("ProfilerStep#"))
    ops = [e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy")]
    share = {
        dev: float(np.median([sum(e["dur"] for e in ops if e["pid"] == dev and lo <= e["ts"] < hi) / (hi - lo) for lo, hi in steps[1:]]))
        for dev in (0, 1)
    }
    together = sum(
        max(0.0, min(a["ts"] + a["dur"], b["ts"] + b["dur"]) - max(a["ts"], b["ts"]))
        for a in ops
        if a["pid"] == 0
        for b in ops
        if b["pid"] == 1
    )
    return share, together


def test_the_run_answer_says_the_devices_take_turns(tmp_path):
    """The run answer's Devices line: each GPU's share of the step busy as the raw events give it
    (within 1 point), and no time with both busy (the raw ops of the two never overlap): they take
    turns. A trace on one device has no such line."""
    from bottleneck_oracle.analysis.answer import run_answer

    path = tmp_path / "two_gpus.json"
    _write(path, 7, True)
    share, together = _raw_busy(json.loads(path.read_text())["traceEvents"])
    assert together == 0.0 and min(share.values()) > 0.45
    answer = run_answer(list(_analyze(path)[1]))
    assert answer.devices is not None
    got = dict(answer.devices.busy)
    assert got.keys() == {"GPU 0", "GPU 1"}
    for dev in (0, 1):
        assert got[f"GPU {dev}"] == pytest.approx(share[dev], abs=0.01)
    assert answer.devices.together < 0.01
    line = next(x for x in answer.lines() if x.startswith("Devices:"))
    assert "take turns" in line and "GPU 0 50%" in line
    single = tmp_path / "one_gpu"
    single.mkdir()
    doc = json.loads(path.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("pid") != 1 and "stage1" not in e["name"]]
    (single / "trace.json").write_text(json.dumps(doc))
    assert run_answer(list(_analyze(single / "trace.json")[1])).devices is None


def test_a_synchronize_waits_for_its_own_device(tmp_path):
    """``torch.cuda.synchronize(1)`` waits for GPU 1 (its Context Sync record says which device);
    GPU 0's prefetch kernel, which ends 3 µs after GPU 1's last op but before the call returns,
    released nothing. The path runs through GPU 1's four kernels, never the prefetch (before: the
    latest-ending op of any of the rank's devices, the prefetch, 8 ms of the path)."""
    path = tmp_path / "two_gpus.json"
    _write(path, 7, True, synchronize=True)
    raw = json.loads(path.read_text())["traceEvents"]
    for step in (e for e in raw if e["name"].startswith("ProfilerStep#")):  # the raw events: the prefetch ends last
        mine = [e for e in raw if e["ph"] == "X" and step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
        last1 = max(e["ts"] + e["dur"] for e in mine if e["name"] == "sm80_gemm_stage1")
        prefetch = next(e for e in mine if e["name"] == "sm80_prefetch")
        assert prefetch["ts"] + prefetch["dur"] == pytest.approx(last1 + 3.0)
    _, analyses = _analyze(path)
    for a in analyses:
        on_path = [s.name for s in a.segments() if s.kind == "op"]
        assert on_path.count("sm80_gemm_stage1") == 4 and "sm80_prefetch" not in on_path, (a.graph.step, on_path)

"""Issue 27's GPU check: record the four loops whose pictures were wrong on traces from outside,
and say whether each is now right, against facts read from the trace's raw events.

- ``gpu_bound``: a loop the device bounds, the host free to run ahead (no sync in the loop): the
  host fills the device's launch queue and is then paced by it. Right: the step time is the
  device's period (within 5% of the period read from the raw events), compute and communication
  at least 80% of the path, and the launches that waited for room read as waits (blocking).
- ``item``: the same loop with ``loss.item()`` every step (a copy to pageable host memory, which
  blocks until the device is done). Right: the copy's call waits on the device (blocking, with a
  wait edge from a device op), compute at least 50% of the path.
- ``event_query``: the same loop ending each step with ``while not event.query(): pass``. Right:
  the queries are one polling wait per step (``polling_loops``), compute at least 50% of the path.
- ``tqdm``: the same loop under a tqdm bar, recorded with Python frames (``with_stack``) so that
  tqdm's monitor thread is in the trace. Right: no more than 10% of the path on that thread.

    PYTHONPATH=src python benchmarks/gpu_unseen.py OUT [--steps 8] [--device cuda]

OUT/<loop>.json.gz: the traces (for tests/data); OUT/gpu_unseen_results.json: per loop the facts
(from the raw JSON, not the tool's parser), the answer and whether each check holds. With
``--device cpu`` it runs end to end without a GPU (the device checks then say "no device work").
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch

LOOPS = ("gpu_bound", "item", "event_query", "tqdm")
WAIT_STEPS = 6  # unprofiled steps first


def _model(device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    width = 4096 if device != "cpu" else 256  # on a GPU: ~0.1-0.2 s of device work a step, a few ms of host work
    layers = []
    for _ in range(12):  # many mid-sized kernels a step: the host can run a queue's length ahead
        layers += [torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.LayerNorm(width)]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(8192 if device != "cpu" else 64, width, device=device)
    return model, opt, x


def _record(loop: str, out: Path, steps: int, device: str) -> Path:
    if loop == "event_query":  # (each step's loop records tens of thousands of queries)
        steps = min(steps, 4)
    model, opt, x = _model(device)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device != "cpu" else [])
    # the steps before the profiled ones let a free-running host get a launch queue ahead
    schedule = torch.profiler.schedule(wait=WAIT_STEPS, warmup=1, active=steps)
    path = out / f"{loop}.json"
    bar = None
    if loop == "tqdm":
        try:
            from tqdm import tqdm

            bar = tqdm(total=WAIT_STEPS + 1 + steps, mininterval=0.0)
            bar.monitor_interval = 1  # (its monitor thread wakes every second: in the trace, asleep through steps)
        except ImportError:  # the same: a thread that sleeps on an event through the steps
            stop = threading.Event()
            threading.Thread(target=lambda: [stop.wait(1.0) for _ in range(60) if not stop.is_set()], daemon=True).start()
    with torch.profiler.profile(activities=acts, schedule=schedule, with_stack=(loop == "tqdm")) as prof:
        for _ in range(WAIT_STEPS + 1 + steps):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if loop == "item":
                loss.item()
            elif loop == "event_query" and device != "cpu":
                ev = torch.cuda.Event()
                ev.record()
                while not ev.query():
                    pass
            if bar is not None:
                bar.update(1)
            prof.step()
    if device != "cpu":
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    if bar is not None:
        bar.close()
    gz = out / f"{loop}.json.gz"
    with open(path, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return gz


def raw_facts(path: Path) -> dict:
    """From the raw JSON: per ProfilerStep its host span and period (end of the device work the
    steps before launched to the end of its own), the device's busy time in the period, the
    threads other than the step's and their Python frames."""
    ev = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    launch = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    device = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    ends: dict[int, float] = {}
    for d in device:
        t = launch.get(d.get("args", {}).get("correlation"))
        for lo, hi, n in steps if t is not None else ():
            if lo <= t < hi:
                ends[n] = max(ends.get(n, 0.0), d["ts"] + d["dur"])
    out = {}
    for lo, hi, n in steps:
        start = max(lo, ends.get(n - 1, lo))
        end = max(hi, ends.get(n, hi))
        busy = sorted((max(d["ts"], start), min(d["ts"] + d["dur"], end)) for d in device if d["ts"] < end and d["ts"] + d["dur"] > start)
        total, cur = 0.0, None
        for a, b in busy:
            if cur is None or a > cur[1]:
                total += (cur[1] - cur[0]) if cur else 0.0
                cur = [a, b]
            else:
                cur[1] = max(cur[1], b)
        total += (cur[1] - cur[0]) if cur else 0.0
        out[n] = {"span_us": hi - lo, "period_us": end - start if n - 1 in ends else None, "device_busy": total / max(end - start, 1e-9)}
    main = {e["tid"] for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")}
    tqdm_threads = sorted(
        {e["tid"] for e in ev if e.get("cat") == "python_function" and "tqdm" in str(e.get("name", "")) and e["tid"] not in main}
    )
    return {"steps": out, "device_events": len(device), "tqdm_threads": tqdm_threads}


def judge(loop: str, path: Path) -> dict:
    from bottleneck_oracle import api
    from bottleneck_oracle.graph_pipeline.schema import Category, EdgeKind

    facts = raw_facts(path)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        _, analyses = api.analyze(path)
    rows = []
    for a in analyses[1:]:  # (the first profiled step: no earlier device work in the trace)
        g, n, e = a.graph, a.graph.nodes, a.graph.edges
        b = a.breakdown()
        raw = facts["steps"].get(g.step, {})
        blocking = (n["category"] == Category.BLOCKING) & ~n["on_gpu"]
        waits = np.unique(e["dst"][(e["kind"] == EdgeKind.SYNC) & blocking[e["dst"]] & n["on_gpu"][e["src"]]])
        on_thread: dict[str, float] = {}
        for s in a.segments():
            if not s.on_gpu:
                on_thread[str(s.tid)] = on_thread.get(str(s.tid), 0.0) + s.dur
        rows.append(
            {
                "step": g.step,
                "step_time_us": a.step_time,
                "raw_period_us": raw.get("period_us"),
                "raw_span_us": raw.get("span_us"),
                "raw_device_busy": raw.get("device_busy"),
                "device_share": (b["compute"] + b["communication"]) / a.step_time,
                "blocking_calls": int(blocking.sum()),
                "blocking_waited_on_device": len(waits),
                "polling_loops": int(g.meta.get("polling_loops", 0)),
                "path_by_host_thread_us": on_thread,
                "bystanders": [x.thread for x in a.bystanders()],
            }
        )
    checks: dict[str, bool | str] = {}
    if not facts["device_events"]:
        checks["device"] = "no device work in the trace (run with --device cuda)"
    elif loop == "gpu_bound":
        checks["step time within 5% of the raw period"] = all(
            r["raw_period_us"] is None or abs(r["step_time_us"] - r["raw_period_us"]) <= 0.05 * r["raw_period_us"] for r in rows
        )
        checks["compute + communication >= 80% of the path"] = all(r["device_share"] >= 0.8 for r in rows)
        checks["launches waiting for room read as waits"] = any(r["blocking_calls"] > 0 for r in rows)
    elif loop == "item":
        checks["the copy waits on the device"] = all(r["blocking_waited_on_device"] >= 1 for r in rows)
        checks["compute + communication >= 50% of the path"] = all(r["device_share"] >= 0.5 for r in rows)
    elif loop == "event_query":
        checks["one polling wait a step"] = all(r["polling_loops"] >= 1 for r in rows)
        checks["compute + communication >= 50% of the path"] = all(r["device_share"] >= 0.5 for r in rows)
    if loop == "tqdm":
        mine = {str(t) for t in facts["tqdm_threads"]}
        checks["<= 10% of the path on tqdm's thread"] = (
            all(sum(us for t, us in r["path_by_host_thread_us"].items() if t in mine) <= 0.1 * r["step_time_us"] for r in rows)
            if mine
            else "tqdm's thread is not in the trace (no Python frame of it)"
        )
    return {
        "loop": loop,
        "trace": path.name,
        "checks": checks,
        "tqdm_threads": facts["tqdm_threads"],
        "steps": rows,
        "warnings": sorted({str(w.message) for w in said}),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--loops", nargs="*", default=list(LOOPS), choices=LOOPS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {"torch": torch.__version__, "device": args.device}
    if args.device != "cpu":
        env["gpu"] = torch.cuda.get_device_name(0)
    results = []
    for loop in args.loops:
        t0 = time.monotonic()
        try:
            path = _record(loop, args.out, args.steps, args.device)
            results.append({**judge(loop, path), "seconds": round(time.monotonic() - t0, 1)})
        except Exception as exc:  # one loop's failure must not lose the others' traces
            results.append({"loop": loop, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps({k: v for k, v in results[-1].items() if k != "steps"}), flush=True)
    (args.out / "gpu_unseen_results.json").write_text(json.dumps({"env": env, "loops": results}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The pictures of the traces that were read wrong before (issue 27), as figures: per step the step
time against its period and the host's span, the share of the path that is compute and
communication, what the blocking copies and bystander threads became, and the device busy time
read from the raw events (json, not our scanner) beside the breakdown's compute.

    python benchmarks/unseen.py [--json benchmarks/unseen_results.json]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import warnings
from pathlib import Path

from bottleneck_oracle import api

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


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


def step_rows(path: Path, steps: list[int] | None = None) -> list[dict]:
    _, analyses = api.analyze(path, steps)
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
        **step_rows(more / "timesformer_h100_1step.json.gz")[0],
        "device_op_us_on_path": sum(s.dur for s in seg if s.on_gpu and s.kind == "op"),
        "longest_copy_segment": None if big is None else {"kind": big.kind, "dur_us": big.dur},
        "wait_us_on_path": sum(s.dur for s in seg if s.kind == "wait"),
    }
    (ow,) = api.analyze(more / "owlv2_h100_1step.json.gz")[1]
    by = ow.bystanders()
    doc["owlv2"] = {
        "bystanders": [{"tid": b.tid, "thread": b.thread} for b in by],
        "share_on_bystander_threads": sum(s.dur for s in ow.segments() if not s.on_gpu and s.tid in {b.tid for b in by}) / ow.step_time,
        "compute_communication_share": step_rows(more / "owlv2_h100_1step.json.gz")[0]["compute_communication_share"],
    }
    (sg,) = api.analyze(more / "sglang_qwen3_8b_prefilldecode_mi300.json.gz")[1]
    doc["sglang"] = {"longest_untraced_us": max((s.dur for s in sg.segments() if s.kind == "untraced"), default=0.0)}
    (mt,) = api.analyze(more / "mtia_inference_rank0.json.gz")[1]
    doc["mtia"] = {"device_nodes": int(mt.graph.nodes["on_gpu"].sum())}
    a.json.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    for k, v in doc.items():
        print(k, json.dumps(v, default=float)[:400])


if __name__ == "__main__":
    main()

"""Synthetic Kineto traces of a data-parallel GPU training job, one file per rank.

The mix follows what real traces of transformer training hold: per layer, nested
aten ops on the main thread launching kernels on a compute stream (with ac2g
flows), backward ops on the autograd thread linked by fwdbwd flows, NCCL
all-reduce kernels on a communication stream (record_param_comms with collective
args), optimizer foreach ops, and a stream synchronize ending each step. Ranks
are generated in lockstep so each all-reduce ends at the same time on every rank
(after the last rank arrived); one rank is a 15% slower straggler.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

COMPUTE_STREAM, NCCL_STREAM = 7, 20
FORWARD_OPS = ("aten::linear", "aten::layer_norm", "aten::gelu", "aten::linear", "aten::scaled_dot_product_attention", "aten::add")
EVENTS_PER_STEP = 2207  # trace events one rank writes per step with the defaults below (24 layers, 4 buckets)


class _Rank:
    def __init__(self, rank: int, world: int, seed: int, slow: float) -> None:
        self.rank, self.world, self.slow = rank, world, slow
        self.rng = random.Random(seed * 1000 + rank)
        self.events: list[dict] = []
        self.pid, self.main, self.bwd = 1000 + rank, 1000 + rank, 2000 + rank
        self.t = 1_000_000.0  # CPU clock, µs
        self.stream_free = {COMPUTE_STREAM: 0.0, NCCL_STREAM: 0.0}
        self.corr = 1
        self.ext = 1
        self.flow = 1
        self.written = 0

    def flush(self, out: Path, last: bool = False) -> None:
        """Append the events so far to rank-N.json (Kineto's layout: a space after each colon
        and comma; HTA reads the rank with a regex on it) and forget them."""
        path = out / f"rank-{self.rank}.json"
        sep = (", ", ": ")
        with open(path, "w" if self.written == 0 else "a") as fh:
            if self.written == 0:
                head = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world}}
                fh.write(json.dumps(head, separators=sep)[:-1] + ', "traceEvents": [')
            for e in self.events:
                fh.write((", " if self.written else "") + json.dumps(e, separators=sep))
                self.written += 1
            if last:
                fh.write("]}")
        self.events = []

    def x(self, cat, name, tid, ts, dur, args=None, pid=None) -> dict:
        e = {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": self.pid if pid is None else pid,
            "tid": tid,
            "ts": round(ts, 3),
            "dur": round(dur, 3),
        }
        if args:
            e["args"] = args
        self.events.append(e)
        return e

    def d(self, mean: float) -> float:
        return max(0.5, self.rng.gauss(mean, mean * 0.1)) * self.slow

    def launch(self, tid: int, kernel: str, kdur: float, stream: int = COMPUTE_STREAM, kargs: dict | None = None) -> dict:
        """cudaLaunchKernel at the CPU clock on thread tid, and its kernel on a stream."""
        c = self.corr
        self.corr += 1
        ldur = self.d(4.0)
        self.x("cuda_runtime", "cudaLaunchKernel", tid, self.t, ldur, {"correlation": c, "External id": self.ext})
        start = max(self.t + ldur + 2.0, self.stream_free[stream])
        k = self.x(
            "kernel",
            kernel,
            stream,
            start,
            kdur,
            {"correlation": c, "stream": stream, "device": 0, "External id": self.ext, **(kargs or {})},
            pid=0,
        )
        self.stream_free[stream] = start + kdur
        for ph, tid_, ts in (("s", tid, self.t), ("f", stream, start)):
            self.events.append(
                {
                    "ph": ph,
                    "cat": "ac2g",
                    "name": "ac2g",
                    "id": c,
                    "pid": self.pid if ph == "s" else 0,
                    "tid": tid_,
                    "ts": round(ts, 3),
                    **({"bp": "e"} if ph == "f" else {}),
                }
            )
        self.t += ldur + 1.0
        return k

    def op(self, tid: int, name: str, kernel: str, kmean: float) -> float:
        """A two-level aten op that launches one kernel; returns its start (for fwdbwd flows)."""
        start = self.t
        self.t += self.d(3.0)
        inner = self.t
        self.t += self.d(2.0)
        self.launch(tid, kernel, self.d(kmean))
        self.t += self.d(2.0)
        self.x("cpu_op", name.replace("aten::", "aten::_") + "_impl", tid, inner, self.t - inner, {"External id": self.ext})
        self.t += self.d(1.5)
        self.x("cpu_op", name, tid, start, self.t - start, {"External id": self.ext, "Sequence number": self.ext})
        self.ext += 1
        self.t += self.d(4.0)
        return start


def generate(out: str | Path, events: int = 1_000_000, ranks: int = 8, layers: int = 24, buckets: int = 4, seed: int = 0) -> dict:
    """Write rank-N.json files holding about ``events`` trace events in all; returns a summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    steps = max(1, round(events / (ranks * EVENTS_PER_STEP)))
    rs = [_Rank(r, ranks, seed, 1.15 if r == ranks - 1 else 1.0) for r in range(ranks)]
    for step in range(steps):
        for R in rs:
            R.step_start = R.t
            R.fwd_starts = []
            for layer in range(layers):
                a = R.t
                R.t += R.d(2.0)
                for name in FORWARD_OPS:
                    R.fwd_starts.append(R.op(R.main, name, f"sm90_xmma_gemm_{name[6:]}_kernel", 60.0))
                R.x("user_annotation", f"layers.{layer}", R.main, a, R.t - a)
            R.t = max(R.t, R.stream_free[COMPUTE_STREAM] - 200.0)  # backward starts as the GPU catches up
            R.flush(out)
        for b in range(buckets):
            for R in rs:
                for i in range(len(FORWARD_OPS) * layers // buckets):
                    k = b * (len(FORWARD_OPS) * layers // buckets) + i
                    s = R.t
                    R.op(R.bwd, "autograd::engine::evaluate_function: MmBackward0", "sm90_xmma_gemm_backward_kernel", 110.0)
                    fid = R.flow
                    R.flow += 1
                    fwd_ts = R.fwd_starts[-1 - k] if k < len(R.fwd_starts) else R.step_start
                    R.events.append(
                        {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": fid, "pid": R.pid, "tid": R.main, "ts": round(fwd_ts, 3)}
                    )
                    R.events.append(
                        {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "id": fid, "pid": R.pid, "tid": R.bwd, "ts": round(s, 3), "bp": "e"}
                    )
                R.nccl_call = R.t
                R.t += R.d(3.0)
                R.nccl_start = max(R.t + 6.0, R.stream_free[NCCL_STREAM], R.stream_free[COMPUTE_STREAM])
            arrive = max(R.nccl_start for R in rs)
            nelems = 16_777_216
            for R in rs:
                args = {
                    "Collective name": "allreduce",
                    "In msg nelems": nelems,
                    "Out msg nelems": nelems,
                    "Group size": ranks,
                    "dtype": "BFloat16",
                    "Process Group Name": "0",
                    "Process Group Ranks": str(list(range(ranks))),
                }
                R.x("cpu_op", "record_param_comms", R.bwd, R.nccl_call, R.t - R.nccl_call + 8.0, {"External id": R.ext, **args})
                R.stream_free[NCCL_STREAM] = R.nccl_start
                k = R.launch(
                    R.bwd, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 1.0, NCCL_STREAM, args
                )
                k["dur"] = round(arrive + 900.0 - k["ts"], 3)
                R.stream_free[NCCL_STREAM] = arrive + 900.0
                R.t += 8.0
                R.flush(out)
        for R in rs:
            R.t = max(R.t, max(x.t for x in rs) - 50.0)
            for _ in range(layers):
                R.op(R.main, "aten::_foreach_add_", "multi_tensor_apply_kernel", 25.0)
            c = R.corr
            R.corr += 1
            done = max(R.stream_free.values())
            R.x("cuda_runtime", "cudaStreamSynchronize", R.main, R.t, max(done - R.t, 0.0) + 3.0, {"correlation": c})
            R.x(
                "cuda_sync",
                "Stream Sync",
                COMPUTE_STREAM,
                done,
                1.0,
                {"correlation": c, "stream": COMPUTE_STREAM, "cuda_sync_kind": "Stream Sync", "device": 0},
                pid=0,
            )
            R.t = max(R.t, done) + 6.0
            R.x("user_annotation", f"ProfilerStep#{step}", R.main, R.step_start, R.t - R.step_start)
            R.t += 5.0
            R.flush(out)  # events are final once written: memory holds one step of the job, not the whole trace
    for R in rs:
        R.flush(out, last=True)
    return {"events": sum(R.written for R in rs), "ranks": ranks, "steps": steps, "folder": str(out)}

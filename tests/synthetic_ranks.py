"""Synthetic 2-rank CPU (gloo-style) traces written event by event, for region blame and re-run tests.

Each step, both ranks run a ``forward`` range holding an inner ``block`` range of small
``aten::mm`` / ``aten::tanh`` ops, then all-reduce (a c10d call, the gloo op on a backend thread
that ends after the last rank arrived) and resume. Rank 1 can run extra small ops inside ``block``
(or in a range of their own): the step takes that much longer (rank 0 waits at the all-reduce), and
that extra time is known from the construction.
"""

from __future__ import annotations

import gzip
import json
import random

MM_US, TANH_US, GAP_US = 60.0, 20.0, 5.0  # a regular pair of ops and the untraced time after each
EXTRA_MM_US, EXTRA_TANH_US = 100.0, 40.0  # an extra pair
NELEMS = 262144


def _x(name, cat, ts, dur, tid, pid, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": round(ts, 3), "dur": round(dur, 3), "pid": pid, "tid": tid, "args": args}


class _Rank:
    def __init__(self, rank: int, seed: int, noise: float) -> None:
        self.rank, self.pid, self.noise = rank, 100 + rank, noise
        self.rng = random.Random(seed * 100 + rank)
        self.events: list[dict] = []
        self.t = 0.0

    def d(self, mean: float) -> float:
        return max(1.0, self.rng.gauss(mean, mean * self.noise))

    def op(self, name: str, mean: float) -> float:
        """An op at the clock, then the untraced time after it; returns the time it took (op and gap)."""
        t0 = self.t
        dur = self.d(mean)
        self.events.append(_x(name, "cpu_op", self.t, dur, 1, self.pid))
        self.t += dur + self.d(GAP_US)
        return self.t - t0

    def pairs(self, k: int, mm: float, tanh: float) -> float:
        return sum(self.op("aten::mm", mm) + self.op("aten::tanh", tanh) for _ in range(k))

    def range(self, name: str, start: float) -> None:
        self.events.append(_x(name, "user_annotation", start, self.t - start, 1, self.pid))
        self.t += self.d(GAP_US)


def write_run(
    folder,
    steps: int = 6,
    extra_pairs: int = 0,
    extra_steps: tuple[int, ...] = (),
    seed: int = 0,
    noise: float = 0.03,
    extra_range: str | None = None,
    repeats: int = 1,
    block: str = "block",
) -> dict[int, float]:
    """Write rank-0.json.gz and rank-1.json.gz. Rank 1 runs ``extra_pairs`` extra mm + tanh pairs
    inside ``block`` in the steps ``extra_steps`` (or, with ``extra_range``, in a range of that
    name no other rank runs, after ``block``). With ``repeats``, ``forward`` runs ``block`` that
    many times (as a pipeline runs a stage once per micro-batch), each with ``extra_pairs`` extra
    pairs; ``block`` names the inner range, ``{i}`` in it the repeat's number (``Forward {i}``, as
    torch.distributed.pipelining names a micro-batch's forward). Returns per step the time rank 1 spent in its extra
    ops and the untraced time after them (µs)."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = [_Rank(r, seed, noise) for r in range(2)]
    extra_us: dict[int, float] = {}
    t = 1000.0
    for step in range(1, steps + 1):
        arrive = []
        for R in ranks:
            R.t = t
            step_start = R.t
            R.t += R.d(20.0)
            fwd = R.t
            R.t += R.d(GAP_US)
            R.pairs(10, MM_US, TANH_US)
            extra = R.rank == 1 and step in extra_steps and extra_pairs > 0
            for i in range(repeats):
                block_start = R.t
                R.t += R.d(GAP_US)
                R.pairs(10, MM_US, TANH_US)
                if extra and extra_range is None:
                    extra_us[step] = extra_us.get(step, 0.0) + R.pairs(extra_pairs, EXTRA_MM_US, EXTRA_TANH_US)
                R.range(block.format(i=i), block_start)
            if extra and extra_range is not None:
                other = R.t
                R.t += R.d(GAP_US)
                extra_us[step] = R.pairs(extra_pairs, EXTRA_MM_US, EXTRA_TANH_US)
                R.range(extra_range, other)
                extra_us[step] += R.t - other - extra_us[step]  # the range's own untraced time too
            R.pairs(10, MM_US, TANH_US)
            R.range("forward", fwd)
            call = R.t
            R.events.append(
                _x("c10d::allreduce_", "cpu_op", call, 20.0, 1, R.pid, **{"Input Dims": [[[NELEMS]]], "Input type": ["TensorList"]})
            )
            R.t = call + 25.0
            arrive.append(R.t)
            R.step_start = step_start
        done = max(arrive) + 300.0
        for R, a in zip(ranks, arrive):
            R.events.append(
                _x("gloo:all_reduce", "user_annotation", a, done - a, 2, R.pid, **{"Input Dims": [[NELEMS]], "Input type": ["float"]})
            )
            R.t = done + 10.0
            R.op("aten::div_", 30.0)
            R.events.append(_x(f"ProfilerStep#{step}", "user_annotation", R.step_start, R.t + 20.0 - R.step_start, 1, R.pid))
        t = max(R.t for R in ranks) + 200.0
    for R in ranks:
        doc = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": R.rank, "world_size": 2}, "traceEvents": R.events}
        with gzip.open(folder / f"rank-{R.rank}.json.gz", "wt") as fh:
            json.dump(doc, fh)
    return extra_us

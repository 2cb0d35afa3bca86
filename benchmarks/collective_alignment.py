"""How collectives without sequence numbers are matched across ranks where a rank's trace lacks
some (events sampled, a trace trimmed or cut): the tool's matching (collectives.match_instances:
each process group's sequences aligned) against the rule it replaced (the k-th op of one kind,
process group and size on every rank is one collective), on two kinds of input:

- ``synthetic``: a process group's collectives (two kinds, two sizes, in one random order) issued
  100 µs apart with ±10 µs of jitter and a clock offset per rank; each op dropped from a rank's
  trace at random; each rank arrives at its own time (starts up to 40 µs apart) and all end
  together within ±5 µs: device kernels on aligned clocks (``device``: time may veto a pair), on
  clocks 400 µs apart, what an imperfect alignment of two hosts' clocks could leave
  (``device, clocks off``), a
  host backend's spans closing late by an exponential time of mean 300 µs (``host backend``:
  order only), or clocks ±5 ms apart as clocks.py matches them before aligning them
  (``unaligned``: order only). Truth: which collective each op is.
- ``pipeline``: two pipeline stages' sends and receives (NCCL kernels on aligned clocks).
- ``dlrm``: the real 8-rank DLRM trace (real-gpu/dlrm_v100_8rank: per rank and step 5 NCCL
  SendRecv kernels and 3 all-reduce kernels, no message sizes, no sequence numbers), one NCCL
  kernel removed from one rank's file at a time. Truth: the instances of the file as recorded.

- ``sampled``: real multi-rank traces (DLRM; our 8-step gloo DDP job and our 2-rank gloo job on
  CUDA tensors) with 5% of every rank's events dropped at random, 10 copies each. Truth: the
  instances of the trace as recorded.

Per condition: instances that pair ops of different collectives (``wrong``), collectives two or
more ranks hold that are not one instance (``missed``), and steps or runs the analysis refused.

    python benchmarks/collective_alignment.py [--json benchmarks/collective_alignment_results.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np

from bottleneck_oracle import api
from bottleneck_oracle.errors import GraphError
from bottleneck_oracle.graph_pipeline.collectives import match_instances
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT.parent / "shared" / "traces" / "real-gpu" / "dlrm_v100_8rank"
KINDS = (int(CollectiveKind.ALL_REDUCE), int(CollectiveKind.ALL_GATHER))
SEND, RECV = int(CollectiveKind.SEND), int(CollectiveKind.RECV)


def kth_of_kind_and_size(rank: np.ndarray, start: np.ndarray, ckind: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The rule replaced: on every rank, the k-th op of one kind and size is one collective."""
    inst = np.full(len(rank), -1, dtype=np.int64)
    seen: dict[tuple, list[int]] = {}
    for i in np.lexsort((start, rank)).tolist():
        key = (int(rank[i]), int(ckind[i]), float(size[i]) if np.isfinite(size[i]) else -1.0)
        seen.setdefault(key, []).append(i)
    groups: dict[tuple, list[int]] = {}
    for (_, k, m), ops in seen.items():
        for j, i in enumerate(ops):
            groups.setdefault((k, m, j), []).append(i)
    n = 0
    for members in groups.values():
        if len({int(rank[i]) for i in members}) >= 2:
            inst[members] = n
            n += 1
    return inst


def score(inst: np.ndarray, truth: np.ndarray, rank: np.ndarray) -> dict[str, int]:
    wrong = sum(len(set(truth[inst == i].tolist())) > 1 for i in np.unique(inst[inst >= 0]).tolist())
    missed = 0
    for t in np.unique(truth).tolist():
        mine = truth == t
        if len(set(rank[mine].tolist())) >= 2 and not (inst[mine][0] >= 0 and (inst[mine] == inst[mine][0]).all()):
            missed += 1
    held = sum(len(set(rank[truth == t].tolist())) >= 2 for t in np.unique(truth).tolist())
    return {"instances": int(len(np.unique(inst[inst >= 0]))), "collectives_held": int(held), "wrong": int(wrong), "missed": int(missed)}


def synthetic_job(seed: int, ranks: int, n: int, drop: float, clock: str) -> dict[str, np.ndarray]:
    rng = random.Random(seed)
    calls = [(rng.choice(KINDS), rng.choice((1024, 4096))) for _ in range(n)]
    cols: dict[str, list] = {"rank": [], "start": [], "end": [], "ckind": [], "size": [], "truth": []}
    for r in range(ranks):
        offset = {"unaligned": rng.uniform(-5000, 5000), "device, clocks off": rng.choice((-1, 1)) * 400.0}.get(clock, rng.uniform(-20, 20))
        for j, (k, m) in enumerate(calls):
            late = rng.expovariate(1 / 300.0) if clock == "host backend" else 0.0
            if rng.random() < drop:
                continue
            cols["rank"].append(r)
            cols["start"].append(offset + 100.0 * j - rng.uniform(0, 40))  # (each rank gets there at its own time)
            cols["end"].append(offset + 100.0 * j + late + rng.uniform(-5, 5))
            cols["ckind"].append(k)
            cols["size"].append(m)
            cols["truth"].append(j)
    return {k: np.array(v) for k, v in cols.items()}


def pipeline_job(seed: int, n: int, drop: float) -> dict[str, np.ndarray]:
    """Two pipeline stages: activations (two sizes) sent from rank 0 to rank 1, gradients (one
    size) sent back, alternately 100 µs apart; each send and receive dropped at random."""
    rng = random.Random(seed)
    cols: dict[str, list] = {"rank": [], "start": [], "ckind": [], "size": [], "peer": [], "truth": []}
    for j in range(n):
        forward = j % 2 == 0
        size = rng.choice((1024, 4096)) if forward else 2048
        src, dst = (0, 1) if forward else (1, 0)
        for r, k, peer in ((src, SEND, dst), (dst, RECV, src)):
            if rng.random() < drop:
                continue
            cols["rank"].append(r)
            cols["start"].append(100.0 * j + rng.uniform(-10, 10) + (20.0 if r == 1 else 0.0))
            cols["ckind"].append(k)
            cols["size"].append(size)
            cols["peer"].append(peer)
            cols["truth"].append(j)
    return {k: np.array(v) for k, v in cols.items()}


def _zero() -> dict[str, int]:
    return dict.fromkeys(("instances", "collectives_held", "wrong", "missed"), 0)


def synthetic(seeds: int) -> list[dict]:
    out = []
    for ranks in (2, 4, 8):
        for clock in ("device", "device, clocks off", "host backend", "unaligned"):
            for drop in (0.0, 0.02, 0.08, 0.2):
                tot = {"tool": _zero(), "kth_of_kind_and_size": _zero()}
                for seed in range(seeds):
                    c = synthetic_job(seed, ranks, 60, drop, clock)
                    rank = c["rank"].astype(np.int32)
                    size = c["size"].astype(float)
                    ours = match_instances(
                        rank,
                        c["start"],
                        c["ckind"].astype(np.int8),
                        np.zeros(len(rank), np.int64),
                        size,
                        end=c["end"],
                        tight=np.full(len(rank), clock.startswith("device")),
                    )
                    old = kth_of_kind_and_size(rank, c["start"], c["ckind"], size)
                    for name, inst in (("tool", ours), ("kth_of_kind_and_size", old)):
                        for k, v in score(inst, c["truth"], rank).items():
                            tot[name][k] += v
                out.append({"ranks": ranks, "drop": drop, "clock": clock, "jobs": seeds, **tot})
    return out


def pipeline(seeds: int) -> list[dict]:
    out = []
    for drop in (0.0, 0.02, 0.05, 0.1):
        tot = {"tool": _zero(), "kth_of_kind_and_size": _zero()}
        for seed in range(seeds):
            c = pipeline_job(seed, 80, drop)
            rank = c["rank"].astype(np.int32)
            args = (rank, c["start"], c["ckind"].astype(np.int8), np.zeros(len(rank), np.int64), c["size"].astype(float))
            ours = match_instances(*args, c["peer"].astype(np.int64), tight=np.ones(len(rank), bool))
            old = kth_send_of_size(rank, c["start"], c["ckind"], c["size"], c["peer"])
            for name, inst in (("tool", ours), ("kth_of_kind_and_size", old)):
                for k, v in score(inst, c["truth"], rank).items():
                    tot[name][k] += v
        out.append({"ranks": 2, "drop": drop, "jobs": seeds, **tot})
    return out


def kth_send_of_size(rank: np.ndarray, start: np.ndarray, ckind: np.ndarray, size: np.ndarray, peer: np.ndarray) -> np.ndarray:
    """The rule replaced, for sends: the k-th send of a size from a to b is the k-th receive of that size on b from a."""
    inst = np.full(len(rank), -1, dtype=np.int64)
    seen: dict[tuple, list[int]] = {}
    for i in np.argsort(start, kind="stable").tolist():
        pair = (int(rank[i]), int(peer[i])) if ckind[i] == SEND else (int(peer[i]), int(rank[i]))
        seen.setdefault((*pair, float(size[i]), int(ckind[i])), []).append(i)
    n = 0
    for (a, b, m, k), ops in seen.items():
        if k != SEND:
            continue
        for j, i in enumerate(ops):
            recv = seen.get((a, b, m, RECV), [])
            if j < len(recv):
                inst[[i, recv[j]]] = n
                n += 1
    return inst


def _instances(path: Path) -> dict[int, dict]:
    """Per step: the network ops as (rank, correlation id), their kinds, starts and the tool's instances."""
    table, graphs = api.build(path, None)
    out = {}
    for g in graphs:
        net = np.flatnonzero((g.nodes["coll_kind"] >= 0) & (g.nodes["rank"] >= 0))
        rows = g.nodes["event"][net]
        ids = [
            (int(r), int(x)) if x >= 0 else (int(r), round(float(table.t0 + t), 1))  # (a host backend's op: its time)
            for r, x, t in zip(table.cols["rank"][rows].tolist(), table.cols["correlation"][rows].tolist(), table.cols["ts"][rows].tolist())
        ]
        barrier = g.nodes["category"] == Category.BARRIER
        sync = barrier[g.edges["src"]] & np.isin(g.edges["dst"], net)
        inst = np.full(len(g.nodes["start"]), -1, dtype=np.int64)
        inst[g.edges["dst"][sync]] = g.edges["src"][sync]
        out[int(g.step)] = {
            "ids": ids,
            "inst": inst[net],
            "rank": g.nodes["rank"][net].astype(np.int32),
            "start": g.nodes["start"][net],
            "ckind": g.nodes["coll_kind"][net].astype(np.int64),
            "size": g.nodes["msg_bytes"][net],
        }
    return out


def _truth(path: Path) -> dict[tuple, int]:
    """Per network op of the trace as recorded, the instance it is in (one of its own where it is in none)."""
    truth_of: dict[tuple, int] = {}
    for s, d in _instances(path).items():
        for k, i in zip(d["ids"], d["inst"].tolist()):
            truth_of[k] = s * 100_000 + i if i >= 0 else -1 - len(truth_of)
    return truth_of


def _score_steps(got: dict[int, dict], truth_of: dict[tuple, int], tot: dict) -> None:
    for d in got.values():
        truth = np.array([truth_of[k] for k in d["ids"]])
        old = kth_of_kind_and_size(d["rank"], d["start"], d["ckind"], d["size"])
        for name, inst in (("tool", d["inst"]), ("kth_of_kind_and_size", old)):
            for k, v in score(inst, truth, d["rank"]).items():
                tot[name][k] += v


SAMPLED = (DLRM, ROOT / "tests" / "data" / "gloo_ddp_8steps_clean", ROOT / "tests" / "data" / "own-gpu" / "gloo_cuda_ddp_tiny_clean")
SAMPLED_RATE = 0.05


def sampled(trials: int) -> list[dict]:
    """Real multi-rank traces with 5% of their events (not the ProfilerStep markers) dropped at
    random from every rank's file, as a sampling profiler or a lossy export leaves them: the
    tool's instances and the k-th rule's against the trace as recorded; and the runs ``analyze``
    refused (a dependency cycle)."""
    out = []
    for path in SAMPLED:
        if not path.exists():
            continue
        truth_of = _truth(path)
        files = sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))
        docs = {f: json.loads((gzip.open(f) if f.name.endswith(".gz") else open(f)).read()) for f in files}
        tot = {"tool": {**_zero(), "runs_refused": 0}, "kth_of_kind_and_size": _zero()}
        with tempfile.TemporaryDirectory() as tmp:
            for seed in range(trials):
                rng = random.Random(seed)
                folder = Path(tmp) / f"s{seed}"
                folder.mkdir()
                for f, doc in docs.items():
                    kept = [
                        e
                        for e in doc["traceEvents"]
                        if e.get("ph") != "X" or e.get("name", "").startswith("ProfilerStep#") or rng.random() >= SAMPLED_RATE
                    ]
                    with gzip.open(folder / (f.name if f.name.endswith(".gz") else f.name + ".gz"), "wt") as fh:
                        json.dump(dict(doc, traceEvents=kept), fh)
                try:
                    api.analyze(folder)
                except GraphError:
                    tot["tool"]["runs_refused"] += 1
                _score_steps(_instances(folder), truth_of, tot)
                shutil.rmtree(folder)
        out.append({"trace": path.name, "dropped": SAMPLED_RATE, "trials": trials, **tot})
    return out


def dlrm(trials: int, seed: int) -> dict:
    truth_of = _truth(DLRM)
    files = sorted(DLRM.glob("*.json.gz"))
    docs = {f: json.loads(gzip.open(f).read()) for f in files}
    rng = random.Random(seed)
    tot = {
        "tool": {"instances": 0, "collectives_held": 0, "wrong": 0, "missed": 0, "steps_refused": 0},
        "kth_of_kind_and_size": {"instances": 0, "collectives_held": 0, "wrong": 0, "missed": 0},
    }
    removed = []
    with tempfile.TemporaryDirectory() as tmp:
        for t in range(trials):
            f = rng.choice(files)
            doc = docs[f]
            nccl = [i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel" and "nccl" in e.get("name", "")]
            gone = rng.choice(nccl)
            folder = Path(tmp) / f"t{t}"
            folder.mkdir()
            for g in files:
                if g != f:
                    shutil.copy(g, folder / g.name)
            cut = dict(doc, traceEvents=[e for i, e in enumerate(doc["traceEvents"]) if i != gone])
            with gzip.open(folder / f.name, "wt") as fh:
                json.dump(cut, fh)
            e = doc["traceEvents"][gone]
            removed.append({"file": f.name, "kernel": e["name"].split("(")[0], "correlation": e["args"].get("correlation")})
            try:
                got = _instances(folder)
            except GraphError:
                tot["tool"]["steps_refused"] += 1
                continue
            _score_steps(got, truth_of, tot)
            shutil.rmtree(folder)
    return {"trials": trials, "seed": seed, **tot, "removed": removed}


def _versus(row: dict) -> str:
    """A row's wrong and missed instances, the tool's against the k-th rule's."""
    t, o = row["tool"], row["kth_of_kind_and_size"]
    return f"wrong {t['wrong']:5d} vs {o['wrong']:5d}, missed {t['missed']:5d} vs {o['missed']:5d} of {t['collectives_held']}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "collective_alignment_results.json"))
    ap.add_argument("--seeds", type=int, default=100, help="synthetic jobs per condition")
    ap.add_argument("--trials", type=int, default=40, help="DLRM files with one kernel removed")
    ap.add_argument("--sampled", type=int, default=10, help="copies of each real trace with events dropped at random")
    args = ap.parse_args()
    result = {
        "synthetic": synthetic(args.seeds),
        "pipeline": pipeline(args.seeds),
        "dlrm": dlrm(args.trials, 0) if DLRM.exists() else None,
        "sampled": sampled(args.sampled),
    }
    for row in result["synthetic"]:
        print(f"synthetic {row['ranks']} ranks, drop {row['drop']:.2f}, {row['clock']:18s}: {_versus(row)}")
    for row in result["pipeline"]:
        print(f"pipeline sends, drop {row['drop']:.2f}: {_versus(row)}")
    if result["dlrm"]:
        d = result["dlrm"]
        print(f"dlrm, one kernel removed ({d['trials']} trials): {_versus(d)}, steps refused {d['tool']['steps_refused']}")
    for row in result["sampled"]:
        print(
            f"{row['trace']}, {100 * row['dropped']:.0f}% of events dropped ({row['trials']} copies): {_versus(row)}, "
            f"runs refused {row['tool']['runs_refused']}"
        )
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

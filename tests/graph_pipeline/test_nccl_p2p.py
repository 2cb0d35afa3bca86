"""An NCCL pipeline's sends and receives pair with the peer their trace names.

NCCL runs a send, a receive, an all-to-all and a batch of them each in one ``SendRecv`` kernel.
Recent PyTorch writes which one it is ("Collective name": ``send``/``recv``) and the peer's global
rank (``Dst Rank``/``Src Rank``) on the ``record_param_comms`` op and on the kernel; older
versions only on the enclosing ``c10d::send``/``c10d::recv_`` call (its third concrete input, the
peer's rank in the call's group). Read as a collective of every rank making such calls, a
pipeline's transfers were aligned across its stages with a warning that events were missing.

No NCCL pipeline trace is bundled (no GPU here): the traces are constructed in Kineto's format
(event names and args as ``public-gpu/nccl_2rank_rank0`` writes them) from a small simulation of a
GPipe schedule over four stages, three micro-batches (each rank runs its ops in program order; a
send and its receive end together a transfer time after the later of the two started). The oracle
is the raw events written: the k-th send from a to b is the k-th receive on b from a.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind

STAGES, MICRO, N, TRANSFER = 4, 3, 1 << 20, 150.0
KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def _program(stage: int) -> list[tuple]:
    """GPipe: every micro-batch's forward, then every backward; ("S"/"R", peer, tag) transfers."""
    ops: list[tuple] = []
    for m in range(MICRO):
        ops += [("R", stage - 1, ("a", m))] if stage > 0 else []
        ops += [("F", m)]
        ops += [("S", stage + 1, ("a", m))] if stage < STAGES - 1 else []
    for m in range(MICRO):
        ops += [("R", stage + 1, ("g", m))] if stage < STAGES - 1 else []
        ops += [("B", m)]
        ops += [("S", stage - 1, ("g", m))] if stage > 0 else []
    return ops


def _simulate(t0: float, work: dict[int, dict[str, float]]) -> dict[int, list[tuple[tuple, float, float, float]]]:
    """Per rank: (op, device start, device end, launch) of one step."""
    prog = {r: _program(r) for r in range(STAGES)}
    free = {r: t0 + 20.0 for r in prog}
    at = {r: 0 for r in prog}
    posted: dict[tuple, float] = {}
    out: dict[int, list] = {r: [] for r in prog}
    while any(at[r] < len(prog[r]) for r in prog):
        moved = False
        for r in prog:
            while at[r] < len(prog[r]):
                op, launch = prog[r][at[r]], t0 + 20.0 + 30.0 * at[r]
                start = max(free[r], launch + 5.0)
                if op[0] in "FB":
                    end = start + work[r][op[0]]
                else:
                    pair = (r, op[1], op[2]) if op[0] == "S" else (op[1], r, op[2])
                    me, other = (*pair, op[0]), (*pair, "R" if op[0] == "S" else "S")
                    if me not in posted:
                        posted[me], moved = start, True
                    if other not in posted:
                        break
                    start, end = posted[me], max(posted[me], posted[other]) + TRANSFER
                out[r].append((op, start, end, launch))
                free[r], at[r], moved = end + 3.0, at[r] + 1, True
        assert moved, "the schedule deadlocks"
    return out


def _x(cat: str, name: str, ts: float, dur: float, args: dict | None = None, pid: int = 1, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args or {}}


def _write(folder: Path, peers_in_args: bool, steps: int = 4, slower: dict[int, float] | None = None) -> None:
    """``slower``: stage -> factor on its forward's and backward's time (2 and 3 ms)."""
    work = {r: {"F": 2000.0 * (slower or {}).get(r, 1.0), "B": 3000.0 * (slower or {}).get(r, 1.0)} for r in range(STAGES)}
    docs: dict[int, list[dict]] = {r: [] for r in range(STAGES)}
    t0, corr = 1000.0, 0
    for step in range(1, steps + 1):
        ops = _simulate(t0, work)
        end = max(e for r in ops for (_, _, e, _) in ops[r])
        for r, mine in ops.items():
            ev = docs[r]
            done = max(e for (_, _, e, _) in mine)  # (its host's synchronize returns when its own device is done)
            ev.append(_x("user_annotation", f"ProfilerStep#{step}", t0, done + 80.0 - t0))
            for op, start, stop, launch in mine:
                corr += 1
                ext = corr
                if op[0] in "FB":
                    ev.append(_x("cpu_op", "aten::mm", launch, 20.0, {"External id": ext}))
                    kernel = {"name": f"sm90_gemm_{op[0]}", "stream": 7}
                    meta: dict = {}
                else:
                    send = op[0] == "S"
                    meta = {
                        "Collective name": "send" if send else "recv",
                        "In msg nelems": N,
                        "Out msg nelems": N,
                        "Group size": STAGES,
                        "dtype": "Float",
                        "Process Group Name": "0",
                        "Process Group Description": "default_pg",
                        "Process Group Ranks": str(list(range(STAGES))),
                    }
                    if peers_in_args:
                        meta["Dst Rank" if send else "Src Rank"] = op[1]
                    call = {"External id": ext + 500_000, "Concrete Inputs": ["", "", str(op[1]), "0"]}
                    ev.append(_x("cpu_op", "c10d::send" if send else "c10d::recv_", launch - 2.0, 24.0, call))
                    ev.append(_x("cpu_op", "record_param_comms", launch, 20.0, {"External id": ext, **meta}))
                    kernel = {"name": KERNEL, "stream": 20}
                ev.append(_x("cuda_runtime", "cudaLaunchKernel", launch + 5.0, 8.0, {"External id": ext, "correlation": corr}))
                args = {"External id": ext, "correlation": corr, "stream": kernel["stream"], "device": 0, **meta}
                ev.append(_x("kernel", str(kernel["name"]), start, stop - start, args, pid=0, tid=int(kernel["stream"])))
            sync = mine[-1][3] + 40.0
            ev.append(_x("cuda_runtime", "cudaDeviceSynchronize", sync, done + 10.0 - sync))
        t0 = end + 500.0
    for r, ev in docs.items():
        group = {"pg_name": "0", "pg_desc": "default_pg", "pg_size": STAGES, "ranks": list(range(STAGES))}
        info = {"backend": "nccl", "rank": r, "world_size": STAGES, "pg_config": [group]}
        (folder / f"rank-{r}.json").write_text(json.dumps({"traceEvents": ev, "distributedInfo": info}))


def _raw_pairs(folder: Path) -> set[tuple[int, int, int, float]]:
    """From the JSON: (sender, receiver, k, send kernel's start less the receive kernel's) of the
    k-th send from sender to receiver and the k-th receive on receiver from sender, the peer read
    from the c10d call that launched the kernel (the ranks' clocks are one: the difference holds
    whatever time zero the tool reads the trace from)."""
    sends: dict[tuple[int, int], list[float]] = {}
    recvs: dict[tuple[int, int], list[float]] = {}
    for f in sorted(folder.glob("rank-*.json")):
        doc = json.loads(f.read_text())
        r = doc["distributedInfo"]["rank"]
        calls = sorted((e for e in doc["traceEvents"] if e["name"].startswith("c10d::")), key=lambda e: e["ts"])
        kernels = sorted((e for e in doc["traceEvents"] if e["name"] == KERNEL), key=lambda e: e["ts"])
        by_launch = {e["args"]["External id"]: e for e in kernels}
        for call in calls:
            kernel = by_launch[call["args"]["External id"] - 500_000]
            peer = int(call["args"]["Concrete Inputs"][2])
            if call["name"] == "c10d::send":
                sends.setdefault((r, peer), []).append(kernel["ts"])
            else:
                recvs.setdefault((peer, r), []).append(kernel["ts"])
    out = set()
    for (a, b), times in sends.items():
        for k, (ts, tr) in enumerate(zip(sorted(times), sorted(recvs[a, b]))):
            out.add((a, b, k, round(ts - tr, 3)))
    return out


def _graph_pairs(folder: Path) -> tuple[set[tuple[int, int, int, float]], list[str]]:
    """From the graphs: the same for every send/recv barrier, and the load's warnings."""
    from bottleneck_oracle import api

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graphs = api.graphs(api.load(folder))
    out = set()
    seen: dict[tuple[int, int], int] = {}
    for g in sorted(graphs, key=lambda g: g.step):
        n, e = g.nodes, g.edges
        bars = np.flatnonzero(n["category"] == Category.BARRIER)
        members = {b: e["dst"][(e["src"] == b) & (e["kind"] == EdgeKind.SEND_RECV)] for b in bars.tolist()}
        for b in sorted(members, key=lambda b: float(n["start"][members[b]].min()) if len(members[b]) else 0.0):
            m = members[b]
            assert len(m) == 2, f"step {g.step}: a barrier of {len(m)} ops"
            kinds = {int(n["coll_kind"][x]): int(x) for x in m.tolist()}
            assert set(kinds) == {CollectiveKind.SEND, CollectiveKind.RECV}, f"step {g.step}: kinds {sorted(kinds)}"
            s, r = kinds[CollectiveKind.SEND], kinds[CollectiveKind.RECV]
            pair = (int(n["rank"][s]), int(n["rank"][r]))
            k = seen[pair] = seen.get(pair, -1) + 1
            out.add((*pair, k, round(float(n["start"][s]) - float(n["start"][r]), 3)))
    return out, [str(w.message) for w in caught]


@pytest.mark.parametrize("peers_in_args", [True, False], ids=["Dst/Src Rank", "c10d call only"])
def test_a_pipeline_s_nccl_transfers_pair_with_their_peers(tmp_path, peers_in_args):
    _write(tmp_path, peers_in_args)
    raw = _raw_pairs(tmp_path)
    got, said = _graph_pairs(tmp_path)
    transfers = 2 * (STAGES - 1) * MICRO  # a step's sends
    assert len(raw) == 4 * transfers
    assert got == raw  # the k-th transfer of each pair in the graph is the raw one, its kernels as the trace has them
    assert not [w for w in said if "lack" in w], said  # (no alignment, no "events sampled?")


def test_a_pipeline_s_waiting_receive_is_no_device_bound_step(tmp_path):
    """A stage's device runs a receive kernel while it waits for the stage before it: busy, not
    computing. Every self-check holds on every step (``device_bound`` failed on all four, the
    first stage's device 99% busy of which its compute is 43%)."""
    from bottleneck_oracle import api
    from bottleneck_oracle.analysis.checks import step_checks

    _write(tmp_path, True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analyses = api.analyze(tmp_path)
    failed = [(a.graph.step, c.name, c.detail) for a in analyses[1] for c in step_checks(a) if not c.ok]
    assert not failed, failed
    facts = analyses[1][1].graph.info.facts
    assert facts is not None
    first = next(f for f in facts.ranks if f.rank == 0)
    assert first.device_busy > 0.95 and first.device_compute_busy < 0.6


def test_a_pipeline_s_straggler_is_a_stage_that_works_longer(tmp_path):
    """In a pipeline the first stage waits for every later stage's forwards and backwards (GPipe's
    bubble): waits at its sends and receives are its schedule's, no one's lateness. Four equal
    stages: no straggler in any step (before: the stage that imposed the longest such wait, rank
    1 of 4). Stage 2 at 1.5 times the others' work: it is named in every step."""
    from bottleneck_oracle import api

    for slower, want in (({}, None), ({2: 1.5}, 2)):
        folder = tmp_path / f"slower{len(slower)}"
        folder.mkdir()
        _write(folder, True, slower=slower)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, analyses = api.analyze(folder)
        named = {a.graph.step: (s.rank if (s := a.straggler()) else None) for a in analyses}
        assert set(named.values()) == {want}, (slower, named)


def test_a_stage_s_exposed_communication_is_mostly_waiting_for_its_peer(tmp_path):
    """The overlap table's exposed communication splits off the time a stage's transfers waited for
    the other side: from the raw kernels, a send or a receive waited from its start to its peer's
    (the constructed stages run one op at a time: no compute beside it). Rank 0's exposed
    communication is 17 ms a step of which 16 ms is its receives waiting for the later stages."""
    from bottleneck_oracle import api

    _write(tmp_path, True)
    waited: dict[int, float] = {}
    starts: dict[int, dict[tuple[int, int], list[float]]] = {}
    for f in sorted(tmp_path.glob("rank-*.json")):
        doc = json.loads(f.read_text())
        r = doc["distributedInfo"]["rank"]
        for e in doc["traceEvents"]:
            if e["name"] == KERNEL:
                a = e["args"]
                pair = (r, a["Dst Rank"]) if a["Collective name"] == "send" else (a["Src Rank"], r)
                starts.setdefault(r, {}).setdefault(pair, []).append(e["ts"])
    for r, mine in starts.items():
        for pair, times in mine.items():
            other = starts[pair[1] if pair[0] == r else pair[0]][pair]
            waited[r] = waited.get(r, 0.0) + sum(max(0.0, b - a) for a, b in zip(sorted(times), sorted(other)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, analyses = api.analyze(tmp_path)
    got = {o.rank: o.waiting_us for a in analyses for o in a.overlap()}
    for o in analyses[0].overlap():
        assert o.waiting_us <= o.exposed_us
    steps = len(analyses)
    assert got.keys() == waited.keys()
    for r in got:
        assert sum(o.waiting_us for a in analyses for o in a.overlap() if o.rank == r) == pytest.approx(waited[r], rel=1e-6), r
    assert steps == 4 and got[0] > 0.9 * next(o.exposed_us for o in analyses[-1].overlap() if o.rank == 0)


def test_the_busiest_stage_of_a_gpu_pipeline_is_the_one_whose_device_computes_most(tmp_path):
    """advise's unbalanced-stages recipe moves a layer off the busiest stage: on a GPU pipeline the
    one whose device computes most (stage 2, at 1.5 times the others' work), not the one whose
    host's ops (launches, the final synchronize) or communication ops took longest (before:
    rank 1, whose receives hold the pipeline's waits)."""
    from bottleneck_oracle import api

    _write(tmp_path, True, slower={2: 1.5})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        advice = api.advise(tmp_path)
    named = {s.remedy for a in advice for s in a.advice.suggestions if s.source == "pp-stage-balance"}
    assert named and all("busiest stage (2)" in r for r in named), named


def test_the_run_answer_says_how_busy_a_pipeline_s_stages_keep(tmp_path):
    """GPipe over 4 equal stages, 3 micro-batches: each stage computes 15 ms of a ~32 ms step (raw:
    its kernels), the schedule's bubble (S - 1) / (M + S - 1) = 50% of it; 'Bound by: device
    compute' alone hid that every stage waits half the step. The run answer says how busy each rank
    kept: at least its compute kernels' time, at most that and its transfers' own time (their
    kernels less their waits) and its launches."""
    from bottleneck_oracle import api
    from bottleneck_oracle.analysis.answer import run_answer

    _write(tmp_path, True)
    compute: dict[int, float] = {}
    transfer: dict[int, float] = {}
    for f in sorted(tmp_path.glob("rank-*.json")):
        doc = json.loads(f.read_text())
        r = doc["distributedInfo"]["rank"]
        for e in doc["traceEvents"]:
            if e["cat"] == "kernel":
                bucket = transfer if e["name"] == KERNEL else compute
                bucket[r] = bucket.get(r, 0.0) + e["dur"] / 4  # (per step: four alike)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, analyses = api.analyze(tmp_path)
    pp = run_answer(analyses).pipeline
    assert pp is not None and pp.ranks == STAGES
    for r, us in (pp.least, pp.most):
        assert compute[r] - 1.0 <= us <= compute[r] + TRANSFER * sum(1 for _ in range(2 * MICRO)) + 1000.0, (r, us)
    bubble = (STAGES - 1) / (MICRO + STAGES - 1)
    assert pp.share == pytest.approx(1 - bubble, abs=0.05)
    assert any(line.startswith("Pipeline (4 ranks") for line in run_answer(analyses).lines())


def test_restoring_the_slow_stage_replays_to_the_equal_stages_run(tmp_path):
    """What-if on the pipeline whose stage 2 works 1.5 times as long: its kernels at 2/3 of their
    time predict the step of the same schedule with four equal stages (the simulation's, recorded as
    its own trace: an oracle outside the tool) to 0.1% (b6415cf, its transfers read as collectives
    of the ranks making them: 32.434 ms for 32.280, +0.5%)."""
    from bottleneck_oracle import api

    slow, equal = tmp_path / "slow", tmp_path / "equal"
    slow.mkdir()
    equal.mkdir()
    _write(slow, True, slower={2: 1.5})
    _write(equal, True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = [a.step_time for a in api.analyze(equal)[1]]
        got = [w.replay.step_us for w in api.whatif(slow, ["rank=2,cat=kernel,scale=0.666667"])]
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert g == pytest.approx(w, rel=1e-3)

"""Clocks of ranks on different hosts, aligned from the collectives they ran together.

Each host stamps its ranks' events with its own clock; two hosts' clocks can differ by
milliseconds (NTP keeps them close, not equal). Cross-rank edges compare times of different
ranks, so an offset between hosts reads as a late rank: waits that did not happen, a wrong
straggler. Ranks of one host share its clock.

The reference instant is the end of a symmetric collective (all-reduce, all-gather,
reduce-scatter, all-to-all, barrier): the last data exchange completes on every rank at about
the same moment, whoever arrived last. A rank's recorded end can be later than that (a
descheduled backend thread closes its span late), never earlier, so per instance the earliest
end on each host is taken. A host's offset is the median, over the instances it shares with
the reference host (the host of the lowest rank), of its earliest end minus the reference's.

Instances are matched as the graph builder matches them (collectives.match_instances: an op's
place in its process group's sequence, the ranks' sequences aligned where one lacks some),
within each ProfilerStep. The GPU-side op is the one
whose end counts on GPU ranks (an NCCL kernel; the CPU call only launches it), the backend op
(gloo:*) on CPU ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from bottleneck_oracle.graph_pipeline.arrays import groups, isin_small
from bottleneck_oracle.graph_pipeline.collectives import SYMMETRIC, match_instances
from bottleneck_oracle.graph_pipeline.events import GPU_SIDE, EvClass, EventTable, Step
from bottleneck_oracle.graph_pipeline.facts import step_offsets
from bottleneck_oracle.graph_pipeline.window import collective_kinds, is_network, name_flags

SUSPECT_US = 1000.0
"""A rank whose collectives end this much earlier or later than the lowest rank's, steadily,
looks like a rank on another host with its own clock: a warning suggests ``--ranks-per-host``."""


@dataclass(slots=True)
class HostClock:
    host: int
    ranks: list[int]
    offset_us: float  # subtracted from this host's times (0 for the reference host)
    instances: int  # collectives shared with the reference host that the offset is the median of
    spread_us: float  # median absolute deviation of the per-instance differences


@dataclass(slots=True)
class ClockReport:
    hosts: list[HostClock] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def hosts_by_block(ranks: list[int], ranks_per_host: int) -> dict[int, int]:
    """torchrun's placement: ranks 0..N-1 on the first host, N..2N-1 on the second, and so on."""
    if ranks_per_host < 1:
        raise ValueError("ranks per host must be at least 1")
    return {r: r // ranks_per_host for r in ranks}


def _symmetric_ends(table: EventTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, end, instance) of every symmetric collective seen on two or more ranks."""
    c = table.cols
    kind_of, gloo, nccl, _ = name_flags(table.names)
    code = c["name"]
    net = np.flatnonzero(is_network(code, c["cls"], gloo, nccl))
    rows = net[np.isin(collective_kinds(c, net, kind_of), np.array(SYMMETRIC, dtype=np.int8))]
    empty = np.zeros(0)
    if not len(rows):
        return empty.astype(np.int64), empty, empty.astype(np.int64)
    anchor = table.anchors()[rows]
    rank = c["rank"][rows].astype(np.int64)
    step = np.full(len(rows), -1, dtype=np.int64)
    # which ProfilerStep each op belongs to (-1: outside every step; of several, the last listed),
    # rank by rank: a scan of every op per step was quadratic in the ranks
    by_rank: dict[int, list[Step]] = {}
    for s in table.steps:
        by_rank.setdefault(s.rank, []).append(s)
    for r, mine in groups(rank):
        for s in by_rank.get(r, []):
            inside = (anchor[mine] >= s.start) & (anchor[mine] < s.end)
            step[mine[inside]] = s.number
    pg = c["pg"][rows].astype(np.int64)
    group = np.unique(np.stack([step, pg]), axis=1, return_inverse=True)[1].reshape(-1)
    ckind = collective_kinds(c, rows, kind_of)
    end = c["ts"][rows] + c["dur"][rows]
    inst = match_instances(rank, anchor, ckind, group, c["msg_nelems"][rows], end=end)
    keep = inst >= 0
    return rank[keep], end[keep], inst[keep]


def _offsets(rank: np.ndarray, end: np.ndarray, inst: np.ndarray, host_of: dict[int, int], ref: int) -> dict[int, tuple[float, int, float]]:
    """Per host: (offset µs, instances used, spread µs) relative to host ``ref``."""
    host = np.array([host_of[int(r)] for r in rank.tolist()], dtype=np.int64)
    n_inst = int(inst.max()) + 1 if len(inst) else 0
    out: dict[int, tuple[float, int, float]] = {}
    for h in sorted(set(host_of.values())):
        first = {}
        for hh in (ref, h):
            e = np.full(n_inst, np.inf)
            m = host == hh
            np.minimum.at(e, inst[m], end[m])
            first[hh] = e
        both = np.isfinite(first[ref]) & np.isfinite(first[h])
        d = first[h][both] - first[ref][both]
        if not len(d):
            out[h] = (0.0, 0, float("nan"))
            continue
        med = float(np.median(d))
        out[h] = (med, len(d), float(np.median(np.abs(d - med))))
    return out


def shift(table: EventTable, offsets: dict[int, float]) -> None:
    """Subtract ``offsets[rank]`` µs from every time of that rank (events, steps, flows), in place."""
    c = table.cols
    per_rank = np.zeros(max(table.ranks) + 1 if table.ranks else 0)
    for r, o in offsets.items():
        per_rank[r] = o
    if not per_rank.any():
        return
    c["ts"] = c["ts"] - per_rank[c["rank"]]
    fl = table.flows
    if len(fl.get("ts", ())):
        fl["ts"] = fl["ts"] - per_rank[fl["rank"]]
    for s in table.steps:
        s.start -= per_rank[s.rank]
        s.end -= per_rank[s.rank]
    low = float(min(c["ts"].min(), min((s.start for s in table.steps), default=np.inf)))
    if low != 0.0:  # times stay relative to the earliest event
        table.t0 += low
        c["ts"] -= low
        if len(fl.get("ts", ())):
            fl["ts"] = fl["ts"] - low
        for s in table.steps:
            s.start -= low
            s.end -= low
    table.steps.sort(key=lambda s: (s.number, s.rank))
    table.by_rank_ts = table.streams = table.queued = None  # caches ordered by time
    table.lookups = {}


def align(table: EventTable, host_of: dict[int, int] | None = None) -> ClockReport:
    """Align the clocks of the hosts in ``host_of`` (rank -> host) in place and report the
    offsets applied. Without ``host_of`` nothing moves; a rank whose collectives end steadily
    more than SUSPECT_US away from the lowest rank's is named in a warning."""
    report = ClockReport()
    ranks = table.ranks
    if len(ranks) < 2:
        return report
    rank, end, inst = _symmetric_ends(table)
    if host_of is None:
        per_rank = _offsets(rank, end, inst, {r: r for r in ranks}, ranks[0])
        odd = [(r, o) for r, (o, n, spread) in per_rank.items() if n >= 3 and abs(o) > SUSPECT_US and spread < abs(o) / 4]
        if odd:  # (not a rank whose step numbers run apart from the first's: its collectives were matched across iterations)
            apart = step_offsets(table)
            odd = [(r, o) for r, o in odd if r not in apart]
        if odd:
            shown = ", ".join(f"rank {r} {o / 1000:+.2f} ms" for r, o in odd[:6]) + (" ..." if len(odd) > 6 else "")
            report.warnings.append(
                f"collectives end at steadily different times on some ranks than on rank {ranks[0]} ({shown}): "
                "clocks of different hosts? Pass --ranks-per-host N to align them"
            )
        return report
    missing = [r for r in ranks if r not in host_of]
    if missing:
        raise ValueError(f"no host given for rank {missing[0]}")
    ref = host_of[ranks[0]]
    found = _offsets(rank, end, inst, host_of, ref)
    offsets: dict[int, float] = {}
    for h, (o, n, spread) in sorted(found.items()):
        members = sorted(r for r in ranks if host_of[r] == h)
        if n == 0 and h != ref:
            report.warnings.append(
                f"host {h} (ranks {_ranks_text(members)}) shares no collective with host {ref}: its clock is left as recorded"
            )
        report.hosts.append(HostClock(h, members, o if n else 0.0, n, spread if n else 0.0))
        for r in members:
            offsets[r] = o if n else 0.0
    shift(table, offsets)
    return report


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


DEVICE_EARLY_MIN = 10
"""Device ops of one device that start before the call that launched them (beyond the clock
tolerance) for its clock to be taken to run behind its host's (device_behind)."""
DEVICE_SHIFT_QUANTILE = 0.001
"""The share of a device's launched ops left starting before their call after the shift (outliers
of a wrong correlation do not set it)."""
MAX_DEVICE_SHIFT_US = 10_000.0
"""A device clock further behind than this is not moved (something else is wrong: said, not fixed)."""
DEVICE_EDGE_US = 20.0
DEVICE_EDGE_SHARE = 0.01
"""A clock offset moves every op alike, so the ops launched to an idle device, started a launch
latency after their call, make a sharp lower edge of the lags: at least this share of a device's
launched ops within DEVICE_EDGE_US of the lowest (ddp_v100: 56%; train_1rank_5steps, its device
behind most of the time: 2.6%). Early ops without one (ops tied to the wrong call) move nothing."""


def _device_keys(c: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """One key per row's device: its rank and its process (a device's lane in the trace)."""
    key: np.ndarray = c["rank"][rows].astype(np.int64) * (1 << 32) + (c["pid"][rows].astype(np.int64) & 0xFFFFFFFF)
    return key


def _moved_in_time(table: EventTable) -> None:
    """Forget the look-ups ordered by time, after device events were moved (rebuilt when asked for)."""
    table.by_rank_ts = table.streams = table.queued = table.facts_cache = None
    table.lookups = {}


def device_behind(table: EventTable, tolerance_us: float) -> list[str]:
    """Move later, in place, the events of each device whose clock runs behind its host's, and say
    so, one line per device. A device op cannot start before the runtime call that launched it;
    where DEVICE_EARLY_MIN or more ops of one device (rank and process) start more than
    ``tolerance_us`` before their call — a device clock converted to the host's with a stale offset,
    as ROCm's tracer did — every event on that device is moved later by the amount that puts all
    but DEVICE_SHIFT_QUANTILE of its launched ops at or after their call's start. The least launch
    latency is not known, so the device may stay a few µs behind; ops queued behind earlier work
    start long after their calls whatever the clock, and set nothing. Early ops without the sharp
    lower edge of lags an offset makes (DEVICE_EDGE_SHARE), or a shift over MAX_DEVICE_SHIFT_US,
    move nothing (said)."""
    c = table.cols
    launcher = table.launchers()
    ops = np.flatnonzero(np.isin(c["cls"], GPU_SIDE) & (launcher >= 0))
    if not len(ops):
        return []
    lag = c["ts"][ops] - c["ts"][launcher[ops]]
    device = _device_keys(c, ops)
    said: list[str] = []
    moved = False
    for _, mine in groups(device):
        early = int((lag[mine] < -tolerance_us).sum())
        if early < DEVICE_EARLY_MIN:
            continue
        by = -float(np.quantile(lag[mine], DEVICE_SHIFT_QUANTILE))
        rank, pid = int(c["rank"][ops[mine[0]]]), int(c["pid"][ops[mine[0]]])
        where = f"rank {rank}'s device (process {pid})"
        edge = int((lag[mine] <= -by + DEVICE_EDGE_US).sum())
        if edge < max(DEVICE_EARLY_MIN, DEVICE_EDGE_SHARE * len(mine)):
            said.append(
                f"{where}: {early} of {len(mine)} device ops start before the call that launched them, not as one clock "
                "offset would have them (ops tied to the wrong call?); times left as recorded"
            )
            continue
        if by > MAX_DEVICE_SHIFT_US:
            said.append(
                f"{where}: {early} of {len(mine)} device ops start before the call that launched them, by up to "
                f"{-float(lag[mine].min()) / 1000:.1f} ms: more than a clock offset explains; times left as recorded"
            )
            continue
        on = np.isin(c["cls"], GPU_SIDE) & (c["rank"] == rank) & (c["pid"] == pid)
        c["ts"][on] += by
        moved = True
        said.append(
            f"{where}: {early} of {len(mine)} device ops started before the call that launched them (its clock runs "
            f"behind its host's); its events were moved {by:.1f} µs later"
        )
    if moved:
        _moved_in_time(table)
    return said


BLOCKED_CALL_US = 50.0
"""A synchronize call or a synchronous copy this long waited for the device (device_ahead): a call
that found its work done returns in a few µs."""
AHEAD_SPREAD_US = 50.0
"""One clock offset makes every stream or event synchronize of a device return the same time before
the op it waited for ends, less its wake-up latency (µs apart): their overruns' median is within
this of the least."""
_SYNC_CALL = re.compile(r"synchroni[sz]e", re.IGNORECASE)
_DEVICE_SYNC_CALL = re.compile(r"(device|ctx|context)_?synchroni[sz]e|synchroni[sz]e_?(device|ctx|context)", re.IGNORECASE)
_SYNC_COPY_CALL = re.compile(r"^(cuda|hip)Memcpy(WithStream)?$|^cuMemcpy[DH]to[DH](_v2)?$")
_COPY_CALL = re.compile(r"memcpy", re.IGNORECASE)
_TO_PAGEABLE = re.compile(r"dtoh.*pageable", re.IGNORECASE)


def _latest_before(keys: np.ndarray, launch: np.ndarray, ends: np.ndarray, q_keys: np.ndarray, q_at: np.ndarray) -> np.ndarray:
    """Per query (key, time): the position of the latest-ending of the entries with its key that
    were launched before the time (-1: none)."""
    out = np.full(len(q_keys), -1, dtype=np.int64)
    queries = dict(groups(q_keys))
    for key, members in groups(keys):
        here = queries.get(key)
        if here is None:
            continue
        at = members[np.argsort(launch[members], kind="stable")]
        e = ends[at]
        best = np.maximum.accumulate(e)
        set_at = np.flatnonzero(np.r_[True, e[1:] > best[:-1]])  # where the running maximum was set
        k = np.searchsorted(launch[at], q_at[here], side="left") - 1
        ok = k >= 0
        out[here[ok]] = at[set_at[np.searchsorted(set_at, k[ok], side="right") - 1]]
    return out


def _blocking_overruns(table: EventTable, ops: np.ndarray, launcher: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(device op, by how much it ended after the blocking call that waited for it returned, whether
    that call must have waited for it, whether it returned right after it did) for every blocking
    call of BLOCKED_CALL_US or longer that the trace ties to an op: a synchronous copy
    (``cudaMemcpy``, ``hipMemcpyWithStream``, a copy to pageable host memory) waits for its own copy
    op, a device synchronize for every op launched before it (the latest-ending of them): both
    must, and a synchronize that waited returns within WAKE_MAX_US of it (a copy may take longer:
    its host-side part); a stream or event synchronize waits for those of one stream, which the
    trace does not name: the latest-ending op its thread launched before it is the likely one, not
    a certain one."""
    c, names = table.cols, table.names
    calls = np.flatnonzero((c["cls"] == EvClass.RUNTIME) & (c["dur"] >= BLOCKED_CALL_US))
    none = np.zeros(0, dtype=np.int64)
    if not len(calls):
        return none, np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    end = c["ts"] + c["dur"]
    long_call = np.zeros(len(end), dtype=bool)
    long_call[calls] = True
    mine = ops[long_call[launcher[ops]]]
    call = launcher[mine]
    sync_copy = np.array(
        [
            bool(_SYNC_COPY_CALL.match(names[k]) or (_COPY_CALL.search(names[k]) and _TO_PAGEABLE.search(names[o])))
            for k, o in zip(c["name"][call].tolist(), c["name"][mine].tolist())
        ],
        dtype=bool,
    )
    waited, over = [mine[sync_copy]], [end[mine[sync_copy]] - end[call[sync_copy]]]
    must, tight = [np.ones(int(sync_copy.sum()), dtype=bool)], [np.zeros(int(sync_copy.sum()), dtype=bool)]
    codes = np.unique(c["name"][calls])
    sync = calls[isin_small(c["name"][calls], codes[[bool(_SYNC_CALL.search(names[k])) for k in codes]])]
    device_wide = isin_small(c["name"][sync], codes[[bool(_DEVICE_SYNC_CALL.search(names[k])) for k in codes]])
    op_launch, op_end = c["ts"][launcher[ops]], end[ops]
    for wide in (True, False):
        these = sync[device_wide == wide]
        if not len(these):
            continue
        if wide:  # every op the rank launched before the call (its launch call ended before the call began)
            k = _latest_before(
                c["rank"][ops].astype(np.int64), end[launcher[ops]], op_end, c["rank"][these].astype(np.int64), c["ts"][these]
            )
        else:  # the ops its thread launched before it
            thread = c["rank"].astype(np.int64) * (1 << 32) + (c["tid"].astype(np.int64) & 0xFFFFFFFF)
            k = _latest_before(thread[launcher[ops]], op_launch, op_end, thread[these], c["ts"][these])
        ok = k >= 0
        waited.append(ops[k[ok]])
        over.append(op_end[k[ok]] - end[these[ok]])
        must.append(np.full(int(ok.sum()), wide))
        tight.append(np.full(int(ok.sum()), wide))
    return np.concatenate(waited), np.concatenate(over), np.concatenate(must), np.concatenate(tight)


IDLE_AHEAD_US = 50.0
IDLE_AHEAD_MIN = 5
IDLE_GAP_MAX_US = 1000.0
"""An op launched to a device that has run nothing for a moment (its last op ended at most
IDLE_GAP_MAX_US before the launch call: not long enough for it to drop its clocks) starts within
a few µs of its launch call's return, often before it (on every bundled GPU trace with five or more
such ops the least of their lags is under 1 µs: ``benchmarks/unseen_results.json``, device_clock_ahead):
where IDLE_AHEAD_MIN or more such ops of a device all start more than IDLE_AHEAD_US after it, the
device's clock runs ahead of its host's (device_ahead). After a longer idle stretch a device may
take milliseconds to start (``simple_add.kineto_for_et``: 2.4–5.8 ms, its first kernels)."""
WAKE_MAX_US = 30.0
"""A device synchronize that waited returns at most about this long after the last op it waited for
ended (its wake-up): with the op's end it bounds a clock offset from above."""


def _idle_launch_lags(table: EventTable, rows: np.ndarray, launcher: np.ndarray) -> np.ndarray:
    """Of one device's ops ``rows`` (all of them), those launched while it ran nothing, for at most
    IDLE_GAP_MAX_US (no op of it that started earlier was still running at the launch call's
    start, and one had ended that recently): how long after the call returned each started."""
    c = table.cols
    o = rows[np.argsort(c["ts"][rows], kind="stable")]
    prev_end = np.r_[-np.inf, np.maximum.accumulate(c["ts"][o] + c["dur"][o])[:-1]]
    launched = launcher[o] >= 0
    o, prev_end = o[launched], prev_end[launched]
    call = launcher[o]
    gap = c["ts"][call] - prev_end
    idle = (gap >= 0) & (gap <= IDLE_GAP_MAX_US)
    lags: np.ndarray = c["ts"][o[idle]] - (c["ts"][call[idle]] + c["dur"][call[idle]])
    return lags


def _least_launch_lag(c: dict[str, np.ndarray], ops: np.ndarray, launcher: np.ndarray) -> float:
    """How soon after its launch call's start a device's ops start, at the least (but for
    DEVICE_SHIFT_QUANTILE of them): the most its clock can be moved back (``ops``: the device's
    ops that have a launch call)."""
    return float(np.quantile(c["ts"][ops] - c["ts"][launcher[ops]], DEVICE_SHIFT_QUANTILE))


def outlasting_waited_ops(table: EventTable, tolerance_us: float) -> list[str]:
    """Cut, in place, each device op that a blocking call had to wait for, that started before the
    call returned and that is recorded as ending after it by more than any clock offset could
    explain, to where the call returned; say so, one line per device. The call cannot return
    before the work it waited for is done (_blocking_overruns: a synchronous copy's own op, the
    latest-ending op a device synchronize waited for), so such an op ended by then. An offset
    between the device's clock and its host's moves an op's start with its end: it is bounded by
    the least launch lag (a device moved back further would start its ops before their launch
    calls), and an overrun beyond that bound, on an op that started while the call was still
    waiting, is the end alone that is wrong: the same deferred completion time as
    overflowing_device_ops finds, on an op with no later op on its stream to show it (the last
    op before a copy to the host, the trace's last). Left as recorded, a 3 s end puts 3 s of
    device work in the step. Runs before device_ahead, which reads the same overruns as an
    offset where they agree with one."""
    c = table.cols
    launcher = table.launchers()
    ops = np.flatnonzero(isin_small(c["cls"], GPU_SIDE[:3]))
    ops = ops[launcher[ops] >= 0]
    if not len(ops):
        return []
    waited, over, must, _ = _blocking_overruns(table, ops, launcher)
    end = c["ts"][waited] + c["dur"][waited]
    returned = end - over  # the end of the call that waited for it
    keys = _device_keys(c, ops)
    room = {int(key): _least_launch_lag(c, ops[members], launcher) + tolerance_us for key, members in groups(keys)}  # per device
    dev = _device_keys(c, waited)
    bad = must & (c["ts"][waited] < returned) & (over > np.array([room[int(k)] for k in dev.tolist()], dtype=np.float64))
    if not bad.any():
        return []
    cut, to, by = waited[bad], returned[bad], over[bad]
    order = np.lexsort((to, cut))  # an op several calls waited for: cut to the earliest return
    cut, to, by = cut[order], to[order], by[order]
    first = np.r_[True, cut[1:] != cut[:-1]]
    cut, to, by = cut[first], to[first], by[first]
    c["dur"][cut] = np.maximum(to - c["ts"][cut], 0.0)
    table.drop_caches()
    said = []
    for _, mine in groups(_device_keys(c, cut)):
        rank, pid = int(c["rank"][cut[mine[0]]]), int(c["pid"][cut[mine[0]]])
        worst = int(np.argmax(by[mine]))
        n = len(mine)
        said.append(
            f"rank {rank}'s device (process {pid}): {n} device op{'s' if n > 1 else ''} recorded as ending after the "
            f"blocking call that waited for {'them' if n > 1 else 'it'} returned, by up to {float(by[mine][worst]) / 1000:.1f} ms "
            f"({table.names[c['name'][cut[mine[worst]]]][:60]}), more than the device's clock can be ahead of its host's: "
            f"a timestamp the profiler got wrong; {'each is' if n > 1 else 'it is'} cut where the call returned"
        )
    return said


def device_ahead(table: EventTable, tolerance_us: float) -> list[str]:
    """Move earlier, in place, the events of each device whose clock runs ahead of its host's, and
    say so, one line per device: the mirror of device_behind. Two physical facts bound the offset
    from below. A call that blocks until device work is done cannot return before that work ends
    (_blocking_overruns): a call that must have waited for an op and returned before it ended
    bounds it by the overrun (the largest: a copy to pageable memory returns later than its op, by
    the host's share of the copy); stream or event synchronizes, whose op is only likely, bound it
    by the least of their overruns where every one of the device returned early by amounts that
    agree (AHEAD_SPREAD_US). And a device that had run nothing for a moment when an op was launched
    starts it within µs of the launch call's return (_idle_launch_lags): IDLE_AHEAD_MIN such ops all
    starting over IDLE_AHEAD_US later bound it by the least of those lags (no further than the
    least lag from a launch call's start), unless a device synchronize that waited returned less
    than that (plus WAKE_MAX_US) after its work ended: then the late starts are the device's own,
    not its clock's. The device's events are moved earlier by the largest bound over
    ``tolerance_us`` (the device may stay a few µs ahead). The move must not start an op
    before the call that launched it (but for DEVICE_SHIFT_QUANTILE of them): where it would, or
    it is over MAX_DEVICE_SHIFT_US, the clocks disagree in a way no offset explains: said, times
    left as recorded. Left uncorrected, each blocking call is cut from the op it waited for (an
    op that ended after the call returned did not release it) and reads as host work, and every
    launch to an idle device as launch latency."""
    c = table.cols
    launcher = table.launchers()
    side = np.flatnonzero(isin_small(c["cls"], GPU_SIDE))  # every device-side event (sync records too: they move)
    if not (launcher[side] >= 0).any():
        return []

    ops = side[isin_small(c["cls"][side], GPU_SIDE[:3]) & (launcher[side] >= 0)]
    waited, over, must, tight = _blocking_overruns(table, ops, launcher)
    evidence_of = dict(groups(_device_keys(c, waited)))
    empty = np.zeros(0, dtype=np.int64)
    said: list[str] = []
    moved = False
    for key, members in groups(_device_keys(c, side)):
        rows = side[members]
        device_ops = rows[isin_small(c["cls"][rows], GPU_SIDE[:3])]
        on = device_ops[launcher[device_ops] >= 0]
        if not len(on):
            continue
        mine = evidence_of.get(key, empty)
        sure, likely = over[mine][must[mine]], over[mine][~must[mine]]
        idle = _idle_launch_lags(table, device_ops, launcher)
        evidence, bounds = [], []
        if len(sure) and float(sure.max()) > tolerance_us:
            late = sure[sure > tolerance_us]
            bounds.append(float(sure.max()))
            evidence.append(
                f"{len(late)} call{'s' if len(late) > 1 else ''} that had to wait for device work returned before "
                f"{'it' if len(late) == 1 else 'that work'} ended, by up to {float(sure.max()):.1f} µs"
            )
        if len(likely) and float(likely.min()) > tolerance_us and float(np.median(likely) - likely.min()) <= AHEAD_SPREAD_US:
            bounds.append(float(likely.min()))
            evidence.append(
                f"{len(likely)} stream or event synchronize{'s' if len(likely) > 1 else ''} returned {float(likely.min()):.1f} µs "
                "or more before the op their thread launched last"
            )
        least = _least_launch_lag(c, on, launcher)
        at_most = float(over[mine[tight[mine]]].min()) + WAKE_MAX_US if tight[mine].any() else np.inf
        if len(idle) >= IDLE_AHEAD_MIN and IDLE_AHEAD_US < float(idle.min()) <= at_most:  # (a synchronize that returned
            # right after its work bounds the offset from above: late starts beyond it are the device's own)
            # the ops seen idle are those whose device was idle longer than the offset, and such a
            # device may start slower: no further than the least lag from a launch call's start
            bounds.append(min(float(idle.min()), least))
            evidence.append(
                f"{len(idle)} ops launched to an idle device started {float(idle.min()):.1f} µs or more after their launch call returned"
            )
        if not bounds:
            continue
        by = max(bounds)
        rank, pid = int(c["rank"][on[0]]), int(c["pid"][on[0]])
        where = f"rank {rank}'s device (process {pid})"
        room = least + tolerance_us
        if by > room or by > MAX_DEVICE_SHIFT_US:
            why = (
                "yet moving its clock back that far would start its ops before their launch calls"
                if by > room
                else f"more than the {MAX_DEVICE_SHIFT_US / 1000:.0f} ms a clock offset is taken to be"
            )
            said.append(
                f"{where}: {'; '.join(evidence)}, {why}: its clock and its host's disagree in a way no offset explains; times left as recorded"
            )
            continue
        c["ts"][rows] -= by
        moved = True
        said.append(f"{where}: {'; '.join(evidence)}: its clock runs ahead of its host's; its events were moved {by:.1f} µs earlier")
    if moved:
        _moved_in_time(table)
    return said


def overflowing_device_ops(table: EventTable) -> list[str]:
    """Cut, in place, each device op whose span runs past the end of the next op on its stream
    (it covers that op whole) to where that op starts, and say so, one line per device. One stream
    runs its ops one after another; an op that overlaps the start of the next is possible (a
    dependent launch may start early), but one that outlasts it is a timestamp the profiler got
    wrong (ROCm's tracer, after a stall, writes deferred completion times: a kernel of a few µs
    recorded as lasting a second), and it would count the whole overrun as device work. Perfetto
    draws such a slice cut at its next sibling's start; so does this."""
    c = table.cols
    gpu = np.flatnonzero(isin_small(c["cls"], GPU_SIDE[:3]))
    if len(gpu) < 2:
        return []
    prev = table.stream_predecessors(gpu)
    has = prev >= 0
    op, before = gpu[has], prev[has]
    over = c["ts"][before] + c["dur"][before] > c["ts"][op] + c["dur"][op] + 1e-3  # (device-sized arrays only)
    if not over.any():
        return []
    cut, at = before[over], op[over]
    excess = c["ts"][cut] + c["dur"][cut] - c["ts"][at]
    c["dur"][cut] = np.maximum(c["ts"][at] - c["ts"][cut], 0.0)
    table.drop_caches()  # (look-ups that read durations)
    said = []
    device = _device_keys(c, cut)
    for _, mine in groups(device):
        rank, pid = int(c["rank"][cut[mine[0]]]), int(c["pid"][cut[mine[0]]])
        worst = int(np.argmax(excess[mine]))
        said.append(
            f"rank {rank}'s device (process {pid}): {len(mine)} device op{'s' if len(mine) > 1 else ''} run past the end of "
            f"the next op on {'their' if len(mine) > 1 else 'its'} stream, by up to {float(excess[mine][worst]) / 1000:.1f} ms "
            f"({table.names[c['name'][cut[mine[worst]]]][:60]}): a timestamp the profiler got wrong (one stream runs its ops "
            "one after another); each is cut where the next op starts, as Perfetto draws it"
        )
    return said

"""Process groups of the collectives whose trace does not name theirs.

PyTorch names a collective's process group on its record_param_comms event and NCCL kernel (recent
versions); gloo's backend ops (``gloo:all_reduce``) and the kernels of older traces name none. In a
job with more than one parallel dimension (data × tensor parallel, FSDP × TP, pipeline stages ×
data parallel) every rank then makes the same calls on different groups: matched by their order
alone (collectives.match_instances), the k-th all-gather of one size on every rank is one
collective of all the ranks, and a rank waits for ranks it never exchanged a byte with.

Two facts of the raw events settle it. A collective cannot finish on any participant before every
participant has joined it: a participant's recorded start is no later than when it joined, its
recorded end no earlier than when the exchange completed, so in a true group the earliest end is
never before the latest start. And each rank's ``distributedInfo.pg_config`` lists the groups it
belongs to (name, description, ranks). For each kind and size of unnamed symmetric collective
(``assign``): the ranks that make it, its k-th call on each of them one instance (where they all
make it equally often). Where one rank's call ended before another's began in some instance, the
ranks cannot be one group: the way of splitting them into groups of one family (the groups of one
description and size: a device mesh's ``mesh_dp``) under which every instance is possible becomes
the calls' groups, written to the table's ``pg`` column, which the graph builder matches them by.
Calls that are all possible as one group of all the ranks are still split where the ranks' ends
cluster by the groups of one split and apart across them (SPLIT_SPREAD_RATIO): participants of one
collective end together. A backend's worker thread (a gloo ``pt_gloo_runloop``, an NCCL stream) serves one process group: a
kind and size whose instances are all possible as one group of all the ranks, but which shares a
thread on some rank with a kind that was split, is split the same way where its calls allow it.
Where no split, or more than one, fits, nothing changes and a warning says the waits at those
collectives may be wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bottleneck_oracle.graph_pipeline.arrays import groups
from bottleneck_oracle.graph_pipeline.collectives import SYMMETRIC, VETO_FLOOR_US
from bottleneck_oracle.graph_pipeline.events import EvClass, EventTable
from bottleneck_oracle.graph_pipeline.schema import CollectiveKind
from bottleneck_oracle.graph_pipeline.window import collective_kinds, is_network, name_flags

MEET_TOLERANCE_US = VETO_FLOOR_US
"""µs by which one participant's end may precede another's start and the two still be one
collective (the residual disagreement of the ranks' clocks)."""

Key = tuple[int, int]  # (CollectiveKind, message elements; -1 unknown)
Partition = tuple[frozenset[int], ...]
Split = tuple[str, Partition]  # (the family's name, its groups that split a collective's ranks)


@dataclass(slots=True)
class GroupReport:
    """What ``assign`` did: per kind and size, the family its calls were placed in and the
    groups' ranks, and the warnings where no split fits."""

    placed: dict[str, tuple[str, list[list[int]]]]
    warnings: list[str]


def _listed(meta: Mapping[int, Any]) -> list[tuple[str, list[int]]]:
    """Every group the ranks' ``distributedInfo.pg_config`` list — its description and its ranks in
    the group's order —, each once (every rank lists the groups it is in: a 4096-rank default group
    4096 times); entries that are no list of integer ranks are left out."""
    out: dict[tuple, tuple[str, list[int]]] = {}
    for info in meta.values():
        config = info.get("pg_config") if isinstance(info, Mapping) else None
        for g in config if isinstance(config, list) else []:
            ranks = g.get("ranks") if isinstance(g, Mapping) else None
            if not isinstance(ranks, list):
                continue
            desc = str(g.get("pg_desc") or g.get("pg_name") or "")[:80]
            try:
                key = (desc, tuple(ranks))
                if key in out:
                    continue
            except TypeError:  # (unhashable members: no rank list)
                continue
            if all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
                out[key] = (desc, ranks)
    return list(out.values())


def families(meta: Mapping[int, Mapping[str, Any]]) -> dict[str, list[frozenset[int]]]:
    """The job's process groups from its ranks' ``distributedInfo.pg_config``, by family: the
    groups of one description and size (a device mesh's ``mesh_dp`` groups; ``new_group``'s
    without a description are all "undefined"), groups of two ranks or more."""
    found: dict[tuple[str, int], set[frozenset[int]]] = {}
    for desc, ranks in _listed(meta):
        members = frozenset(ranks)
        if len(members) >= 2:
            found.setdefault((desc, len(members)), set()).add(members)
    return {
        (f"{desc} ({size} ranks)" if desc else f"groups of {size} ranks"): sorted(sets, key=sorted)
        for (desc, size), sets in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    }


COVERS = 8
"""The most ways of splitting a collective's ranks into one family's groups that are weighed; more
(a family of many overlapping groups) are too many to tell apart by times."""
SEARCH_RANKS = 64
"""Ways of splitting into overlapping groups are searched for collectives of at most this many ranks."""


def _splits(ranks: frozenset[int], fams: Mapping[str, list[frozenset[int]]]) -> list[Split] | None:
    """Every way of splitting ``ranks`` into two or more groups of one family (None: more than
    COVERS). A family's groups may overlap: a 2 × 2 layout's groups made by ``new_group`` without
    descriptions split four ranks two ways; those ways are searched (a family of disjoint groups,
    a device mesh's dimension, has one, read off directly however many ranks it spans)."""
    out: list[Split] = []
    for name, family in fams.items():
        inside = [g for g in family if g < ranks]
        if sum(len(g) for g in inside) == len(frozenset().union(*inside)):  # disjoint: one way, if they cover
            if inside and frozenset().union(*inside) == ranks:
                out.append((name, tuple(sorted(inside, key=min))))
            continue
        if len(ranks) > SEARCH_RANKS:
            return None  # (too many ways to weigh)
        found: list[Split] = []
        room = COVERS - len(out)

        def split(
            left: frozenset[int],
            chosen: list[frozenset[int]],
            name: str = name,
            inside: list = inside,
            found: list = found,
            room: int = room,
        ) -> bool:
            if not left:
                found.append((name, tuple(sorted(chosen, key=min))))
                return len(found) <= room
            r = min(left)
            return all(split(left - g, [*chosen, g]) for g in inside if r in g and g <= left)

        if not split(ranks, []):
            return None
        out += found
    return out if len(out) <= COVERS else None


def _possible(parts: Partition, calls: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether every instance is possible with these groups: in each group, its latest start is
    no later than its earliest end (``calls``: rank -> the starts and ends of its calls, k-th = k-th)."""
    for p in parts:
        members = sorted(p)
        latest = np.max(np.stack([calls[r][0] for r in members]), axis=0)
        earliest = np.min(np.stack([calls[r][1] for r in members]), axis=0)
        if (earliest < latest - MEET_TOLERANCE_US).any():
            return False
    return True


SPLIT_MIN_CALLS = 3
SPLIT_SPREAD_RATIO = 3.0
SPLIT_SPREAD_MIN_US = 1000.0
"""A kind and size whose calls are all possible as one collective of all its ranks is still split
into groups where, over SPLIT_MIN_CALLS calls or more, the median spread of the ranks' ends is
SPLIT_SPREAD_RATIO times (and SPLIT_SPREAD_MIN_US) more for all the ranks than inside the groups
of one split (the widest group's), and that split's is as far below any other's: participants of
one collective end together, those of two collectives each when its own ends. A rank late in
every call (a descheduled thread) widens its own group's spread as much as the whole's: no split."""


def _spread(parts: Partition, calls: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> float:
    """The median over the calls of the widest group's spread of ends (µs)."""
    widest = np.max([np.ptp(np.stack([calls[r][1] for r in sorted(p)]), axis=0) for p in parts], axis=0)
    return float(np.median(widest))


def _describe(key: Key) -> str:
    kind, size = key
    name = CollectiveKind(kind).name.lower().replace("_", "-")
    return f"{name}s of {size} elements" if size >= 0 else f"{name}s"


def _calls(table: EventTable) -> tuple[np.ndarray, dict[Key, dict[int, np.ndarray]], np.ndarray, np.ndarray, np.ndarray]:
    """The symmetric collectives that name no process group: their rows, and per kind and size,
    each rank's positions among them in start order; their starts, ends and threads."""
    c = table.cols
    kind_of, gloo, nccl, _ = name_flags(table.names)
    net = np.flatnonzero(is_network(c["name"], c["cls"], gloo, nccl) & (c["pg"] < 0))
    kinds = collective_kinds(c, net, kind_of).astype(np.int64)
    symmetric = np.isin(kinds, np.array(SYMMETRIC, dtype=np.int64))
    net, kinds = net[symmetric], kinds[symmetric]
    sizes = np.where(np.isnan(c["msg_nelems"][net]), -1, c["msg_nelems"][net]).astype(np.int64)
    start = c["ts"][net]
    rank = c["rank"][net].astype(np.int64)
    by_key: dict[Key, dict[int, np.ndarray]] = {}
    if len(net):
        uniq, inverse = np.unique(np.stack([kinds, sizes]), axis=1, return_inverse=True)
        for code, pos in groups(inverse.reshape(-1)):
            key = (int(uniq[0, code]), int(uniq[1, code]))
            for r, mine in groups(rank[pos]):
                at = pos[mine]
                by_key.setdefault(key, {})[r] = at[np.argsort(start[at], kind="stable")]
    return net, by_key, start, start + c["dur"][net], c["tid"][net]


def assign(table: EventTable) -> GroupReport:
    """Place the table's symmetric collectives that name no process group in the groups their
    times allow (see the module's docstring); returns what was placed and the warnings."""
    report = GroupReport({}, [])
    if len(table.ranks) < 2:
        return report
    net, by_key, start, end, thread = _calls(table)
    fams = families(table.meta)
    decided: dict[Key, Split] = {}
    calls_of: dict[Key, dict[int, tuple[np.ndarray, np.ndarray]]] = {}
    whole: set[Key] = set()  # the kinds and sizes whose every call is possible as one group of all their ranks
    for key, per in by_key.items():
        if len(per) < 2 or len({len(v) for v in per.values()}) != 1:
            continue  # on one rank, or made unequally often: left to the builder's alignment
        calls_of[key] = calls = {r: (start[v], end[v]) for r, v in per.items()}
        ranks = frozenset(per)
        if _possible((ranks,), calls):
            whole.add(key)
            continue
        splits = _splits(ranks, fams)
        fits = [sp for sp in splits or [] if _possible(sp[1], calls)]
        if len(fits) == 1:
            decided[key] = fits[0]
            continue
        if splits is None:
            what = "the trace's process groups split them too many ways to tell which"
        elif fits:
            what = "more than one split into the trace's process groups allows them (" + "; ".join(_groups_text(p) for _, p in fits) + ")"
        else:
            what = "no split into the trace's process groups allows them, or the ranks' clocks disagree (ranks on several hosts: --ranks-per-host aligns them)"
        report.warnings.append(
            f"{_describe(key)} matched in order across ranks {_ranks(ranks)} cannot all be one collective "
            f"(a rank's call ended before another's began), and {what}: the cross-rank waits at them may be wrong"
        )
    # possible as one group of all the ranks, and as groups whose ends cluster apart
    for key, calls in calls_of.items():
        ranks = frozenset(calls)
        if key not in whole or len(next(iter(calls.values()))[0]) < SPLIT_MIN_CALLS:
            continue
        ranked = sorted(((_spread(p, calls), (n, p)) for n, p in _splits(ranks, fams) or [] if _possible(p, calls)), key=lambda x: x[0])
        spread = _spread((ranks,), calls)
        if ranked and spread >= SPLIT_SPREAD_RATIO * ranked[0][0] and spread - ranked[0][0] >= SPLIT_SPREAD_MIN_US:
            if len(ranked) == 1 or ranked[1][0] >= SPLIT_SPREAD_RATIO * ranked[0][0]:
                decided[key] = ranked[0][1]
    # a kind and size that shares a backend thread with a placed one, on some rank, is in its groups
    linked: dict[Key, set[Key]] = {}
    for r in np.unique(table.cols["rank"][net]).tolist():
        on: dict[int, set[Key]] = {}
        for key, per in by_key.items():
            for t in np.unique(thread[per[r]]).tolist() if r in per else []:
                on.setdefault(int(t), set()).add(key)
        for keys in on.values():
            for k in keys:
                linked.setdefault(k, set()).update(keys)
    for key, calls in calls_of.items():
        ranks = frozenset(calls)
        if key in decided or key not in whole:
            continue
        found = {decided[k] for k in linked.get(key, ()) if k in decided}
        fits = [(n, p) for n, p in found if frozenset().union(*p) == ranks and _possible(p, calls)]
        if len(fits) == 1:
            decided[key] = fits[0]
    pg = table.cols["pg"]
    code = int(pg.max()) + 1 if len(pg) else 0
    for key, (name, parts) in sorted(decided.items()):
        for part in parts:
            for r in part:
                pg[net[by_key[key][r]]] = code
            code += 1
        report.placed[_describe(key)] = (name, [sorted(p) for p in parts])
    return report


def _groups_text(parts: Partition) -> str:
    return ", ".join("+".join(map(str, sorted(p))) for p in parts)


def _ranks(ranks: frozenset[int]) -> str:
    r = sorted(ranks)
    return f"{r[0]}–{r[-1]}" if r == list(range(r[0], r[-1] + 1)) and len(r) > 2 else ", ".join(map(str, r))


def _c10d_calls(table: EventTable, rows: np.ndarray) -> np.ndarray:
    """Of ``rows``, the c10d calls (``c10d::send``: the peer they record is a rank in their group)."""
    names = table.names
    return rows[np.array([names[k].startswith("c10d::") for k in table.cols["name"][rows].tolist()], dtype=bool)]


def resolve_peers(table: EventTable) -> int:
    """Point each c10d send and receive at its peer's global rank. The peer a call records (its
    third concrete input: ``dst``, ``src``) is the peer's rank in the call's process group, which
    the call does not name (the global rank that recent PyTorch writes on the send's
    record_param_comms and NCCL kernel, ``Dst Rank``, is read as it is): in a pipeline whose stages are also data or tensor parallel, stage
    group 2+3's rank 2 sends to "1", meaning rank 3. Each reading (the peer's place in one of the
    rank's groups in its ``distributedInfo.pg_config``, in the group's order) is kept where the
    other side makes the opposite calls naming this rank by its place in the same group; where
    exactly one peer is so read, the call points at it (the ``peer`` column the graph builder
    pairs sends and receives by). Returns how many calls were re-pointed."""
    c = table.cols
    names = table.names
    rows = _c10d_calls(table, np.flatnonzero(c["peer"] >= 0))
    if not len(rows):
        return 0
    is_send = np.array(["send" in names[k] for k in c["name"][rows].tolist()], dtype=bool)
    mine: dict[int, list[list[int]]] = {}  # rank -> the groups it is in, each in its order
    for ranks in {tuple(ranks): ranks for _, ranks in _listed(table.meta)}.values():
        for r in set(ranks):
            mine.setdefault(r, []).append(ranks)
    if not any(len(gs) > 1 for gs in mine.values()):
        return 0
    written: set[tuple[int, bool, int]] = set(zip(c["rank"][rows].tolist(), is_send.tolist(), c["peer"][rows].tolist()))
    moved = 0
    for r, send, p in sorted(written):
        readings = {g[p] for g in mine.get(r, []) if p < len(g) and g[p] != r and (g[p], not send, g.index(r)) in written}
        if len(readings) == 1 and (q := readings.pop()) != p:
            at = rows[(c["rank"][rows] == r) & (is_send == send) & (c["peer"][rows] == p)]
            c["peer"][at] = q
            moved += len(at)
    return moved


def nested_peers(table: EventTable) -> int:
    """Give each send or receive op that names no peer of its own (the ``record_param_comms`` of an
    NCCL send before PyTorch wrote ``Dst Rank`` on it; the NCCL kernel it launched reads it from
    there, by External id) the peer of the c10d send or receive call that encloses it on its
    thread (after resolve_peers: a global rank). Returns how many ops got one."""
    c = table.cols
    names = table.names
    p2p = (c["coll_kind"] == CollectiveKind.SEND) | (c["coll_kind"] == CollectiveKind.RECV)
    want = np.flatnonzero(p2p & (c["peer"] < 0) & (c["cls"] == EvClass.CPU))
    if not len(want):
        return 0
    calls = _c10d_calls(table, np.flatnonzero((c["peer"] >= 0) & (c["cls"] == EvClass.CPU)))
    if not len(calls):
        return 0
    by_thread: dict[tuple[int, int, int], list[int]] = {}
    for e in calls[np.argsort(c["ts"][calls], kind="stable")].tolist():
        by_thread.setdefault((int(c["rank"][e]), int(c["pid"][e]), int(c["tid"][e])), []).append(e)
    starts = {k: np.array([c["ts"][e] for e in v]) for k, v in by_thread.items()}
    given = 0
    for e in want.tolist():
        key = (int(c["rank"][e]), int(c["pid"][e]), int(c["tid"][e]))
        if key not in by_thread:
            continue
        i = int(np.searchsorted(starts[key], c["ts"][e], side="right")) - 1
        if i < 0:
            continue
        call = by_thread[key][i]
        send = c["coll_kind"][e] == CollectiveKind.SEND
        if c["ts"][call] + c["dur"][call] >= c["ts"][e] + c["dur"][e] and ("send" in names[int(c["name"][call])]) == send:
            c["peer"][e] = c["peer"][call]
            given += 1
    return given

"""Cross-rank matching of collectives and point-to-point ops.

Rules, in order: a collective that carries its sequence number in its process group (the
``Seq`` argument recent PyTorch writes on record_param_comms and NCCL kernels) is the
instance of that (process group, sequence number, kind) on every rank: exact, whatever ops a
rank's trace lacks. Otherwise, ranks issue the collectives of a process group in one order
(c10d requires it): where every rank's sequence of (kind, message size — not for the kinds whose
sizes differ between ranks by design, window.UNEVEN_KINDS) in a group is the same,
the k-th op of one kind and size on every rank is one collective; where a rank's trace lacks
some (sampled events, a trace trimmed or cut), the ranks' sequences are aligned (the longest
common subsequence of kinds and sizes, ties broken by the ops' ends) so that one missing op shifts no
other pairing. A send pairs with a recv of the same size on another rank. Each instance seen on
two or more ranks gets a barrier node. ``match_report`` counts the instances each rule matched.

Symmetric collectives (all-reduce, all-gather, reduce-scatter, all-to-all,
barrier) finish together: the last data exchange completes on every rank at
about the same time. A backend thread that is descheduled can close its trace
span later than that (seen on gloo under CPU contention), so the modelled end of
each participant is the earliest recorded end of the instance.

A send/recv pair is treated the same way when both spans overlap; where one side ended before
the other's span began (a buffered send that ended before the receive was posted, or a backend
span recorded after its transfer had already happened) the recorded ends stay. Asynchronous
sends and receives (isend/irecv) close their spans only when the program waits on them, often
at the end of the step; the pair's transfer was over when the first side saw it complete.
"""

from __future__ import annotations

import numba
import numpy as np

from bottleneck_oracle.graph_pipeline.arrays import isin_small
from bottleneck_oracle.graph_pipeline.schema import CollectiveKind
from bottleneck_oracle.graph_pipeline.window import P2P_KINDS, UNEVEN_KINDS

SYMMETRIC = (
    CollectiveKind.ALL_REDUCE,
    CollectiveKind.ALL_GATHER,
    CollectiveKind.REDUCE_SCATTER,
    CollectiveKind.ALL_TO_ALL,
    CollectiveKind.BARRIER,
)


def match_instances(
    rank: np.ndarray,
    start: np.ndarray,
    ckind: np.ndarray,
    pg: np.ndarray,
    nelems: np.ndarray,
    peer: np.ndarray | None = None,
    seq: np.ndarray | None = None,
    stats: dict | None = None,
    end: np.ndarray | None = None,
    tight: np.ndarray | None = None,
) -> np.ndarray:
    """Instance id per node (-1: compute, or a network op seen on one rank only).
    ``ckind`` is -1 for compute nodes; ``nelems`` NaN where the size is unknown; ``peer`` the
    other rank of a send or recv (-1 unknown): the k-th send of a size from a to b pairs with
    the k-th recv of that size on b from a; ``seq`` the collective's sequence number in its
    process group (-1 unknown): collectives with one are matched by (group, number, kind); the
    others by their place in their group's sequence (aligned where the ranks' sequences differ).
    ``stats``, if given, gets ``aligned``: the collectives of a group that some of the group's
    ranks lack, where the ranks' sequences had to be aligned. ``end``: each op's end, the time
    that breaks an alignment's ties (the participants of a collective end together; they start
    apart, each when its rank got there); without it, the start. ``tight``: per op, whether the
    participants of its collective end together within microseconds on clocks that agree — a
    device kernel in a window (its ranks' clocks aligned by clocks.py) —, so that in a group of
    such ops a pair whose ends lie further apart than half the ops' spacing is none; elsewhere
    (a host backend's spans, which close when their thread runs again, or clocks not yet
    aligned) only the order counts, and time only breaks its ties."""
    inst = np.full(len(rank), -1, dtype=np.int64)
    net = np.flatnonzero(ckind >= 0)
    if len(np.unique(rank[net])) < 2:
        return inst
    size = np.where(np.isnan(nelems[net]) | isin_small(ckind[net], UNEVEN_KINDS), -1, nelems[net]).astype(np.int64)
    peers = peer[net] if peer is not None else np.full(len(net), -1)
    seqs = seq[net] if seq is not None else np.full(len(net), -1)
    sequences: dict[tuple, list[tuple[float, int]]] = {}
    groups: dict[tuple, list[int]] = {}
    for i, r, k, g, m, t, q, s in zip(
        net.tolist(),
        rank[net].tolist(),
        ckind[net].tolist(),
        pg[net].tolist(),
        size.tolist(),
        start[net].tolist(),
        peers.tolist(),
        seqs.tolist(),
    ):
        if s >= 0 and k not in P2P_KINDS:
            groups.setdefault(("seq", k, g, s), []).append(i)
        else:
            sequences.setdefault((r, k, g, m, q if k in P2P_KINDS else -1), []).append((t, i))
    for calls in sequences.values():
        calls.sort()
    place, aligned = _places(sequences, start if end is None else end, np.zeros(len(rank), bool) if tight is None else tight)
    if stats is not None:
        stats["aligned"] = aligned
    for (r, k, g, m, q), calls in sequences.items():
        if k not in P2P_KINDS:
            family: tuple = (k,)
        elif q < 0:
            family = ("p2p", -1, -1)
        else:  # (sender, receiver)
            family = ("p2p", r, q) if k == CollectiveKind.SEND else ("p2p", q, r)
        for j, (_, i) in enumerate(calls):
            groups.setdefault((*family, g, m, place.get(i, j)), []).append(i)
    n = 0
    for key, members in groups.items():
        ranks = {int(rank[i]) for i in members}
        if len(ranks) < 2 or len(ranks) != len(members):
            continue
        if key[0] == "p2p" and sorted(int(ckind[i]) for i in members) != [CollectiveKind.SEND, CollectiveKind.RECV]:
            continue
        inst[members] = n
        n += 1
    return inst


OFFSET_PAIRS = 16
"""A rank's clock offset at an op: the median over this many aligned pairs either side of it."""
VETO_SPACING = 0.5
"""Where the ranks' clocks agree, two ops further apart in time than this share of the median
spacing of one rank's ops are not one collective (nor a send and its receive)."""
VETO_FLOOR_US = 20.0
"""µs: the least such distance (ops issued back to back; the clocks' residual disagreement)."""
SECOND_VETO = 1.5
"""The veto distance of the second alignment (with each rank's clock offset) against the first's."""
ALIGN_MAX_CELLS = 4_000_000
"""The largest alignment (ops of one rank × ops of the consensus) computed; beyond it a group's
ops pair by their place among those of their kind and size, as where the sequences agree."""


def _places(sequences: dict[tuple, list[tuple[float, int]]], when: np.ndarray, tight: np.ndarray) -> tuple[dict[int, int], int]:
    """Per collective, its place among the collectives of its kind and size in its process
    group's sequence, the same on every rank that ran it; per send and receive whose peer is
    known, its place among those of its size between its two ranks (the sender's sends against
    the receiver's receives); and how many of these some of their ranks lack. ``sequences``:
    (rank, kind, group, size, peer) -> [(start, node)] in start order; ``when``: the time of each
    node that breaks ties; ``tight``: per node, whether time may veto a pair (match_instances)."""
    by_group: dict[tuple, dict[int, list[tuple[float, int, tuple[int, int]]]]] = {}
    for (r, k, g, m, q), calls in sequences.items():
        if k not in P2P_KINDS:
            mine = by_group.setdefault(("group", g), {}).setdefault(r, [])
        elif q >= 0:  # a pair's sends on the sender against its receives on the receiver, matched in order
            pair = ("p2p", g, r, q) if k == CollectiveKind.SEND else ("p2p", g, q, r)
            mine = by_group.setdefault(pair, {}).setdefault(int(k == CollectiveKind.RECV), [])
        else:
            continue
        mine.extend((t, i, (-1 if k in P2P_KINDS else k, m)) for t, i in calls)
    place: dict[int, int] = {}
    aligned = 0
    for ranks in by_group.values():
        if len(ranks) < 2:
            continue
        seqs = {r: [(float(when[i]), i, tok) for _, i, tok in sorted(ops)] for r, ops in ranks.items()}
        agree = all(bool(tight[i]) for ops in seqs.values() for _, i, _ in ops)
        tokens = {r: [tok for _, _, tok in ops] for r, ops in seqs.items()}
        first = next(iter(tokens.values()))
        if all(t == first for t in tokens.values()) and (not agree or _in_step(seqs)):
            continue  # the same sequence on every rank: each op's place among its kind and size
        columns = _consensus(seqs, agree)
        if columns is None:
            continue
        seen: dict[tuple[int, int], int] = {}
        for members, tok in columns:
            j = seen.get(tok, 0)
            seen[tok] = j + 1
            for i in members:
                place[i] = j
            aligned += len(members) < len(seqs)
    return place, aligned


def _in_step(seqs: dict[int, list[tuple[float, int, tuple[int, int]]]]) -> bool:
    """Whether ranks whose sequences are alike op for op are one collective op for op. Two ranks
    that each lack a different one of a run of like ops have alike sequences, every op between
    the two gaps paired with its neighbour's, each pair a spacing apart in time; a span that
    closed late (a descheduled backend thread) puts one pair apart. So where a rank's k-th op
    is further from the first rank's k-th than the veto distance (``_veto``, past the rank's
    median offset), the two are aligned in time; the pairing by place stands unless the
    alignment's pairs, with half a spacing for each op it leaves alone, lie closer in time by
    more than half a spacing (each distance counted up to one spacing)."""
    ranks = list(seqs.values())
    ref = ranks[0]
    ta = np.array([t for t, _, _ in ref])
    veto = _veto(ta)
    cap = veto / VETO_SPACING
    code: dict = {}
    for other in ranks[1:]:
        tb = np.array([t for t, _, _ in other])
        d = tb - ta
        if not len(d) or np.abs(d - np.median(d)).max() <= veto or len(d) * len(d) > ALIGN_MAX_CELLS:
            continue
        to, offset = _aligned([tok for _, _, tok in ref], list(ta), other, code, None, True)
        hit = to >= 0
        by_place = np.minimum(np.abs(d - np.median(d)), cap).sum()
        alone = 2 * (len(to) - hit.sum())  # (as many of the first rank's ops as of this one's: the sequences are as long)
        aligned = np.minimum(np.abs(tb[hit] - offset[hit] - ta[to[hit]]), cap).sum() + cap / 2 * alone
        if aligned + cap / 2 < by_place:
            return False
    return True


def _veto(ta: np.ndarray) -> float:
    """Where the ranks' clocks agree, how far apart in time (µs) two ops may be and still be one
    collective (or a send and its receive): ``VETO_SPACING`` of the median spacing of one rank's
    ops, at least ``VETO_FLOOR_US``."""
    gaps = np.diff(np.sort(ta))
    gaps = gaps[gaps > 0]
    return max(VETO_SPACING * float(np.median(gaps)) if len(gaps) else 0.0, VETO_FLOOR_US)


def _consensus(seqs: dict[int, list[tuple[float, int, tuple[int, int]]]], agree: bool) -> list[tuple[list[int], tuple[int, int]]] | None:
    """The columns of the ranks' sequences aligned one to another (each: its ops, at most one per
    rank, and its kind and size), in issue order. First the columns: the longest sequence, then
    each other rank's aligned to the columns so far, its ops that align to none inserted as
    columns of their own (and its clock's offset from the first rank's, from the pairs). Then
    every rank's sequence again against all the columns, so that where two ranks each lack a
    different one of two like collectives, the one a third rank holds both of decides (by time)
    which is which. ``None`` where an alignment would be too large (ALIGN_MAX_CELLS)."""
    order = sorted(seqs, key=lambda r: (-len(seqs[r]), r))
    code: dict[tuple[int, int], int] = {}
    ref = seqs[order[0]]
    toks = [tok for _, _, tok in ref]
    times = [t for t, _, _ in ref]  # a column's time, on the first rank's clock
    offsets = {order[0]: np.zeros(len(ref))}
    for r in order[1:]:
        ops = seqs[r]
        if len(ops) * len(toks) > ALIGN_MAX_CELLS:
            return None
        to, offsets[r] = _aligned(toks, times, ops, code, None, agree)
        new_toks, new_times, c = [], [], 0
        for j, (t, _, tok) in enumerate(ops):
            if to[j] >= 0:
                new_toks.extend(toks[c : to[j] + 1])
                new_times.extend(times[c : to[j] + 1])
                c = to[j] + 1
            else:
                new_toks.append(tok)
                new_times.append(t - float(offsets[r][j]))
        toks, times = new_toks + toks[c:], new_times + times[c:]
    columns: dict[tuple[int, int, int], tuple[list[int], tuple[int, int]]] = {(c, -1, 0): ([], tok) for c, tok in enumerate(toks)}
    for r in order:
        ops = seqs[r]
        to, _ = _aligned(toks, times, ops, code, offsets[r], agree)
        prev = -1
        for j, (_, i, tok) in enumerate(ops):
            if to[j] >= 0:
                prev = int(to[j])
                columns[(prev, -1, 0)][0].append(i)
            else:  # (after the columns it follows: the first pass made one for every op, so seldom)
                columns[(prev, r, j)] = ([i], tok)
    return [columns[k] for k in sorted(columns) if columns[k][0]]


def _aligned(
    toks: list, times: list[float], ops: list, code: dict, offset: np.ndarray | None, agree: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Each op's column (-1: none) and the rank's clock offset at each op: given, or estimated
    from a first alignment, as the median offset of its nearest pairs (a clock that drifts), and
    then used to break the ties of the second.

    Where the clocks agree, neither alignment pairs two ops further apart in time than
    ``VETO_SPACING`` of the ops' median spacing (or ``VETO_FLOOR_US``) past the rank's offset —
    by order alone, where two ranks each lack a different one of a run of like ops, pairing every
    op between the two gaps with its neighbour's makes one more pair than leaving both gaps, and
    the longest common subsequence takes it. The first alignment's offset is none, or the median
    over an alignment by order alone where that pairs twice as many (what clocks.py left of two
    hosts' offset; not a shift by one op between two gaps). Where the clocks do not agree, the
    first alignment is by order alone (its ties broken late)."""
    a = np.array([code.setdefault(tok, len(code)) for tok in toks], dtype=np.int64)
    b = np.array([code.setdefault(tok, len(code)) for _, _, tok in ops], dtype=np.int64)
    ta, tb = np.array(times, dtype=np.float64), np.array([t for t, _, _ in ops], dtype=np.float64)
    veto = _veto(ta) if agree else np.inf
    if offset is None:
        to = _align(a, ta, b, tb, np.zeros(len(b)), agree, veto)
        if agree:  # (the clocks as they are, unless offset by the median of an alignment by order alone they pair twice as many)
            by_order = _align(a, ta, b, tb, np.zeros(len(b)), False, np.inf)
            hit = np.flatnonzero(by_order >= 0)
            if len(hit):
                moved = _align(a, ta, b, tb, np.full(len(b), float(np.median(tb[hit] - ta[by_order[hit]]))), True, veto)
                if (moved >= 0).sum() > 2 * (to >= 0).sum():
                    to = moved
        hit = np.flatnonzero(to >= 0)
        offset = np.zeros(len(b))
        if len(hit):
            d = tb[hit] - ta[to[hit]]
            near = np.clip(np.searchsorted(hit, np.arange(len(b))), 0, len(hit) - 1)
            for j in range(len(b)):
                k = int(near[j])
                offset[j] = np.median(d[max(0, k - OFFSET_PAIRS) : k + OFFSET_PAIRS])
    return _align(a, ta, b, tb, offset, True, veto * SECOND_VETO), offset


@numba.njit(cache=True)
def _align(a: np.ndarray, ta: np.ndarray, b: np.ndarray, tb: np.ndarray, offset: np.ndarray, by_time: bool, veto: float) -> np.ndarray:
    """For each element of ``b``, the index of the element of ``a`` it aligns to (-1: none): the
    longest common subsequence of equal elements whose times (``tb - offset`` against ``ta``,
    ``offset`` per element of ``b``) differ by ``veto`` or less; among those, with ``by_time``,
    the one whose pairs lie closest in time (the time term of all pairs together is under one
    pair, so it only breaks ties); without, the latest pairing on a tie."""
    na, nb = len(a), len(b)
    span = 1.0
    if na and nb:
        span += max(ta.max(), (tb - offset).max()) - min(ta.min(), (tb - offset).min())
    unit = 1.0 / (span * (min(na, nb) + 1))
    score = np.zeros((na + 1, nb + 1))
    for i in range(1, na + 1):
        for j in range(1, nb + 1):
            best = max(score[i - 1, j], score[i, j - 1])
            apart = abs(tb[j - 1] - offset[j - 1] - ta[i - 1])
            if a[i - 1] == b[j - 1] and apart <= veto:
                gain = 1.0 - (min(apart, span) * unit if by_time else 0.0)
                best = max(best, score[i - 1, j - 1] + gain)
            score[i, j] = best
    out = np.full(nb, -1, dtype=np.int64)
    i, j = na, nb
    while i > 0 and j > 0:
        apart = abs(tb[j - 1] - offset[j - 1] - ta[i - 1])
        if a[i - 1] == b[j - 1] and apart <= veto:
            gain = 1.0 - (min(apart, span) * unit if by_time else 0.0)
            if score[i, j] == score[i - 1, j - 1] + gain:
                out[j - 1] = i - 1
                i -= 1
                j -= 1
                continue
        if score[i - 1, j] >= score[i, j - 1]:
            i -= 1
        else:
            j -= 1
    return out


def match_report(ckind: np.ndarray, inst: np.ndarray, seq: np.ndarray | None = None) -> dict[str, int]:
    """How the network ops of a window were matched: instances by sequence number, instances by
    order, and network ops left unmatched (on one rank only, or pairing no peer)."""
    net = ckind >= 0
    matched = inst[net & (inst >= 0)]
    by_seq = 0
    if seq is not None and len(matched):
        with_seq = np.unique(inst[net & (inst >= 0) & (seq >= 0) & ~np.isin(ckind, P2P_KINDS)])
        by_seq = len(with_seq)
    n_inst = len(np.unique(matched))
    return {"by_seq": by_seq, "by_order": n_inst - by_seq, "unmatched_ops": int((net & (inst < 0)).sum())}


def modelled_ends(start: np.ndarray, end: np.ndarray, ckind: np.ndarray, inst: np.ndarray) -> np.ndarray:
    """End of every node (µs): recorded, except participants of symmetric collectives and of
    send/recv pairs whose spans overlap, which end when the first participant ended (but not
    before the last one arrived)."""
    end = end.copy()
    member = np.flatnonzero(inst >= 0)
    if not len(member):
        return end
    n = int(inst.max()) + 1  # every member of an instance is the same kind of op, or a send/recv pair
    first_end = np.full(n, np.inf)
    np.minimum.at(first_end, inst[member], end[member])
    last_start = np.full(n, -np.inf)
    np.maximum.at(last_start, inst[member], start[member])
    k = inst[member]
    overlapping = np.isin(ckind[member], P2P_KINDS) & (first_end[k] >= last_start[k])
    sym = member[np.isin(ckind[member], SYMMETRIC) | overlapping]
    end[sym] = np.maximum(np.maximum(first_end[inst[sym]], last_start[inst[sym]]), start[sym])
    return end


def barrier_labels(ckind: np.ndarray, inst: np.ndarray, n_bar: int) -> list[str]:
    kinds = np.full(n_bar, -1)
    kinds[inst[inst >= 0]] = ckind[inst >= 0]

    def label(k: int) -> str:
        if k in P2P_KINDS:
            return "send_recv"
        return CollectiveKind(k).name.lower() if k >= 0 else "collective"

    return [f"barrier:{label(int(k))}#{i}" for i, k in enumerate(kinds)]

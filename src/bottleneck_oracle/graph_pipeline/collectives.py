"""Cross-rank matching of collectives and point-to-point ops.

Rules, in order: a collective that carries its sequence number in its process group (the
``Seq`` argument recent PyTorch writes on record_param_comms and NCCL kernels) is the
instance of that (process group, sequence number, kind) on every rank: exact, whatever ops a
rank's trace lacks. Otherwise, on every rank, the k-th network op of one kind, process group
and message size in a window is the same collective (ranks issue collectives in the same
order: c10d requires it); one op missing on one rank shifts the pairing of the later ones.
A send pairs with a recv of the same size on another rank. Each instance seen on two or more
ranks gets a barrier node. ``match_report`` counts the instances each rule matched.

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

import numpy as np

from bottleneck_oracle.graph_pipeline.schema import CollectiveKind
from bottleneck_oracle.graph_pipeline.window import P2P_KINDS

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
) -> np.ndarray:
    """Instance id per node (-1: compute, or a network op seen on one rank only).
    ``ckind`` is -1 for compute nodes; ``nelems`` NaN where the size is unknown; ``peer`` the
    other rank of a send or recv (-1 unknown): the k-th send of a size from a to b pairs with
    the k-th recv of that size on b from a; ``seq`` the collective's sequence number in its
    process group (-1 unknown): collectives with one are matched by (group, number, kind)."""
    inst = np.full(len(rank), -1, dtype=np.int64)
    net = np.flatnonzero(ckind >= 0)
    if len(np.unique(rank[net])) < 2:
        return inst
    size = np.where(np.isnan(nelems[net]), -1, nelems[net]).astype(np.int64)
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
    for (r, k, g, m, q), calls in sequences.items():
        calls.sort()
        if k not in P2P_KINDS:
            family: tuple = (k,)
        elif q < 0:
            family = ("p2p", -1, -1)
        else:  # (sender, receiver)
            family = ("p2p", r, q) if k == CollectiveKind.SEND else ("p2p", q, r)
        for j, (_, i) in enumerate(calls):
            groups.setdefault((*family, g, m, j), []).append(i)
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

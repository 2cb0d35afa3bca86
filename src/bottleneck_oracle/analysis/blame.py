"""Causal attribution: which nodes, ranks and op kinds made this step slow.

The counterfactual of every node: restore it to its typical duration and replay. A node's
typical duration is the median modelled duration of its counterparts: the same op (same rank,
same name, same occurrence in the step) in the reference steps (the other steps of the trace,
or a baseline trace) and on the rank's peers in the same step, the smaller of the two where both
exist (so a rank that is slow in every step is still seen). Peers are ranks that run the same
program: members of one collective (data or tensor parallel replicas). Pipeline stages, which
only exchange point-to-point messages, run different layers and are not compared. An op with
no counterpart at all (work that normally does not happen) is typically absent: 0 µs; with
nothing to compare against (one rank and no reference step) nothing is blamed. The untraced
time after an op on its thread (Python code, sleeps, anything not profiled: the program-order
latency) is a candidate too, restored the same way, and so is the untraced time from a rank's
step start to a thread's first op. A candidate must exceed its typical by at least 20 µs and
lie above the upper outlier fence of its counterparts (Q3 + 1.5 IQR, Tukey's rule): a gap that
is 2.5 ms in most steps and 10 ms in a third of them is not blamed for being 9 ms once; work
that never happens elsewhere always is (the margin is the wider of the two comparisons': one
peer rank alone shows no spread). Its causal contribution is the step time the restoration
saves (exact, via the replay); a node faster than typical contributes nothing. Candidates are
ranked by it; savings under 1% of the step time (run-to-run noise of a step) rank as none, and
ties by how much slower than typical the candidate was. The
same candidates are also listed by how much slower than typical they were (``anomalies``),
whatever they cost: a delay that overlapped waiting shows there with its (zero) saving and its
slack. Ranks and op kinds are restored as a whole (one replay each), and their saving is
reported as a share of the saving of restoring everything.

Regions (``region_blame``): a slowdown made of many small ops (a few hundred extra matmuls in
one ``record_function`` range) is spread thin over single ops, each with a small saving. So the
enclosing events of the leaf ops (the graph's regions: ranges, ``nn.Module`` and Python ranges,
parent ops, autograd hooks) are blamed as a whole too. A region's time is its own work: the
modelled durations of the ops inside it and the untraced time between them that lies inside its
span (waiting excluded, as the graph models it). Its typical time is that of the same region
(same rank, name and occurrence in the step) in the reference steps and on the peer ranks, the
smaller where both exist, as for ops; a region that its peers do not run at all is typically
absent there (0 µs: a range only one data-parallel replica runs is extra work). Its saving is the
replay of the region taking its typical time: every op duration and untraced stretch inside it
scaled by typical / time. Scaling, not restoring each op inside to its own typical duration,
because extra ops have no counterpart to be restored to (and shift the occurrence of every op
after them). Only the regions most slower than typical are replayed, and of nested regions
whose savings are within 10% of each other the innermost is reported (the most specific
region that explains the excess). A range run several times in the step (per micro-batch, per
call) and a little slower each time is also replayed as one region: its slower occurrences, each
scaled to its own typical time. It encloses each occurrence and is enclosed by a range around
all of them, for the same innermost rule.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from bottleneck_oracle.analysis.cpm import CPMResult, makespan_of, origins, run_cpm
from bottleneck_oracle.analysis.segments import LOADER_WAIT
from bottleneck_oracle.analysis.whatif import single_edge_makespans, single_node_makespans
from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline.arrays import isin_small
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind
from bottleneck_oracle.serial import Computed, json_meta

MIN_EXCESS_US = 20.0  # slower than typical by less than this: noise, not a candidate
MIN_SAVING_SHARE = 0.01  # a saving under this share of the step time is run-to-run noise: ranked as none


def noise_floor(makespan_us: float) -> float:
    """The saving (µs) under which a culprit of a step this long ranks as none: its run-to-run
    noise (MIN_SAVING_SHARE of it), and at least MIN_EXCESS_US."""
    return max(MIN_EXCESS_US, MIN_SAVING_SHARE * makespan_us)


TUKEY_K = 1.5  # nor without passing the upper outlier fence of its counterparts: Q3 + K x IQR
TypicalFrom = Literal["none", "peer ranks", "reference steps"]
TYPICAL_FROM: tuple[TypicalFrom, ...] = (
    "none",
    "peer ranks",
    "reference steps",
)  # where a typical value came from, by _typical's source code
CulpritKind = Literal["op", "gap"]  # an op, or untraced time (after an op, or before a thread's first)
REGION_REPLAYS = 20  # regions replayed per step: the ones most slower than typical
REGION_NESTED_SHARE = 0.9  # a region enclosing one that saves at least this share of its saving is not reported
REGION_GROUP_REPLAYS = 10  # repeated ranges (all occurrences of a name on a rank, taken as one) replayed per step


NodeKey = tuple[int, bool, str, int]
"""(rank or peer group, on_gpu, name, occurrence in the step) of a node: its identity across steps."""


class KeyMemo:
    """The node keys of the graphs of one blame run over many steps (a step is the reference of
    many others: its keys are computed once), each also as an integer id shared by equal keys."""

    def __init__(self) -> None:
        self.graphs: dict[int, tuple[ExecutionGraph, list[NodeKey], np.ndarray]] = {}
        self.ids: dict[NodeKey, int] = {}
        self.arrays: dict[str, dict[int, tuple[ExecutionGraph, np.ndarray]]] = {}
        self.region_graphs: dict[int, tuple[ExecutionGraph, list[NodeKey], np.ndarray]] = {}
        self.region_ids: dict[NodeKey, int] = {}

    def derived(self, g: ExecutionGraph, what: str, fn: Callable[[ExecutionGraph], np.ndarray]) -> np.ndarray:
        """``fn(g)``, computed once per graph in this run (the leads and gaps of a reference step)."""
        cache = self.arrays.setdefault(what, {})
        hit = cache.get(id(g))
        if hit is None or hit[0] is not g:
            hit = cache[id(g)] = (g, fn(g))
        return hit[1]

    @staticmethod
    def _memo(
        g: ExecutionGraph,
        graphs: dict[int, tuple[ExecutionGraph, list[NodeKey], np.ndarray]],
        ids: dict[NodeKey, int],
        keys_of: Callable[[ExecutionGraph], list[NodeKey]],
    ) -> tuple[list[NodeKey], np.ndarray]:
        """``keys_of(g)`` and their integer ids in ``ids``, computed once per graph (``graphs``)."""
        hit = graphs.get(id(g))
        if hit is None or hit[0] is not g:
            keys = keys_of(g)
            hit = graphs[id(g)] = (g, keys, np.array([ids.setdefault(k, len(ids)) for k in keys], dtype=np.int64))
        return hit[1], hit[2]

    def get(self, g: ExecutionGraph) -> tuple[list[NodeKey], np.ndarray]:
        """The node keys of ``g`` (_node_keys) and their integer ids, computed once per graph."""
        return self._memo(g, self.graphs, self.ids, _node_keys)

    def regions(self, g: ExecutionGraph) -> tuple[list[NodeKey], np.ndarray]:
        """The region keys of ``g`` (_region_keys) and their integer ids, computed once per graph."""
        return self._memo(g, self.region_graphs, self.region_ids, _region_keys)


def _keys(g: ExecutionGraph, memo: KeyMemo | None = None) -> list[NodeKey]:
    """(rank, on_gpu, name, occurrence) of every node: its identity across steps."""
    return (memo or KeyMemo()).get(g)[0]


def _node_keys(g: ExecutionGraph) -> list[NodeKey]:
    n = g.nodes
    order = np.lexsort((n["start"], n["name"], n["on_gpu"], n["rank"]))
    keys: list[NodeKey] = [(0, False, "", 0)] * g.n_nodes  # every entry is set below
    prev, k = None, 0
    for i in order:
        base = (int(n["rank"][i]), bool(n["on_gpu"][i]), int(n["name"][i]))
        k = k + 1 if base == prev else 0
        prev = base
        keys[i] = (base[0], base[1], g.names[base[2]], k)
    return keys


def _region_keys(g: ExecutionGraph) -> list[NodeKey]:
    """(rank, False, name, occurrence among the rank's regions of that name by start) of every region."""
    rg = g.regions
    order = np.lexsort((rg["start"], rg["name"], rg["rank"]))
    keys: list[NodeKey] = [(0, False, "", 0)] * len(order)
    prev, k = None, 0
    for i in order.tolist():
        base = (int(rg["rank"][i]), int(rg["name"][i]))
        k = k + 1 if base == prev else 0
        prev = base
        keys[i] = (base[0], False, g.names[base[1]], k)
    return keys


_SPMD = (CollectiveKind.ALL_REDUCE, CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER, CollectiveKind.ALL_TO_ALL)


def peer_groups(g: ExecutionGraph) -> dict[int, int]:
    """Rank -> peer group id: ranks joined (transitively) by an all-reduce, all-gather,
    reduce-scatter or all-to-all of the step run the same program; every other rank is alone."""
    parent = {int(r): int(r) for r in g.ranks}

    def find(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    e, n = g.edges, g.nodes
    m = (e["kind"] == EdgeKind.COLLECTIVE_SYNC) & np.isin(n["coll_kind"][e["dst"]], [int(k) for k in _SPMD])
    members: dict[int, set[int]] = defaultdict(set)
    for src, dst in zip(e["src"][m], e["dst"][m]):
        r = int(n["rank"][dst])
        if r in parent:
            members[int(src)].add(r)
    for ranks in members.values():
        first, *rest = ranks
        for r in rest:
            parent[find(r)] = find(first)
    return {r: find(r) for r in parent}


def _gaps(g: ExecutionGraph) -> np.ndarray:
    """Per node, the id of its positive program-order out-edge on a CPU thread (untraced time after it), or -1."""
    e = g.edges
    out = np.full(g.n_nodes, -1, dtype=np.int64)
    m = (e["kind"] == EdgeKind.PROGRAM_ORDER) & (e["weight"] > 0) & ~g.nodes["on_gpu"][e["src"]]
    ids = np.flatnonzero(m)
    out[e["src"][ids]] = ids
    return out


def _quantile(s: list[float], q: float) -> float:
    """The q-quantile of sorted ``s``, linear interpolation (numpy's default method), in plain
    Python: blame asks for three of them per node and counterpart set, mostly of a few values,
    where np.quantile's per-call overhead (~0.1 ms) made it quadratic-feeling in the step count."""
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _robust(vals: list[float]) -> tuple[float, float]:
    """(median, noise: how far above the median the upper outlier fence Q3 + K x IQR lies)."""
    s = sorted(vals)
    q1, med, q3 = _quantile(s, 0.25), _quantile(s, 0.5), _quantile(s, 0.75)
    return float(med), float(q3 + TUKEY_K * (q3 - q1) - med)


def _typical(
    values: np.ndarray,
    keys: list[NodeKey],
    references: list[tuple[list[NodeKey], np.ndarray]],
    groups: dict[int, int] | None,
    ids: tuple[np.ndarray, list[np.ndarray]] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median (and noise margin, see _robust) of each key's values in the references and on the peer ranks
    (``groups``: rank -> peer group; None: every rank is a peer); the smaller median where both exist.
    ``ids``: the keys of the step and of each reference as integer ids (KeyMemo), for speed."""
    n, r = len(keys), len(references)
    typical = np.maximum(np.asarray(values, dtype=np.float64), 0.0)  # nothing to compare with: no excess claimed
    noise = np.zeros(n)
    source = np.zeros(n, dtype=np.int8)
    ref_med = ref_noise = None
    if r:  # one row per node, one column per reference step; a reference without the op did not run it: 0 µs
        if ids is None:
            memo = KeyMemo()
            ids = (
                np.array([memo.ids.setdefault(k, len(memo.ids)) for k in keys], dtype=np.int64),
                [np.array([memo.ids.setdefault(k, len(memo.ids)) for k in rk], dtype=np.int64) for rk, _ in references],
            )
        own, theirs = ids
        order = np.argsort(own, kind="stable")
        sorted_own = own[order]
        table = np.zeros((n, r))
        if n:  # every reference's keys looked up at once (a key occurs once per step: one value per cell)
            rid = np.concatenate([np.asarray(x, dtype=np.int64) for x in theirs])
            col = np.repeat(np.arange(r), [len(x) for x in theirs])
            val = np.concatenate([np.asarray(v, dtype=np.float64) for _, v in references])
            p = np.minimum(np.searchsorted(sorted_own, rid), n - 1)
            hit = sorted_own[p] == rid
            table[order[p[hit]], col[hit]] = np.maximum(val[hit], 0.0)
        table.sort(axis=1)
        q1, ref_med, q3 = (_column_quantile(table, q) for q in (0.25, 0.5, 0.75))
        ref_noise = q3 + TUKEY_K * (q3 - q1) - ref_med
        typical, noise, source = ref_med.copy(), ref_noise.copy(), np.full(n, 2, dtype=np.int8)

    def peer(key: NodeKey) -> NodeKey:
        return (0 if groups is None else groups.get(key[0], key[0]), *key[1:])

    across: dict[NodeKey, list[tuple[int, float]]] = defaultdict(list)
    for i, (key, v) in enumerate(zip(keys, values)):
        if v >= 0:
            across[peer(key)].append((i, float(v)))
    for members in across.values():
        if len(members) < 2:
            continue  # nobody to compare with
        if len(members) >= _MANY_PEERS:  # the same, each rank against all the others at once
            _against_peers(members, typical, source, noise, ref_med, ref_noise)
            continue
        for i, _ in members:
            others = [v for j, v in members if j != i]
            med, nz = (others[0], 0.0) if len(others) == 1 else _robust(others)  # one peer: its value, no spread
            if ref_med is None or ref_noise is None or (med, nz, 1) < (ref_med[i], ref_noise[i], 2):  # the smaller median ...
                typical[i], source[i] = med, 1
            noise[i] = max(nz, ref_noise[i]) if ref_noise is not None else nz  # ... the wider margin (one peer alone shows no spread)
    return typical, source, noise


_MANY_PEERS = 8  # peer groups this large are compared with one sort (_against_peers), smaller ones in plain Python


def _against_peers(
    members: list[tuple[int, float]],
    typical: np.ndarray,
    source: np.ndarray,
    noise: np.ndarray,
    ref_med: np.ndarray | None,
    ref_noise: np.ndarray | None,
) -> None:
    """_typical's comparison of each member (node id, value) with the others of its peer group, for
    every member at once: the quantiles of the values without member i are read off the sorted
    values, skipping i's place (one sort for the group, not one per member: thousands of ranks
    made this quadratic). The same floats as _robust's, by the same arithmetic. In place."""
    idx = np.array([i for i, _ in members], dtype=np.int64)
    vals = np.array([v for _, v in members], dtype=np.float64)
    m = len(vals)
    order = np.argsort(vals, kind="stable")
    srt = vals[order]
    place = np.empty(m, dtype=np.int64)
    place[order] = np.arange(m)

    def quantile(q: float) -> np.ndarray:  # _quantile of the m - 1 others, for every member
        pos = (m - 2) * q
        lo = int(pos)
        hi = min(lo + 1, m - 2)
        a = np.where(lo < place, srt[lo], srt[lo + 1])
        b = np.where(hi < place, srt[hi], srt[hi + 1])
        out: np.ndarray = a + (b - a) * (pos - lo)
        return out

    q1, med, q3 = quantile(0.25), quantile(0.5), quantile(0.75)
    nz = q3 + TUKEY_K * (q3 - q1) - med
    if ref_med is None or ref_noise is None:
        typical[idx], source[idx], noise[idx] = med, 1, nz
        return
    rm, rn = ref_med[idx], ref_noise[idx]
    smaller = (med < rm) | ((med == rm) & ((nz < rn) | (nz == rn)))  # (med, nz, 1) < (rm, rn, 2), as tuples compare
    typical[idx[smaller]], source[idx[smaller]] = med[smaller], 1
    noise[idx] = np.where(rn > nz, rn, nz)  # max(nz, rn)


def absent_on_peers(g: ExecutionGraph, keys: list[NodeKey], groups: dict[int, int], typical: np.ndarray, source: np.ndarray) -> None:
    """A node or region no peer runs (its peer group has other ranks in the step, none of which has
    its key) is typically absent: typical 0 µs, from the peer ranks, even where every reference
    step has it too (a slowdown in every step shows against the peers only). In place."""
    present: dict[NodeKey, int] = defaultdict(int)
    for k in keys:
        present[(groups.get(k[0], k[0]), k[1], k[2], k[3])] += 1
    group_size: dict[int, int] = defaultdict(int)
    for r in g.ranks:
        group_size[groups.get(int(r), int(r))] += 1
    for i, k in enumerate(keys):
        gk = groups.get(k[0], k[0])
        if group_size[gk] >= 2 and present[(gk, k[1], k[2], k[3])] == 1 and typical[i] > 0.0:
            typical[i], source[i] = 0.0, 1


def _leads(g: ExecutionGraph) -> np.ndarray:
    """Per node, the untraced time from its rank's step start to its release if it starts a
    thread's step (no predecessor), else -1."""
    rel = g.release
    ok = np.isfinite(rel) & (g.nodes["category"] != Category.BARRIER) & (g.nodes["rank"] >= 0)
    start = origins(g)  # each node's rank's step start
    return np.where(ok, np.maximum(np.where(ok, rel, 0.0) - start, 0.0), -1.0)


def _column_quantile(rows_sorted: np.ndarray, q: float) -> np.ndarray:
    """The q-quantile of every row of a row-sorted matrix (linear interpolation, numpy's default)."""
    pos = (rows_sorted.shape[1] - 1) * q
    lo = int(pos)
    hi = min(lo + 1, rows_sorted.shape[1] - 1)
    out: np.ndarray = rows_sorted[:, lo] + (rows_sorted[:, hi] - rows_sorted[:, lo]) * (pos - lo)
    return out


# (_keys of the step, of each reference, peer_groups, (their ids: the step's, each reference's))
Keys = tuple[list[NodeKey], list[list[NodeKey]], dict[int, int], tuple[np.ndarray, list[np.ndarray]]]


def _all_keys(g: ExecutionGraph, references: list[ExecutionGraph], memo: KeyMemo | None = None) -> Keys:
    memo = memo or KeyMemo()
    own, own_ids = memo.get(g)
    refs = [memo.get(r) for r in references]
    return own, [k for k, _ in refs], peer_groups(g), (own_ids, [i for _, i in refs])


def typical_durations(
    g: ExecutionGraph, references: list[ExecutionGraph], keys: Keys | None = None, all_ranks: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(typical modelled duration µs, where it came from: 2 reference steps, 1 peer ranks, 0 none,
    its noise margin µs there). ``all_ranks``: compare with every other rank, peers or not."""
    gk, rks, groups, ids = keys or _all_keys(g, references)
    return _typical(g.nodes["mdur"], gk, [(k, r.nodes["mdur"]) for k, r in zip(rks, references)], None if all_ranks else groups, ids)


def _gap_weights(g: ExecutionGraph) -> tuple[np.ndarray, np.ndarray]:
    gap = _gaps(g)
    w = g.edges["weight"]
    return gap, np.where(gap >= 0, w[np.maximum(gap, 0)], 0.0) if len(w) else np.zeros(len(gap))


def typical_gaps(
    g: ExecutionGraph, references: list[ExecutionGraph], keys: Keys | None = None, memo: KeyMemo | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(program-order edge id after each node or -1, its latency µs, its typical latency µs,
    source, noise margin µs) for the untraced time after each node."""
    memo = memo or KeyMemo()
    gk, rks, groups, ids = keys or _all_keys(g, references, memo)
    gap, w = _gap_weights(g)
    ref_w = [(k, memo.derived(r, "gaps", lambda h: _gap_weights(h)[1])) for k, r in zip(rks, references)]
    typical, source, noise = _typical(w, gk, ref_w, groups, ids)
    return gap, w, typical, source, noise


def typical_leads(
    g: ExecutionGraph, references: list[ExecutionGraph], keys: Keys | None = None, memo: KeyMemo | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(untraced time before each thread's first op of the step or -1, its typical, source, noise)."""
    memo = memo or KeyMemo()
    gk, rks, groups, ids = keys or _all_keys(g, references, memo)
    lead = _leads(g)
    typical, source, noise = _typical(lead, gk, [(k, memo.derived(r, "leads", _leads)) for k, r in zip(rks, references)], groups, ids)
    return lead, typical, source, noise


@dataclass(slots=True)
class Culprit:
    """One blamed candidate: an op (``kind`` "op") or untraced time (``kind`` "gap": after the op
    ``id`` on its thread, through the program-order edge ``edge``; or, with ``edge`` None, from its
    rank's step start to the thread's first op ``id``)."""

    id: int
    kind: CulpritKind
    name: str
    rank: int
    dur_us: float
    typical_us: float
    typical_from: TypicalFrom
    noise_us: float
    saving_us: float  # the step time restoring it to typical saves (replay)
    share: float  # of the saving of restoring everything
    slack_us: float
    edge: int | None = field(default=None, metadata=json_meta(omit_none=True))
    parent: str | None = field(default=None, metadata=json_meta(omit_none=True))  # the op whose own time an untraced gap is (name_gaps)
    model_predicted: bool = field(default=False, metadata=json_meta(skip=True))  # the graph network was asked for this one's saving
    model_saving_us: float | None = field(
        default=None, metadata=json_meta(when="model_predicted")
    )  # its answer; None where it refused (out of domain)
    corrected: bool = field(
        default=False, metadata=json_meta(skip=True)
    )  # the corrections (models.corrections) were asked for this one's saving
    corrected_saving_us: float | None = field(
        default=None, metadata=json_meta(when="corrected")
    )  # the corrected replay's saving; None where out of domain
    corrected_interval_us: tuple[float, float] | None = field(default=None, metadata=json_meta(when="corrected"))  # its 90% interval


@dataclass(slots=True)
class RankBlame:
    """A rank restored to typical as a whole: its saving, and its excess in ops and in untraced time."""

    rank: int
    saving_us: float
    share: float
    op_excess_us: float
    gap_excess_us: float
    op_us: float
    gap_us: float


@dataclass(slots=True)
class OpKindBlame:
    """Every op of one name restored to typical at once."""

    name: str
    saving_us: float
    share: float
    excess_us: float


@dataclass(slots=True)
class Region:
    """An enclosing event (a range, an ``nn.Module``, a parent op) taking its typical time as a whole."""

    rank: int
    tid: int
    name: str
    occurrence: int  # of the regions of this name on its rank in the step, by start
    kind: Literal["range", "op"]  # "range" (record_function, Python, nn.Module) or "op" (a parent op)
    span_us: float  # from its start to its end, as measured (waiting included)
    dur_us: float  # its own time: the ops inside it and the untraced time between them (waiting excluded)
    typical_us: float
    typical_from: TypicalFrom
    noise_us: float
    saving_us: float  # the step time it taking its typical time saves (replay)
    share: float  # of the step time
    nodes: int  # ops inside it
    occurrences: int = field(
        default=1, metadata=json_meta(skip=True)
    )  # > 1: every slower occurrence of a range run several times in the step, taken as one (``occurrence``: the first)

    JSON_COMPUTED: ClassVar[tuple[Computed, ...]] = (Computed("occurrences", "occurrences", after="occurrence"),)

    @property
    def label(self) -> str:
        """The name, with ``×N`` for a repeated range taken as one."""
        return self.name if self.occurrences == 1 else f"{self.name} ×{self.occurrences}"


def region_labels(regions: list[Region]) -> list[str]:
    """What a table shows for each region: its label, and ``#k`` (the k-th of its name on its
    rank) where the list names the same region more than once (a repeated range and its
    occurrences)."""
    count: dict[tuple[int, str], int] = defaultdict(int)
    for r in regions:
        count[(r.rank, r.name)] += 1
    return [r.label if r.occurrences > 1 or count[(r.rank, r.name)] == 1 else f"{r.name} #{r.occurrence + 1}" for r in regions]


@dataclass(slots=True)
class Blame:
    step: int | None
    makespan: float = field(metadata=json_meta(key="makespan_us"))
    restored_makespan: float = field(metadata=json_meta(key="restored_makespan_us"))  # every node restored to typical
    nodes: list[Culprit] = field(default_factory=list)  # ranked by saving
    anomalies: list[Culprit] = field(default_factory=list)  # the same candidates ranked by excess over typical
    ranks: list[RankBlame] = field(default_factory=list)
    ops: list[OpKindBlame] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)  # the most specific regions, ranked by saving

    JSON_COMPUTED: ClassVar[tuple[Computed, ...]] = (Computed("excess_us", "excess", after="restored_makespan"),)

    @property
    def excess(self) -> float:
        return self.makespan - self.restored_makespan


def blame(
    g: ExecutionGraph, references: list[ExecutionGraph], top: int = 20, cpm: CPMResult | None = None, memo: KeyMemo | None = None
) -> Blame:
    """Rank the nodes (and ranks, and op kinds) of ``g`` by the step time restoring them saves.
    ``memo``: shared by the calls of one run over many steps (see _keys)."""
    base = cpm or run_cpm(g)
    n = g.nodes
    memo = memo or KeyMemo()
    keys = _all_keys(g, references, memo)
    typical, source, noise = typical_durations(g, references, keys)
    absent_on_peers(g, keys[0], keys[2], typical, source)
    d = n["mdur"].astype(np.float64)
    real = n["category"] != Category.BARRIER
    slower = real & (d - typical > np.maximum(MIN_EXCESS_US, noise))
    restored = np.where(slower, typical, d)
    excess = d - restored
    cand = np.flatnonzero(slower)
    saving = base.makespan - single_node_makespans(g, cand, -excess[cand], base) if len(cand) else np.zeros(0)
    # untraced time after a node on its thread (program-order latency), against its typical
    gap, gap_w, gap_typical, gap_source, gap_noise = typical_gaps(g, references, keys, memo)
    w = g.edges["weight"].astype(np.float64)
    gap_excess = np.where((gap >= 0) & (gap_w - gap_typical > np.maximum(MIN_EXCESS_US, gap_noise)), gap_w - gap_typical, 0.0)
    gcand = np.flatnonzero(gap_excess > 0)
    gsaving = base.makespan - single_edge_makespans(g, gap[gcand], -gap_excess[gcand], base) if len(gcand) else np.zeros(0)
    restored_w = w.copy()
    restored_w[gap[gcand]] -= gap_excess[gcand]
    # untraced time before a thread's first op of the step
    lead, lead_typical, lead_source, lead_noise = typical_leads(g, references, keys, memo)
    lead_excess = np.where((lead >= 0) & (lead - lead_typical > np.maximum(MIN_EXCESS_US, lead_noise)), lead - lead_typical, 0.0)
    lcand = np.flatnonzero(lead_excess > 0)
    restored_rel = g.release.astype(np.float64).copy()
    restored_rel[lcand] -= lead_excess[lcand]
    lsaving = []
    for i in lcand:
        rel = g.release.astype(np.float64).copy()
        rel[i] -= lead_excess[i]
        lsaving.append(base.makespan - makespan_of(g, None, None, rel))
    items = [(float(saving[j]), float(excess[cand[j]]), "op", int(cand[j])) for j in range(len(cand))]
    items += [(float(lsaving[j]), float(lead_excess[lcand[j]]), "lead", int(lcand[j])) for j in range(len(lcand))]
    items += [(float(gsaving[j]), float(gap_excess[gcand[j]]), "gap", int(gcand[j])) for j in range(len(gcand))]
    floor = noise_floor(base.makespan)
    items.sort(key=lambda x: (-(x[0] if x[0] >= floor else 0.0), -x[1]))
    everything = makespan_of(g, restored, restored_w, restored_rel)
    out = Blame(step=g.step, makespan=base.makespan, restored_makespan=everything)
    total = max(base.makespan - everything, 1e-9)

    def entry(sav: float, kind: str, i: int) -> Culprit:
        if kind == "op":
            return Culprit(
                i,
                "op",
                g.node_name(i),
                int(n["rank"][i]),
                float(d[i]),
                float(typical[i]),
                TYPICAL_FROM[source[i]],
                float(noise[i]),
                sav,
                float(sav / total),
                float(base.slack[i]),
            )
        if kind == "lead":
            return Culprit(
                i,
                "gap",
                _lead_name(g, i),
                int(n["rank"][i]),
                float(lead[i]),
                float(lead_typical[i]),
                TYPICAL_FROM[lead_source[i]],
                float(lead_noise[i]),
                sav,
                float(sav / total),
                float(base.slack[i]),
            )
        return Culprit(
            i,
            "gap",
            f"untraced time after {g.node_name(i)}",
            int(n["rank"][i]),
            float(gap_w[i]),
            float(gap_typical[i]),
            TYPICAL_FROM[gap_source[i]],
            float(gap_noise[i]),
            sav,
            float(sav / total),
            float(base.slack[i]),
            edge=int(gap[i]),
        )

    out.nodes = [entry(sav, kind, i) for sav, _, kind, i in items[:top]]
    out.anomalies = [entry(sav, kind, i) for sav, _, kind, i in sorted(items, key=lambda x: (-x[1], -x[0]))[:top]]
    for rank in g.ranks:
        m = n["rank"] == rank
        rw = np.where(m[g.edges["src"]], restored_w, w)
        rr = np.where(m, restored_rel, g.release)
        s = base.makespan - makespan_of(g, np.where(m, restored, d), rw, rr)
        lead_m = np.where(m & (lead > 0), lead, 0.0)
        out.ranks.append(
            RankBlame(
                int(rank),
                float(s),
                float(s / total),
                float(excess[m].sum()),
                float(gap_excess[m].sum() + lead_excess[m].sum()),
                float(d[m].sum()),
                float(gap_w[m].sum() + lead_m.sum()),
            )
        )
    out.ranks.sort(key=lambda r: -r.saving_us)
    by_name: dict[str, float] = defaultdict(float)
    for i in cand:
        by_name[g.node_name(int(i))] += float(excess[i])
    codes = np.unique(n["name"]).tolist()  # the names of the step's nodes (not every name of the trace)
    for name in sorted(by_name, key=lambda k: -by_name[k])[: max(top, 10)]:
        m = isin_small(n["name"], [c for c in codes if g.names[c] == name])
        s = base.makespan - makespan_of(g, np.where(m, restored, d))
        out.ops.append(OpKindBlame(name, float(s), float(s / total), by_name[name]))
    out.ops.sort(key=lambda r: -r.saving_us)
    out.ops = out.ops[:top]
    out.regions = region_blame(g, references, top, base, memo, keys[2])
    return out


@dataclass(slots=True)
class RegionTime:
    """Each region's own time in parts (see region_time): what scaling the region touches."""

    work: np.ndarray  # µs per region: ops + untraced time inside
    gap: np.ndarray  # per node, its positive program-order edge to the next leaf of its thread, or -1
    before: np.ndarray  # µs per region: the part inside it of the untraced time before its first op (that edge's weight)
    lead: np.ndarray  # µs per region: the part inside it of its first op's lead from the step start (its release)
    after: np.ndarray  # µs per region: the part inside it of the untraced time after its last op


def region_time(g: ExecutionGraph) -> RegionTime:
    """The own time of every region of ``g``: the modelled durations of its ops, the untraced time
    between them (program-order latencies) and the parts inside its span of the untraced time
    before its first op and after its last one (a latency is counted in the share of its stretch
    that lies inside the region)."""
    rg, n, e = g.regions, g.nodes, g.edges
    nn = g.n_nodes
    d = n["mdur"].astype(np.float64)
    gap, gap_w = _gap_weights(g)
    nxt = np.where(gap >= 0, e["dst"][np.maximum(gap, 0)] if len(e["dst"]) else -1, -1)
    chain = (gap >= 0) & (nxt == np.arange(nn) + 1)
    gap = np.where(chain, gap, -1)
    gi = np.where(chain, gap_w, 0.0)
    first, last = rg["first"].astype(np.int64), rg["last"].astype(np.int64)
    m = len(first)
    if not m:
        z = np.zeros(0)
        return RegionTime(z, gap, z, z, z)
    cs_d = np.concatenate([[0.0], np.cumsum(d)])
    cs_g = np.concatenate([[0.0], np.cumsum(gi)])
    work = cs_d[last + 1] - cs_d[first] + cs_g[last] - cs_g[first]
    start = n["start"].astype(np.float64)
    end = start + n["dur"]

    def inside(lo: np.ndarray, hi: np.ndarray, weight: np.ndarray, r_lo: np.ndarray, r_hi: np.ndarray) -> np.ndarray:
        span = hi - lo
        part = np.clip(np.minimum(hi, r_hi) - np.maximum(lo, r_lo), 0.0, None)
        return np.where(span > 1e-9, weight * np.minimum(part / np.where(span > 1e-9, span, 1.0), 1.0), 0.0)

    prev = np.maximum(first - 1, 0)
    has_before = (first > 0) & chain[prev]
    before = np.where(has_before, inside(end[prev], start[first], gi[prev], rg["start"], rg["end"]), 0.0)
    lead_all = _leads(g)
    lead = np.where(
        ~has_before & (lead_all[first] > 0),
        inside(origins(g)[first], start[first], np.maximum(lead_all[first], 0.0), rg["start"], rg["end"]),
        0.0,
    )
    nxt_leaf = np.minimum(last + 1, nn - 1)
    after = np.where(chain[last], inside(end[last], start[nxt_leaf], gi[last], rg["start"], rg["end"]), 0.0)
    return RegionTime(work + before + lead + after, gap, before, lead, after)


def restored_regions(
    g: ExecutionGraph, parts: RegionTime, members: list[int], factors: list[float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(durations, edge weights, releases) of ``g`` with each region ``members[k]`` taking
    ``factors[k]`` of its own time: its ops, the untraced time between them, and the parts inside
    it of the untraced time before its first op, after its last one and of its lead."""
    rg = g.regions
    dd = g.nodes["mdur"].astype(np.float64).copy()
    ww = g.edges["weight"].astype(np.float64).copy()
    rr = g.release.astype(np.float64).copy()
    for j, f in zip(members, factors):
        a, b = int(rg["first"][j]), int(rg["last"][j])
        dd[a : b + 1] *= f
        inner = parts.gap[a:b]
        inner = inner[inner >= 0]
        ww[inner] *= f
        if parts.before[j] > 0:
            ww[parts.gap[a - 1]] -= (1.0 - f) * parts.before[j]
        if parts.after[j] > 0:
            ww[parts.gap[b]] -= (1.0 - f) * parts.after[j]
        if parts.lead[j] > 0:
            rr[a] -= (1.0 - f) * parts.lead[j]
    return dd, ww, rr


def _region_work(g: ExecutionGraph) -> np.ndarray:
    return region_time(g).work


def region_blame(
    g: ExecutionGraph,
    references: list[ExecutionGraph],
    top: int = 20,
    cpm: CPMResult | None = None,
    memo: KeyMemo | None = None,
    groups: dict[int, int] | None = None,
) -> list[Region]:
    """The most specific regions of ``g`` (see the module docstring), ranked by the step time
    their taking their typical time saves; only savings of at least 1% of the step time."""
    rg = g.regions
    if not len(rg["first"]):
        return []
    base = cpm or run_cpm(g)
    memo = memo or KeyMemo()
    groups = peer_groups(g) if groups is None else groups
    keys, ids = memo.regions(g)
    parts = region_time(g)
    rt = parts.work
    ref_keys = [memo.regions(r) for r in references]
    ref_work = [memo.derived(r, "region_time", _region_work) for r in references]
    typical, source, noise = _typical(rt, keys, [(k, w) for (k, _), w in zip(ref_keys, ref_work)], groups, (ids, [i for _, i in ref_keys]))
    absent_on_peers(g, keys, groups, typical, source)
    excess = rt - typical
    floor = noise_floor(base.makespan)
    step_marker = np.array([g.names[int(x)].startswith("ProfilerStep#") for x in rg["name"]], dtype=bool)
    cand = np.flatnonzero((excess > np.maximum(MIN_EXCESS_US, noise)) & (excess >= floor) & ~step_marker)
    cand = cand[np.argsort(-excess[cand], kind="stable")][:REGION_REPLAYS]

    def within(j: int, k: int) -> bool:
        """Region k is region j or lies inside it (regions come in (thread, start, -dur) order:
        of two with the same extent, the later one is the inner)."""
        return k == j or (
            k > j
            and rg["rank"][k] == rg["rank"][j]
            and rg["tid"][k] == rg["tid"][j]
            and rg["first"][k] >= rg["first"][j]
            and rg["last"][k] <= rg["last"][j]
            and rg["start"][k] >= rg["start"][j] - 1e-6
            and rg["end"][k] <= rg["end"][j] + 1e-6
        )

    # a range run several times in the step (once per micro-batch, per layer call, per hook
    # call), each time a little slower: its occurrences taken as one, each to its own typical time
    slower = np.flatnonzero((excess > np.maximum(0.0, noise)) & rg["is_range"].astype(bool) & ~step_marker)
    repeated: dict[tuple[int, str], list[int]] = defaultdict(list)
    for j in slower.tolist():  # by name, and by family: ranges numbered per micro-batch or layer (forward.mb0, forward.mb1)
        repeated[(keys[j][0], keys[j][2])].append(j)
        family = _family(keys[j][2])
        if family != keys[j][2]:
            repeated[(keys[j][0], family)].append(j)
    for key, m in repeated.items():  # an occurrence inside another (a recursive Python range): the outer one holds it
        outer: list[int] = []
        for j in m:  # in region order: an enclosing one comes first
            if not any(within(o, j) for o in outer):
                outer.append(j)
        repeated[key] = outer
    groups_of = [m for m in repeated.values() if len(m) >= 2 and float(excess[m].sum()) >= floor]
    groups_of.sort(key=lambda m: -float(excess[m].sum()))
    candidates = [[j] for j in cand.tolist()] + groups_of[:REGION_GROUP_REPLAYS]
    if not candidates:
        return []
    saving: list[float] = []
    for members in candidates:
        factors = [float(np.clip(typical[j] / rt[j], 0.0, 1.0)) if rt[j] > 0 else 1.0 for j in members]
        dd, ww, rr = restored_regions(g, parts, members, factors)
        saving.append(float(base.makespan - makespan_of(g, dd, ww, rr)))
    kept = [c for c in range(len(candidates)) if saving[c] >= floor]

    def encloses(x: list[int], y: list[int]) -> bool:
        return x != y and all(any(within(j, k) for j in x) for k in y)

    # of nested candidates saving about the same, the innermost (a repeated range encloses each of
    # its occurrences, and is enclosed by a range around all of them)
    specific = [
        c for c in kept if not any(saving[o] >= REGION_NESTED_SHARE * saving[c] and encloses(candidates[c], candidates[o]) for o in kept)
    ]
    specific.sort(key=lambda c: (-saving[c], -float(excess[candidates[c]].sum())))
    out = []
    for c in specific[:top]:
        m = candidates[c]
        j = m[0]
        own = float(rt[m].sum())
        names = {keys[k][2] for k in m}
        out.append(
            Region(
                int(rg["rank"][j]),
                int(rg["tid"][j]),
                keys[j][2] if len(names) == 1 else _family(keys[j][2]),
                keys[j][3],
                "range" if rg["is_range"][j] else "op",
                float((rg["end"][m] - rg["start"][m]).sum()),
                own,
                own - float(excess[m].sum()) if len(m) > 1 else float(typical[j]),
                TYPICAL_FROM[int(source[m].max())],
                float(noise[m].sum()),
                saving[c],
                saving[c] / base.makespan if base.makespan > 0 else 0.0,
                int((rg["last"][m] - rg["first"][m] + 1).sum()),
                len(m),
            )
        )
    return out


_NUMBERED = re.compile(r"(?<=[._#\- ])(mb|microbatch|layer|chunk|stage)?\d+$", re.IGNORECASE)


def _family(name: str) -> str:
    """The name with a trailing number after a separator replaced by ``*`` (``forward.mb3`` ->
    ``forward.mb*``, ``layers.11`` -> ``layers.*``): one range per micro-batch or layer, as one."""
    return _NUMBERED.sub(lambda m: (m.group(1) or "") + "*", name)


def _lead_name(g: ExecutionGraph, i: int) -> str:
    """The untraced time before a thread's first op, named by the range it mostly lies in (the
    graph's gap pieces: a sleep inside ``forward`` is "untraced time in forward")."""
    gp = g.gaps
    mine = np.flatnonzero(gp["node"] == i)
    if len(mine):
        longest = mine[np.argmax(gp["end"][mine] - gp["start"][mine])]
        if gp["owner"][longest] >= 0:
            owner = g.names[int(gp["owner"][longest])]
            if owner.startswith(F.LOADER_WAIT_RANGE):  # (no untraced work: the loop waiting for its batch)
                return f"{LOADER_WAIT} (in its __next__, from the step start to {g.node_name(i)})"
            return f"untraced time in {owner} (from the step start to {g.node_name(i)})"
    return f"untraced time before {g.node_name(i)} (from the step start)"


def name_gaps(b: Blame, g: ExecutionGraph, table: object = None) -> None:
    """Rename the untraced gaps after an op by the op that encloses them, in place: nodes are the
    leaves of a thread's op tree, so the time between two leaves of one parent is that parent's
    own time (``aten::mm``'s compute between its ``aten::resolve_conj`` and ``aten::_unsafe_view``),
    or untraced Python inside a range. The parent is the innermost event open over the whole gap,
    read from the graph's gap pieces (``table`` is no longer needed; kept for callers)."""
    e, gp = g.edges, g.gaps
    order = np.argsort(gp["node"], kind="stable")
    sorted_nodes = gp["node"][order]
    for x in [*b.nodes, *b.anomalies]:
        if x.kind != "gap" or x.edge is None:
            continue
        src, dst = int(e["src"][x.edge]), int(e["dst"][x.edge])
        lo, hi = float(g.nodes["start"][src] + g.nodes["dur"][src]), float(g.nodes["start"][dst])
        mine = order[np.searchsorted(sorted_nodes, dst, side="left") : np.searchsorted(sorted_nodes, dst, side="right")]
        owners = mine[(gp["owner"][mine] >= 0) & (gp["owner_start"][mine] <= lo + 0.5) & (gp["owner_end"][mine] >= hi - 0.5)]
        if not len(owners):
            continue
        parent = g.names[int(gp["owner"][owners[np.argmax(gp["owner_start"][owners])]])]  # the innermost of them
        if parent.startswith("ProfilerStep#"):
            continue
        x.parent = parent
        if parent.startswith(F.LOADER_WAIT_RANGE):
            x.name = f"{LOADER_WAIT} (in its __next__, after {g.node_name(src)})"
        else:
            x.name = f"own time of {parent} (after {g.node_name(src)})"

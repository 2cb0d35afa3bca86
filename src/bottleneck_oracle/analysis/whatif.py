"""What-if by exact replay: edit node durations, rerun the CPM, read the new step time.

An edit selects nodes of one ExecutionGraph (by id, name, rank, kind, phase or module) and changes their
modelled duration: ``scale`` times it, then ``delay_ms`` added. An op that encloses other ops is not
a node (nodes are the leaves of each thread's op tree): its own time, the stretches between its
children that ``analyze`` lists under its name, is part of the latency of the program-order edge
into the leaf after each stretch (or of the thread's release before its first leaf). An edit that
names ops (``name=``, ``name~=``) selects that own time too, and changes it as it changes a
duration; its children keep theirs. The replay is the CPM on the
edited durations with the graph's dependencies and latencies unchanged, so the predicted ΔT is
exact for the graph's model of the step: a node with slack s absorbs the first s µs of a delay.

Single-node edits in bulk (``single_node_makespans``) do not rerun the CPM per edit: a node
lengthened by d puts the longest path through it at makespan - slack + d, and a node shortened
changes the makespan only if it has no slack, which is rerun exactly.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from bottleneck_oracle.analysis.cpm import CPMResult, makespan_of, makespans_after, run_cpm
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.graph_pipeline.events import EvClass, EventTable
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind, NodeType

if TYPE_CHECKING:
    from bottleneck_oracle.analysis.answer import StepWindows

MAX_DELAY_MS = 3_600_000.0  # an edit adds or takes at most an hour per op: beyond, it is a typo or a hostile reply
MAX_SCALE = 1e6  # an edit makes an op at most a million times longer: beyond, float64 step times overflow
STEADY_STEPS_BEFORE = 2  # a step replayed in steady state (steady_replay) is replayed with up to this many steps before it
STEADY_QUEUE_SHARE = 0.2  # a host that waited this share of its step or more for room in the device's launch queue is paced by it
Phase = Literal["forward", "backward", "optimizer"]
PHASES: tuple[Phase, ...] = get_args(Phase)  # codes 1, 2, 3 of analysis.phases.node_phases
EditCategory = Literal["cpu_op", "runtime", "kernel", "memcpy", "memset", "collective", "p2p", "blocking"]
"""What ``cat=`` selects: a schema.Category's name, lower case (barriers are never edited)."""


@dataclass(frozen=True, slots=True)
class TimeDelta:
    """What edits changed in a step, per node and edge (µs; positive: time added). One object for
    every reader: the what-if's added time, the graph network's size of the edit, the corrections'
    removed time and edited nodes."""

    dur: np.ndarray  # float64 [n_nodes]: modelled duration after - before
    weight: np.ndarray  # float64 [n_edges]: latency after - before; 0 where the edits removed the dependency
    release: np.ndarray  # float64 [n_nodes]: release after - before; 0 for a node without one
    detached: np.ndarray  # bool [n_edges]: the dependencies the edits removed (latency -inf)

    @property
    def added_us(self) -> float:
        """The time the edits added to ops, latencies and thread starts (negative: removed)."""
        return float(self.dur.sum() + self.weight[~self.detached].sum() + self.release.sum())

    @property
    def size_us(self) -> float:
        """Every change taken as positive, summed: how large the edit is."""
        return float(np.abs(self.dur).sum()) + (float(np.abs(self.weight[~self.detached]).sum()) + float(np.abs(self.release).sum()))

    @property
    def removed_us(self) -> float:
        """The work and untraced time the edits removed (every negative change, taken positive)."""
        return float(-self.dur[self.dur < 0].sum() - self.weight[self.weight < 0].sum() - self.release[self.release < 0].sum())

    @property
    def lengthens(self) -> bool:
        """Does an edit add time somewhere (more than 1 ns)?"""
        return bool((self.dur > 1e-6).any() or (self.weight > 1e-6).any() or (self.release > 1e-6).any())

    def changed_nodes(self, src: np.ndarray) -> np.ndarray:
        """bool [n_nodes]: nodes whose duration, release or a latency out of them changed (``src``:
        each edge's source node)."""
        out: np.ndarray = np.abs(self.dur) > 1e-9
        out[src[np.abs(self.weight) > 1e-9]] = True
        out[np.abs(self.release) > 1e-9] = True
        return out


@dataclass(frozen=True, slots=True)
class EditedTimes:
    """A step's times after edits (µs), what the replay, the corrected replay and the graph network
    read: every node's modelled duration, every edge's latency, every node's release. What changes
    together travels together; ``delta()`` is what the edits changed."""

    graph: ExecutionGraph
    dur: np.ndarray  # float64 [n_nodes]: modelled durations
    weight: np.ndarray  # float64 [n_edges]: latencies; -inf: a dependency the edits removed (detach=1)
    release: np.ndarray  # float64 [n_nodes]: earliest starts of nodes without a predecessor (-inf: none)
    nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """int64: the edited nodes (their duration, or the untraced time before them)"""
    edges: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """int64: the edited edges (latencies changed, dependencies removed)"""

    @classmethod
    def unedited(cls, g: ExecutionGraph) -> EditedTimes:
        """The step's own times, copied (to edit in place before the object is handed on)."""
        return cls(g, g.nodes["mdur"].astype(np.float64), g.edges["weight"].astype(np.float64), g.release.astype(np.float64))

    def delta(self) -> TimeDelta:
        """What the edits changed, per node and edge."""
        g = self.graph
        fin = np.isfinite(self.weight)
        old_release = g.release
        return TimeDelta(
            dur=self.dur - g.nodes["mdur"].astype(np.float64),
            weight=np.where(fin, self.weight - g.edges["weight"].astype(np.float64), 0.0),
            release=np.where(
                np.isfinite(old_release), np.nan_to_num(self.release, neginf=0.0) - np.nan_to_num(old_release, neginf=0.0), 0.0
            ),
            detached=~fin,
        )

    def cpm(self) -> CPMResult:
        """The replay: the critical path method on these times."""
        return run_cpm(self.graph, self.dur, self.weight, self.release)

    def applied(self) -> ExecutionGraph:
        """A copy of the graph with these times (``with_durations``: removed dependencies dropped)."""
        return with_durations(self.graph, self.dur, self.weight, self.release)


@dataclass(frozen=True, slots=True)
class Edit:
    """Which nodes, and what happens to their modelled duration (µs): d * scale + delay_ms * 1000."""

    ids: tuple[int, ...] = ()
    name: str | None = None
    """exact node name, or an fnmatch pattern if it has * ? or ["""
    name_contains: str | None = None
    rank: int | None = None
    category: EditCategory | None = None
    """schema.Category name, lower case: cpu_op, runtime, kernel, memcpy, memset, collective, p2p"""
    max_us: float | None = None
    """only nodes whose modelled duration is at most this (µs)"""
    min_bytes: float | None = None
    """only collectives and sends/receives whose message is this many bytes or more (those whose size
    the trace does not give included): a compression's edit leaves a 4-byte metric all-reduce out"""
    collective: str | None = None
    """collectives of one kind (schema.CollectiveKind, lower case: all_reduce, all_gather,
    reduce_scatter, broadcast, all_to_all, ...), whatever their names: NCCL's
    ``ncclKernel_AllReduce_*``, its generic kernel that says so in its args, gloo's ``gloo:all_reduce``"""
    phase: Phase | None = None
    """forward | backward | optimizer: nodes inside that phase range (needs the event table)"""
    module: str | None = None
    """nodes run inside a CPU range whose name matches this (exact, or an fnmatch pattern if it
    has * ? or [; a ``nn.Module: `` prefix of the range name is optional), on the same thread,
    and the GPU ops they launch: a module's forward (``nn.Module: Block_1`` from a profile taken
    with ``with_stack=True``, or any ``record_function`` range); needs the event table"""
    detach: bool = False
    """structural: the selected ops neither wait for nor hold up anything but their own thread's
    program order and their launch (their other dependency edges, in and out, are removed),
    e.g. a collective fully overlapped with compute"""
    gap: bool = False
    """change the untraced time around the selected nodes on their thread instead of their
    duration: after them (the program-order latency: Python code, sleeps, anything not
    profiled) and, for a thread's first op in the step, before it (from the rank's step start)"""
    scale: float = 1.0
    delay_ms: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.scale <= MAX_SCALE:
            raise ValueError(f"scale must be a number from 0 to {MAX_SCALE:g} (found {self.scale})")
        if not abs(self.delay_ms) <= MAX_DELAY_MS:
            raise ValueError(f"delay_ms must be a number within ±{MAX_DELAY_MS:g} ms (found {self.delay_ms})")
        if self.max_us is not None and not 0 <= self.max_us < float("inf"):
            raise ValueError(f"max_us must be a finite number >= 0 (found {self.max_us})")
        if self.min_bytes is not None and not 0 <= self.min_bytes < float("inf"):
            raise ValueError(f"min_bytes must be a finite number >= 0 (found {self.min_bytes})")
        if any(not 0 <= i < 2**62 for i in self.ids):
            raise ValueError(f"node ids are non-negative integers below 2**62 (found {max(self.ids, key=abs)})")
        if not (
            self.ids
            or self.name
            or self.name_contains
            or self.rank is not None
            or self.category
            or self.max_us is not None
            or self.min_bytes is not None
            or self.phase
            or self.module
            or self.collective
        ):
            raise ValueError("an edit needs a selector: id=, name=, name~=, rank=, cat=, coll=, max_us=, min_bytes=, phase= or module=")
        if self.collective is not None and _collective_kind_named(self.collective) is None:
            raise ValueError(f"coll must be one of {', '.join(k.name.lower() for k in CollectiveKind)} (found {self.collective!r})")
        if self.phase is not None and self.phase not in PHASES:
            raise ValueError(f"phase must be one of {', '.join(PHASES)} (found {self.phase!r})")
        if self.category is not None and self.category.upper() not in Category.__members__:
            raise ValueError(
                f"cat must be one of {', '.join(c.name.lower() for c in Category if c != Category.BARRIER)} (found {self.category!r})"
            )
        if self.scale == 1.0 and self.delay_ms == 0.0 and not self.detach:
            raise ValueError("an edit needs scale= (other than 1), delay_ms= or detach=1")

    def describe(self) -> str:
        """The edit in words, e.g. "make the untraced time after rank 1's ops 11% of what it is"."""
        kinds = {
            "cpu_op": "CPU ops",
            "runtime": "runtime calls",
            "kernel": "GPU kernels",
            "memcpy": "GPU memcpys",
            "memset": "GPU memsets",
            "collective": "collectives",
            "p2p": "sends and receives",
        }
        what = kinds.get(self.category or "", "ops")
        if self.collective is not None:
            what = f"{self.collective} collectives"
        if self.ids:
            what = f"op{'s' if len(self.ids) > 1 else ''} #{', #'.join(str(i) for i in self.ids)}"
        if self.name is not None:
            what += f" named {self.name}"
        if self.name_contains is not None:
            what += f" whose name contains {self.name_contains!r}"
        if self.module is not None:
            what += f" inside {self.module}"
        if self.phase is not None:
            what += f" of the {self.phase} pass"
        if self.max_us is not None:
            what += f" of at most {self.max_us:g} µs"
        if self.min_bytes is not None:
            what += f" moving {self.min_bytes:g} bytes or more"
        if self.rank is not None:
            what = f"rank {self.rank}'s {what}"
        if self.detach:
            return f"let {what} neither wait for nor hold up other threads and ranks"
        target = f"the untraced time after {what}" if self.gap else what
        change = []
        if self.scale == 0:
            change.append(f"remove {target}")
        elif self.scale < 1:
            change.append(f"make {target} {100 * self.scale:.0f}% of what it is")
        elif self.scale > 1:
            change.append(f"make {target} {self.scale:g}x as long")
        if self.delay_ms:
            change.append(
                f"{'add' if self.delay_ms > 0 else 'take'} {abs(self.delay_ms):g} ms {'to' if self.delay_ms > 0 else 'from'} each of {target}"
            )
        return ", then ".join(change)

    @classmethod
    def parse(cls, text: str) -> Edit:
        """``"name~=all_reduce,rank=1,scale=0.5"``, ``"id=12,delay_ms=5"``, ``"name=aten::mm,scale=2"``,
        ``"cat=runtime,max_us=20,scale=0.2"``. Values are data: nothing in an edit is evaluated."""
        kw: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = re.fullmatch(r"([a-z_]+)(~=|=)(.*)", part)
            if not m:
                raise OracleError(f"edit {text!r}: {part!r} is not key=value")
            key, op, value = m.groups()
            try:
                if key == "name" and op == "~=":
                    kw["name_contains"] = value
                elif key == "name":
                    kw["name"] = value
                elif key == "id":
                    kw["ids"] = tuple(int(v) for v in value.split("+"))
                elif key == "rank":
                    kw["rank"] = int(value)
                elif key == "cat":
                    kw["category"] = value
                elif key == "coll":
                    kw["collective"] = value
                elif key == "phase":
                    kw["phase"] = value
                elif key == "module":
                    kw["module"] = value
                elif key == "gap":
                    kw["gap"] = value.lower() in ("1", "true", "yes")
                elif key == "detach":
                    kw["detach"] = value.lower() in ("1", "true", "yes")
                elif key == "max_us":
                    kw["max_us"] = float(value)
                elif key == "min_bytes":
                    kw["min_bytes"] = float(value)
                elif key == "scale":
                    kw["scale"] = float(value)
                elif key in ("delay_ms", "delay"):
                    kw["delay_ms"] = float(value)
                else:
                    raise OracleError(
                        f"edit {text!r}: unknown key {key!r} (id, name, name~, rank, cat, coll, max_us, min_bytes, phase, module, gap, detach, scale, delay_ms)"
                    )
            except ValueError as exc:
                raise OracleError(f"edit {text!r}: bad value for {key}: {value!r}") from exc
        try:
            return cls(**kw)
        except ValueError as exc:
            raise OracleError(f"edit {text!r}: {exc}") from exc

    @property
    def owns_time(self) -> bool:
        """Does the edit change the own time of the enclosing ops it selects (see the module doc)?
        Those it names (``name=``, ``name~=``), or every op of a rank (``rank=`` naming no op, no
        phase nor module: ``rank=1,scale=0.5`` is the rank's ops at half their time, an
        ``aten::mm``'s own time around its ``aten::resolve_conj`` child too)."""
        named = self.name is not None or self.name_contains is not None
        whole_rank = (
            self.rank is not None and self.phase is None and self.module is None and self.collective is None and self.min_bytes is None
        )
        return (
            (named or whole_rank)
            and not self.ids
            and self.category in (None, "cpu_op")
            and not self.gap
            and (self.scale != 1.0 or self.delay_ms != 0.0)
        )

    @property
    def region(self) -> bool:
        """Does the edit scale a region (``phase=`` or ``module=``, naming no op): the time between
        two of its ops on a thread too, and for ``module=`` the ranges' time before their first op
        and after their last (edited_weights, edited_releases)?"""
        named = self.name is not None or self.name_contains is not None
        return (self.phase is not None or self.module is not None) and self.scale != 1.0 and not self.gap and not named

    def names_matching(self, names: list[str]) -> np.ndarray:
        """Per name: does it pass the edit's ``name=`` and ``name~=`` (True where neither is given)?
        ``name~=`` matches in any case: a recipe's "softmax" selects ``cunn_SoftMaxForward``, as a
        user's "allreduce" selects ``ncclKernel_AllReduce``."""
        pattern = self.name
        glob = pattern is not None and _is_glob(pattern)
        part = None if self.name_contains is None else self.name_contains.lower()  # (any case: cunn_SoftMaxForward)
        return np.array(
            [
                (part is None or part in s.lower()) and (pattern is None or (fnmatch.fnmatchcase(s, pattern) if glob else s == pattern))
                for s in names
            ],
            dtype=bool,
        )

    def select(self, g: ExecutionGraph, phases: np.ndarray | None = None, table: EventTable | None = None) -> np.ndarray:
        """Node ids the edit applies to (compute and network nodes; barriers never). ``phases``:
        the phase code of every node (analysis.phases.node_phases), for ``phase=``; ``table``:
        the trace's events, for ``module=``."""
        n = g.nodes
        mask = n["category"] != Category.BARRIER
        if self.ids:
            ids = np.asarray(self.ids, dtype=np.int64)
            bad = ids[(ids < 0) | (ids >= g.n_nodes)]
            if len(bad):
                raise OracleError(f"edit: node id {int(bad[0])} is not in the graph ({g.n_nodes} nodes)")
            sel = np.zeros(g.n_nodes, dtype=bool)
            sel[ids] = True
            mask &= sel
        if self.rank is not None:
            mask &= n["rank"] == self.rank
        if self.category is not None:
            mask &= n["category"] == Category[self.category.upper()]
        if self.collective is not None:
            mask &= (n["node_type"] == NodeType.NETWORK) & (n["coll_kind"] == _collective_kind_named(self.collective))
        if self.max_us is not None:
            mask &= n["mdur"] <= self.max_us
        if self.min_bytes is not None:  # (a size the trace does not give is no size under it)
            mask &= (n["node_type"] == NodeType.NETWORK) & ~(n["msg_bytes"] < self.min_bytes)
        if self.phase is not None:
            if phases is None:
                raise OracleError("edit: phase= needs the trace's phase ranges (not available for this input)")
            mask &= phases == PHASES.index(self.phase) + 1
        if self.module is not None:
            if table is None:
                raise OracleError("edit: module= needs the trace's ranges (not available for this input)")
            mask &= module_mask(table, g, self.module)
        if self.name is not None or self.name_contains is not None:
            mask &= self.names_matching(g.names)[n["name"]]
        return np.flatnonzero(mask)


MODULE_PREFIX = "nn.Module: "


def _collective_kind_named(text: str) -> int | None:
    """The CollectiveKind a ``coll=`` value names (``all_reduce``, ``allreduce``, any case), else None."""
    key = text.strip().lower().replace("_", "").replace("-", "")
    for kind in CollectiveKind:
        if kind.name.lower().replace("_", "") == key:
            return int(kind)
    return None


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _matches(name: str, pattern: str, glob: bool) -> bool:
    names = (name, name[len(MODULE_PREFIX) :]) if name.startswith(MODULE_PREFIX) else (name,)
    return any(fnmatch.fnmatchcase(s, pattern) if glob else s == pattern for s in names)


def module_mask(table: EventTable, g: ExecutionGraph, pattern: str) -> np.ndarray:
    """Per node: does it run inside a CPU range (of ``table``) whose name matches ``pattern``
    (see ``Edit.module``) on its rank and thread, or was it launched by such a node?"""
    mask = np.zeros(g.n_nodes, dtype=bool)
    for inside, _, _ in _module_ranges(table, g, pattern):
        mask[inside] = True
    e = g.edges
    launched = (e["kind"] == EdgeKind.LAUNCH) & mask[e["src"]]
    mask[e["dst"][launched]] = True
    return mask


def _module_ranges(table: EventTable, g: ExecutionGraph, pattern: str) -> Iterator[tuple[np.ndarray, float, float]]:
    """Each CPU range (of ``table``) in the window whose name matches ``pattern`` (see
    ``Edit.module``) as (the host nodes of its thread inside it, its start, its end; µs from the
    window start)."""
    glob = _is_glob(pattern)
    c, n = table.cols, g.nodes
    name_ok = np.array([_matches(s, pattern, glob) for s in table.names], dtype=bool)
    ts_rel = g.window_start - table.t0
    for rank in g.ranks:
        rows = table.window_rows(rank, g)
        rows = rows[name_ok[c["name"][rows]] & (c["cls"][rows] == EvClass.CPU)]
        if not len(rows):
            continue
        mine = np.flatnonzero((n["rank"] == rank) & ~n["on_gpu"] & (n["category"] != Category.BARRIER))
        start, end, tid = n["start"][mine], n["start"][mine] + n["dur"][mine], n["tid"][mine]
        for r in rows.tolist():
            lo = float(c["ts"][r] - ts_rel)
            hi = lo + float(c["dur"][r])
            yield mine[(start >= lo - 0.5) & (end <= hi + 0.5) & (tid == c["tid"][r])], lo, hi


@dataclass(frozen=True, slots=True)
class RangeEnds:
    """The time a module edit's ranges hold before their first op and after their last one (the
    loop waiting in a DataLoader's ``__next__`` for its workers before the batch's first op, a
    range's own work after its last op): in the program-order latency into the first op or out of
    the last, or in the first op's release where it starts its thread's step."""

    edges: np.ndarray  # int64 program-order edge ids
    edge_us: np.ndarray  # float64 µs of each edge's latency inside a range
    nodes: np.ndarray  # int64 ids of first ops that start their thread's step
    node_us: np.ndarray  # float64 µs of each one's lead (rank start to release) inside a range


def range_ends(g: ExecutionGraph, e: Edit, phases: np.ndarray | None, table: EventTable | None) -> RangeEnds:
    """The ends of the ranges ``e`` (a region edit with ``module=``) selects: see RangeEnds. Only
    the part of a latency inside a range counts (a gap that began before the range did is the
    code before it); a latency both ends of which the edit selects is scaled whole already."""
    empty = np.zeros(0, dtype=np.int64)
    if e.module is None or table is None:
        return RangeEnds(empty, np.zeros(0), empty, np.zeros(0))
    sel = np.zeros(g.n_nodes, dtype=bool)
    sel[e.select(g, phases, table)] = True
    ed, n = g.edges, g.nodes
    into = _program_order_into(g)
    po = np.flatnonzero((ed["kind"] == EdgeKind.PROGRAM_ORDER) & ~n["on_gpu"][ed["src"]] & ~n["on_gpu"][ed["dst"]])
    out_of = np.full(g.n_nodes, -1, dtype=np.int64)
    out_of[ed["src"][po]] = po
    w, rel = ed["weight"], g.release
    by_edge: dict[int, float] = {}
    by_node: dict[int, float] = {}
    for inside, lo, hi in _module_ranges(table, g, e.module):
        inside = inside[sel[inside]]
        if not len(inside):
            continue
        start, end = n["start"][inside], n["start"][inside] + n["dur"][inside]
        first, last = int(inside[np.argmin(start)]), int(inside[np.argmax(end)])
        head = float(n["start"][first]) - lo
        if head > 0:
            k = int(into[first])
            if k >= 0 and not sel[ed["src"][k]]:
                by_edge[k] = max(by_edge.get(k, 0.0), min(float(w[k]), head))
            elif k < 0 and np.isfinite(rel[first]):
                lead = float(rel[first]) - g.rank_start(int(n["rank"][first]))
                by_node[first] = max(by_node.get(first, 0.0), min(max(lead, 0.0), head))
        tail = hi - float(n["start"][last] + n["dur"][last])
        k = int(out_of[last])
        if tail > 0 and k >= 0 and not sel[ed["dst"][k]]:
            by_edge[k] = max(by_edge.get(k, 0.0), min(float(w[k]), tail))
    return RangeEnds(
        np.array(list(by_edge), dtype=np.int64),
        np.array(list(by_edge.values()), dtype=np.float64),
        np.array(list(by_node), dtype=np.int64),
        np.array(list(by_node.values()), dtype=np.float64),
    )


@dataclass(frozen=True, slots=True)
class OwnTime:
    """The own time of the enclosing ops an edit names, per leaf node it precedes."""

    nodes: np.ndarray  # int64 node ids: the leaf after each stretch of own time
    own_us: np.ndarray  # float64 µs of the selected own time in the gap before each node
    delay_us: np.ndarray  # float64 µs the edit's delay_ms adds before each node (at each op's last stretch)
    instances: int  # how many op instances that is


def own_time(g: ExecutionGraph, e: Edit, phases: np.ndarray | None = None, table: EventTable | None = None) -> OwnTime:
    """The own time (graph.gaps pieces owned by an op) of the enclosing ops ``e`` names, with its
    other selectors holding for the leaf after each piece (rank, phase, module) or for the op
    (``max_us``: its whole duration)."""
    gp, n = g.gaps, g.nodes
    none = OwnTime(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), 0)
    if not e.owns_time or not len(gp["node"]):
        return none
    owner = gp["owner"].astype(np.int64)
    mask = gp["owner_op"].astype(bool) & (owner >= 0)
    named = e.name is not None or e.name_contains is not None
    if named:
        mask[mask] &= e.names_matching(g.names)[owner[mask]]
    node = gp["node"].astype(np.int64)
    if e.rank is not None:
        mask &= n["rank"][node] == e.rank
    if e.max_us is not None:
        mask &= (gp["owner_end"] - gp["owner_start"]) <= e.max_us
    if e.phase is not None and mask.any():
        if phases is None:
            raise OracleError("edit: phase= needs the trace's phase ranges (not available for this input)")
        mask &= phases[node] == PHASES.index(e.phase) + 1
    if e.module is not None and mask.any():
        if table is None:
            raise OracleError("edit: module= needs the trace's ranges (not available for this input)")
        mask &= module_mask(table, g, e.module)[node]
    sel = np.flatnonzero(mask)
    if not len(sel):
        return none
    # one op instance: its rank, thread, name and start; its last stretch carries the delay
    rank, tid, start, end = n["rank"][node[sel]], n["tid"][node[sel]], gp["owner_start"][sel], gp["end"][sel]
    order = np.lexsort((end, start, owner[sel], tid, rank))
    keys = np.stack([rank[order], tid[order], owner[sel][order]]).astype(np.float64)
    new = np.r_[True, (np.diff(keys, axis=1) != 0).any(axis=0) | (np.diff(start[order]) != 0)]
    last = order[np.r_[np.flatnonzero(new)[1:] - 1, len(order) - 1]]
    nodes, inv = np.unique(node[sel], return_inverse=True)
    own = np.bincount(inv, weights=gp["end"][sel] - gp["start"][sel], minlength=len(nodes))
    delay = np.zeros(len(nodes))
    if named:  # (a whole rank's delay_ms is its leaves': each op once)
        np.add.at(delay, inv[last], e.delay_ms * 1000.0)
    return OwnTime(nodes, own, delay, int(new.sum()))


def _edits_own_time(e: Edit, edits: list[Edit] | tuple[Edit, ...]) -> bool:
    """Does ``e`` change the own time of the ops it selects (Edit.owns_time), beside the other
    ``edits``? A whole rank's edit does not where a ``gap=1`` edit of the same rank sets the time
    between the rank's ops, its ops' own time with it (the straggler suggestion's pair: its ops, and
    the time between them): the own time is scaled once."""
    if not e.owns_time:
        return False
    if e.name is not None or e.name_contains is not None:
        return True
    return not any(x.gap and x.rank == e.rank and x.name is None and x.name_contains is None for x in edits)


def _program_order_into(g: ExecutionGraph) -> np.ndarray:
    """Per node, the program-order edge into it from the leaf before it on its CPU thread (-1: none)."""
    e, n = g.edges, g.nodes
    po = np.flatnonzero((e["kind"] == EdgeKind.PROGRAM_ORDER) & ~n["on_gpu"][e["dst"]])
    into = np.full(g.n_nodes, -1, dtype=np.int64)
    into[e["dst"][po]] = po
    return into


def own_time_edits(
    g: ExecutionGraph, edits: list[Edit] | tuple[Edit, ...], phases: np.ndarray | None = None, table: EventTable | None = None
) -> tuple[int, np.ndarray]:
    """(enclosing op instances whose own time the edits change, ids of the edges holding it)."""
    into = _program_order_into(g)
    found = [own_time(g, e, phases, table) for e in edits if _edits_own_time(e, edits)]
    edges = [into[o.nodes][into[o.nodes] >= 0] for o in found]
    return sum(o.instances for o in found), _union(edges)


def _union(touched: list[np.ndarray]) -> np.ndarray:
    return np.unique(np.concatenate(touched)) if touched else np.zeros(0, dtype=np.int64)


def _edge_ends(g: ExecutionGraph, e: Edit, phases: np.ndarray | None, table: EventTable | None) -> tuple[np.ndarray, np.ndarray]:
    """(source selected, destination selected) per edge."""
    sel = np.zeros(g.n_nodes, dtype=bool)
    sel[e.select(g, phases, table)] = True
    return sel[g.edges["src"]], sel[g.edges["dst"]]


def edited_durations(
    g: ExecutionGraph, edits: list[Edit] | tuple[Edit, ...], phases: np.ndarray | None = None, table: EventTable | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(modelled durations after the edits, ids of the edited nodes)."""
    d = g.nodes["mdur"].astype(np.float64).copy()
    touched = []
    for e in edits:
        if e.gap or (e.detach and e.scale == 1.0 and e.delay_ms == 0.0):
            continue
        ids = e.select(g, phases, table)
        d[ids] = np.maximum(d[ids] * e.scale + e.delay_ms * 1000.0, 0.0)
        touched.append(ids)
    return d, _union(touched)


def edited_weights(
    g: ExecutionGraph, edits: list[Edit] | tuple[Edit, ...], phases: np.ndarray | None = None, table: EventTable | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(edge latencies after the edits, ids of the edited edges): with ``gap=1`` the positive
    program-order latency after each selected node is scaled, then delay_ms added. A region edit
    (``phase=`` or ``module=`` naming no op) scales the time between two of its ops on a thread too:
    that is the own time of the ops and ranges of the region (an op's work between its children).
    An edit naming ops changes their own time (``own_time``) in the latency that holds it."""
    w = g.edges["weight"].astype(np.float64).copy()
    touched = []
    into: np.ndarray | None = None
    for e in edits:
        region = e.region
        if _edits_own_time(e, edits):
            own = own_time(g, e, phases, table)
            into = _program_order_into(g) if into is None else into
            edge = into[own.nodes]
            has = edge >= 0
            ids = edge[has]
            w[ids] = np.maximum(w[ids] - (1.0 - e.scale) * own.own_us[has] + own.delay_us[has], 0.0)
            touched.append(ids)
        if not (e.detach or e.gap or region):
            continue
        from_sel, to_sel = _edge_ends(g, e, phases, table)
        if region:
            ids = np.flatnonzero(from_sel & to_sel & (g.edges["kind"] == EdgeKind.PROGRAM_ORDER) & (w > 0))
            w[ids] *= e.scale
            touched.append(ids)
            ends = range_ends(g, e, phases, table)
            w[ends.edges] = np.maximum(w[ends.edges] - (1.0 - e.scale) * ends.edge_us, 0.0)
            touched.append(ends.edges)
        if e.detach:
            ids = np.flatnonzero((from_sel | to_sel) & ~np.isin(g.edges["kind"], (EdgeKind.PROGRAM_ORDER, EdgeKind.LAUNCH)))
            w[ids] = -np.inf  # the CPM never takes an edge of latency -inf: the dependency is gone
            touched.append(ids)
        if e.gap:
            ids = np.flatnonzero(from_sel & (g.edges["kind"] == EdgeKind.PROGRAM_ORDER) & (w > 0))
            w[ids] = np.maximum(w[ids] * e.scale + e.delay_ms * 1000.0, 0.0)
            touched.append(ids)
    return w, _union(touched)


def edited_releases(
    g: ExecutionGraph, edits: list[Edit] | tuple[Edit, ...], phases: np.ndarray | None = None, table: EventTable | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(releases after the ``gap=1`` edits, ids of the nodes whose leading untraced time changed):
    a selected op that starts its thread's step (no predecessor) has the time from its rank's
    step start to its release scaled, then delay_ms added. The own time of a named enclosing op
    before a thread's first leaf changes that leaf's release."""
    rel = g.release.astype(np.float64).copy()
    touched = []
    into: np.ndarray | None = None
    for e in edits:
        if _edits_own_time(e, edits):
            own = own_time(g, e, phases, table)
            into = _program_order_into(g) if into is None else into
            first = (into[own.nodes] < 0) & np.isfinite(rel[own.nodes])
            ids = own.nodes[first]
            start = np.array([g.rank_start(int(r)) for r in g.nodes["rank"][ids]])
            rel[ids] = np.maximum(rel[ids] - (1.0 - e.scale) * own.own_us[first] + own.delay_us[first], np.minimum(start, rel[ids]))
            touched.append(ids)
        if e.region and e.module is not None:  # (the ranges' lead-in)
            ends = range_ends(g, e, phases, table)
            rel[ends.nodes] = np.maximum(rel[ends.nodes] - (1.0 - e.scale) * ends.node_us, 0.0)
            touched.append(ends.nodes)
        if not e.gap:
            continue
        ids = e.select(g, phases, table)
        ids = ids[np.isfinite(rel[ids])]
        if not len(ids):
            continue
        start = np.array([g.rank_start(int(r)) for r in g.nodes["rank"][ids]])
        lead = np.maximum(rel[ids] - start, 0.0)
        rel[ids] = start + np.maximum(lead * e.scale + e.delay_ms * 1000.0, 0.0)
        touched.append(ids)
    return rel, _union(touched)


def apply_edits(
    g: ExecutionGraph, edits: list[Edit] | tuple[Edit, ...], phases: np.ndarray | None = None, table: EventTable | None = None
) -> EditedTimes:
    """The step's times after all the edits, with the edited nodes and edges; nodes whose leading
    untraced time changed count among the edited nodes."""
    d, ids = edited_durations(g, edits, phases, table)
    w, eids = edited_weights(g, edits, phases, table)
    rel, rids = edited_releases(g, edits, phases, table)
    return EditedTimes(g, d, w, rel, np.union1d(ids, rids), eids)


def selects_anything(g: ExecutionGraph, e: Edit, phases: np.ndarray | None = None, table: EventTable | None = None) -> bool:
    """Does the edit, alone, change anything in ``g``: a duration, an op's own time, a latency, a
    release or a dependency?"""
    t = apply_edits(g, [e], phases, table)
    return bool(len(t.nodes) or len(t.edges))


SELECTORS = ("ids", "name", "name_contains", "rank", "category", "collective", "max_us", "phase", "module")
_CLAUSE = {
    "ids": "id",
    "name": "name",
    "name_contains": "name~",
    "rank": "rank",
    "category": "cat",
    "collective": "coll",
    "max_us": "max_us",
    "phase": "phase",
    "module": "module",
}


def _range_named(g: ExecutionGraph, pattern: str) -> bool:
    """Whether a range of program code (a region that is a range: record_function, a module's, a
    Python frame) in ``g`` has a name ``pattern`` matches (exactly, or as a glob)."""
    import fnmatch

    names = {g.names[k] for k in np.unique(g.regions["name"][g.regions["is_range"]]).tolist()}
    names |= {g.names[k] for k in g.meta.get("range_leaves", ())}
    return pattern in names or any(fnmatch.fnmatchcase(n, pattern) for n in names)


def why_nothing(graphs: list[ExecutionGraph], e: Edit, phases: list[np.ndarray | None], table: EventTable | None = None) -> str:
    """Why ``e`` selects nothing in any of ``graphs``: the selector that selects nothing by itself,
    or that its selectors hold for no op together (and where its name is found)."""
    given = {k: getattr(e, k) for k in SELECTORS if getattr(e, k) not in (None, ())}
    for key, value in given.items():
        cleared: dict[str, Any] = {k: (() if k == "ids" else None) for k in given if k != key}
        alone = replace(e, **cleared, gap=False, detach=False, scale=0.5, delay_ms=0.0)
        if not any(selects_anything(g, alone, p, table) for g, p in zip(graphs, phases)):
            shown = "+".join(map(str, value)) if key == "ids" else value
            what = {
                "rank": "no op runs on that rank",
                "name": "no op has that name",
                "name_contains": "no op's name contains it",
                "category": "no op is of that category",
                "collective": "no collective of that kind runs",
                "max_us": "no op is that short",
                "ids": "those are not ops",
                "phase": "no op runs in a range of that phase",
                "module": "no op runs inside a range of that name",
            }[key]
            if key == "name" and any(_range_named(g, str(value)) for g in graphs):
                what += f"; a range does: module={shown} selects the ops inside it"
            return f"{_CLAUSE[key]}={shown} selects nothing ({what})"
    if "rank" in given and ("name" in given or "name_contains" in given):
        named = replace(e, rank=None, gap=False, detach=False, scale=0.5, delay_ms=0.0)
        ranks = sorted(
            {int(r) for g, p in zip(graphs, phases) for r in g.nodes["rank"][apply_edits(g, [named], p, table).nodes]}
            | {int(r) for g, p in zip(graphs, phases) for r in g.nodes["rank"][own_time(g, named, p, table).nodes]}
        )
        if ranks:
            return f"its ops run on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}, not on rank {e.rank}"
    if e.gap:
        return "its ops have no untraced time after them (gap=1)"
    return "each of its selectors selects something, but no op matches them all"


def with_durations(
    g: ExecutionGraph, dur: np.ndarray, weight: np.ndarray | None = None, release: np.ndarray | None = None
) -> ExecutionGraph:
    """A copy of ``g`` whose modelled durations are ``dur`` and, if given, edge latencies ``weight``
    and releases ``release`` (measured durations unchanged)."""
    nodes = dict(g.nodes)
    nodes["mdur"] = np.asarray(dur, dtype=np.float64)
    edges = g.edges
    if weight is not None:
        weight = np.asarray(weight, dtype=np.float64)
        keep = np.isfinite(weight)  # detached dependencies are dropped
        edges = {k: v[keep] for k, v in g.edges.items()}
        edges["weight"] = weight[keep]
    return replace(g, nodes=nodes, edges=edges, release=g.release if release is None else np.asarray(release, dtype=np.float64))


@dataclass(slots=True)
class WhatIf:
    base: CPMResult
    edited: CPMResult
    ids: np.ndarray  # the edited nodes

    @property
    def delta_us(self) -> float:
        return self.edited.makespan - self.base.makespan


def replay(
    g: ExecutionGraph,
    edits: list[Edit] | tuple[Edit, ...],
    base: CPMResult | None = None,
    phases: np.ndarray | None = None,
    table: EventTable | None = None,
) -> WhatIf:
    t = apply_edits(g, edits, phases, table)
    if not len(t.nodes) and not len(t.edges):
        raise OracleError("edit selects no node of the graph")
    return WhatIf(base=base or run_cpm(g), edited=t.cpm(), ids=t.nodes)


def single_node_makespans(g: ExecutionGraph, ids: np.ndarray, delta_us: np.ndarray | float, base: CPMResult | None = None) -> np.ndarray:
    """The makespan after each single edit ``ids[i]`` += ``delta_us[i]`` (µs), exact, vectorised.

    Lengthening: max(M, M - slack + d). Shortening a node with slack changes nothing; shortening
    one without slack is recomputed exactly (one compiled forward pass per such edit)."""
    r = base or run_cpm(g)
    ids = np.asarray(ids, dtype=np.int64)
    delta = np.broadcast_to(np.asarray(delta_us, dtype=np.float64), ids.shape)
    m = r.makespan
    out: np.ndarray = np.maximum(m, m - r.slack[ids] + np.maximum(delta, -g.nodes["mdur"][ids]))
    tol = 1e-3 + 1e-9 * m  # float noise in the slack of critical nodes (µs)
    shrink = np.flatnonzero((delta < 0) & (r.slack[ids] <= tol))
    if len(shrink):  # a shortened node without slack: exact forward passes, compiled
        v = ids[shrink]
        out[shrink] = makespans_after(g, v, np.maximum(g.nodes["mdur"][v] + delta[shrink], 0.0))
    return out


def single_edge_makespans(g: ExecutionGraph, eids: np.ndarray, delta_us: np.ndarray | float, base: CPMResult | None = None) -> np.ndarray:
    """The makespan after each single latency edit ``weight[eids[i]]`` += ``delta_us[i]``, exact:
    the longest path through an edge is makespan - its slack (lst[dst] - eft[src] - weight)."""
    r = base or run_cpm(g)
    eids = np.asarray(eids, dtype=np.int64)
    delta = np.broadcast_to(np.asarray(delta_us, dtype=np.float64), eids.shape)
    e = g.edges
    w = e["weight"].astype(np.float64)
    slack = r.lst[e["dst"][eids]] - r.eft[e["src"][eids]] - w[eids]
    m = r.makespan
    out: np.ndarray = np.maximum(m, m - slack + np.maximum(delta, -w[eids]))
    for i in np.flatnonzero((delta < 0) & (slack <= 1e-3 + 1e-9 * m)):
        w2 = w.copy()
        w2[eids[i]] = max(w2[eids[i]] + delta[i], 0.0)
        out[i] = makespan_of(g, None, w2)
    return out


def main_thread(g: ExecutionGraph, rank: int) -> int:
    """The CPU thread of ``rank`` with the most nodes (the training loop's)."""
    n = g.nodes
    m = (n["rank"] == rank) & ~n["on_gpu"] & (n["node_type"] == NodeType.COMPUTE)
    tids, counts = np.unique(n["tid"][m], return_counts=True)
    if not len(tids):
        raise OracleError(f"rank {rank} has no CPU nodes in step {g.step}")
    return int(tids[np.argmax(counts)])


def thread_chain(g: ExecutionGraph, rank: int, tid: int) -> np.ndarray:
    """The CPU compute nodes of one thread of ``rank``, in start order."""
    n = g.nodes
    ids = np.flatnonzero((n["rank"] == rank) & (n["tid"] == tid) & ~n["on_gpu"] & (n["node_type"] == NodeType.COMPUTE))
    return ids[np.argsort(n["start"][ids], kind="stable")]


def carried_in(g: ExecutionGraph) -> bool:
    """Whether on some rank the device was still running earlier steps' work when ``g``'s step began
    (its period starts at that work's end, after its host's step start): the host ran part of the
    step, and the end of the step before, outside the window, so an edit there moves the step's
    work in steady state and not in the window alone. Such a step is replayed in steady state
    (steady_replay): a step whose host waited for room in the device's full launch queue is one
    (its recorded launch times follow the device, and a faster device would free it); so is a host-bound
    loop whose device work runs past each step's host (an edit of the host's tail moves the next
    step), and a device-bound one whose host ran ahead without filling the queue (diff_test). A
    simulation of 300 random loops (tests/analysis/test_simulated_loops.py) found 13 whose
    what-ifs in the step's own window missed the re-simulated period by more than 1% + 20 µs."""
    return any(g.rank_origin(r) > g.rank_start(r) + 1.0 for r in g.ranks)


@dataclass(slots=True)
class SteadyState:
    """A step's what-if replayed in steady state (steady_replay): the window of ``steps`` consecutive
    steps from ``first``, the step last; the step's period before and after the edits (µs); the
    window's graph, its replay before and after, and its edited durations."""

    first: int
    steps: int
    period_us: float
    edited_us: float
    graph: ExecutionGraph
    base: CPMResult
    edited: CPMResult
    dur: np.ndarray


def steady_replay(windows: StepWindows | None, g: ExecutionGraph, edits: list[Edit], table: EventTable | None) -> SteadyState | None:
    """The period of ``g``'s step with ``edits`` applied in steady state: to it and up to
    STEADY_STEPS_BEFORE steps before it, replayed together, so that a device that runs faster
    drains the work earlier steps queued and a host that waited for room in its device's queue
    (EventTable.queue_waits) waits less. The period is the difference between the window's makespan
    with the step and without it (the same first step; later steps do not move earlier ones);
    ``windows``: api.two_step_graphs. None where the step is not one to replay so
    (carried_in), nor of several ranks, an edit names nodes of ``g`` by id, or the trace has not
    the step before it. Several ranks: a rank that ends a step later starts the next later, and a
    peer that waited for it at the next collective then waits less; the step's window alone holds
    every rank's start as recorded (tests/analysis/test_simulated_ddp.py)."""
    from bottleneck_oracle.analysis.phases import node_phases

    step = g.step
    if (
        windows is None or step is None or any(e.ids for e in edits) or not (carried_in(g) or len(g.ranks) > 1)
    ):  # (ranks that meet at collectives: see below)
        return None
    for k in range(STEADY_STEPS_BEFORE, 0, -1):
        with_it, without = windows(step - k, k + 1), windows(step - k, k)
        if with_it is None or without is None:
            continue
        runs = []
        for w in (with_it, without):
            phases = node_phases(table, w)[0] if table is not None else None
            t = apply_edits(w, edits, phases, table)
            runs.append((run_cpm(w), t.cpm(), t.dur))
        (base_a, edit_a, dur), (base_b, edit_b, _) = runs
        return SteadyState(
            first=step - k,
            steps=k + 1,
            period_us=base_a.makespan - base_b.makespan,
            edited_us=edit_a.makespan - edit_b.makespan,
            graph=with_it,
            base=base_a,
            edited=edit_a,
            dur=dur,
        )
    return None

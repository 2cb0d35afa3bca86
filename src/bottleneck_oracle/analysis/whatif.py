"""What-if by exact replay: edit node durations, rerun the CPM, read the new step time.

An edit selects nodes of one ExecutionGraph (by id, name, rank, kind, phase or module) and changes their
modelled duration: ``scale`` times it, then ``delay_ms`` added. The replay is the CPM on the
edited durations with the graph's dependencies and latencies unchanged, so the predicted ΔT is
exact for the graph's model of the step: a node with slack s absorbs the first s µs of a delay.

Single-node edits in bulk (``single_node_makespans``) do not rerun the CPM per edit: a node
lengthened by d puts the longest path through it at makespan - slack + d, and a node shortened
changes the makespan only if it has no slack, which is rerun exactly.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace

import numpy as np

from bottleneck_oracle.analysis.cpm import CPMResult, makespans_after, run_cpm
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.graph_pipeline.events import EvClass, EventTable
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, EdgeKind, NodeType

MAX_DELAY_MS = 3_600_000.0  # an edit adds or takes at most an hour per op: beyond, it is a typo or a hostile reply
MAX_SCALE = 1e6  # an edit makes an op at most a million times longer: beyond, float64 step times overflow
PHASES = ("forward", "backward", "optimizer")  # codes 1, 2, 3 of analysis.phases.node_phases


@dataclass(frozen=True, slots=True)
class Edit:
    """Which nodes, and what happens to their modelled duration (µs): d * scale + delay_ms * 1000."""

    ids: tuple[int, ...] = ()
    name: str | None = None
    """exact node name, or an fnmatch pattern if it has * ? or ["""
    name_contains: str | None = None
    rank: int | None = None
    category: str | None = None
    """schema.Category name, lower case: cpu_op, runtime, kernel, memcpy, memset, collective, p2p"""
    max_us: float | None = None
    """only nodes whose modelled duration is at most this (µs)"""
    phase: str | None = None
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
        if any(not 0 <= i < 2**62 for i in self.ids):
            raise ValueError(f"node ids are non-negative integers below 2**62 (found {max(self.ids, key=abs)})")
        if not (
            self.ids
            or self.name
            or self.name_contains
            or self.rank is not None
            or self.category
            or self.max_us is not None
            or self.phase
            or self.module
        ):
            raise ValueError("an edit needs a selector: id=, name=, name~=, rank=, cat=, max_us=, phase= or module=")
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
        kinds = {"cpu_op": "CPU ops", "runtime": "runtime calls", "kernel": "GPU kernels", "memcpy": "GPU memcpys", "memset": "GPU memsets",
                 "collective": "collectives", "p2p": "sends and receives"}  # fmt: skip
        what = kinds.get(self.category or "", "ops")
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
        kw: dict = {}
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
                elif key == "scale":
                    kw["scale"] = float(value)
                elif key in ("delay_ms", "delay"):
                    kw["delay_ms"] = float(value)
                else:
                    raise OracleError(
                        f"edit {text!r}: unknown key {key!r} (id, name, name~, rank, cat, max_us, phase, module, gap, detach, scale, delay_ms)"
                    )
            except ValueError as exc:
                raise OracleError(f"edit {text!r}: bad value for {key}: {value!r}") from exc
        try:
            return cls(**kw)
        except ValueError as exc:
            raise OracleError(f"edit {text!r}: {exc}") from exc

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
        if self.max_us is not None:
            mask &= n["mdur"] <= self.max_us
        if self.phase is not None:
            if phases is None:
                raise OracleError("edit: phase= needs the trace's phase ranges (not available for this input)")
            mask &= phases == PHASES.index(self.phase) + 1
        if self.module is not None:
            if table is None:
                raise OracleError("edit: module= needs the trace's ranges (not available for this input)")
            mask &= module_mask(table, g, self.module)
        if self.name is not None or self.name_contains is not None:
            pattern = self.name
            glob = pattern is not None and _is_glob(pattern)
            keep = np.array(
                [
                    (self.name_contains is None or self.name_contains in s)
                    and (pattern is None or (fnmatch.fnmatchcase(s, pattern) if glob else s == pattern))
                    for s in g.names
                ],
                dtype=bool,
            )
            mask &= keep[n["name"]]
        return np.flatnonzero(mask)


MODULE_PREFIX = "nn.Module: "


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _matches(name: str, pattern: str, glob: bool) -> bool:
    names = (name, name[len(MODULE_PREFIX) :]) if name.startswith(MODULE_PREFIX) else (name,)
    return any(fnmatch.fnmatchcase(s, pattern) if glob else s == pattern for s in names)


def module_mask(table: EventTable, g: ExecutionGraph, pattern: str) -> np.ndarray:
    """Per node: does it run inside a CPU range (of ``table``) whose name matches ``pattern``
    (see ``Edit.module``) on its rank and thread, or was it launched by such a node?"""
    glob = _is_glob(pattern)
    c, n = table.cols, g.nodes
    name_ok = np.array([_matches(s, pattern, glob) for s in table.names], dtype=bool)
    mask = np.zeros(g.n_nodes, dtype=bool)
    ts_rel = g.window_start - table.t0
    for rank in g.ranks:
        rows = table.window_rows(rank, g)
        rows = rows[name_ok[c["name"][rows]] & (c["cls"][rows] == EvClass.CPU)]
        if not len(rows):
            continue
        mine = np.flatnonzero((n["rank"] == rank) & ~n["on_gpu"] & (n["category"] != Category.BARRIER))
        start, end, tid = n["start"][mine], n["start"][mine] + n["dur"][mine], n["tid"][mine]
        for r in rows:
            lo = c["ts"][r] - ts_rel
            hi = lo + c["dur"][r]
            mask[mine[(start >= lo - 0.5) & (end <= hi + 0.5) & (tid == c["tid"][r])]] = True
    e = g.edges
    launched = (e["kind"] == EdgeKind.LAUNCH) & mask[e["src"]]
    mask[e["dst"][launched]] = True
    return mask


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
    (``phase=`` or ``module=``) scales the time between two of its ops on a thread too: that is
    the own time of the ops and ranges of the region (an op's work between its children)."""
    w = g.edges["weight"].astype(np.float64).copy()
    touched = []
    for e in edits:
        region = (e.phase is not None or e.module is not None) and e.scale != 1.0 and not e.gap
        if not (e.detach or e.gap or region):
            continue
        from_sel, to_sel = _edge_ends(g, e, phases, table)
        if region:
            ids = np.flatnonzero(from_sel & to_sel & (g.edges["kind"] == EdgeKind.PROGRAM_ORDER) & (w > 0))
            w[ids] *= e.scale
            touched.append(ids)
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
    step start to its release scaled, then delay_ms added."""
    rel = g.release.astype(np.float64).copy()
    touched = []
    for e in edits:
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(durations, edge latencies, releases, edited node ids, edited edge ids) after all the edits;
    nodes whose leading untraced time changed count among the edited nodes."""
    d, ids = edited_durations(g, edits, phases, table)
    w, eids = edited_weights(g, edits, phases, table)
    rel, rids = edited_releases(g, edits, phases, table)
    return d, w, rel, np.union1d(ids, rids), eids


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
    d, w, rel, ids, eids = apply_edits(g, edits, phases, table)
    if not len(ids) and not len(eids):
        raise OracleError("edit selects no node of the graph")
    return WhatIf(base=base or run_cpm(g), edited=run_cpm(g, d, w, rel), ids=ids)


def single_node_makespans(g: ExecutionGraph, ids: np.ndarray, delta_us: np.ndarray | float, base: CPMResult | None = None) -> np.ndarray:
    """The makespan after each single edit ``ids[i]`` += ``delta_us[i]`` (µs), exact, vectorised.

    Lengthening: max(M, M - slack + d). Shortening a node with slack changes nothing; shortening
    one without slack is recomputed exactly (one compiled forward pass per such edit)."""
    r = base or run_cpm(g)
    ids = np.asarray(ids, dtype=np.int64)
    delta = np.broadcast_to(np.asarray(delta_us, dtype=np.float64), ids.shape)
    m = r.makespan
    out = np.maximum(m, m - r.slack[ids] + np.maximum(delta, -g.nodes["mdur"][ids]))
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
    out = np.maximum(m, m - slack + np.maximum(delta, -w[eids]))
    for i in np.flatnonzero((delta < 0) & (slack <= 1e-3 + 1e-9 * m)):
        w2 = w.copy()
        w2[eids[i]] = max(w2[eids[i]] + delta[i], 0.0)
        out[i] = run_cpm(g, None, w2).makespan
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

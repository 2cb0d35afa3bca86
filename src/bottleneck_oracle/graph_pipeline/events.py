"""Trace files -> a columnar event table (numpy), one table for all ranks.

Only the events the graph needs are materialised: complete ("X") events of the
categories in ``fields``, fwdbwd flow endpoints and ProfilerStep markers. All
times are microseconds relative to ``EventTable.t0`` (the earliest event of all
files), which keeps float64 resolution below 1 ns.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import gzip
import io
import json
import math
import mmap
import os
import re
import stat
import tempfile
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, overload

import numba
import numpy as np
import orjson

from bottleneck_oracle.errors import OracleWarning, TraceError
from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline import scan
from bottleneck_oracle.graph_pipeline.arrays import SharedArena, groups, isin_small, span_positions
from bottleneck_oracle.graph_pipeline.engine import Engine, LocalEngine
from bottleneck_oracle.graph_pipeline.schema import CollectiveKind, collective_kind

if TYPE_CHECKING:
    from bottleneck_oracle.graph_pipeline.clocks import ClockReport
    from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph

MAX_SPAN_US = 7 * 24 * 3600 * 1e6  # no event of a trace lies further from the rest, or lasts longer
MAX_TS_US = 2.0**53  # µs: timestamps float64 holds to the µs (285 years from the epoch); no event lies beyond
MAX_RANK = 2**20  # ranks are below this (a million; per-rank arrays are sized by the largest rank)
MAX_STEP = 2**31 - 1  # ProfilerStep numbers are at most this (a step counter that reached it ran for centuries)
MAX_TRACE_BYTES = 16 * 2**30  # refuse traces whose decompressed JSON exceeds this (bytes)
MAX_GZIP_RATIO = 100  # trace JSON compresses 10-30x; a gzip stream inflating more than this is a bomb ...
BOMB_FLOOR = 64 * 2**20  # ... once it has inflated past this many bytes (small, repetitive files stay readable)
PARALLEL_BYTES = 32 * 2**20  # parse a folder in parallel above this many bytes on disk
FILES_PER_TASK = 16  # rank files parsed by one task of a Dask cluster (each task costs the scheduler a round trip)
SPLIT_BYTES = 64 * 2**20  # one trace file of this many JSON bytes is scanned in parts, one thread each
MAX_SCAN_THREADS = 8  # (the scan reads memory at a few hundred MB/s a thread: more threads gain little)
QUEUE_MIN_DEPTH = 256  # launches a device held at most before its queue is taken to have a ceiling ...
QUEUE_FULL = 0.9  # ... a launch made while the device held this share of that ceiling found the queue full ...
QUEUE_WAIT_MIN_US = 50.0  # µs: ... and if this long, may have waited for room ...
QUEUE_AHEAD_US = 1000.0  # ... if what it launched started this long after it returned (work was queued ahead) ...
QUEUE_WAKE_US = 15.0  # ... and it returned within this of the end of a device op of its device (that op made room)
RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_DEVICE_PROCESS = re.compile(F.DEVICE_PROCESS_PATTERN, re.IGNORECASE)
_RUNTIME_PROCESS = re.compile(F.RUNTIME_PROCESS_PATTERN, re.IGNORECASE)
_RANK_FOLDER = re.compile(r"(?:rank[-_]?)?(\d+)", re.IGNORECASE)


class EvClass(IntEnum):
    CPU = 0  # cpu_op / user_annotation / python_function on a CPU thread
    RUNTIME = 1  # CUDA runtime / driver call
    KERNEL = 2
    MEMCPY = 3
    MEMSET = 4
    GPU_SYNC = 5  # GPU-side record of a CUDA sync (cuda_sync category)


_CAT_CLASS: dict[str, EvClass] = {}
for _cats, _cls in (
    (F.CPU_CATS, EvClass.CPU),
    (F.RUNTIME_CATS, EvClass.RUNTIME),
    (F.KERNEL_CATS, EvClass.KERNEL),
    (F.MEMCPY_CATS, EvClass.MEMCPY),
    (F.MEMSET_CATS, EvClass.MEMSET),
    (F.GPU_SYNC_CATS, EvClass.GPU_SYNC),
):
    for _c in _cats:
        _CAT_CLASS[_c] = _cls

GPU_SIDE = (EvClass.KERNEL, EvClass.MEMCPY, EvClass.MEMSET, EvClass.GPU_SYNC)  # recorded on a GPU timeline

SYNC_KINDS = ("Context Sync", "Stream Sync", "Event Sync", "Stream Wait Event")


class _HashLookup:
    """Event class of a category, looked up by the scanner's hash of the category's bytes."""

    def __init__(self, mapping: dict[str, int]) -> None:
        items = sorted((scan.fnv1a(k.encode()), v) for k, v in mapping.items())
        self.keys = np.array([k for k, _ in items], dtype=np.uint64)
        self.values = np.array([v for _, v in items], dtype=np.int64)

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """The class of each hash (-1: a category not in the mapping): one comparison per known
        category (a dozen), cheaper than a binary search of each of millions of events."""
        out = np.full(len(hashes), -1, dtype=np.int64)
        for k, v in zip(self.keys.tolist(), self.values.tolist()):
            hit = hashes == np.uint64(k)
            if hit.any():
                out[hit] = v
        return out


_CAT_BY_HASH = _HashLookup({k: int(v) for k, v in _CAT_CLASS.items()})
_FLOW_HASHES = np.array([scan.fnv1a(c.encode()) for c in F.FLOW_CATS], dtype=np.uint64)
_LAUNCH_FLOW_HASHES = np.array([scan.fnv1a(c.encode()) for c in F.LAUNCH_FLOW_CATS], dtype=np.uint64)
_RANGE_HASHES = np.array([scan.fnv1a(c.encode()) for c in F.RANGE_CATS], dtype=np.uint64)


@dataclass(slots=True)
class Step:
    """One ProfilerStep#N span on one rank (times relative to EventTable.t0)."""

    rank: int
    number: int
    start: float
    end: float
    pid: int
    tid: int

    @property
    def span(self) -> float:
        return self.end - self.start


def _renumbered(arena: SharedArena, rows_of: np.ndarray, perm: np.ndarray, new: np.ndarray) -> np.ndarray:
    """A per-row column of rows (-1: none) in a new layout: row i of it is ``new[rows_of[perm[i]]]``."""
    before = rows_of[perm]
    out = arena.take(new, np.maximum(before, 0))
    out[before < 0] = -1
    return out


@dataclass(slots=True)
class EventTable:
    """Columnar events of one or more rank files. Every column has one row per event."""

    t0: float  # absolute µs of time zero
    names: list[str]
    cols: dict[str, np.ndarray]
    steps: list[Step]
    flows: dict[str, np.ndarray]  # fwdbwd flow endpoints: rank, pid, tid, ts, id, is_start
    files: dict[int, str]  # rank -> file path
    meta: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> distributedInfo
    thread_names: dict[tuple[int, int, int], str] = field(default_factory=dict)
    """(rank, pid, tid) -> the thread's or GPU stream's name in the trace's metadata."""
    data_deps: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    """(producer row, consumer row) pairs of CPU ops from a PyTorch execution trace (et.attach)."""
    clocks: ClockReport | None = None
    """Clock alignment across hosts (clocks.align): per host its ranks and the offset applied, and
    warnings; None where nothing was aligned or suspected."""
    inputs: dict[int, dict[str, Any]] = field(default_factory=dict)
    """rank -> what its files say of themselves beyond the events: ``numbered`` (per file, the
    events its exporter numbered with Ev Idx that it holds, and the first and last number: gaps
    mean sampled or removed events), ``unknown_device_events``, ``process_names`` (pid -> name),
    ``devices`` (the device models its files' ``deviceProperties`` name), ``steps_from`` (where its
    steps are not its ProfilerStep markers: ``{"name": the host op that cuts them, "at": "end"``
    (the optimizer's steps: _optimizer_steps) or ``"start"`` (--steps-at: _named_steps)``}``)."""
    execution_traces: list[dict[str, Any]] = field(default_factory=list)
    """Per attached execution trace: path, rank, how the rank was told, joined / op nodes (et.attach)."""
    by_rank_ts: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    """Cached (rows sorted by rank then anchor, their rank, their anchor) for window look-ups."""
    launcher: np.ndarray | None = None
    """Cached row of the runtime call that launched each GPU op (-1: none, or not a GPU op)."""
    streams: np.ndarray | None = None
    """Cached per row: the row of the GPU op before it on its stream (-1: none, or not a GPU op)."""
    queued: np.ndarray | None = None
    """Cached per row: for a launch that waited for room in a full device queue, the row of the op that made room (queue_waits)."""
    facts_cache: dict[str, Any] | None = None
    """Cached per-rank indexes of facts.py (device ops by launch and by start; long host ops)."""
    lookups: dict[str, Any] = field(default_factory=dict)
    """Cached look-ups that every step's graph reads (window.py, edges.py): flags of every name,
    the steps by number, the flows by rank and time; each says what it was computed from."""
    layout: np.ndarray | None = None
    """Where ``share`` moved the rows: per row, the row it had as read (None: as read). Every
    result is the same either way: windows list their events in the order read, and ties between
    rows are broken by that order."""
    flow_layout: np.ndarray | None = None
    """The same for the flow endpoints (``flows``): per endpoint, its place as read."""

    def drop_caches(self) -> None:
        """Forget the look-up caches (rebuilt when next asked for): memory back once graphs are built."""
        self.by_rank_ts = self.launcher = self.streams = self.queued = self.facts_cache = None
        self.lookups = {}

    def share(self) -> None:
        """Move the columns and every look-up the steps' graphs read into memory shared with the
        processes this one forks next (arrays.SharedArena), the rows laid out step by step: a
        forked step worker then counts in its resident size the pages of its own steps' rows, not
        every page of the table. (Fork copies the page tables of private memory, so a child starts
        out resident in all of it; a shared mapping's pages count once read, and the kernel maps
        them 16 at a time: a step's rows spread across every rank's block would still be read
        whole.) The look-ups are computed first and renumbered, not recomputed; the values, and
        every answer, stay the same."""
        from bottleneck_oracle.graph_pipeline.edges import flow_index, flow_spans, lay_out_flows
        from bottleneck_oracle.graph_pipeline.facts import index_facts
        from bottleneck_oracle.graph_pipeline.window import table_lookups

        self.index()
        self.launchers()
        self.stream_predecessors(np.zeros(0, dtype=np.int64))
        self.queue_waits()
        table_lookups(self)
        index_facts(self)
        self.lookups.pop("flows", None)  # (made again below on the moved flows, which it is keyed on)
        assert self.by_rank_ts is not None and self.launcher is not None and self.streams is not None and self.facts_cache is not None
        assert self.queued is not None
        arena = SharedArena(
            2 * SharedArena.size_of((self.cols, self.flows, self.by_rank_ts, self.launcher, self.streams, self.queued, self.facts_cache))
        )
        if self.layout is None:  # (shared before: its columns are there still; the look-ups made since move)
            perm = self._step_major()
            new = np.empty_like(perm)
            new[perm] = np.arange(len(perm))
            # two columns at a time, each original let go once copied: filling new shared pages is most of the cost
            with ThreadPoolExecutor(2) as pool:
                for k, v in zip(list(self.cols), pool.map(lambda k: arena.take(self.cols[k], perm), list(self.cols))):
                    self.cols[k] = v
            order, rank_s, anchor_s = self.by_rank_ts
            self.by_rank_ts = (arena.take(new, order), rank_s, anchor_s)
            del order, rank_s, anchor_s
            self.launcher = _renumbered(arena, self.launcher, perm, new)
            self.streams = _renumbered(arena, self.streams, perm, new)
            self.queued = _renumbered(arena, self.queued, perm, new)
            self.facts_cache["long_host"] = {r: (new[rows], d) for r, (rows, d) in self.facts_cache["long_host"].items()}
            self.facts_cache["launch"] = tuple(
                np.sort(new[rows]) for rows in self.facts_cache["launch"]
            )  # (sorted: isin_sorted reads them)
            self.data_deps = new[self.data_deps]
            del new
            self.layout = arena.move(perm)
            lay_out_flows(self)
        self.by_rank_ts = arena.move(self.by_rank_ts)
        self.launcher, self.streams, self.queued = arena.move(self.launcher), arena.move(self.streams), arena.move(self.queued)
        arena.move(self.facts_cache)
        arena.move(self.flows)
        self.flow_layout = arena.move(self.flow_layout)
        flow_index(self)
        self._step_spans()
        arena.move(self.lookups)
        flow_spans(self)  # (after the move: it is keyed on the moved flow index)
        arena.move(self.lookups)

    def _step_spans(self) -> None:
        """Where each rank's step is in the index (``rows_between`` of a step's span then reads
        only its own part of the index: a step worker's pages, not every rank's)."""
        order, rank_s, ts_s = self.index()
        spans = [(s.rank, s.start, s.end) for s in self.steps]
        self.lookups["spans"] = (order, dict(zip(spans, span_positions(rank_s, ts_s, spans))))

    def _step_major(self) -> np.ndarray:
        """The rows in step order (every rank's rows of the first step, then of the next, ...,
        then the rows in no step), each step's in table order: per new row, its row now."""
        numbers = {n: i for i, n in enumerate(sorted({s.number for s in self.steps}))}
        block = np.full(len(self), len(numbers), dtype=np.int32)
        for s in self.steps:
            rows = self.rows_between(s.rank, s.start, s.end)
            block[rows] = np.minimum(block[rows], numbers[s.number])  # (a row in two steps' spans: the first)
        perm: np.ndarray = np.argsort(block, kind="stable")
        return perm

    def steps_of(self, number: int) -> list[Step]:
        """The ProfilerStep spans numbered ``number`` (every rank's), in table order: one look-up
        per step instead of a scan of every step of every rank."""
        index = self.lookups.get("steps")
        if index is None or index[0] != len(self.steps):
            by: dict[int, list[Step]] = {}
            for s in self.steps:
                by.setdefault(s.number, []).append(s)
            index = self.lookups["steps"] = (len(self.steps), by)
        return index[1].get(number, [])

    def launchers(self) -> np.ndarray:
        """Per row, the row of the runtime call that launched it: GPU ops and GPU-side sync records
        are joined to the runtime call of the same rank with the same correlation id (flows are
        incomplete in real traces); -1 for CPU events and GPU ops whose launch is not in the trace."""
        if self.launcher is None:
            c = self.cols
            corr, cls = c["correlation"], c["cls"]
            out = np.full(len(self), -1, dtype=np.int64)
            gpu = np.flatnonzero(np.isin(cls, GPU_SIDE) & (corr >= 0))
            rt = np.flatnonzero((cls == EvClass.RUNTIME) & (corr >= 0))
            if len(gpu) and len(rt):
                if self.layout is not None:  # (ties in the order read, whatever the layout)
                    rt = rt[np.argsort(self.layout[rt], kind="stable")]
                key = c["rank"][rt].astype(np.int64) * (1 << 40) + corr[rt]
                order = np.argsort(key, kind="stable")  # the first call of a duplicated id wins
                rt, key = rt[order], key[order]
                gkey = c["rank"][gpu].astype(np.int64) * (1 << 40) + corr[gpu]
                pos = np.minimum(np.searchsorted(key, gkey), len(rt) - 1)
                hit = key[pos] == gkey
                out[gpu[hit]] = rt[pos[hit]]
            self.launcher = out
        return self.launcher

    def queue_waits(self) -> np.ndarray:
        """Per row, for a runtime call that waited for room in its device's full launch queue, the
        row of the device op whose end made room; -1 otherwise. A device holds a bounded number of
        launches not yet done (CUDA about a thousand): a host that far ahead blocks in every launch
        until an op ends, so the host is paced by the device, not by its own work. A launch (a call
        whose device work is in the trace; a graph launch is one) is seen to have waited when
        - the launches of its device not yet done when it began were at least QUEUE_FULL of the most
          the device ever held, and that most was QUEUE_MIN_DEPTH or more (a ceiling the trace shows);
        - it lasted QUEUE_WAIT_MIN_US or longer, and what it launched started QUEUE_AHEAD_US or more
          after it returned;
        - it returned within QUEUE_WAKE_US after the end of an op of the same device (process).
        (A launch slowed by something else that happens to end near an op's end, with the queue far
        from full, is not one: resnet50_legacy's two 52-118 µs launches held 11 and 158 of 569.)"""
        if self.queued is not None:
            return self.queued
        c = self.cols
        out = np.full(len(self), -1, dtype=np.int64)
        launcher = self.launchers()
        ops = np.flatnonzero(np.isin(c["cls"], GPU_SIDE[:3]))
        launched = ops[launcher[ops] >= 0]
        if len(launched):
            ts, end = c["ts"], c["ts"] + c["dur"]
            calls, first = np.unique(launcher[launched], return_inverse=True)
            op_start = np.full(len(calls), np.inf)
            np.minimum.at(op_start, first, ts[launched])
            done = np.full(len(calls), -np.inf)  # when the last op of each launch ended
            np.maximum.at(done, first, end[launched])
            op_of = np.full(len(calls), -1, dtype=np.int64)
            op_of[first[::-1]] = launched[::-1]  # (any op of the call names its device)
            device = c["rank"].astype(np.int64) * (1 << 32) + (c["pid"].astype(np.int64) & 0xFFFFFFFF)
            full = np.zeros(len(calls), dtype=bool)
            for _, mine in groups(device[op_of]):  # launches not yet done, at each launch of a device
                t_launch, t_done = np.sort(ts[calls[mine]]), np.sort(done[mine])
                held = np.searchsorted(t_launch, ts[calls[mine]], side="left") - np.searchsorted(t_done, ts[calls[mine]], side="right")
                most = int(held.max())
                full[mine] = (most >= QUEUE_MIN_DEPTH) & (held >= QUEUE_FULL * most)
            back = end[calls]
            cand = full & (c["dur"][calls] >= QUEUE_WAIT_MIN_US) & (op_start >= back + QUEUE_AHEAD_US)
            if cand.any():
                calls, back, dev_op = calls[cand], back[cand], op_of[cand]
                rel = np.full(len(calls), -1, dtype=np.int64)
                for d, mine in groups(device[dev_op]):  # the last op of the call's device that ended by its return
                    on = ops[device[ops] == d]
                    on = on[np.lexsort((self.layout[on] if self.layout is not None else on, end[on]))]  # (ties: as read)
                    pos = np.searchsorted(end[on], back[mine], side="right") - 1
                    rel[mine] = np.where(pos >= 0, on[np.maximum(pos, 0)], -1)
                ok = rel >= 0
                ok &= back - end[np.maximum(rel, 0)] <= QUEUE_WAKE_US
                out[calls[ok]] = rel[ok]
        self.queued = out
        return out

    def anchors(self) -> np.ndarray:
        """Per row, the time (µs) that decides which step an event belongs to: its start, or for a
        GPU op the start of the call that launched it. GPU work belongs to the step whose CPU
        launched it, not to the step it happened to start in (the GPU can run a step behind).
        A GPU op with no launch in the trace that ran before the first traced launch's op on its
        rank, or whose correlation id is below every traced runtime call's of its rank (the runtime
        numbers its calls in the order they are made: it was launched before the first call the
        trace holds, though it may run long after, behind the work queued with it: diff_test's 610
        ops of the step before the trace, 39 ms of them), was queued before the profiler started:
        it belongs to no step (-inf), and the first step's period starts where it ends. Any other was
        launched no later than the next op on its stream whose launch is traced (a stream runs its
        ops in launch order), nor than its own start: the earlier of the two (a trace whose thread
        that launched the backward pass was filtered out keeps those kernels in their step, where
        the device runs a step behind and their own starts fall in the next)."""
        launcher = self.launchers()
        c = self.cols
        ts, corr = c["ts"], c["correlation"]
        anchor = np.where(launcher >= 0, ts[np.maximum(launcher, 0)], ts)
        orphan = np.isin(c["cls"], GPU_SIDE) & (launcher < 0)
        if orphan.any():
            launched = np.flatnonzero(launcher >= 0)
            calls = np.flatnonzero((c["cls"] == EvClass.RUNTIME) & (corr > 0))  # (ids above 0: 0 is none)
            for r in np.unique(c["rank"][orphan]).tolist():
                mine = launched[c["rank"][launched] == r]
                if len(mine):
                    ids = corr[calls[c["rank"][calls] == r]]  # (none where every id of the rank is 0: no id to read)
                    first_call = ids.min() if len(ids) else 0
                    early = orphan & (c["rank"] == r) & ((ts < ts[mine].min()) | ((corr > 0) & (corr < first_call)))
                    anchor[early] = -np.inf
            late = np.flatnonzero(orphan & np.isfinite(anchor))
            if len(late):
                anchor[late] = np.minimum(anchor[late], self._next_launched_on_stream(late, launcher, anchor))
        return anchor

    def _next_launched_on_stream(self, rows: np.ndarray, launcher: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        """Per row of ``rows`` (device ops), the anchor of the next op after it on its stream whose
        launch is traced (inf: none)."""
        order, same = self._stream_order()
        value = np.where(launcher[order] >= 0, anchor[order], np.inf)
        # the next traced launch's anchor at or after each position, within its stream (a reversed running
        # minimum restarted per stream: streams are blocks of ``order``)
        nxt = np.full(len(order), np.inf)
        bounds = [0, *(np.flatnonzero(~same) + 1).tolist(), len(order)]
        for lo, hi in zip(bounds, bounds[1:]):
            nxt[lo:hi] = np.minimum.accumulate(value[lo:hi][::-1])[::-1]
        after = np.full(len(order), np.inf)
        after[:-1] = np.where(same, nxt[1:], np.inf)
        pos = np.empty(len(self), dtype=np.int64)
        pos[order] = np.arange(len(order))
        out: np.ndarray = after[pos[rows]]
        return out

    def _stream_order(self) -> tuple[np.ndarray, np.ndarray]:
        """The GPU ops' rows in stream order (rank, device, stream, then start time; ties in the
        order read, whatever the layout), and per neighbouring pair whether both are on one stream."""
        c = self.cols
        gpu = np.flatnonzero(np.isin(c["cls"], GPU_SIDE[:3]))
        if self.layout is not None:
            gpu = gpu[np.argsort(self.layout[gpu], kind="stable")]
        order = gpu[np.lexsort((c["ts"][gpu], c["tid"][gpu], c["pid"][gpu], c["rank"][gpu]))]
        same = (c["rank"][order[1:]] == c["rank"][order[:-1]]) & (c["pid"][order[1:]] == c["pid"][order[:-1]])
        same &= c["tid"][order[1:]] == c["tid"][order[:-1]]
        return order, same

    def stream_predecessors(self, rows: np.ndarray) -> np.ndarray:
        """Per GPU op in ``rows``, the row of the op that ran before it on its stream (same rank,
        device and stream, by start time), -1 for the first one."""
        if self.streams is None:
            order, same = self._stream_order()
            prev = np.full(len(self), -1, dtype=np.int64)
            prev[order[1:][same]] = order[:-1][same]
            self.streams = prev
        out: np.ndarray = self.streams[rows]
        return out

    def index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows sorted by rank then anchor, their rank, their anchor), computed once."""
        if self.by_rank_ts is None:
            anchor = self.anchors()
            order = _by_group_then(self.cols["rank"], anchor)
            self.by_rank_ts = (order, self.cols["rank"][order], anchor[order])
        return self.by_rank_ts

    def rows_between(self, rank: int, start: float, end: float) -> np.ndarray:
        """Rows of the events of ``rank`` whose anchor (see ``anchors``) is in [start, end), in
        anchor order (ties in table order): CPU events that start there and the GPU ops they launched."""
        order, rank_s, ts_s = self.index()
        known: tuple[np.ndarray, dict[tuple[int, float, float], tuple[int, int]]] | None = self.lookups.get("spans")
        if known is not None and known[0] is order and (rank, start, end) in known[1]:  # a step's span (share)
            a, b = known[1][rank, start, end]
            return order[a:b]
        ((a, b),) = span_positions(rank_s, ts_s, [(rank, start, end)])
        return order[a:b]

    def window_rows(self, rank: int, g: ExecutionGraph) -> np.ndarray:
        """Rows of the events of ``rank`` that start in the window of ``g`` (an ExecutionGraph:
        from its start to its longest measured span, or to its last step's end where it holds
        several steps, 1 µs either side), in table order."""
        offset = g.window_start - self.t0
        span = max([*g.measured.values(), *(float(v) for v in g.info.step_end_us.values())], default=0.0)
        return self.rows_between(rank, offset - 1.0, offset + span + 1.0)

    def __len__(self) -> int:
        return len(self.cols["ts"])

    @property
    def ranks(self) -> list[int]:
        return sorted(self.files)


_CHUNK = 64 * 2**20  # bytes read at a time from a gzip stream (the whole trace is never asked for at once)


def _too_large(path: Path, inflated: bool) -> TraceError:
    what = "decompresses to more than" if inflated else "larger than"
    return TraceError(path, f"{what} {MAX_TRACE_BYTES // 2**30} GiB of JSON; split the trace by rank or window")


GZIP_TRAILER = 8
"""Bytes of a gzip stream's trailer (CRC-32, size): zeros there can be data; a longer run of
zeros ending the file is space a file system left unwritten (_zero_tail_on_disk)."""


def _zero_tail_on_disk(fh: BinaryIO) -> int:
    """How many zero bytes end the open file, where they are more than a gzip trailer's worth
    (0 otherwise): looked for a MiB at a time from the end."""
    size = os.fstat(fh.fileno()).st_size
    zeros = size - _end_before_zeros(size, lambda lo, hi: os.pread(fh.fileno(), hi - lo, lo))
    return zeros if zeros > GZIP_TRAILER else 0


def _end_before_zeros(size: int, read: Callable[[int, int], bytes]) -> int:
    """Where ``size`` bytes end but for a tail of zero bytes, ``read(lo, hi)`` giving bytes
    [lo, hi): the last byte first (every file but a padded one ends in another), then a MiB at a
    time from the end."""
    if not size or read(size - 1, size) != b"\0":
        return size
    end = size
    while end > 0:
        part = np.frombuffer(read(max(0, end - (1 << 20)), end), dtype=np.uint8)
        nz = np.flatnonzero(part)
        if len(nz):
            return end - len(part) + int(nz[-1]) + 1
        end -= len(part)
    return 0


class _Head(io.RawIOBase):
    """The first ``size`` bytes of an open file, as a file: a gzip stream without the zeros a
    failed file system left after it (gzip would inflate them into garbage after a cut)."""

    def __init__(self, fh: BinaryIO, size: int) -> None:
        self._fh, self._size, self._pos = fh, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fh.fileno()

    def readinto(self, b: Any) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        data = os.pread(self._fh.fileno(), n, self._pos)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def _gzip_source(fh: BinaryIO) -> BinaryIO:
    """The open gzip file as its stream: without a tail of zeros (_zero_tail_on_disk)."""
    zeros = _zero_tail_on_disk(fh)
    if not zeros:
        return fh
    return io.BufferedReader(_Head(fh, os.fstat(fh.fileno()).st_size - zeros), 1 << 20)


def _check_inflation(path: Path, fh: BinaryIO, total: int) -> None:
    """Refuse a gzip stream that has inflated ``total`` bytes from the ``fh.tell()`` bytes read so
    far: past MAX_TRACE_BYTES, or past BOMB_FLOOR at more than MAX_GZIP_RATIO times its input
    (a decompression bomb is refused after tens of megabytes, not after filling the memory)."""
    if total > MAX_TRACE_BYTES:
        raise _too_large(path, inflated=True)
    if total > BOMB_FLOOR and total > MAX_GZIP_RATIO * max(fh.tell(), 1):
        raise TraceError(
            path,
            f"gzip data inflates more than {MAX_GZIP_RATIO}x ({fh.tell():,} bytes to over {total:,}): "
            "a decompression bomb, not a profiler trace",
        )


@contextmanager
def _read_errors(path: Path) -> Iterator[None]:
    """Errors of reading a trace file as one TraceError naming the file and the problem."""
    try:
        yield
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(path, f"corrupt or truncated gzip data ({exc.__class__.__name__}: {exc})") from None
    except MemoryError:
        raise TraceError(path, "not enough memory to read the trace (see the limits in the README)") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None


def read_bytes(path: Path) -> bytes | bytearray:
    """The JSON bytes of a .json or .json.gz file, raising TraceError with the problem named.

    Memory is asked for by size: a plain file's size is known before reading; a gzip stream is
    read into one buffer grown as it inflates (see _gunzip) and refused as soon as it passes
    MAX_TRACE_BYTES (a small file that inflates to gigabytes is a bomb, not a trace)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise TraceError(path, "a link to a missing file" if path.is_symlink() else "no such file") from None
    except OSError as exc:  # a link loop, a name too long, no permission
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise TraceError(path, "is a folder, expected a trace file")
    if not stat.S_ISREG(mode):
        raise TraceError(path, "is not a regular file (a FIFO, device or socket); pass a trace file")
    raw: bytes | bytearray
    with _read_errors(path), open(path, "rb") as fh:
        head = fh.read(2)
        fh.seek(0)
        if head == b"\x1f\x8b":
            raw = _gunzip(path, _gzip_source(fh))
        else:
            if os.fstat(fh.fileno()).st_size > MAX_TRACE_BYTES:
                raise _too_large(path, inflated=False)
            raw = fh.read()
    if not raw or raw.isspace():  # (strip() would copy a gigabyte to find out)
        raise TraceError(path, "file is empty")
    return raw


UTF8_BOM = b"\xef\xbb\xbf"
_FOREIGN = (
    (b"SQLite format 3\x00", "an SQLite database (Nsight Systems' SQLite export?)"),
    (b"PK\x03\x04", "a zip archive (a torch.save file, or traces zipped together: unpack the trace)"),
    (b"\x28\xb5\x2f\xfd", "compressed with zstd (decompress it; gzip is read as it is)"),
    (b"BZh", "compressed with bzip2 (decompress it; gzip is read as it is)"),
    (b"\xfd7zXZ\x00", "compressed with xz (decompress it; gzip is read as it is)"),
    (b"\x80", "a Python pickle (never unpickled here)"),
    (b"\xff\xfe", "UTF-16 text (PowerShell's > writes it; save the trace as UTF-8)"),
    (b"\xfe\xff", "UTF-16 text (save the trace as UTF-8)"),
)


def _starts_as_json(path: Path, head: bytes) -> None:
    """Refuse a file whose first bytes cannot open a JSON trace, naming what it looks like: a
    format a user may have been handed instead of a trace-event JSON (an Nsight Systems export,
    a Perfetto or XPlane protobuf, another compression)."""
    first = head.removeprefix(UTF8_BOM).lstrip()[:1]
    if first in (b"{", b"["):
        return
    what = next((name for magic, name in _FOREIGN if head.startswith(magic)), None)
    if what is None:
        text = sum(32 <= b < 127 or b in (9, 10, 13) for b in head) >= 0.9 * len(head)
        what = (
            f"text that starts with {head.lstrip()[:12].decode('ascii', 'replace')!r}"
            if text
            else "a binary file (a Perfetto or XPlane protobuf, an Nsight Systems report?)"
        )
    raise TraceError(path, f"not a JSON trace: {what}; this tool reads trace-event JSON (torch.profiler / Kineto), plain or gzip")


MAP_BYTES = 256 * 2**20
"""Trace files at least this large (on disk) are read through a file mapping (map_trace)."""


class MappedTrace:
    """A trace's JSON bytes through a read-only file mapping: the file itself, or a gzip trace
    decompressed into an unlinked temporary file. Slicing gives bytes, like a bytes object; the
    pages already scanned can be given back (``release``), so a trace of gigabytes is never held
    whole — what stays is what was read lately."""

    def __init__(self, fh: BinaryIO, length: int = 0) -> None:
        self._fh = fh
        self.map = mmap.mmap(fh.fileno(), length, access=mmap.ACCESS_READ)

    def truncated(self, length: int) -> MappedTrace:
        """The same trace's first ``length`` bytes (a mapping of that many; this one closed)."""
        out = MappedTrace(self._fh, length)
        self.map.close()
        return out

    def __len__(self) -> int:
        return len(self.map)

    @overload
    def __getitem__(self, item: int) -> int: ...
    @overload
    def __getitem__(self, item: slice) -> bytes: ...
    def __getitem__(self, item: int | slice) -> int | bytes:
        return self.map[item]

    def release(self, end: int) -> None:
        """Give back the resident pages of bytes [0, end) (they are read again if touched)."""
        self.release_range(0, end)

    def release_range(self, start: int, end: int) -> None:
        """Give back the resident pages that lie wholly inside bytes [start, end)."""
        start += -start % mmap.PAGESIZE
        end -= end % mmap.PAGESIZE
        if end > start and hasattr(self.map, "madvise"):
            self.map.madvise(mmap.MADV_DONTNEED, start, end - start)


TraceBytes = bytes | bytearray | MappedTrace
"""A trace file's JSON: read into memory, or mapped (map_trace). Slices of each are bytes."""


RELEASE_EVERY = 1024
"""Reads of single events (names, args) between two give-backs of a mapped trace's pages."""


def _give_back(raw: TraceBytes, end: int | None = None) -> None:
    """After reads here and there in a mapped trace (names, args of single events): give its pages
    back, those before byte ``end`` or all (a 1 GiB trace had 660 MiB resident again after
    reading its names and thread names; _parse_file turns the kernel's read-ahead off for them)."""
    if isinstance(raw, MappedTrace):
        raw.release(len(raw) if end is None else end)


def map_trace(path: Path) -> TraceBytes:
    """``read_bytes``, but a file of MAP_BYTES or more on disk comes back as a MappedTrace of a
    private, unlinked temporary copy: a plain file copied by the kernel (copy_file_range), a gzip
    file decompressed block by block (same limits and errors as read_bytes). The input itself is
    never mapped: a mapped file that shrinks (a profiler exporting it again, NFS) kills the
    reader with SIGBUS, and nothing can turn that into an error message."""
    size = _size(path)
    if size < MAP_BYTES or not hasattr(mmap, "MADV_DONTNEED"):
        return read_bytes(path)
    with _read_errors(path), open(path, "rb") as src:
        head = src.read(1 << 16)
        src.seek(0)
        gz = head[:2] == b"\x1f\x8b"
        if not gz and size > MAX_TRACE_BYTES:
            raise _too_large(path, inflated=False)
        if not gz:  # before gigabytes are copied: zeros, a sparse file, binary junk
            _starts_as_json(path, head[: 1 << 12])
        tmp = tempfile.TemporaryFile(prefix="bottleneck-oracle-")  # noqa: SIM115 - unlinked; closed with the mapping
        try:
            total = _copy_plain(path, src, tmp, size) if not gz else _copy_gunzipped(path, _gzip_source(src), tmp)
            try:
                tmp.flush()
            except OSError as exc:
                raise _spool_error(path, exc) from None
        except BaseException:
            tmp.close()
            raise
        if total == 0:
            tmp.close()
            raise TraceError(path, "file is empty")
        return MappedTrace(tmp)


def _spool_error(path: Path, exc: OSError) -> TraceError:
    return TraceError(
        path,
        f"cannot copy the trace into the temporary folder {tempfile.gettempdir()} ({exc.strerror or exc}); "
        "set TMPDIR to a folder with room for it",
    )


def _copy_plain(path: Path, src: BinaryIO, tmp: BinaryIO, size: int) -> int:
    """Copy ``size`` bytes of the open file ``src`` into ``tmp`` (in the kernel where it can);
    TraceError if the file ends sooner (it shrank while being read)."""
    done = 0
    fast = hasattr(os, "copy_file_range")
    while done < size:
        want = min(_CHUNK, size - done)
        try:
            k = os.copy_file_range(src.fileno(), tmp.fileno(), want, done, done) if fast else 0
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise _spool_error(path, exc) from None
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            fast, k = False, 0
        if not fast:
            chunk = os.pread(src.fileno(), want, done)
            try:
                k = os.pwrite(tmp.fileno(), chunk, done) if chunk else 0
            except OSError as exc:
                raise _spool_error(path, exc) from None
        if k == 0:
            raise TraceError(path, f"the file shrank while it was read ({size:,} bytes, then {done:,}): is it being rewritten?")
        done += k
    return done


def _copy_gunzipped(path: Path, src: BinaryIO, tmp: BinaryIO) -> int:
    """Decompress the open gzip file ``src`` into ``tmp`` block by block; the bytes written (a
    stream cut short: all it holds)."""
    total = 0
    with gzip.open(src, "rb") as gz:
        while True:
            try:
                chunk = gz.read(_CHUNK)
            except EOFError:  # cut short: start again and keep everything the stream holds
                tmp.seek(0)
                tmp.truncate()
                _inflate_prefix(path, src, sink=tmp)
                return tmp.tell()
            if not chunk:
                break
            total += len(chunk)
            _check_inflation(path, src, total)
            try:
                tmp.write(chunk)
            except OSError as exc:
                raise _spool_error(path, exc) from None
    return total


def _inflate_prefix(path: Path, fh: BinaryIO, sink: BinaryIO | None = None) -> bytearray:
    """Everything a gzip stream cut short decompresses to, from the start of ``fh`` (gzip's reader
    drops the last block it was inflating when the stream ends): into ``sink`` when given (the
    bytes are not also returned), with the same inflation limits; TraceError if that is nothing."""
    fh.seek(0)
    d = zlib.decompressobj(wbits=31)
    out = bytearray()
    total = 0
    while piece := fh.read(1 << 20):
        try:
            more = d.decompress(piece)
        except zlib.error:
            break  # (corrupt past here: what came before stands)
        total += len(more)
        _check_inflation(path, fh, total)
        if sink is None:
            out += more
        else:
            try:
                sink.write(more)
            except OSError as exc:
                raise _spool_error(path, exc) from None
        if d.eof:
            break
    if not total:
        raise TraceError(path, "corrupt or truncated gzip data: the stream ends before any of its data")
    return out


def _gunzip(path: Path, fh: BinaryIO) -> bytearray:
    """The decompressed bytes of an open gzip file, in one buffer grown as the data arrives: the
    gzip trailer's size (ISIZE) only sets the first block (up to _CHUNK), so a trailer that lies
    costs nothing; each block is filled in place (no list of chunks and their join) and the
    inflation is checked before every growth (refused beyond MAX_TRACE_BYTES, or as a bomb)."""
    size = os.fstat(fh.fileno()).st_size
    fh.seek(-4, os.SEEK_END)
    hint = int.from_bytes(fh.read(4), "little")
    fh.seek(0)
    # JSON compresses up to ~30x: a larger claimed ratio is a bomb or a wrapped size, not a plan
    first = hint if 0 < hint <= 64 * size else 4 * size
    buf = bytearray(min(max(first, 1 << 16), _CHUNK))
    n = 0
    with gzip.open(fh) as gz:
        while True:
            try:
                with memoryview(buf) as view:
                    k = gz.readinto(view[n:])
            except EOFError:  # the stream ends before its end marker: a trace cut short (_parse_file reads
                # its whole events): all that the stream holds
                del buf
                return _inflate_prefix(path, fh)
            if not k:
                break
            n += k
            if n == len(buf):  # full: is there more? (a truthful trailer ends here, with one empty read)
                try:
                    more = gz.read(min(max(len(buf), 1 << 20), _CHUNK))
                except EOFError:
                    del buf
                    return _inflate_prefix(path, fh)
                if not more:
                    break
                _check_inflation(path, fh, n + len(more))
                buf += more  # grown in place where the allocator can (large blocks are remapped, not copied)
                n += len(more)
                buf += bytes(min(max(len(buf) // 4, 1 << 20), _CHUNK))  # room for the next block, filled in place
    del buf[n:]
    return buf


def _decode(path: Path, raw: bytes | bytearray) -> object:
    try:
        return orjson.loads(raw[3:] if raw[:3] == UTF8_BOM else raw)
    except orjson.JSONDecodeError as exc:
        hint = "truncated JSON" if "unexpected end" in str(exc).lower() or "eof" in str(exc).lower() else "not valid JSON"
        raise TraceError(path, f"{hint} ({exc})") from None


_BARE_TOKEN = re.compile(r'("(?:[^"\\]|\\.)*")|(?<![\w."])-?(?:inf(?:inity)?|nan|NaN|Infinity|N/A)(?![\w])', re.IGNORECASE)
"""A JSON string (kept whole) or a bare non-JSON token outside one (replaced by null)."""


def _decode_one(raw: bytes | bytearray) -> object | None:
    """One object of a trace the scanner already validated (an event, the metadata around the
    events): orjson, else the standard library, which keeps what orjson refuses (a lone UTF-16
    surrogate, ``"\\ud800"``, that some profilers write in names); None if neither can (nesting
    deeper than either parser goes)."""
    try:
        out: object = orjson.loads(raw)
        return out
    except orjson.JSONDecodeError:
        pass
    text = bytes(raw).decode("utf-8", errors="replace")
    try:
        std: object = json.loads(text)
        return std
    except (ValueError, RecursionError):
        pass
    try:  # bare tokens JSON has not (Kineto once wrote a copy's bandwidth as inf, and N/A unquoted): null
        bare: object = json.loads(_BARE_TOKEN.sub(lambda m: m.group(1) or "null", text))
        return bare
    except (ValueError, RecursionError):
        return None


def read_json(path: Path) -> object:
    """Read and decode a .json or .json.gz file, raising TraceError with the problem named."""
    raw = read_bytes(path)
    _starts_as_json(path, bytes(raw[: 1 << 12]))
    return _decode(path, raw)


def rank_of(doc: dict[str, Any], path: Path, default: int | None) -> int:
    """Rank from distributedInfo.rank, else from a file name like rank-3.json.gz, else from a
    folder named like rank3 or 3 that holds the file. A rank is an integer in [0, MAX_RANK):
    anything else (negative, or beyond any job) is a TraceError, not a rank read another way."""
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and info.get("rank") is not None:
        r = info["rank"]
        if isinstance(r, str) and r.isascii() and r.isdigit():
            return _valid_rank(path, r, "distributedInfo.rank")
        if not isinstance(r, int) or isinstance(r, bool):  # a float beyond int64 (orjson's reading of 2**70), true, "one"
            raise TraceError(path, f"distributedInfo.rank is {str(r)[:40]!r}, not an integer rank")
        return _valid_rank(path, r, "distributedInfo.rank")
    m = RANK_IN_NAME.search(path.name)
    if m:
        return _valid_rank(path, m.group(1), "the rank in the file name")
    m = _RANK_FOLDER.fullmatch(path.parent.name)  # one subfolder per rank: rank3/trace.json, 3/trace.json
    if m:
        return _valid_rank(path, m.group(1), "the rank in the folder name")
    if default is not None:
        return default
    raise _unranked_error(path)


UNRANKED = -1
"""The rank of a folder's file that names none (load_events gives it one: _rank_unranked)."""


def _unranked_error(path: str | Path, why: str = "") -> TraceError:
    return TraceError(
        path,
        "cannot tell the rank: no distributedInfo.rank and no rank-N in the file name"
        f"{why} (name each rank's file rank-N.json.gz, or analyse one file alone)",
    )


def _rank_unranked(b: _Builder, first: list[tuple[str, set[int]]], ranked: list[str]) -> None:
    """Give a folder's file that names no rank rank 0 where every such file is one process's (the
    pids of its ProfilerStep markers, else of its host ops, shared with the first such file) and
    no file of the folder names a rank: a one-process job profiled in several windows, each
    written by ``tensorboard_trace_handler`` as ``<host>_<pid>.<time>.pt.trace.json`` (windows of
    one rank, read as such). Otherwise TraceError: two processes, or files with ranks beside it,
    cannot be told apart. ``first``: the first such file's path and pids; ``ranked``: paths of the
    folder's files that name a rank, read so far."""
    pids = {s[4] for s in b.steps} or {int(p) for part in b.parts for p in np.unique(part["pid"][part["cls"] == EvClass.CPU]).tolist()}
    if ranked:
        raise _unranked_error(b.path, f", beside files that name theirs ({ranked[0]})")
    if first and not pids & first[0][1]:
        raise _unranked_error(b.path, f", and it is another process's than {first[0][0]} (another run, or another rank?)")
    if not first:
        first.append((b.path, pids))
    b.rank = 0
    for part in b.parts:
        part["rank"][:] = 0
    b.flows["rank"][:] = 0
    b.steps = [(0, n, a, e, p, t) for _, n, a, e, p, t in b.steps]


def _valid_rank(path: Path, value: int | str, what: str) -> int:
    """``value`` as a rank; TraceError naming the file unless it is in [0, MAX_RANK)."""
    if isinstance(value, str):  # digits: a thousand of them would still convert, slowly
        value = int(value) if len(value) <= 12 else MAX_RANK
    if not 0 <= value < MAX_RANK:
        shown = str(value) if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
        raise TraceError(path, f"{what} is {shown}: a rank is an integer from 0 to {MAX_RANK - 1:,}")
    return value


def _step_number(name: str) -> int | None:
    """N of a ProfilerStep#N name (ASCII digits only); -1 for a number beyond MAX_STEP; None if
    the name is not a step marker."""
    digits = name[len(F.STEP_PREFIX) :]
    if not (digits.isascii() and digits.isdigit()):
        return None
    number = int(digits) if len(digits) <= 12 else -1
    return number if 0 <= number <= MAX_STEP else -1


def _first(args: dict[str, Any], keys: tuple[str, ...]) -> object:
    for k in keys:
        if k in args:
            return args[k]
    return None


def _sizes(d: object) -> list[int] | None:
    return d if isinstance(d, list) and d and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d) else None


def shape_flops(name: str, dims: object) -> float:
    """The FLOPs of a matmul, convolution or attention op as its input sizes give them ("Input Dims",
    ``record_shapes``): ``aten::mm`` [M, K] [K, N] 2MKN, ``aten::addmm`` (bias) [M, K] [K, N],
    ``aten::bmm``/``baddbmm`` [B, M, K] [B, K, N] 2BMKN; a convolution 2 x its input's elements x
    its weight's elements over its input channels (stride 1: the output's size is not written);
    attention [B, H, L, D] queries and [B, H, S, D] keys 4BHLSD. 0 for the ops that hold those
    (``aten::linear``, ``aten::matmul``: their inner op counts) and where the sizes are not known:
    the work the same op of the same program is given, to hold against another rank's."""
    if not isinstance(dims, list):
        return 0.0
    op = name.rsplit("::", 1)[-1]
    t = [_sizes(d) for d in dims]
    mats = [d for d in t if d is not None and len(d) >= 2]
    if op in ("mm", "addmm", "_scaled_mm") and len(mats) >= 2 and len(mats[-2]) == 2 and len(mats[-1]) == 2:
        (m, k), (_, n) = mats[-2], mats[-1]
        return 2.0 * m * k * n
    if op in ("bmm", "baddbmm", "addbmm") and len(mats) >= 2 and len(mats[-2]) == 3 and len(mats[-1]) == 3:
        (b, m, k), (_, _, n) = mats[-2], mats[-1]
        return 2.0 * b * m * k * n
    if ("conv" in op) and len(mats) >= 2 and len(mats[0]) >= 3 and len(mats[1]) == len(mats[0]) and mats[0][1] > 0:
        return 2.0 * math.prod(mats[0]) * math.prod(mats[1]) / mats[0][1]
    if "attention" in op and len(mats) >= 2 and len(mats[0]) == 4 and len(mats[1]) == 4:
        (b, h, l_q, d), (_, _, l_k, _) = mats[0], mats[1]
        return 4.0 * b * h * l_q * l_k * d
    return 0.0


def _prod(dims: object) -> float:
    if not isinstance(dims, list) or not dims:
        return math.nan
    first = dims[0]
    while isinstance(first, list) and first and isinstance(first[0], list):
        first = first[0]
    if not isinstance(first, list):
        return math.nan
    n = 1
    for d in first:
        if not isinstance(d, int):
            return math.nan
        n *= d
    return float(n)


def _arg(args: dict[str, Any], col: str) -> object:
    spec = F.ARG_SPECS[col]
    v = _first(args, spec.raw_names)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else spec.default


NEGATIVE_SHARE = 0.01
"""Events with a negative duration (Kineto wrote some where it missed an end time, before it guarded
against them in 2022) are dropped, with a warning, while they are at most this share of a file's
ops (or one); a file with more is refused."""
WINDOW_ID_BITS = 32
MAX_WINDOWS = 256
"""A rank's k-th file (profiling window) after its first has its correlation, External, record
function and flow ids moved up by k << WINDOW_ID_BITS (CUPTI's correlation ids are 32-bit), for
fewer than MAX_WINDOWS windows: ids stay below 2**40, as the launch join's keys need."""
_WINDOW_IDS = frozenset({"correlation", "ext_id", "rf_id", "wait_event_corr"})

_COMM_MARKERS = ("nccl", "gloo", "mpi:", "ucc:", "c10d", "record_param_comms")
PRECISION_OP_NAME = re.compile(F.PRECISION_OP_PATTERN)
"""fields.PRECISION_OP_PATTERN compiled once (the parser, facts)."""
DEVICE_WAIT_NAME = re.compile(F.DEVICE_WAIT_PATTERN)
"""fields.DEVICE_WAIT_PATTERN compiled once (the parser, facts, edges, segments)."""
_INPUT_TYPE = F.INPUT_TYPE_KEY.encode()
_SPARSE = (
    "correlation",
    "ext_id",
    "stream",
    "wait_stream",
    "wait_event_corr",
    "msg_nelems",
    "group_size",
    "pg",
    "elem_bytes",
    "shape_flops",
    "sync_kind",
    "peer",
    "seq",
    "coll_kind",
)
_SPARSE_DEFAULT = {"pg": -1, "elem_bytes": math.nan, "shape_flops": math.nan, "sync_kind": -1, "coll_kind": -1}
_SPARSE_DTYPE = {
    "coll_kind": np.int8,  # the CollectiveKind its "Collective name" arg names (-1: none)
    "pg": np.int32,
    "sync_kind": np.int8,
    "group_size": np.int32,
    "elem_bytes": np.float32,  # 1, 2, 4, 8: exact
    "msg_nelems": np.float64,
    "shape_flops": np.float64,  # the FLOPs a matmul's, convolution's or attention's input sizes give ("Input Dims")
    "wait_stream": np.int32,  # a stream id
    "peer": np.int32,  # a rank
}


def _duplicates(
    pid: np.ndarray,
    tid: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    code: np.ndarray,
    cls: np.ndarray,
    raw: TraceBytes,
    lo: np.ndarray,
    hi: np.ndarray,
) -> np.ndarray:
    """Events whose JSON text is the same as an earlier one's: a trace written twice. (Two calls
    of one name starting in the same microsecond with the same duration are common in µs-resolution
    traces; they differ in their correlation or External ids, so only identical text counts.)"""
    out = np.zeros(len(ts), dtype=bool)
    if not len(ts):
        return out
    # only events sharing their start with another can be one's copy: one sort of one column finds
    # them (few in most traces), the full sort runs on those alone
    by = np.argsort(ts)
    t = ts[by]
    tie = t[1:] == t[:-1]
    cand = np.zeros(len(ts), dtype=bool)
    cand[by[1:][tie]] = True
    cand[by[:-1][tie]] = True
    sub = np.flatnonzero(cand)  # ascending: ties of the full sort keep the table order
    if not len(sub):
        return out
    order = sub[np.lexsort((dur[sub], ts[sub], code[sub], cls[sub], tid[sub], pid[sub]))]
    same = np.ones(len(order) - 1, dtype=bool)
    for col in (pid, tid, cls, code, ts, dur):
        c = col[order]
        same &= c[1:] == c[:-1]
    for k in np.flatnonzero(same).tolist():
        a, b = int(order[k]), int(order[k + 1])
        if raw[int(lo[a]) : int(hi[a])] == raw[int(lo[b]) : int(hi[b])]:
            out[b] = True
    return out


def _flow_ends(ev: dict[str, np.ndarray], categories: np.ndarray) -> np.ndarray:
    """Which events of the scanner's output are flow endpoints ('s', 'f') in one of ``categories``
    (category hashes), with an id and a time."""
    ph = ev["ph"]
    ends: np.ndarray = (
        ((ph == ord("s")) | (ph == ord("f")))
        & np.isin(ev["cat"], categories)
        & (ev["fid"] != scan.NO_ID)
        & (ev["fid"] != -1)
        & ev["has_ts"]
    )
    return ends


def _link_by_flows(part: dict[str, np.ndarray], flows: dict[str, np.ndarray], name_code: int) -> int:
    """Device ops without a correlation id tied, in place, to the host op a launch flow
    (fields.LAUNCH_FLOW_CATS) starts in: the flow's end is a device op's start on its lane, its
    start a time inside a host op of its thread. Each start (thread, time) becomes a runtime call
    of no duration there (named ``name_code``: the flow's name) with a correlation id of its own,
    which the device ops it launched take: a launch as a CUDA trace writes it, so the graph ties
    them as it ties kernels to ``cudaLaunchKernel``. Returns how many device ops were tied."""
    start, end = flows["is_start"], ~flows["is_start"]
    ids = np.intersect1d(flows["id"][start], flows["id"][end])
    if not len(ids):
        return 0
    device = isin_small(part["cls"], (EvClass.KERNEL, EvClass.MEMCPY, EvClass.MEMSET)) & (part["correlation"] < 0)
    if not device.any():
        return 0
    at: dict[tuple[int, int, int], int] = {}
    for r in np.flatnonzero(device).tolist():
        at.setdefault((int(part["pid"][r]), int(part["tid"][r]), round(float(part["ts"][r]) * 1000)), r)
    # the host op a start lies in: on its thread, some op that started no later ends no earlier
    host = np.flatnonzero(part["cls"] == EvClass.CPU)
    order = host[np.lexsort((part["ts"][host], part["tid"][host], part["pid"][host]))]
    reach: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    if len(order):
        lane = np.stack([part["pid"][order], part["tid"][order]])
        cut = np.flatnonzero((lane[:, 1:] != lane[:, :-1]).any(axis=0)) + 1
        for seg in np.split(np.arange(len(order)), cut):
            rows = order[seg]
            ends = np.maximum.accumulate(part["ts"][rows] + part["dur"][rows])
            reach[(int(part["pid"][rows[0]]), int(part["tid"][rows[0]]))] = (part["ts"][rows], ends)
    first_start: dict[int, int] = {}
    for k in np.flatnonzero(start).tolist():
        first_start.setdefault(int(flows["id"][k]), k)
    groups: dict[tuple[int, int, float], int] = {}
    new_src: list[int] = []
    tied_rows: list[int] = []
    tied_group: list[int] = []
    for k in np.flatnonzero(end).tolist():
        s = first_start.get(int(flows["id"][k]))
        if s is None:
            continue
        r = at.get((int(flows["pid"][k]), int(flows["tid"][k]), round(float(flows["ts"][k]) * 1000)))
        if r is None:
            continue
        thread = (int(flows["pid"][s]), int(flows["tid"][s]))
        t = float(flows["ts"][s])
        starts_ends = reach.get(thread)
        if starts_ends is None:
            continue
        i = int(np.searchsorted(starts_ends[0], t, side="right")) - 1
        if i < 0 or starts_ends[1][i] < t:
            continue  # (a start on a thread or at a time this tool reads no host op of)
        g = groups.setdefault((*thread, t), len(groups))
        if g == len(new_src):
            new_src.append(s)
        tied_rows.append(r)
        tied_group.append(g)
    if not tied_rows:
        return 0
    base = int(part["correlation"].max()) + 1  # (ids are -1 or more: 0 where the file has none)
    part["correlation"][np.asarray(tied_rows)] = base + np.asarray(tied_group, dtype=np.int64)
    src = np.asarray(new_src, dtype=np.int64)
    n = len(src)
    added = {
        "rank": np.full(n, part["rank"][0] if len(part["rank"]) else 0, dtype=part["rank"].dtype),
        "src_idx": flows["src_idx"][src].astype(part["src_idx"].dtype),
        "pid": flows["pid"][src].astype(part["pid"].dtype),
        "tid": flows["tid"][src].astype(part["tid"].dtype),
        "ts": flows["ts"][src].astype(part["ts"].dtype),
        "dur": np.zeros(n, dtype=part["dur"].dtype),
        "name": np.full(n, name_code, dtype=part["name"].dtype),
        "cls": np.full(n, EvClass.RUNTIME, dtype=part["cls"].dtype),
        "is_range": np.zeros(n, dtype=bool),
        "correlation": base + np.arange(n, dtype=part["correlation"].dtype),
    }
    for col, arr in list(part.items()):
        extra = added.get(col)
        if extra is None:
            default = _SPARSE_DEFAULT.get(col, F.ARG_SPECS[col].default if col in F.ARG_SPECS else -1)
            extra = np.full(n, default, dtype=arr.dtype)
        part[col] = np.concatenate([arr, extra])
    return len(tied_rows)


def _one_lane_per_stream(part: dict[str, np.ndarray]) -> int:
    """Device ops of one stream (``args.stream``) on several lanes (tids) of their device's process
    moved, in place, to the lane most of them are on; returns how many moved. A profiler puts a
    stream's ops on one lane (Kineto: its tid is the stream), and the graph orders a lane's ops;
    tools that rewrite traces for a viewer split the ops of a stream that overlap (programmatic
    dependent launches) onto lanes of their own, which would read as streams running free."""
    dev = np.flatnonzero(
        isin_small(part["cls"], (EvClass.KERNEL, EvClass.MEMCPY, EvClass.MEMSET, EvClass.GPU_SYNC)) & (part["stream"] >= 0)
    )
    if not len(dev):
        return 0
    pid, tid, stream = part["pid"][dev], part["tid"][dev], part["stream"][dev]
    lanes = np.unique(np.stack([pid, stream, tid]), axis=1)
    if len(np.unique(lanes[:2], axis=1)[0]) == lanes.shape[1]:
        return 0  # one lane per stream: as every profiler writes them
    moved = 0
    for p, st in np.unique(lanes[:2], axis=1).T.tolist():
        mine = dev[(pid == p) & (stream == st)]
        tids, counts = np.unique(part["tid"][mine], return_counts=True)
        if len(tids) > 1:
            main = tids[np.argmax(counts)]
            moved += int((part["tid"][mine] != main).sum())
            part["tid"][mine] = main
    return moved


_DEVICE_LABEL = re.compile(F.DEVICE_LABEL_PATTERN, re.IGNORECASE)


def device_label(names: Iterable[str], pid: int) -> str:
    """How the trace labels a device's process, of its process's names and labels ("GPU 1":
    Kineto's process_labels), else "device N"."""
    return next((n.strip() for n in names if _DEVICE_LABEL.match(n)), f"device {pid}")


def _streams_per_device(b: _Builder) -> int:
    """One rank's device streams told apart by device, in place: where a process drives several
    devices (a model split across GPUs in one process: ``device_map="auto"``, naive model
    parallelism, ``nn.DataParallel``), each device counts its streams on its own (CUPTI numbers a
    stream within its context: every GPU's default stream is "stream 7"), and the graph, which
    orders and names a device lane by its stream, would read two devices' stream 7 as one lane.
    A stream number held by several devices keeps it on the first and takes a new one above every
    number in use on the others (its ops, its sync records, and the waits that name it; its lane
    named "GPU 1 stream 7"). A wait on a stream number several devices hold (a cuda_sync record's
    ``wait_on_stream``: Kineto writes no device for it) is on the record's own device unless that
    is the waiting stream itself (PyTorch's copy between devices makes one device's stream wait
    for the other's under the same number); else on the device whose stream of that number
    launched the last op before the waited-for event was recorded. Returns how many lanes were
    renumbered; a rank on one device is left as it is."""
    parts = [p for p in b.parts if len(p["cls"])]
    dev = [np.flatnonzero(isin_small(p["cls"], GPU_SIDE)) for p in parts]
    first = next((int(p["pid"][d[0]]) for p, d in zip(parts, dev) if len(d)), None)
    if first is None or not any((p["pid"][d] != first).any() for p, d in zip(parts, dev)):
        return 0  # (one device: a look at each op, no sort)
    lanes = np.unique(np.concatenate([np.stack([p["pid"][d], p["tid"][d]]) for p, d in zip(parts, dev)], axis=1), axis=1)
    holders: dict[int, list[int]] = {}
    for pid, tid in lanes.T.tolist():
        holders.setdefault(int(tid), []).append(int(pid))
    shared = {t: sorted(ps) for t, ps in holders.items() if len(ps) > 1 and t >= 0}
    if not shared:
        return 0
    used = max([int(lanes[1].max())] + [int(p["stream"][d].max()) for p, d in zip(parts, dev) if len(d)] + [max(shared)])
    renumber: dict[tuple[int, int], int] = {}
    for t, ps in sorted(shared.items()):
        for pid in ps[1:]:
            used += 1
            renumber[pid, t] = used
    label = {p: device_label(b.process_names.get(p, []), p) for p in np.unique(lanes[0]).tolist()}
    for pid, tid in lanes.T.tolist():  # every lane of a rank on several devices is named with its device
        name = b.thread_names.pop((pid, tid), f"stream {tid}").strip()
        b.thread_names[pid, renumber.get((pid, tid), tid)] = f"{label[pid]} {name}"
    # the last op launched on each (device, stream) before a correlation id: for the waits' devices
    corrs: dict[tuple[int, int], list[int]] = {}
    for p, d in zip(parts, dev):
        for pid, tid, corr in zip(p["pid"][d].tolist(), p["tid"][d].tolist(), p["correlation"][d].tolist()):
            if tid in shared and corr >= 0:
                corrs.setdefault((pid, tid), []).append(corr)
    launched = {k: np.sort(np.asarray(v)) for k, v in corrs.items()}

    def latest_before(pid: int, stream: int, corr: int) -> int:
        got = launched.get((pid, stream))
        if got is None or corr < 0:
            return -1
        at = int(np.searchsorted(got, corr)) - 1
        return int(got[at]) if at >= 0 else -1

    for p, d in zip(parts, dev):
        pid_d, tid_d, stream = p["pid"][d], p["tid"][d].copy(), p["stream"].copy()  # (the numbers as the trace gave them)
        for (pid, t), new in renumber.items():
            on = pid_d == pid
            p["tid"][d[on & (tid_d == t)]] = new
            p["stream"][d[on & (stream[d] == t)]] = new
        if "wait_stream" not in p:
            continue
        waits = np.flatnonzero(isin_small(p["wait_stream"], np.array(sorted(shared))) & (p["wait_stream"] >= 0))
        rec = p["wait_event_corr"] if "wait_event_corr" in p else np.full(len(p["cls"]), -1)
        for w in waits.tolist():  # (a sync record or a device wait op: a device event, its stream its own)
            ws, own, own_stream = int(p["wait_stream"][w]), int(p["pid"][w]), int(stream[w])
            cands = [q for q in shared[ws] if not (q == own and ws == own_stream)]
            if own in cands:
                on = own
            elif cands:
                on = max(cands, key=lambda q: latest_before(q, ws, int(rec[w])))
            else:
                continue
            p["wait_stream"][w] = renumber.get((on, ws), ws)
    return len(renumber)


def _pair_begin_end(ev: dict[str, np.ndarray]) -> int:
    """Duration events written as a begin/end pair (``ph`` 'B' then 'E' on one thread, nested; the
    trace format allows them beside complete 'X' events) made complete events in place: the begin
    event becomes an 'X' lasting until its end, the end event is left out. Returns how many of
    them had no other half (a thread still inside an op when the trace ended, a stray end)."""
    ph = ev["ph"]
    be = np.flatnonzero(((ph == ord("B")) | (ph == ord("E"))) & ev["has_ts"])
    if not len(be):
        return 0
    ts_i, ts_f = ev["ts_i"], ev["ts_f"]
    order = be[np.lexsort((be, ts_f[be], ts_i[be], ev["tid"][be], ev["tid_str"][be], ev["pid"][be], ev["pid_str"][be]))]
    stacks: dict[tuple[int, int, int, int], list[int]] = {}
    unmatched = 0
    for i, p, ps, t, tstr in zip(
        order.tolist(), ev["pid"][order].tolist(), ev["pid_str"][order].tolist(), ev["tid"][order].tolist(), ev["tid_str"][order].tolist()
    ):
        stack = stacks.setdefault((p, ps, t, tstr), [])
        if ph[i] == ord("B"):
            stack.append(i)
            continue
        if not stack:
            unmatched += 1
            continue
        b = stack.pop()
        d_i, d_f = int(ts_i[i]) - int(ts_i[b]), float(ts_f[i]) - float(ts_f[b])
        if d_f < 0:
            d_i, d_f = d_i - 1, d_f + 1.0
        ph[b] = ord("X")
        ev["dur_i"][b], ev["dur_f"][b], ev["has_dur"][b] = d_i, d_f, True
    return unmatched + sum(len(st) for st in stacks.values())


_OBJECT_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+(?=>)")
"""An object's address in a Python tracer's name (``<built-in method run_backward of
torch._C._EngineBase object at 0x7f46a8053010>``): it differs between processes and runs."""


def _name(b: bytes | bytearray) -> str:
    """An event name from its raw JSON string bytes: escapes decoded; bytes that are not UTF-8
    become U+FFFD and lone UTF-16 surrogates (``\\ud800``) "?", so every later consumer (the HTML
    report, the JSON output, the terminal) sees valid text. An object's address in a Python call's
    name is left out (``<built-in method acquire of _thread.lock object>``): the same call on two
    ranks, or in two runs, has one name, as the ranks' and runs' comparisons need."""
    if b" at 0x" in b:
        return _OBJECT_ADDRESS.sub("", _decoded(b))
    return _decoded(b)


def _decoded(b: bytes | bytearray) -> str:
    if b"\\" not in b:
        return b.decode("utf-8", errors="replace")
    try:
        name: str = orjson.loads(b'"' + b + b'"')
        return name
    except orjson.JSONDecodeError:
        try:
            text: str = json.loads('"' + b.decode("utf-8", errors="replace") + '"')  # the stdlib keeps lone surrogates ...
        except ValueError:  # an escape JSON does not know: keep the characters as they are
            return b.decode("utf-8", errors="replace")
        return text.encode("utf-8", errors="replace").decode("utf-8")  # ... which become "?" here


class _Builder:
    """The columns of one trace file, from the scanner's output (``_Merger`` joins files).

    The scanner gives the columns every event has; arguments only a few events carry
    (CUDA sync details, collective sizes, peers) are decoded for those events and stored
    sparsely as (row, value)."""

    def __init__(self, rank: int = 0, path: str = "", meta: dict[str, Any] | None = None) -> None:
        self.rank, self.path, self.meta = rank, path, meta or {}
        self.names: list[str] = []
        self.str_codes: dict[object, int] = {}
        self.pg_codes: dict[str, int] = {}
        self.parts: list[dict[str, np.ndarray]] = []
        self.flows: dict[str, np.ndarray] = {}
        self.steps: list[tuple[int, int, float, float, int, int]] = []  # times relative to base
        self.base = 0  # integer µs that this file's times are relative to
        self.clock_base_us: int | None = None  # the file's baseTimeNanoseconds, in whole µs: its ts count from there
        self.thread_names: dict[tuple[int, int], str] = {}  # (pid, tid) -> name
        self.notes: list[str] = []  # warnings about this file, raised in the main process (files may be parsed in workers)
        self.mended = 0  # names whose unescaped quotes were escaped to read the file (mend_names)
        self.cut = False  # the file ends inside its events: read up to its last whole event
        self.process_names: dict[int, list[str]] = {}  # pid -> its "process_name" and "process_labels"
        self.numbered: dict[str, int] = {}  # Ev Idx: events numbered by the exporter that the file holds, first, last
        self.unknown_device_events = 0  # device ops read from categories the field map does not list
        self.skipped = ""  # what complete events were left out for their category, said when nothing else is read
        self.devices: list[str] = []  # the names in the file's deviceProperties (GPU models)
        self.pid_strings: dict[int, str] = {}  # the code of a process named by a string -> that string
        self.pid_ranks: dict[int, int] = {}  # where several processes count steps: a process -> the rank its events' args name
        self.numbered_by_pid: dict[int, dict[str, int]] = {}  # there, each process's share of ``numbered``
        self.steps_from: dict[str, str] = {}  # where its steps are not its ProfilerStep markers: what cut them (name, at)
        self.step_hint: tuple[str, int] | None = None  # without steps: an annotation pattern that repeats at a thread's top, and how often

    def add_scanned(self, path: Path, raw: TraceBytes, ev: dict[str, np.ndarray]) -> int:
        """Columns from the scanner's output (scan.scan) for one file; returns the op count."""
        rank = self.rank
        unmatched = _pair_begin_end(ev)
        if unmatched:
            self.notes.append(f"{path}: {unmatched} begin/end events (ph 'B'/'E') without their other half on their thread dropped")
        cls = _CAT_BY_HASH.lookup(ev["cat"])
        ph = ev["ph"]
        self._process_names(path, raw, ev)
        cls = self._other_categories(path, raw, ev, cls)
        is_x = (ph == ord("X")) & (cls >= 0)
        flow = _flow_ends(ev, _FLOW_HASHES)
        launch_flow = _flow_ends(ev, _LAUNCH_FLOW_HASHES)
        x = np.flatnonzero(is_x)
        if not len(x):
            return 0
        missing = x[~ev["has_ts"][x] | (ev["name_lo"][x] < 0)]
        if len(missing):
            i = int(missing[0])
            raise TraceError(path, f"event at byte {int(ev['obj_lo'][i])} has no numeric ts or no name")
        # an event a week away from the rest (or lasting a week, or stamped beyond the µs float64
        # counts exactly) is a corrupt record: kept, it would stretch every window and cost the
        # float64 times their sub-µs resolution. (The scanner reads an integer beyond int64 as a
        # float, so 2**64 + 20000 is that, not 20000.)
        ts_abs = ev["ts_i"][x].astype(np.float64) + ev["ts_f"][x]
        med = float(np.median(ts_abs))
        far = ~(np.abs(ts_abs - med) <= MAX_SPAN_US) | ~(ev["dur_i"][x].astype(np.float64) + ev["dur_f"][x] <= MAX_SPAN_US)
        far |= ~(np.abs(ts_abs) < MAX_TS_US)
        if far.all():
            raise TraceError(
                path,
                "every op event lasts more than a week, lies more than a week from the others or has a timestamp beyond "
                "2**53 µs: these are not a profiler's times",
            )
        if far.any():
            self.notes.append(f"{path}: {int(far.sum())} events more than a week from the rest of the trace (or lasting a week) dropped")
            x = x[~far]
            fts = ev["ts_i"].astype(np.float64) + ev["ts_f"]
            flow &= np.abs(fts - med) <= MAX_SPAN_US
        negative = (ev["dur_i"][x].astype(np.float64) + ev["dur_f"][x]) < 0
        if negative.any() and negative.sum() < len(x) and negative.sum() <= max(1.0, NEGATIVE_SHARE * len(x)):
            # (more: the file is refused below, naming one)
            i = int(x[np.flatnonzero(negative)[0]])
            self.notes.append(
                f"{path}: {int(negative.sum())} events with a negative duration (an end the profiler did not record; "
                f"e.g. {ev['dur_i'][i] + ev['dur_f'][i]:.3f} µs at ts={ev['ts_i'][i] + ev['ts_f'][i]:.3f}) dropped"
            )
            x = x[~negative]
        ev_idx = ev.pop("evidx")
        # a file that may hold several ranks' traces (string pids, or more than host, device and the profiler's
        # own in a sample of its events) keeps each process's numbering for a split (_split_merged)
        sample = x[::64]
        maybe_merged = bool((ev["pid_str"][sample] != 0).any()) or len(np.unique(ev["pid"][sample])) > 2
        numbered_of = (ev["pid"], ev["pid_str"], ev_idx) if maybe_merged else None
        ev_idx = ev_idx[ev_idx >= 0]  # every event, of any phase: instant events are numbered too
        if len(ev_idx):  # how many of the events its exporter numbered the file holds (facts.py)
            self.numbered = {"events": int(len(np.unique(ev_idx))), "first": int(ev_idx.min()), "last": int(ev_idx.max())}
        names, code = self._names(raw, ev, x)
        _give_back(raw)
        base = int(min(ev["ts_i"][x].min(), ev["ts_i"][flow].min() if flow.any() else ev["ts_i"][x].min()))
        self.base = base
        ts = (ev["ts_i"][x] - base).astype(np.float64) + ev["ts_f"][x]
        dur = ev["dur_i"][x].astype(np.float64) + ev["dur_f"][x]
        no_dur = int((~ev["has_dur"][x]).sum())
        if no_dur:
            self.notes.append(f"{path}: {no_dur} complete events have no numeric dur; read as 0 µs")
        f = np.flatnonzero(flow)
        self.flows = {"rank": np.full(len(f), rank, dtype=np.int64), **self._flow_columns(ev, f, base)}
        lf = np.flatnonzero(launch_flow)
        launch_flows = {"src_idx": lf, **self._flow_columns(ev, lf, base)}
        flow_name = ""
        if len(lf):
            obj = _decode_one(raw[int(ev["obj_lo"][lf[0]]) : int(ev["obj_hi"][lf[0]])])
            flow_name = str(obj.get("name") or "") if isinstance(obj, dict) else ""
        self._thread_names(path, raw, ev)
        _give_back(raw)
        # each scanner column is let go once read: a long trace's columns are not all held beside the table
        for k in ("ts_i", "ts_f", "dur_i", "dur_f", "has_dur", "has_ts", "fid", "name_hash", "name_lo", "name_hi"):
            ev.pop(k)
        if not np.isfinite(dur).all() or not np.isfinite(ts).all():
            i = int(np.flatnonzero(~np.isfinite(dur) | ~np.isfinite(ts))[0])
            raise TraceError(path, f"event {names[code[i]][:80]!r} has a ts or dur that is not a finite number")
        if (dur < 0).any():
            i = int(np.flatnonzero(dur < 0)[0])
            raise TraceError(path, f"event {names[code[i]][:80]!r} at ts={ts[i] + base} has a negative duration ({dur[i]} µs)")
        pid_hash = ev.pop("pid_str")[x]
        pid = self._ids(ev.pop("pid")[x], pid_hash)
        if (pid_hash != 0).any():  # (rare: a process named by a string) its name, for a file of merged ranks (_split_merged)
            hashes, first = np.unique(pid_hash, return_index=True)
            for h, i in zip(hashes.tolist(), first.tolist()):
                obj = _decode_one(raw[int(ev["obj_lo"][x[i]]) : int(ev["obj_hi"][x[i]])]) if h else None
                if isinstance(obj, dict) and isinstance(obj.get("pid"), str):
                    self.pid_strings[int(pid[i])] = obj["pid"]
        tid = self._ids(ev.pop("tid")[x], ev.pop("tid_str")[x])
        xcls = cls[x].astype(np.int8)
        # ProfilerStep#N spans are step markers, not ops
        marked = {k: _step_number(n) for k, n in enumerate(names) if n.startswith(F.STEP_PREFIX)}
        numbers = {k: v for k, v in marked.items() if v is not None}
        step_codes = np.array([k for k, v in numbers.items() if v >= 0], dtype=np.int64)
        is_step = np.isin(code, step_codes) & (xcls == EvClass.CPU)
        absurd = np.isin(code, [k for k, v in numbers.items() if v < 0])
        if absurd.any():  # a marker with a number no step counter reaches: dropped, not read as a step
            self.notes.append(f"{path}: {int(absurd.sum())} ProfilerStep markers numbered beyond {MAX_STEP:,} dropped")
        for i in np.flatnonzero(is_step).tolist():
            number = numbers[int(code[i])]
            self.steps.append((rank, number, float(ts[i]), float(ts[i] + dur[i]), int(pid[i]), int(tid[i])))
        if len({st[4] for st in self.steps}) > 1 or (not self.steps and len(np.unique(pid[xcls == EvClass.RUNTIME])) > 1):
            # (rare: ranks merged into one file?) the rank each process's events name
            codes, first = np.unique(pid, return_index=True)
            for k, i in zip(codes.tolist(), first.tolist()):
                obj = _decode_one(raw[int(ev["obj_lo"][x[i]]) : int(ev["obj_hi"][x[i]])])
                args = obj.get("args") if isinstance(obj, dict) else None
                named = args.get("rank") if isinstance(args, dict) else None
                if isinstance(named, int) and not isinstance(named, bool) and 0 <= named < 2**31:
                    self.pid_ranks[int(k)] = named
            if numbered_of is not None:  # each process's share of the events its exporter numbered
                num, hashed, idx = numbered_of
                has = idx >= 0
                codes = self._ids(num[has], hashed[has])
                for k in np.unique(codes).tolist():
                    mine = idx[has][codes == k]
                    self.numbered_by_pid[int(k)] = {"events": int(len(np.unique(mine))), "first": int(mine.min()), "last": int(mine.max())}
        del numbered_of
        keep = ~is_step & ~absurd
        dup = _duplicates(pid, tid, ts, dur, code, xcls, raw, ev["obj_lo"][x], ev["obj_hi"][x])
        _give_back(raw)
        if dup.any():
            self.notes.append(f"{path}: {int(dup.sum())} duplicated events (same thread, name, start and duration) dropped")
            keep &= ~dup
        rows = x[keep]
        n = len(rows)
        part = {
            "rank": np.full(n, rank, dtype=np.int32),
            "src_idx": rows.astype(np.int32),  # event index in its file (a file holds far fewer than 2**31)
            "pid": pid[keep],
            "tid": tid[keep],
            "ts": ts[keep],
            "dur": dur[keep],
            "name": code[keep].astype(np.int32),
            "cls": xcls[keep],
            "is_range": np.isin(ev.pop("cat")[rows], _RANGE_HASHES),
            "correlation": ev.pop("corr")[rows],
            "ext_id": ev.pop("ext")[rows],
            "rf_id": ev.pop("rfid")[rows],
            "stream": ev.pop("stream")[rows],
        }
        sparse: dict[str, tuple[list[int], list[Any]]] = {k: ([], []) for k in _SPARSE if k not in part}
        # the few events whose args need more than the scanner reads are decoded in full
        comm = np.array([any(m in nm.lower() for m in _COMM_MARKERS) for nm in names], dtype=bool)
        typed = np.array([bool(PRECISION_OP_NAME.match(nm)) for nm in names], dtype=bool)  # matmuls, convolutions, attention
        typed_op = (part["cls"] == EvClass.CPU) & typed[part["name"]]
        waiting = np.array([bool(DEVICE_WAIT_NAME.match(nm)) for nm in names], dtype=bool)  # a queue waiting: on which stream
        wait_op = isin_small(part["cls"], (EvClass.KERNEL, EvClass.MEMCPY, EvClass.MEMSET)) & waiting[part["name"]]
        full = np.flatnonzero((part["cls"] == EvClass.GPU_SYNC) | comm[part["name"]] | typed_op | wait_op)
        unread = 0
        for j, r in enumerate(full.tolist()):
            e = rows[r]
            if j % RELEASE_EVERY == RELEASE_EVERY - 1:  # in file order: the pages behind are done with
                _give_back(raw, int(ev["obj_lo"][e]))
            text = raw[int(ev["obj_lo"][e]) : int(ev["obj_hi"][e])]
            if typed_op[r] and _INPUT_TYPE not in text:  # (no record_shapes: nothing to read)
                continue
            obj = _decode_one(text)
            args = obj.get("args") if isinstance(obj, dict) else None
            if obj is None and not typed_op[r]:  # (a matmul whose args are unread is one of unknown precision)
                unread += 1
            if not isinstance(args, dict):
                continue
            if part["cls"][r] == EvClass.GPU_SYNC:
                self._sync_args(sparse, r, names[part["name"][r]], args)
            if comm[part["name"][r]]:
                self._comm_args(sparse, r, args, names[part["name"][r]])
            elif typed_op[r]:
                self._precision_args(sparse, r, args, names[part["name"][r]])
            elif wait_op[r] and _arg(args, "wait_stream") != -1:
                sparse["wait_stream"][0].append(r)
                sparse["wait_stream"][1].append(_arg(args, "wait_stream"))
        if unread:
            self.notes.append(f"{path}: the args of {unread} collective or sync events are nested too deep to read; read without them")
        for col, (at, values) in sparse.items():
            dtype = _SPARSE_DTYPE.get(col, np.int64)
            default = _SPARSE_DEFAULT.get(col, F.ARG_SPECS[col].default if col in F.ARG_SPECS else -1)
            arr = np.full(n, default, dtype=dtype)
            if at:
                where, got = np.asarray(at, dtype=np.int64), np.asarray(values)
                if np.issubdtype(dtype, np.integer):  # a value the column cannot hold is unknown, not an overflow
                    info = np.iinfo(arr.dtype)
                    fits = (got >= info.min) & (got <= info.max) if got.dtype != object else np.zeros(len(got), dtype=bool)
                    where, got = where[fits], got[fits]
                arr[where] = got.astype(dtype)
            part[col] = arr
        _give_back(raw)
        if len(launch_flows["id"]):
            linked = _link_by_flows(part, launch_flows, len(names))
            if linked:
                names.append((flow_name or "launch flow")[:200])
                self.notes.append(
                    f"{path}: {linked} device ops tied to the host ops that launched them by flow events "
                    f"({', '.join(sorted(F.LAUNCH_FLOW_CATS))}: their device ops carry no correlation id)"
                )
        split = _one_lane_per_stream(part)
        if split:
            self.notes.append(
                f"{path}: {split} device ops on lanes split from their stream's (a rewrite for a trace viewer that moves a "
                "stream's overlapping ops to lanes of their own, tid '7_hack') read on their stream's lane, as their args say"
            )
        self.parts.append(part)
        self.names = names
        return n

    def _flow_columns(self, ev: dict[str, np.ndarray], rows: np.ndarray, base: int) -> dict[str, np.ndarray]:
        """The flow endpoints ``rows`` of the scanner's output: pid, tid, ts (from ``base``), id, is_start."""
        return {
            "pid": self._ids(ev["pid"][rows], ev["pid_str"][rows]),
            "tid": self._ids(ev["tid"][rows], ev["tid_str"][rows]),
            "ts": (ev["ts_i"][rows] - base).astype(np.float64) + ev["ts_f"][rows],
            "id": ev["fid"][rows],
            "is_start": ev["ph"][rows] == ord("s"),
        }

    def _process_names(self, path: Path, raw: TraceBytes, ev: dict[str, np.ndarray]) -> None:
        """Names and labels of the trace's processes ("process_name" / "process_labels" metadata):
        they tell an accelerator's process ("GPU 0", "MTIA 17") from the host's."""
        meta = np.flatnonzero((ev["ph"] == ord("M")) & (ev["name_lo"] >= 0) & (ev["pid_str"] == 0))
        for i in meta.tolist():
            key = raw[int(ev["name_lo"][i]) : int(ev["name_hi"][i])]
            if key not in (b"process_name", b"process_labels"):
                continue
            obj = _decode(path, raw[int(ev["obj_lo"][i]) : int(ev["obj_hi"][i])])
            args = obj.get("args") if isinstance(obj, dict) else None
            value = args.get("name" if key == b"process_name" else "labels") if isinstance(args, dict) else None
            if isinstance(value, str) and value.strip():
                parts = self.process_names.setdefault(int(ev["pid"][i]), [])
                if value.strip()[:200] not in parts:
                    parts.append(value.strip()[:200])

    def _other_categories(self, path: Path, raw: TraceBytes, ev: dict[str, np.ndarray], cls: np.ndarray) -> np.ndarray:
        """Event classes for complete events in categories the field map does not list.

        A category of another vendor's runtime (``mtia_runtime``) holds runtime calls, except on the
        accelerator's own process, where such events are its marks (an MTIA's "Stream N Submission
        Queue" lanes of 1 µs ``synchronize`` events): left out and counted; any other
        category on an accelerator's process (named like "MTIA 17", or one that also has kernels)
        holds device ops (so does one on a process with no host op whose events name a stream, for
        a trace without process names); the profiler's own categories (fields.IGNORED_CATS) hold no work. What
        is left (an unknown category on a host thread) is not analysed, and counted in a warning,
        as are the device ops read from a category this tool does not know."""
        other = np.flatnonzero((ev["ph"] == ord("X")) & (cls < 0) & (ev["name_lo"] >= 0))
        if not len(other):
            return cls
        known = bool(((ev["ph"] == ord("X")) & (cls >= 0)).any())
        cls = cls.copy()
        hashes, first = np.unique(ev["cat"][other], return_index=True)
        device_pids = set(np.unique(ev["pid"][(cls >= EvClass.KERNEL) & (ev["pid_str"] == 0)]).tolist())
        device_pids |= {p for p, names in self.process_names.items() if any(_DEVICE_PROCESS.match(n) for n in names)}
        # a process with no host op whose events of such categories name a stream is an accelerator too, named or
        # not (a trace whose process names were filtered out: ``jq 'select(.ph == "X")'``)
        numeric = ev["pid_str"] == 0
        host_pids = np.unique(ev["pid"][(cls == EvClass.CPU) & numeric])
        streamed = other[(ev["stream"][other] >= 0) & numeric[other]]
        device_pids |= set(np.setdiff1d(np.unique(ev["pid"][streamed]), host_pids).tolist())
        runtime_calls = self._runtime_process(ev, cls, other, device_pids)
        if len(runtime_calls):
            cls[runtime_calls] = EvClass.RUNTIME
            other = np.setdiff1d(other, runtime_calls)
            self.notes.append(
                f"{path}: {len(runtime_calls)} calls of the accelerator's runtime in a process of their own (Ascend's CANN: "
                "AscendCL) read as runtime calls of the host threads they ran on"
            )
            if not len(other):
                return cls
            hashes, first = np.unique(ev["cat"][other], return_index=True)
        on_device = np.isin(ev["pid"], np.array(sorted(device_pids), dtype=np.int64)) & (ev["pid_str"] == 0)
        read_as_device: dict[str, int] = {}
        skipped: dict[str, int] = {}
        skipped_rows: list[np.ndarray] = []
        device_marks: dict[str, int] = {}
        decoded = [_decode(path, raw[int(ev["obj_lo"][i]) : int(ev["obj_hi"][i])]) for i in other[first].tolist()]
        if not known and not any(isinstance(o, dict) and isinstance(o.get("cat"), str) and o["cat"] for o in decoded):
            said = self._eventlist_export(decoded, len(other))
            if said:
                raise NotATrace(path, said)
        for h, obj in zip(hashes.tolist(), decoded):
            cat = obj.get("cat") if isinstance(obj, dict) else None
            cat = cat if isinstance(cat, str) else ""
            mine = other[ev["cat"][other] == np.uint64(h)]
            if cat in F.IGNORED_CATS:
                continue
            if cat and cat.lower().endswith(F.RUNTIME_CAT_SUFFIXES):
                cls[mine[~on_device[mine]]] = EvClass.RUNTIME  # (on the accelerator's process: its own marks, below)
                if on_device[mine].any():
                    device_marks[cat[:60]] = int(on_device[mine].sum())
                continue
            dev = mine[on_device[mine]]
            cls[dev] = EvClass.KERNEL
            label = cat[:60] or "(no category)"
            if len(dev):
                read_as_device[label] = int(len(dev))
            if len(dev) < len(mine):
                skipped[label] = int(len(mine) - len(dev))
                skipped_rows.append(mine[~on_device[mine]])
        ranges = sum(n for c, n in (*read_as_device.items(), *skipped.items()) if c.lower().endswith(F.COUNTER_RANGE_SUFFIX))
        unknown = {c: n for c, n in read_as_device.items() if not c.lower().endswith(F.COUNTER_RANGE_SUFFIX)}
        if unknown:
            shown = ", ".join(f"{c}: {n}" for c, n in sorted(unknown.items(), key=lambda kv: -kv[1]))
            self.notes.append(
                f"{path}: {sum(unknown.values())} events on an accelerator in categories this tool does not know "
                f"({shown}) are analysed as device ops"
            )
        if skipped:
            shown = ", ".join(f"{c}: {n}" for c, n in sorted(skipped.items(), key=lambda kv: -kv[1]))
            self.skipped = f"{sum(skipped.values())} events in categories this tool does not read ({shown})"
            self.notes.append(
                f"{path}: {sum(skipped.values())} events on host threads in categories this tool does not read ({shown}) left out"
                + self._in_processes(ev, np.concatenate(skipped_rows))
            )
        if device_marks:
            shown = ", ".join(f"{c}: {n}" for c, n in sorted(device_marks.items(), key=lambda kv: -kv[1]))
            self.notes.append(
                f"{path}: {sum(device_marks.values())} events of a runtime's category on the accelerator's own process ({shown}) "
                "are the device's marks (an MTIA's per-stream submission queues), not calls of a host thread: left out"
            )
        if ranges:
            self.notes.append(
                f"{path}: {ranges} kernel ranges of a counter-reading profiler (torch.profiler's experimental profiler_metrics, "
                "the CUPTI range profiler): it replays each kernel to read its counters and runs them one at a time, so the "
                "device's times here are the replays', not the job's; profile without profiler_metrics for the step's times"
            )
        self.unknown_device_events = int(sum(unknown.values()))
        return cls

    def _in_processes(self, ev: dict[str, np.ndarray], rows: np.ndarray) -> str:
        """The named processes most of ``rows`` are in (two at most), as ', in "CANN" (84)'; "" where none is named."""
        pids, counts = np.unique(ev["pid"][rows[ev["pid_str"][rows] == 0]], return_counts=True)
        named = [(int(n), self.process_names[int(p)][0]) for p, n in zip(pids.tolist(), counts.tolist()) if int(p) in self.process_names]
        if not named:
            return ""
        named.sort(key=lambda pn: -pn[0])
        return ", in " + " and ".join(f'"{name[:40]}" ({n:,})' for n, name in named[:2]) + (" and others" if len(named) > 2 else "")

    def _runtime_process(self, ev: dict[str, np.ndarray], cls: np.ndarray, other: np.ndarray, device_pids: set[int]) -> np.ndarray:
        """Events (of ``other``: complete, in no category this tool reads) of a process named like an
        accelerator runtime's layer (fields.RUNTIME_PROCESS_PATTERN: Ascend's "CANN", whose
        ``AscendCL@...`` calls torch_npu writes beside its torch ops, on the ids of the threads
        that made them) whose thread id is that of a host thread of exactly one process with host
        ops: moved, in place, to that process (the calls of that thread). Returns their indices."""
        named = [p for p, names in self.process_names.items() if p not in device_pids and any(_RUNTIME_PROCESS.match(n) for n in names)]
        numeric = ev["pid_str"][other] == 0
        mine = other[numeric & np.isin(ev["pid"][other], np.array(named, dtype=np.int64)) & (ev["tid_str"][other] == 0)]
        if not len(named) or not len(mine):
            return np.empty(0, dtype=np.int64)
        host = np.flatnonzero((cls == EvClass.CPU) & (ev["pid_str"] == 0) & (ev["tid_str"] == 0))
        pairs = np.unique(np.stack([ev["tid"][host], ev["pid"][host]]), axis=1)
        tids, counts = np.unique(pairs[0], return_counts=True)
        alone = tids[counts == 1]  # a thread id one host process has
        owner = pairs[1][np.isin(pairs[0], alone)]
        at = np.searchsorted(alone, ev["tid"][mine])
        hit = (at < len(alone)) & (alone[np.minimum(at, len(alone) - 1)] == ev["tid"][mine])
        mine, at = mine[hit], at[hit]
        ev["pid"][mine] = owner[at]
        return np.asarray(mine, dtype=np.int64)

    @staticmethod
    def _eventlist_export(sample: list[Any], count: int) -> str | None:
        """Why a file none of whose complete events has a category, in a process named "CPU
        functions", is no trace this tool reads; None for any other file."""
        if not any(isinstance(o, dict) and o.get("pid") == "CPU functions" for o in sample):
            return None
        return (
            f'none of its {count:,} events has a category, and they sit in a process named "CPU functions": PyTorch\'s '
            "EventList export (prof.events().export_chrome_trace(), the legacy autograd profiler), which writes neither "
            "categories, device events nor the ids that tie launches to them; export with the profiler's own "
            "prof.export_chrome_trace() (or tensorboard_trace_handler)"
        )

    def _thread_names(self, path: Path, raw: TraceBytes, ev: dict[str, np.ndarray]) -> None:
        """Names of the CPU threads and GPU streams from the trace's "thread_name" metadata events
        (a thread renamed later keeps its last name: "pt_autograd_0" over "pt_main_thread")."""
        meta = np.flatnonzero((ev["ph"] == ord("M")) & (ev["name_lo"] >= 0))
        want = b"thread_name"
        named = [i for i in meta.tolist() if raw[int(ev["name_lo"][i]) : int(ev["name_hi"][i])] == want]
        if not named:
            return
        idx = np.array(named, dtype=np.int64)
        pids, tids = self._ids(ev["pid"][idx], ev["pid_str"][idx]), self._ids(ev["tid"][idx], ev["tid_str"][idx])
        for i, pid, tid in zip(named, pids.tolist(), tids.tolist()):
            obj = _decode_one(raw[int(ev["obj_lo"][i]) : int(ev["obj_hi"][i])])  # (a name it cannot read: the thread goes unnamed)
            args = obj.get("args") if isinstance(obj, dict) else None
            name = args.get("name") if isinstance(args, dict) else None
            if isinstance(name, str) and name.strip():
                self.thread_names[(int(pid), int(tid))] = name.strip()

    @staticmethod
    def _names(raw: TraceBytes, ev: dict[str, np.ndarray], x: np.ndarray) -> tuple[list[str], np.ndarray]:
        """Decoded names (one per distinct hash) and each event's index into them."""
        _, first, code = np.unique(ev["name_hash"][x], return_index=True, return_inverse=True)
        order = np.argsort(first)  # names in order of first appearance
        rank_of_code = np.empty(len(order), dtype=np.int64)
        rank_of_code[order] = np.arange(len(order))
        code = rank_of_code[code.reshape(-1)]
        names = []
        for k, i in enumerate(x[first[order]].tolist()):
            if k % RELEASE_EVERY == RELEASE_EVERY - 1:  # in file order: the pages behind are done with
                _give_back(raw, int(ev["name_lo"][i]))
            b = raw[int(ev["name_lo"][i]) : int(ev["name_hi"][i])]
            names.append(_name(b))
        return names, code

    def _ids(self, num: np.ndarray, str_hash: np.ndarray) -> np.ndarray:
        """pid/tid: the number, or a stable negative code for a string id."""
        out: np.ndarray = num.astype(np.int64).copy()
        s = np.flatnonzero(str_hash != 0)
        if len(s):  # each distinct string once, coded in the order the strings first appear
            hashes, first, inv = np.unique(str_hash[s], return_index=True, return_inverse=True)
            codes = np.empty(len(hashes), dtype=np.int64)
            for k in np.argsort(first, kind="stable").tolist():
                codes[k] = self.str_codes.setdefault(int(hashes[k]), -(len(self.str_codes) + 2))
            out[s] = codes[inv.reshape(-1)]
        return out

    @staticmethod
    def _sync_args(sparse: dict[str, tuple[list[int], list[Any]]], row: int, name: str, args: dict[str, Any]) -> None:
        kind = args.get(F.SYNC_KIND_KEY, name)
        if kind in SYNC_KINDS:
            sparse["sync_kind"][0].append(row)
            sparse["sync_kind"][1].append(SYNC_KINDS.index(kind))
        for col in ("wait_stream", "wait_event_corr"):
            v = _arg(args, col)
            if v != -1:
                sparse[col][0].append(row)
                sparse[col][1].append(v)

    @staticmethod
    def _precision_args(sparse: dict[str, tuple[list[int], list[Any]]], row: int, args: dict[str, Any], name: str) -> None:
        """The element size of a matmul's, convolution's or attention's first floating-point input
        ("Input type", written with ``record_shapes=True``): the precision its kernels run in; and
        the FLOPs its inputs' sizes give ("Input Dims": the work it is given, which the same op on
        another rank may be given more or less of)."""
        flops = shape_flops(name, args.get(F.INPUT_DIMS_KEY))
        if flops > 0:
            sparse["shape_flops"][0].append(row)
            sparse["shape_flops"][1].append(flops)
        types = args.get(F.INPUT_TYPE_KEY)
        if not isinstance(types, list):
            return
        for t in types:
            if isinstance(t, str) and t in F.FLOAT_DTYPES:
                sparse["elem_bytes"][0].append(row)
                sparse["elem_bytes"][1].append(float(F.DTYPE_BYTES[t]))
                return

    def _comm_args(self, sparse: dict[str, tuple[list[int], list[Any]]], row: int, args: dict[str, Any], name: str) -> None:
        """Message size, group size, process group and element size of collective-ish ops, and
        the peer rank of c10d send/recv calls (their third concrete input: dst or src)."""
        if name.startswith("c10d::") and ("send" in name or "recv" in name):
            concrete = args.get(F.CONCRETE_INPUTS_KEY)
            if isinstance(concrete, list) and len(concrete) > 2 and str(concrete[2]).lstrip("-").isdigit():
                sparse["peer"][0].append(row)
                sparse["peer"][1].append(int(concrete[2]))
        nelems = _arg(args, "msg_nelems")
        if nelems != nelems and F.INPUT_DIMS_KEY in args:  # NaN: gloo ops only give Input Dims
            nelems = _prod(args[F.INPUT_DIMS_KEY])
        if nelems == nelems:
            sparse["msg_nelems"][0].append(row)
            sparse["msg_nelems"][1].append(nelems)
        group = _arg(args, "group_size")
        if group != -1:
            sparse["group_size"][0].append(row)
            sparse["group_size"][1].append(group)
        seq = _first(args, F.SEQ_KEYS)
        if isinstance(seq, str) and seq.isdigit() and len(seq) < 19:
            seq = int(seq)
        if isinstance(seq, int) and not isinstance(seq, bool) and 0 <= seq < 2**62:
            sparse["seq"][0].append(row)
            sparse["seq"][1].append(seq)
        named = _first(args, F.COLLECTIVE_NAME_KEYS)  # ("allreduce" on record_param_comms, and on NCCL's generic kernel)
        kind = collective_kind(named) if isinstance(named, str) else -1
        if kind >= 0:
            sparse["coll_kind"][0].append(row)
            sparse["coll_kind"][1].append(kind)
        if kind in (CollectiveKind.SEND, CollectiveKind.RECV) and not name.startswith("c10d::"):
            peer = _first(args, F.P2P_PEER_KEYS["send" if kind == CollectiveKind.SEND else "recv"])
            if isinstance(peer, str) and peer.isdigit() and len(peer) < 10:
                peer = int(peer)
            if isinstance(peer, int) and not isinstance(peer, bool) and 0 <= peer < 2**31:
                sparse["peer"][0].append(row)
                sparse["peer"][1].append(peer)
        ranks_v, pg_name = _first(args, F.PG_RANKS_KEYS), _first(args, F.PG_NAME_KEYS)
        if ranks_v is not None or pg_name is not None:
            sparse["pg"][0].append(row)
            sparse["pg"][1].append(self.pg_codes.setdefault(f"{pg_name}|{ranks_v}", len(self.pg_codes)))
        dtype = _first(args, F.DTYPE_KEYS)
        if dtype is None and F.INPUT_TYPE_KEY in args:
            types = args[F.INPUT_TYPE_KEY]
            dtype = types[0] if isinstance(types, list) and types else None
        if isinstance(dtype, str) and dtype in F.DTYPE_BYTES:
            sparse["elem_bytes"][0].append(row)
            sparse["elem_bytes"][1].append(float(F.DTYPE_BYTES[dtype]))


class _Merger:
    """One table from per-file builders, added one at a time as their files are parsed: name and
    process-group codes made global, times relative to the earliest event of all files (each
    file's are relative to its own base). Each builder's rows are copied into growing columns and
    the builder dropped, so the parsed files and the table are never held at once; the columns are
    sized from the files' bytes after the first (``expected_bytes``), grown by half when short."""

    def __init__(self, expected_bytes: int) -> None:
        self.expected_bytes = expected_bytes
        self.names: list[str] = []
        self.codes: dict[str, int] = {}
        self.pg_codes: dict[str, int] = {}
        self.base: float | None = None
        self.clock_base_us: int | None = None  # the first file's baseTimeNanoseconds (µs), if it has one
        self.cols: dict[str, np.ndarray] = {}
        self.n = 0
        self.flows: list[dict[str, np.ndarray]] = []
        self.steps: list[tuple[int, int, float, float, int, int]] = []
        self.files: dict[int, str] = {}
        self.meta: dict[int, dict[str, Any]] = {}
        self.thread_names: dict[tuple[int, int, int], str] = {}
        self.inputs: dict[int, dict[str, Any]] = {}
        self.windows: dict[int, int] = {}  # rank -> files of it added so far

    def _reserve(self, rows: int, template: dict[str, np.ndarray], bytes_seen: int) -> None:
        need = self.n + rows
        if self.cols and need <= len(self.cols["ts"]):
            return
        if not self.cols:  # rows per byte of the first file, times every file's bytes
            cap = max(need, int(rows * self.expected_bytes / max(bytes_seen, 1) * 1.02) + 1024)
        else:
            cap = max(need, int(len(self.cols["ts"]) * 1.5))
        for k, v in template.items():  # one column at a time: growing costs one column, not the table
            grown = np.empty(cap, dtype=v.dtype)
            if k in self.cols:
                grown[: self.n] = self.cols[k][: self.n]
            self.cols[k] = grown

    def add(self, b: _Builder) -> None:
        if self.base is None:
            self.base = float(b.base)
            self.clock_base_us = b.clock_base_us
        for n in b.names:
            if n not in self.codes:
                self.codes[n] = len(self.names)
                self.names.append(n)
        remap = np.array([self.codes[n] for n in b.names], dtype=np.int32)
        pg_remap = np.array([self.pg_codes.setdefault(k, len(self.pg_codes)) for k in b.pg_codes], dtype=np.int32)
        # a file whose times count from a base of its own (recent Kineto: ts from baseTimeNanoseconds,
        # a host's boot time: hosts differ by days) is put on the first file's by the bases' difference
        rebase = b.clock_base_us - self.clock_base_us if b.clock_base_us is not None and self.clock_base_us is not None else 0
        shift = float(b.base - self.base + rebase)
        # a rank's later windows (files) have ids of their own: the ids a launch, a CPU op and a flow
        # are joined by count within one profiling session, and a process restarted into a later
        # window counts from 1 again; each window after a rank's first is given its own range
        window = self.windows.get(b.rank, 0)
        self.windows[b.rank] = window + 1
        id_offset = np.int64(window) << np.int64(WINDOW_ID_BITS) if 0 < window < MAX_WINDOWS else np.int64(0)
        # the first file's bytes size the columns (rows per byte); later files only fill them
        size = (_size(Path(b.path)) or 1) if not self.cols and b.path else 1

        def merged(k: str, v: np.ndarray) -> np.ndarray:
            """A file's column in the merged table's codes and clock."""
            if k == "name":
                named: np.ndarray = remap[v]
                return named
            if k == "ts":
                return v + shift
            if k == "pg" and len(pg_remap):
                return np.where(v >= 0, pg_remap[np.maximum(v, 0)], -1)
            if id_offset and k in _WINDOW_IDS:
                return np.where(v >= 0, v + id_offset, v)
            return v

        if not self.cols and len(b.parts) == 1 and size >= self.expected_bytes:  # the one file: its columns become the table's
            part = b.parts.pop()
            self.n = len(part["ts"])
            self.cols = {k: merged(k, part.pop(k)) for k in list(part)}  # one column at a time
        b.parts.reverse()
        while b.parts:  # each part let go once copied: the file's columns and the merged ones are not both held whole
            part = b.parts.pop()
            m = len(part["ts"])
            self._reserve(m, part, size)
            for k in list(part):
                self.cols[k][self.n : self.n + m] = merged(k, part.pop(k))
            self.n += m
        flow_id = b.flows["id"]
        if id_offset:
            flow_id = np.where(flow_id != scan.NO_ID, flow_id + id_offset, flow_id)
        self.flows.append({**b.flows, "ts": b.flows["ts"] + shift, "id": flow_id})
        self.steps.extend((r, n, a + shift, e + shift, p, t) for r, n, a, e, p, t in b.steps)
        self.files.setdefault(b.rank, b.path)  # a rank in several windows: named by its first file
        self.meta.setdefault(b.rank, b.meta)
        info = self.inputs.setdefault(b.rank, {"numbered": [], "unknown_device_events": 0, "process_names": {}, "devices": []})
        info["devices"] += [d for d in b.devices if d not in info["devices"]]
        if b.numbered:
            info["numbered"].append(b.numbered)
        info["unknown_device_events"] += b.unknown_device_events
        if b.steps_from:
            info["steps_from"] = b.steps_from
        if b.skipped:
            info["skipped"] = b.skipped
        if b.mended:  # (the Perfetto export reads the file again: mended as the loader read it)
            info.setdefault("mended", {})[b.path] = b.mended
        if b.cut:  # (and closed after its last whole event)
            info.setdefault("cut", []).append(b.path)
        if b.step_hint and b.step_hint[1] > info.get("step_hint", ("", 0))[1]:
            info["step_hint"] = b.step_hint
        info["process_names"].update({str(k): " / ".join(v) for k, v in b.process_names.items()})
        self.thread_names.update({(b.rank, p, t): name for (p, t), name in b.thread_names.items()})

    def table(self) -> EventTable:
        cols = {}
        for k in list(self.cols):  # trimmed to the rows there are, one column at a time
            v = self.cols.pop(k)
            cols[k] = v[: self.n].copy() if len(v) > self.n else v
            del v
        steps = self.steps
        first = float(min(cols["ts"].min(), min((s[2] for s in steps), default=math.inf)))
        cols["ts"] -= first
        fl = {k: np.concatenate([f[k] for f in self.flows]) for k in self.flows[0]}
        fl["ts"] -= first
        step_list = sorted((Step(r, n, a - first, e - first, p, t) for r, n, a, e, p, t in steps), key=lambda s: (s.number, s.rank))
        return EventTable(
            t0=float(self.base or 0.0) + first,
            names=self.names,
            cols=cols,
            steps=step_list,
            flows=fl,
            files=self.files,
            meta=self.meta,
            thread_names=self.thread_names,
            inputs=self.inputs,
        )


def trace_files(path: str | Path) -> list[Path]:
    """The trace files a path names: the file itself, or every *.json[.gz] in a folder (or, if it
    has none, in each of its subfolders). Every entry with a trace's name counts, whatever it is:
    a link to nothing, a link loop or a device named like a rank fails when read, with its name,
    instead of the job being analysed as one rank fewer; a folder that cannot be listed too."""
    p = Path(path)
    mode = _mode(p)
    if mode is None:
        raise TraceError(p, "no such file or folder" + (" (a link to nothing)" if p.is_symlink() else ""))
    if stat.S_ISREG(mode):
        return [p]
    if not stat.S_ISDIR(mode):
        raise TraceError(p, "is not a regular file or folder (a FIFO, device or socket); pass a trace file or a folder of them")
    entries = _listed(p)
    files = _json_files(entries)
    if not files:  # one subfolder per rank (rank0/, rank1/, ... or 0/, 1/, ...)
        subs = [d for d in entries if (m := _mode(d, quiet=True)) is not None and stat.S_ISDIR(m)]
        files = [f for sub in subs for f in _json_files(_listed(sub))]
    if not files:
        raise TraceError(p, "folder holds no .json or .json.gz trace files (nor do its subfolders)")
    return files


def _mode(p: Path, quiet: bool = False) -> int | None:
    """st_mode of ``p`` (links followed); None if it does not exist or is a link to nothing or a
    link loop; other errors (a name too long, no permission) a TraceError unless ``quiet``."""
    try:
        return os.stat(p).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # a link loop, a name too long, no permission
        if quiet:
            return None
        raise TraceError(p, f"cannot read: {exc.strerror or exc}") from None


def _listed(folder: Path) -> list[Path]:
    """The entries of a folder, sorted; TraceError naming it if it cannot be listed."""
    try:
        return sorted(folder.iterdir())
    except OSError as exc:
        raise TraceError(folder, f"cannot list the folder ({exc.strerror or exc})") from None


def _json_files(entries: list[Path]) -> list[Path]:
    """The entries named like traces that are not folders."""
    named = [f for f in entries if f.name.endswith((".json", ".json.gz"))]
    return [f for f in named if (m := _mode(f, quiet=True)) is None or not stat.S_ISDIR(m)]


def _size(p: Path) -> int:
    """Bytes of a file on disk, 0 if it cannot be told (reading it says why)."""
    try:
        return os.stat(p).st_size
    except OSError:
        return 0


class NotATrace(TraceError):
    """Valid JSON that is not a profiler trace (a results file, an execution trace)."""


def _not_a_trace(path: Path, raw: TraceBytes, is_object: bool, has_nodes: bool, has_schema: bool) -> TraceError:
    if has_nodes and has_schema:
        return NotATrace(path, "is a PyTorch execution trace, not a Kineto trace; pass it with --et (paired with its Kineto trace)")
    # name a few of its keys, without building a large foreign document in memory
    doc = _decode(path, raw) if is_object and not isinstance(raw, MappedTrace) and len(raw) <= 16 * 2**20 else None
    keys = ", ".join(list(doc)[:5]) if isinstance(doc, dict) else ("an object" if is_object else "no object")
    return NotATrace(path, f"JSON but not a profiler trace: no traceEvents list (found {keys})")


def _not_events(buf: np.ndarray, lo: int, err: int, ev: dict[str, np.ndarray] | None) -> bool:
    """Whether a top-level array (a trace in the format's array form, or a results file: a log
    folder holds both) holds something other than events: its first element is not an object
    (``[]``, ``[0.52, 0.48]``), or none of its objects has a ``ph`` (``[{"step": 1, "loss": 0.5}]``)."""
    i = lo + 1
    while i < len(buf) and buf[i] in (0x20, 0x09, 0x0A, 0x0D):
        i += 1
    if i >= len(buf):
        return False  # cut right after its '[': said as a cut trace
    if buf[i] != ord("{"):
        return True
    return err == scan.OK and ev is not None and not bool((ev["ph"] != 0).any())


def _parse_in_folder(path: Path, single: bool) -> _Builder | NotATrace:
    """A folder's file: its builder, or why it is not a trace (the folder skips it)."""
    try:
        return _parse_file(path, single)
    except NotATrace as exc:
        return exc


def _gzip_zero_tail(path: Path) -> int:
    """The zero bytes a gzip trace file ends in, beyond its stream (_zero_tail_on_disk; 0 for a plain file)."""
    try:
        with open(path, "rb") as fh:
            return _zero_tail_on_disk(fh) if fh.read(2) == b"\x1f\x8b" else 0
    except OSError:
        return 0


def _without_zero_tail(raw: TraceBytes) -> tuple[TraceBytes, int]:
    """A trace whose file ends in zero bytes, without them, and how many there were. A file
    system that crashed (a node lost, a full disk) can leave the end of a file it had grown as
    zeros, written before its data was: what the trace holds ends before them (a trace cut short,
    read as such, or a whole one)."""
    end = _end_before_zeros(len(raw), lambda lo, hi: bytes(raw[lo:hi]))
    zeros = len(raw) - end
    if not zeros or not end:  # (none; or all zeros: said as no JSON)
        return raw, 0
    if isinstance(raw, MappedTrace):
        return raw.truncated(end), zeros
    if isinstance(raw, bytearray):
        del raw[end:]
        return raw, zeros
    return raw[:end], zeros


def bytes_as_read(path: Path, mended: bool = False, cut: bool = False) -> TraceBytes:
    """A trace file's bytes as the loader read them, for a writer that copies its events (the
    Perfetto export): without a tail of zero bytes, its names' bare quotes escaped where the loader
    mended them (``mended``), a document cut short (``cut``) closed after its last whole event."""
    raw, _ = _without_zero_tail(map_trace(path))
    if mended and (fixed := mend_names(path, raw)) is not None:
        raw = fixed[0]
    if not cut:
        return raw
    buf = np.frombuffer(raw.map if isinstance(raw, MappedTrace) else raw, dtype=np.uint8)
    whole = _closed_at_last_event(raw, buf)
    del buf
    return raw if whole is None else whole


def _parse_file(path: Path, single: bool, raw: TraceBytes | None = None, mended: int = 0) -> _Builder:
    """The builder of one trace file (``raw``: its bytes where they are not the file's own: a
    document cut short and closed, or names mended; ``mended``: how many names were)."""
    cut_before = raw is not None and not mended  # (the events of a document cut short, closed: see the end)
    zeros = packed = inflated = 0
    if raw is None:
        raw = map_trace(path)
        inflated, packed = len(raw), _gzip_zero_tail(path)
        raw, zeros = _without_zero_tail(raw)

    def said(b: _Builder) -> _Builder:
        nonlocal zeros
        if packed:  # (a whole stream's trailer ends in its size mod 2^32, little-endian: its zero high bytes are no padding)
            size = (inflated % 2**32).to_bytes(4, "little")
            zeros += packed - (0 if b.cut else len(size) - len(size.rstrip(b"\0")))
        if zeros:
            b.notes.append(
                f"{path}: the file ends in {zeros:,} zero bytes after its data (space a file system left unwritten when "
                "the machine or the disk failed?): read up to them"
            )
        return b

    if not isinstance(raw, MappedTrace):  # (map_trace looked before it copied a large one)
        _starts_as_json(path, bytes(raw[: 1 << 12]))
    buf = np.frombuffer(raw.map if isinstance(raw, MappedTrace) else raw, dtype=np.uint8)
    # one file alone is scanned in parts, one thread each; a folder's files are already parsed in parallel
    parts = scan_threads(len(buf)) if single else 1
    # a file in memory is found and scanned in one pass; a mapped or split one is counted first
    once = scan.scan_once(buf) if parts == 1 and not isinstance(raw, MappedTrace) else None
    if once is not None:
        lo, hi, is_object, has_nodes, has_schema, err, pos, ev = once
        if err == scan.OK and lo < 0:
            raise _not_a_trace(path, raw, is_object, has_nodes, has_schema)
    else:
        lo, hi, is_object, has_nodes, has_schema, err, count, splits = scan.count_events(buf, parts)
        if err == scan.OK and lo < 0:
            raise _not_a_trace(path, raw, is_object, has_nodes, has_schema)
        if isinstance(raw, MappedTrace):  # finding the events array read every page
            raw.release(len(raw))
        if err == scan.OK:  # a mapped trace gives back the pages it has scanned as it goes
            mapped = raw.release_range if isinstance(raw, MappedTrace) else None
            err, pos, ev = scan.scan(buf, lo, hi, release=mapped, events=count, splits=splits)
        else:
            pos = 0
    _give_back(raw)
    if not is_object and _not_events(buf, lo, err, ev):
        raise NotATrace(path, "JSON but not a profiler trace: a top-level array whose elements are not trace events (no 'ph')")
    if isinstance(raw, MappedTrace) and hasattr(mmap, "MADV_RANDOM"):  # from here on: single events' bytes, no read-ahead
        raw.map.madvise(mmap.MADV_RANDOM)
    if err == scan.TRUNCATED and not cut_before:
        whole = _closed_at_last_event(raw, buf)
        if whole is not None:
            del buf
            b = _parse_file(path, single, whole)
            b.cut = True
            late, kept = _steps_past_the_cut(b)
            steps = f"step{'s' if len(late) > 1 else ''} {', '.join(map(str, late))}"
            past = (
                f"; {steps} ran past where its events stop and {'are' if len(late) > 1 else 'is'} left out"
                if late and not kept
                else f"; {steps} ran past where its events stop (kept: no step is whole) and may lack device work"
                if late
                else ""
            )
            b.notes.append(
                f"{path}: the file ends inside its events (a trace cut short: the job stopped while writing it?): "
                f"the {len(whole):,} bytes up to its last whole event are read, what followed is lost{past}"
            )
            return said(b)
    if err == scan.BAD_JSON and not mended:
        fixed = mend_names(path, raw)
        if fixed is not None:
            del buf
            try:
                b = _parse_file(path, single, fixed[0], mended=fixed[1])
            except NotATrace:
                raise
            except TraceError as exc:  # bad another way too: where, on the file's lines
                raise TraceError(
                    path,
                    f"{exc.problem}; read with the unescaped quotes of {fixed[1]:,} event name{'s' if fixed[1] > 1 else ''} "
                    "escaped (lines are the file's; a char offset counts the escapes)",
                ) from None
            b.mended = fixed[1]
            b.notes.append(mended_note(path, fixed[1]))
            return said(b)
    if err != scan.OK:
        if err == scan.NOT_OBJECT and 0 <= pos < len(raw) and raw[pos] == ord("]"):
            raise TraceError(path, f"not valid JSON: a comma after the last event, before the closing bracket at byte {pos:,}")
        if err in (scan.BAD_JSON, scan.TRUNCATED) and not isinstance(raw, MappedTrace) and len(raw) <= MAP_BYTES:
            _decode(path, raw)  # orjson names the problem precisely when the JSON itself is bad
        raise TraceError(path, f"{scan.ERRORS[err]} (at byte {pos})")
    if not len(ev["ph"]):
        raise TraceError(path, "trace holds no events")
    meta_doc = _decode_one(bytes(raw[:lo]).removeprefix(UTF8_BOM) + b"[]" + raw[hi:]) if is_object else {}
    if meta_doc is None:
        raise TraceError(path, _metadata_problem(raw, lo, hi))
    info = meta_doc.get("distributedInfo") if isinstance(meta_doc, dict) else None
    rank = rank_of(meta_doc if isinstance(meta_doc, dict) else {}, path, default=0 if single else UNRANKED)
    b = _Builder(rank, str(path), info if isinstance(info, dict) else {})
    clock_base = meta_doc.get("baseTimeNanoseconds") if isinstance(meta_doc, dict) else None
    if isinstance(clock_base, int) and not isinstance(clock_base, bool) and 0 < clock_base < 2**63:
        b.clock_base_us = clock_base // 1000
    props = meta_doc.get("deviceProperties") if isinstance(meta_doc, dict) else None
    b.devices = (
        sorted({str(d["name"]) for d in props if isinstance(d, dict) and isinstance(d.get("name"), str)}) if isinstance(props, list) else []
    )
    if b.add_scanned(path, raw, ev) == 0:
        also = f": {b.skipped}, on no process named as an accelerator's" if b.skipped else ""
        raise TraceError(path, f"no CPU or GPU op events (ph 'X', or 'B'/'E' pairs) in the trace{also}")
    return said(b)


def _metadata_problem(raw: TraceBytes, lo: int, hi: int) -> str:
    """Why the document around a trace's events (``raw[lo:hi]``) could not be decoded, where in the file."""
    bom = len(UTF8_BOM) if bytes(raw[:3]) == UTF8_BOM else 0
    head, tail = bytes(raw[bom:lo]), bytes(raw[hi:])
    text = (head + b"[]" + tail).decode("utf-8", errors="replace")
    try:
        json.loads(text)
    except RecursionError:
        return "the trace's metadata around its events is not JSON this tool can read (nested too deep)"
    except json.JSONDecodeError as exc:
        pos = len(text[: exc.pos].encode("utf-8"))  # (the decoder counts characters; the file, bytes)
        at = pos + bom if pos < len(head) else pos - len(head) - 2 + hi
        if exc.msg == "Extra data":
            shown = bytes(raw[at : at + 40]).decode("utf-8", errors="replace")
            return f"more after its JSON document ends, at byte {at:,}: {shown!r} (a second document or a log line appended?)"
        return f"not valid JSON around its events ({exc.msg} at byte {at:,})"
    return "the trace's metadata around its events is not JSON this tool can read (nested too deep)"


def _steps_past_the_cut(b: _Builder) -> tuple[list[int], bool]:
    """Of a trace cut short, the steps that end after the events of some kind stop (the step
    numbers), left out of ``b.steps``, and whether they were kept instead. A profiler writes its
    events grouped (Kineto: every CPU op first, then the runtime calls and device ops), so the cut
    ends one kind early: a step past that point holds its host's ops and not its device's, and
    would read as a host-only step. Where every step is past it, none is left out (kept)."""
    ends: dict[str, float] = {}
    for part in b.parts:
        cls, end = part["cls"], part["ts"] + part["dur"]
        for kind, mine in (
            ("host", cls == EvClass.CPU),
            ("runtime", cls == EvClass.RUNTIME),
            ("device", isin_small(cls, GPU_SIDE)),
        ):
            if mine.any():
                ends[kind] = max(ends.get(kind, -math.inf), float(end[mine].max()))
    if len(ends) < 2:
        return [], False
    cut = min(ends.values())
    late = {n for _, n, _, e, _, _ in b.steps if e > cut}
    if late == {n for _, n, _, _, _, _ in b.steps}:
        return sorted(late), True
    b.steps = [s for s in b.steps if s[1] not in late]
    return sorted(late), False


_NAME_UP_TO_PID = re.compile(rb'("name"[ \t]*:[ \t]*")([^\n]{0,4096}?)("[ \t]*,[ \t\r\n]*"pid"[ \t]*:)')
"""An event's name as Kineto writes it, ``"name": "<value>", "pid": `` (``"pid"`` on the same or
the next line): the value is what lies between, quotes and all, on one line."""
_KEY_AFTER_STRING = re.compile(rb'"[ \t]*,[ \t]*"(?:ph|cat|name|tid|ts|dur|args|id|s|bp|cname)"[ \t]*:')
"""Within such a value: a string closed and another key of an event begun, so the value spans
several keys of a valid event (a writer that puts other keys between name and pid), not one name."""
_BARE_QUOTE = re.compile(rb'(?<!\\)((?:\\\\)*)"')
"""A double quote no backslash escapes (after any number of escaped backslashes)."""
MEND_CHUNK = 64 * 2**20
"""Bytes of a mapped trace mended at a time (mend_names: each part ends at a line's end)."""


def _mend_part(data: bytes | bytearray) -> tuple[bytes, int]:
    count = 0

    def one(m: re.Match[bytes]) -> bytes:
        nonlocal count
        value = m.group(2)
        if b'"' not in value or not _BARE_QUOTE.search(value) or _KEY_AFTER_STRING.search(value):
            return m.group(0)
        count += 1
        return m.group(1) + _BARE_QUOTE.sub(lambda q: q.group(1) + b'\\"', value) + m.group(3)

    return _NAME_UP_TO_PID.sub(one, data), count


def mended_note(path: Path, count: int) -> str:
    """What a user is told of a trace whose names were mended (mend_names)."""
    return (
        f"{path}: {count:,} event name{'s' if count > 1 else ''} held double quotes the profiler wrote unescaped, "
        "so the file is not valid JSON (PyTorch's profiler writes a Python frame's file name as it is: "
        "pytorch/pytorch#146900); read with the quotes as part of the name"
    )


def mend_names(path: Path, raw: TraceBytes) -> tuple[TraceBytes, int] | None:
    """A trace whose event names hold double quotes its writer did not escape, with them escaped,
    and how many names were so mended; None where there are none (its JSON is bad some other way).

    PyTorch's profiler writes a Python frame's name (``with_stack=True``) as the frame's file name,
    line and function, unescaped (pytorch/pytorch#146900; still so in PyTorch 2.13): a frame of
    generated code whose file name holds quotes (``compile(src, '{"device": "cpu"}', "exec")``,
    dynamo's generated frames) makes the whole file invalid JSON. Only a name that runs on one
    line from ``"name": "`` to Kineto's next key, ``"pid"``, is mended, and only where what lies
    between is no other key of the event; every other byte is kept. A trace in memory is mended in
    memory; a mapped one (MAP_BYTES or more) into another unlinked temporary file, a part at a
    time, each part ending at a line's end (a part of MEND_CHUNK bytes with no line end in it:
    None, not mended)."""
    if not isinstance(raw, MappedTrace):
        out, count = _mend_part(raw)
        return (out, count) if count else None
    tmp = tempfile.TemporaryFile(prefix="bottleneck-oracle-")  # noqa: SIM115 - unlinked; closed with the mapping
    total, at, n = 0, 0, len(raw)
    try:
        while at < n:
            end = n if n - at <= MEND_CHUNK else raw.map.rfind(b"\n", at, at + MEND_CHUNK) + 1
            if end <= at:
                tmp.close()
                return None
            part, count = _mend_part(raw[at:end])
            raw.release(end)
            total += count
            try:
                tmp.write(part)
            except OSError as exc:
                raise _spool_error(path, exc) from None
            at = end
        tmp.flush()
    except BaseException:
        tmp.close()
        raise
    if not total:
        tmp.close()
        return None
    return MappedTrace(tmp), total


def _closed_at_last_event(raw: TraceBytes, buf: np.ndarray) -> bytearray | None:
    """A document cut short, closed just after its last whole event (its events array and top
    level closed): a copy in memory; None where the cut falls before the first event."""
    end, is_object = scan.cut_at_last_event(buf)
    if end < 0:
        return None
    whole = bytearray(raw[:end])
    whole += b"]}" if is_object else b"]"
    return whole


def _parse_task(single: bool, path: Path) -> _Builder | NotATrace:
    return _parse_file(path, single) if single else _parse_in_folder(path, single)


def _parse_files(single: bool, paths: list[Path]) -> list[_Builder | NotATrace]:
    """``_parse_task`` of each file (one task of an engine that is not this machine's processes)."""
    return [_parse_task(single, p) for p in paths]


def load_events(path: str | Path, workers: int | None = None, engine: Engine | None = None, steps_at: str = "") -> EventTable:
    """Load one trace file or a folder of per-rank trace files into one EventTable.

    The steps are the ProfilerStep markers; where a file has none, its optimizer's steps cut them
    (``_optimizer_steps``); with ``steps_at`` (a shell-style pattern of host op names), the ops so
    named start them instead (``_named_steps``), numbered on from a rank's earlier files.

    Each file is parsed on its own: large folders with one process per core (``workers``;
    default: all cores when the files hold more than PARALLEL_BYTES), or on ``engine``
    (graph_pipeline.engine: a Dask cluster, any concurrent.futures.Executor)."""
    files = trace_files(path)
    single = len(files) == 1
    if engine is None or isinstance(engine, LocalEngine) or single:
        if workers is None:
            big = sum(map(_size, files)) > PARALLEL_BYTES
            workers = min(len(files), os.cpu_count() or 1) if big else 1
        engine = LocalEngine(workers)
    merger = _Merger(sum(map(_size, files)))
    skipped: list[NotATrace] = []
    # per rank and file: first and last µs (absolute), steps, path, the steps' processes, whether its profiler was a new one
    seen: dict[int, list[tuple[float, float, set[int], str, set[int], bool]]] = {}
    counted: dict[int, int] = {}  # per rank: the steps its earlier files' own markers cut (numbered on from there)
    if isinstance(engine, LocalEngine):
        parsed: Iterator[_Builder | NotATrace] = engine.imap(_parse_task, files, shared=single)
    else:  # another engine's tasks cost a round trip each: a few files to a task (a worker's folder is not ours)
        per = max(1, min(FILES_PER_TASK, len(files) // (4 * max(getattr(engine, "workers", 1) or 1, 1))))
        chunks = [[f.absolute() for f in files[i : i + per]] for i in range(0, len(files), per)]
        parsed = (b for bs in engine.imap(_parse_files, chunks, shared=single) for b in bs)
    ranked = (one for got in parsed for one in ([got] if isinstance(got, NotATrace) else _split_merged(got)))
    unranked: list[tuple[str, set[int]]] = []  # a folder's first file that names no rank, and its processes
    named: list[str] = []  # the folder's files that name their rank
    for b in ranked:  # in file order, merged as they arrive
        if isinstance(b, NotATrace):
            skipped.append(b)
            continue
        if b.rank == UNRANKED:
            _rank_unranked(b, unranked, named)
        elif not single:
            if unranked:
                raise _unranked_error(unranked[0][0], f", beside files that name theirs ({b.path})")
            named.append(b.path)
        _streams_per_device(b)
        span, numbers, pids = _time_span(b), {s[1] for s in b.steps}, {s[4] for s in b.steps}
        earlier = seen.get(b.rank, [])
        for lo, hi, _, other, _, _ in earlier:
            # windows of one run follow each other in time and in step numbers; a copy or another run does not
            if span[0] < hi and lo < span[1]:
                raise TraceError(b.path, f"rank {b.rank} appears twice (also in {other}, over the same time)")
        clash = [(other, n) for _, _, n, other, _, _ in earlier if numbers & n]
        if clash and all(hi <= span[0] and pids & p for _, hi, _, _, p, _ in earlier):
            numbers = _numbered_after(b, max(max(n, default=-1) for _, _, n, _, _, _ in earlier) + 1, clash[0][0])
        elif clash:
            other, n = clash[0]
            raise TraceError(
                b.path,
                f"rank {b.rank} appears twice (also in {other}, with ProfilerStep#{min(numbers & n)} in both: another run?)",
            )
        seen.setdefault(b.rank, []).append((*span, numbers, b.path, pids, bool(clash)))
        if steps_at:
            b.steps = _numbered_on(_named_steps(b, steps_at), counted.get(b.rank, 0))
            counted[b.rank] = counted.get(b.rank, 0) + len(b.steps)
        elif b.steps:
            b.steps = _outermost_steps(b)
        else:
            b.steps = _numbered_on(_optimizer_steps(b), counted.get(b.rank, 0))
            counted[b.rank] = counted.get(b.rank, 0) + len(b.steps)
            if not b.steps:
                b.step_hint = _repeated_annotation(b)
        for note in b.notes:
            warnings.warn(note, OracleWarning, stacklevel=2)
        merger.add(b)
    if not seen:
        raise TraceError(path, f"folder holds no profiler trace ({skipped[0].problem}: {Path(skipped[0].path).name})")
    if steps_at and not any(counted.values()):
        raise TraceError(path, f"no host op matches --steps-at {steps_at!r} (a shell-style pattern the whole name must match)")
    if steps_at and not all(counted.get(r) for r in seen):
        lacking = sorted(r for r in seen if not counted.get(r))
        warnings.warn(
            f"{path}: no host op of rank{'s' if len(lacking) > 1 else ''} {', '.join(map(str, lacking[:8]))} matches --steps-at "
            f"{steps_at!r}: {'they have' if len(lacking) > 1 else 'it has'} no steps",
            OracleWarning,
            stacklevel=2,
        )
    for exc in skipped:  # a results file or an execution trace beside the rank traces
        warnings.warn(f"{exc.path}: skipped, {exc.problem}", OracleWarning, stacklevel=2)
    opening = _window_openers(seen)
    if opening:
        shown = ", ".join(map(str, opening[:8])) + (f" and {len(opening) - 8} more" if len(opening) > 8 else "")
        warnings.warn(
            f"{path}: step{'s' if len(opening) > 1 else ''} {shown} open{'' if len(opening) > 1 else 's'} a new profiling window "
            "(a rank's trace is in several files): such a step also holds the export of the window before it, while the "
            "other ranks wait; leave it out of comparisons (--step)",
            OracleWarning,
            stacklevel=2,
        )
    return merger.table()


_TRAILING_NUMBER = re.compile(r"\s*\d+\s*$")


_RANK_NAME = re.compile(r"^\s*rank\W*(\d+)\s*$", re.IGNORECASE)


def _merged_anchors(b: _Builder) -> set[int] | None:
    """The processes of a file that each stand for a rank, where the file holds several: those
    that count the same ProfilerStep side by side, or, in a trace without steps, those whose host
    threads call the runtime (one process's trace has one such process: the profiler records its
    own). None where there is one."""
    by_number: dict[int, set[int]] = {}
    for s in b.steps:
        by_number.setdefault(s[1], set()).add(s[4])
    if any(len(p) > 1 for p in by_number.values()):
        return {s[4] for s in b.steps}
    if b.steps:
        return None  # (processes that take turns, each its own steps: not ranks side by side)
    calls = [part["pid"][part["cls"] == EvClass.RUNTIME] for part in b.parts]
    callers = set(np.unique(np.concatenate(calls)).tolist()) if calls else set()
    return callers if len(callers) > 1 else None


def _rank_groups(b: _Builder, step_pids: set[int] | None) -> dict[int, tuple[str, int]] | None:
    """For a file that holds several ranks' traces merged into one (``step_pids``: the processes that
    stand for its ranks, _merged_anchors), each process's rank: process
    code -> (its rank's label, its rank), from what the merge left, tried in turn: every event's
    ``args.rank`` (TraceLens' TraceFuse), one process per rank named "Rank N" or not (a script that
    gives each rank one pid for all its events), the processes' names with their trailing
    number left out (SGLang's ``"[TP03] 59994"``, its device ``"[TP03] 0"``). None where the file
    is not such a merge (one process counts the steps) or its processes do not group so."""
    if step_pids is None:
        return None
    used = set(np.unique(np.concatenate([part["pid"] for part in b.parts])).tolist()) if b.parts else set()
    if used and used <= set(b.pid_ranks):
        return {p: (f"rank {b.pid_ranks[p]}", b.pid_ranks[p]) for p in used}
    if used and used <= step_pids:
        named = {p: _RANK_NAME.match(" ".join(b.process_names.get(p, [])[:1])) for p in used}
        if all(named.values()) and len({m.group(1) for m in named.values() if m}) == len(used):
            return {p: (f"rank {m.group(1)}", int(m.group(1))) for p, m in named.items() if m}
        return {p: (f"process {p}", k) for k, p in enumerate(sorted(used))}
    if not step_pids <= set(b.pid_strings):
        return None
    prefix = {code: _TRAILING_NUMBER.sub("", name) for code, name in b.pid_strings.items()}
    labels = {prefix[p] for p in step_pids}
    if len(labels) != len(step_pids) or "" in labels or any(prefix.get(p) not in labels for p in used):
        return None
    ordered = sorted(labels)
    found = [re.findall(r"\d+", g) for g in ordered]
    ranks = (
        [int(f[0]) for f in found]
        if all(len(f) == 1 for f in found) and len({f[0] for f in found}) == len(found)
        else list(range(len(ordered)))
    )
    rank_of = dict(zip(ordered, ranks))
    return {p: (prefix[p], rank_of[prefix[p]]) for p in used}


def _split_merged(b: _Builder) -> list[_Builder]:
    """A file that holds several ranks' traces merged (a merge script for viewing them together in
    Perfetto or chrome://tracing, _rank_groups) split into one builder per rank. Correlation ids
    are each process's own count, so the ranks' launches can only be tied to their device ops
    apart. Any other file is returned as it is (one whose processes count steps side by side but
    do not group is said to look merged, _outermost_steps)."""
    anchors = _merged_anchors(b)
    groups_of = _rank_groups(b, anchors)
    if groups_of is None:
        if anchors is not None and not b.steps:  # (with steps, _outermost_steps says so)
            shown = ", ".join(str(p) for p in sorted(anchors)[:4]) + (", ..." if len(anchors) > 4 else "")
            b.notes.append(
                f"{b.path}: {len(anchors)} processes call the device's runtime (pids {shown}): this looks like several ranks' "
                "traces merged into one file, read here as one rank (device ops are matched to launches by correlation ids "
                "that each process counts on its own); give each rank its own file"
            )
        return [b]
    ranks = sorted({r for _, r in groups_of.values()})
    labels = sorted({label for label, _ in groups_of.values()}, key=lambda g: next(r for lb, r in groups_of.values() if lb == g))
    out = []
    for r in ranks:
        mine_set = {p for p, (_, rr) in groups_of.items() if rr == r}
        mine = np.array(sorted(mine_set), dtype=np.int64)
        one = _Builder(r, b.path, dict(b.meta))
        one.names, one.str_codes, one.pg_codes = b.names, b.str_codes, b.pg_codes
        one.base, one.clock_base_us, one.devices = b.base, b.clock_base_us, b.devices
        for part in b.parts:
            keep = np.isin(part["pid"], mine)
            cut = {k: v[keep] for k, v in part.items()}
            cut["rank"] = np.full(int(keep.sum()), r, dtype=part["rank"].dtype)
            one.parts.append(cut)
        keep = np.isin(b.flows["pid"], mine)
        one.flows = {k: v[keep] for k, v in b.flows.items()}
        one.flows["rank"] = np.full(int(keep.sum()), r, dtype=b.flows["rank"].dtype)
        one.steps = [(r, *s[1:]) for s in b.steps if s[4] in mine_set]
        one.thread_names = {k: v for k, v in b.thread_names.items() if k[0] in mine_set}
        one.process_names = {k: v for k, v in b.process_names.items() if k in mine_set}
        numbered = [v for k, v in b.numbered_by_pid.items() if k in mine_set]
        if numbered:  # (the numbers of one rank's events: its processes' together)
            one.numbered = {
                "events": sum(v["events"] for v in numbered),
                "first": min(v["first"] for v in numbered),
                "last": max(v["last"] for v in numbered),
            }
        out.append(one)
    shown = ", ".join(repr(g) for g in labels[:4]) + (", ..." if len(labels) > 4 else "")
    out[0].notes = [
        *b.notes,
        f"{b.path}: holds {len(ranks)} ranks' traces merged into one file ({'processes that count their own ProfilerSteps side by side' if b.steps else 'processes that each call the device runtime'}"
        f": {shown}): read as rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks[:8]))}{', ...' if len(ranks) > 8 else ''}",
    ]
    return out


def _numbered_after(b: _Builder, first: int, other: str) -> set[int]:
    """A later window of a process whose ProfilerStep numbers start again (a new profiler in the
    same process: each counts its steps from 0) numbered on from ``first``, after its rank's
    earlier windows' steps, said in a note; its new step numbers."""
    old = sorted({s[1] for s in b.steps})
    shift = first - old[0]
    b.steps = [(r, n + shift, a, e, p, t) for r, n, a, e, p, t in b.steps]
    b.notes.append(
        f"{b.path}: its ProfilerStep numbers ({old[0]}–{old[-1]}) start again after {other}'s, in the same process "
        f"and later: a new profiler's window of the same run, its steps numbered on from there ({old[0] + shift}–{old[-1] + shift})"
    )
    return {s[1] for s in b.steps}


def _window_openers(seen: dict[int, list[tuple[float, float, set[int], str, set[int], bool]]]) -> list[int]:
    """The first step of every window but a rank's first, over the ranks recorded in windows of
    one profiler (``schedule(repeat=...)``: the step after a window holds its export); not a new
    profiler's window (_numbered_after: the one before exported as it closed, between steps)."""
    out: set[int] = set()
    for files in seen.values():
        for _, _, numbers, _, _, restarted in sorted(files, key=lambda f: f[0])[1:]:
            if numbers and not restarted:
                out.add(min(numbers))
    return sorted(out)


def _time_span(b: _Builder) -> tuple[float, float]:
    """First and last µs of a file's events, on the clock its events were recorded with. A rank
    recorded in several profiling windows (``oracle_profile(window=...)``,
    ``torch.profiler.schedule(repeat=...)`` with ``tensorboard_trace_handler``) has a file per
    window, one after the other in time: they are merged as one trace of that rank."""
    lo = min((float(p["ts"].min()) for p in b.parts if len(p["ts"])), default=0.0)
    hi = max((float((p["ts"] + p["dur"]).max()) for p in b.parts if len(p["ts"])), default=0.0)
    base = float(b.base + (b.clock_base_us or 0))  # (on the wall clock where the file says where its times start)
    return base + lo, base + hi


IRREGULAR_OPTIMIZER_STEPS = 2.0
"""``_optimizer_steps`` cuts no steps where the intervals between optimizer steps alternate in two
sizes (four or more of them): every other one shorter than each of the rest by more than this
factor — two optimizers of one class stepping in turn within an iteration. Slow steps among
regular ones (an injected delay, a periodic checkpoint), or steps that alternate by less, are
not this."""


def _outermost_host(b: _Builder, codes: np.ndarray) -> tuple[dict[tuple[int, int], list[tuple[float, float, int]]], dict[int, float]]:
    """Per (pid, tid): the host events named ``codes`` that start after every earlier one of them
    on the thread has ended (the ones no other encloses), as (start, end, name code) in time
    order; and per pid, its first host event's start. One sort, not a loop per event (a trace
    recorded with Python frames holds millions of ranges)."""
    first: dict[int, float] = {}
    cols: dict[str, list[np.ndarray]] = {"pid": [], "tid": [], "ts": [], "end": [], "name": []}
    for part in b.parts:
        host = part["cls"] == EvClass.CPU
        if host.any():
            pids, inv = np.unique(part["pid"][host], return_inverse=True)
            lowest = np.full(len(pids), np.inf)
            np.minimum.at(lowest, inv.reshape(-1), part["ts"][host])
            for p, t in zip(pids.tolist(), lowest.tolist()):
                first[p] = min(first.get(p, t), t)
        sel = host & np.isin(part["name"], codes)
        cols["pid"].append(part["pid"][sel])
        cols["tid"].append(part["tid"][sel])
        cols["ts"].append(part["ts"][sel])
        cols["end"].append(part["ts"][sel] + part["dur"][sel])
        cols["name"].append(part["name"][sel])
    got = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    if not len(got["ts"]):
        return {}, first
    threads, th = np.unique(np.stack([got["pid"], got["tid"]], axis=1), axis=0, return_inverse=True)
    th = th.reshape(-1)
    order = np.lexsort((got["ts"] - got["end"], got["ts"], th))  # per thread by start, the longer first
    t0 = float(got["ts"].min())
    span = float(got["end"].max()) - t0 + 1.0
    shift = th[order] * span  # (each thread's times apart from the others': one running maximum for all)
    ends = np.maximum.accumulate(shift + got["end"][order] - t0)
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = shift[1:] + got["ts"][order][1:] - t0 >= ends[:-1]
    outer: dict[tuple[int, int], list[tuple[float, float, int]]] = {}
    kept = order[keep]
    for k, a, e, c in zip(th[kept].tolist(), got["ts"][kept].tolist(), got["end"][kept].tolist(), got["name"][kept].tolist()):
        outer.setdefault((int(threads[k][0]), int(threads[k][1])), []).append((float(a), float(e), int(c)))
    return outer, first


def _numbered_on(steps: list[tuple[int, int, float, float, int, int]], before: int) -> list[tuple[int, int, float, float, int, int]]:
    """``steps`` numbered on from ``before`` steps in a rank's earlier files."""
    return [(r, n + before, a, e, p, t) for r, n, a, e, p, t in steps]


def _optimizer_steps(b: _Builder) -> list[tuple[int, int, float, float, int, int]]:
    """Steps of a trace without ProfilerStep markers (a loop that never calls the profiler's
    ``step()``, the commonest way to record one), cut where its optimizer's steps end: PyTorch
    records ``Optimizer.step#<class>.step`` around each ``optimizer.step()``, once an iteration.
    Step k runs from the end of optimizer step k-1 (step 1: from the process's first host event)
    to the end of optimizer step k, numbered from 1; what follows the last is in no step, as after
    a last ProfilerStep. The optimizer (annotation name) and thread with the most outermost such
    annotations are read (a wrapper optimizer's step encloses the one it wraps); of several
    stepping once an iteration each, the last to end. None is cut, with a note, where there are
    fewer than two, or where the intervals between them alternate short and long (two optimizers
    of one class, each stepping once an iteration, would cut an iteration in parts)."""
    prefix = F.OPTIMIZER_STEP_PREFIX
    codes = np.array([k for k, n in enumerate(b.names) if n.startswith(prefix)], dtype=np.int64)
    if not len(codes):
        return []
    outer, first = _outermost_host(b, codes)
    families: dict[tuple[int, int, int], list[tuple[float, float, int]]] = {}
    for (p, t), kept in outer.items():
        for s in kept:
            families.setdefault((p, t, s[2]), []).append(s)
    # the most of one optimizer's steps; of several optimizers stepping once an iteration, the last to end
    (pid, tid, code), spans = max(families.items(), key=lambda kv: (len(kv[1]), kv[1][0][1]))
    name = b.names[code]
    if len(spans) < 2:
        return []
    ends = np.array([s[1] for s in spans])
    gaps = np.diff(ends)
    odd, even = gaps[1::2], gaps[0::2]
    if len(gaps) >= 4 and (
        float(odd.max()) * IRREGULAR_OPTIMIZER_STEPS < float(even.min()) or float(even.max()) * IRREGULAR_OPTIMIZER_STEPS < float(odd.min())
    ):
        b.notes.append(
            f"{b.path}: no ProfilerStep markers, and its {len(spans)} {name} annotations come at intervals that alternate "
            "short and long (two optimizers stepping in turn?): the whole trace is analysed as one window; call the profiler's step() once an iteration to mark "
            "steps, or name the annotation that starts each (--steps-at)"
        )
        return []
    b.notes.append(
        f"{b.path}: no ProfilerStep markers (the loop does not call the profiler's step()); its {len(spans)} steps are cut "
        f"at the ends of the {name} annotations (thread {tid}), step 1 from the trace's first host event"
    )
    b.steps_from = {"name": name, "at": "end"}
    starts = [min(first.get(pid, spans[0][0]), spans[0][0]), *ends[:-1].tolist()]
    return [(b.rank, k + 1, float(a), float(e), pid, tid) for k, (a, e) in enumerate(zip(starts, ends.tolist()))]


STEP_HINT_MIN = 3
"""``_repeated_annotation`` names a pattern only where it repeats this often."""


def _repeated_annotation(b: _Builder) -> tuple[str, int] | None:
    """For a file without steps: the annotation that repeats most often at the top of one thread
    (no other annotation of that thread encloses it), as a ``--steps-at`` pattern (its digits as
    ``*``: an inference engine names each iteration's batch, ``execute_16_iter_1``), and how many
    there are; None below STEP_HINT_MIN. A hint for the user, who knows the loop: never used to
    cut steps on its own (a server's threads run requests side by side)."""
    ranged = np.zeros(len(b.names), dtype=bool)
    for part in b.parts:
        ranged[part["name"][(part["cls"] == EvClass.CPU) & part["is_range"]]] = True
    # annotations, not the Python tracer's frames ("train.py(42): step", "<built-in method ...>")
    codes = np.array([k for k in np.flatnonzero(ranged).tolist() if not _PYTHON_FRAME.search(b.names[k])], dtype=np.int64)
    if not len(codes):
        return None
    outer, _ = _outermost_host(b, codes)
    best: tuple[int, str] | None = None
    for spans in outer.values():
        counts: dict[str, int] = {}
        for s in spans:
            pattern = _DIGITS.sub("*", glob.escape(b.names[s[2]]))  # (a name's own [, ?, * matched as they are)
            counts[pattern] = counts.get(pattern, 0) + 1
        for pattern, n in counts.items():
            if n >= STEP_HINT_MIN and (best is None or n > best[0]):
                best = (n, pattern)
    return (best[1], best[0]) if best else None


_DIGITS = re.compile(r"\d+")
_PYTHON_FRAME = re.compile(r"\.py\(\d+\)|^<built-in ")


def _named_steps(b: _Builder, pattern: str) -> list[tuple[int, int, float, float, int, int]]:
    """Steps that start where a host op named ``pattern`` starts (``--steps-at``: a shell-style
    pattern the whole name matches, e.g. ``execute_*``): a loop whose iterations its own
    annotations mark (an inference server's, a script without ``prof.step()``), or whose
    ProfilerStep markers are not its iterations. The thread with the most outermost such ops is
    read; step k runs from the start of the k-th to the start of the next (what runs between two,
    loading the next batch or scheduling the next request, is the iteration's), the last to its
    thread's last host event; numbered from 1. None where no host op of the file matches."""
    codes = np.array([k for k, n in enumerate(b.names) if fnmatch.fnmatchcase(n, pattern)], dtype=np.int64)
    if not len(codes):
        return []
    outer, _ = _outermost_host(b, codes)
    if not outer:
        return []
    (pid, tid), spans = max(outer.items(), key=lambda kv: (len(kv[1]), -kv[1][0][0]))
    names = sorted({b.names[s[2]] for s in spans})
    b.steps_from = {"name": names[0] if len(names) == 1 else pattern, "at": "start"}
    b.notes.append(
        f"{b.path}: {len(spans)} steps cut where the host ops matching --steps-at {pattern!r} start (thread {tid}"
        + (f", {len(names)} names, e.g. {names[0]!r}" if len(names) > 1 else "")
        + ")"
    )
    last = spans[-1][1]  # the last runs on to its thread's last host event (as a last ProfilerStep to the profiler's stop)
    for part in b.parts:
        mine = (part["cls"] == EvClass.CPU) & (part["pid"] == pid) & (part["tid"] == tid)
        if mine.any():
            last = max(last, float((part["ts"][mine] + part["dur"][mine]).max()))
    starts = [s[0] for s in spans]
    ends = [*starts[1:], last]
    return [(b.rank, k + 1, a, e, pid, tid) for k, (a, e) in enumerate(zip(starts, ends))]


def _outermost_steps(b: _Builder) -> list[tuple[int, int, float, float, int, int]]:
    """One ProfilerStep#N per rank: a second span with the same number (nested in the first, or a
    trace written twice) is dropped with a note, keeping the longest."""
    best: dict[int, tuple[int, int, float, float, int, int]] = {}
    for s in b.steps:
        if s[1] not in best or s[3] - s[2] > best[s[1]][3] - best[s[1]][2]:
            best[s[1]] = s
    if len(best) < len(b.steps):
        numbers = sorted({s[1] for s in b.steps if sum(t[1] == s[1] for t in b.steps) > 1})
        pids = sorted({s[4] for s in b.steps if s[1] == numbers[0]})
        if len(pids) > 1:  # one process counts its steps once: several processes' steps in one file
            shown = ", ".join(str(p) for p in pids[:4]) + (", ..." if len(pids) > 4 else "")
            said = (
                f"ProfilerStep#{numbers[0]} appears in {len(pids)} processes (pids {shown}): this looks like several ranks' "
                "traces merged into one file, read here as one rank (their steps overlap, and device ops are matched to "
                "launches by correlation ids that each process counts on its own); give each rank its own file"
            )
        else:
            said = f"ProfilerStep#{numbers[0]} appears more than once (nested or repeated); the longest span is used"
        warnings.warn(f"{b.path}: {said}", OracleWarning, stacklevel=3)
    return sorted(best.values(), key=lambda s: s[2])


def scan_threads(nbytes: int) -> int:
    """Threads one trace file of ``nbytes`` JSON bytes is counted and scanned in (scan.py)."""
    return min(os.cpu_count() or 1, MAX_SCAN_THREADS) if nbytes >= SPLIT_BYTES else 1


def _by_group_then(group: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``np.lexsort((value, group))`` (stable: ties keep the table's order), sorting each group's
    values on their own: thousands of ranks of a few thousand events each sort far faster than
    one sort of all their events, and a table's ranks come in blocks (a file each)."""
    if not len(group) or group.min() == group.max():
        return np.argsort(value, kind="stable")
    return np.concatenate([part[np.argsort(value[part], kind="stable")] for _, part in groups(group)])


def cpu_parents(table: EventTable) -> np.ndarray:
    """Row of the innermost enclosing CPU event of every event (-1 for roots and GPU ops)."""
    c = table.cols
    cpu = np.flatnonzero((c["cls"] == EvClass.CPU) | (c["cls"] == EvClass.RUNTIME))
    order = cpu[np.lexsort((-c["dur"][cpu], c["ts"][cpu], c["tid"][cpu], c["pid"][cpu], c["rank"][cpu]))]
    parent = np.full(len(table), -1, dtype=np.int64)
    ts = c["ts"][order].astype(np.float64)
    end = ts + c["dur"][order]
    _nest(order, ts, end, c["rank"][order].astype(np.int64), c["pid"][order].astype(np.int64), c["tid"][order].astype(np.int64), parent)
    return parent


@numba.njit(cache=True, nogil=True)
def _nest(
    rows: np.ndarray, ts: np.ndarray, end: np.ndarray, rank: np.ndarray, pid: np.ndarray, tid: np.ndarray, parent: np.ndarray
) -> None:
    """``parent[rows[p]]``: the innermost event of the same thread open around event p, for events
    sorted by thread, start and longest first (a stack per thread)."""
    stack = np.empty(len(rows), dtype=np.int64)
    top = 0
    for p in range(len(rows)):
        if p == 0 or rank[p] != rank[p - 1] or pid[p] != pid[p - 1] or tid[p] != tid[p - 1]:
            top = 0
        while top > 0 and end[stack[top - 1]] <= ts[p] and not (end[stack[top - 1]] == ts[p] and ts[p] == ts[stack[top - 1]]):
            top -= 1
        if top > 0 and end[p] <= end[stack[top - 1]] + 1e-6:
            parent[rows[p]] = rows[stack[top - 1]]
        stack[top] = p
        top += 1


def ancestors_of(parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows themselves and every enclosing CPU event of them."""
    seen = set()
    todo = [int(r) for r in rows if r >= 0]
    while todo:
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        p = int(parent[r])
        if p >= 0:
            todo.append(p)
    return np.array(sorted(seen), dtype=np.int64)

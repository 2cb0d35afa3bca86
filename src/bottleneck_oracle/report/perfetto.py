"""Annotated trace for Perfetto / chrome://tracing: the input events with the critical path marked.

As HTA's overlay does: every event on the critical path (and the ops enclosing it)
gets ``args.critical = 1`` and ``args.slack_us``; consecutive critical events are
joined by flow arrows of category ``critical_path``. Several rank files are merged
into one trace, each rank's processes renamed ``rank N: ...``.
"""

from __future__ import annotations

import gzip
import queue
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline import scan
from bottleneck_oracle.graph_pipeline.events import (
    EventTable,
    MappedTrace,
    TraceBytes,
    _decode,
    ancestors_of,
    bytes_as_read,
    cpu_parents,
    scan_threads,
)


def _pid(rank: int, pid: object, multi: bool) -> object:
    if not multi:
        return pid
    if isinstance(pid, int):
        return rank * 10_000_000 + pid
    return f"rank {rank}: {pid}"


def critical_events(a: StepAnalysis) -> tuple[np.ndarray, np.ndarray]:
    """A step's critical path as the overlay needs it: the table rows of its ops in path order
    and their slack (µs). Small: a long run keeps this per step, not the graphs."""
    ev = a.graph.nodes["event"][a.cpm.path]
    real = a.cpm.path[ev >= 0]
    return ev[ev >= 0].astype(np.int64), a.cpm.slack[real].astype(np.float64)


def write_overlay(table: EventTable, analyses: list[StepAnalysis], out: str | Path, gz: bool | None = None) -> Path:
    """Write the annotated trace atomically (gzipped if ``gz``, by default if the name ends in .gz); returns the path."""
    return write_overlay_paths(table, [critical_events(a) for a in analyses], out, gz)


def write_overlay_paths(table: EventTable, paths: list[tuple[np.ndarray, np.ndarray]], out: str | Path, gz: bool | None = None) -> Path:
    """``write_overlay`` from each step's ``critical_events``.

    Streamed: each rank file is read as bytes, its events located (scan.object_bounds), the
    events that change decoded and rewritten one at a time, the rest copied as they are. Memory
    is one file's bytes and two integers per event, not the decoded trace."""
    out = Path(out)
    gz = out.name.endswith(".gz") if gz is None else gz
    empty = np.zeros(0, np.int64)
    ev_all = np.concatenate([ev for ev, _ in paths]) if paths else empty
    slack_all = np.concatenate([sl for _, sl in paths]) if paths else np.zeros(0)
    flow_a = np.concatenate([ev[:-1] for ev, _ in paths]) if paths else empty  # consecutive critical events
    flow_b = np.concatenate([ev[1:] for ev, _ in paths]) if paths else empty
    crit_rows = ancestors_of(cpu_parents(table), ev_all)
    rank_col, src_idx = table.cols["rank"], table.cols["src_idx"]
    multi = len(table.files) > 1
    # per rank: which events change, as arrays over the file's events (not sets of Python tuples)
    ends_rows = np.unique(np.concatenate([flow_a, flow_b]))
    located: dict[int, tuple[np.ndarray, list]] = {}  # rank -> (endpoint event indices, their pid/tid/ts/dur as written)
    # a million small writes into gzip cost more than compressing them: _Chunks gathers them
    with atomic_path(out) as tmp, gzip.open(tmp, "wb", compresslevel=GZIP_LEVEL) if gz else open(tmp, "wb") as sink, _Chunks(sink) as fh:
        fh.write(b'{"traceEvents":[')
        first = True
        for rank, name in sorted(table.files.items()):
            path = Path(name)
            # a large file through a mapping, its pages given back behind the writer; as the loader read
            # it (names mended: copied verbatim, they are valid JSON; a trace cut short, closed)
            given = table.inputs.get(rank, {})
            raw = bytes_as_read(path, mended=name in given.get("mended", {}), cut=name in given.get("cut", []))
            data = raw.map if isinstance(raw, MappedTrace) else raw
            buf = np.frombuffer(data, dtype=np.uint8)
            # a large file is walked in parts, one thread each (as the loader scans it)
            lo, hi, _, _, _, err, count, splits = scan.count_events(buf, scan_threads(len(buf)))
            if err == scan.OK and lo >= 0:
                err, pos, starts, ends, (problem, at) = scan.object_bounds(buf, lo, hi, count, splits, text=not multi)
            if err != scan.OK or lo < 0:
                raise TraceError(path, "changed since it was analysed (its events can no longer be found)")
            # the events copied verbatim must be what a strict JSON reader takes
            if problem == scan.NOT_UTF8:
                raise TraceError(path, f"not valid JSON (a string is not UTF-8 near byte {at})")
            if problem == scan.LONE_SURROGATE:
                raise TraceError(path, f"not valid JSON (a lone surrogate escape {bytes(data[at : at + 6]).decode()} at byte {at})")
            if isinstance(raw, MappedTrace):
                raw.release(len(raw))
            n = len(starts)

            def on_rank(rows: np.ndarray, n: int = n, rank: int = rank) -> np.ndarray:
                idx = src_idx[rows[rank_col[rows] == rank]].astype(np.int64)
                return idx[idx < n]

            mark = np.zeros(n, dtype=bool)
            mark[on_rank(crit_rows)] = True
            slack_v = np.full(n, np.nan)
            mine = rank_col[ev_all] == rank
            keep = src_idx[ev_all[mine]] < n
            slack_v[src_idx[ev_all[mine]][keep]] = slack_all[mine][keep]
            endpoint = np.zeros(n, dtype=bool)
            endpoint[on_rank(ends_rows)] = True
            ep_idx = np.flatnonzero(endpoint)
            ep_info: list = [None] * len(ep_idx)
            located[rank] = (ep_idx, ep_info)
            change = np.arange(n) if multi else np.flatnonzero(mark | ~np.isnan(slack_v) | endpoint)
            # per changed event its figures as Python values (numpy scalars cost more than the work)
            c_start, c_end = starts[change].tolist(), ends[change].tolist()
            before_end = ends[np.maximum(change - 1, 0)].tolist()  # the end of the event before it
            after_start = starts[np.minimum(change + 1, n - 1)].tolist()  # the start of the event after it
            c_mark, c_slack, c_ep = mark[change].tolist(), slack_v[change].tolist(), endpoint[change].tolist()
            whole = raw.map if isinstance(raw, MappedTrace) else raw
            pieces: list[bytes | bytearray] = []  # this rank's pieces, handed to fh in batches
            at, at_start, ep = 0, int(starts[0]) if n else 0, 0  # next event not yet written, where it starts; endpoints seen
            give_back = _GiveBack(raw)
            for j, i in enumerate(change.tolist()):
                if i > at:  # the unchanged events before it, bytes as they are (separators included)
                    if not first:
                        pieces.append(b",")
                    if before_end[j] - at_start < _BLOCK:
                        pieces.append(whole[at_start : before_end[j]])
                        give_back.upto(before_end[j])
                    else:
                        fh.write(b"".join(pieces))
                        pieces = []
                        _copy(fh, raw, at_start, before_end[j], give_back)
                    first = False
                e = _decode(path, whole[c_start[j] : c_end[j]])
                if isinstance(e, dict):
                    if "pid" in e:
                        e["pid"] = _pid(rank, e["pid"], multi)
                    if multi and e.get("ph") == "M" and e.get("name") == "process_name":
                        e.setdefault("args", {})["name"] = f"rank {rank}: {e.get('args', {}).get('name', '')}"
                    if c_mark[j]:
                        e.setdefault("args", {})["critical"] = 1
                    if c_slack[j] == c_slack[j]:  # not NaN
                        e.setdefault("args", {})["slack_us"] = round(c_slack[j], 3)
                    if c_ep[j]:
                        ep_info[ep] = (e.get("pid"), e.get("tid"), e.get("ts"), e.get("dur"))
                if c_ep[j]:
                    ep += 1
                if not first:
                    pieces.append(b",")
                pieces.append(orjson.dumps(e))
                first = False
                at, at_start = i + 1, after_start[j]
                if len(pieces) >= 8192:
                    fh.write(b"".join(pieces))
                    pieces = []
            fh.write(b"".join(pieces))
            if at < n:
                fh.write(b"" if first else b",")
                _copy(fh, raw, int(starts[at]), int(ends[-1]), give_back)
                first = False
            del raw, data, buf, starts, ends, mark, slack_v, endpoint

        # each flow end's event as written, looked up at once: (rank, index in its file) -> its place
        ranks_sorted = sorted(located)
        keys = np.concatenate([np.int64(r) * _FILE_EVENTS + located[r][0] for r in ranks_sorted]) if located else empty
        infos = [x for r in ranks_sorted for x in located[r][1]]

        def where(rows: np.ndarray) -> list:
            q = rank_col[rows].astype(np.int64) * _FILE_EVENTS + src_idx[rows].astype(np.int64)
            k = np.searchsorted(keys, q)
            hit = k < len(keys)
            hit[hit] = keys[k[hit]] == q[hit]
            return [infos[j] if h else None for j, h in zip(k.tolist(), hit.tolist())]

        flows: list[dict[str, Any]] = []  # serialised a batch at a time (one orjson call, not one per flow)
        for k, (ea, eb) in enumerate(zip(where(flow_a), where(flow_b))):
            if ea is None or eb is None or not isinstance(ea[2], (int, float)) or not isinstance(eb[2], (int, float)):
                continue
            common = {"cat": "critical_path", "name": "critical_path", "id": 900_000_000 + k}
            dur = ea[3] if isinstance(ea[3], (int, float)) else 0
            flows.append({**common, "ph": "s", "pid": ea[0], "tid": ea[1], "ts": ea[2] + dur})
            flows.append({**common, "ph": "f", "bp": "e", "pid": eb[0], "tid": eb[1], "ts": eb[2]})
            if len(flows) >= 8192:
                first = _write_batch(fh, flows, first)
        first = _write_batch(fh, flows, first)
        fh.write(b'],"displayTimeUnit":"ms","bottleneckOracle":' + orjson.dumps({"critical_events": int(len(crit_rows))}) + b"}")
        fh.flush()
    return out


def _write_batch(fh: _Chunks, events: list[dict[str, Any]], first: bool) -> bool:
    """Write ``events`` as members of the array being written (a comma before them unless
    ``first``) and empty the list; returns whether the array is still empty."""
    if not events:
        return first
    fh.write((b"" if first else b",") + orjson.dumps(events)[1:-1])
    events.clear()
    return False


GZIP_LEVEL = 1  # an overlay of a gigabyte trace: zlib's fastest level, 3x faster than 5 for ~15% more bytes
_FILE_EVENTS = np.int64(1) << np.int64(40)  # more events than any file holds: (rank, index) as one key
_CHUNK = 1 << 20
_QUEUED = 8  # chunks waiting for the writer thread


class _Sink(Protocol):
    def write(self, b: bytes, /) -> int: ...


class _Chunks:
    """Small writes gathered into 1 MiB ones, written (and compressed: zlib runs without the GIL)
    by a thread of their own while the caller goes on; a failed write is raised by the next call."""

    def __init__(self, sink: _Sink) -> None:
        self.sink = sink
        self.parts: list[bytes | bytearray] = []
        self.size = 0
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=_QUEUED)  # bounded: memory is a few chunks
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="overlay-writer", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while (chunk := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self.sink.write(chunk)
                except BaseException as exc:  # handed to the caller's thread
                    self._error = exc

    def write(self, b: bytes | bytearray) -> None:
        self.parts.append(b)
        self.size += len(b)
        if self.size >= _CHUNK:
            self._send()

    def _send(self) -> None:
        if self._error is not None:
            raise self._error
        if self.parts:
            self._queue.put(b"".join(self.parts))
            self.parts, self.size = [], 0

    def flush(self) -> None:
        """Everything written so far is in the sink."""
        self._send()
        self.close()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Stop the writer thread (after what was queued); idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> _Chunks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _GiveBack:
    """A mapped trace's pages given back behind the writer, a block at a time (a call per event
    would cost more than the copy)."""

    def __init__(self, raw: TraceBytes) -> None:
        self.raw = raw if isinstance(raw, MappedTrace) else None
        self.done = 0  # given back up to here

    def upto(self, end: int) -> None:
        """Bytes before ``end`` are written: give their pages back once a block has gathered."""
        if self.raw is not None and end - self.done >= _BLOCK:
            self.raw.release(end)
            self.done = end


def _copy(fh: _Chunks, raw: TraceBytes, a: int, b: int, give_back: _GiveBack) -> None:
    """Write bytes [a, b) of a trace a block at a time, its pages given back behind."""
    for x in range(a, b, _BLOCK):
        y = min(b, x + _BLOCK)
        fh.write(raw[x:y])
        give_back.upto(y)


_BLOCK = 16 * 2**20

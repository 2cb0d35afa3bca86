"""Annotated trace for Perfetto / chrome://tracing: the input events with the critical path marked.

As HTA's overlay does: every event on the critical path (and the ops enclosing it)
gets ``args.critical = 1`` and ``args.slack_us``; consecutive critical events are
joined by flow arrows of category ``critical_path``. Several rank files are merged
into one trace, each rank's processes renamed ``rank N: ...``.
"""

from __future__ import annotations

import codecs
import gzip
import mmap
import re
from pathlib import Path

import numpy as np
import orjson

from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline import scan
from bottleneck_oracle.graph_pipeline.events import EventTable, MappedTrace, _decode, ancestors_of, cpu_parents, map_trace


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
    with atomic_path(out) as tmp, gzip.open(tmp, "wb", compresslevel=5) if gz else open(tmp, "wb") as fh:
        fh.write(b'{"traceEvents":[')
        first = True
        for rank, path in sorted(table.files.items()):
            raw = map_trace(Path(path))  # a large file through a mapping, its pages given back behind the writer
            data = raw.map if isinstance(raw, MappedTrace) else raw
            buf = np.frombuffer(data, dtype=np.uint8)
            lo, hi, _, _, _, err = scan.find_events(buf)
            if err == scan.OK and lo >= 0:
                err, pos, starts, ends = scan.object_bounds(buf, lo, hi)
            if err != scan.OK or lo < 0:
                raise TraceError(path, "changed since it was analysed (its events can no longer be found)")
            if not multi:
                _check_text(Path(path), data, int(lo), int(hi))
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
            change = range(n) if multi else np.flatnonzero(mark | ~np.isnan(slack_v) | endpoint).tolist()
            at = 0  # next event not yet written
            for i in change:
                if i > at:  # the unchanged events before it, bytes as they are (separators included)
                    fh.write(b"" if first else b",")
                    _copy(fh, raw, int(starts[at]), int(ends[i - 1]))
                    first = False
                e = _decode(Path(path), raw[int(starts[i]) : int(ends[i])])
                if isinstance(e, dict):
                    if "pid" in e:
                        e["pid"] = _pid(rank, e["pid"], multi)
                    if e.get("ph") == "M" and e.get("name") == "process_name" and multi:
                        e.setdefault("args", {})["name"] = f"rank {rank}: {e.get('args', {}).get('name', '')}"
                    if mark[i]:
                        e.setdefault("args", {})["critical"] = 1
                    if not np.isnan(slack_v[i]):
                        e.setdefault("args", {})["slack_us"] = round(float(slack_v[i]), 3)
                    if endpoint[i]:
                        ep_info[int(np.searchsorted(ep_idx, i))] = (e.get("pid"), e.get("tid"), e.get("ts"), e.get("dur"))
                fh.write(b"" if first else b",")
                fh.write(orjson.dumps(e))
                first = False
                at = i + 1
            if at < n:
                fh.write(b"" if first else b",")
                _copy(fh, raw, int(starts[at]), int(ends[-1]))
                first = False
            del raw, data, buf, starts, ends, mark, slack_v, endpoint

        def where(row: int) -> tuple | None:
            ep_idx, info = located.get(int(rank_col[row]), (empty, []))
            k = int(np.searchsorted(ep_idx, int(src_idx[row])))
            return info[k] if k < len(ep_idx) and ep_idx[k] == src_idx[row] else None

        for k, (a, b) in enumerate(zip(flow_a.tolist(), flow_b.tolist())):
            ea, eb = where(a), where(b)
            if ea is None or eb is None or not isinstance(ea[2], (int, float)) or not isinstance(eb[2], (int, float)):
                continue
            common = {"cat": "critical_path", "name": "critical_path", "id": 900_000_000 + k}
            dur = ea[3] if isinstance(ea[3], (int, float)) else 0
            for flow in (
                {**common, "ph": "s", "pid": ea[0], "tid": ea[1], "ts": ea[2] + dur},
                {**common, "ph": "f", "bp": "e", "pid": eb[0], "tid": eb[1], "ts": eb[2]},
            ):
                fh.write(b"" if first else b",")
                fh.write(orjson.dumps(flow))
                first = False
        fh.write(b'],"displayTimeUnit":"ms","bottleneckOracle":' + orjson.dumps({"critical_events": int(len(crit_rows))}) + b"}")
    return out


def _copy(fh, raw, a: int, b: int) -> None:
    """Write bytes [a, b) of a trace a block at a time; a mapped trace gives each block's pages back."""
    mapped = isinstance(raw, MappedTrace)
    data = raw.map if mapped else raw
    for x in range(a, b, _BLOCK):
        y = min(b, x + _BLOCK)
        fh.write(data[x:y])
        if mapped:
            raw.release(y)


# a high surrogate escape not followed by a low one, or a low one not preceded by a high one
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_BLOCK = 16 * 2**20


def _check_text(path: Path, raw: bytes | bytearray | mmap.mmap, lo: int, hi: int) -> None:
    """The events copied verbatim must be what a strict JSON reader takes: UTF-8 without lone
    surrogate escapes (checked a block at a time, never the whole text decoded at once)."""
    view = memoryview(raw)[lo:hi]
    decoder = codecs.getincrementaldecoder("utf-8")()
    for a in range(0, len(view), _BLOCK):
        block = view[max(a - 12, 0) : a + _BLOCK + 12].tobytes()  # blocks overlap: a pair split by a boundary is seen whole
        try:
            decoder.decode(view[a : a + _BLOCK].tobytes(), final=a + _BLOCK >= len(view))
        except UnicodeDecodeError as exc:
            raise TraceError(path, f"not valid JSON (a string is not UTF-8 near byte {lo + a + exc.start})") from None
        if b"\\u" in block:
            m = _LONE_SURROGATE.search(block)
            if m:
                at = lo + max(a - 12, 0) + m.start()
                raise TraceError(path, f"not valid JSON (a lone surrogate escape {m.group().decode()} at byte {at})")

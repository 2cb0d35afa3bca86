"""Annotated trace for Perfetto / chrome://tracing: the input events with the critical path marked.

As HTA's overlay does: every event on the critical path (and the ops enclosing it)
gets ``args.critical = 1`` and ``args.slack_us``; consecutive critical events are
joined by flow arrows of category ``critical_path``. Several rank files are merged
into one trace, each rank's processes renamed ``rank N: ...``.
"""

from __future__ import annotations

import codecs
import gzip
import re
from pathlib import Path

import numpy as np
import orjson

from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline import scan
from bottleneck_oracle.graph_pipeline.events import EventTable, _decode, ancestors_of, cpu_parents, read_bytes


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
    rows_cp: list[np.ndarray] = []
    slack_of: dict[int, float] = {}
    flows: list[tuple[int, int]] = []
    for ev, slack_us in paths:
        slack_of.update(zip(ev.tolist(), slack_us.tolist()))
        rows_cp.append(ev)
        flows.extend(zip(ev[:-1].tolist(), ev[1:].tolist()))
    crit_rows = ancestors_of(cpu_parents(table), np.concatenate(rows_cp) if rows_cp else np.zeros(0, np.int64))
    rank_col, src_idx = table.cols["rank"], table.cols["src_idx"]

    def key(row: int) -> tuple[int, int]:
        return int(rank_col[row]), int(src_idx[row])

    marks = {key(r) for r in crit_rows.tolist()}
    slack = {key(r): v for r, v in slack_of.items()}
    ends_needed = {key(r) for pair in flows for r in pair}
    multi = len(table.files) > 1
    located: dict[tuple[int, int], dict] = {}  # flow endpoints as written: pid, tid, ts, dur
    with atomic_path(out) as tmp, gzip.open(tmp, "wb", compresslevel=5) if gz else open(tmp, "wb") as fh:
        fh.write(b'{"traceEvents":[')
        first = True
        for rank, path in sorted(table.files.items()):
            raw = read_bytes(Path(path))
            buf = np.frombuffer(raw, dtype=np.uint8)
            lo, hi, _, _, _, err = scan.find_events(buf)
            if err == scan.OK and lo >= 0:
                err, pos, starts, ends = scan.object_bounds(buf, lo, hi)
            if err != scan.OK or lo < 0:
                raise TraceError(path, "changed since it was analysed (its events can no longer be found)")
            if not multi:
                _check_text(Path(path), raw, int(lo), int(hi))
            change = range(len(starts)) if multi else sorted(i for r, i in marks | slack.keys() | ends_needed if r == rank)
            at = 0  # next event not yet written
            for i in change:
                if i >= len(starts):
                    continue
                if i > at:  # the unchanged events before it, bytes as they are (separators included)
                    fh.write(b"" if first else b",")
                    fh.write(raw[int(starts[at]) : int(ends[i - 1])])
                    first = False
                e = _decode(Path(path), raw[int(starts[i]) : int(ends[i])])
                if isinstance(e, dict):
                    if "pid" in e:
                        e["pid"] = _pid(rank, e["pid"], multi)
                    if e.get("ph") == "M" and e.get("name") == "process_name" and multi:
                        e.setdefault("args", {})["name"] = f"rank {rank}: {e.get('args', {}).get('name', '')}"
                    if (rank, i) in marks:
                        e.setdefault("args", {})["critical"] = 1
                    if (rank, i) in slack:
                        e.setdefault("args", {})["slack_us"] = round(slack[(rank, i)], 3)
                    if (rank, i) in ends_needed:
                        located[(rank, i)] = {k: e.get(k) for k in ("pid", "tid", "ts", "dur")}
                fh.write(b"" if first else b",")
                fh.write(orjson.dumps(e))
                first = False
                at = i + 1
            if at < len(starts):
                fh.write(b"" if first else b",")
                fh.write(raw[int(starts[at]) : int(ends[-1])])
                first = False
            del raw, buf, starts, ends
        for k, (a, b) in enumerate(flows):
            ea, eb = located.get(key(a)), located.get(key(b))
            if ea is None or eb is None or not isinstance(ea.get("ts"), (int, float)) or not isinstance(eb.get("ts"), (int, float)):
                continue
            common = {"cat": "critical_path", "name": "critical_path", "id": 900_000_000 + k}
            dur = ea["dur"] if isinstance(ea.get("dur"), (int, float)) else 0
            for flow in (
                {**common, "ph": "s", "pid": ea["pid"], "tid": ea["tid"], "ts": ea["ts"] + dur},
                {**common, "ph": "f", "bp": "e", "pid": eb["pid"], "tid": eb["tid"], "ts": eb["ts"]},
            ):
                fh.write(b"" if first else b",")
                fh.write(orjson.dumps(flow))
                first = False
        fh.write(b'],"displayTimeUnit":"ms","bottleneckOracle":' + orjson.dumps({"critical_events": int(len(crit_rows))}) + b"}")
    return out


# a high surrogate escape not followed by a low one, or a low one not preceded by a high one
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_BLOCK = 16 * 2**20


def _check_text(path: Path, raw: bytes | bytearray, lo: int, hi: int) -> None:
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

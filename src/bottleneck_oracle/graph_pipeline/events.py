"""Trace files -> a columnar event table (numpy), one table for all ranks.

Only the events the graph needs are materialised: complete ("X") events of the
categories in ``fields``, fwdbwd flow endpoints and ProfilerStep markers. All
times are microseconds relative to ``EventTable.t0`` (the earliest event of all
files), which keeps float64 resolution below 1 ns.
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

import numpy as np
import orjson

from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline import fields as F

MAX_TRACE_BYTES = 16 * 2**30  # refuse traces whose decompressed JSON exceeds this (bytes)
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


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

SYNC_KINDS = ("Context Sync", "Stream Sync", "Event Sync", "Stream Wait Event")


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


@dataclass(slots=True)
class EventTable:
    """Columnar events of one or more rank files. Every column has one row per event."""

    t0: float  # absolute µs of time zero
    names: list[str]
    cols: dict[str, np.ndarray]
    steps: list[Step]
    flows: dict[str, np.ndarray]  # fwdbwd flow endpoints: rank, pid, tid, ts, id, is_start
    files: dict[int, str]  # rank -> file path
    meta: dict[int, dict] = field(default_factory=dict)  # rank -> distributedInfo

    def __len__(self) -> int:
        return len(self.cols["ts"])

    @property
    def ranks(self) -> list[int]:
        return sorted(self.files)


def read_json(path: Path) -> object:
    """Read a .json or .json.gz file, raising TraceError with the problem named."""
    if not path.exists():
        raise TraceError(path, "no such file")
    if path.is_dir():
        raise TraceError(path, "is a folder, expected a trace file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            fh.seek(0)
            if head == b"\x1f\x8b":
                with gzip.open(fh) as gz:
                    raw = gz.read(MAX_TRACE_BYTES + 1)
            else:
                raw = fh.read(MAX_TRACE_BYTES + 1)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(path, f"corrupt or truncated gzip data ({exc.__class__.__name__}: {exc})") from None
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_TRACE_BYTES:
        raise TraceError(path, f"larger than {MAX_TRACE_BYTES // 2**30} GiB of JSON; split the trace by rank or window")
    if not raw.strip():
        raise TraceError(path, "file is empty")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        hint = "truncated JSON" if "unexpected end" in str(exc).lower() or "eof" in str(exc).lower() else "not valid JSON"
        raise TraceError(path, f"{hint} ({exc})") from None


def rank_of(doc: dict, path: Path, default: int | None) -> int:
    """Rank from distributedInfo.rank, else from a file name like rank-3.json.gz."""
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    m = _RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1))
    if default is not None:
        return default
    raise TraceError(path, "cannot tell the rank: no distributedInfo.rank and no rank-N in the file name")


def _as_int(value: object, codes: dict[object, int]) -> int:
    """Integer pid/tid; strings get stable negative codes."""
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return codes.setdefault(value, -(len(codes) + 2))


def _first(args: dict, keys: tuple[str, ...]) -> object:
    for k in keys:
        if k in args:
            return args[k]
    return None


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


class _Builder:
    """Accumulates rows from several files into python lists, then numpy arrays."""

    _ARG_COLS = tuple(F.ARG_SPECS)

    def __init__(self) -> None:
        self.name_codes: dict[str, int] = {}
        self.names: list[str] = []
        self.str_codes: dict[object, int] = {}
        self.pg_codes: dict[str, int] = {}
        self.rows: dict[str, list] = {
            k: []
            for k in (
                "rank",
                "pid",
                "tid",
                "ts",
                "dur",
                "name",
                "cls",
                "sync_kind",
                "pg",
                "elem_bytes",
                "src_idx",
                *self._ARG_COLS,
            )
        }
        self.flows: dict[str, list] = {k: [] for k in ("rank", "pid", "tid", "ts", "id", "is_start")}
        self.steps: list[tuple[int, int, float, float, int, int]] = []

    def code(self, name: str) -> int:
        c = self.name_codes.get(name)
        if c is None:
            c = self.name_codes[name] = len(self.names)
            self.names.append(name)
        return c

    def add_file(self, path: Path, events: list, rank: int) -> int:
        r = self.rows
        append = {k: v.append for k, v in r.items()}
        f_append = {k: v.append for k, v in self.flows.items()}
        cat_class = _CAT_CLASS
        specs = [(c, F.ARG_SPECS[c].raw_names, F.ARG_SPECS[c].default) for c in self._ARG_COLS]
        str_codes = self.str_codes
        n_before = len(r["ts"])
        for idx, ev in enumerate(events):
            if not isinstance(ev, dict):
                raise TraceError(path, f"traceEvents holds a {type(ev).__name__}, expected objects")
            ph = ev.get("ph")
            if ph == "X":
                cls = cat_class.get(ev.get("cat"))
                if cls is None:
                    continue
                name = ev.get("name")
                ts = ev.get("ts")
                dur = ev.get("dur", 0)
                if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or not isinstance(name, str):
                    raise TraceError(path, f"event {str(name)[:60]!r} has no numeric ts/dur or no name")
                if dur < 0:
                    raise TraceError(path, f"event {name[:80]!r} at ts={ts} has a negative duration ({dur} µs)")
                pid = _as_int(ev.get("pid"), str_codes)
                tid = _as_int(ev.get("tid"), str_codes)
                if cls == EvClass.CPU and name.startswith(F.STEP_PREFIX):
                    num = name[len(F.STEP_PREFIX) :]
                    if num.isdigit():
                        self.steps.append((rank, int(num), float(ts), float(ts + dur), pid, tid))
                    continue
                args = ev.get("args") or {}
                append["rank"](rank)
                append["src_idx"](idx)
                append["pid"](pid)
                append["tid"](tid)
                append["ts"](float(ts))
                append["dur"](float(dur))
                append["name"](self.code(name))
                append["cls"](int(cls))
                for col, keys, default in specs:
                    v = default
                    for k in keys:
                        if k in args:
                            v = args[k]
                            break
                    if not isinstance(v, (int, float)):
                        v = default
                    append[col](v)
                sync = args.get(F.SYNC_KIND_KEY) if cls == EvClass.GPU_SYNC else None
                append["sync_kind"](
                    SYNC_KINDS.index(sync) if sync in SYNC_KINDS else (SYNC_KINDS.index(name) if name in SYNC_KINDS else -1)
                )
                pg = -1
                elem = math.nan
                if args:
                    ranks_v = _first(args, F.PG_RANKS_KEYS)
                    pg_name = _first(args, F.PG_NAME_KEYS)
                    if ranks_v is not None or pg_name is not None:
                        key = f"{pg_name}|{ranks_v}"
                        pg = self.pg_codes.setdefault(key, len(self.pg_codes))
                    dtype = _first(args, F.DTYPE_KEYS)
                    if dtype is None and F.INPUT_TYPE_KEY in args:
                        types = args[F.INPUT_TYPE_KEY]
                        dtype = types[0] if isinstance(types, list) and types else None
                    if isinstance(dtype, str):
                        elem = float(F.DTYPE_BYTES.get(dtype, math.nan))
                    if r["msg_nelems"][-1] != r["msg_nelems"][-1] and F.INPUT_DIMS_KEY in args:
                        r["msg_nelems"][-1] = _prod(args[F.INPUT_DIMS_KEY])
                append["pg"](pg)
                append["elem_bytes"](elem)
            elif (ph == "s" or ph == "f") and ev.get("cat") in F.FLOW_CATS:
                fid = ev.get("id")
                if not isinstance(fid, int) or not isinstance(ev.get("ts"), (int, float)):
                    continue
                f_append["rank"](rank)
                f_append["pid"](_as_int(ev.get("pid"), str_codes))
                f_append["tid"](_as_int(ev.get("tid"), str_codes))
                f_append["ts"](float(ev["ts"]))
                f_append["id"](fid)
                f_append["is_start"](ph == "s")
        return len(r["ts"]) - n_before

    def table(self, files: dict[int, str], meta: dict[int, dict]) -> EventTable:
        dtypes = {
            "rank": np.int32,
            "pid": np.int64,
            "tid": np.int64,
            "ts": np.float64,
            "dur": np.float64,
            "name": np.int32,
            "cls": np.int8,
            "sync_kind": np.int8,
            "pg": np.int32,
            "elem_bytes": np.float64,
            "src_idx": np.int64,
        }
        dtypes.update({c: np.dtype(F.ARG_SPECS[c].dtype) for c in self._ARG_COLS})
        cols = {k: np.asarray(v, dtype=dtypes[k]) for k, v in self.rows.items()}
        starts = [s[2] for s in self.steps]
        t0 = float(min(cols["ts"].min() if len(cols["ts"]) else math.inf, min(starts, default=math.inf)))
        cols["ts"] -= t0
        fl = {k: np.asarray(v, dtype=np.float64 if k == "ts" else (bool if k == "is_start" else np.int64)) for k, v in self.flows.items()}
        fl["ts"] -= t0
        steps = [Step(r, n, a - t0, b - t0, p, t) for r, n, a, b, p, t in self.steps]
        steps.sort(key=lambda s: (s.number, s.rank))
        return EventTable(t0=t0, names=self.names, cols=cols, steps=steps, flows=fl, files=files, meta=meta)


def trace_files(path: str | Path) -> list[Path]:
    """The trace files a path names: the file itself, or every *.json[.gz] in a folder."""
    p = Path(path)
    if not p.exists():
        raise TraceError(p, "no such file or folder")
    if p.is_file():
        return [p]
    files = sorted(f for f in p.iterdir() if f.is_file() and (f.name.endswith(".json") or f.name.endswith(".json.gz")))
    if not files:
        raise TraceError(p, "folder holds no .json or .json.gz trace files")
    return files


def kineto_events(doc: object, path: Path) -> list:
    """The traceEvents list of a Kineto/Chrome trace document, or a clear error."""
    if isinstance(doc, list):
        events = doc  # the Chrome "JSON array" form
    elif isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events = doc["traceEvents"]
    elif isinstance(doc, dict) and "nodes" in doc and "schema" in doc:
        raise TraceError(path, "is a PyTorch execution trace, not a Kineto trace; pass it with --et (paired with its Kineto trace)")
    else:
        keys = ", ".join(list(doc)[:5]) if isinstance(doc, dict) else type(doc).__name__
        raise TraceError(path, f"JSON but not a profiler trace: no traceEvents list (found {keys})")
    if not events:
        raise TraceError(path, "trace holds no events")
    return events


def load_events(path: str | Path) -> EventTable:
    """Load one trace file or a folder of per-rank trace files into one EventTable."""
    files = trace_files(path)
    builder = _Builder()
    ranks: dict[int, str] = {}
    meta: dict[int, dict] = {}
    for i, f in enumerate(files):
        doc = read_json(f)
        events = kineto_events(doc, f)
        rank = rank_of(doc if isinstance(doc, dict) else {}, f, default=i if len(files) == 1 else None)
        if rank in ranks:
            raise TraceError(f, f"rank {rank} appears twice (also in {ranks[rank]})")
        n = builder.add_file(f, events, rank)
        if n == 0:
            raise TraceError(f, "no CPU or GPU op events (ph='X') in the trace")
        ranks[rank] = str(f)
        info = doc.get("distributedInfo") if isinstance(doc, dict) else None
        meta[rank] = info if isinstance(info, dict) else {}
    return builder.table(ranks, meta)


def cpu_parents(table: EventTable) -> np.ndarray:
    """Row of the innermost enclosing CPU event of every event (-1 for roots and GPU ops)."""
    c = table.cols
    cpu = np.flatnonzero((c["cls"] == EvClass.CPU) | (c["cls"] == EvClass.RUNTIME))
    order = cpu[np.lexsort((-c["dur"][cpu], c["ts"][cpu], c["tid"][cpu], c["pid"][cpu], c["rank"][cpu]))]
    parent = np.full(len(table), -1, dtype=np.int64)
    ts = c["ts"][order].tolist()
    end = (c["ts"][order] + c["dur"][order]).tolist()
    thread = list(zip(c["rank"][order].tolist(), c["pid"][order].tolist(), c["tid"][order].tolist()))
    rows = order.tolist()
    stack: list[int] = []  # positions into `order`
    current = None
    for p in range(len(rows)):
        if thread[p] != current:
            stack.clear()
            current = thread[p]
        while stack and end[stack[-1]] <= ts[p] and not (end[stack[-1]] == ts[p] == ts[stack[-1]]):
            stack.pop()
        if stack and end[p] <= end[stack[-1]] + 1e-6:
            parent[rows[p]] = rows[stack[-1]]
        stack.append(p)
    return parent


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

"""Trace files -> a columnar event table (numpy), one table for all ranks.

Only the events the graph needs are materialised: complete ("X") events of the
categories in ``fields``, fwdbwd flow endpoints and ProfilerStep markers. All
times are microseconds relative to ``EventTable.t0`` (the earliest event of all
files), which keeps float64 resolution below 1 ns.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import math
import multiprocessing
import os
import re
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

import numpy as np
import orjson

from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline import fields as F

MAX_TRACE_BYTES = 16 * 2**30  # refuse traces whose decompressed JSON exceeds this (bytes)
PARALLEL_BYTES = 32 * 2**20  # parse a folder in parallel above this many bytes on disk
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
    data_deps: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    """(producer row, consumer row) pairs of CPU ops from a PyTorch execution trace (et.attach)."""

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


def _int_column(values: list, codes: dict[object, int]) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array([_as_int(v, codes) for v in values], dtype=np.int64)


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


def _arg(args: dict, col: str) -> object:
    spec = F.ARG_SPECS[col]
    v = _first(args, spec.raw_names)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else spec.default


_COMM_MARKERS = ("nccl", "gloo", "c10d", "record_param_comms")
_SPARSE = ("correlation", "ext_id", "stream", "wait_stream", "wait_event_corr", "msg_nelems", "group_size", "pg", "elem_bytes", "sync_kind")
_SPARSE_DEFAULT = {"pg": -1, "elem_bytes": math.nan, "sync_kind": -1}
_SPARSE_DTYPE = {"pg": np.int32, "sync_kind": np.int8, "group_size": np.int32, "elem_bytes": np.float64, "msg_nelems": np.float64}


class _Builder:
    """Accumulates rows from several files into python lists, then numpy arrays.

    Dense columns get one append per event; arguments only a few events carry
    (correlation ids, streams, collective sizes) are stored sparsely as (row, value)."""

    def __init__(self, rank: int = 0, path: str = "", meta: dict | None = None) -> None:
        self.rank, self.path, self.meta = rank, path, meta or {}
        self.name_codes: dict[str, int] = {}
        self.names: list[str] = []
        self.comm_name: list[bool] = []
        self.str_codes: dict[object, int] = {}
        self.pg_codes: dict[str, int] = {}
        self.parts: list[dict[str, np.ndarray]] = []
        self.n = 0
        self.flows: dict[str, list] = {k: [] for k in ("rank", "pid", "tid", "ts", "id", "is_start")}
        self.steps: list[tuple[int, int, float, float, int, int]] = []

    def add_file(self, path: Path, events: list, rank: int) -> int:
        codes, names, comm_name = self.name_codes, self.names, self.comm_name
        cat_class = _CAT_CLASS
        src_idx, pid_l, tid_l, ts_l, dur_l, name_l, cls_l = [], [], [], [], [], [], []
        sparse: dict[str, tuple[list, list]] = {k: ([], []) for k in _SPARSE}
        corr_rows, corr_vals = sparse["correlation"]
        stream_rows, stream_vals = sparse["stream"]
        ext_rows, ext_vals = sparse["ext_id"]
        k_runtime, k_cpu, k_sync = EvClass.RUNTIME, EvClass.CPU, EvClass.GPU_SYNC
        step_prefix = F.STEP_PREFIX
        f = self.flows
        row = 0
        for idx, ev in enumerate(events):
            try:
                ph = ev["ph"]
            except (KeyError, TypeError):
                if not isinstance(ev, dict):
                    raise TraceError(path, f"traceEvents holds a {type(ev).__name__}, expected objects") from None
                continue
            if ph != "X":
                if (ph == "s" or ph == "f") and ev.get("cat") in F.FLOW_CATS and isinstance(ev.get("id"), int):
                    f["rank"].append(rank)
                    f["pid"].append(ev.get("pid"))
                    f["tid"].append(ev.get("tid"))
                    f["ts"].append(ev.get("ts"))
                    f["id"].append(ev["id"])
                    f["is_start"].append(ph == "s")
                continue
            cls = cat_class.get(ev.get("cat"))
            if cls is None:
                continue
            name = ev.get("name")
            code = codes.get(name)
            if code is None:
                if not isinstance(name, str):
                    raise TraceError(path, f"event at index {idx} has no name")
                code = codes[name] = len(names)
                names.append(name)
                comm_name.append(any(m in name.lower() for m in _COMM_MARKERS))
            if cls == k_cpu and name.startswith(step_prefix):
                num = name[len(step_prefix) :]
                if num.isdigit():
                    self._step(path, ev, rank, int(num))
                    continue
            src_idx.append(idx)
            pid_l.append(ev.get("pid"))
            tid_l.append(ev.get("tid"))
            ts_l.append(ev.get("ts"))
            dur_l.append(ev.get("dur", 0))
            name_l.append(code)
            cls_l.append(cls)
            args = ev.get("args")
            if args and cls == k_cpu:
                v = args.get("External id")
                if v is not None:
                    ext_rows.append(row)
                    ext_vals.append(v)
            elif args:
                v = args.get("correlation")
                if v is not None:
                    corr_rows.append(row)
                    corr_vals.append(v)
                if cls != k_runtime:
                    v = args.get("stream")
                    if v is not None:
                        stream_rows.append(row)
                        stream_vals.append(v)
                    if cls == k_sync:
                        self._sync_args(sparse, row, name, args)
            if comm_name[code]:
                self._comm_args(sparse, row, args or {})
            row += 1
        if not row:
            return 0
        ts = self._floats(path, ts_l, names, name_l, "ts")
        dur = self._floats(path, dur_l, names, name_l, "dur")
        neg = np.flatnonzero(dur < 0)
        if len(neg):
            i = int(neg[0])
            raise TraceError(path, f"event {names[name_l[i]][:80]!r} at ts={ts[i]} has a negative duration ({dur[i]} µs)")
        part = {
            "rank": np.full(row, rank, dtype=np.int32),
            "src_idx": np.asarray(src_idx, dtype=np.int64),
            "pid": _int_column(pid_l, self.str_codes),
            "tid": _int_column(tid_l, self.str_codes),
            "ts": ts,
            "dur": dur,
            "name": np.asarray(name_l, dtype=np.int32),
            "cls": np.asarray(cls_l, dtype=np.int8),
        }
        for col, (rows, vals) in sparse.items():
            dtype = _SPARSE_DTYPE.get(col, np.int64)
            default = _SPARSE_DEFAULT.get(col, F.ARG_SPECS[col].default if col in F.ARG_SPECS else -1)
            arr = np.full(row, default, dtype=dtype)
            if rows:
                arr[np.asarray(rows, dtype=np.int64)] = np.asarray(vals, dtype=dtype)
            part[col] = arr
        self.parts.append(part)
        self.n += row
        return row

    def _floats(self, path: Path, values: list, names: list[str], name_l: list[int], what: str) -> np.ndarray:
        try:
            return np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            for i, v in enumerate(values):
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    raise TraceError(path, f"event {names[name_l[i]][:80]!r} has a non-numeric {what} ({v!r})") from None
            raise

    def _step(self, path: Path, ev: dict, rank: int, number: int) -> None:
        ts, dur = ev.get("ts"), ev.get("dur", 0)
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)) or dur < 0:
            raise TraceError(path, f"{ev.get('name')} has no valid ts/dur")
        self.steps.append(
            (rank, number, float(ts), float(ts + dur), _as_int(ev.get("pid"), self.str_codes), _as_int(ev.get("tid"), self.str_codes))
        )

    @staticmethod
    def _sync_args(sparse: dict, row: int, name: str, args: dict) -> None:
        kind = args.get(F.SYNC_KIND_KEY, name)
        if kind in SYNC_KINDS:
            sparse["sync_kind"][0].append(row)
            sparse["sync_kind"][1].append(SYNC_KINDS.index(kind))
        for col in ("wait_stream", "wait_event_corr"):
            v = _arg(args, col)
            if v != -1:
                sparse[col][0].append(row)
                sparse[col][1].append(v)

    def _comm_args(self, sparse: dict, row: int, args: dict) -> None:
        """Message size, group size, process group and element size of collective-ish ops."""
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


def _merge(builders: list[_Builder]) -> EventTable:
    """One table from per-file builders: name and process-group codes made global."""
    names: list[str] = []
    codes: dict[str, int] = {}
    pg_codes: dict[str, int] = {}
    parts, flows, steps = [], {k: [] for k in ("rank", "pid", "tid", "ts", "id", "is_start")}, []
    for b in builders:
        for n in b.names:
            if n not in codes:
                codes[n] = len(names)
                names.append(n)
        remap = np.array([codes[n] for n in b.names], dtype=np.int32)
        pg_remap = np.array([pg_codes.setdefault(k, len(pg_codes)) for k in b.pg_codes], dtype=np.int32)
        for part in b.parts:
            part = dict(part)
            part["name"] = remap[part["name"]]
            if len(pg_remap):
                has = part["pg"] >= 0
                part["pg"] = np.where(has, pg_remap[np.maximum(part["pg"], 0)], -1).astype(np.int32)
            parts.append(part)
        fl = b.flows
        flows["rank"].append(np.asarray(fl["rank"], dtype=np.int64))
        flows["pid"].append(_int_column(fl["pid"], b.str_codes))
        flows["tid"].append(_int_column(fl["tid"], b.str_codes))
        flows["ts"].append(np.asarray([t if isinstance(t, (int, float)) else math.nan for t in fl["ts"]], dtype=np.float64))
        flows["id"].append(np.asarray(fl["id"], dtype=np.int64))
        flows["is_start"].append(np.asarray(fl["is_start"], dtype=bool))
        steps.extend(b.steps)
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    t0 = float(min(cols["ts"].min(), min((s[2] for s in steps), default=math.inf)))
    cols["ts"] -= t0
    fl = {k: np.concatenate(v) for k, v in flows.items()}
    fl["ts"] -= t0
    step_list = sorted((Step(r, n, a - t0, b - t0, p, t) for r, n, a, b, p, t in steps), key=lambda s: (s.number, s.rank))
    return EventTable(
        t0=t0, names=names, cols=cols, steps=step_list, flows=fl,
        files={b.rank: b.path for b in builders}, meta={b.rank: b.meta for b in builders},
    )  # fmt: skip


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


@contextlib.contextmanager
def _no_gc():
    """A trace decodes into ~10^5-10^6 acyclic dicts: the cycle collector finds nothing in them
    but would run hundreds of times while they are created (a third of the parse time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _parse_file(path: Path, single: bool) -> _Builder:
    with _no_gc():
        doc = read_json(path)
        events = kineto_events(doc, path)
        info = doc.get("distributedInfo") if isinstance(doc, dict) else None
        rank = rank_of(doc if isinstance(doc, dict) else {}, path, default=0 if single else None)
        b = _Builder(rank, str(path), info if isinstance(info, dict) else {})
        if b.add_file(path, events, rank) == 0:
            raise TraceError(path, "no CPU or GPU op events (ph='X') in the trace")
    return b


def load_events(path: str | Path, workers: int | None = None) -> EventTable:
    """Load one trace file or a folder of per-rank trace files into one EventTable.

    Large folders are parsed with one process per core (``workers``; default: all cores
    when the files hold more than PARALLEL_BYTES)."""
    files = trace_files(path)
    single = len(files) == 1
    if workers is None:
        big = sum(f.stat().st_size for f in files) > PARALLEL_BYTES
        workers = min(len(files), os.cpu_count() or 1) if big else 1
    if workers > 1:
        ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            builders = list(pool.map(_parse_file, files, [single] * len(files)))
    else:
        builders = [_parse_file(f, single) for f in files]
    seen: dict[int, str] = {}
    for b in builders:
        if b.rank in seen:
            raise TraceError(b.path, f"rank {b.rank} appears twice (also in {seen[b.rank]})")
        seen[b.rank] = b.path
    return _merge(builders)


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

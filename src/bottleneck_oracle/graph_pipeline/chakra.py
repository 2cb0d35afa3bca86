"""MLCommons Chakra execution traces (.et, protobuf) -> ExecutionGraph.

A Chakra ET file is a GlobalMetadata message then Node messages, each prefixed by its
length as a varint; one file per rank (``name.<rank>.et`` or ``rank-<rank>.et``). Nodes
carry their dependencies (data_deps, ctrl_deps) and, when converted from a profiled run,
start times and durations. Messages are decoded with Chakra's schema (et_def_pb2, vendored in graph_pipeline/vendor);
nothing in the file is executed.

Mapping: COMP / MEM nodes are ``compute``, COMM_COLL / COMM_SEND / COMM_RECV nodes are
``network``; data_deps become DATA edges, ctrl_deps PROGRAM_ORDER edges; collectives are
matched across ranks (kind, size, order) into barriers as for Kineto traces. Without start
times, ops are placed as soon as their dependencies allow.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from bottleneck_oracle.errors import TraceError
from bottleneck_oracle.graph_pipeline.builder import RawGraph, finalize
from bottleneck_oracle.graph_pipeline.collectives import match_instances, modelled_ends
from bottleneck_oracle.graph_pipeline.events import read_bytes
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, CollectiveKind, EdgeKind, NodeType

_RANK = re.compile(r"(?:rank[-_]?|\.)(\d+)\.et(?:\.gz)?$", re.IGNORECASE)
# Chakra CollectiveCommType -> CollectiveKind
_COMM_KIND = {
    0: CollectiveKind.ALL_REDUCE,
    1: CollectiveKind.REDUCE,
    2: CollectiveKind.ALL_GATHER,
    3: CollectiveKind.GATHER,
    4: CollectiveKind.SCATTER,
    5: CollectiveKind.BROADCAST,
    6: CollectiveKind.ALL_TO_ALL,
    7: CollectiveKind.REDUCE_SCATTER,
    8: CollectiveKind.REDUCE_SCATTER,
    9: CollectiveKind.BARRIER,
}


def _pb(path: str | Path = "Chakra ET"):
    try:
        from bottleneck_oracle.graph_pipeline.vendor import et_def_pb2
    except ImportError:
        raise TraceError(path, "reading Chakra .et files needs protobuf: pip install 'bottleneck-oracle[chakra]'") from None
    return et_def_pb2


def is_chakra(path: str | Path) -> bool:
    p = Path(path)
    if p.is_dir():
        return any(f.name.endswith((".et", ".et.gz")) for f in p.iterdir())
    return p.name.endswith((".et", ".et.gz"))


def _varint(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise IndexError
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def read_chakra(path: str | Path) -> tuple[object, list]:
    """(GlobalMetadata, [Node, ...]) of one .et file; TraceError names the file and the problem."""
    p = Path(path)
    raw = read_bytes(p)  # a regular file; gzip inflated within the trace limits (a bomb is refused, not inflated)
    pb = _pb(p)
    from google.protobuf.message import DecodeError

    messages = []
    pos = 0
    while pos < len(raw):
        start = pos
        try:
            size, pos = _varint(raw, pos)
        except (IndexError, ValueError):
            raise TraceError(p, f"truncated or not a Chakra ET file: bad length prefix at byte {start}") from None
        if pos + size > len(raw):
            raise TraceError(p, f"truncated Chakra ET file: message at byte {start} needs {size} bytes, {len(raw) - pos} left")
        messages.append(raw[pos : pos + size])
        pos += size
    try:
        meta = pb.GlobalMetadata.FromString(messages[0])
        nodes = [pb.Node.FromString(m) for m in messages[1:]]
    except DecodeError as exc:
        raise TraceError(p, f"not a Chakra ET file (protobuf decoding failed: {exc})") from None
    if not nodes:
        raise TraceError(p, "Chakra ET file holds no nodes")
    return meta, nodes


def _attr(node, name: str, default=None):
    for a in node.attr:
        if a.name == name:
            field = a.WhichOneof("value")
            return getattr(a, field) if field else default
    return default


def _rank(p: Path, single: bool) -> int:
    m = _RANK.search(p.name)
    if m:
        return int(m.group(1))
    if single:
        return 0
    raise TraceError(p, "cannot tell the rank: name the files <name>.<rank>.et or rank-<rank>.et")


def chakra_graph(path: str | Path) -> ExecutionGraph:
    """One ExecutionGraph for a Chakra ET file or a folder of per-rank .et files."""
    p = Path(path)
    files = sorted(f for f in p.iterdir() if f.name.endswith((".et", ".et.gz"))) if p.is_dir() else [p]
    if not files:
        raise TraceError(p, "folder holds no .et files")
    pb = _pb()
    names: list[str] = []
    codes: dict[str, int] = {}
    cols: dict[str, list] = {k: [] for k in ("rank", "tid", "on_gpu", "name", "node_type", "category", "start", "dur", "msg", "coll")}
    src, dst, kind = [], [], []
    ranks: dict[int, str] = {}
    offset = 0
    for f in files:
        _, nodes = read_chakra(f)
        rank = _rank(f, len(files) == 1)
        if rank in ranks:
            raise TraceError(f, f"rank {rank} appears twice (also in {ranks[rank]})")
        ranks[rank] = str(f)
        index = {n.id: offset + i for i, n in enumerate(nodes)}
        for n in nodes:
            t = n.type
            net = t in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE)
            if t == pb.COMM_COLL_NODE:
                ck = int(_COMM_KIND.get(_attr(n, "comm_type", -1), -1))
            elif t == pb.COMM_SEND_NODE:
                ck = int(CollectiveKind.SEND)
            elif t == pb.COMM_RECV_NODE:
                ck = int(CollectiveKind.RECV)
            else:
                ck = -1
            cols["rank"].append(rank)
            cols["tid"].append(int(_attr(n, "tid", _attr(n, "stream", 0)) or 0))
            cols["on_gpu"].append(not bool(_attr(n, "is_cpu_op", True)))
            cols["name"].append(codes.setdefault(n.name, len(codes)))
            if cols["name"][-1] == len(names):
                names.append(n.name)
            cols["node_type"].append(NodeType.NETWORK if net else NodeType.COMPUTE)
            cols["category"].append(
                (Category.P2P if ck in (CollectiveKind.SEND, CollectiveKind.RECV) else Category.COLLECTIVE) if net else Category.CPU_OP
            )
            cols["start"].append(float(n.start_time_micros))
            cols["dur"].append(float(n.duration_micros))
            size = _attr(n, "comm_size", None)
            cols["msg"].append(float(size) if net and size is not None else np.nan)
            cols["coll"].append(ck if net else -1)
            for deps, k in ((n.data_deps, EdgeKind.DATA), (n.ctrl_deps, EdgeKind.PROGRAM_ORDER)):
                for d in deps:
                    if d not in index:
                        raise TraceError(f, f"node {n.id} ({n.name!r}) depends on node {d}, which the file does not hold")
                    src.append(index[d])
                    dst.append(index[n.id])
                    kind.append(int(k))
        offset += len(nodes)
    src_a, dst_a, kind_a = np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(kind, dtype=np.int8)
    start = np.array(cols["start"])
    dur = np.array(cols["dur"])
    if not start.any():
        start = _as_soon_as_possible(len(start), dur, src_a, dst_a, p)
    t0 = start.min()
    start = start - t0
    rank_a = np.array(cols["rank"], dtype=np.int32)
    ckind = np.array(cols["coll"], dtype=np.int8)
    msg = np.array(cols["msg"])
    inst = match_instances(rank_a, start, ckind, np.full(len(start), -1), msg, end=start + dur)
    end = modelled_ends(start, start + dur, ckind, inst)
    measured = {r: float((start + dur)[rank_a == r].max() - start[rank_a == r].min()) for r in ranks}
    nodes_cols = {
        "rank": rank_a,
        "tid": np.array(cols["tid"], dtype=np.int64),
        "on_gpu": np.array(cols["on_gpu"], dtype=bool),
        "name": np.array(cols["name"], dtype=np.int32),
        "node_type": np.array(cols["node_type"], dtype=np.int8),
        "category": np.array(cols["category"], dtype=np.int8),
        "start": start,
        "dur": dur,
        "event": np.arange(len(start), dtype=np.int64),
        "msg_bytes": msg,
        "group_size": np.full(len(start), -1, dtype=np.int32),
        "coll_kind": ckind,
    }
    raw = RawGraph(
        names=names,
        nodes=nodes_cols,
        end=end,
        inst=inst,
        src=src_a,
        dst=dst_a,
        kind=kind_a,
        is_wait=np.zeros(len(src_a), bool),
        window_start=float(t0),
        step=None,
        measured=measured,
        meta={
            "files": {str(k): v for k, v in ranks.items()},
            "format": "chakra",
            "rank_start_us": {str(r): float(start[rank_a == r].min()) for r in ranks},
        },
    )
    return finalize(raw)


def _as_soon_as_possible(n: int, dur: np.ndarray, src: np.ndarray, dst: np.ndarray, path: Path) -> np.ndarray:
    """Start times when the trace has none: every op starts when its dependencies end."""
    from graphlib import CycleError, TopologicalSorter

    preds: dict[int, list[int]] = {i: [] for i in range(n)}
    for s, d in zip(src.tolist(), dst.tolist()):
        preds[d].append(s)
    start = np.zeros(n)
    try:
        for v in TopologicalSorter(preds).static_order():
            if preds[v]:
                start[v] = max(start[u] + dur[u] for u in preds[v])
    except CycleError as exc:
        raise TraceError(path, f"dependency cycle among nodes {exc.args[1][:5]}") from None
    return start

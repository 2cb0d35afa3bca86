"""The graph contract: node types, edge kinds, edge-type triples, columns and units.

Everything that builds, analyses or learns from an ExecutionGraph imports its
names from here. All times are microseconds (float64), measured from the start
of the analysed window; message sizes are bytes.
"""

from __future__ import annotations

import functools
from enum import IntEnum

import numpy as np

SCHEMA_VERSION = 2  # bump when a column, a node type or an edge rule changes meaning


class NodeType(IntEnum):
    """PyG node types of the heterogeneous graph."""

    COMPUTE = 0  # CPU ops, CUDA runtime calls, GPU kernels, memcpy/memset
    NETWORK = 1  # collectives and point-to-point ops (gloo or NCCL), and collective barriers


NODE_TYPE_NAMES = {NodeType.COMPUTE: "compute", NodeType.NETWORK: "network"}


class Category(IntEnum):
    """What a node is, finer than its NodeType."""

    CPU_OP = 0  # aten / user ops on a CPU thread (leaf slices of the op tree)
    RUNTIME = 1  # CUDA/HIP runtime or driver call (cudaLaunchKernel, cudaDeviceSynchronize, ...)
    KERNEL = 2  # GPU compute kernel
    MEMCPY = 3  # GPU memcpy
    MEMSET = 4  # GPU memset
    COLLECTIVE = 5  # all_reduce, all_gather, reduce_scatter, broadcast, barrier, all_to_all
    P2P = 6  # send / recv
    BARRIER = 7  # virtual, zero-duration: the moment every participant of one collective arrived
    BLOCKING = 8  # a runtime call that blocks the host until device work completes: a synchronize, a
    # copy into pageable host memory (.item(), .cpu()), a polling loop of event/stream queries


GPU_CATEGORIES = (Category.KERNEL, Category.MEMCPY, Category.MEMSET)


class EdgeKind(IntEnum):
    """Why one node must wait for another (finish-to-start, with a weight in µs)."""

    PROGRAM_ORDER = 0  # consecutive leaf ops on one CPU thread, or ops on one GPU stream
    LAUNCH = 1  # CPU runtime call -> the GPU op it launched (joined on correlation id)
    FWD_BWD = 2  # forward op -> its backward op (fwdbwd flow events)
    SYNC = 3  # GPU op -> the blocking CUDA sync call waiting for it, or across streams (wait event)
    BACKEND = 4  # c10d op on the calling thread -> its backend op (gloo work on a runloop thread)
    COLLECTIVE_SYNC = 5  # collective barrier -> each participant (nobody finishes before all arrived)
    SEND_RECV = 6  # barrier of a send/recv pair -> the send and the recv
    FEEDS = 7  # collective completion -> the op its waiting thread resumes with
    DATA = 8  # the op that wrote a tensor -> an op that reads it (PyTorch execution trace, Chakra data deps)
    THREAD = 9  # the last op of a thread that handed over -> the op a waiting thread of its process resumes with


# Edge types of the heterogeneous graph as PyG (src, relation, dst) triples.
EDGE_TYPES = (
    ("compute", "depends_on", "compute"),
    ("compute", "triggers", "network"),
    ("network", "feeds", "compute"),
    ("network", "syncs", "network"),
)


def edge_relation(src_type: int, dst_type: int) -> tuple[str, str, str]:
    """The (src, rel, dst) triple for an edge between two node types."""
    src = NODE_TYPE_NAMES[NodeType(src_type)]
    dst = NODE_TYPE_NAMES[NodeType(dst_type)]
    for triple in EDGE_TYPES:
        if triple[0] == src and triple[2] == dst:
            return triple
    raise ValueError(f"no edge type from {src} to {dst}")


# Node columns of ExecutionGraph.nodes (all numpy arrays of length n_nodes).
NODE_COLUMNS = {
    "rank": "int32, rank of the process the op ran in (-1 for barriers spanning ranks)",
    "tid": "int64, CPU thread id, or GPU stream id for GPU ops",
    "on_gpu": "bool, op ran on a GPU stream",
    "name": "int32, index into ExecutionGraph.names",
    "node_type": "int8, NodeType",
    "category": "int8, Category",
    "start": "float64 µs, measured start (from the window start)",
    "dur": "float64 µs, measured duration",
    "mstart": "float64 µs, modelled start: for blocking ops, when what they wait for was ready",
    "mdur": "float64 µs, modelled duration = start + dur - mstart (the part that is not waiting)",
    "event": "int64, row of the event in the EventTable (-1 for barriers)",
    "msg_bytes": "float64 bytes, message size of network ops (NaN if unknown)",
    "group_size": "int32, participants of a collective (-1 if unknown)",
    "coll_kind": "int8, CollectiveKind of network ops (-1 otherwise)",
}

EDGE_COLUMNS = {
    "src": "int64 node index",
    "dst": "int64 node index",
    "kind": "int8, EdgeKind",
    "weight": "float64 µs, the dependency's latency: dst may start weight µs after src ends",
}


# The time between consecutive leaf ops of a CPU thread, in pieces with one innermost open event
# (graph_pipeline.gaps): ExecutionGraph.gaps, arrays of one row per piece.
GAP_COLUMNS = {
    "node": (np.int64, "the leaf node the piece precedes on its thread"),
    "start": (np.float64, "µs from the window start"),
    "end": (np.float64, "µs from the window start"),
    "owner": (np.int32, "index into ExecutionGraph.names of the innermost event open then (-1: none)"),
    "owner_start": (np.float64, "µs, when the owner opened (NaN: no owner)"),
    "owner_end": (np.float64, "µs, when the owner closed (NaN: no owner)"),
    "owner_op": (np.bool_, "the owner is an op (its own time is work), not a range of program code"),
}


# The enclosing CPU events of the leaf ops (record_function / user annotation ranges, nn.Module and
# Python ranges, parent ops, autograd hooks): ExecutionGraph.regions, one row per event that has
# leaves inside it. A region's leaves are the nodes first..last (a thread's leaves are consecutive
# nodes, in time order). Rows are in (thread, start, -duration) order: an enclosed region comes
# after the regions that enclose it.
REGION_COLUMNS = {
    "name": (np.int32, "index into ExecutionGraph.names"),
    "rank": (np.int32, "rank of the process"),
    "tid": (np.int64, "CPU thread id"),
    "start": (np.float64, "µs from the window start"),
    "end": (np.float64, "µs from the window start"),
    "first": (np.int64, "the first leaf node inside it"),
    "last": (np.int64, "the last leaf node inside it"),
    "is_range": (np.bool_, "a range of program code (record_function, Python), not an op"),
}


class CollectiveKind(IntEnum):
    ALL_REDUCE = 0
    ALL_GATHER = 1
    REDUCE_SCATTER = 2
    BROADCAST = 3
    BARRIER = 4
    ALL_TO_ALL = 5
    REDUCE = 6
    GATHER = 7
    SCATTER = 8
    SEND = 9
    RECV = 10
    SEND_RECV = 11  # NCCL's fused SendRecv kernel


# Substrings (lower-case, underscores removed) that identify a collective in an op name.
COLLECTIVE_PATTERNS = (
    ("reducescatter", CollectiveKind.REDUCE_SCATTER),
    ("allreduce", CollectiveKind.ALL_REDUCE),
    ("allgather", CollectiveKind.ALL_GATHER),
    ("alltoall", CollectiveKind.ALL_TO_ALL),
    ("broadcast", CollectiveKind.BROADCAST),
    ("barrier", CollectiveKind.BARRIER),
    ("sendrecv", CollectiveKind.SEND_RECV),
    ("reduce", CollectiveKind.REDUCE),
    ("gather", CollectiveKind.GATHER),
    ("scatter", CollectiveKind.SCATTER),
    ("send", CollectiveKind.SEND),
    ("recv", CollectiveKind.RECV),
)


@functools.lru_cache(maxsize=1 << 16)  # names repeat in every step: classify each once
def collective_kind(name: str) -> int:
    """CollectiveKind of a network op name, -1 if it names none."""
    key = name.lower().replace("_", "")
    for pattern, kind in COLLECTIVE_PATTERNS:
        if pattern in key:
            return int(kind)
    return -1

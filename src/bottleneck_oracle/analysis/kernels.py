"""Where a step's device time goes by kernel family, and how much of its communication is hidden
behind compute.

Families are read from kernel (or, in a trace without GPU work, op) names by the first matching
rule of FAMILIES, a documented, ordered list: communication kernels first (NCCL/RCCL/gloo names),
then convolution before GEMM (cuDNN's convolution kernels are "implicit_gemm"), attention, GEMM,
normalization, memory movement, reductions, element-wise math, else "other".

Overlap, per rank: the time its communication runs (the union of its communication intervals),
and how much of that time some compute of the same rank runs too; the rest is exposed
communication, the part a faster network or better overlap can win back.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, NodeType
from bottleneck_oracle.serial import Computed

FAMILIES: tuple[tuple[str, str], ...] = (
    # (collectives in kernels of their own, not NCCL's, too: fields.DEVICE_COLLECTIVE_PATTERN)
    ("communication", r"nccl|rccl|gloo|^mpi:|^ucc:|broadcast|sendrecv|c10d::|" + F.DEVICE_COLLECTIVE_PATTERN),
    ("normalization", r"bn_fw|bn_bw|batch_?norm|layer_?norm|group_?norm|rms_?norm|instance_?norm"),
    ("convolution", r"conv|cudnn|winograd|implicit_gemm|dgrad|wgrad|fprop|miopen|igemm_(fwd|bwd|wrw)|gemm_xdlops_bwd_weight"),
    ("attention", r"flash|attention|attn|fmha|sdpa"),
    ("gemm", r"gemm|matmul|cublas|cutlass|xmma|^cijk_|aten::(mm|addmm|bmm|baddbmm|linear)$"),
    ("normalization", r"norm|softmax"),
    ("memory", r"memcpy|memset|copy|transpose|aten::(cat|fill_|zero_|empty|clone|contiguous|to|_to_copy|index_select|gather|scatter)"),
    ("reduction", r"reduce|aten::(sum|mean|max|min|amax|argmax|norm)"),
    (
        "elementwise",
        r"elementwise|vectorized|unrolled|tensorop|aten::(add|mul|sub|div|relu|gelu|silu|sigmoid|tanh|exp|pow|threshold|where|dropout)",
    ),
)
_RULES = [(f, re.compile(p)) for f, p in FAMILIES]


@functools.lru_cache(maxsize=1 << 16)  # kernel names repeat in every step: classify each once
def family(name: str) -> str:
    """The family of a kernel or op name (first matching rule of FAMILIES, else "other")."""
    low = name.lower()
    for f, rule in _RULES:
        if rule.search(low):
            return f
    return "other"


@dataclass(frozen=True, slots=True)
class FamilyTime:
    family: str
    count: int
    total_us: float  # summed measured durations
    share: float  # of the summed durations of the step's kernels (ops)
    critical_us: float  # of it on the critical path


@dataclass(frozen=True, slots=True)
class Overlap:
    rank: int
    communication_us: float  # time some communication of the rank runs (union of its intervals)
    overlapped_us: float  # of it, time some compute of the rank runs too
    exposed_us: float  # communication_us - overlapped_us
    waiting_us: float = 0.0  # of exposed_us, time its communication ops waited for their peers (a late rank, a pipeline's bubble)

    JSON_COMPUTED: ClassVar[tuple[Computed, ...]] = (Computed("overlap_share", "overlap_share", after="exposed_us"),)

    @property
    def overlap_share(self) -> float:
        return self.overlapped_us / self.communication_us if self.communication_us > 0 else 0.0


Scope = Literal["gpu", "cpu"]  # what the families are of: a step's GPU kernels, or its ops where it has none


def scope(g: ExecutionGraph) -> tuple[Scope, np.ndarray]:
    """("gpu", the GPU nodes) where the step has GPU work, else ("cpu", every op node); barriers
    (the graph's stand-ins for a collective's rendezvous) are not work."""
    n = g.nodes
    gpu = n["on_gpu"].astype(bool)
    work = (n["category"] != Category.BARRIER) & (n["rank"] >= 0)
    return ("gpu", np.flatnonzero(gpu & work)) if gpu.any() else ("cpu", np.flatnonzero(work))


def families(g: ExecutionGraph, critical: np.ndarray) -> list[FamilyTime]:
    """Time per kernel family of a step with GPU work (``critical``: each node's time on the
    critical path, StepAnalysis.critical_time()), largest first; [] without GPU work."""
    where, ids = scope(g)
    if where != "gpu" or not len(ids):  # a CPU op's time is mostly its own time between its children, not a leaf's
        return []
    fam = _families_of(g, ids)
    dur = np.asarray(g.nodes["dur"][ids], dtype=np.float64)
    total = float(dur.sum())
    out = []
    for f in sorted(set(fam)):
        m = fam == f
        out.append(
            FamilyTime(
                f,
                int(m.sum()),
                float(dur[m].sum()),
                float(dur[m].sum()) / total if total > 0 else 0.0,
                float(np.asarray(critical, dtype=np.float64)[ids][m].sum()),
            )
        )
    return sorted(out, key=lambda x: -x.total_us)


def _families_of(g: ExecutionGraph, ids: np.ndarray) -> np.ndarray:
    if not len(ids):
        return np.array([], dtype=object)
    codes, inverse = np.unique(g.nodes["name"][ids], return_inverse=True)  # each name classified once
    fam = np.array([family(g.names[int(c)]) for c in codes], dtype=object)[inverse.reshape(-1)]
    fam[g.nodes["node_type"][ids] == NodeType.NETWORK] = "communication"
    return fam


def interval_union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted intervals covering the union of [starts, ends)."""
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.concatenate([[True], s[1:] > reach[:-1]])
    first = np.flatnonzero(new)
    last = np.concatenate([first[1:], [len(s)]]) - 1
    return s[first], reach[last]


def overlap_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two disjoint sorted interval sets."""
    sa, ea = (x.astype(float).tolist() for x in a)  # Python floats: the walk reads them one at a time
    sb, eb = (x.astype(float).tolist() for x in b)
    total, i, j = 0.0, 0, 0
    while i < len(sa) and j < len(sb):
        lo, hi = max(sa[i], sb[j]), min(ea[i], eb[j])
        if hi > lo:
            total += hi - lo
        if ea[i] < eb[j]:
            i += 1
        else:
            j += 1
    return total


def overlap(g: ExecutionGraph) -> list[Overlap]:
    """Per rank with communication in scope: its communication time, how much of it runs beside
    compute of the same rank (its kernels but communication and memory movement; on a CPU-only
    trace its leaf ops and ops' own time between their children), and how much of the rest its
    communication ops spent waiting for their peers (from an op's start to its collective's last
    arrival, the graph's modelled start): time a faster network or more overlap would not save."""
    where, ids = scope(g)
    if not len(ids):
        return []
    fam = _families_of(g, ids)
    n = g.nodes
    start = np.asarray(n["start"][ids], dtype=np.float64)
    end = start + np.asarray(n["dur"][ids], dtype=np.float64)
    ready = np.minimum(np.maximum(np.asarray(n["mstart"][ids], dtype=np.float64), start), end)  # (where its peers were all there)
    rank = n["rank"][ids]
    comm = fam == "communication"
    compute = ~comm & (fam != "memory")
    if where == "cpu":  # CPU compute is mostly ops' own time between their children: the gap pieces an op owns
        gp = g.gaps
        own = gp["owner_op"].astype(bool) & (n["rank"][gp["node"]] >= 0)
        k = int(own.sum())
        start = np.r_[start, gp["start"][own]]
        end = np.r_[end, gp["end"][own]]
        ready = np.r_[ready, gp["start"][own]]
        rank = np.r_[rank, n["rank"][gp["node"][own]]]
        comm, compute = np.r_[comm, np.zeros(k, bool)], np.r_[compute, np.ones(k, bool)]
    out = []
    by_rank = np.argsort(rank, kind="stable")  # each rank's ops in their order: one sort, not one scan per rank
    ranks = rank[by_rank]
    with_comm = np.unique(rank[comm])
    lo, hi = np.searchsorted(ranks, with_comm, side="left").tolist(), np.searchsorted(ranks, with_comm, side="right").tolist()
    for r, a, b in zip(with_comm.tolist(), lo, hi):  # (searched at once: a search per rank costs a copy of the column each)
        mine = by_rank[a:b]
        cm, cp = mine[comm[mine]], mine[compute[mine]]
        c = interval_union(start[cm], end[cm])
        busy = float((c[1] - c[0]).sum())
        work = interval_union(start[cp], end[cp])
        hidden = overlap_length(c, work)
        waits = interval_union(start[cm], ready[cm])  # (inside the communication's own intervals)
        waiting = float((waits[1] - waits[0]).sum()) - overlap_length(waits, work)
        out.append(Overlap(r, busy, float(hidden), float(busy - hidden), max(waiting, 0.0)))
    return out

"""ExecutionGraph: the typed DAG of one training step (all ranks merged), columnar."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bottleneck_oracle.atomic import atomic_path, uninterrupted
from bottleneck_oracle.errors import GraphError, OracleError
from bottleneck_oracle.files import check_archive
from bottleneck_oracle.graph_pipeline.gaps import empty_gaps
from bottleneck_oracle.graph_pipeline.regions import empty_regions
from bottleneck_oracle.graph_pipeline.schema import (
    EDGE_COLUMNS,
    GAP_COLUMNS,
    NODE_COLUMNS,
    REGION_COLUMNS,
    SCHEMA_VERSION,
    Category,
    EdgeKind,
    NodeType,
)
from bottleneck_oracle.serial import JSONObject

if TYPE_CHECKING:
    import networkx as nx

MAX_GRAPH_BYTES = 16 * 2**30  # what a saved graph's arrays may declare (a 4096-rank step's take a few GiB)


@dataclass(frozen=True, slots=True)
class Bystander:
    """A host thread left out of the step: no dependency into its work (graph_pipeline.builder)."""

    rank: int
    pid: int
    tid: int
    thread: str  # its name in the trace
    ops: int  # its ops in the step
    longest_op: str  # the name of its longest op (at most 120 characters)
    ends_us: float  # when its last op in the step ended
    polls: bool = False  # every op of it a runtime query (no launch, no synchronize): a monitor, e.g. NCCL's watchdog


@dataclass(frozen=True, slots=True)
class AsleepThread:
    """A host thread that slept through the step (graph_pipeline.facts)."""

    tid: int
    thread: str  # its name in the trace
    op: str  # its longest op (at most 120 characters)


@dataclass(frozen=True, slots=True)
class RankFactsRecord:
    """What the analysis reads of one rank's facts as the graph saved them (graph_pipeline.facts)."""

    rank: int
    device_ops: int  # device events the step launched
    device_busy: float  # share of the period the device was busy
    device_busy_us: float
    period_us: float  # the rank's period: end of the device work queued before the step to the end of the step's
    blocking_us: float  # host time in calls that block on the device (each >= 1 ms)
    asleep: tuple[AsleepThread, ...]  # host threads that slept through the step
    launched: int = 0  # of device_ops, those the trace ties to the runtime call that launched them
    early_launches: int = 0  # of those, the ones that start before their call began (beyond the clock tolerance)
    runtime_calls: int = 0  # runtime calls of the rank's host in the step
    host_blocked_us: float = 0.0  # time of the step's thread in Python calls that block it (sleep, lock, select; each >= 1 ms)
    setup_us: float = 0.0  # one-time work in the step: runtime setup with the device idle, torch.compile compiling
    launch_calls: int = 0  # calls of the rank's host in the step that launch device work (on a rank with device events)
    lost_launches: int = 0  # of those, the ones no device op in the trace is tied to
    unrun_launches: int = 0  # of those, the ones after the rank's last launch that has a device op (the trace ends first)
    queued_before_trace_us: float = 0.0  # the rank's first device op's wait for work queued before the trace began
    first_op_held_us: float = 0.0  # as long, where that wait is no work of the loop's: an untraced wait (facts.QUEUED_OF_SPAN)
    cpu_start: float = 0.0  # the step's start on the rank's host (µs, the table's clock)
    cpu_end: float = 0.0  # its end there
    past_end_us: float = 0.0  # how far the step's span runs past the start of the rank's last event
    held_share: float = 1.0  # the step's host events against the median of its rank's other steps' (where past_end_us > 1 ms)
    hidden: bool = False  # its host ended before the device work queued before it did (its period is its host's span)
    devices: int = 0  # devices the step's device ops ran on
    kernel_us: float = 0.0  # time of the kernels the step launched, collectives' kernels left out
    low_precision_us: float = 0.0  # of it, kernels that run in 16 or 8 bits
    conv_kernel_us: float = 0.0  # of it, kernels a convolution op launched
    nhwc_kernel_us: float = 0.0  # of those, kernels whose names say NHWC and no layout conversion
    host_matmul_us: float = 0.0  # host time inside matmul, convolution and attention ops
    host_low_precision_us: float = 0.0  # of it, inside those whose input is 16 or 8 bits
    host_matmul_flops: float = 0.0  # the FLOPs their input sizes give (record_shapes; 0: not recorded), summed
    host_matmul_ops: int = 0  # those ops whose FLOPs are known
    loader_waits: tuple[tuple[float, float], ...] = ()  # the step's thread waiting for a DataLoader's workers (start, end; each >= 1 ms)
    device_comm_only_us: float = 0.0  # of device_busy_us, the time the device ran collectives' kernels and nothing else
    device_busy_each: tuple[
        tuple[int, float, str], ...
    ] = ()  # a process that drives several devices: (device's process, busy µs, label) each

    @property
    def device_compute_busy(self) -> float:
        """Share of the period the device ran other work than collectives' kernels alone: an NCCL
        receive that waits for its peer keeps the device busy without computing."""
        return (self.device_busy_us - self.device_comm_only_us) / self.period_us if self.period_us > 0 else 0.0


_LATER_RANK_FACTS = {f.name: f.default for f in fields(RankFactsRecord) if isinstance(f.default, (int, float))}
"""RankFactsRecord's fields with a default (an int or a float), read with it where absent."""


def _later_rank_facts(saved: Mapping[str, Any]) -> dict[str, Any]:
    """Those fields of one rank's saved facts, as their default's type (its default where absent)."""
    return {k: type(default)(saved.get(k, default)) for k, default in _LATER_RANK_FACTS.items()}


@dataclass(frozen=True, slots=True)
class StepFactsRecord:
    """What the analysis reads of the step's facts as the graph saved them."""

    period_us: float  # the step's period: from its origin (the last rank's finish of the step before) to its last rank's end
    ranks: tuple[RankFactsRecord, ...]


class GraphInfo:
    """The typed view of ``ExecutionGraph.meta``: what the builder recorded beside the graph (thread
    and stream names, step starts and ends, the facts, dropped edges, collective matching,
    bystanders). ``meta`` itself is what a saved graph holds (JSON in its header, keys by name);
    the analysis reads it through this view. Absent keys read as empty (graphs of Chakra input,
    or saved by older versions)."""

    __slots__ = ("_meta",)

    def __init__(self, meta: Mapping[str, Any]) -> None:
        self._meta = meta

    def _dict(self, key: str) -> dict[str, Any]:
        value = self._meta.get(key)
        return value if isinstance(value, dict) else {}

    @property
    def queue_wait_us(self) -> dict[str, float]:
        """Per rank ("rank"), the time its host's launches in the step waited for room in the
        device's full launch queue (EventTable.queue_waits), µs; ranks without such waits absent."""
        return self._dict("queue_wait_us")

    @property
    def thread_names(self) -> dict[str, str]:
        """The trace's names of the step's CPU threads, keyed "rank:tid"."""
        return self._dict("thread_names")

    @property
    def stream_names(self) -> dict[str, str]:
        """The trace's names of the step's device streams, keyed "rank:stream"."""
        return self._dict("stream_names")

    def lane_name(self, rank: int, tid: int, on_gpu: bool) -> str:
        """A thread's or stream's name, or "thread N" / "stream N" where the trace gives none."""
        names = self.stream_names if on_gpu else self.thread_names
        return names.get(f"{rank}:{tid}", f"{'stream' if on_gpu else 'thread'} {tid}")

    @property
    def rank_start_us(self) -> dict[str, float]:
        """When each rank ("rank") started the step, µs from the window start."""
        return self._dict("rank_start_us")

    @property
    def rank_origin_us(self) -> dict[str, float]:
        """Where each rank's step time starts (facts.py), µs from the window start."""
        return self._dict("rank_origin_us")

    @property
    def step_end_us(self) -> dict[str, float]:
        """When each rank's ProfilerStep span ended, µs from the window start."""
        return self._dict("step_end_us")

    @property
    def dropped_edges(self) -> dict[str, int]:
        """Edges dropped because they ran back in time, per edge kind; ``<kind>_in_a_cycle``: given
        up to break a cycle closed where the trace's times tie (builder._acyclic)."""
        return self._dict("dropped_edges")

    @property
    def collectives(self) -> dict[str, int]:
        """How the collectives were matched across ranks (collectives.match_report)."""
        return self._dict("collectives")

    @property
    def facts_json(self) -> JSONObject | None:
        """The step's facts as saved (facts.StepFacts.to_dict), None without them."""
        return self._facts()

    def _facts(self) -> dict[str, Any] | None:
        facts = self._meta.get("facts")
        return facts if isinstance(facts, dict) else None

    @property
    def facts(self) -> StepFactsRecord | None:
        """The step's facts the analysis reads, None without facts or without a rank in them."""
        facts = self._facts()
        if not facts or not facts.get("ranks"):
            return None
        ranks = tuple(
            RankFactsRecord(
                rank=int(f["rank"]),
                device_ops=int(f["device_ops"]),
                device_busy=float(f["device_busy"]),
                device_busy_us=float(f["device_busy_us"]),
                period_us=float(f["period_us"]),
                blocking_us=float(f["blocking_us"]),
                asleep=tuple(AsleepThread(tid=int(t["tid"]), thread=str(t["thread"]), op=str(t["op"])) for t in f.get("asleep", [])),
                loader_waits=tuple((float(lo), float(hi)) for lo, hi in f.get("loader_waits", [])),
                device_busy_each=tuple((int(p), float(us), str(label)) for p, us, label in f.get("device_busy_each", [])),
                # the counts and times later versions added: absent in a graph saved before them
                **_later_rank_facts(f),
            )
            for f in facts["ranks"]
        )
        return StepFactsRecord(period_us=float(facts["period_us"]), ranks=ranks)

    @property
    def unprofiled(self) -> dict[int, str]:
        """Ranks whose profiler left one side of the job out (facts.unprofiled): rank -> the side
        missing, "host", or "device" where host ops name a device library (a GPU listed in the
        file's deviceProperties alone may be one the job did not use: not here); "unread host"
        where the host's events are there in categories this tool does not read (another
        profiler's trace)."""
        got = self._run_fact("unprofiled")
        return {
            int(r): "unread host" if v.get("missing") == "host" and v.get("skipped") else str(v["missing"])
            for r, v in got.items()
            if isinstance(v, dict) and (v.get("missing") in ("host", "host ops") or (v.get("missing") == "device" and v.get("ops")))
        }

    @property
    def launches_waited_at_start(self) -> int:
        """Device ops launched by a call that waits for them (a blocking copy, a synchronous launch)
        as its thread's first op in the window: released by nothing before it, so no launch edge."""
        v = self._meta.get("launches_waited_at_start", 0)
        return int(v) if isinstance(v, int) else 0

    def _run_fact(self, key: str) -> dict[str, Any]:
        """One per-rank entry of the run facts the builder stored (facts.RunFacts.to_dict), or {}."""
        run = self._meta.get("run_facts")
        got = run.get(key, {}) if isinstance(run, dict) else {}
        return got if isinstance(got, dict) else {}

    @property
    def sampled(self) -> dict[int, float]:
        """Ranks whose files hold under 90% of the events their profiler numbered (Ev Idx: events
        sampled or removed): rank -> the share held (facts.RunFacts.sampled)."""
        return {int(r): float(v) for r, v in self._run_fact("sampled").items() if isinstance(v, (int, float))}

    @property
    def setup(self) -> dict[int, float]:
        """Ranks whose analysed window holds one-time runtime setup (facts.setup_calls): rank -> its share of the window."""
        got = self._run_fact("setup")
        return {int(r): float(v["us"]) / float(v["window_us"]) for r, v in got.items() if isinstance(v, dict) and v.get("window_us")}

    @property
    def setup_names(self) -> set[str]:
        """The names of the setup calls those ranks made (their largest)."""
        return {
            str(t[0])
            for v in self._run_fact("setup").values()
            if isinstance(v, dict)
            for t in [*v.get("top", []), *v.get("compile_top", [])]
            if isinstance(t, list) and t
        }

    @property
    def synchronous(self) -> list[int]:
        """Ranks whose launches waited for their own device work (facts.synchronous_launches)."""
        return sorted(int(r) for r in self._run_fact("synchronous"))

    @property
    def bystanders(self) -> list[Bystander]:
        """Host threads left out of the step (builder): no dependency into its work."""
        return [
            Bystander(
                rank=int(b["rank"]),
                pid=int(b["pid"]),
                tid=int(b["tid"]),
                thread=str(b["thread"]),
                ops=int(b["ops"]),
                longest_op=str(b["longest_op"]),
                ends_us=float(b["ends_us"]),
                polls=bool(b.get("polls", False)),
            )
            for b in self._meta.get("bystanders", [])
        ]


@dataclass(slots=True, repr=False)
class ExecutionGraph:
    """Nodes and edges as numpy columns (see schema.NODE_COLUMNS / EDGE_COLUMNS).

    ``window_start`` is the absolute trace time (µs) of time zero; ``measured``
    maps each rank to its measured step span (µs) in this window.
    """

    names: list[str]
    nodes: dict[str, np.ndarray]
    edges: dict[str, np.ndarray]
    release: np.ndarray  # float64 µs: earliest start of nodes with no predecessor (-inf otherwise)
    window_start: float
    step: int | None
    measured: dict[int, float]
    meta: dict[str, Any] = field(default_factory=dict)
    """What the builder recorded beside the graph, as saved (JSON); read it through ``info``."""
    gaps: dict[str, np.ndarray] = field(default_factory=empty_gaps)
    """The time between consecutive ops of each CPU thread, in pieces (schema.GAP_COLUMNS)."""
    regions: dict[str, np.ndarray] = field(default_factory=empty_regions)
    """The CPU events enclosing leaf ops, each with its range of leaf nodes (schema.REGION_COLUMNS)."""

    @property
    def n_nodes(self) -> int:
        return len(self.nodes["start"])

    @property
    def n_edges(self) -> int:
        return len(self.edges["src"])

    @property
    def ranks(self) -> list[int]:
        return sorted(self.measured)

    def __repr__(self) -> str:
        return f"ExecutionGraph(step {self.step}, ranks {self.ranks}, {self.n_nodes} nodes, {self.n_edges} edges)"

    @property
    def info(self) -> GraphInfo:
        """The typed view of ``meta``."""
        return GraphInfo(self.meta)

    def rank_origin(self, rank: int) -> float:
        """Where ``rank``'s step time starts (µs from the window start): the later of its step start
        and the end of the device work queued before the step (facts.py); its step start if unknown."""
        origin = self.info.rank_origin_us.get(str(rank))
        return float(origin) if origin is not None else self.rank_start(rank)

    def span(self) -> float:
        """The step's measured time from its ProfilerStep spans (µs): for a step of several ranks
        that follows a step of theirs in the trace (its facts' origin is set), from the last rank's
        start to the last rank's end (a rank that began earlier did so while another was still in
        the step before); otherwise the slowest rank's span."""
        if not self.measured:
            return 0.0
        facts = self.info.facts_json
        if len(self.measured) < 2 or not facts or facts.get("origin") is None:
            return max(self.measured.values())
        starts = {r: self.rank_start(r) for r in self.measured}
        return max(starts[r] + t for r, t in self.measured.items()) - max(starts.values())

    def rank_start(self, rank: int) -> float:
        """When ``rank`` started this step, µs from the window start."""
        return float(self.info.rank_start_us.get(str(rank), 0.0))

    def node_name(self, i: int) -> str:
        return self.names[int(self.nodes["name"][i])]

    def validate(self) -> None:
        """Raise GraphError naming the column whose shape or values are wrong."""
        n = self.n_nodes
        for col in NODE_COLUMNS:
            if col not in self.nodes:
                raise GraphError(f"node column {col!r} is missing")
            if len(self.nodes[col]) != n:
                raise GraphError(f"node column {col!r} has {len(self.nodes[col])} rows (expected {n})")
        for col in EDGE_COLUMNS:
            if col not in self.edges or len(self.edges[col]) != self.n_edges:
                raise GraphError(f"edge column {col!r} is missing or has the wrong length")
        if self.n_edges and (self.edges["src"].max() >= n or self.edges["dst"].max() >= n or self.edges["src"].min() < 0):
            raise GraphError("an edge points outside the node table")
        lengths = {len(self.gaps.get(col, ())) for col in GAP_COLUMNS}
        if len(lengths) != 1:
            raise GraphError(f"gap columns are missing or of different lengths ({sorted(lengths)})")
        if len(self.gaps["node"]) and (self.gaps["node"].min() < 0 or self.gaps["node"].max() >= n):
            raise GraphError("a gap piece points outside the node table")
        lengths = {len(self.regions.get(col, ())) for col in REGION_COLUMNS}
        if len(lengths) != 1:
            raise GraphError(f"region columns are missing or of different lengths ({sorted(lengths)})")
        rg = self.regions
        if len(rg["first"]) and (rg["first"].min() < 0 or rg["last"].max() >= n or (rg["last"] < rg["first"]).any()):
            raise GraphError("a region points outside the node table")
        if (self.nodes["mdur"] < -1e-6).any():
            i = int(np.argmin(self.nodes["mdur"]))
            raise GraphError(f"node {self.node_name(i)!r} has a negative modelled duration")

    def to_networkx(self) -> nx.DiGraph:
        """A networkx.DiGraph with node and edge attributes (for interop only)."""
        import networkx as nx

        g = nx.DiGraph()
        cols = {k: v.tolist() for k, v in self.nodes.items()}
        for i in range(self.n_nodes):
            attrs = {k: cols[k][i] for k in cols}
            attrs["label"] = self.names[attrs["name"]]
            g.add_node(i, **attrs)
        for s, d, k, w in zip(
            self.edges["src"].tolist(), self.edges["dst"].tolist(), self.edges["kind"].tolist(), self.edges["weight"].tolist()
        ):
            g.add_edge(s, d, kind=EdgeKind(k).name.lower(), weight=w)
        return g

    # -- safe persistence: plain arrays in an .npz, metadata as JSON, no pickles --

    def save(self, path: str | Path, compress: bool = True) -> None:
        """Write the graph to ``path`` (.npz); ``compress=False`` for a file read back at once."""
        path = Path(path)
        arrays = {f"node__{k}": v for k, v in self.nodes.items()}
        arrays.update({f"edge__{k}": v for k, v in self.edges.items()})
        arrays.update({f"gap__{k}": v for k, v in self.gaps.items()})
        arrays.update({f"region__{k}": v for k, v in self.regions.items()})
        arrays["release"] = self.release
        header = {
            "schema_version": SCHEMA_VERSION,
            "names": self.names,
            "window_start": self.window_start,
            "step": self.step,
            "measured": {str(k): v for k, v in self.measured.items()},
            "meta": self.meta,
        }
        arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
        with atomic_path(path) as tmp, open(tmp, "wb") as fh, uninterrupted():  # (a signal: raised once the archive is closed)
            if compress:
                np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]  # numpy's stubs take a ** key for allow_pickle
            else:
                np.savez(fh, **arrays)  # type: ignore[arg-type]  # (the same)

    @classmethod
    def load(cls, path: str | Path) -> ExecutionGraph:
        try:
            check_archive(path, "saved ExecutionGraph", max_bytes=MAX_GRAPH_BYTES)
        except OracleError as exc:
            raise GraphError(str(exc)) from None
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
            header = json.loads(bytes(data.pop("header")).decode())
        except (OSError, ValueError, KeyError) as exc:
            raise GraphError(f"{path}: not a saved ExecutionGraph ({exc})") from None
        if header.get("schema_version") != SCHEMA_VERSION:
            raise GraphError(
                f"{path}: graph schema version {header.get('schema_version')} does not match this version ({SCHEMA_VERSION}); re-run parse"
            )
        g = cls(
            names=header["names"],
            nodes={k[6:]: v for k, v in data.items() if k.startswith("node__")},
            edges={k[6:]: v for k, v in data.items() if k.startswith("edge__")},
            release=data["release"],
            window_start=header["window_start"],
            step=header["step"],
            measured={int(k): v for k, v in header["measured"].items()},
            meta=header["meta"],
            gaps={k[5:]: v for k, v in data.items() if k.startswith("gap__")},
            regions={k[8:]: v for k, v in data.items() if k.startswith("region__")} or empty_regions(),  # saved before regions: none
        )
        g.validate()
        return g

    def summary_counts(self) -> dict[str, int]:
        nt = self.nodes["node_type"]
        cat = self.nodes["category"]
        kinds = np.bincount(self.edges["kind"][self.edges["kind"] >= 0].astype(np.int64), minlength=len(EdgeKind))
        return {
            "nodes": self.n_nodes,
            "edges": self.n_edges,
            "compute_nodes": int((nt == NodeType.COMPUTE).sum()),
            "network_nodes": int(((nt == NodeType.NETWORK) & (cat != Category.BARRIER)).sum()),
            "barriers": int((cat == Category.BARRIER).sum()),
            **{f"edges_{k.name.lower()}": int(kinds[k]) for k in EdgeKind},
        }

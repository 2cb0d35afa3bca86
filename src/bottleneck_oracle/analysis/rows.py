"""The typed rows ``StepAnalysis`` returns, and ``StepReport``: one analysed step as
``analyze --json`` writes it (``serial.to_json(a.report(top))``; keys in docs/json.md).

Times are µs from the step's window start; a share is of the step's CPM makespan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bottleneck_oracle.analysis.checks import Check
from bottleneck_oracle.analysis.kernels import FamilyTime, Overlap, Scope
from bottleneck_oracle.analysis.segments import SegmentKind
from bottleneck_oracle.graph_pipeline.graph import Bystander
from bottleneck_oracle.serial import JSONObject, json_meta


@dataclass(frozen=True, slots=True)
class TopOp:
    """What the critical path's time went to (segments.label), summed over its segments."""

    name: str
    kind: SegmentKind  # the kind of its first segment
    critical_us: float
    share: float
    count: int  # segments


# PathCause and PathSegment are not frozen: a step's critical path has up to hundreds of thousands of
# segments, and a frozen dataclass is built three times slower (each field set through object.__setattr__)
@dataclass(slots=True)
class PathCause:
    """The node a wait on the critical path waited for."""

    node: int
    name: str
    rank: int
    thread: str | None  # its CPU thread's name (None on a device stream, or for a barrier)
    stream: int | None  # its device stream (None on a CPU thread)


@dataclass(slots=True)
class PathSegment:
    """One segment of the critical path, in time order (analysis.segments.Segment, named)."""

    kind: SegmentKind
    rank: int
    tid: int | None  # the CPU thread's id (None on a device stream, or for a barrier: rank -1)
    thread: str | None  # its name
    stream: int | None  # the device stream (None on a CPU thread)
    name: str
    start_us: float
    dur_us: float
    node: int  # the node the segment is time of, or ends at
    cause: PathCause | None  # what a wait waited for
    stream_name: str | None = field(default=None, metadata=json_meta(omit_none=True))  # the device stream's name (on a device stream only)


@dataclass(frozen=True, slots=True)
class CommSlack:
    """A communication op with its slack and how long it waited for its peers."""

    node: int
    name: str
    rank: int
    slack_us: float
    dur_us: float
    wait_us: float
    msg_bytes: float | None  # None where the trace does not say
    critical: bool


@dataclass(frozen=True, slots=True)
class RankRow:
    """One rank in the step: its measured span, its CPM step time, its waits at collectives and its
    share of the critical path."""

    rank: int
    step_us: float
    predicted_step_us: float
    collective_wait_us: float
    critical_us: float
    critical_share: float


@dataclass(frozen=True, slots=True)
class StepStraggler:
    """The rank the others waited for at the collectives on the critical path, and the longest wait it imposed."""

    rank: int
    imposed_wait_us: float


@dataclass(frozen=True, slots=True)
class RankQueue:
    """How far one rank's device ran behind its host in the step."""

    rank: int
    lag_us: float  # median launch-call start to device-op start
    gpu_after_step_us: float  # how long after the step's CPU end the device finished the step's work
    deeper_than_step: bool  # the lag is longer than the step: the device ran earlier steps' work
    host_queue_wait_us: float = 0.0  # the host's launches waited this long in the step for room in the device's full queue


@dataclass(frozen=True, slots=True)
class GpuQueue:
    ranks: list[RankQueue]
    deeper_than_step: bool  # on any rank


@dataclass(frozen=True, slots=True)
class KernelFamilies:
    scope: Scope  # "gpu": the step's kernels; "cpu": its ops (no GPU work; families are then empty)
    families: list[FamilyTime]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepReport:
    """One analysed step as ``analyze --json`` writes it, with ``top`` ops by critical-path time."""

    step: int | None
    ranks: list[int]
    measured_us: float
    period_us: float | None
    step_time_us: float
    step_time_error: float  # (step time - period, or measured without one) / that
    makespan_us: float
    window_us: float
    counts: dict[str, int]
    breakdown_us: dict[str, float]
    top_ops: list[TopOp]
    lowest_slack_comm: list[CommSlack]
    per_rank: list[RankRow]
    straggler: StepStraggler | None
    critical_path_nodes: int
    untraced_us: float
    gpu_queue: GpuQueue | None
    dropped_edges: dict[str, int]
    collective_matching: dict[str, int]
    warnings: list[str]
    checks: list[Check]
    facts: JSONObject | None
    bystanders: list[Bystander]
    critical_path_top: list[PathSegment] | None = field(
        default=None, metadata=json_meta(omit_none=True)
    )  # its ``top`` longest segments (the default)
    critical_path: list[PathSegment] | None = field(default=None, metadata=json_meta(omit_none=True))  # every segment (--full-path)
    kernel_families: KernelFamilies
    overlap: list[Overlap]

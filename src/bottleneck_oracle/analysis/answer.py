"""One answer for the run: what a user reads first, before any step.

Over the run's steady steps (all but the first, warm-up, when there are three or more): the step
time (the CPM's, the step's period) as a median with a 95% interval; what bounds it (the class of
the critical path's time with the largest median); the persistent straggler (the rank the others
waited for at collectives on the path, in how many steps); and where that rank differs from its
peers — the region (an ``nn.Module``, a ``record_function`` range, a parent op) that blame's
region replay finds slowest against the peer ranks, its excess per step and the step time that
restoring it to its peers' time saves (replayed), each a median with its interval, and ops that
rank runs which its peers do not ("extra ops").

On a run whose device compute is a fifth of the path or more, the answer also replays what
halving every device compute op would save a step in steady state: over a window of two steps
less the next step's own one-step saving (what the first step passes on), beside what it saves in
one step's window. A loop bound by its host saves almost nothing in steady state however much
device time its step windows end with (the device's last work of a step overlaps the next step's
host work): where the replay says so and the raw facts agree (the device idles, the host does not
wait for it), the answer says the host bounds the loop.

Intervals: a percentile bootstrap of the median (2,000 resamples of the steps, seeded), none with
fewer than 3 steps. Blame runs on at most ``MAX_BLAME_STEPS`` steps spread evenly over the run
(it replays the step per candidate: the answer for a 2,000-step run stays seconds).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

import numpy as np

from bottleneck_oracle.analysis.cpm import makespan_of
from bottleneck_oracle.analysis.segments import (
    BREAKDOWN_KEYS,
    NAMED_FRAME,
    NAMED_OP,
    NAMED_RANGE,
    NAMED_UNTRACED,
    BreakdownKey,
    path_by_name,
)
from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.analysis.whatif import STEADY_QUEUE_SHARE
from bottleneck_oracle.graph_pipeline.arrays import isin_sorted
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph, StepFactsRecord
from bottleneck_oracle.graph_pipeline.schema import EdgeKind, NodeType

T = TypeVar("T")

MAX_BLAME_STEPS = 12  # steps blame replays for the region and the extra ops, spread over the steady steps
BOOTSTRAP = 2000
DEVICE_SHARE = 0.2  # device compute at least this share of the path: the run answer replays its steady-state weight
HOST_BOUND = 0.25  # a steady-state saving under this share of the one-step window's: the host bounds the loop ...
HOST_DEVICE_BUSY = 0.9  # ... where the device is busy under this share of the period (it idles, waiting for the host) ...
HOST_BLOCKING = 0.1  # ... and the host's blocking calls take under this share of it (it does not wait for the device)
INPUT_BOUND = 0.5  # the loop is bound by data loading when at least this share of the critical path is in the DataLoader
DEVICES_TOGETHER = 0.10
"""Where a rank drives several devices and two or more of them ran at once less than this share of
the time any was busy, they take turns (the run answer says so)."""
INPUT_SHARE = 0.05  # the input pipeline is named when at least this share of the critical path is in the DataLoader
PERSISTENT = 0.5  # a rank named straggler in at least this share of the steady steps is the run's
SMALL_SAVING = 0.01  # a region whose fix saves under this share of the step is said not to set the step's time
SLOW_FACTOR = 2.0  # a steady step this many times the others' median step time, or more, is a slow step ...
SLOW_MIN_US = 500.0  # ... and at least this much (µs) longer
SLOW_MIN_STEPS = 4  # steady steps needed to tell slow steps from the others (three or more of them to set the median)
PERIODIC_FACTOR = 1.5  # steps every k-th (three or more) whose median is this many times the others' median ...
PERIODIC_LEAST = 1.3  # ... and each of them this many times it, are slow steps too (an optimizer step every k-th micro-batch)
PERIODIC_MAX_EVERY = 16  # the longest period looked for
CAUSE_SHARE = 0.5  # a name that adds at least this share of the slow steps' excess to their critical path is their cause ...
NARROWER = 0.9  # ... or one of its kind that adds this share of that name's excess and spends less time on the path (inside it)
NAMED_TOP = 40  # names kept per step (StepFigures.named): the ones the critical path spends most time in

Bound = Literal["device compute", "CPU compute", "communication", "host CPU overhead", "waiting", "untraced time", "data loading"]


@dataclass(frozen=True, slots=True)
class Estimate:
    """A median over steps (µs) with its 95% interval (None with fewer than 3 steps)."""

    median_us: float
    low_us: float | None
    high_us: float | None
    steps: int


def estimate(values: list[float], seed: int = 0) -> Estimate:
    """The median of ``values`` and a percentile-bootstrap 95% interval of it."""
    v = np.asarray(values, dtype=np.float64)
    med = float(np.median(v)) if len(v) else 0.0
    if len(v) < 3:
        return Estimate(med, None, None, len(v))
    rng = np.random.default_rng(seed)
    meds = np.median(v[rng.integers(0, len(v), size=(BOOTSTRAP, len(v)))], axis=1)
    return Estimate(med, float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975)), len(v))


@dataclass(slots=True)
class Straggler:
    rank: int
    steps: int  # steady steps in which the others waited for it
    of: int
    wait: Estimate  # the longest wait it imposed, per step


@dataclass(slots=True)
class RegionAnswer:
    """Where the straggler (or the slowest rank) differs from its peers."""

    rank: int
    name: str
    kind: Literal["range", "op"]
    steps: int  # blamed steps in which blame found it slower than on the peers
    of: int
    own: Estimate  # its own time on the rank, per step
    peers: Estimate  # its typical time on the peer ranks (or in the baseline's steps)
    excess: Estimate
    saving: Estimate  # the step time restoring it to the peers' time saves (replayed), per step: in steady state where known
    one_step: Estimate | None = None  # the same, replayed in one step alone (its ranks' starts fixed); None: saving is that
    against: str = "on its peers"  # what it was held against: "on its peers" or "in the baseline's steps"


@dataclass(slots=True)
class ExtraOp:
    """An op the rank runs that no peer runs (blame: typically absent on the peers)."""

    rank: int
    name: str
    count: int  # per step (median)
    dur: Estimate  # its time per step


class StepWindows(Protocol):
    """Step number -> the graph of ``span`` consecutive steps from it (``build_graph(..., span)``),
    None where the trace has not that many from it (api.two_step_graphs)."""

    def __call__(self, step: int | None, span: int = 2) -> ExecutionGraph | None: ...


@dataclass(slots=True)
class HostPace:
    """A host paced by its device: per step, the time its launches waited for room in the device's
    full launch queue (EventTable.queue_waits) and what is left of its span, its own work (µs)."""

    waited: Estimate
    own: Estimate


@dataclass(slots=True)
class DeviceWeight:
    """What halving every device compute op saves a step (µs, replayed): in one step's window, and
    in steady state (two steps' window less the next step's one-step saving)."""

    one_step: Estimate
    steady: Estimate


@dataclass(frozen=True, slots=True)
class SlowCause:
    """What the slow steps' critical path spends more time in than the others' (segments.path_by_name)."""

    rank: int
    name: str
    kind: str  # "range" (a record_function, a module's, the optimizer's), "frame" (a Python frame), "op", "untraced" (the host's untraced time)
    slow_us: float  # its critical-path time in the slow steps (mean)
    typical_us: float  # in the other steps (median; 0: it is not on their path)

    def words(self, ms: Callable[[float], str], others: str) -> str:
        """The cause in words, e.g. ``rank 0's evaluate, 19.9 ms on the critical path (not on the
        others' path)``: ``ms`` writes µs as ms, ``others`` names the steps it is set against."""
        what = {"range": "", "frame": "Python frame ", "op": "op ", "untraced": ""}[self.kind]
        name = self.name
        if self.kind == "untraced":  # (no name to give: say what such time is)
            name = f"{self.name} (no op recorded: a checkpoint written, logging, Python the profiler does not see)"
        return f"rank {self.rank}'s {what}{name}, {ms(self.slow_us)} ms on the critical path " + (
            f"({ms(self.typical_us)} ms in {others})" if self.typical_us > 0 else f"(not on {others}' path)"
        )


@dataclass(frozen=True, slots=True)
class SlowSteps:
    """Steady steps much slower than the others (an evaluation, a checkpoint, logging every N
    steps): the median hides them, the run's time does not."""

    steps: list[int]
    every: int | None  # the slow steps come every this many steps (three or more of them, evenly spaced)
    times_us: list[float]  # their step times
    others_us: float  # the other steady steps' median step time
    mean_us: float  # the mean step time of the steady steps, slow ones included
    added_us: float  # what the slow steps add to the mean step (µs): mean_us - others_us
    cause: SlowCause | None


@dataclass(frozen=True, slots=True)
class PipelineAnswer:
    """A job whose ranks send to and receive from each other (pipeline stages): how much of the step
    each rank kept busy (StepAnalysis.busy_by_rank: its step to its last op of work, less its
    sends' and receives' waits with none of its work running); the rest of the step it waited for
    the other stages — the schedule's bubble, and any stage slower than the others."""

    ranks: int
    busy: Estimate  # per step, the mean over the ranks of their busy time (µs)
    share: float  # busy's median over the step time's
    least: tuple[int, float]  # the rank least busy and its median busy time (µs)
    most: tuple[int, float]  # the rank most busy and its median busy time (µs)


@dataclass(frozen=True, slots=True)
class DevicesAnswer:
    """A rank whose process drives several devices (a model split across them in one process:
    ``device_map="auto"``, naive model parallelism): how busy each kept over its period, and how
    much of the time any of them was busy two or more ran at once (from the raw events: facts)."""

    rank: int
    busy: tuple[tuple[str, float], ...]  # (device, median share of the period it was busy)
    together: float  # median over the steps of the busy time two or more shared, over the time any was busy
    ranks: int  # ranks that drive several devices


@dataclass(frozen=True, slots=True)
class UnevenInputs:
    """The straggler runs the same matmuls, convolutions and attention as its peers, on larger
    inputs: the FLOPs their input sizes give (``record_shapes``, from the raw events: facts), against
    the median of its peers', per step. Its data is larger (an uneven split of the batch, longer
    sequences, larger images), not its host slower."""

    rank: int
    ratio: float  # its FLOPs over its peers' median: the median over the steps
    low: float  # the ratio's 95% interval (bootstrap of the median; low == high == ratio under 3 steps)
    high: float
    steps: int  # steady steps in which the ratio is UNEVEN_INPUTS or more, its op count its peers'
    of: int  # steady steps with the sizes recorded on it and a peer


TREND_TAU = 0.6
"""Kendall's tau of the steady steps' times against their order: this or more (in size), with
TREND_RISE, and the steps trend (a decode loop whose cache grows, a leak, a rank slowing)."""
TREND_RISE = 0.25
"""...where the Theil-Sen line over them rises (or falls) this share of their median or more."""
TREND_MIN_STEPS = 6
GROUP_GAP = 3.0
"""Two groups of steps: the gap between the faster group's slowest and the slower group's fastest
at least this many times the larger group's own spread (robust sigma), and GROUP_RISE of the
median or more."""
GROUP_RISE = 0.25
GROUP_SHARE = 0.25  # each group this share of the steady steps or more (two steps at least)
MAX_PAIRS_STEPS = 2000  # steps whose pairs are counted for the trend (more: evenly spaced ones of them)
ROBUST_SIGMA = 1.4826  # MAD -> sigma of a normal distribution


@dataclass(frozen=True, slots=True)
class StepTrend:
    """Steady steps whose time trends (step_trend): the Theil-Sen line at the first and last step."""

    first_step: int | None
    last_step: int | None
    first_us: float
    last_us: float
    slope_us: float  # per step
    tau: float  # Kendall's tau of time against order
    mean_us: float

    def line(self) -> str:
        return (
            f"Step time trends {'up' if self.slope_us > 0 else 'down'}: {_ms(self.first_us)} ms at step {self.first_step} to "
            f"{_ms(self.last_us)} at step {self.last_step} ({self.slope_us / 1000:+.2f} ms a step, Kendall's tau {self.tau:.2f}): "
            f"the median is no steady value; the mean is {_ms(self.mean_us)} ms"
        )


@dataclass(frozen=True, slots=True)
class StepGroups:
    """Steady steps that fall in two groups by their time (step_groups)."""

    fast: Estimate
    slow: Estimate
    fast_steps: int
    slow_steps: int
    alternate: bool  # the two kinds take turns step by step (most neighbours differ)
    mean_us: float

    def line(self) -> str:
        return (
            f"Steps fall in two groups: {self.fast_steps} of {_ms(self.fast.median_us)} ms and {self.slow_steps} of "
            f"{_ms(self.slow.median_us)} ms{', taking turns' if self.alternate else ''}: the median stands for neither; "
            f"the mean is {_ms(self.mean_us)} ms"
        )


def step_trend(steps: Sequence[int | None], times: Sequence[float]) -> StepTrend | None:
    """The trend of a run's steady step times (in step order), where Kendall's tau of time against
    order is TREND_TAU or more in size and the Theil-Sen line rises or falls TREND_RISE of their
    median or more over the steps (TREND_MIN_STEPS at least); None otherwise: the steps are alike,
    their median a steady value."""
    t = np.asarray(times, dtype=np.float64)
    n = len(t)
    if n < TREND_MIN_STEPS:
        return None
    pick = np.unique(np.linspace(0, n - 1, min(n, MAX_PAIRS_STEPS)).round().astype(np.int64))
    x, y = pick.astype(np.float64), t[pick]
    i, j = np.triu_indices(len(pick), 1)
    dx, dy = x[j] - x[i], y[j] - y[i]
    tau = float(np.sum(np.sign(dy)) / len(dy))
    slope = float(np.median(dy / dx))
    median = float(np.median(t))
    rise = slope * (n - 1)
    if abs(tau) < TREND_TAU or abs(rise) < TREND_RISE * max(median, 1e-9):
        return None
    centre = float(np.median(t - slope * np.arange(n)))
    return StepTrend(steps[0], steps[-1], centre, centre + rise, slope, tau, float(np.mean(t)))


def step_groups(times: Sequence[float]) -> StepGroups | None:
    """Two groups among a run's steady step times (in step order): the split of the sorted times with
    the largest gap against the groups' own spread, where that gap is GROUP_GAP times the spread or
    more and GROUP_RISE of the median, each group GROUP_SHARE of the steps (two at least); None
    otherwise (one group: the median stands for the steps)."""
    t = np.asarray(times, dtype=np.float64)
    n = len(t)
    least = max(2, int(np.ceil(GROUP_SHARE * n)))
    if n < 2 * least:
        return None
    s = np.sort(t)
    median = float(np.median(t))

    def spread(a: np.ndarray) -> float:
        return max(ROBUST_SIGMA * float(np.median(np.abs(a - np.median(a)))), 0.01 * median)

    best, at = 0.0, -1
    for k in range(least, n - least + 1):
        gap = float(s[k] - s[k - 1])
        ratio = gap / max(spread(s[:k]), spread(s[k:]))
        if gap >= GROUP_RISE * median and ratio > best:
            best, at = ratio, k
    if at < 0 or best < GROUP_GAP:
        return None
    cut = (s[at - 1] + s[at]) / 2
    slow = t > cut
    alternate = bool(np.mean(slow[1:] != slow[:-1]) >= 0.8)
    return StepGroups(estimate(list(t[~slow])), estimate(list(t[slow])), int((~slow).sum()), int(slow.sum()), alternate, float(np.mean(t)))


@dataclass(slots=True, repr=False)
class RunAnswer:
    source: str
    ranks: list[int]
    steps: int  # steps analysed
    steady: int  # of them, steady (the first left out as warm-up when there are three or more)
    step_time: Estimate
    measured: Estimate  # the ProfilerStep span
    bound: Bound
    breakdown: dict[BreakdownKey, Estimate]
    straggler: Straggler | None
    region: RegionAnswer | None
    extra_ops: list[ExtraOp] = field(default_factory=list)
    extra_saving: Estimate | None = (
        None  # the step time removing the extra ops saves (replayed; in steady state where known); None: not replayed
    )
    extra_one_step: Estimate | None = None  # the same, replayed in one step alone; None: extra_saving is that, or none
    notes: list[str] = field(default_factory=list)
    input_pipeline: Estimate | None = None  # the critical path's time in the DataLoader's __next__, per step; None: under INPUT_SHARE
    device: DeviceWeight | None = None  # a host-bound loop whose windows end with device time (_device_weight); None: not one
    host_paced: HostPace | None = None  # a host that waits STEADY_QUEUE_SHARE of its step or more for the device's queue; None: not one
    slow_steps: SlowSteps | None = None  # steady steps SLOW_FACTOR times the others or more (_slow_steps); None: none
    pipeline: PipelineAnswer | None = None  # ranks that send to and receive from each other: how busy each kept (_pipeline); None: none
    devices: DevicesAnswer | None = None  # a rank that drives several devices: how busy each kept (_devices); None: none does
    inputs: UnevenInputs | None = None  # the straggler's ops given more work than its peers' same ops (_uneven_inputs); None: not so
    trend: StepTrend | None = None  # the steady steps' time trends (step_trend); None: it does not
    groups: StepGroups | None = None  # the steady steps fall in two groups by their time (step_groups); None: they do not

    def __repr__(self) -> str:
        return "RunAnswer(\n  " + "\n  ".join(self.lines()) + "\n)"

    def _repr_html_(self) -> str:
        from bottleneck_oracle.inert import html_text

        return "<ul>" + "".join(f"<li>{html_text(line.strip())}</li>" for line in self.lines()) + "</ul>"

    def lines(self, width: int = 80) -> list[str]:
        """The answer in a few lines of plain text (the terminal's first lines, the HTML's top)."""
        ms = _ms
        st = self.step_time
        out = [
            f"Run: {self.steady} steady step{'s' if self.steady != 1 else ''} of {self.steps}, {len(self.ranks)} "
            f"rank{'s' if len(self.ranks) != 1 else ''}: step time {ms(st.median_us)} ms{_interval(st)}"
            + (
                f"; host span {ms(self.measured.median_us)} ms" if abs(self.measured.median_us - st.median_us) > 0.05 * st.median_us else ""
            ),
        ]
        if self.trend is not None:
            out.append(self.trend.line())
        if self.groups is not None:
            out.append(self.groups.line())
        b = self.breakdown
        total = sum(e.median_us for e in b.values()) or 1.0
        shares = sorted(((e.median_us / total, k) for k, e in b.items()), reverse=True)
        rest = ", ".join(f"{_CLASS_WORDS[k]} {100 * s:.0f}%" for s, k in shares[1:3] if s >= 0.005)
        if self.bound == "data loading" and self.input_pipeline is not None:  # (the classes hold the loader's time too)
            classes = ", ".join(f"{_CLASS_WORDS[k]} {100 * s:.0f}%" for s, k in shares[:3] if s >= 0.005)
            out.append(
                f"Bound by: data loading ({100 * self.input_pipeline.median_us / total:.0f}% of the critical path); the whole path: {classes}"
            )
        else:
            out.append(f"Bound by: {self.bound} ({100 * shares[0][0]:.0f}% of the critical path)" + (f"; then {rest}" if rest else ""))
        if self.slow_steps is not None:
            sl = self.slow_steps
            n = len(sl.steps)
            listed = ", ".join(map(str, sl.steps[:8]))
            beat = _beat(sl) if sl.every else sl.steps
            if sl.every:  # the ones of the period first, then the others ("3, 7, 11, 15 (every 4th) and 4")
                once = [x for x in sl.steps if x not in beat]
                listed = f"{', '.join(map(str, beat[:8]))} (every {_ordinal(sl.every)})" + (
                    f" and {', '.join(map(str, once[:4]))}" if once else ""
                )
            took = f"{ms(min(sl.times_us))}–{ms(max(sl.times_us))}" if n > 1 else ms(sl.times_us[0])
            out.append(
                f"Slow step{'s' if n > 1 else ''}: {listed} take{'' if n > 1 else 's'} {took} ms "
                f"against {ms(sl.others_us)} ms for the others: {'they add' if n > 1 else 'it adds'} {ms(sl.added_us)} ms to the "
                f"mean step ({ms(sl.mean_us)} ms)"
            )
            if sl.cause is not None:
                which = f"the every {_ordinal(sl.every)}" if sl.every and len(beat) < n else ("them" if n > 1 else "it")
                out.append(f"  in {which}: {sl.cause.words(ms, 'the others')}")
        if self.input_pipeline is not None:
            e = self.input_pipeline
            out.append(
                f"Data loading (DataLoader): {100 * e.median_us / (total or 1.0):.0f}% of the critical path, "
                f"{ms(e.median_us)} ms a step{_interval(e)}"
            )
        if self.device is not None:
            one, steady = self.device.one_step, self.device.steady
            out.append(
                f"Host-bound loop: halving device compute saves {ms(steady.median_us)} ms a step in steady state"
                f"{_interval(steady)} ({ms(one.median_us)} ms in one step's window)"
            )
        if self.host_paced is not None:
            hp = self.host_paced
            out.append(
                f"Host paced by the device: it waits {ms(hp.waited.median_us)} ms a step for room in the device's launch queue; "
                f"its own work is {ms(hp.own.median_us)} ms{_interval(hp.own)}, so the device could run "
                f"{st.median_us / max(hp.own.median_us, 1.0):.1f}x faster before the host bounds the loop"
            )
        if self.straggler:
            s = self.straggler
            out.append(
                f"Straggler: rank {s.rank} in {s.steps} of {s.of} steps; the longest wait of the others for it, "
                f"{ms(s.wait.median_us)} ms a step (median)"
            )
        if self.pipeline is not None:
            pp = self.pipeline
            out.append(
                f"Pipeline ({pp.ranks} ranks that send to and receive from each other): a rank keeps busy "
                f"{100 * pp.share:.0f}% of the step ({ms(pp.least[1])} ms on rank {pp.least[0]} to {ms(pp.most[1])} on rank {pp.most[0]}); "
                "the rest it waits for the other stages: the schedule's bubble, and any stage slower than the others"
            )
        if self.devices is not None:
            dv = self.devices
            each = ", ".join(f"{name} {100 * share:.0f}%" for name, share in dv.busy[:4]) + (
                f" and {len(dv.busy) - 4} more" if len(dv.busy) > 4 else ""
            )
            turns = (
                ": they take turns, each idle while another works (a model split across devices runs one part at a time; "
                "a pipeline of micro-batches or tensor parallelism keeps them busy together)"
                if dv.together < DEVICES_TOGETHER
                else ""
            )
            out.append(
                f"Devices: rank {dv.rank} drives {len(dv.busy)}, each busy a share of the step ({each}); two or more at once "
                f"{100 * dv.together:.0f}% of the time any is busy{turns}"
                + (f" ({dv.ranks - 1} more rank{'s' if dv.ranks > 2 else ''} alike)" if dv.ranks > 1 else "")
            )
        if self.inputs is not None:
            u = self.inputs
            spread = f" [{u.low:.2f}, {u.high:.2f}]" if u.of >= 3 else ""
            out.append(
                f"Inputs: rank {u.rank}'s matmuls are given {u.ratio:.2f}×{spread} the work of its peers' by their input sizes "
                f"(the same ops on larger inputs, record_shapes; in {u.steps} of {u.of} steps): its share of the data is larger "
                "(an uneven split of the batch, longer sequences, larger images), not its host slower"
            )
        if self.region:
            r = self.region
            out.append(
                f"Where rank {r.rank} differs: {r.name} takes {ms(r.own.median_us)} ms a step, {ms(r.peers.median_us)} {r.against} "
                f"(+{ms(r.excess.median_us)} ms{_interval(r.excess)}; slower in {r.steps} of {r.of} steps)"
            )
        if self.extra_ops:
            shown = ", ".join(f"{x.name} ×{x.count} ({ms(x.dur.median_us)} ms)" for x in self.extra_ops[:3])
            if self.region is None and self.extra_saving is not None:  # the extra ops are where it differs
                out.append(f"Where rank {self.extra_ops[0].rank} differs: it runs ops its peers do not, a step: {shown}")
                x = self.extra_saving
                how = "in steady state: replayed over two steps" if self.extra_one_step is not None else "replayed"
                share = 100 * x.median_us / (st.median_us or 1)
                small = x.median_us < SMALL_SAVING * (st.median_us or 1)
                out.append(
                    f"Removing them saves {ms(x.median_us)} ms a step{_interval(x)} "
                    f"({share if abs(share) >= 0.5 else 0.0:.0f}%; {how}, without those ops)"
                    + (": they do not set the step's time, other work does" if small else "")
                )
            else:
                out.append(
                    f"  extra ops on rank {self.extra_ops[0].rank} that its peers do not run, a step: {shown}"
                    + (
                        f"; removing them saves {ms(self.extra_saving.median_us)} ms a step{_interval(self.extra_saving)}"
                        if self.extra_saving is not None
                        else ""
                    )
                )
        if self.region:
            r = self.region
            how = "in steady state: replayed over two steps" if r.one_step is not None else "replayed"
            small = r.saving.median_us < SMALL_SAVING * (st.median_us or 1)  # (off the path: other work sets the step)
            share = 100 * r.saving.median_us / (st.median_us or 1)
            out.append(
                f"Fixing it saves {ms(r.saving.median_us)} ms a step{_interval(r.saving)} "
                f"({share if abs(share) >= 0.5 else 0.0:.0f}%; {how}, the region at its time {r.against})"
                + (": it does not set the step's time, other work does" if small else "")
            )
        out += self.notes
        return out


_CLASS_WORDS = {
    "compute": "compute",
    "communication": "communication",
    "cpu_overhead": "CPU overhead",
    "idle": "waiting",
    "untraced": "untraced",
}


def _ordinal(n: int) -> str:
    """2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _ms(us: float) -> str:
    if abs(us) < 5:  # (rounds to 0.00: not "-0.00")
        return "0.00"
    return f"{us / 1000:.1f}" if abs(us) >= 100 else f"{us / 1000:.2f}"


def _interval(e: Estimate) -> str:
    return f" [{_ms(e.low_us)}, {_ms(e.high_us)}]" if e.low_us is not None and e.high_us is not None else " (no interval: < 3 steps)"


@dataclass(frozen=True, slots=True)
class StepFigures:
    """What the run answer needs of one step (kept for every step of a long run walked one step
    at a time; the graphs are not)."""

    step: int | None
    ranks: tuple[int, ...]
    on_gpu: bool
    step_time: float
    measured: float
    breakdown: dict[str, float]
    straggler: tuple[int, float] | None  # rank, the longest wait it imposed (µs)
    input_us: float = 0.0  # the critical path's time inside the DataLoader's __next__ (µs)
    queue_wait_us: float = 0.0  # the most any rank's host waited for room in its device's launch queue (µs)
    queue_span_us: float = 0.0  # that rank's ProfilerStep span (µs)
    setup: bool = False  # the step holds one-time work (StepAnalysis.holds_setup): warm-up, wherever it is
    empty: bool = False  # the step holds no op (StepAnalysis.is_empty): the profiler's stop, not a step
    cut: bool = False  # the trace ends inside the step (StepAnalysis.cut_by_trace_end): only a part of it is held
    hidden: bool = False  # the step adds nothing past earlier steps' device work (StepAnalysis.adds_nothing)
    named: tuple[tuple[int, str, int, float], ...] = ()  # the names the critical path spends most time in (segments.path_by_name)
    stage_busy: tuple[
        tuple[int, float], ...
    ] = ()  # where ranks send to and receive from each other: (rank, busy µs) (StepAnalysis.busy_by_rank)
    devices_busy: tuple[
        tuple[int, tuple[tuple[str, float], ...], float, float], ...
    ] = ()  # a rank that drives several devices: (rank, (device, busy µs) each, their union's busy µs, its period µs) (facts)
    shaped: tuple[
        tuple[int, float, int], ...
    ] = ()  # per rank: its matmuls' FLOPs by their input sizes, and their count (facts; record_shapes)

    @classmethod
    def of(cls, a: StepAnalysis) -> StepFigures:
        s = a.straggler() if len(a.graph.ranks) > 1 else None
        waited = {int(r): float(v) for r, v in a.graph.info.queue_wait_us.items()}
        paced = max(waited, key=lambda r: waited[r]) if waited else None
        return cls(
            a.graph.step,
            tuple(a.graph.ranks),
            bool(a.graph.nodes["on_gpu"].any()),
            a.step_time,
            a.measured,
            a.breakdown(),
            (s.rank, s.imposed_wait_us) if s else None,
            a.input_pipeline_us(),
            waited[paced] if paced is not None else 0.0,
            float(a.graph.measured.get(paced, 0.0)) if paced is not None else 0.0,
            a.holds_setup(),
            a.is_empty(),
            bool(a.cut_by_trace_end()),
            a.adds_nothing(),
            tuple(path_by_name(a.graph, a.segments(), NAMED_TOP)),
            tuple(sorted(a.busy_by_rank().items()))
            if len(a.graph.ranks) > 1 and (a.graph.edges["kind"] == EdgeKind.SEND_RECV).any()
            else (),
            _devices_busy(a),
            matmul_work(a.graph.info.facts),
        )


def _devices_busy(a: StepAnalysis) -> tuple[tuple[int, tuple[tuple[str, float], ...], float, float], ...]:
    """StepFigures.devices_busy of one step, from its facts (read from the raw events)."""
    facts = a.graph.info.facts
    if facts is None:
        return ()
    return tuple(
        (f.rank, tuple((label, us) for _, us, label in f.device_busy_each), f.device_busy_us, f.period_us)
        for f in facts.ranks
        if len(f.device_busy_each) > 1 and f.period_us > 0
    )


def steady_of(items: Sequence[T], step: Callable[[T], int | None], empty: Callable[[T], bool], setup: Callable[[T], bool]) -> list[T]:
    """The steady ones of a run's steps (in order; ``step``, ``empty``, ``setup`` read each): of
    those that hold an op (an empty ProfilerStep span is the profiler's stop, not a step; the
    callers count a step the trace ends inside as ``empty`` too: only part of it is held), all but
    the first, warm-up, when there are three or more; and of those, not a step of one-time work
    (StepAnalysis.holds_setup), unless every one is. The one rule of the run answer, the run
    summary and compare (runs.steady)."""
    held = [x for x in items if not empty(x)] or list(items)
    kept = held[1:] if len(held) >= 3 and step(held[0]) is not None else held
    return [x for x in kept if not setup(x)] or kept


def steady_figures(figures: Sequence[StepFigures]) -> list[StepFigures]:
    """The steady ones of a run's step figures (steady_of): a step the trace ends inside, or that
    adds nothing past earlier steps' device work, counts as holding no op."""
    return steady_of(figures, lambda f: f.step, lambda f: f.empty or f.cut or f.hidden, lambda f: f.setup)


def steady(steps: list[int | None]) -> list[int | None]:
    """The steady steps among ``steps`` (in order) by their numbers alone: all but the first,
    warm-up, when there are three or more."""
    return steady_of(steps, lambda n: n, lambda _: False, lambda _: False)


def blame_sample(steps: list[int | None], k: int = MAX_BLAME_STEPS) -> set[int | None]:
    """The steady steps blame replays for the run answer: at most ``k``, spread evenly."""
    st = steady(steps)
    if len(st) <= k:
        return set(st)
    return {st[int(i)] for i in np.linspace(0, len(st) - 1, k).round().astype(int)}


def _steps(steps: list[int]) -> str:
    """ "Step 3" or "Steps 3, 4" (the first 8)."""
    return f"Step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps[:8]))}"


def _them(steps: list[int]) -> str:
    return "them" if len(steps) > 1 else "it"


def run_answer(
    analyses: list[StepAnalysis],
    source: str = "",
    references: list[ExecutionGraph] | None = None,
    two_steps: StepWindows | None = None,
) -> RunAnswer:
    """The run-level answer of ``analyses`` (every analysed step, in step order); ``references``:
    graphs of a baseline run of the same job (the typical times where ranks have no peers);
    ``two_steps``: step number -> the graph of that step and the next (the steady-state saving)."""
    picked = blame_sample([a.graph.step for a in analyses])
    return answer_from(
        [StepFigures.of(a) for a in analyses], [a for a in analyses if a.graph.step in picked], source, references, two_steps
    )


def answer_from(
    figures: list[StepFigures],
    blamed: list[StepAnalysis],
    source: str = "",
    references: list[ExecutionGraph] | None = None,
    two_steps: StepWindows | None = None,
) -> RunAnswer:
    """The run-level answer from every step's figures (in step order) and the analyses of the
    steps ``blame_sample`` picked (the region and the extra ops are found on those), against the
    peer ranks and, where given, the ``references`` (a baseline run's graphs). With
    ``two_steps`` (step number -> ExecutionGraph of that step and the next, or None), the saving of
    fixing the region is replayed in steady state: over two consecutive steps, the second step's
    saving, so that a step ending earlier starts the next one earlier (a pipeline's stages, a
    rank whose late end held the others' next start)."""
    st = steady_figures(figures)
    gpu = any(f.on_gpu for f in st)
    breakdown = {k: estimate([f.breakdown[k] for f in st]) for k in BREAKDOWN_KEYS}
    top = max(BREAKDOWN_KEYS, key=lambda k: breakdown[k].median_us)
    bound: Bound = {
        "compute": "device compute" if gpu else "CPU compute",
        "communication": "communication",
        "cpu_overhead": "host CPU overhead",
        "idle": "waiting",
        "untraced": "untraced time",
    }[top]
    ranks = sorted({r for f in figures for r in f.ranks})
    answer = RunAnswer(
        source=source,
        ranks=ranks,
        steps=len(figures),
        steady=len(st),
        step_time=estimate([f.step_time for f in st]),
        measured=estimate([f.measured for f in st]),
        bound=bound,
        breakdown=breakdown,
        straggler=_straggler(st),
        region=None,
    )
    answer.trend = step_trend([f.step for f in st], [f.step_time for f in st])
    answer.slow_steps = _slow_steps(st)
    if answer.trend is None and answer.slow_steps is None:  # (slow steps are the minority group, said so)
        answer.groups = step_groups([f.step_time for f in st])
    answer.pipeline = _pipeline(st)
    answer.devices = _devices(st)
    fed = [f.input_us for f in st]
    if fed and float(np.median(fed)) > 0 and float(np.median(fed)) >= INPUT_SHARE * sum(e.median_us for e in breakdown.values()):
        answer.input_pipeline = estimate(fed)
        if answer.input_pipeline.median_us >= INPUT_BOUND * sum(e.median_us for e in breakdown.values()):
            answer.bound = "data loading"  # (its classes: the loader's own work and the loop waiting for its workers)
    if len(st) < 3:
        answer.notes.append(f"Fewer than 3 steady steps ({len(st)}): medians without intervals; profile more steps for a run-level answer")
    missing: dict[int, str] = {}
    serial: set[int] = set()
    setup: dict[int, float] = {}
    for a in blamed:
        missing.update(a.graph.info.unprofiled)
        serial.update(a.graph.info.synchronous)
        setup.update(a.graph.info.setup)
    cut = [f.step for f in figures if f.cut and not f.empty and f not in st and f.step is not None]
    if cut:
        answer.notes.append(
            f"{_steps(cut)}: the trace ends inside {_them(cut)} (work launched there had not run, or its ops stop before its span ends): "
            "left out of the run's figures"
        )
    cut_kept = [f.step for f in st if f.cut and f.step is not None]
    if cut_kept:
        answer.notes.append(
            f"{_steps(cut_kept)}: the trace ends inside {_them(cut_kept)} and no step is whole: the run's figures are of the part "
            "the trace holds"
        )
    hidden = [f.step for f in figures if f.hidden and not f.empty and f not in st and f.step is not None]
    if hidden:
        answer.notes.append(
            f"{_steps(hidden)}: the host ended {_them(hidden)} before the device work queued in earlier steps did, launching none that ran "
            "later: nothing added to the loop's time; left out of the run's figures"
        )
    empty = [f.step for f in figures if f.empty and f not in st and f.step is not None]
    if empty:
        answer.notes.append(
            f"{_steps(empty)} hold{'' if len(empty) > 1 else 's'} no op: the "
            "profiler's stop after the last prof.step(), not a step of the loop; left out of the run's figures"
        )
    left = [f.step for f in figures if f.setup and f not in st and f.step is not None]
    if setup:
        answer.notes.append(
            f"Setup: {max(setup.values()) * 100:.0f}% of the window (rank {', '.join(str(r) for r in sorted(setup))}) is one-time "
            "work (torch.compile compiling or recording CUDA graphs, the runtime creating its context, kernels loaded at their first launch, first "
            "allocations): the process's start, not its loop; profile steps after a warm-up"
            + (f" (step{'s' if len(left) > 1 else ''} {', '.join(map(str, left[:8]))} left out of the run's figures)" if left else "")
        )
    elif left:
        answer.notes.append(
            f"Setup: step{'s' if len(left) > 1 else ''} {', '.join(map(str, left[:8]))} spent a fifth of {'their' if len(left) > 1 else 'its'} "
            "time or more in one-time work (torch.compile compiling, the runtime setting itself up) and "
            f"{'are' if len(left) > 1 else 'is'} left out of the run's figures"
        )
    if serial:
        answer.notes.append(
            f"Synchronous launches (rank {', '.join(str(r) for r in sorted(serial))}): its launches waited for their own device "
            "work (CUDA_LAUNCH_BLOCKING=1?), so host and device ran in series: this is the step in that mode, not as the job "
            "runs with asynchronous launches"
        )
    for side in sorted(set(missing.values())):
        who = ", ".join(str(r) for r in sorted(r for r, m in missing.items() if m == side))
        answer.notes.append(
            f"Host only (rank {who}): the trace has no device event of a job that ran on one, so the breakdown's compute is host "
            "time, the host's waits on the device included; profile with the device activity on"
            if side == "device"
            else f"Device only (rank {who}): the trace has no host event, so the path is the device's alone and its gaps read as "
            "waiting; profile with the CPU activity on"
            if side == "host"
            else f"Runtime calls only (rank {who}): the trace has no host op (ProfilerActivity.CPU off), so the host's work "
            "between its launches reads as untraced and no op of the model can be named; profile with the CPU activity on"
            if side == "host ops"
            else f"Device only (rank {who}): the trace's host events are in categories this tool does not read (not the PyTorch "
            "profiler's: an XLA profile?), so the path is the device's alone and its gaps read as waiting"
        )
    waited = [f.queue_wait_us for f in st]
    if gpu and float(np.median(waited)) >= STEADY_QUEUE_SHARE * float(np.median([f.queue_span_us or f.measured for f in st])):
        answer.host_paced = HostPace(estimate(waited), estimate([max(f.queue_span_us - f.queue_wait_us, 0.0) for f in st]))
    compute = breakdown["compute"].median_us
    if gpu and two_steps is not None and compute >= DEVICE_SHARE * sum(e.median_us for e in breakdown.values()):
        answer.device = _device_weight(blamed, two_steps)
    if len(ranks) > 1 and answer.straggler is not None:
        answer.inputs = _uneven_inputs(st, answer.straggler.rank, blamed)
    if len(ranks) > 1:
        found = _where(answer, blamed, list(references or []))
        if answer.region is not None and two_steps is not None:
            _steady_saving(answer, blamed, two_steps)
        if answer.extra_ops:
            _extra_saving(answer, blamed, two_steps, found)
        r, x = answer.region, answer.extra_saving
        if r is not None and x is not None and x.median_us >= EXTRA_OVER_REGION * max(r.saving.median_us, 0.0):
            # the ops it runs and its peers do not are where it differs; the region a lesser difference
            # (named, unless it is one of those ops: their removal holds it)
            if not any(e.rank == r.rank and e.name == r.name for e in answer.extra_ops):
                answer.notes.append(
                    f"Also slower on rank {r.rank} than {r.against}: {r.name}, {_ms(r.own.median_us)} ms a step against "
                    f"{_ms(r.peers.median_us)} (+{_ms(r.excess.median_us)} ms); fixing it saves {_ms(r.saving.median_us)} ms a step"
                )
            answer.region = None
    return answer


_KINDS = {NAMED_RANGE: "range", NAMED_FRAME: "frame", NAMED_OP: "op", NAMED_UNTRACED: "untraced"}


def _pipeline(st: list[StepFigures]) -> PipelineAnswer | None:
    """How busy the ranks of a job that sends and receives between them kept (PipelineAnswer), over
    the steady steps that hold such transfers; None where none does."""
    held = [f for f in st if f.stage_busy]
    if not held:
        return None
    per_rank: dict[int, list[float]] = {}
    for f in held:
        for r, us in f.stage_busy:
            per_rank.setdefault(r, []).append(us)
    median = {r: float(np.median(v)) for r, v in per_rank.items()}
    least, most = min(median, key=lambda r: median[r]), max(median, key=lambda r: median[r])
    busy = estimate([float(np.mean([us for _, us in f.stage_busy])) for f in held])
    step = float(np.median([f.step_time for f in held]))
    return PipelineAnswer(len(per_rank), busy, busy.median_us / step if step > 0 else 0.0, (least, median[least]), (most, median[most]))


def _devices(st: list[StepFigures]) -> DevicesAnswer | None:
    """How busy the devices of a rank that drives several kept (DevicesAnswer), over the steady
    steps: the lowest of the ranks with the most devices; None where no rank drives several."""
    per_rank: dict[int, list[tuple[tuple[tuple[str, float], ...], float, float]]] = {}
    for f in st:
        for rank, each, union, period in f.devices_busy:
            per_rank.setdefault(rank, []).append((each, union, period))
    if not per_rank:
        return None
    rank = min(per_rank, key=lambda r: (-max(len(e) for e, _, _ in per_rank[r]), r))
    shares: dict[str, list[float]] = {}
    together = []
    for each, union, period in per_rank[rank]:
        for name, us in each:
            shares.setdefault(name, []).append(us / period)
        if union > 0:
            together.append((sum(us for _, us in each) - union) / union)
    busy = tuple((name, float(np.median(v))) for name, v in shares.items())
    return DevicesAnswer(rank, busy, float(np.median(together)) if together else 0.0, len(per_rank))


def _beat(sl: SlowSteps) -> list[int]:
    """Of the slow steps, those of the period's phase (the residue modulo ``every`` most of them have)."""
    k = sl.every or 1
    phase = max(range(k), key=lambda p: sum(x % k == p for x in sl.steps))
    return [x for x in sl.steps if x % k == phase]


def _periodic(number: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, int | None]:
    """The steps of one phase of a period k (those whose number is one residue modulo k; three
    or more, fewer than half the steps) each PERIODIC_LEAST and together (median)
    PERIODIC_FACTOR times the other steps' median or more, and SLOW_MIN_US longer: the shortest
    such period. (mask of them, k), or (none, None)."""
    none = np.zeros(len(times), dtype=bool)
    for k in range(2, min(PERIODIC_MAX_EVERY, len(times) // 3) + 1):
        for phase in range(k):
            mine = number % k == phase
            if mine.sum() < 3 or 2 * int(mine.sum()) >= len(times):
                continue
            base = float(np.median(times[~mine]))
            ratio = float(np.median(times[mine])) / base if base > 0 else 0.0
            if (
                ratio >= PERIODIC_FACTOR
                and float(times[mine].min()) >= PERIODIC_LEAST * base
                and float(np.median(times[mine])) - base >= SLOW_MIN_US
            ):
                return mine, k
    return none, None


def _slow_steps(st: list[StepFigures]) -> SlowSteps | None:
    """The steady steps SLOW_FACTOR times the others' median or more (and SLOW_MIN_US longer), when
    they are fewer than half of SLOW_MIN_STEPS or more steady steps, with what they add to the
    mean step and their cause: of the names their critical path spends time in (a range the
    program marked first, then a Python frame, then an op), the one whose time there exceeds its
    median in the other steps the most, if that excess is CAUSE_SHARE of the slow steps' own
    excess or more (the first kind that has one)."""
    numbered = [f for f in st if f.step is not None]
    if len(numbered) < SLOW_MIN_STEPS:
        return None
    times = np.array([f.step_time for f in numbered])
    number = np.array([int(f.step) for f in numbered if f.step is not None])
    # steps that come every k-th (a gradient-accumulation loop profiled per micro-batch: every 4th
    # all-reduces and steps the optimizer, 1.5-2.3 times the others, with a one-off slow step among
    # them), then the ones twice the others' median or more
    periodic, every_k = _periodic(number, times)
    # against the others' median: the slow steps' own times count in the first guess only (an
    # optimizer step every 4th of a gradient-accumulation loop's steps: a 13.2 ms one was left among
    # the others at twice the median of all 15, 6.8 ms, not at twice the others', 6.4 ms)
    is_slow = periodic.copy()
    typical = float(np.median(times[~periodic]))
    for round_ in range(3):
        now = periodic | ((times >= SLOW_FACTOR * typical) & (times - typical >= SLOW_MIN_US))
        if not now.any() or 2 * int(now.sum()) >= len(numbered):
            return None
        if (now == is_slow).all() and round_ > 0:
            break
        is_slow = now
        typical = float(np.median(times[~is_slow]))
    slow = [f for f, s in zip(numbered, is_slow.tolist()) if s]
    others = [f for f, s in zip(numbered, is_slow.tolist()) if not s]
    base = float(np.median([f.step_time for f in others]))
    excess = float(np.mean([f.step_time - base for f in slow]))
    steps = [int(f.step) for f in slow if f.step is not None]  # (all are: numbered)
    gaps = set(np.diff(steps).tolist())
    every = int(gaps.pop()) if len(steps) >= 3 and len(gaps) == 1 and min(np.diff(steps)) >= 2 else every_k

    mean = float(np.mean(times))
    if every_k is not None and not periodic.all() and len(slow) > int(periodic.sum()):  # (what the period's steps hold, not a one-off's)
        beat = [f for f, s in zip(numbered, periodic.tolist()) if s]
        cause = named_cause([f.named for f in beat], [f.named for f in others], float(np.mean([f.step_time - base for f in beat])))
    else:
        cause = named_cause([f.named for f in slow], [f.named for f in others], excess)
    return SlowSteps(steps, every, [f.step_time for f in slow], base, mean, mean - base, cause)


Named = Sequence[tuple[int, str, int, float]]


def named_cause(slow: Sequence[Named], others: Sequence[Named], excess_us: float) -> SlowCause | None:
    """Of the names the ``slow`` steps' critical path spends time in (segments.path_by_name of each),
    the one whose time there exceeds its median in the ``others`` the most, if that excess is
    CAUSE_SHARE of ``excess_us`` (what the slow steps take over the others) or more; a range the
    program marked first, then a Python frame, then an op, then the host's untraced time (work the
    profiler records no op for: a checkpoint written, logging; the first kind that has one). Of the
    names of that kind whose excess is NARROWER of the most, the one with the least time on the
    path: the range inside the others (the injected delay, not the forward that holds it)."""
    if excess_us <= 0 or not slow or not others:
        return None
    slow_d = [{(r, n, k): us for r, n, k, us in x} for x in slow]
    other_d = [{(r, n, k): us for r, n, k, us in x} for x in others]
    for kind in (NAMED_RANGE, NAMED_FRAME, NAMED_OP, NAMED_UNTRACED):
        scored = []
        for key in {k for d in slow_d for k in d if k[2] == kind}:
            s_us = float(np.mean([d.get(key, 0.0) for d in slow_d]))
            t_us = float(np.median([d.get(key, 0.0) for d in other_d]))
            scored.append((s_us - t_us, key, s_us, t_us))
        if scored:
            best = max(scored)[0]
            if best >= CAUSE_SHARE * excess_us:  # the narrowest that explains nearly as much (a range inside a module's forward)
                gain, key, s_us, t_us = min((x for x in scored if x[0] >= NARROWER * best), key=lambda x: (x[2], -x[0]))
                return SlowCause(key[0], key[1], _KINDS[kind], s_us, t_us)
    return None


def persistent_rank(named: Sequence[int | None]) -> tuple[int, int] | None:
    """The rank named in PERSISTENT of the steps or more (``named``: one per steady step, None where a
    step names none) and in how many: the run's straggler; None: no such rank."""
    ranks = [r for r in named if r is not None]
    if not ranks:
        return None
    rank, count = Counter(ranks).most_common(1)[0]
    return (int(rank), count) if count >= PERSISTENT * len(named) else None


def _straggler(st: list[StepFigures]) -> Straggler | None:
    found = persistent_rank([f.straggler[0] if f.straggler is not None else None for f in st])
    if found is None:
        return None
    rank, count = found
    return Straggler(rank, count, len(st), estimate([f.straggler[1] for f in st if f.straggler is not None and f.straggler[0] == rank]))


RegionKey = tuple[int, str, Literal["range", "op"]]  # a region: rank, name, kind


ExtraFound = dict[int, dict[tuple[int, str], tuple[int, float]]]
"""Per picked step (its index), the extra ops _where found in it (_extra_ops: (rank, name) -> how
many more, their time)."""


def _where(answer: RunAnswer, picked: list[StepAnalysis], references: list[ExecutionGraph]) -> ExtraFound:
    """The region where the straggler (or, without one, any rank) differs from its peer ranks (or,
    with ``references``, from the baseline's steps), and its extra ops, on the ``picked`` steps.
    The region is the one whose saving has the largest median over the blamed steps (a step in
    which blame did not find it slower counts as no saving), named only if blame found it slower
    in at least half of them: a region slower in one noisy step is not the run's. Returns the
    extra ops it found in each step (for _extra_saving)."""
    from bottleneck_oracle.analysis.blame import KeyMemo, peer_groups, region_blame

    memo = KeyMemo()
    against = ("peer ranks", "reference steps") if references else ("peer ranks",)
    focus = answer.straggler.rank if answer.straggler else None
    per: dict[RegionKey, dict[int, tuple[float, float, float]]] = {}  # region -> step -> own, typical, saving
    extra: dict[tuple[int, str], list[tuple[int, float]]] = {}
    counted: dict[
        tuple[int, str], list[float]
    ] = {}  # ops a rank ran more often than its peers: their time, a step (inf: its peers run them too)
    sources: dict[RegionKey, set[str]] = {}
    sampled: dict[int, float] = {}
    found: ExtraFound = {}
    used = 0
    for k, a in enumerate(picked):
        g = a.graph
        sampled.update(g.info.sampled)
        groups = peer_groups(g)
        if len(set(groups.values())) == len(g.ranks) and not references:  # no peers (pipeline stages), no baseline
            continue
        used += 1
        for r in region_blame(g, references, top=10, cpm=a.cpm, memo=memo, groups=groups):
            if r.typical_from in against and (focus is None or r.rank == focus):
                per.setdefault((r.rank, r.name, r.kind), {}).setdefault(k, (r.dur_us, r.typical_us, r.saving_us))
                sources.setdefault((r.rank, r.name, r.kind), set()).add(r.typical_from)
        if not sampled:  # (an op a peer's sampled trace lacks may have run there: counts say nothing)
            every = _extra_ops(g, groups, focus, outermost=False)
            if every:
                on_peers = {r: _names_on_peers(g, groups, r) for r in {r for r, _ in every}}
                for key, (_, dur) in every.items():
                    counted.setdefault(key, []).append(dur if key[1] not in on_peers[key[0]] else np.inf)
            found[k] = _outermost(g, every)
            for key, (count, dur) in found[k].items():
                extra.setdefault(key, []).append((count, dur))
    if not used:
        return found
    if sampled:
        extra.clear()
        worst = min(sampled, key=lambda r: sampled[r])
        answer.notes.append(
            f"Extra ops (ops one rank runs more often than its peers) not named: rank {worst}'s trace holds "
            f"{100 * sampled[worst]:.0f}% of the events its profiler numbered"
            + (f" ({len(sampled)} ranks' traces are sampled)" if len(sampled) > 1 else "")
            + ": an op missing from a rank's trace may have run there"
        )

    def typical_saving(key: RegionKey) -> float:
        return float(np.median([per[key][k][2] if k in per[key] else 0.0 for k in range(len(picked))]))

    ops_ = [
        ExtraOp(r, n, int(np.median([c for c, _ in v])), estimate([d for _, d in v]))
        for (r, n), v in extra.items()
        if len(v) >= PERSISTENT * used
    ]
    answer.extra_ops = sorted(ops_, key=lambda x: -x.dur.median_us)
    # an op the rank runs more often than its peers is no slower region: its occurrences, matched by
    # their order, pair an extra one with none or with another (aten::mm "0.4 ms, 0.2 on its peers"
    # where the rank runs 12 more): those ops are where it differs (_extra_saving)
    if not answer.extra_ops:
        counted.clear()

    def explained(key: RegionKey) -> bool:
        """An op region the extra ops explain: its peers run the op too (its occurrences paired by
        order), or one occurrence holds less than half the time the rank's extra ones take (one of
        many: a hook only this rank registered, holding all of it, is its own region)."""
        times = counted.get((key[0], key[1]))
        if key[2] != "op" or not times:
            return False
        own = float(np.median([v[0] for v in per[key].values()]))
        return own < EXTRA_ONE_OF_MANY * float(np.median(times))

    per = {key: v for key, v in per.items() if not explained(key)}
    best = max(per, key=lambda key: (typical_saving(key), len(per[key])), default=None)
    if best is not None and len(per[best]) >= PERSISTENT * used:
        rows = list(per[best].values())
        answer.region = RegionAnswer(
            best[0],
            best[1],
            best[2],
            len(rows),
            used,
            own=estimate([r[0] for r in rows]),
            peers=estimate([r[1] for r in rows]),
            excess=estimate([r[0] - r[1] for r in rows]),
            saving=estimate([r[2] for r in rows]),
            against="on its peers" if sources[best] == {"peer ranks"} else "in the baseline's steps",
        )
    elif per and not answer.extra_ops:
        answer.notes.append(
            f"No region is slower than on its peers in most steps ({len(per)} regions; none in {used // 2 + 1} of {used} steps)"
        )
    return found


EXTRA_MIN_US = 100.0  # µs a step: extra ops worth naming
EXTRA_ONE_OF_MANY = 0.5  # an op region holding less than this share of its op's extra time a step is one of many extra ones
EXTRA_OVER_REGION = 2.0
"""Removing the extra ops saving this many times what restoring the region saves or more: the extra
ops lead the answer (a region slower by a little beside ops that take far more: rank 0's metric
after the step, its forward 0.2 ms slower); below it the region does (extra ops inside it are its
excess: both save about the same)."""


def _extra_ops(
    g: ExecutionGraph, groups: dict[int, int], focus: int | None, outermost: bool = True
) -> dict[tuple[int, str], tuple[int, float]]:
    """Ops a rank runs more often than its peers (the median peer of its peer group), parent ops
    included: per (rank, name), how many more times and their time (its median run, as many more
    times). Host ops only: the device ops they launch follow them. Counted with one matrix of
    (rank, name) counts, so thousands of ranks cost no more than their ops."""
    n, rg = g.nodes, g.regions
    leaf_in, region_in = _inside_same_name(g)  # (aten::sort inside aten::sort: the call once)
    host = ~n["on_gpu"] & (n["rank"] >= 0) & ~leaf_in
    ops = ~rg["is_range"].astype(bool) & ~region_in  # parent ops too (aten::mm around its children): the names a user recognises
    rank = np.concatenate([n["rank"][host], rg["rank"][ops]]).astype(np.int64)
    name = np.concatenate([n["name"][host], rg["name"][ops]]).astype(np.int64)
    dur = np.concatenate([n["mdur"][host], (rg["end"] - rg["start"])[ops]]).astype(np.float64)
    if not len(rank):
        return {}
    ranks, r_idx = np.unique(rank, return_inverse=True)
    names, k_idx = np.unique(name, return_inverse=True)
    counts = np.zeros((len(ranks), len(names)), dtype=np.int64)
    np.add.at(counts, (r_idx, k_idx), 1)
    order = np.lexsort((dur, k_idx, r_idx))  # each (rank, name)'s durations together, sorted
    cell = r_idx[order] * len(names) + k_idx[order]
    dur_sorted = dur[order]
    group = np.array([groups.get(int(r), int(r)) for r in ranks])
    out: dict[tuple[int, str], tuple[int, float]] = {}
    for gr in np.unique(group).tolist():
        members = np.flatnonzero(group == gr)
        if len(members) < 2:  # no peers
            continue
        if focus is not None:
            look = members[ranks[members] == focus]
            if not len(look):
                continue
        else:
            look = members
        typical = _median_without(counts[members], counts[look])  # the median peer's count, per name
        more = counts[look] - typical
        for a, k in zip(*np.nonzero(more >= 1)):
            i = int(look[a])
            c = i * len(names) + int(k)
            lo, hi = np.searchsorted(cell, [c, c + 1])
            if typical[a, k] == 0:  # its peers run none: every one of them is extra
                extra = float(dur_sorted[lo:hi].sum())
            else:  # its typical run, as many more times (which ones are extra, the order cannot tell)
                extra = float(np.median(dur_sorted[lo:hi])) * float(more[a, k])
            if extra >= EXTRA_MIN_US:
                out[(int(ranks[i]), g.names[int(names[k])])] = (int(round(float(more[a, k]))), extra)
    return _outermost(g, out) if outermost else out


def _inside_same_name(g: ExecutionGraph) -> tuple[np.ndarray, np.ndarray]:
    """(per host leaf node, per region) is it an op inside an enclosing op of its own name on its
    thread: the profiler's record of one call dispatched to itself (``aten::sort`` around
    ``aten::sort``, the stable overload) is one call, counted once."""
    n, rg = g.nodes, g.regions
    leaf_in = np.zeros(g.n_nodes, dtype=bool)
    region_in = np.zeros(len(rg["name"]), dtype=bool)
    ops = np.flatnonzero(~rg["is_range"].astype(bool))
    if not len(ops):
        return leaf_in, region_in
    # per (rank, thread, name) in start order (the enclosing first): inside an earlier one's leaves
    o = ops[np.lexsort((-rg["last"][ops], rg["first"][ops], rg["name"][ops], rg["tid"][ops], rg["rank"][ops]))]
    key = np.stack([rg["rank"][o], rg["tid"][o], rg["name"][o]]).astype(np.int64)
    new = np.r_[True, (np.diff(key, axis=1) != 0).any(axis=0)]
    group = np.cumsum(new) - 1
    span = int(g.n_nodes) + 2
    reach = np.maximum.accumulate(group * span + rg["last"][o] + 1)  # (within a group: the furthest leaf so far)
    before = np.r_[-1, reach[:-1]]
    region_in[o] = ~new & (before - group * span - 1 >= rg["last"][o])
    # a leaf of a name some op region encloses (a thread's leaves are consecutive nodes: inside its
    # leaf range is on its thread): per name, the regions by their first leaf with the furthest last
    # leaf so far, looked up for every such leaf at once (one pass, not one per name)
    names = np.unique(rg["name"][o])
    by = o[np.lexsort((rg["first"][o], rg["name"][o]))]
    code = np.searchsorted(names, rg["name"][by]).astype(np.int64)
    starts = code * span + rg["first"][by]
    far = np.maximum.accumulate(code * span + rg["last"][by]) - code * span  # (a name's codes come after the earlier names')
    cand = np.flatnonzero(~n["on_gpu"] & isin_sorted(n["name"], names))
    mine = np.searchsorted(names, n["name"][cand]).astype(np.int64)
    at = np.searchsorted(starts, mine * span + cand, side="right") - 1
    ok = at >= 0
    ok[ok] &= (code[at[ok]] == mine[ok]) & (far[at[ok]] >= cand[ok])
    leaf_in[cand[ok]] = True
    return leaf_in, region_in


def _names_on_peers(g: ExecutionGraph, groups: dict[int, int], rank: int) -> set[str]:
    """The names of the host ops (leaves and parent ops) the peers of ``rank`` (its peer group's
    other ranks) run in ``g``."""
    n, rg = g.nodes, g.regions
    mine = groups.get(rank, rank)
    peers = np.array([r != rank and groups.get(r, r) == mine for r in range(int(max(g.ranks, default=-1)) + 1)], dtype=bool)

    def of(ranks: np.ndarray) -> np.ndarray:
        ok = (ranks >= 0) & (ranks < len(peers))
        out = np.zeros(len(ranks), dtype=bool)
        out[ok] = peers[ranks[ok].astype(np.int64)]
        return out

    codes = np.concatenate([n["name"][of(n["rank"]) & ~n["on_gpu"]], rg["name"][of(rg["rank"]) & ~rg["is_range"].astype(bool)]])
    return {g.names[int(k)] for k in np.unique(codes).tolist()}


def _outermost(g: ExecutionGraph, extra: dict[tuple[int, str], tuple[int, float]]) -> dict[tuple[int, str], tuple[int, float]]:
    """Of a rank's extra ops, those not inside another of them: an op that runs, as many times as it
    is extra or more, inside the parent ops of another extra name (``aten::mm`` inside the
    ``aten::matmul`` the rank runs 12 more of) is that parent's work, named once."""
    if len(extra) < 2:
        return extra
    rg, n = g.regions, g.nodes
    code = {name: k for k, name in enumerate(g.names)}
    out = dict(extra)
    for rank in {r for r, _ in extra}:
        mine = [name for r, name in extra if r == rank]
        regs = np.flatnonzero((rg["rank"] == rank) & ~rg["is_range"].astype(bool))
        for name in mine:
            k = code.get(name, -1)
            own = regs[rg["name"][regs] == k]
            leaves = np.flatnonzero((n["rank"] == rank) & (n["name"] == k) & ~n["on_gpu"]) if not len(own) else own[:0]
            for other in mine:
                if other == name:
                    continue
                parents = regs[rg["name"][regs] == code.get(other, -1)]
                if not len(parents):
                    continue
                lo, hi = rg["first"][parents][None, :], rg["last"][parents][None, :]
                if len(own):  # a region inside a parent: after it in region order (outermost first), within its ops
                    j = own[:, None]
                    inside = ((parents[None, :] < j) & (lo <= rg["first"][j]) & (rg["last"][j] <= hi)).any(axis=1)
                else:
                    inside = ((lo <= leaves[:, None]) & (leaves[:, None] <= hi)).any(axis=1)
                if int(inside.sum()) >= extra[(rank, name)][0]:
                    out.pop((rank, name), None)
                    break
    return out


def _median_without(group: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each of ``rows`` (members of ``group``, a matrix of counts: ranks by names), per name,
    ``np.median`` of the group's column with that row taken out (a rank's peers: the group
    without it), read off the sorted columns instead of a matrix built per rank (thousands of
    ranks made that quadratic)."""
    s = np.sort(group, axis=0)
    m, k_names = s.shape
    # where one occurrence of each row's value sits in its sorted column: taking out any of them leaves the same rest
    p = np.stack([np.searchsorted(s[:, k], rows[:, k]) for k in range(k_names)], axis=1) if k_names else rows
    cols = np.arange(k_names)

    def at(j: int) -> np.ndarray:
        v: np.ndarray = np.where(j < p, s[min(j, m - 1), cols], s[min(j + 1, m - 1), cols]).astype(np.float64)
        return v

    k = m - 1
    if k % 2:
        return at(k // 2)
    mid: np.ndarray = (at(k // 2 - 1) + at(k // 2)) / 2.0
    return mid


def _matching_regions(g: ExecutionGraph, rank: int, name: str) -> list[int]:
    """The regions of ``g`` on ``rank`` named ``name`` (or of its family: ``forward.mb*``), the
    outermost where one holds another."""
    from bottleneck_oracle.analysis.blame import _family

    rg = g.regions
    out: list[int] = []
    for j in np.flatnonzero(rg["rank"] == rank).tolist():
        nm = g.names[int(rg["name"][j])]
        if nm != name and _family(nm) != name:
            continue
        if out and rg["tid"][out[-1]] == rg["tid"][j] and rg["start"][j] >= rg["start"][out[-1]] and rg["end"][j] <= rg["end"][out[-1]]:
            continue  # inside the previous one (regions come outermost first)
        out.append(j)
    return out


def _restored_makespan(g: ExecutionGraph, rank: int, name: str, factor: float) -> tuple[float, float] | None:
    from bottleneck_oracle.analysis.blame import region_time, restored_regions

    members = _matching_regions(g, rank, name)
    if not members:
        return None
    dd, ww, rr = restored_regions(g, region_time(g), members, [factor] * len(members))
    return makespan_of(g), makespan_of(g, dd, ww, rr)


def _steady_saving(answer: RunAnswer, picked: list[StepAnalysis], two_steps: StepWindows | None) -> None:
    """The region's saving in steady state: on each picked step that has a next one, the region at
    its typical time in both steps, replayed over the two; the saving of the second step."""
    r = answer.region
    assert r is not None
    factor = float(np.clip(r.peers.median_us / r.own.median_us, 0.0, 1.0)) if r.own.median_us > 0 else 1.0
    savings = []
    for a in picked:
        g2 = two_steps(a.graph.step) if two_steps is not None and a.graph.step is not None else None
        one, two = _restored_makespan(a.graph, r.rank, r.name, factor), (_restored_makespan(g2, r.rank, r.name, factor) if g2 else None)
        if one is None or two is None:
            continue
        savings.append((two[0] - two[1]) - (one[0] - one[1]))
    if savings:
        r.one_step, r.saving = r.saving, estimate(savings)


def _without_extra_ops(g: ExecutionGraph, rank: int, counts: dict[str, int], steps: int = 1) -> tuple[float, float] | None:
    """(makespan, makespan without the rank's extra ops): of the ``steps`` consecutive steps ``g``
    holds, in each the last ``counts[name]`` occurrences of each name on the rank's host — a parent
    op as the region it encloses (its children with it), a leaf op as itself, none inside one
    already taken — at no time. The extra occurrences are the last: ops matched by their order,
    the ones past the peers' count. A name's occurrences are split into ``steps`` equal runs in time
    order (a persistent difference: each step runs the same ops). The time between two of them on
    their thread goes too. None where none is found."""
    from bottleneck_oracle.analysis.blame import region_time, restored_regions

    rg, n = g.regions, g.nodes
    leaf_in, region_in = _inside_same_name(g)  # (as _extra_ops counts them)
    mine = np.flatnonzero((rg["rank"] == rank) & ~rg["is_range"].astype(bool) & ~region_in)
    region_names = np.array([g.names[int(k)] for k in rg["name"][mine]], dtype=object)
    host = np.flatnonzero((n["rank"] == rank) & ~n["on_gpu"] & ~leaf_in)
    taken: list[int] = []  # regions
    leaves: list[int] = []
    covered = np.zeros(g.n_nodes, dtype=bool)

    def reach(name: str) -> int:
        regs = mine[region_names == name]
        return int((rg["last"][regs] - rg["first"][regs]).max()) if len(regs) else -1

    for name in sorted(counts, key=lambda x: -reach(x)):  # outermost first: a parent op before the ops inside it
        want = counts[name]
        regs = mine[region_names == name]
        if len(regs):
            for run in np.array_split(regs[np.argsort(rg["start"][regs], kind="stable")], steps):
                for j in run[-want:].tolist():
                    if not covered[int(rg["first"][j])]:
                        taken.append(j)
                        covered[int(rg["first"][j]) : int(rg["last"][j]) + 1] = True
        else:
            ops = host[n["name"][host] == g.names.index(name)] if name in g.names else host[:0]
            for run in np.array_split(ops[np.argsort(n["start"][ops], kind="stable")], steps):
                for i in run[-want:].tolist():
                    if not covered[i]:
                        leaves.append(i)
                        covered[i] = True
    if not taken and not leaves:
        return None
    parts = region_time(g)
    dd, ww, rr = restored_regions(g, parts, taken, [0.0] * len(taken))
    dd[leaves] = 0.0
    # the thread's own time between two ops both removed (the framework's, between one extra op and the next) goes with them
    both = np.flatnonzero(covered[:-1] & covered[1:] & (parts.gap[:-1] >= 0))
    ww[parts.gap[both]] = np.minimum(ww[parts.gap[both]], 0.0)
    return makespan_of(g), makespan_of(g, dd, ww, rr)


def _extra_saving(answer: RunAnswer, picked: list[StepAnalysis], two_steps: StepWindows | None, found: ExtraFound) -> None:
    """The step time removing the rank's extra ops (answer.extra_ops: the ops it runs more often
    than its peers; ``found``: those _where found in each picked step) saves, replayed on each
    picked step; in steady state where a step has a next one (both steps without them, replayed
    over the two; the second step's saving), else in the step alone."""
    rank = answer.extra_ops[0].rank
    one_step, steady = [], []
    for k, a in enumerate(picked):
        counts = {name: c for (r, name), (c, _) in found.get(k, {}).items() if r == rank}
        if not counts:
            continue
        one = _without_extra_ops(a.graph, rank, counts)
        if one is None:
            continue
        one_step.append(one[0] - one[1])
        g2 = two_steps(a.graph.step) if two_steps is not None and a.graph.step is not None else None
        two = _without_extra_ops(g2, rank, counts, steps=2) if g2 is not None else None
        if two is not None:
            steady.append((two[0] - two[1]) - (one[0] - one[1]))
    if steady:
        answer.extra_saving, answer.extra_one_step = estimate(steady), estimate(one_step)
    elif one_step:
        answer.extra_saving = estimate(one_step)


UNEVEN_INPUTS = 1.15
"""The straggler's matmuls given this many times the work of its peers' by their input sizes, or
more, with as many ops: its inputs are larger."""


def matmul_work(facts: StepFactsRecord | None) -> tuple[tuple[int, float, int], ...]:
    """Per rank of one step's facts whose matmuls' input sizes are known (``record_shapes``): (rank,
    the FLOPs those sizes give, how many such ops)."""
    return tuple((f.rank, f.host_matmul_flops, f.host_matmul_ops) for f in facts.ranks if f.host_matmul_ops > 0) if facts else ()


def input_work_ratio(shaped: Sequence[tuple[int, float, int]], rank: int, groups: dict[int, int]) -> float | None:
    """Of one step's matmul_work rows: ``rank``'s FLOPs over the median of its peers' (the other
    ranks of its peer group in ``groups``) where it runs as many such ops as their median (else
    other ops, not the same ones larger: the extra ops' answer); None where not comparable."""
    peers = {r for r in groups if r != rank and groups[r] == groups.get(rank, rank)}
    by = {r: (flops, ops) for r, flops, ops in shaped}
    theirs = [by[r] for r in peers if r in by]
    if rank not in by or not theirs or by[rank][1] != int(np.median([o for _, o in theirs])):
        return None
    base = float(np.median([x for x, _ in theirs]))
    return by[rank][0] / base if base > 0 else None


def _uneven_inputs(st: list[StepFigures], rank: int, blamed: list[StepAnalysis]) -> UnevenInputs | None:
    """UnevenInputs of ``rank`` over the steady steps ``st``: per step, the FLOPs its matmuls' input
    sizes give over the median of its peers' (its peer group in the blamed steps' graphs: data-
    parallel ranks, not pipeline stages), where it runs as many such ops as that peers' median;
    named where the ratio is UNEVEN_INPUTS or more in at least half of such steps."""
    from bottleneck_oracle.analysis.blame import peer_groups

    if not blamed:
        return None
    groups = peer_groups(blamed[0].graph)
    ratios = [x for x in (input_work_ratio(f.shaped, rank, groups) for f in st) if x is not None]
    larger = sum(x >= UNEVEN_INPUTS for x in ratios)
    if not ratios or larger < PERSISTENT * len(ratios):
        return None
    e = estimate(ratios)
    low = e.low_us if e.low_us is not None else e.median_us  # (no interval under 3 steps)
    high = e.high_us if e.high_us is not None else e.median_us
    return UnevenInputs(rank, e.median_us, low, high, larger, len(ratios))


def _halving_device(g: ExecutionGraph) -> float:
    """The makespan ``g`` saves with every device compute op (not a collective) at half its time."""
    n = g.nodes
    dur = n["mdur"].astype(np.float64).copy()
    dur[n["on_gpu"] & (n["node_type"] != NodeType.NETWORK)] *= 0.5
    return makespan_of(g) - makespan_of(g, dur)


def _device_weight(picked: list[StepAnalysis], windows: StepWindows) -> DeviceWeight | None:
    """A loop bound by its host although its step windows end with device time: halving the
    device's compute on each picked step that has a next one, in the one-step window and in steady
    state (the two steps' window's saving less the next step's own), where the steady-state saving
    is under HOST_BOUND of the one-step one, and the raw facts agree: the device idles (busy under
    HOST_DEVICE_BUSY of the period on every rank) and the host does not wait for it (its blocking
    calls under HOST_BLOCKING of the period), in the median step. None otherwise."""
    ones, steady, busy, blocked = [], [], [], []
    for a in picked:
        step = a.graph.step
        facts = a.graph.info.facts
        two = windows(step, 2) if step is not None and facts is not None else None
        after = windows(step + 1, 1) if two is not None and step is not None else None
        if two is None or after is None or facts is None or facts.period_us <= 0:
            continue
        ones.append(_halving_device(a.graph))
        steady.append(_halving_device(two) - _halving_device(after))
        busy.append(max(f.device_busy for f in facts.ranks))
        blocked.append(max(f.blocking_us for f in facts.ranks) / facts.period_us)
    if not ones:
        return None
    weight = DeviceWeight(estimate(ones), estimate(steady))
    host = weight.steady.median_us < HOST_BOUND * weight.one_step.median_us
    if host and float(np.median(busy)) < HOST_DEVICE_BUSY and float(np.median(blocked)) < HOST_BLOCKING:
        return weight
    return None

"""The self-check: the analysis of a step held against the facts read from its raw events.

``graph_pipeline.facts`` reads, without the graph, what the trace says of a step (the device's
period and busy time, the host's time in blocking calls, threads asleep through the step, device
events) and of the run (ranks present against the world size, events left out). Each invariant
below ties the analysis to those facts; one that fails is a contradiction between the tool's
picture and the trace, and is shown to the user as a warning: on traces nobody here has seen,
the tool says when its answer does not fit.

Invariants (thresholds stated with each):

- ``period``: the step time is the step's period (facts) within 5%: the graph ends the step
  where the trace does.
- ``device_bound``: a rank whose device was busy at least 95% of its period, and whose period is
  the step's, puts at least 80% of the critical path on its device; on the ranks' devices, where
  it was busy computing less than 95% (the rest a collective's kernel running alone, which may
  wait for a peer: a pipeline stage's receive, for the stage before it).
- ``blocking``: host time in calls that block on the device (synchronize, copies, queries; each
  >= 1 ms) is not reported as CPU overhead: at most 25% of it is (a copy from pageable memory
  stages its data on the host before the device copies it: that part is host work).
- ``host_blocked``: time of the step's own thread in Python calls that block it without computing
  (``time.sleep``, a lock's acquire, ``select``, a pipe's read; each >= 1 ms, seen with
  ``with_stack=True``), in functional collectives' waits (``_c10d_functional::wait_tensor``) and
  in collectives' own calls (``c10d::allreduce_`` held past handing its work to the backend) is
  not reported as an op's work (communication it may be): at most 25% of it is.
- ``loader_wait``: time the step's own thread spent inside a multi-process DataLoader's
  ``__next__`` with no other event of its thread open (each stretch >= 1 ms: the loop waiting for
  the loader's workers) is not reported as work or untraced time: at most 25% of it is.
- ``asleep``: a host thread that slept through the step (one op covering 90% of it) carries at
  most 10% of the critical path.
- ``device_ops``: every device event the facts count for the step is a device node of the graph.
- ``launches``: the graph keeps the launch of every device op the trace ties to the call that
  launched it (at least 99% of them): a device op that starts before its launch call is a clock
  the trace's host and device disagree on, and its launch cannot be a dependency.
- ``linked``: on a rank whose host makes runtime calls in the step, at least half of the step's
  device ops are tied to the call that launched them (a correlation id the trace gives both):
  without those ties the device's dependencies on the host are unknown, and the path treats the
  device as running free of its host.
- ``launches_found``: on a rank with device events in the trace, at least half of the step's
  launch calls (``cudaLaunchKernel``, ``hipLaunchKernel``, ``cudaGraphLaunch``, ...; 20 or more)
  have their device ops in it: where they have not, the profiler lost the device's events of the
  step, and the step is read from its host alone.
- ``compute``: the path's device-op time is at most the device busy time of the ranks it runs on
  (plus 1%): no breakdown class exceeds what the device did.
- ``collectives_meet``: no collective matched across ranks has a participant whose recorded end
  comes before another's recorded start (a collective cannot end before all have joined).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from bottleneck_oracle.analysis.segments import COMM, CPU, Segment
from bottleneck_oracle.graph_pipeline import fields as F
from bottleneck_oracle.graph_pipeline.arrays import isin_small
from bottleneck_oracle.graph_pipeline.collectives import SYMMETRIC
from bottleneck_oracle.graph_pipeline.facts import BLOCKING_FACT_US, WAITING_NAME, RunFacts
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle.graph_pipeline.groups import MEET_TOLERANCE_US
from bottleneck_oracle.graph_pipeline.schema import EdgeKind

if TYPE_CHECKING:
    from bottleneck_oracle.analysis.summary import StepAnalysis  # (for the annotation only: summary imports this module)

CheckName = Literal[
    "period",
    "device_bound",
    "blocking",
    "host_blocked",
    "loader_wait",
    "asleep",
    "device_ops",
    "launches",
    "linked",
    "launches_found",
    "compute",
    "device_idle",
    "collectives_meet",
]

PERIOD_TOLERANCE = 0.05
DEVICE_BUSY = 0.95
DEVICE_PATH_SHARE = 0.80
BLOCKING_AS_CPU = 0.25
ASLEEP_PATH_SHARE = 0.10
COMPUTE_SLACK = 0.01
DEVICE_IDLE_SLACK = 0.01  # of the step: the path's untraced device waits may exceed the device's idle time by this
LAUNCHES_KEPT = 0.99
LINKED_SHARE = 0.5
LOST_MIN_LAUNCHES = 20
LOST_SHARE = 0.5
_CUDA_GRAPH = re.compile(r"cudagraph", re.IGNORECASE)  # torch.compile's CUDA-graph trees recording (``CUDAGraphNode.record``)
_BLOCKING = re.compile(r"synchroni[sz]e|memcpy|memset|eventquery|streamquery|" + F.HOST_WAIT_PATTERN, re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Check:
    """One invariant on one step: whether it holds, and the figures it compared."""

    name: CheckName
    ok: bool
    detail: str  # what was compared, in words with the figures


def _ms(us: float) -> str:
    return f"{us / 1000:.1f} ms"


def step_checks(a: StepAnalysis) -> list[Check]:
    """The invariants of one analysed step against the facts in its graph's meta (facts.py);
    none when the graph carries no facts (Chakra input, graphs saved by older versions)."""
    g = a.graph
    facts = g.info.facts
    if facts is None:
        return []
    segs: list[Segment] = a.segments()
    ms = a.step_time or 1.0
    out: list[Check] = []
    period = facts.period_us
    if period > 0:
        off = (a.step_time - period) / period
        out.append(
            Check(
                "period",
                abs(off) <= PERIOD_TOLERANCE,
                f"step time {_ms(a.step_time)} against the period the trace shows, {_ms(period)} ({100 * off:+.1f}%)",
            )
        )
    on_device: dict[int, float] = {}
    for s in segs:
        if s.on_gpu:
            on_device[s.rank] = on_device.get(s.rank, 0.0) + s.dur
    for f in facts.ranks:
        if f.device_ops and f.device_busy >= DEVICE_BUSY and f.period_us >= (1 - PERIOD_TOLERANCE) * period:
            share = on_device.get(f.rank, 0.0) / ms
            where = "on it"
            if f.device_compute_busy < DEVICE_BUSY:
                # busy in part with collectives' kernels alone: one may wait there for a peer (a pipeline
                # stage's receive, for the stage before it), and the path is then on the peer's device
                share = sum(on_device.values()) / ms
                where = f"on the ranks' devices (its own busy computing {100 * f.device_compute_busy:.0f}% of the period)"
            out.append(
                Check(
                    "device_bound",
                    share >= DEVICE_PATH_SHARE,
                    f"rank {f.rank}'s device was busy {100 * f.device_busy:.1f}% of its period; {100 * share:.0f}% of the critical path runs {where}",
                )
            )
    blocking_us = sum(f.blocking_us for f in facts.ranks)
    if blocking_us > 0:
        dur = g.nodes["dur"]
        as_cpu = sum(
            s.dur
            for s in segs
            if s.kind == "op" and s.klass == CPU and not s.on_gpu and _BLOCKING.search(s.name) and dur[s.node] >= BLOCKING_FACT_US
        )  # the calls the facts count
        out.append(
            Check(
                "blocking",
                as_cpu <= BLOCKING_AS_CPU * blocking_us,
                f"{_ms(blocking_us)} in calls that block on the device; {_ms(as_cpu)} of the path shown as CPU work in such calls",
            )
        )
    host_blocked_us = sum(f.host_blocked_us for f in facts.ranks)
    if host_blocked_us > 0:
        as_work = sum(
            s.dur
            for s in segs
            if s.kind == "op"
            and s.klass != COMM
            and not s.on_gpu
            and WAITING_NAME.search(s.name)
            and g.nodes["dur"][s.node] >= BLOCKING_FACT_US
        )  # the calls the facts count, read as an op's work
        out.append(
            Check(
                "host_blocked",
                as_work <= BLOCKING_AS_CPU * host_blocked_us,
                f"{_ms(host_blocked_us)} of the step's thread in calls that block it (sleep, lock, select, a collective's call or wait); "
                f"{_ms(as_work)} of the path shown as work in such calls",
            )
        )
    for f in facts.ranks:
        if not f.loader_waits:
            continue
        waited = sum(hi - lo for lo, hi in f.loader_waits)
        as_work = sum(
            max(0.0, min(s.end, hi) - max(s.start, lo))
            for s in segs
            if s.rank == f.rank and not s.on_gpu and s.kind != "wait"
            for lo, hi in f.loader_waits
        )  # (the path elsewhere meanwhile, on another thread or the device, is no work in the wait)
        out.append(
            Check(
                "loader_wait",
                as_work <= BLOCKING_AS_CPU * waited,
                f"rank {f.rank}'s step thread waited {_ms(waited)} in the DataLoader's __next__ with nothing of its own open; "
                f"{_ms(as_work)} of the path shown there as work or untraced time",
            )
        )
    for f in facts.ranks:
        for t in f.asleep:
            carried = sum(s.dur for s in segs if not s.on_gpu and s.rank == f.rank and s.tid == t.tid)
            out.append(
                Check(
                    "asleep",
                    carried <= ASLEEP_PATH_SHARE * ms,
                    f"rank {f.rank} {t.thread} slept through the step in {t.op[:60]}; it carries "
                    f"{100 * carried / ms:.0f}% of the critical path",
                )
            )
    device_ops = sum(f.device_ops for f in facts.ranks)
    nodes = int(g.nodes["on_gpu"].sum())
    if device_ops:
        out.append(
            Check(
                "device_ops",
                nodes >= device_ops,
                f"{device_ops} device events launched in the step in the trace; {nodes} device ops in the graph",
            )
        )
    launched = sum(f.launched for f in facts.ranks)
    if launched:
        early = sum(f.early_launches for f in facts.ranks)
        # (a device op its call waits for, a blocking copy's or a synchronous launch's, has that
        # wait instead where no op of the call's thread precedes the call in the window)
        kept = int((g.edges["kind"] == EdgeKind.LAUNCH).sum()) + g.info.launches_waited_at_start
        out.append(
            Check(
                "launches",
                kept >= LAUNCHES_KEPT * launched,
                f"{launched} device ops launched in the step by a call the trace names; {kept} launch dependencies in the graph"
                + (
                    f"; {early} of the ops start before their launch call began: the trace's device clock runs ahead of its "
                    "host clock (or its times are inconsistent), so the host/device split of this step is unreliable"
                    if early
                    else ""
                ),
            )
        )
    for f in facts.ranks:
        if f.device_ops and f.runtime_calls:
            tied = f.launched >= LINKED_SHARE * f.device_ops
            out.append(
                Check(
                    "linked",
                    tied,
                    f"rank {f.rank}: {f.launched} of its {f.device_ops} device ops in the step are tied to the runtime call that "
                    f"launched them ({f.runtime_calls} runtime calls on its host)"
                    + (
                        ""
                        if tied
                        else "; the rest have no correlation id a call shares: the path treats the device as running free of its host"
                    ),
                )
            )
    for f in facts.ranks:
        if f.launch_calls >= LOST_MIN_LAUNCHES:
            found = f.lost_launches < LOST_SHARE * f.launch_calls
            out.append(
                Check(
                    "launches_found",
                    found,
                    f"rank {f.rank}: {f.launch_calls - f.lost_launches} of its {f.launch_calls} launch calls in the step have their "
                    "device ops in the trace"
                    + (
                        ""
                        if found
                        else f"; the other {f.lost_launches} have none: the profiler lost the device's events of this step (a "
                        "full activity buffer, a trace cut short), so its device work is unknown and the step is read from "
                        "its host alone"
                    ),
                )
            )
    for f in facts.ranks:
        if f.devices == 1 and f.period_us > 0:  # (the busy time of several devices is their union: not each one's)
            waited = sum(s.dur for s in segs if s.on_gpu and s.kind == "untraced" and s.rank == f.rank)
            idle = max(f.period_us - f.device_busy_us, 0.0)
            if waited > 0:
                out.append(
                    Check(
                        "device_idle",
                        waited <= idle + DEVICE_IDLE_SLACK * ms,
                        f"rank {f.rank}: {_ms(waited)} of the path waits on its device with no traced cause; the device was "
                        f"idle {_ms(idle)} of the period",
                    )
                )
    met = _collectives_met(g)
    if met is not None:
        n_inst, unmet = met
        detail = (
            f"{n_inst - len(unmet)} of {n_inst} collectives matched across ranks could have met (no participant ended before another began)"
        )
        if unmet:
            name, early, late, gap = unmet[0]
            detail += f"; e.g. {name}: rank {early}'s ended {_ms(gap)} before rank {late}'s began (the ranks' clocks disagree, or the calls were matched wrongly)"
        out.append(Check("collectives_meet", not unmet, detail))
    busy = sum(f.device_busy_us for f in facts.ranks if f.rank in on_device)
    dev_ops = sum(s.dur for s in segs if s.on_gpu and s.kind == "op")
    if dev_ops > 0:
        out.append(
            Check(
                "compute",
                dev_ops <= busy * (1 + COMPUTE_SLACK) + 1.0,
                f"{_ms(dev_ops)} of device ops on the path; the devices it runs on were busy {_ms(busy)}",
            )
        )
    return out


def _collectives_met(g: ExecutionGraph) -> tuple[int, list[tuple[str, int, int, float]]] | None:
    """Of the step's symmetric collectives matched across ranks (each barrier's participants), how
    many, and those in which a participant's recorded end comes before another's recorded start
    (beyond MEET_TOLERANCE_US): (name, the rank that ended, the rank that began later, by how much),
    worst first. None where the step has none. From the ops' recorded times: a participant joins no
    later than its op starts and is done no earlier than its op ends."""
    n, e = g.nodes, g.edges
    sync = np.flatnonzero(e["kind"] == EdgeKind.COLLECTIVE_SYNC)
    dst = e["dst"][sync]
    keep = isin_small(n["coll_kind"][dst], SYMMETRIC)
    if not keep.any():
        return None
    bar, dst = e["src"][sync][keep], dst[keep]
    order = np.argsort(bar, kind="stable")  # (each barrier's participants together: one pass, not one scan per barrier)
    bar, dst = bar[order], dst[order]
    cuts = np.flatnonzero(np.r_[True, bar[1:] != bar[:-1]])
    start = n["start"][dst]
    end = start + n["dur"][dst]
    gap = np.maximum.reduceat(start, cuts) - np.minimum.reduceat(end, cuts)
    size = np.diff(np.r_[cuts, len(bar)])
    out = []
    for k in np.flatnonzero((size >= 2) & (gap > MEET_TOLERANCE_US)).tolist():
        m = dst[cuts[k] : cuts[k] + size[k]]
        first, last = int(m[np.argmin(n["start"][m] + n["dur"][m])]), int(m[np.argmax(n["start"][m])])
        out.append((g.node_name(first), int(n["rank"][first]), int(n["rank"][last]), float(gap[k])))
    return len(cuts), sorted(out, key=lambda x: -x[3])


def run_warnings(run: RunFacts | None) -> list[str]:
    """What the input says of the whole job that bears on every answer: ranks missing against the
    world size, events left out of the trace (sampled or removed), one side of a job on host and
    device left out by the profiler's activities (facts.unprofiled). (Device events in unknown
    categories are counted when the files are read.)"""
    if not run:
        return []
    out = []
    present, world = len(run.ranks), run.world_size
    if world and present < world:
        out.append(
            f"{present} of {world} ranks are in the input: a collective's time includes waiting for ranks that are not here, "
            "and a straggler among them cannot be named"
        )
    for rank, k in sorted(run.step_offsets.items()):
        out.append(
            f"rank {rank} numbers its steps {abs(k)} {'ahead of' if k > 0 else 'behind'} rank {min(run.ranks)} (its ProfilerStep#N runs "
            f"beside rank {min(run.ranks)}'s #N{-k:+d}): their profilers counted steps differently, and steps are matched by number, "
            "so each step pairs different iterations of the ranks (or, if they ran on different hosts, their clocks are more than "
            "half a step apart: then pass --ranks-per-host N)"
        )
    for rank, u in sorted(run.unprofiled.items()):
        if u["missing"] == "host" and u.get("skipped"):  # host events there, none this tool reads: another profiler's trace
            out.append(
                f"rank {rank}'s trace holds device events ({u['device_events']:,}) and no host op nor runtime call this tool reads: "
                f"its host's {u['skipped']} (not the PyTorch profiler's: an XLA profile?), so the path is the device's alone, a gap "
                "on the device reads as idle where its host may have been busy, and there are no ProfilerStep markers to cut steps at"
            )
            continue
        if u["missing"] == "host ops":
            out.append(
                f"rank {rank}'s trace holds device events ({u['device_events']:,}) and the runtime's calls ({u['runtime_calls']:,}) "
                "but no host op: its profiler did not record the host's ops (ProfilerActivity.CPU off: the device activity "
                "records only the launches, copies and synchronizes), so the host's own work between those calls reads as "
                "untraced, no op of the model can be named, and there are no ProfilerStep markers to cut steps at; profile with "
                "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]"
            )
            continue
        if u["missing"] == "host":
            out.append(
                f"rank {rank}'s trace holds device events only ({u['device_events']:,}), no host op nor runtime call: its profiler "
                "did not record the host (ProfilerActivity.CPU off), so the path is the device's alone, a gap on the device reads as "
                "idle where its host may have been busy, and there are no ProfilerStep markers to cut steps at"
            )
            continue
        named = ", ".join(u["examples"])
        seen = f"its deviceProperties list {', '.join(u['devices'][:2])}" if u["devices"] else ""
        why = (
            f"{u['ops']:,} of its host ops run only with an accelerator ({named})" + (f", and {seen}" if seen else "")
            if u["ops"]
            else f"{seen}, so it may have used one"
        )
        out.append(
            f"rank {rank}'s trace holds no device event, yet {why}: its profiler recorded the host only (the device activity, "
            "e.g. ProfilerActivity.CUDA, off). Time the host spent waiting on the device (copies to the host, .item(), "
            "synchronize) reads as host work here, and the device's own time cannot be seen: profile with the device activity "
            "on for the step's real picture"
        )
    for rank, v in sorted(run.synchronous.items()):
        out.append(
            f"rank {rank}'s launches of 50 µs of device work or more returned only after it had ended ({v['waited']:,} of "
            f"{v['launches']:,}): its device ran in step with its host (CUDA_LAUNCH_BLOCKING=1, a sanitizer or a debugger), so "
            "each launch waits for its own work and is read as a wait on the device; the step is host and device in series, "
            "not the job as it runs with asynchronous launches"
        )
    for rank, v in sorted(run.setup.items()):
        parts = []
        if v.get("compile_us"):
            longest = ", ".join(f"{n.removesuffix(' (dynamo_timed)')} {us / 1000:,.1f} ms" for n, us in v.get("compile_top", [])[:2])
            recording = any(_CUDA_GRAPH.search(n) for n, _ in v.get("compile_top", [])[:2])
            what = "compiling and recording CUDA graphs" if recording else "compiling"
            parts.append(f"torch.compile {what} for {v['compile_us'] / 1000:,.1f} ms ({longest})")
        if v["calls"]:
            names = ", ".join(f"{n} {us / 1000:,.1f} ms" for n, us in v["top"][:3])
            parts.append(
                f"the runtime setting itself up: {v['calls']:,} call{'s' if v['calls'] != 1 else ''} of 1 ms or more with its device "
                f"idle ({names}): creating its context, loading kernels at their first launch, first allocations"
            )
        out.append(
            f"{v['us'] / 1000:,.1f} ms ({100 * v['us'] / v['window_us']:.0f}%) of rank {rank}'s analysed window is one-time work, "
            f"{'; and '.join(parts)}. That time is the process's start, not its loop: profile steps after a warm-up "
            "(torch.profiler.schedule(wait=1, warmup=1, active=3)); the steps that hold it include it"
        )
    for rank, held in sorted(run.sampled().items()):
        n = run.numbered[rank]
        out.append(
            f"rank {rank}'s trace holds {n['held']:,} of the {n['numbered']:,} events its profiler numbered (Ev Idx, {100 * held:.1f}%): "
            "events were sampled or removed, so ops and the waits between them may be missing"
        )
    return out

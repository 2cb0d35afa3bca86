"""What a user reads off one analysed step: breakdown, top ops, slack, rank skew."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bottleneck_oracle.analysis.checks import Check, step_checks
from bottleneck_oracle.analysis.cpm import CPMResult, run_cpm
from bottleneck_oracle.analysis.kernels import FamilyTime, Overlap, families, overlap, scope
from bottleneck_oracle.analysis.rows import (
    CommSlack,
    GpuQueue,
    KernelFamilies,
    PathCause,
    PathSegment,
    RankQueue,
    RankRow,
    StepReport,
    StepStraggler,
    TopOp,
)
from bottleneck_oracle.analysis.segments import (
    BREAKDOWN_KEYS,
    UNTRACED_GAP_US,
    Segment,
    SegmentKind,
    breakdown,
    explain,
    input_pipeline,
    label,
    node_class,
)
from bottleneck_oracle.graph_pipeline.arrays import isin_sorted
from bottleneck_oracle.graph_pipeline.facts import PAST_END_US
from bottleneck_oracle.graph_pipeline.graph import Bystander, ExecutionGraph
from bottleneck_oracle.graph_pipeline.schema import Category, EdgeKind, NodeType
from bottleneck_oracle.serial import JSONObject, to_json_object

SETUP_STEP_SHARE = 0.2
"""A step whose one-time work (facts ``setup_us``) is this share of its time or more is warm-up."""
CUT_PAST_END_US = PAST_END_US  # (the facts count held_share from there)
CUT_PAST_END_SHARE = 0.05
"""A step's span that runs on this far (µs) and this share of it past its rank's last event: the
trace ends inside it (in the traces bundled, a last step's span ends at most 0.67 ms, 0.4% of it,
after its rank's last event; sampled events 4.5 ms, 0.7%)."""
CUT_HELD_SHARE = 0.95
"""... while holding fewer host events than this share of its rank's typical step's (facts.held_share)."""
PIPELINE_BUSY_EXCESS = 0.1
PIPELINE_BUSY_MIN_US = 1000.0
"""A rank that made the others wait only at a pipeline's sends and receives on the critical path is
a straggler where it also kept busier than they did (busy_by_rank: this share and this many µs
over the others' median): the waits a schedule holds by design
(GPipe's first stage waits for every later stage's forwards and backwards; 1F1B's warm-up) are
no one's lateness, and were named as a straggler in a pipeline of equal stages."""
BYSTANDERS_SAID_EACH = 3
"""More host threads of one rank left out of a step than this: one warning names the first few
and counts the rest (an MTIA job has a submission thread per stream)."""

__all__ = ["BREAKDOWN_KEYS", "StepAnalysis"]


def _rank_positions(ranks: np.ndarray, node_rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the position of its rank in the sorted ``ranks`` (0 where it has none: barriers)
    and whether it has one."""
    pos = np.searchsorted(ranks, node_rank)
    inside = pos < len(ranks)
    pos = np.where(inside, pos, 0)
    on = inside & (ranks[pos] == node_rank) if len(ranks) else inside
    return np.where(on, pos, 0), on


_EDGE_WORDS = {
    "thread": "thread hand-over",
    "sync": "wait on the device",
    "launch": "launch",
    "program_order": "program-order edge",
    "feeds": "collective's completion feeding its waiter",
    "fwd_bwd": "forward-to-backward edge",
    "data": "data dependency",
    "backend": "c10d call-to-backend edge",
    "collective_sync": "collective barrier edge",
    "send_recv": "send/recv barrier edge",
}
"""How a warning names each edge kind (schema.EdgeKind, lower case)."""


LATE_RANK_PATH_SHARE = 0.5
"""A rank that arrived last at a collective where the others waited, and holds this share of the
critical path's time or more, is the step's straggler though no barrier is on the path
(StepAnalysis._late_and_critical)."""


@dataclass(slots=True, repr=False)
class StepAnalysis:
    """One analysed step (api.analyze): its graph, the critical path method's result on it, and
    what a user reads off them. Times are µs; ``report()`` is the step of ``analyze --json``
    (``serial.to_json(a.report(top))``, or ``a.to_dict(top)``).

    Attributes:
        graph: the step's ExecutionGraph (all ranks merged).
        cpm: the critical path method on it (analysis.cpm.CPMResult: EST, LST, slack, path, makespan).
        untraced_gap_us: time between ops longer than this (µs) with no traced cause is untraced.
    """

    graph: ExecutionGraph
    cpm: CPMResult
    untraced_gap_us: float = UNTRACED_GAP_US
    _segments: list[Segment] | None = None
    _checks: list[Check] | None = None
    _queue: tuple[GpuQueue | None] | None = None  # gpu_queue(), computed once
    _breakdown: dict[str, float] | None = None  # breakdown(), computed once

    def __repr__(self) -> str:
        period = f", period {self.period / 1000:.3f} ms" if self.period is not None else ""
        return (
            f"StepAnalysis(step {self.graph.step}, ranks {self.graph.ranks}: step time {self.step_time / 1000:.3f} ms{period}, "
            f"measured {self.measured / 1000:.3f} ms, {self.graph.n_nodes} nodes, critical path {len(self.cpm.path)} nodes)"
        )

    def _repr_html_(self) -> str:
        """A notebook's view: the step's figures and its breakdown."""
        from bottleneck_oracle.inert import html_text

        rows = [
            ("step", self.graph.step),
            ("ranks", self.graph.ranks),
            ("step time (ms)", f"{self.step_time / 1000:.3f}"),
            ("period (ms)", "—" if self.period is None else f"{self.period / 1000:.3f}"),
            ("measured (ms)", f"{self.measured / 1000:.3f}"),
        ]
        rows += [(f"{k} (ms)", f"{v / 1000:.3f}") for k, v in self.breakdown().items()]
        warn = "".join(f"<p>warning: {html_text(w)}</p>" for w in self.warnings())
        return (
            "<table>" + "".join(f"<tr><th>{html_text(str(k))}</th><td>{html_text(str(v))}</td></tr>" for k, v in rows) + "</table>" + warn
        )

    @classmethod
    def of(cls, g: ExecutionGraph, untraced_gap_us: float = UNTRACED_GAP_US) -> StepAnalysis:
        """Run the critical path method on ``g`` and wrap the result."""
        return cls(graph=g, cpm=run_cpm(g), untraced_gap_us=untraced_gap_us)

    # -- the numbers -------------------------------------------------------------------

    @property
    def measured(self) -> float:
        """The measured step time from the ProfilerStep spans (µs): the slowest rank's span, or from
        the last rank's start to the last rank's end where the step follows one in the trace
        (ExecutionGraph.span)."""
        return self.graph.span()

    def rank_step_times(self) -> dict[int, float]:
        """Each rank's step time from the CPM (µs): from its own step start to the end of its
        last op. Ranks start a step at different times, so the merged window is longer."""
        g, r = self.graph, self.cpm
        ranks = np.asarray(g.ranks, dtype=np.int64)
        pos, on = _rank_positions(ranks, g.nodes["rank"])
        last = np.full(len(ranks), -np.inf)
        np.maximum.at(last, pos[on], r.eft[on])
        return {rk: float(last[i] - g.rank_start(rk)) if np.isfinite(last[i]) else 0.0 for i, rk in enumerate(g.ranks)}

    def is_empty(self) -> bool:
        """Does the step hold no op at all (its graph only its step-end markers)? Such a step is
        the time between the last ``prof.step()`` and the profiler's stop (older PyTorch writes a
        ProfilerStep span there), not a step of the loop."""
        return self.graph.step is not None and not bool((self.graph.nodes["event"] >= 0).any())

    def cut_by_trace_end(self) -> list[str]:
        """How the trace ends inside this step, one phrase per rank where it does (empty: it does
        not): launches after the rank's last launch that has a device op (their work had not run
        when the trace stopped: a trace cut at a time, a profiler stopped with work still queued),
        or the step's span running on more than CUT_PAST_END_US and CUT_PAST_END_SHARE of it past
        the rank's last event with fewer host events than CUT_HELD_SHARE of the rank's typical
        step's (the ops after the cut are gone; a last step that holds them all and ends with
        untraced work, a checkpoint written after the loop's last op, is whole). Such a step's time
        and breakdown are those of the part the trace holds."""
        facts = self.graph.info.facts
        if facts is None or self.graph.step is None:
            return []
        out = []
        for f in facts.ranks:
            span = float(self.graph.measured.get(f.rank, 0.0))
            if f.unrun_launches:
                out.append(f"rank {f.rank}: {f.unrun_launches} of its launches come after its last one whose device work the trace holds")
            elif f.past_end_us > max(CUT_PAST_END_US, CUT_PAST_END_SHARE * span) and f.held_share < CUT_HELD_SHARE:
                out.append(f"rank {f.rank}: its step runs {f.past_end_us / 1000:,.1f} ms past its last event")
        return out

    def adds_nothing(self) -> bool:
        """Did every rank's host end the step before the device work queued before it did, the
        step's own device work (if any) ending earlier still (``RankFacts.hidden``)? Such a step
        (a few host ops after a device-bound loop's last launches: logging, the profiler's stop)
        adds nothing to the loop's time: its step time is its host's span, and it is left out of
        the run's figures like a span that holds no op."""
        facts = self.graph.info.facts
        if facts is None or self.graph.step is None or not facts.ranks:
            return False
        return all(f.hidden for f in facts.ranks)

    def holds_setup(self) -> bool:
        """Does the step spend SETUP_STEP_SHARE of its time or more in one-time work (the runtime
        setting itself up, torch.compile compiling: ``facts.setup_calls``' rules, per step and
        rank)? Such a step is warm-up, whatever its place in the run."""
        facts = self.graph.info.facts
        if facts is None or self.graph.step is None:
            return False
        return max((f.setup_us for f in facts.ranks), default=0.0) >= SETUP_STEP_SHARE * max(self.step_time, 1e-9)

    @property
    def step_time(self) -> float:
        """Predicted step time: the CPM's objective (µs; analysis.cpm), the step's period in the graph."""
        return self.cpm.makespan

    def node_class(self) -> np.ndarray:
        """Breakdown class per node: 0 compute, 1 communication, 2 CPU overhead."""
        return node_class(self.graph)

    def segments(self) -> list[Segment]:
        """The critical path, segment by segment (analysis.segments), computed once."""
        if self._segments is None:
            self._segments = explain(self.graph, self.cpm, self.untraced_gap_us)
        return self._segments

    def breakdown(self) -> dict[str, float]:
        """Critical path time by class (µs): compute, communication, cpu_overhead, idle (waiting
        with a traced cause) and untraced; every part >= 0, together the makespan."""
        if self._breakdown is None:
            self._breakdown = breakdown(self.segments())
        return dict(self._breakdown)

    def input_pipeline_us(self) -> float:
        """The critical path's time inside the DataLoader's ``__next__`` (µs; analysis.segments.input_pipeline)."""
        return input_pipeline(self.graph, self.segments())

    @property
    def untraced_us(self) -> float:
        """The critical path's time in gaps with no traced cause (µs)."""
        return self.breakdown()["untraced"]

    def critical_time(self, with_gaps: bool = False) -> np.ndarray:
        """Time each node contributes to the critical path (µs, 0 off the path): its modelled
        duration as it lies on the path, and with ``with_gaps`` also the time on the path
        before it (waits, latencies, untraced time), so that the parts add up to the makespan."""
        g = self.graph
        t = [0.0] * g.n_nodes  # summed in Python, segment by segment: the same floats, without numpy's per-item cost
        code = g.nodes["name"].tolist()
        for s in self.segments():
            if with_gaps or (s.kind == "op" and s.name == g.names[code[s.node]]):
                t[s.node] += s.dur
        return np.array(t, dtype=np.float64)

    def top_ops(self, k: int = 20) -> list[TopOp]:
        """What the critical path's time went to, largest first: ops (an op's own time between
        its children included), the framework time of ranges, waits, launch latency, untraced
        time (segments.label); shares of the makespan add up to 1 over all of them."""
        total: dict[str, float] = {}
        count: dict[str, int] = {}
        kind: dict[str, SegmentKind] = {}
        for s in self.segments():
            key = label(s) if s.kind == "framework" or s.kind == "untraced" else s.name  # (label: the name of the rest)
            total[key] = total.get(key, 0.0) + s.dur
            count[key] = count.get(key, 0) + 1
            kind.setdefault(key, s.kind)
        ms = self.cpm.makespan or 1.0
        order = sorted(total, key=lambda x: (-total[x], x))[:k]
        return [TopOp(name=x, kind=kind[x], critical_us=total[x], share=total[x] / ms, count=count[x]) for x in order]

    def critical_path(self, segments: list[Segment] | None = None) -> list[PathSegment]:
        """The segments (``segments``: those of them) as named rows, in time order (schema:
        docs/commands/analyze.md, critical_path)."""
        g = self.graph
        info = g.info
        threads, streams = info.thread_names, info.stream_names
        rows = []
        on_gpu_of, rank_of, tid_of = g.nodes["on_gpu"], g.nodes["rank"], g.nodes["tid"]
        for s in (
            self.segments() if segments is None else segments
        ):  # positional arguments: a long step has hundreds of thousands of segments
            key = f"{s.rank}:{s.tid}"
            host = not s.on_gpu and s.rank >= 0
            cause = None
            if s.cause >= 0:
                c = s.cause
                on_gpu = bool(on_gpu_of[c])
                rk, tid = int(rank_of[c]), int(tid_of[c])
                cause = PathCause(
                    c,
                    g.node_name(c),
                    rk,
                    None if on_gpu or rk < 0 else threads.get(f"{rk}:{tid}", f"thread {tid}"),
                    tid if on_gpu else None,
                )
            rows.append(
                PathSegment(
                    s.kind,
                    s.rank,
                    s.tid if host else None,
                    threads.get(key, f"thread {s.tid}") if host else None,
                    s.tid if s.on_gpu else None,
                    s.name,
                    s.start,
                    s.dur,
                    s.node,
                    cause,
                    streams.get(key, f"stream {s.tid}") if s.on_gpu else None,
                )
            )
        return rows

    def untraced_warning(self, share: float = 0.10) -> str | None:
        """One line when more than ``share`` of the step is untraced: how much, and where most of it is."""
        segs = [s for s in self.segments() if s.kind == "untraced"]
        total = sum(s.dur for s in segs)
        ms = self.cpm.makespan or 1.0
        if not segs or total <= share * abs(ms):
            return None
        g = self.graph
        where: dict[tuple[int, int, bool], float] = {}
        for s in segs:
            where[(s.rank, s.tid, s.on_gpu)] = where.get((s.rank, s.tid, s.on_gpu), 0.0) + s.dur
        (rank, tid, gpu), most = max(where.items(), key=lambda kv: kv[1])
        place = g.info.lane_name(rank, tid, gpu)
        big = max(segs, key=lambda s: s.dur)
        step = g.step if g.step is not None else "(whole trace)"
        return (
            f"step {step}: {total / 1000:.1f} ms ({100 * total / ms:.0f}%) of the critical path is untraced (no traced cause), "
            f"{most / 1000:.1f} ms of it on rank {rank} {place}; the longest stretch is {big.dur / 1000:.1f} ms "
            f"{'with no op open' if big.name == 'no op open' else 'in ' + big.name} before {g.node_name(big.node)} at {big.start / 1000:.3f} ms"
        )

    def gpu_queue(self) -> GpuQueue | None:
        """How far each rank's GPU ran behind its CPU in this step: the median delay from a launch
        call's start to its GPU op's start, how long after the step's CPU end the GPU finished the
        step's work, and whether the queue was deeper than the step (the GPU still ran earlier
        steps' work when this step's began). None without GPU ops."""
        if self._queue is None:
            self._queue = (self._gpu_queue(),)
        return self._queue[0]

    def _gpu_queue(self) -> GpuQueue | None:
        g = self.graph
        n, e = g.nodes, g.edges
        if not n["on_gpu"].any():
            return None
        launch = e["kind"] == EdgeKind.LAUNCH
        src, dst = e["src"][launch], e["dst"][launch]
        ends = g.info.step_end_us
        ranks = np.asarray(g.ranks, dtype=np.int64)
        pos, _ = _rank_positions(ranks, n["rank"])
        gpu = np.flatnonzero(n["on_gpu"])
        has_gpu = np.bincount(pos[gpu], minlength=len(ranks)) > 0
        gpu_end = np.full(len(ranks), -np.inf)
        np.maximum.at(gpu_end, pos[gpu], n["start"][gpu] + n["dur"][gpu])
        lag_of = np.zeros(len(ranks))  # median launch-to-start delay per rank: one sort, not one scan per rank
        key = pos[dst]
        order = np.lexsort((n["start"][dst] - n["start"][src], key))
        k, lags = key[order], (n["start"][dst] - n["start"][src])[order]
        cut = np.flatnonzero(np.diff(k)) + 1
        for part, vals in zip(np.split(k, cut), np.split(lags, cut)):
            if len(part):
                lag_of[part[0]] = float(np.median(vals))
        out = []
        for i, rk in enumerate(g.ranks):
            if not has_gpu[i]:
                continue
            end_cpu = ends.get(str(rk))
            tail = float(gpu_end[i] - end_cpu) if end_cpu is not None else 0.0
            span = g.measured.get(rk, 0.0)
            lag = float(lag_of[i])
            waited = float(g.info.queue_wait_us.get(str(rk), 0.0))
            out.append(
                RankQueue(
                    rank=rk,
                    lag_us=lag,
                    gpu_after_step_us=max(tail, 0.0),
                    deeper_than_step=bool(span and lag > span),
                    host_queue_wait_us=waited,
                )
            )
        return GpuQueue(ranks=out, deeper_than_step=any(x.deeper_than_step for x in out)) if out else None

    def lowest_slack_comm(self, k: int = 10) -> list[CommSlack]:
        """The ``k`` communication ops with the least slack (µs), with how long each waited for its peers."""
        g, r = self.graph, self.cpm
        n = g.nodes
        net = np.flatnonzero((n["node_type"] == NodeType.NETWORK) & (n["category"] != Category.BARRIER))
        order = net[np.lexsort((-n["dur"][net], r.slack[net]))][:k]
        return [
            CommSlack(
                node=int(i),
                name=g.node_name(i),
                rank=int(n["rank"][i]),
                slack_us=float(r.slack[i]),
                dur_us=float(n["dur"][i]),
                wait_us=float(n["mstart"][i] - n["start"][i]),
                msg_bytes=None if np.isnan(n["msg_bytes"][i]) else float(n["msg_bytes"][i]),
                critical=bool(r.critical[i]),
            )
            for i in order
        ]

    def ranks(self) -> list[RankRow]:
        """Per-rank step span, time spent waiting in collectives, share of the critical path."""
        g, r = self.graph, self.cpm
        n = g.nodes
        t = self.critical_time(with_gaps=True)
        wait = n["mstart"] - n["start"]
        predicted = self.rank_step_times()
        ranks = np.asarray(g.ranks, dtype=np.int64)
        pos, on = _rank_positions(ranks, n["rank"])  # sums by bincount, not a scan per rank
        net = on & (n["node_type"] == NodeType.NETWORK)
        waits = np.bincount(pos[net], weights=wait[net], minlength=len(ranks))
        crit = np.bincount(pos[on], weights=t[on], minlength=len(ranks))
        return [
            RankRow(
                rank=rk,
                step_us=float(g.measured[rk]),
                predicted_step_us=predicted[rk],
                collective_wait_us=float(waits[i]),
                critical_us=float(crit[i]),
                critical_share=float(crit[i] / (r.makespan or 1.0)),
            )
            for i, rk in enumerate(g.ranks)
        ]

    def straggler(self) -> StepStraggler | None:
        """The rank the others waited for at the collectives on the critical path: at each such
        barrier, the last participant to arrive imposed the others' waits; reported with the
        longest wait it imposed at any collective of the step (µs: a DDP job's first gradient
        bucket waits for the late rank, and the path may leave through a later bucket, whose wait
        the first one's absorbed). None if no collective on the critical path made a rank wait."""
        g, r = self.graph, self.cpm
        n, e = g.nodes, g.edges
        on_path = r.path[n["category"][r.path] == Category.BARRIER]
        # and the collectives whose last arrival's own op is on it: the path ran through that rank's
        # work into the collective, the barrier beside it (a tie), while the others waited there
        member = (e["kind"] == EdgeKind.COLLECTIVE_SYNC) & isin_sorted(e["dst"], np.sort(r.path))
        on_path = np.union1d(on_path, e["src"][member])
        imposed = self._imposed(on_path)
        if not imposed or max(imposed.values()) <= 0:
            return self._late_and_critical()
        rank = max(imposed, key=lambda r: imposed[r])
        if not (np.isin(e["src"], on_path) & (e["kind"] == EdgeKind.COLLECTIVE_SYNC)).any():
            # a pipeline's transfers alone: of the ranks that made the others wait there, the busiest,
            # where it kept busier than the others (PIPELINE_BUSY_EXCESS); waits its schedule holds by design are no one's
            busy = self.busy_by_rank()
            late = [k for k, v in imposed.items() if v > 0 and k in busy]
            if not late:
                return None
            rank = max(late, key=lambda k: busy[k])
            others = [v for k, v in busy.items() if k != rank]
            typical = float(np.median(others)) if others else 0.0
            if others and busy[rank] < max(typical * (1 + PIPELINE_BUSY_EXCESS), typical + PIPELINE_BUSY_MIN_US):
                return None
        every = self._imposed(np.flatnonzero(n["category"] == Category.BARRIER))
        return StepStraggler(rank=rank, imposed_wait_us=max(imposed[rank], every.get(rank, 0.0)))

    def _late_and_critical(self) -> StepStraggler | None:
        """Where no collective on the critical path made a rank wait: the rank that arrived last at
        a collective of the step where the others waited (COLLECTIVE_SYNC: not a pipeline's
        transfers, whose waits its schedule holds), where the critical path runs on that rank for
        LATE_RANK_PATH_SHARE of its time or more. A data-parallel rank slowed before its all-reduce
        takes the path through its own work to the step's end: the others' wait at the all-reduce
        is then no barrier on the path, but that rank is what they waited for (it had read as no
        straggler in 15 of 20 steps of a job whose rank 1 ran 1-27 ms of extra matmuls a step). Not
        where a rank's trace is sampled or ranks of the job are not in the input: which of the ranks
        here came last then says little of who held the collective up."""
        g = self.graph
        n, e = g.nodes, g.edges
        run = g.meta.get("run_facts") or {}
        if g.info.sampled or int(run.get("missing_ranks") or 0):  # (who came last among the ranks here says little)
            return None
        sym = np.unique(e["src"][(e["kind"] == EdgeKind.COLLECTIVE_SYNC) & (n["category"][e["src"]] == Category.BARRIER)])
        every = self._imposed(sym)
        late = {k: v for k, v in every.items() if v > 0}
        if not late:
            return None
        t = self.critical_time()
        on = n["rank"] >= 0
        total = float(t[on].sum())
        rank = max(late, key=lambda k: late[k])
        if total <= 0 or float(t[on & (n["rank"] == rank)].sum()) < LATE_RANK_PATH_SHARE * total:
            return None
        return StepStraggler(rank=rank, imposed_wait_us=late[rank])

    def busy_by_rank(self) -> dict[int, float]:
        """Per rank, how long it kept busy in the step (µs): from its step start to the end of its
        last op that is work (not a transfer, a collective or a call blocking on the device: a
        stage's tail of sends and its host's final synchronize are no work), less the time in
        that stretch its communication ops waited for their peers while none of its work ran (a
        receive posted ahead waits while its thread computes)."""
        g, r = self.graph, self.cpm
        n = g.nodes
        ranks = np.asarray(g.ranks, dtype=np.int64)
        pos, on = _rank_positions(ranks, n["rank"])
        work = on & np.isin(n["category"], (Category.CPU_OP, Category.RUNTIME, Category.KERNEL, Category.MEMCPY, Category.MEMSET))
        work &= n["event"] >= 0  # (not the step-end markers)
        if not work.any():
            return {}
        last = np.full(len(ranks), -np.inf)
        np.maximum.at(last, pos[work], r.eft[work])
        net = on & (n["node_type"] == NodeType.NETWORK) & (n["mstart"] > n["start"])
        # one sweep over every rank's intervals, each rank's moved into a band of its own: the time
        # in which some wait of the rank is open and none of its work is
        lo_w, hi_w = n["start"][net], np.minimum(n["mstart"][net], last[pos[net]])
        keep = hi_w > lo_w
        lo_k, hi_k = n["start"][work], n["start"][work] + n["dur"][work]
        band = float(max(np.nanmax(np.abs(n["start"][on])) if on.any() else 0.0, np.nanmax(np.abs(r.eft[on])))) * 2 + 1.0
        off_w, off_k = (pos[net][keep] + 0.5) * band, (pos[work] + 0.5) * band  # (times within ±band/2 of a band's middle)
        at = np.concatenate([lo_w[keep] + off_w, hi_w[keep] + off_w, lo_k + off_k, hi_k + off_k])
        d_wait = np.concatenate([np.ones(int(keep.sum())), -np.ones(int(keep.sum())), np.zeros(2 * len(lo_k))])
        d_work = np.concatenate([np.zeros(2 * int(keep.sum())), np.ones(len(lo_k)), -np.ones(len(lo_k))])
        order = np.argsort(at, kind="stable")
        at, d_wait, d_work = at[order], d_wait[order], d_work[order]
        open_wait, open_work = np.cumsum(d_wait)[:-1], np.cumsum(d_work)[:-1]
        length = np.diff(at)
        idle = (open_wait > 0.5) & (open_work < 0.5) & (length > 0)
        waited = np.bincount(np.floor(at[:-1][idle] / band).astype(np.int64), weights=length[idle], minlength=len(ranks))
        has = np.isfinite(last)
        return {int(rk): float(last[i] - g.rank_start(int(rk)) - waited[i]) for i, rk in enumerate(ranks.tolist()) if has[i]}

    def _imposed(self, barriers: np.ndarray) -> dict[int, float]:
        """Per rank, the longest wait it imposed on the others as the last to arrive at one of
        ``barriers`` (µs; waits at collectives on different threads overlap in time)."""
        g, r = self.graph, self.cpm
        n, e = g.nodes, g.edges
        barriers = barriers[r.pred[barriers] >= 0]
        if not len(barriers):
            return {}
        culprit = np.full(g.n_nodes, -1, dtype=np.int64)
        culprit[barriers] = n["rank"][e["src"][r.pred[barriers]]]
        out = np.flatnonzero((culprit[e["src"]] >= 0) & (e["kind"] != EdgeKind.FEEDS))  # barrier -> its members
        who = culprit[e["src"][out]]
        member = e["dst"][out]
        other = n["rank"][member] != who
        waited = (n["mstart"] - n["start"])[member[other]]
        imposed: dict[int, float] = {}
        for rank_, w_ in zip(who[other].tolist(), waited.tolist()):
            imposed[rank_] = max(imposed.get(rank_, 0.0), float(w_))
        for rank_ in np.unique(culprit[barriers]).tolist():
            imposed.setdefault(int(rank_), 0.0)
        return imposed

    def longest_segments(self, k: int) -> list[Segment]:
        """The ``k`` longest segments of the critical path (the earlier of equal ones), in time order."""
        segs = self.segments()
        return [segs[i] for i in sorted(sorted(range(len(segs)), key=lambda i: -segs[i].dur)[:k])]

    def report(self, top: int = 20, full_path: bool = True) -> StepReport:
        """The step as ``analyze --json`` writes it, with ``top`` ops by critical-path time; with
        ``full_path`` the critical path segment by segment, else its ``top`` longest segments."""
        g, r = self.graph, self.cpm
        step_time = self.step_time
        reference = self.period or self.measured
        info = g.info
        return StepReport(
            step=g.step,
            ranks=g.ranks,
            measured_us=self.measured,
            period_us=self.period,
            step_time_us=step_time,
            step_time_error=(step_time - reference) / reference if reference else 0.0,
            makespan_us=r.makespan,
            window_us=r.window,
            counts=g.summary_counts(),
            breakdown_us=self.breakdown(),
            top_ops=self.top_ops(top),
            lowest_slack_comm=self.lowest_slack_comm(),
            per_rank=self.ranks(),
            straggler=self.straggler(),
            critical_path_nodes=len(r.path),
            untraced_us=self.untraced_us,
            gpu_queue=self.gpu_queue(),
            dropped_edges=info.dropped_edges,
            collective_matching=info.collectives,
            warnings=self.warnings(),
            checks=self.checks(),
            facts=info.facts_json,
            bystanders=self.bystanders(),
            critical_path=self.critical_path() if full_path else None,
            critical_path_top=None if full_path else self.critical_path(self.longest_segments(top)),
            kernel_families=KernelFamilies(scope=scope(g)[0], families=self.kernel_families()),
            overlap=self.overlap(),
        )

    def to_dict(self, top: int = 20, full_path: bool = True) -> JSONObject:
        """``serial.to_json(self.report(top, full_path))``: the step as ``analyze --json`` prints it."""
        return to_json_object(self.report(top, full_path))

    def kernel_families(self) -> list[FamilyTime]:
        """Time per kernel family (per op family in a trace without GPU work): analysis.kernels."""
        return families(self.graph, self.critical_time())

    def overlap(self) -> list[Overlap]:
        """Per rank, its communication time and how much of it compute hides: analysis.kernels."""
        return overlap(self.graph)

    @property
    def period(self) -> float | None:
        """The step's period as the trace shows it (µs, graph_pipeline.facts): from the end of the
        device work queued before the step to the end of the step's own work, on the rank where it
        is longest; the ProfilerStep span on a step whose device queued nothing ahead. None
        without facts (Chakra input)."""
        facts = self.graph.info.facts
        return facts.period_us if facts is not None else None

    def checks(self) -> list[Check]:
        """The self-check (analysis.checks): each invariant between this analysis and the facts
        read from the step's raw events, computed once."""
        if self._checks is None:
            self._checks = step_checks(self)
        return self._checks

    def bystanders(self) -> list[Bystander]:
        """Host threads left out of the step: no dependency into its work (graph_pipeline.builder)."""
        return self.graph.info.bystanders

    def queue_warning(self) -> str | None:
        """One line when the device ran the work of earlier steps while this step's host ran: what
        the step time then is (its period), and how far ahead the host was."""
        q = self.gpu_queue()
        if not q or not q.deeper_than_step:
            return None
        worst = max(q.ranks, key=lambda x: x.lag_us)
        step = self.graph.step if self.graph.step is not None else "(whole trace)"
        waited = worst.host_queue_wait_us
        return (
            f"step {step}: the device of rank {worst.rank} runs {worst.lag_us / 1000:.1f} ms behind its host (median launch to "
            f"start), more than its host's {self.graph.measured.get(worst.rank, 0.0) / 1000:.1f} ms step: the step is device-bound; "
            f"its step time is its period on the device ({(self.period or self.step_time) / 1000:.1f} ms), not the host's span"
            + (
                f"; its host waited {waited / 1000:.1f} ms of the step for room in the device's full launch queue (paced by the "
                "device, not by its own work)"
                if waited >= 0.05 * self.step_time
                else ""
            )
        )

    def warnings(self) -> list[str]:
        """Every warning of this step, each one line: untraced time, a device-bound step, host
        threads left out, and each self-check that failed (a contradiction with the raw facts)."""
        step = self.graph.step if self.graph.step is not None else "(whole trace)"
        out = [w for w in (self.untraced_warning(), self.queue_warning()) if w]
        groups: dict[tuple[int, bool], list[Bystander]] = {}
        for b in self.bystanders():
            groups.setdefault((b.rank, b.polls), []).append(b)
        for (rank, polls), bs in groups.items():
            poll_note = "; it only polls the device: a monitor such as the NCCL watchdog" if polls else ""
            if len(bs) <= BYSTANDERS_SAID_EACH:
                for b in bs:
                    out.append(
                        f"step {step}: rank {rank} {b.thread} has no dependency into the step's work ({b.ops} ops, e.g. "
                        f"{b.longest_op[:60]}{poll_note}); left out of the critical path"
                    )
                continue
            top = max(bs, key=lambda b: b.ops)
            shown = ", ".join(b.thread for b in bs[:BYSTANDERS_SAID_EACH])
            out.append(
                f"step {step}: rank {rank}: {len(bs)} threads have no dependency into the step's work ({shown} and "
                f"{len(bs) - BYSTANDERS_SAID_EACH} more; {sum(b.ops for b in bs)} ops, e.g. {top.longest_op[:60]}"
                f"{poll_note.replace('it only polls', 'they only poll')}); left out of the critical path"
            )
        cycles = {k.removesuffix("_in_a_cycle"): v for k, v in self.graph.info.dropped_edges.items() if k.endswith("_in_a_cycle")}
        if cycles:
            what = ", ".join(
                f"{v} {_EDGE_WORDS.get(k, k.replace('_', ' ') + ' edge')}{'s' if v > 1 else ''}" for k, v in sorted(cycles.items())
            )
            out.append(
                f"step {step}: {sum(cycles.values())} dependency edge{'s' if sum(cycles.values()) > 1 else ''} closed a cycle "
                f"where the trace's times tie ({what}): the least certain edge of each was given up"
            )
        m = self.graph.info.collectives
        if m.get("aligned"):
            out.append(
                f"step {step}: {m['aligned']} collective{'s' if m['aligned'] > 1 else ''} or send{'s' if m['aligned'] > 1 else ''} "
                "that some ranks' traces lack (events sampled, a trace trimmed or cut, or a collective its process issued "
                "from a thread the profiler did not record, as a DDP comm hook's callback can be?): each process group's sequences were "
                "aligned by kind and size so that the others still pair with their own"
            )
        if m.get("in_a_cycle"):
            out.append(
                f"step {step}: {m['in_a_cycle']} collective instance{'s' if m['in_a_cycle'] > 1 else ''} matched across ranks "
                "by order crossed another (each waiting for the other: a rank's trace lacks a collective or a send that order "
                "alone cannot place); left unmatched, their ops as seen on one rank"
            )
        facts = self.graph.info.facts
        for f in facts.ranks if facts is not None else ():
            if f.queued_before_trace_us > 0:
                out.append(
                    f"step {step}: rank {f.rank}'s device started the step's first op {f.queued_before_trace_us / 1000:,.1f} ms after "
                    "its launch, with no earlier device work in the trace, and ran busy from then: work queued before the trace "
                    "began held it (a trace split or trimmed here?); the step is measured from that op's start, its period"
                )
            elif f.first_op_held_us > 0:
                out.append(
                    f"step {step}: rank {f.rank}'s device started the step's first op {f.first_op_held_us / 1000:,.1f} ms after its "
                    f"launch, with no earlier device work in the trace; its host ran {(f.cpu_end - f.cpu_start) / 1000:,.1f} ms in the "
                    "step, far longer than the step measured from that op would be, so no work this loop queued before the trace "
                    "held it (events left out of the trace? another process on the device?): read as an untraced wait on the device"
                )
        if self.adds_nothing():
            out.append(
                f"step {step}: its host ended before the device work queued in earlier steps did, and it launched no device work "
                "that ran later: it adds nothing to the loop's time (its time here is its host's span); left out of the run's figures"
            )
        cut = self.cut_by_trace_end()
        if cut:
            out.append(
                f"step {step}: the trace ends inside this step ({'; '.join(cut)}): its time and breakdown are of the part the "
                "trace holds (a trace cut at a time, or a profiler stopped with work still queued); left out of the run's figures"
            )
        for c in self.checks():
            if not c.ok:
                out.append(f"step {step}: self-check '{c.name}' does not hold: {c.detail}; this step's picture may be wrong")
        return out

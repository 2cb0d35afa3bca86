"""The Python API the CLI is a thin layer over.

Every function takes a trace path (a Kineto/Chrome trace file, a folder of per-rank traces, or
Chakra ET files) and returns typed results whose ``serial.to_json`` is the matching command's
``--json``. Times are microseconds (µs) throughout. Bad input raises
``bottleneck_oracle.errors.OracleError`` naming the file; partial input warns with
``OracleWarning``.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from bottleneck_oracle.analysis.checks import run_warnings
from bottleneck_oracle.analysis.results import (
    BlameModel,
    Corrected,
    ModelAnswer,
    NodeRef,
    PathChange,
    Replay,
    Resplit,
    SteadyReplay,
    StepAdvice,
    StepBlame,
    StepWhatIf,
)
from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.analysis.whatif import EditedTimes
from bottleneck_oracle.config import Config
from bottleneck_oracle.errors import OracleWarning
from bottleneck_oracle.graph_pipeline import chakra, clocks
from bottleneck_oracle.graph_pipeline import groups as process_groups
from bottleneck_oracle.graph_pipeline.builder import BuildOptions, build_graphs, iter_graphs
from bottleneck_oracle.graph_pipeline.engine import Engine, LocalEngine, make_engine
from bottleneck_oracle.graph_pipeline.et import attach, load_execution_traces
from bottleneck_oracle.graph_pipeline.events import EventTable, load_events
from bottleneck_oracle.graph_pipeline.facts import LAUNCH_TOLERANCE_US, align_cut_steps, run_facts
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph

if TYPE_CHECKING:
    import numpy as np

    from bottleneck_oracle.analysis.answer import StepWindows
    from bottleneck_oracle.analysis.blame import KeyMemo
    from bottleneck_oracle.analysis.change import Comparison
    from bottleneck_oracle.analysis.cpm import CPMResult
    from bottleneck_oracle.analysis.runs import RunSummary
    from bottleneck_oracle.llm.client import ChatClient
    from bottleneck_oracle.models.corrections import Corrections, GraphCorrections
    from bottleneck_oracle.models.predict import Predictor

ExecutorSpec = str | Executor | Engine | Any | None
"""Where parsing and graph building run: see ``build``."""
T = TypeVar("T")


def _predictor(checkpoint: str | Path | None) -> Predictor:
    """The graph network (models.predict.Predictor). It runs in numpy from the checkpoint's .npz;
    a .pt without one needs torch, and says so when it is not installed."""
    from bottleneck_oracle.models.predict import Predictor

    return Predictor(checkpoint)


def load(
    path: str | Path, et: str | Path | None = None, ranks_per_host: int = 0, executor: ExecutorSpec = None, steps_at: str = ""
) -> EventTable:
    """Events of a Kineto trace file or a folder of per-rank trace files.

    Args:
        path: a trace file (``.json``, ``.json.gz``) or a folder of per-rank traces.
        et: the run's PyTorch execution trace(s), one file or a folder with one per rank: adds
            tensor data dependencies.
        ranks_per_host: ranks per host (0..N-1 on the first); > 0 aligns each host's clock to the
            first's from the collectives they ran together (graph_pipeline.clocks); 0: one clock.
        executor: where the files are parsed (see ``build``).
        steps_at: a shell-style pattern of host op names (``"execute_*"``): each op it names starts
            a step, in place of the ProfilerStep markers; "": the markers (where a trace has none,
            its optimizer's steps).

    Returns:
        The columnar event table of all ranks (timestamps in µs); ``table.clocks`` says what the
        clock alignment moved.
    """
    with _engine(executor) as eng:
        table = load_events(path, engine=eng, steps_at=steps_at)
    hosts = clocks.hosts_by_block(table.ranks, ranks_per_host) if ranks_per_host > 0 else None
    report = clocks.align(table, hosts)
    table.clocks = report if hosts is not None or report.warnings else None
    for line in report.warnings:
        warnings.warn(f"{path}: {line}", OracleWarning, stacklevel=2)
    # a device op's impossible end is cut first: the clock checks read the ends of the ops blocking calls waited for
    for line in clocks.overflowing_device_ops(table):
        warnings.warn(f"{path}: {line}", OracleWarning, stacklevel=2)
    for line in clocks.device_behind(table, LAUNCH_TOLERANCE_US):  # (moves device events: drops the look-ups by time)
        warnings.warn(f"{path}: {line}", OracleWarning, stacklevel=2)
    for line in clocks.outlasting_waited_ops(table, LAUNCH_TOLERANCE_US):
        warnings.warn(f"{path}: {line}", OracleWarning, stacklevel=2)
    for line in clocks.device_ahead(table, LAUNCH_TOLERANCE_US):
        warnings.warn(f"{path}: {line}", OracleWarning, stacklevel=2)
    process_groups.resolve_peers(table)  # (before the collectives: their groups are placed from the peers' pairing too)
    process_groups.nested_peers(table)  # (an NCCL send's record_param_comms: its enclosing call's peer, resolved)
    for line in process_groups.assign(table).warnings:  # (after the clocks: it compares ranks' times)
        warnings.warn(f"{path}: {line}", OracleWarning, stacklevel=2)
    for line in align_cut_steps(table):
        warnings.warn(f"{path}: {line}", OracleWarning, stacklevel=2)
    for line in run_warnings(run_facts(table)):  # a partial job, sampled events: said once, up front
        warnings.warn(f"{path}: {line}", OracleWarning, stacklevel=2)
    if et is not None:
        attach(table, load_execution_traces(et, table))
    return table


@contextmanager
def _engine(executor: ExecutorSpec) -> Iterator[Engine | None]:
    """The engine of ``executor``; one this call created is shut down after it."""
    if executor is None:
        yield None
        return
    eng = make_engine(executor)
    try:
        yield eng
    finally:
        if eng is not executor:
            eng.close()


def graphs(
    table: EventTable, steps: list[int] | None = None, config: Config | None = None, executor: ExecutorSpec = None
) -> list[ExecutionGraph]:
    """The graphs of an event table.

    Args:
        table: events from ``load``.
        steps: the ProfilerStep numbers to build; None: every step.
        config: thresholds of the edge rules (``Config().graph``); None: the defaults.
        executor: where the per-step graph building runs (see ``build``).

    Returns:
        One ExecutionGraph per ProfilerStep (all ranks merged), or one for the whole trace when it
        has no step markers.
    """
    with _engine(executor) as eng:
        return build_graphs(table, steps, _options(config), eng)


def two_step_graphs(table: EventTable | None, config: Config | None = None) -> StepWindows | None:
    """For the run answer's steady-state figures: (step number, span: 2 by default) -> the graph of
    that step and the ``span - 1`` after it (``build_graph(..., span)``), None where the trace has
    not those steps; None for Chakra input."""
    if table is None:
        return None
    from bottleneck_oracle.graph_pipeline.builder import build_graph

    present = {s.number for s in table.steps}
    opt = _options(config)
    kept: dict[tuple[int, int], ExecutionGraph] = {}  # the last few windows (a steady-state replay reads each several times)

    def two(step: int | None, span: int = 2) -> ExecutionGraph | None:
        if step is None or any(step + k not in present for k in range(span)):
            return None
        if (step, span) not in kept:
            if len(kept) >= 4:
                del kept[next(iter(kept))]
            kept[step, span] = build_graph(table, step, opt, span=span)
        return kept[step, span]

    return two


MULTI_STEP_EVENTS = 1_000_000
"""Events a step: beyond, graphs of several steps are not built (too large to hold): the run
answer's saving and a what-if are replayed in the step's own window."""


def steady_windows(table: EventTable | None, config: Config | None = None) -> StepWindows | None:
    """``two_step_graphs`` for a steady-state what-if (analysis.whatif.steady_replay), None where a
    step has more than MULTI_STEP_EVENTS events (or for Chakra input)."""
    if table is None or len(table) / max(1, len({s.number for s in table.steps})) > MULTI_STEP_EVENTS:
        return None
    return two_step_graphs(table, config)


def _options(config: Config | None) -> BuildOptions:
    gc = (config or Config()).graph
    return BuildOptions(
        feeds_resume_us=gc.feeds_resume_us,
        idle_gap_us=gc.idle_gap_us,
        stream_wait_us=gc.stream_wait_us,
        clock_tolerance_us=gc.clock_tolerance_us,
    )


def build(
    path: str | Path,
    steps: list[int] | None = None,
    config: Config | None = None,
    et: str | Path | None = None,
    executor: ExecutorSpec = None,
) -> tuple[EventTable | None, list[ExecutionGraph]]:
    """The graphs of any supported input.

    Args:
        path: a trace file, a folder of per-rank traces, or Chakra ET files (``.et``).
        steps: the ProfilerStep numbers to build; None: every step.
        config: the configuration (graph thresholds, ``graph.ranks_per_host``); None: defaults.
        et: the run's PyTorch execution trace(s) (see ``load``).
        executor: where the per-rank parsing and the per-step graph building run: None or
            ``"local"`` (this machine's processes), ``"dask"`` (a Dask LocalCluster),
            ``"dask://HOST:PORT"`` (a running Dask scheduler), a ``distributed.Client``, or any
            ``concurrent.futures.Executor``. The answers are the same on every one
            (graph_pipeline.engine).

    Returns:
        ``(table, graphs)``: the event table and one ExecutionGraph per step. Chakra ET input has
        no steps and no event table: one graph for the whole trace, and None for the table.
    """
    table, gs = _graph_stream(path, steps, config, et, executor)
    return table, list(gs)


def _graph_stream(
    path: str | Path, steps: list[int] | None, config: Config | None, et: str | Path | None, executor: ExecutorSpec
) -> tuple[EventTable | None, Iterator[ExecutionGraph]]:
    """``build``'s graphs one at a time. The input is read and the steps checked here (bad input
    raises before the first graph); the engine is shut down when the iterator ends."""
    if chakra.is_chakra(path):
        return None, iter([chakra.chakra_graph(path)])
    stack = ExitStack()
    try:
        eng = stack.enter_context(_engine(executor))
        table = load(path, et, (config or Config()).graph.ranks_per_host, eng, (config or Config()).graph.steps_at)
        graphs_of = iter_graphs(table, steps, _options(config), eng)
    except BaseException:
        stack.close()
        raise

    def run() -> Iterator[ExecutionGraph]:
        with stack:
            try:
                yield from graphs_of
            finally:
                table.drop_caches()

    return table, run()


def analyze(
    path: str | Path,
    steps: list[int] | None = None,
    config: Config | None = None,
    et: str | Path | None = None,
    executor: ExecutorSpec = None,
) -> tuple[EventTable | None, list[StepAnalysis]]:
    """Build and run the critical path method on every selected step.

    Args:
        path: a trace file, a folder of per-rank traces, or Chakra ET files.
        steps: the ProfilerStep numbers to analyse; None: every step.
        config: the configuration (graph thresholds, ``analysis.untraced_gap_us``); None: defaults.
        et: the run's PyTorch execution trace(s) (see ``load``).
        executor: where parsing and graph building run (see ``build``).

    Returns:
        ``(table, analyses)``: the event table (None for Chakra input) and one StepAnalysis per
        step: measured and CPM step time (µs), slack, critical path, breakdown, straggler.
    """
    table, stream = analyze_stream(path, steps, config, et, executor)
    return table, list(stream)


def analyze_stream(
    path: str | Path,
    steps: list[int] | None = None,
    config: Config | None = None,
    et: str | Path | None = None,
    executor: ExecutorSpec = None,
) -> tuple[EventTable | None, Iterator[StepAnalysis]]:
    """``analyze``, one step at a time.

    Each step's graph is built and analysed when the iterator reaches it, so a run of thousands
    of steps never holds every graph at once. Bad input (a missing step, traces of different
    runs) raises here, before the first step.

    Args:
        path: a trace file, a folder of per-rank traces, or Chakra ET files.
        steps: the ProfilerStep numbers to analyse; None: every step.
        config: the configuration; None: defaults.
        et: the run's PyTorch execution trace(s) (see ``load``).
        executor: where parsing and graph building run (see ``build``).

    Returns:
        ``(table, iterator)``: the event table (None for Chakra input) and an iterator of
        StepAnalysis, one per step, in step order.
    """
    gap = (config or Config()).analysis.untraced_gap_us
    table, gs = _graph_stream(path, steps, config, et, executor)
    return table, (StepAnalysis.of(g, gap) for g in gs)


def analyze_map(
    path: str | Path,
    fn: Callable[[StepAnalysis], T],
    steps: list[int] | None = None,
    config: Config | None = None,
    et: str | Path | None = None,
    executor: ExecutorSpec = None,
    keep: frozenset[int | None] | Callable[[list[int | None], EventTable | None], frozenset[int | None]] = frozenset(),
) -> tuple[EventTable | None, Iterator[tuple[T, StepAnalysis | None]]]:
    """``analyze``, keeping only ``fn(analysis)`` of each step, computed where the step is built
    (analysis.stepwise: forked workers or the executor's; the graphs stay there).

    Args:
        path: a trace file, a folder of per-rank traces, or Chakra ET files (as for ``analyze``).
        fn: what to keep of each step (a module-level function or a ``functools.partial`` of one).
        steps: the ProfilerStep numbers to analyse; None: every step.
        config: the configuration; None: defaults.
        et: the run's PyTorch execution trace(s) (see ``load``).
        executor: where parsing and graph building run (see ``build``).
        keep: the steps whose StepAnalysis comes back whole too, or a function of the step numbers
            to be analysed (None: the whole trace) and the event table that gives them.

    Returns:
        ``(table, iterator)``: the event table (None for Chakra input) and, per step in step order,
        ``(fn's result, the StepAnalysis if the step is in keep else None)``. Bad input raises
        here, before the first step.
    """
    from bottleneck_oracle.analysis.stepwise import map_steps

    gap = (config or Config()).analysis.untraced_gap_us
    if chakra.is_chakra(path):
        a = StepAnalysis.of(chakra.chakra_graph(path), gap)
        kept = keep([None], None) if callable(keep) else keep
        return None, iter([(fn(a), a if a.graph.step in kept else None)])
    stack = ExitStack()
    try:
        eng = stack.enter_context(_engine(executor))
        table = load(path, et, (config or Config()).graph.ranks_per_host, eng, (config or Config()).graph.steps_at)
        results = map_steps(table, fn, steps, _options(config), gap, eng, keep)
    except BaseException:
        stack.close()
        raise

    def run() -> Iterator[tuple[T, StepAnalysis | None]]:
        with stack:
            try:
                yield from results
            finally:
                table.drop_caches()

    return table, run()


def step_analysis(table: EventTable, step: int | None, config: Config | None = None) -> StepAnalysis:
    """The StepAnalysis of one step of a loaded table (``step`` None: the whole trace), built here."""
    from bottleneck_oracle.graph_pipeline.builder import build_graph

    return StepAnalysis.of(build_graph(table, step, _options(config)), (config or Config()).analysis.untraced_gap_us)


def _corrections() -> Corrections | GraphCorrections | None:
    """The bundled per-node corrections to the replay (models.corrections), if the package has them."""
    from bottleneck_oracle.models.corrections import load_corrections, pretrained_corrections

    return load_corrections() if pretrained_corrections().is_file() else None


def whatif(
    path: str | Path,
    edits: list[str],
    steps: list[int] | None = None,
    config: Config | None = None,
    checkpoint: str | Path | None = None,
    use_model: bool = False,
    microbatches: int | None = None,
    batch: float | None = None,
    knobs: list[str] | None = None,
) -> list[StepWhatIf]:
    """The step time after changing op durations or the job's configuration: exact replay,
    corrected replay and graph network.

    Args:
        path: a Kineto trace file or a folder of per-rank traces.
        edits: edits in the ``whatif --edit`` syntax (``analysis.whatif.Edit.parse``), e.g.
            ``"name~=all_reduce,rank=1,scale=0.5"``; several apply together.
        steps: the ProfilerStep numbers to predict; None: every step.
        config: the configuration; None: defaults.
        checkpoint: the graph network, a ``.pt`` or its ``.npz``; None: the shipped pretrained one.
        use_model: True: also the corrected replay and the graph network's prediction. Off by default:
            on 112 held-out slowdowns the corrected replay did not beat the replay times a
            constant (benchmarks/model_earned.py).
        microbatches: a pipeline step re-split into this many micro-batches at the same global
            batch (the same as the knob ``microbatches=N``).
        batch: the batch scaled by this ratio (the same as the knob ``batch=xR``).
        knobs: configuration changes in the ``whatif --set`` syntax (``analysis.knobs.Knob.parse``),
            e.g. ``"batch=4:8"``, ``"bucket_mb=25:1"``, ``"checkpoint=on"``, ``"microbatches=8"``;
            applied after the edits, in order.

    Returns:
        One StepWhatIf per step: the measured step, the replay's edited step time and change
        (µs), the corrected replay with its 90% interval, each graph-network variant's answer,
        and the ops that joined and left the critical path.

    Raises:
        OracleError: no edit, ``microbatches`` or ``batch`` given; an edit that selects nothing in any step; a
            re-split of a step that is not a pipeline step.
    """
    import numpy as np

    from bottleneck_oracle.analysis.cpm import run_cpm
    from bottleneck_oracle.analysis.knobs import Knob, has_passes, knob_times, microbatch_parts, pieces
    from bottleneck_oracle.analysis.knobs import interval as knob_interval
    from bottleneck_oracle.analysis.phases import node_phases
    from bottleneck_oracle.analysis.whatif import (
        MAX_SCALE,
        Edit,
        apply_edits,
        own_time_edits,
        selects_anything,
        steady_replay,
        why_nothing,
    )
    from bottleneck_oracle.errors import OracleError

    parsed = [Edit.parse(e) for e in edits]
    settings = [Knob.parse(k) for k in knobs or []]
    if batch is not None:
        if not 0 < batch <= MAX_SCALE:
            raise OracleError(f"--batch must be a ratio > 0 and at most {MAX_SCALE:g} (found {batch})")
        settings.append(Knob("batch", float(batch), 1.0, relative=True))
    if microbatches is not None:
        settings.append(Knob("microbatches", float(microbatches)))
    resplits = [k for k in settings if k.name == "microbatches"]
    if len(resplits) > 1:
        raise OracleError("whatif: one micro-batch count at a time")
    if not parsed and not settings:
        raise OracleError("whatif needs an --edit or a --set")
    table, gs = build(path, steps, config)
    phase_mbs = [node_phases(table, g) if table is not None else None for g in gs]
    phase_of = [pm[0] if pm is not None else None for pm in phase_mbs]
    for e, text in zip(parsed, edits):  # every edit must select something, alone or combined
        empty = [g.step for g, p in zip(gs, phase_of) if not selects_anything(g, e, p, table)]
        if len(empty) == len(gs):
            raise OracleError(f"{path}: edit {text!r} selects nothing: {why_nothing(gs, e, phase_of, table)}")
        if empty:
            shown = ", ".join(str(s) for s in empty[:10]) + (", ..." if len(empty) > 10 else "")
            warnings.warn(
                f"{path}: edit {text!r} selects nothing in step(s) {shown}: they are predicted without it", OracleWarning, stacklevel=2
            )
    predictor = corrections = None
    if use_model:
        predictor = _predictor(checkpoint)
        corrections = _corrections()
    out: list[StepWhatIf] = []
    windows = steady_windows(table, config)
    no_passes: list[int | None] = []
    if settings and any(pm is None for pm in phase_mbs):
        raise OracleError(f"{path}: --set needs the trace's forward/backward ranges (a training step's phases), and this input has none")
    for g, phase_mb, phases in zip(gs, phase_mbs, phase_of):
        times = apply_edits(g, parsed, phases, table)
        owned, own_eids = own_time_edits(g, parsed, phases, table)
        split = pieces(g, *phase_mb) if settings and phase_mb is not None else None
        if split is not None and not has_passes(split.node_phase) and g.step not in no_passes:
            no_passes.append(g.step)
        for k in settings:
            if k.name != "microbatches" and split is not None:
                try:
                    times = knob_times(g, split, k, times)
                except OracleError as exc:
                    raise OracleError(f"{path}: step {g.step}: {exc}") from None
        base = run_cpm(g)
        measured = g.span()
        step_us = base.makespan  # the step's time as analyze gives it (its period: the span of a CPU-bound step)
        delta = times.delta()
        model: ModelAnswer | None = None
        if predictor is not None:
            from bottleneck_oracle.models.predict import sample_for

            data, edited = sample_for(g, times, table, base, phase_mb)
            model = predictor.effect(g, sample_for(g, None, table, base, phase_mb)[0], data)
        else:
            edited = times.cpm()
        replay = Replay(step_us=edited.makespan, delta_us=edited.makespan - base.makespan)
        steady: SteadyReplay | None = None
        path_of = (g, base, edited, times.dur)  # whose critical paths the answer compares
        found = steady_replay(windows, g, parsed, table) if not settings and predictor is None else None
        if found is not None:
            steady = SteadyReplay(first=found.first, steps=found.steps, one_step_us=replay.step_us)
            replay = Replay(step_us=step_us + found.edited_us - found.period_us, delta_us=found.edited_us - found.period_us)
            path_of = (found.graph, found.base, found.edited, found.dur)
        corrected = None
        if corrections is not None:
            fixed = corrections.answer(times, base)
            corrected = Corrected(
                step_us=None if fixed.saving_us is None else step_us - fixed.saving_us,
                delta_us=None if fixed.saving_us is None else -fixed.saving_us,
                interval_us=None if fixed.interval_us is None else (-fixed.interval_us[1], -fixed.interval_us[0]),
                out_of_domain=fixed.out_of_domain,
                trained_on=corrections.trained_on,
            )
        resplit = None
        if resplits:
            from bottleneck_oracle.analysis.phases import is_pipeline

            if split is None or not is_pipeline(g, table):
                raise OracleError(f"{path}: step {g.step} is not a pipeline-parallel step (no per-micro-batch phases and send/recv)")
            parts = microbatch_parts(g, split, times.dur)
            want = resplits[0]
            if want.old is not None and not want.relative and int(want.old) != parts.microbatches:
                raise OracleError(f"{path}: step {g.step} has {parts.microbatches} micro-batches, not {want.old:g}")
            new = max(1, round(parts.microbatches * want.new)) if want.relative else int(want.new)
            now, then = parts.step(parts.microbatches), parts.step(new)
            resplit = Resplit(
                old=parts.microbatches,
                new=new,
                stages=parts.stages,
                schedule=parts.schedule,
                formula_delta_us=then - now,
                step_us=step_us + replay.delta_us + then - now,
            )
            replay = Replay(step_us=resplit.step_us, delta_us=replay.delta_us + then - now)
        pg, pbase, pedited, pdur = path_of
        before, after = set(pbase.path.tolist()), set(pedited.path.tolist())

        def names(s: set[int], g: ExecutionGraph = pg, d: np.ndarray = pdur) -> list[NodeRef]:
            ranked = sorted(s, key=lambda i: -float(d[i]))[:10]
            return [NodeRef(int(i), g.node_name(i), int(g.nodes["rank"][i])) for i in ranked]

        out.append(
            StepWhatIf(
                step=g.step,
                measured_us=measured,
                step_us=step_us,
                edited_nodes=len(times.nodes),
                edited_gaps=int((~delta.detached)[np.setdiff1d(times.edges, own_eids)].sum()),
                edited_own=owned,
                detached_edges=int(delta.detached.sum()),
                added_us=delta.added_us,
                replay=replay,
                steady=steady,
                model=model,
                microbatches=resplit,
                corrected=corrected,
                knobs=[k.describe() for k in settings],
                knobs_interval_us=knob_interval(g, replay.step_us) if settings else None,
                critical_path=PathChange(len(before), len(after), names(after - before), names(before - after)),
            )
        )
    if no_passes:
        shown = ", ".join(str(s) for s in no_passes[:10]) + (", ..." if len(no_passes) > 10 else "")
        warnings.warn(
            f"{path}: step(s) {shown} have no forward/backward ranges: --set scaled all of their work outside an optimizer range",
            OracleWarning,
            stacklevel=2,
        )
    return out


def _reference_pool(
    path: str | Path, baseline: str | Path | None, steps: list[int] | None, config: Config | None, gs: list[ExecutionGraph]
) -> list[ExecutionGraph]:
    """The steps typical durations come from: the baseline's, or all of the trace's own."""
    if baseline is not None:
        return build(baseline, None, config)[1]
    return build(path, None, config)[1] if steps else gs


MAX_REFERENCES = 32  # reference steps per blamed step: the nearest ones (blame stays linear in the number of steps)


def _references(
    g: ExecutionGraph, pool: list[ExecutionGraph], baseline: bool, index: _PoolIndex | None = None
) -> tuple[list[ExecutionGraph], str]:
    """(reference steps of ``g``, how to say where they came from): a baseline's steps, or the
    trace's other steps without the first (warm-up) when there are three or more; at most
    MAX_REFERENCES of them, the nearest to ``g`` in step number. ``index``: the pool's (a part of
    a trace's steps: its first step and size those of the whole)."""
    index = index or _PoolIndex.of(pool)
    here = g.step if g.step is not None else 0
    if len(pool) > 2 * MAX_REFERENCES + 4 and index.ordered:  # a long run: only the steps around g can be picked
        at = bisect.bisect_left(index.numbers, here)
        pool = pool[max(at - MAX_REFERENCES - 2, 0) : at + MAX_REFERENCES + 2]
    if not baseline:
        if index.size >= 3 and index.first is not None:
            pool = [r for r in pool if r.step != index.first]
        pool = [r for r in pool if r.step != g.step]
    if len(pool) > MAX_REFERENCES:
        pool = sorted(pool, key=lambda r: (abs((r.step if r.step is not None else 0) - here), r.step or 0))[:MAX_REFERENCES]
    if baseline:
        return pool, "baseline"
    return pool, f"{len(pool)} other step{'s' if len(pool) != 1 else ''}" if pool else "peer ranks"


@dataclass(frozen=True)
class _PoolIndex:
    """A reference pool's step numbers, whether they increase (a trace's steps) and the first one
    (None where a step has no number), computed once per pool (blame reads them for every step)."""

    pool: list[ExecutionGraph]
    numbers: list[int]
    ordered: bool
    first: int | None
    size: int  # steps in the whole pool

    _last: ClassVar[list[_PoolIndex]] = []

    @classmethod
    def of(cls, pool: list[ExecutionGraph]) -> _PoolIndex:
        if cls._last and cls._last[0].pool is pool and len(cls._last[0].numbers) == len(pool):
            return cls._last[0]
        steps = [r.step for r in pool]
        numbered = [s for s in steps if s is not None]
        complete = len(numbered) == len(steps)
        ordered = complete and all(b > a for a, b in zip(numbered, numbered[1:]))
        index = cls(pool, numbered if complete else [], ordered, min(numbered) if complete and numbered else None, len(pool))
        cls._last[:] = [index]
        return index


def blame(
    path: str | Path,
    baseline: str | Path | None = None,
    steps: list[int] | None = None,
    config: Config | None = None,
    top: int = 10,
    checkpoint: str | Path | None = None,
    use_model: bool = False,
) -> list[StepBlame]:
    """Who is to blame: what restoring each op, gap, region, rank and op kind to typical saves.

    Typical durations come from ``baseline``'s steps when given, else from the trace's other
    steps (the first one, warm-up, left out when there are three or more), and from the peer
    ranks (analysis.blame).

    Args:
        path: a Kineto trace file or a folder of per-rank traces.
        baseline: a trace of the same job as it normally runs; None: the trace's own steps.
        steps: the ProfilerStep numbers to blame; None: every step.
        config: the configuration; None: defaults.
        top: how many nodes and op kinds to list per step.
        checkpoint: the graph network that also predicts the top five nodes' savings; None: the
            shipped one.
        use_model: True: also the graph network's savings of the top five nodes (off by default,
            see ``whatif``).

    Returns:
        One StepBlame per step: culprit nodes, anomalies, regions, ranks and op kinds, each with
        its saving (µs) and share, the measured step time (µs) and where the typical durations
        came from.
    """
    from bottleneck_oracle.analysis.blame import KeyMemo
    from bottleneck_oracle.analysis.cpm import run_cpm

    table: EventTable | None
    if baseline is None and steps is None and not use_model and not chakra.is_chakra(path):
        loaded = load(path, None, (config or Config()).graph.ranks_per_host, steps_at=(config or Config()).graph.steps_at)
        present = {st.number for st in loaded.steps}
        if len(present) >= CHUNKED_BLAME_STEPS and len(loaded) <= CHUNKED_BLAME_EVENTS * len(present) and LocalEngine().workers >= 2:
            return _blame_in_chunks(loaded, config, top)
        try:
            gs = list(iter_graphs(loaded, None, _options(config)))
        finally:
            loaded.drop_caches()
        table = loaded
    else:
        table, gs = build(path, steps, config)
    pool = _reference_pool(path, baseline, steps, config, gs)
    predictor = corrections = None
    if use_model:
        predictor = _predictor(checkpoint)
        variants: list[str] = [v for v in ("correction", "directed", "bidirectional") if v in predictor.models]
        predictor.variants = variants[:1]
        corrections = _corrections()
    out: list[StepBlame] = []
    memo = KeyMemo()
    for g in gs:
        base = run_cpm(g)
        row = _blame_step(g, _references(g, pool, baseline is not None), top, base, memo, table)
        b = row.blame
        if predictor is not None and b.nodes:
            from bottleneck_oracle.analysis.phases import node_phases
            from bottleneck_oracle.models.predict import sample_for

            (variant,) = predictor.variants
            row.model = BlameModel(str(predictor.path), variant)
            phases = node_phases(table, g) if table is not None else None
            unedited = sample_for(g, None, table, base, phases)[0]
            for x in b.nodes[:5]:  # the same restoration the replay's saving is for
                times = EditedTimes.unedited(g)
                if x.kind == "op":
                    times.dur[x.id] = x.typical_us
                elif x.edge is not None:  # the untraced time after the op
                    times.weight[x.edge] = x.typical_us
                else:  # the untraced time before a thread's first op, from the rank's step start
                    times.release[x.id] = g.rank_start(x.rank) + x.typical_us
                data, _ = sample_for(g, times, table, base, phases)
                answer = predictor.effect(g, unedited, data)
                x.model_predicted = True
                effect = answer.delta_us[variant]
                x.model_saving_us = None if answer.out_of_domain or effect is None else -effect
                row.model.out_of_domain = answer.out_of_domain
                if corrections is not None:
                    x.corrected = True
                    fixed = corrections.answer(times, base)
                    x.corrected_saving_us, x.corrected_interval_us = fixed.saving_us, fixed.interval_us
        out.append(row)
    return out


CHUNKED_BLAME_STEPS = 128  # a run of this many steps or more is blamed in chunks of steps, one per core ...
CHUNKED_BLAME_EVENTS = 100_000  # ... where its steps are small (a chunk builds its own graphs and its neighbours')


def _blame_in_chunks(table: EventTable, config: Config | None, top: int) -> list[StepBlame]:
    """``blame`` of every step of a long run of small steps, in contiguous chunks of steps on this
    machine's cores (forked workers share the table): each chunk builds its steps' graphs and the
    MAX_REFERENCES on either side, and blames its steps against the same references as one pass
    over the whole run would (the nearest steps, the run's first step left out)."""
    from bottleneck_oracle.graph_pipeline.builder import checked_steps

    numbers = checked_steps(table, None)
    assert numbers is not None  # (the caller saw steps)
    eng = LocalEngine()
    cuts = [len(numbers) * k // eng.workers for k in range(eng.workers + 1)]
    out: list[StepBlame] = []
    try:
        for rows in eng.imap(_blame_chunk, list(zip(cuts[:-1], cuts[1:])), shared=(table, _options(config), numbers, top)):
            out.extend(rows)
    finally:
        table.drop_caches()
    return out


def _blame_chunk(shared: tuple[EventTable, BuildOptions, list[int], int], span: tuple[int, int]) -> list[StepBlame]:
    from bottleneck_oracle.analysis.blame import KeyMemo
    from bottleneck_oracle.analysis.cpm import run_cpm
    from bottleneck_oracle.graph_pipeline.builder import build_graph

    table, options, numbers, top = shared
    lo, hi = span
    a, b = max(lo - MAX_REFERENCES - 2, 0), min(hi + MAX_REFERENCES + 2, len(numbers))
    graphs = [build_graph(table, numbers[i], options) for i in range(a, b)]
    index = _PoolIndex(graphs, numbers[a:b], True, numbers[0], len(numbers))
    memo = KeyMemo()
    return [_blame_step(g, _references(g, graphs, False, index), top, run_cpm(g), memo, table) for g in graphs[lo - a : hi - a]]


def _blame_step(
    g: ExecutionGraph,
    references: tuple[list[ExecutionGraph], str],
    top: int,
    base: CPMResult,
    memo: KeyMemo,
    table: EventTable | None,
) -> StepBlame:
    """One step's blame against its reference steps (and where they came from), gaps named from
    the trace's events."""
    from bottleneck_oracle.analysis.blame import blame as blame_graph
    from bottleneck_oracle.analysis.blame import name_gaps

    refs, row_refs = references
    b = blame_graph(g, refs, top, base, memo)
    if table is not None:
        name_gaps(b, g, table)
    return StepBlame(b, g.span(), row_refs)


def advise(
    path: str | Path,
    steps: list[int] | None = None,
    config: Config | None = None,
    baseline: str | Path | None = None,
    checkpoint: str | Path | None = None,
    use_model: bool = False,
    llm: ChatClient | None = None,
    recipes: str | Path | None = None,
) -> list[StepAdvice]:
    """Validated optimisation suggestions for every step (llm.graphrag).

    Args:
        path: a Kineto trace file or a folder of per-rank traces.
        steps: the ProfilerStep numbers to advise on; None: every step.
        config: the configuration; None: defaults.
        baseline: a normal run of the same job, for the blame's typical durations.
        checkpoint: the graph network that also predicts each suggestion's saving; None: the
            shipped one.
        use_model: True: also the graph network's predicted savings (off by default, see ``whatif``).
        llm: an OpenAI-compatible chat server (``llm.client.ChatClient``); None: the offline
            recipe engine.
        recipes: another recipe file in the format of the shipped ``llm/recipes.yaml``.

    Returns:
        One StepAdvice per step: the suggestions that passed validation, best replay saving (µs)
        first, the rejected ones with their reasons, and the blame they are based on.
    """
    table, gs = build(path, steps, config)
    pool = _reference_pool(path, baseline, steps, config, gs)
    gap = (config or Config()).analysis.untraced_gap_us
    windows = steady_windows(table, config)
    return advise_graphs(
        table, [StepAnalysis.of(g, gap) for g in gs], pool, baseline is not None, checkpoint, use_model, llm, recipes, windows
    )


def advise_graphs(
    table: EventTable | None,
    analyses: list[StepAnalysis],
    refs_all: list[ExecutionGraph],
    baseline: bool = False,
    checkpoint: str | Path | None = None,
    use_model: bool = False,
    llm: ChatClient | None = None,
    recipes: str | Path | None = None,
    windows: StepWindows | None = None,
) -> list[StepAdvice]:
    """``advise`` on steps already analysed.

    Args:
        table: the event table the steps came from (None for Chakra input).
        analyses: the analysed steps.
        refs_all: the reference steps for typical durations: a baseline's, or the trace's own.
        baseline: whether ``refs_all`` is a baseline's (else the warm-up step is left out).
        checkpoint: the graph network (see ``advise``).
        use_model: True: also the graph network's predicted savings (off by default, see ``whatif``).
        llm: an OpenAI-compatible chat server; None: the offline recipe engine.
        recipes: another recipe file.
        windows: graphs of consecutive steps (``two_step_graphs``): a suggestion for a step whose
            the device carried earlier work into (whatif.carried_in) is replayed in steady state (``steady_replay``); None:
            in the step's own window.

    Returns:
        One StepAdvice per analysed step.
    """
    from bottleneck_oracle.analysis.blame import KeyMemo, name_gaps
    from bottleneck_oracle.analysis.blame import blame as blame_graph
    from bottleneck_oracle.analysis.phases import node_phases
    from bottleneck_oracle.llm.graphrag import advise as advise_step
    from bottleneck_oracle.llm.graphrag import slow_step_suggestions
    from bottleneck_oracle.llm.retrieve import load_recipes

    predictor = None
    if use_model:
        predictor = _predictor(checkpoint)
    kb = load_recipes(recipes)
    from bottleneck_oracle.analysis.runs import steady

    out: list[StepAdvice] = []
    memo = KeyMemo()
    kept = {id(a) for a in steady(analyses)}
    late = run_straggler([a for a in analyses if id(a) in kept])
    for a in analyses:
        g = a.graph
        refs, row_refs = _references(g, refs_all, baseline)
        b = blame_graph(g, refs, 10, a.cpm, memo)
        if table is not None:
            name_gaps(b, g, table)
        phase, mb = node_phases(table, g) if table is not None else (None, None)
        out.append(
            StepAdvice(
                advise_step(a, b, phase, table, predictor, llm, recipes=kb, mb=mb, windows=windows, run_straggler=late),
                b,
                row_refs,
                id(a) in kept,
            )
        )
    slow_step_suggestions(analyses, [x.advice for x in out], table)
    return out


def run_straggler(analyses: list[StepAnalysis]) -> int | None:
    """The rank the others waited for (StepAnalysis.straggler) in most of ``analyses`` (the run's
    steady steps), as the run answer names it (answer.persistent_rank); None: no such rank."""
    from bottleneck_oracle.analysis.answer import persistent_rank

    found = persistent_rank([s.rank if s is not None else None for s in (a.straggler() for a in analyses)])
    return found[0] if found else None


def summary(path: str | Path, steps: list[int] | None = None, config: Config | None = None) -> RunSummary:
    """Every step of a run against its median; outliers with their top cause.

    Args:
        path: a trace file or a folder of per-rank traces.
        steps: the ProfilerStep numbers to include; None: every step.
        config: the configuration; None: defaults.

    Returns:
        The RunSummary (analysis.runs): the steady-state step time (median of the steps after
        the first, µs), its spread, and per step its difference from it, its CPM step time,
        untraced time and, for an outlier, blame's top cause.
    """
    from bottleneck_oracle.analysis.runs import summarize

    _, analyses = analyze(path, steps, config)
    return summarize(analyses, str(path))


def compare(
    baseline: str | Path,
    candidate: str | Path,
    config: Config | None = None,
    top: int = 10,
    min_change: float = 0.01,
    force: bool = False,
) -> Comparison:
    """Did a change help: the candidate run against the baseline run.

    Args:
        baseline: the run before the change (a trace file or a folder of per-rank traces).
        candidate: the run after the change.
        config: the configuration; None: defaults.
        top: how many rows of what moved on the critical path to keep.
        min_change: the minimum practical change, a share of the baseline's median step (0.01: 1%).
        force: compare runs that share almost no ops instead of refusing.

    Returns:
        The Comparison (analysis.change): the median step times (periods), their difference (µs)
        with the 95% interval of the shift and a verdict (faster, slower, within noise, too few
        steps), why the runs may not be comparable (also warned with OracleWarning), what moved
        on the critical path, per breakdown class and per rank.

    Raises:
        OracleError: a run without steps; runs that share almost no ops (unless ``force``).
    """
    from bottleneck_oracle.analysis.change import compare as compare_runs
    from bottleneck_oracle.analysis.change import shape_of

    tb, base = analyze(baseline, None, config)
    tc, cand = analyze(candidate, None, config)
    c = compare_runs(base, cand, str(baseline), str(candidate), top, min_change, (shape_of(tb, base), shape_of(tc, cand)), force)
    for line in c.warnings:
        warnings.warn(line, OracleWarning, stacklevel=2)
    return c

"""The Python API the CLI is a thin layer over."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bottleneck_oracle.analysis.results import (
    BatchScale,
    BlameModel,
    Corrected,
    NodeRef,
    PathChange,
    Replay,
    Resplit,
    StepAdvice,
    StepBlame,
    StepWhatIf,
)
from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.config import Config
from bottleneck_oracle.errors import OracleWarning
from bottleneck_oracle.graph_pipeline import chakra, clocks
from bottleneck_oracle.graph_pipeline.builder import BuildOptions, build_graphs, iter_graphs
from bottleneck_oracle.graph_pipeline.engine import Engine, make_engine
from bottleneck_oracle.graph_pipeline.et import attach, load_execution_traces
from bottleneck_oracle.graph_pipeline.events import EventTable, load_events
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph

if TYPE_CHECKING:
    import numpy as np

    from bottleneck_oracle.analysis.runs import Comparison, RunSummary
    from bottleneck_oracle.llm.client import ChatClient
    from bottleneck_oracle.models.corrections import Corrections, GraphCorrections
    from bottleneck_oracle.models.predict import Predictor

ExecutorSpec = str | Executor | Engine | Any | None
"""Where parsing and graph building run: see ``build``."""


def _predictor(checkpoint: str | Path | None) -> Predictor:
    """The graph network (models.predict.Predictor). It runs in numpy from the checkpoint's .npz;
    a .pt without one needs torch, and says so when it is not installed."""
    from bottleneck_oracle.models.predict import Predictor

    return Predictor(checkpoint)


def load(path: str | Path, et: str | Path | None = None, ranks_per_host: int = 0, executor: ExecutorSpec = None) -> EventTable:
    """Events of a Kineto trace file or a folder of per-rank trace files, with the data
    dependencies of the run's PyTorch execution trace(s) when ``et`` is given. With
    ``ranks_per_host`` > 0 the clocks of the hosts are aligned (graph_pipeline.clocks);
    ``table.clocks`` says what moved. ``executor``: where the files are parsed (see ``build``)."""
    with _engine(executor) as eng:
        table = load_events(path, engine=eng)
    hosts = clocks.hosts_by_block(table.ranks, ranks_per_host) if ranks_per_host > 0 else None
    report = clocks.align(table, hosts)
    table.clocks = report.as_dict() if hosts is not None or report.warnings else {}
    for line in report.warnings:
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
    """One ExecutionGraph per ProfilerStep (all ranks merged), or one for the whole trace."""
    with _engine(executor) as eng:
        return build_graphs(table, steps, _options(config), eng)


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
    """The graphs of any supported input. Chakra ET input (.et files) has no steps and no
    event table: one graph for the whole trace, and None for the table.

    ``executor`` runs the per-rank parsing and the per-step graph building: None or "local"
    (this machine's processes), "dask" (a Dask LocalCluster), "dask://HOST:PORT" (a running
    Dask scheduler), a ``distributed.Client``, or any ``concurrent.futures.Executor``. The
    answers are the same on every one (graph_pipeline.engine)."""
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
        table = load(path, et, (config or Config()).graph.ranks_per_host, eng)
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
    """Build and run the critical path method on every selected step (``executor``: see ``build``)."""
    table, stream = analyze_stream(path, steps, config, et, executor)
    return table, list(stream)


def analyze_stream(
    path: str | Path,
    steps: list[int] | None = None,
    config: Config | None = None,
    et: str | Path | None = None,
    executor: ExecutorSpec = None,
) -> tuple[EventTable | None, Iterator[StepAnalysis]]:
    """``analyze``, one step at a time: each step's graph is built and analysed when the iterator
    reaches it, so a run of thousands of steps never holds every graph at once. Bad input (a
    missing step, traces of different runs) raises here, before the first step."""
    gap = (config or Config()).analysis.untraced_gap_us
    table, gs = _graph_stream(path, steps, config, et, executor)
    return table, (StepAnalysis.of(g, gap) for g in gs)


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
    use_model: bool = True,
    microbatches: int | None = None,
    batch: float | None = None,
) -> list[StepWhatIf]:
    """Per step: the step time after ``edits`` (``Edit.parse`` strings) by the exact replay and by
    each HeteroGAT variant of ``checkpoint`` (the shipped pretrained model by default), with
    the critical path before and after. ``microbatches``: a pipeline step re-split into that
    many micro-batches, predicted by the 1F1B formula (the replay cannot restructure the graph).
    ``batch``: the batch scaled by this ratio, the step bracketed by two replays (``BatchScale``)."""
    import numpy as np

    from bottleneck_oracle.analysis.cpm import run_cpm
    from bottleneck_oracle.analysis.phases import node_phases
    from bottleneck_oracle.analysis.whatif import MAX_SCALE, Edit, apply_edits
    from bottleneck_oracle.errors import OracleError

    parsed = [Edit.parse(e) for e in edits]
    if not parsed and microbatches is None and batch is None:
        raise OracleError("whatif needs an --edit, --microbatches or --batch")
    if batch is not None and not 0 < batch <= MAX_SCALE:
        raise OracleError(f"--batch must be a ratio > 0 and at most {MAX_SCALE:g} (found {batch})")
    table, gs = build(path, steps, config)
    predictor = corrections = None
    if use_model:
        predictor = _predictor(checkpoint)
        corrections = _corrections()
    out: list[StepWhatIf] = []
    for g in gs:
        phase_mb = node_phases(table, g) if table is not None else None
        phases = phase_mb[0] if phase_mb is not None else None
        d, w, rel, ids, eids = apply_edits(g, parsed, phases, table)
        if parsed and not len(ids) and not len(eids):
            raise OracleError(f"{path}: step {g.step}: the edits select no node ({', '.join(edits)})")
        base = run_cpm(g)
        measured = max(g.measured.values())
        fin = np.isfinite(w)
        added = float(
            (d - g.nodes["mdur"]).sum()
            + (w[fin] - g.edges["weight"][fin]).sum()
            + np.where(np.isfinite(g.release), np.nan_to_num(rel, neginf=0.0) - np.nan_to_num(g.release, neginf=0.0), 0.0).sum()
        )
        model: dict[str, Any] | None = None
        if predictor is not None:
            from bottleneck_oracle.models.predict import sample_for

            data, edited = sample_for(g, d, table, base, w, rel, phase_mb)
            model = predictor.effect(g, sample_for(g, None, table, base, phases=phase_mb)[0], data)
        else:
            edited = run_cpm(g, d, w, rel)
        replay = Replay(step_us=measured + edited.makespan - base.makespan, delta_us=edited.makespan - base.makespan)
        corrected = None
        if corrections is not None:
            answer = corrections.answer(g, d, w, rel, base)
            if isinstance(answer, str):
                corrected = Corrected(
                    step_us=None, delta_us=None, interval_us=None, out_of_domain=answer, trained_on=corrections.trained_on
                )
            else:
                saving, (lo, hi) = answer
                corrected = Corrected(step_us=measured - saving, delta_us=-saving, interval_us=(-hi, -lo), out_of_domain=None,
                                      trained_on=corrections.trained_on)  # fmt: skip
        resplit = None
        if microbatches is not None:
            from bottleneck_oracle.analysis.phases import formula_parts, is_pipeline, pipeline_step

            if phase_mb is None or not is_pipeline(g, table):
                raise OracleError(f"{path}: step {g.step} is not a pipeline-parallel step (no per-micro-batch phases and send/recv)")
            parts = formula_parts(g, d, *phase_mb)
            now, then = pipeline_step(parts), pipeline_step(parts, microbatches)
            resplit = Resplit(old=int(parts["m"]), new=microbatches, stages=int(parts["p"]), formula_delta_us=then - now,
                              step_us=measured + replay.delta_us + then - now)  # fmt: skip
        scaled = None
        if batch is not None:
            scaled = _batch_scale(g, table, phases, d, w, rel, batch, measured - base.makespan, path)
        before, after = set(base.path.tolist()), set(edited.path.tolist())

        def names(s: set[int], g: ExecutionGraph = g, d: np.ndarray = d) -> list[NodeRef]:
            ranked = sorted(s, key=lambda i: -float(d[i]))[:10]
            return [NodeRef(int(i), g.node_name(i), int(g.nodes["rank"][i])) for i in ranked]

        out.append(
            StepWhatIf(
                step=g.step, measured_us=measured, edited_nodes=len(ids), edited_gaps=int(fin[eids].sum()),
                detached_edges=int((~fin).sum()), added_us=added, replay=replay, model=model, microbatches=resplit, corrected=corrected, batch=scaled,
                critical_path=PathChange(len(before), len(after), names(after - before), names(before - after)),
            )
        )  # fmt: skip
    return out


def _reference_pool(
    path: str | Path, baseline: str | Path | None, steps: list[int] | None, config: Config | None, gs: list[ExecutionGraph]
) -> list[ExecutionGraph]:
    """The steps typical durations come from: the baseline's, or all of the trace's own."""
    if baseline is not None:
        return build(baseline, None, config)[1]
    return build(path, None, config)[1] if steps else gs


MAX_REFERENCES = 32  # reference steps per blamed step: the nearest ones (blame stays linear in the number of steps)


def _references(g: ExecutionGraph, pool: list[ExecutionGraph], baseline: bool) -> tuple[list[ExecutionGraph], str]:
    """(reference steps of ``g``, how to say where they came from): a baseline's steps, or the
    trace's other steps without the first (warm-up) when there are three or more; at most
    MAX_REFERENCES of them, the nearest to ``g`` in step number."""
    if not baseline:
        if len(pool) >= 3 and all(r.step is not None for r in pool):
            first = min(r.step for r in pool if r.step is not None)
            pool = [r for r in pool if r.step != first]
        pool = [r for r in pool if r.step != g.step]
    if len(pool) > MAX_REFERENCES:
        here = g.step if g.step is not None else 0
        pool = sorted(pool, key=lambda r: (abs((r.step if r.step is not None else 0) - here), r.step or 0))[:MAX_REFERENCES]
    if baseline:
        return pool, "baseline"
    return pool, f"{len(pool)} other step{'s' if len(pool) != 1 else ''}" if pool else "peer ranks"


def _batch_scale(
    g: ExecutionGraph, table: EventTable | None, phases: np.ndarray | None, d: np.ndarray, w: np.ndarray, rel: np.ndarray, ratio: float,
    offset: float, path: str | Path,
) -> BatchScale:  # fmt: skip
    """The step with the batch scaled by ``ratio`` (on top of the edits: ``d``, ``w``, ``rel``):
    the forward and backward passes' CPU ops scaled alone, and with their regions' own time."""
    from bottleneck_oracle.analysis.cpm import run_cpm
    from bottleneck_oracle.analysis.whatif import Edit, edited_weights
    from bottleneck_oracle.errors import OracleError
    from bottleneck_oracle.graph_pipeline.schema import Category

    if (g.nodes["category"] == Category.KERNEL).any():
        raise OracleError(f"{path}: step {g.step}: --batch is built and checked on CPU (gloo) runs only; on a GPU the "
                          "kernels scale with the batch, which it does not model")  # fmt: skip
    edits = [Edit(phase=p, category="cpu_op", scale=ratio) for p in ("forward", "backward")]
    ids = [e.select(g, phases, table) for e in edits] if phases is not None else []
    if not ids or not sum(len(i) for i in ids):
        raise OracleError(f"{path}: step {g.step}: --batch needs the forward and backward ranges (the profiler's '## forward ##' "
                          "or a phase hook); this step has no CPU op inside one")  # fmt: skip
    dd = d.copy()
    for i in ids:
        dd[i] = d[i] * ratio
    _, eids = edited_weights(g, edits, phases, table)
    ww = w.copy()
    ww[eids] = w[eids] * ratio
    return BatchScale(ratio=ratio, ops_alone_step_us=offset + run_cpm(g, dd, w, rel).makespan,
                      with_own_time_step_us=offset + run_cpm(g, dd, ww, rel).makespan)  # fmt: skip


def blame(
    path: str | Path,
    baseline: str | Path | None = None,
    steps: list[int] | None = None,
    config: Config | None = None,
    top: int = 10,
    checkpoint: str | Path | None = None,
    use_model: bool = True,
) -> list[StepBlame]:
    """Per step: nodes, ranks and op kinds ranked by the step time restoring them to their typical
    duration saves (analysis.blame). Typical durations come from ``baseline``'s steps when given,
    else from the trace's other steps (the first one, warm-up, left out when there are three or
    more). The top nodes' savings are also predicted by the graph network (its default variant)."""
    from bottleneck_oracle.analysis.blame import KeyMemo, name_gaps
    from bottleneck_oracle.analysis.blame import blame as blame_graph
    from bottleneck_oracle.analysis.cpm import run_cpm

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
        refs, row_refs = _references(g, pool, baseline is not None)
        base = run_cpm(g)
        b = blame_graph(g, refs, top, base, memo)
        if table is not None:
            name_gaps(b, g, table)
        row = StepBlame(b, max(g.measured.values()), row_refs)
        if predictor is not None and b.nodes:
            from bottleneck_oracle.analysis.phases import node_phases
            from bottleneck_oracle.models.predict import sample_for

            (variant,) = predictor.variants
            row.model = BlameModel(str(predictor.path), variant)
            phases = node_phases(table, g) if table is not None else None
            unedited = sample_for(g, None, table, base, phases=phases)[0]
            for x in b.nodes[:5]:  # the same restoration the replay's saving is for
                d, w, rel = g.nodes["mdur"].astype(float).copy(), g.edges["weight"].astype(float).copy(), g.release.astype(float).copy()
                if x.kind == "op":
                    d[x.id] = x.typical_us
                elif x.edge is not None:  # the untraced time after the op
                    w[x.edge] = x.typical_us
                else:  # the untraced time before a thread's first op, from the rank's step start
                    rel[x.id] = g.rank_start(x.rank) + x.typical_us
                data, _ = sample_for(g, d, table, base, w, rel, phases)
                answer = predictor.effect(g, unedited, data)
                x.model_predicted = True
                x.model_saving_us = None if answer["out_of_domain"] else -answer["delta_us"][variant]
                row.model.out_of_domain = answer["out_of_domain"]
                if corrections is not None:
                    x.corrected = True
                    fixed = corrections.answer(g, d, w, rel, base)
                    if not isinstance(fixed, str):
                        x.corrected_saving_us, x.corrected_interval_us = fixed
        out.append(row)
    return out


def advise(
    path: str | Path,
    steps: list[int] | None = None,
    config: Config | None = None,
    baseline: str | Path | None = None,
    checkpoint: str | Path | None = None,
    use_model: bool = True,
    llm: ChatClient | None = None,
    recipes: str | Path | None = None,
) -> list[StepAdvice]:
    """Per step: validated optimisation suggestions (llm.graphrag), from the offline recipe engine or
    from ``llm`` (an llm.client.ChatClient), with the blame they are based on."""
    table, gs = build(path, steps, config)
    pool = _reference_pool(path, baseline, steps, config, gs)
    gap = (config or Config()).analysis.untraced_gap_us
    return advise_graphs(table, [StepAnalysis.of(g, gap) for g in gs], pool, baseline is not None, checkpoint, use_model, llm, recipes)


def advise_graphs(
    table: EventTable | None,
    analyses: list[StepAnalysis],
    refs_all: list[ExecutionGraph],
    baseline: bool = False,
    checkpoint: str | Path | None = None,
    use_model: bool = True,
    llm: ChatClient | None = None,
    recipes: str | Path | None = None,
) -> list[StepAdvice]:
    """advise on analysed steps: ``refs_all`` are the reference steps (a baseline's, or the trace's own)."""
    from bottleneck_oracle.analysis.blame import KeyMemo, name_gaps
    from bottleneck_oracle.analysis.blame import blame as blame_graph
    from bottleneck_oracle.analysis.phases import node_phases
    from bottleneck_oracle.llm.graphrag import advise as advise_step
    from bottleneck_oracle.llm.retrieve import load_recipes

    predictor = None
    if use_model:
        predictor = _predictor(checkpoint)
    kb = load_recipes(recipes)
    out: list[StepAdvice] = []
    memo = KeyMemo()
    for a in analyses:
        g = a.graph
        refs, row_refs = _references(g, refs_all, baseline)
        b = blame_graph(g, refs, 10, a.cpm, memo)
        if table is not None:
            name_gaps(b, g, table)
        phase, mb = node_phases(table, g) if table is not None else (None, None)
        out.append(StepAdvice(advise_step(a, b, phase, table, predictor, llm, recipes=kb, mb=mb), b, row_refs))
    return out


def summary(path: str | Path, steps: list[int] | None = None, config: Config | None = None) -> RunSummary:
    """Every step of a run against its median, outliers with their top cause (analysis.runs.RunSummary)."""
    from bottleneck_oracle.analysis.runs import summarize

    _, analyses = analyze(path, steps, config)
    return summarize(analyses, str(path))


def compare(baseline: str | Path, candidate: str | Path, config: Config | None = None, seed: int = 0) -> Comparison:
    """Baseline run against candidate run: the step-time change with its noise, what moved on the
    critical path, per kind and per rank (analysis.runs.Comparison)."""
    from bottleneck_oracle.analysis.runs import compare as compare_runs

    _, base = analyze(baseline, None, config)
    _, cand = analyze(candidate, None, config)
    return compare_runs(base, cand, str(baseline), str(candidate), seed)

"""Every step of a run analysed where its graph is built, keeping only what the caller asks of it.

``analyze`` on a long run (thousands of steps) or a large one (thousands of ranks) is dominated
by per-step work: building the step's graph, the critical path method, and reading its figures
off the analysis (segments, top ops, checks, its JSON). ``map_steps`` runs all of it for each step
in one task: in forked worker processes when the event table is large (they share the table
without a copy), on the given engine (graph_pipeline.engine), or in this process. Each task
returns ``fn(analysis)``, which should be small (a step's figures, its JSON bytes): the graphs
stay in the workers. Results come in step order, so the answers do not depend on where the work
ran.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from bottleneck_oracle.analysis.segments import UNTRACED_GAP_US
from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.graph_pipeline.builder import PARALLEL_EVENTS, BuildOptions, build_graph, checked_steps
from bottleneck_oracle.graph_pipeline.engine import Engine, LocalEngine
from bottleneck_oracle.graph_pipeline.events import EventTable
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph

T = TypeVar("T")


def map_steps(
    table: EventTable,
    fn: Callable[[StepAnalysis], T],
    steps: list[int] | None = None,
    options: BuildOptions | None = None,
    untraced_gap_us: float = UNTRACED_GAP_US,
    engine: Engine | None = None,
    keep: frozenset[int | None] | Callable[[list[int | None], EventTable | None], frozenset[int | None]] = frozenset(),
) -> Iterator[tuple[T, StepAnalysis | None]]:
    """``fn(StepAnalysis)`` of every selected step, in step order, computed where the step is built.

    Args:
        table: the event table (graph_pipeline.events).
        fn: what to keep of each analysed step; a module-level function (or a ``functools.partial``
            of one) when the steps run in other processes, returning something small.
        steps: the ProfilerStep numbers; None: every step (one window for a trace without steps).
        options: the graph builder's thresholds.
        untraced_gap_us: µs, the analysis's untraced-gap threshold.
        engine: where the steps run (graph_pipeline.engine); None: forked processes of this
            machine when the table holds at least PARALLEL_EVENTS events, else this process.
        keep: the steps whose analysis comes back whole too (forked workers hand its graph back
            as a file, and its critical path method is run again here: the same numbers), or a
            function of the step numbers to be analysed that gives them.

    Returns:
        An iterator of ``(fn's result, the step's StepAnalysis if it is in keep, else None)``. The
        steps are checked before it is returned (bad input raises here, not halfway through).
    """
    present = checked_steps(table, steps)
    numbers: list[int | None] = [None] if present is None else list(present)
    if callable(keep):
        keep = keep(numbers, table)
    if engine is not None and not isinstance(engine, LocalEngine):
        shared = (table, options, untraced_gap_us, fn, keep, _GRAPH)
        return _whole_analyses(engine.imap(_task, numbers, shared=shared), untraced_gap_us)
    workers = min(os.cpu_count() or 1, len(numbers)) if len(table) >= PARALLEL_EVENTS else 1
    if engine is not None:
        workers = min(workers, engine.workers)
    if workers < 2:
        return (_task((table, options, untraced_gap_us, fn, keep, None), n) for n in numbers)
    return _forked(table, fn, numbers, options, untraced_gap_us, keep, workers)


def _forked(
    table: EventTable,
    fn: Callable[[StepAnalysis], Any],
    numbers: list[int | None],
    options: BuildOptions | None,
    gap: float,
    keep: frozenset[int | None],
    workers: int | None,
) -> Iterator[tuple[Any, StepAnalysis | None]]:
    # forked workers hand whole graphs back as files: a pickled graph would be held twice on each side
    if len(table.files) > 1:  # each step's rows spread over every rank's block of the table: laid out step by step
        table.share()
    with tempfile.TemporaryDirectory(prefix="bottleneck-oracle-") as folder:
        for out, whole in LocalEngine(workers).imap(_task, numbers, shared=(table, options, gap, fn, keep, folder)):
            if isinstance(whole, str):
                g = ExecutionGraph.load(whole)
                os.unlink(whole)
                whole = StepAnalysis.of(g, gap)
            yield out, whole


def _whole_analyses(results: Iterator[tuple[Any, ExecutionGraph | None]], gap: float) -> Iterator[tuple[Any, StepAnalysis | None]]:
    """Results of another engine's workers: a whole step comes back as its graph."""
    for out, g in results:
        yield out, (StepAnalysis.of(g, gap) if g is not None else None)


_GRAPH = ""  # a whole step travels back as its graph (another engine's workers)


def _task(shared: tuple[Any, ...], step: int | None) -> tuple[Any, Any]:
    """One step: built, analysed, ``fn`` of it; with the step in ``keep`` also the analysis itself
    (``to`` None: this process), its graph saved in the folder ``to`` (a forked worker) or its
    graph (``to`` _GRAPH: another engine's worker)."""
    table, options, gap, fn, keep, to = shared
    a = StepAnalysis.of(build_graph(table, step, options), gap)
    out = fn(a)
    if step not in keep:
        return out, None
    if to is None:
        return out, a
    if to == _GRAPH:
        return out, a.graph
    path = os.path.join(to, f"step-{step}.npz")
    a.graph.save(path, compress=False)
    return out, path

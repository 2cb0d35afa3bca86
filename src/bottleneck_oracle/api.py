"""The Python API the CLI is a thin layer over."""

from __future__ import annotations

from pathlib import Path

from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.config import Config
from bottleneck_oracle.graph_pipeline import chakra
from bottleneck_oracle.graph_pipeline.builder import BuildOptions, build_graphs
from bottleneck_oracle.graph_pipeline.et import attach, load_execution_traces
from bottleneck_oracle.graph_pipeline.events import EventTable, load_events
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph


def load(path: str | Path, et: str | Path | None = None) -> EventTable:
    """Events of a Kineto trace file or a folder of per-rank trace files, with the data
    dependencies of the run's PyTorch execution trace(s) when ``et`` is given."""
    table = load_events(path)
    if et is not None:
        attach(table, load_execution_traces(et, table.ranks))
    return table


def graphs(table: EventTable, steps: list[int] | None = None, config: Config | None = None) -> list[ExecutionGraph]:
    """One ExecutionGraph per ProfilerStep (all ranks merged), or one for the whole trace."""
    cfg = config or Config()
    return build_graphs(table, steps, BuildOptions(feeds_resume_us=cfg.graph.feeds_resume_us))


def build(
    path: str | Path, steps: list[int] | None = None, config: Config | None = None, et: str | Path | None = None
) -> tuple[EventTable | None, list[ExecutionGraph]]:
    """The graphs of any supported input. Chakra ET input (.et files) has no steps and no
    event table: one graph for the whole trace, and None for the table."""
    if chakra.is_chakra(path):
        return None, [chakra.chakra_graph(path)]
    table = load(path, et)
    return table, graphs(table, steps, config)


def analyze(
    path: str | Path, steps: list[int] | None = None, config: Config | None = None, et: str | Path | None = None
) -> tuple[EventTable | None, list[StepAnalysis]]:
    """Build and run the critical path method on every selected step."""
    table, gs = build(path, steps, config, et)
    return table, [StepAnalysis.of(g) for g in gs]

"""The Python API the CLI is a thin layer over."""

from __future__ import annotations

from pathlib import Path

from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.config import Config
from bottleneck_oracle.graph_pipeline.builder import BuildOptions, build_graphs
from bottleneck_oracle.graph_pipeline.events import EventTable, load_events
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph


def load(path: str | Path) -> EventTable:
    """Events of a trace file or a folder of per-rank trace files."""
    return load_events(path)


def graphs(table: EventTable, steps: list[int] | None = None, config: Config | None = None) -> list[ExecutionGraph]:
    """One ExecutionGraph per ProfilerStep (all ranks merged), or one for the whole trace."""
    cfg = config or Config()
    return build_graphs(table, steps, BuildOptions(feeds_resume_us=cfg.graph.feeds_resume_us))


def analyze(path: str | Path, steps: list[int] | None = None, config: Config | None = None) -> tuple[EventTable, list[StepAnalysis]]:
    """Load, build and run the critical path method on every selected step."""
    table = load(path)
    return table, [StepAnalysis.of(g) for g in graphs(table, steps, config)]

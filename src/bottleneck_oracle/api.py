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


def whatif(
    path: str | Path,
    edits: list[str],
    steps: list[int] | None = None,
    config: Config | None = None,
    checkpoint: str | Path | None = None,
    use_model: bool = True,
) -> list[dict]:
    """Per step: the step time after ``edits`` (``Edit.parse`` strings) by the exact replay and by
    each HeteroGAT variant of ``checkpoint`` (the shipped pretrained model by default), with
    the critical path before and after."""
    from bottleneck_oracle.analysis.cpm import run_cpm
    from bottleneck_oracle.analysis.whatif import Edit, edited_durations
    from bottleneck_oracle.errors import OracleError

    parsed = [Edit.parse(e) for e in edits]
    table, gs = build(path, steps, config)
    predictor = None
    if use_model:
        from bottleneck_oracle.models.predict import Predictor

        predictor = Predictor(checkpoint)
    out = []
    for g in gs:
        d, ids = edited_durations(g, parsed)
        if not len(ids):
            raise OracleError(f"{path}: step {g.step}: the edits select no node ({', '.join(edits)})")
        base = run_cpm(g)
        measured = max(g.measured.values())
        row = {"step": g.step, "measured_us": measured, "edited_nodes": len(ids), "added_us": float((d - g.nodes["mdur"]).sum())}
        if predictor is not None:
            from bottleneck_oracle.models.predict import sample_for

            data, edited = sample_for(g, d, table, base)
            row["model"] = {"checkpoint": str(predictor.path), "step_us": predictor.step_times(data)}
            row["model"]["delta_us"] = {v: t - measured for v, t in row["model"]["step_us"].items()}
        else:
            edited = run_cpm(g, d)
        row["replay"] = {"step_us": measured + edited.makespan - base.makespan, "delta_us": edited.makespan - base.makespan}
        before, after = set(base.path.tolist()), set(edited.path.tolist())

        def names(s, g=g, d=d):
            ranked = sorted(s, key=lambda i: -float(d[i]))[:10]
            return [{"id": int(i), "name": g.node_name(i), "rank": int(g.nodes["rank"][i])} for i in ranked]

        row["critical_path"] = {
            "nodes_before": len(before),
            "nodes_after": len(after),
            "joined": names(after - before),
            "left": names(before - after),
        }
        out.append(row)
    return out

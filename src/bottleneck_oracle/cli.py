"""`bottleneck-oracle` command line: thin over bottleneck_oracle.api."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from bottleneck_oracle import __version__, api
from bottleneck_oracle.analysis.summary import BREAKDOWN_KEYS, StepAnalysis
from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.config import Config, load_config
from bottleneck_oracle.errors import OracleError, OracleWarning

app = typer.Typer(
    name="bottleneck-oracle",
    help="Critical path, slack and bottlenecks of (distributed) PyTorch training steps, from profiler traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

STEP_HELP = "ProfilerStep number to analyse (repeatable); default: every step in the trace."
CONFIG_HELP = "YAML config (see config.yaml); default: built-in defaults."


def _error(msg: str) -> None:
    """One line on stderr; trace strings in msg are shown as they are, never as markup."""
    err.print(Text("error: ", style="bold red") + Text(msg), soft_wrap=True)


def _fail(msg: str, code: int = 2) -> None:
    _error(msg)
    raise typer.Exit(code)


def _config(path: Path | None) -> Config:
    return load_config(path)


def _ms(us: float) -> str:
    return f"{us / 1000:.3f}"


def _print_summary(analyses: list[StepAnalysis], source: str, top: int) -> None:
    out.print(f"[bold]BottleneckOracle[/] {__version__} — {source}", highlight=False)
    t = Table(
        title="Steps (ms)",
        caption="measured / CPM: slowest rank's step; window: first rank's start to last op's end (the critical path, broken down)",
    )
    for col in ("step", "ranks", "measured", "CPM", "error", "window", "compute", "comm", "cpu ovh", "idle"):
        t.add_column(col, justify="right")
    for a in analyses:
        b = a.breakdown()
        err_pct = 100 * (a.step_time - a.measured) / (a.measured or 1)
        t.add_row(
            str(a.graph.step if a.graph.step is not None else "-"),
            str(len(a.graph.ranks)),
            _ms(a.measured),
            _ms(a.step_time),
            f"{err_pct:+.2f}%",
            _ms(a.cpm.makespan),
            *[_ms(b[k]) for k in BREAKDOWN_KEYS],
        )
    out.print(t)
    for a in analyses:
        label = a.graph.step if a.graph.step is not None else "(whole trace)"
        c = a.graph.summary_counts()
        out.print(
            f"\n[bold]Step {label}[/]: {c['nodes']} nodes ({c['network_nodes']} network, {c['barriers']} barriers), "
            f"{c['edges']} edges, critical path {len(a.cpm.path)} ops",
            highlight=False,
        )
        ops = Table(title=f"Top {top} ops by time on the critical path")
        for col in ("op", "count", "critical ms", "share"):
            ops.add_column(col, justify="left" if col == "op" else "right", overflow="fold")
        for o in a.top_ops(top):
            ops.add_row(o["name"][:90], str(o["count"]), _ms(o["critical_us"]), f"{100 * o['share']:.1f}%")
        out.print(ops)
        comm = a.lowest_slack_comm()
        if comm:
            ct = Table(title="Lowest-slack communication")
            for col in ("op", "rank", "slack ms", "dur ms", "waiting ms", "critical"):
                ct.add_column(col, justify="left" if col == "op" else "right")
            for x in comm:
                ct.add_row(
                    x["name"][:60], str(x["rank"]), _ms(x["slack_us"]), _ms(x["dur_us"]), _ms(x["wait_us"]), "yes" if x["critical"] else ""
                )
            out.print(ct)
        ranks = a.ranks()
        if len(ranks) > 1:
            rt = Table(title="Ranks")
            for col in ("rank", "step ms", "CPM step ms", "collective wait ms (sum)", "critical path share"):
                rt.add_column(col, justify="right")
            for x in ranks:
                rt.add_row(
                    str(x["rank"]),
                    _ms(x["step_us"]),
                    _ms(x["predicted_step_us"]),
                    _ms(x["collective_wait_us"]),
                    f"{100 * x['critical_share']:.1f}%",
                )
            out.print(rt)
            s = a.straggler()
            if s:
                out.print(
                    f"Straggler: rank {s['rank']} (the others waited up to {_ms(s['imposed_wait_us'])} ms for it at a collective on the critical path)"
                )


@app.command()
def analyze(
    path: Path = typer.Argument(..., help="A trace file (.json / .json.gz) or a folder of per-rank trace files."),
    step: list[int] = typer.Option(None, "--step", "-s", help=STEP_HELP),
    html: Path = typer.Option(None, "--html", help="Write a self-contained HTML report here."),
    perfetto: Path = typer.Option(None, "--perfetto", help="Write the trace with the critical path marked (opens in Perfetto)."),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON instead of the tables."),
    top: int = typer.Option(None, "--top", help="How many ops to list by critical-path time (default from config: 20)."),
    et: Path = typer.Option(
        None, "--et", help="The run's PyTorch execution trace (file, or folder of rank-N files): adds tensor data dependencies."
    ),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
) -> None:
    """Step time, critical path, slack and per-rank skew of every step in PATH.

    PATH is a Kineto/Chrome trace (.json, .json.gz), a folder of per-rank traces, or
    MLCommons Chakra ET files (.et)."""
    cfg = _config(config)
    k = top or cfg.analysis.top_k
    with err.status(f"analysing {path} ...", spinner="dots") if not as_json and err.is_terminal else _null():
        table, analyses = api.analyze(path, step or None, cfg, et)
    if perfetto and table is None:
        _fail(f"{path}: --perfetto marks the critical path in a Kineto trace; Chakra ET input has none to annotate")
    if html:
        from bottleneck_oracle.report.html import write_report

        write_report(analyses, str(path), html, k)
    if perfetto:
        from bottleneck_oracle.report.perfetto import write_overlay

        write_overlay(table, analyses, perfetto)
    if as_json:
        doc = {"version": __version__, "input": str(path), "ranks": table.ranks, "steps": [a.to_dict(k) for a in analyses]}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    _print_summary(analyses, str(path), k)
    for label, target in (("HTML report", html), ("Perfetto trace", perfetto)):
        if target:
            out.print(f"{label}: {target}", highlight=False)


@app.command()
def parse(
    input: Path = typer.Option(..., "--input", "-i", help="A trace file, a folder of per-rank trace files, or Chakra ET files."),  # noqa: A002
    output: Path = typer.Option(
        None, "--output", "-o", help="Folder for the graphs (step-N.npz) and graphs.json (default: paths.graphs of the config)."
    ),
    step: list[int] = typer.Option(None, "--step", "-s", help=STEP_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
) -> None:
    """Build the ExecutionGraph of every step and save it (plain arrays, no pickles)."""
    cfg = _config(config)
    output = output or Path(cfg.paths.graphs)
    _, graphs = api.build(input, step or None, cfg)
    entries = []
    for g in graphs:
        name = f"step-{g.step}.npz" if g.step is not None else "window.npz"
        g.save(output / name)
        entries.append({"file": name, "step": g.step, "ranks": g.ranks, "measured_us": g.measured, **g.summary_counts()})
    manifest = {"version": __version__, "input": str(input), "graphs": entries}
    with atomic_path(output / "graphs.json") as tmp:
        tmp.write_text(json.dumps(manifest, indent=1))
    if as_json:
        sys.stdout.write(json.dumps(manifest, indent=1) + "\n")
    else:
        for e in entries:
            out.print(f"{output / e['file']}: {e['nodes']} nodes, {e['edges']} edges, ranks {e['ranks']}", highlight=False)


@app.command()
def generate(
    config: Path = typer.Option(Path("config.yaml"), "--config", help="Config whose grid section says what to record."),
    out_dir: Path = typer.Option(None, "--out", "-o", help="Folder for the runs and manifest.jsonl (default: paths.raw of the config)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Record the grid of profiled runs with injected delays (resumes: finished runs are skipped)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from bottleneck_oracle.systems.generate import generate as run_grid

    cfg = _config(config)
    target = out_dir or Path(cfg.paths.raw)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, disable=as_json
    ) as bar:
        task = bar.add_task("runs", total=None)

        def progress(run_id: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=run_id or "done")

        summary = run_grid(cfg.grid, target, progress)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=1) + "\n")
    else:
        out.print(
            f"{summary['recorded']} runs recorded, {summary['skipped']} already done; "
            f"{summary['steps']} profiled steps ({summary['perturbed_steps']} perturbed) in {summary['manifest']}",
            highlight=False,
        )


@app.command("build-dataset")
def build_dataset_cmd(
    raw: Path = typer.Argument(None, help="Folder written by `generate` (default: paths.raw of the config)."),
    out_dir: Path = typer.Option(None, "--out", "-o", help="Folder for the samples and dataset.jsonl (default: paths.graphs)."),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Turn generated runs into labelled PyG graphs (one per profiled step) with train/val/test and OOD splits."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from bottleneck_oracle.training.dataset import build_dataset

    cfg = _config(config)
    with Progress(TextColumn("graphs"), BarColumn(), MofNCompleteColumn(), console=err, disable=as_json) as bar:
        task = bar.add_task("graphs", total=None)
        summary = build_dataset(
            raw or Path(cfg.paths.raw),
            out_dir or Path(cfg.paths.graphs),
            cfg.grid.seed,
            lambda d, t: bar.update(task, completed=d, total=t),
        )
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=1) + "\n")
    else:
        out.print(
            f"{summary['samples']} graphs ({summary['perturbed']} with injected culprits), held out {summary['held_out']}; {summary['dataset']}",
            highlight=False,
        )


@app.command()
def train(config: Path = typer.Option(Path("config.yaml"), "--config", help=CONFIG_HELP)) -> None:
    """Train the HeteroGAT on a built dataset (not built yet)."""
    _config(config)
    _fail("train: the HeteroGAT trainer is not built yet; `analyze` and `parse` work today")


@app.command("eval")
def evaluate(checkpoint: Path = typer.Option(..., "--checkpoint", help="A checkpoint written by `train`.")) -> None:
    """Evaluate a trained model against the baselines (not built yet)."""
    _fail(f"eval: model evaluation is not built yet, so {checkpoint} cannot be evaluated; `analyze` works today")


@app.command()
def version() -> None:
    """Print the version."""
    out.print(__version__)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    err.print(Text("warning: ", style="bold yellow") + Text(str(message)), soft_wrap=True)


def main() -> None:
    """Entry point: library errors become one clean line and exit code 2."""
    warnings.showwarning = _show_warning
    warnings.simplefilter("always", OracleWarning)
    try:
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except OracleError as exc:
        _error(str(exc))
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # click usage errors carry their own message
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(1)
        raise

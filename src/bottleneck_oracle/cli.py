"""`bottleneck-oracle` command line: thin over bottleneck_oracle.api."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from bottleneck_oracle import __version__, api
from bottleneck_oracle.analysis.results import StepAdvice, StepWhatIf
from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.atomic import (
    Interrupted,
    atomic_folder,
    atomic_path,
    atomic_paths,
    check_folder_target,
    guard_output_folder,
    guard_outputs,
    unwinding_signals,
)
from bottleneck_oracle.config import Config, load_config
from bottleneck_oracle.errors import OracleError, OracleWarning, first_line
from bottleneck_oracle.graph_pipeline.clocks import HostClock
from bottleneck_oracle.inert import UNSAFE, plain
from bottleneck_oracle.report.step_output import dumps
from bottleneck_oracle.report.tables import region_labels, shorten
from bottleneck_oracle.serial import to_json, to_json_object

if TYPE_CHECKING:
    from bottleneck_oracle.graph_pipeline.events import EventTable


class _Grouped(TyperGroup):
    """The command list of --help in two sections: what users run, and the developers' commands that
    record the grid, train and evaluate the models (the lab)."""

    # ctx, formatter: click's Context and HelpFormatter; newer typer vendors its own click (typer._click), so
    # which classes they are depends on the installed typer
    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # in the order they are defined, not sorted

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        width = formatter.width - 6 - max((len(n) for n in self.list_commands(ctx)), default=0)
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            panel = getattr(cmd, "rich_help_panel", None) or "Commands"
            groups.setdefault(panel, []).append((name, cmd.get_short_help_str(limit=max(width, 30))))
        for panel, rows in groups.items():
            with formatter.section(panel):
                formatter.write_dl(rows)


ANALYSIS = "Analysis"  # the --help group of what users run
DEVELOPER = "Developer commands (the lab, pip install -e lab/: recording, training, evaluation)"

app = typer.Typer(
    cls=_Grouped,
    name="bottleneck-oracle",
    help="Critical path, slack and bottlenecks of (distributed) PyTorch training steps, from profiler traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no markup from trace strings, no <bool>/<path> type tags
)


def _plain_arguments() -> None:
    """Positional arguments in --help as plain names, like the options: ``PATH`` rather than
    ``PATH <path>`` beside it and ``{PATH}`` in the usage line (typer's defaults)."""
    from typer.core import TyperArgument

    def usage(self: TyperArgument) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]
    TyperArgument._usage_display_name = usage  # type: ignore[method-assign]


_plain_arguments()


class _PlainConsole(Console):
    """A Console that prints trace strings, paths and LLM replies as data: no Rich markup is
    interpreted (a name like ``[/bold]`` or ``[link=...]`` is text), no automatic highlighting,
    and every character that could act (escape sequences, bidirectional overrides, a line break
    inside a name or a path) is shown as an escape by ``inert.plain`` (leading line
    breaks, the only ones this module prints, stay)."""

    def print(self, *objects, **kwargs) -> None:  # noqa: A003
        kwargs.setdefault("highlight", False)
        super().print(*(_inert(o) for o in objects), **kwargs)


def _inert(o: object) -> object:
    if isinstance(o, str):
        o = Text(o)
    if not isinstance(o, Text):
        return o
    s = o.plain
    lead = len(s) - len(s.lstrip("\n"))
    if not UNSAFE.search(s, lead):
        return o
    at = [0] * (len(s) + 1)  # old offset -> new offset: the styles' spans move with the text
    parts = [s[:lead]]
    n = lead
    for i in range(lead, len(s)):
        at[i] = n
        parts.append(plain(s[i]))
        n += len(parts[-1])
    at[len(s)] = n
    t = Text("".join(parts), style=o.style, justify=o.justify, overflow=o.overflow, no_wrap=o.no_wrap, end=o.end)
    for span in o.spans:
        t.stylize(span.style, at[span.start], at[min(span.end, len(s))])
    return t


class OutputError(OracleError):
    """Standard output did not take what was written: closed, on a full disk, or a pipe whose
    reader went away (``| head``). One error line, not a traceback, nor a silent exit 1."""


class _Stdout:
    """What the CLI writes its output through: ``sys.stdout`` (looked up at each call, so tests
    can capture it), with every failure to write turned into an OutputError."""

    @staticmethod
    def _stream():
        if sys.stdout is None:  # started with its stdout closed
            raise OutputError("stdout is closed: the output cannot be written")
        return sys.stdout

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except BrokenPipeError:
            raise OutputError("stdout: the reader went away before the output ended (broken pipe)") from None
        except (OSError, ValueError) as exc:  # a full disk, a closed file
            raise OutputError(f"stdout: cannot write the output ({getattr(exc, 'strerror', None) or exc})") from None

    def write(self, text: str) -> int:
        with self._guard():
            return self._stream().write(text)

    def write_bytes(self, data: bytes) -> None:
        with self._guard():
            stream = self._stream()
            buffer = getattr(stream, "buffer", None)
            if buffer is not None:  # the bytes as they are: a long run's JSON is not copied into a str
                stream.flush()
                buffer.write(data)
            else:
                stream.write(data.decode())

    def flush(self) -> None:
        with self._guard():
            stream = self._stream()
            stream.flush()
            buffer = getattr(stream, "buffer", None)
            if buffer is not None:
                buffer.flush()

    def isatty(self) -> bool:
        return sys.stdout is not None and sys.stdout.isatty()

    def fileno(self) -> int:
        return self._stream().fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", None) or "utf-8"


stdout = _Stdout()
out = _PlainConsole(markup=False, file=stdout)  # type: ignore[arg-type]  # a file-like object: what rich needs of one
err = _PlainConsole(stderr=True, markup=False)

MAX_STEP_DETAILS = 20  # per-step sections printed by analyze: the slowest steps
MAX_STEP_ROWS = 40  # steps table rows printed without --detail: a longer run shows its MAX_STEP_DETAILS slowest
RUN_ANSWER_EVENTS = 4_000_000  # events of the steps the run answer's blame holds at once (at most 12 steps; none beyond)
UNVERIFIED = "[LLM text, not verified: only the what-if edit below was replayed] "
PARSE_OUTPUTS = re.compile(r"graphs\.json|step-\d+\.npz|window\.npz")  # what `parse` writes into its folder
STEP_HELP = (
    "Step to analyse: its ProfilerStep#N number, or 1..N where the steps were cut otherwise (the optimizer's steps, --steps-at) "
    "(repeatable); default: every step in the trace."
)
CONFIG_HELP = "YAML config (see config.yaml); default: built-in defaults."
EXECUTOR_HELP = (
    "Where per-rank parsing and per-step graph building run: local (this machine's cores), dask (a Dask LocalCluster), "
    "or dask://HOST:PORT (a running Dask scheduler; workers read the traces at the same path)."
)
MODEL_HELP = (
    "Also show the graph network's corrected replay and predictions. Off by default: on 112 held-out slowdowns the corrected "
    "replay did not beat the replay times a constant fitted on other launches (benchmarks/model_earned.py)."
)
STEPS_AT_HELP = (
    "Host op name (a shell-style pattern, e.g. 'execute_*') whose every op starts a step, in place of the ProfilerStep "
    "markers: for a loop its own annotations mark. Default: graph.steps_at (the markers; without them, the optimizer's steps)."
)
HOSTS_HELP = (
    "Ranks per host (0..N-1 on the first): align each host's clock to the first's from the collectives "
    "they ran together. Default: graph.ranks_per_host (0, one clock)."
)


def _error(msg: str) -> None:
    """One line on stderr; trace strings in msg are shown as they are, never as markup (and never
    as more than one line: ``_inert``)."""
    try:
        err.print(Text("error: ", style="bold red") + Text(msg), soft_wrap=True)
    except OSError:  # stderr itself is gone: the exit status still says it
        pass


def _fail(msg: str, code: int = 2) -> None:
    _error(msg)
    raise typer.Exit(code)


def _config(path: Path | None, ranks_per_host: int | None = None, steps_at: str | None = None) -> Config:
    cfg = load_config(path)
    if ranks_per_host is not None:
        cfg.graph.ranks_per_host = ranks_per_host
    if steps_at is not None:
        if not steps_at.strip():
            _fail("--steps-at needs a name (a shell-style pattern of host op names, e.g. 'execute_*')")
        cfg.graph.steps_at = steps_at
    return cfg


_dumps = dumps  # (report.step_output: the one --json serialiser, also run by the workers that analyse steps)


def _print_json_spooled(head: dict, spool, tail: dict) -> None:
    """``_print_json`` of ``{**head, "steps": [...], **tail}`` where the steps' JSON is in the
    file ``spool`` (comma-separated): copied to stdout a block at a time, never held whole."""
    write = stdout.write_bytes
    write(_dumps(_with_warnings(head))[:-2] + b',\n  "steps": [\n')
    spool.seek(0)
    while block := spool.read(16 * 2**20):
        write(block)
    write(b"\n  ]")
    for key, value in tail.items():
        write(b",\n  " + orjson.dumps(key) + b": " + _dumps(value))
    write(b"\n}\n")
    stdout.flush()


def _print_json(doc: object) -> None:
    """``--json`` output: orjson (fast on the long critical paths of big steps), indented, one
    trailing newline; a value JSON cannot hold (NaN, infinity) is an error, never invalid JSON."""
    data = _dumps(_with_warnings(doc) if isinstance(doc, dict) else doc)
    stdout.write_bytes(data)
    stdout.write_bytes(b"\n")
    stdout.flush()


def _step_title(step: int | None) -> str:
    """ "Step N", or "Whole trace" for a trace analysed as one window (no ProfilerStep markers)."""
    return "Whole trace" if step is None else f"Step {step}"


def _ms(us: float) -> str:
    return f"{us / 1000:.3f}"


def _step_list(steps: list[int | None]) -> str:
    """ "step 7", "steps 7, 8, 9" (at most ten shown)."""
    shown = [str(s) for s in steps if s is not None]
    more = ", ..." if len(shown) > 10 else ""
    return f"step {shown[0]}" if len(shown) == 1 else f"steps {', '.join(shown[:10])}{more}"


def _model_ms(us: float | None, signed: bool = False) -> str:
    """A graph-network figure in ms, or "out of domain" where the model refused to answer."""
    if us is None:
        return "out of domain"
    return f"{us / 1000:+.3f}" if signed else _ms(us)


def _path_summary(a: StepAnalysis) -> str:
    """One line: where the critical path runs (rank, thread or stream: time), largest first."""
    g = a.graph
    info = g.info
    where: dict[tuple, float] = {}
    for x in a.segments():
        if x.rank >= 0:
            where[(x.rank, x.on_gpu, x.tid)] = where.get((x.rank, x.on_gpu, x.tid), 0.0) + x.dur
    parts = []
    for (rank, gpu, tid), t in sorted(where.items(), key=lambda kv: -kv[1])[:4]:
        place = info.lane_name(rank, tid, gpu)
        parts.append(f"rank {rank} {place} {_ms(t)} ms")
    return "critical path: " + ", ".join(parts) if parts else "critical path: empty"


def _print_summary(
    analyses: list[StepAnalysis], source: str, top: int, rows: list[list] | None = None, n_steps: int = 0, run=None, detail: bool = True
) -> None:
    """The summary of ``analyses``; or, for a run walked step by step, of the steps table ``rows``
    (tables.step_row) of all ``n_steps`` steps with ``analyses`` holding only the slowest. The run
    answer (analysis.answer) first; the sections of single steps only with ``detail``."""
    from bottleneck_oracle.report import tables
    from bottleneck_oracle.report.terminal import print_table

    out.print(Text("BottleneckOracle ", style="bold") + Text(f"{__version__} — {source}"))
    if run is not None:
        for line in run.lines():
            out.print(Text(line), soft_wrap=False)
        _print_step_warnings(analyses if rows is None else analyses, n_steps or len(analyses))
    table = tables.steps_table(analyses, rows)
    if not detail and len(table.rows) > MAX_STEP_ROWS:  # a long run: its slowest steps, the run answer above says the rest
        shown = _slowest([r[3] for r in table.rows])
        table.rows = [table.rows[i] for i in shown]
        table.title += f": the {len(shown)} slowest of {n_steps or len(analyses)} steps (every step: --detail)"
    print_table(out, table)
    if not detail and (n_steps or len(analyses)) > 1:  # a one-step input: the run is that step, shown whole
        out.print(Text("Per-step detail (critical path, top ops, ranks, warnings): --detail"))
        return
    n_steps = n_steps or len(analyses)
    detailed = analyses
    if n_steps > MAX_STEP_DETAILS:
        slowest = sorted(analyses, key=lambda a: -a.step_time)[:MAX_STEP_DETAILS]
        detailed = [a for a in analyses if a in slowest]
        out.print(
            Text(
                f"{n_steps} steps; details below for the {MAX_STEP_DETAILS} slowest (--step N for others, `summary` for every step against the median)"
            )
        )
    for a in detailed:
        label = a.graph.step if a.graph.step is not None else "(whole trace)"
        c = a.graph.summary_counts()
        m = a.graph.info.collectives
        matched = (
            f"; matched {m['by_seq']} by sequence number, {m['by_order']} by order, {m['unmatched_ops']} ops unmatched"
            if c["network_nodes"] and m
            else ""
        )
        out.print(
            Text(f"\nStep {label}", style="bold")
            + Text(
                f": {c['nodes']} nodes ({c['network_nodes']} network, {c['barriers']} barriers{matched}), {c['edges']} edges, "
                f"critical path {len(a.cpm.path)} ops"
            )
        )
        out.print(Text(_path_summary(a)))
        for w in a.warnings():
            if w:
                out.print(Text("warning: " + w, style="yellow"))
        print_table(out, tables.top_ops_table(a, top))
        for t in (tables.comm_table(a), tables.ranks_table(a)):
            if t is not None:
                print_table(out, t)
        s = a.straggler()
        if s and len(a.graph.ranks) > 1:
            out.print(
                f"Straggler: rank {s.rank} (the others waited up to {_ms(s.imposed_wait_us)} ms for it at a collective on the critical path)"
            )


_NUMBER = re.compile(r"[-+]?\d[\d,.]*")


def _baseline_sample(baseline: Path, cfg: Config) -> list:
    """The graphs of a baseline run's steady steps the run answer holds each rank against (at most
    32, spread over the run)."""
    from bottleneck_oracle.analysis.answer import blame_sample

    table = api.load(baseline, ranks_per_host=cfg.graph.ranks_per_host, steps_at=cfg.graph.steps_at)
    numbers: list[int | None] = [*sorted({s.number for s in table.steps})] or [None]
    picked = sorted(n for n in blame_sample(numbers, 32) if n is not None)
    return api.build(baseline, picked or None, cfg)[1]


def _print_step_warnings(analyses: list[StepAnalysis], n_steps: int) -> None:
    """Each kind of step warning once (warnings alike but for their figures are one kind), the
    first step's text as the example, with how many of the steps shown carry it."""
    kinds: dict[str, tuple[str, list]] = {}
    for a in analyses:
        for w in a.warnings():
            text = w.split(": ", 1)[1] if w.startswith("step ") and ": " in w else w
            key = _NUMBER.sub("#", text)
            kinds.setdefault(key, (text, []))[1].append(a.graph.step)
    for text, steps in kinds.values():
        first = "the whole trace" if steps[0] is None else f"step {steps[0]}"
        where = first if len(steps) == 1 else f"{len(steps)} of {len(analyses)} steps; {first}"
        out.print(Text(f"warning ({where}): {text}", style="yellow"))


def _et_line(ets: list[dict]) -> str:
    """One line on how the execution traces joined: per rank, joined of op nodes."""
    joined, total = sum(e["joined"] for e in ets), sum(e["op_nodes"] for e in ets)
    how = sorted({f"rank by {e['rank_from']}, joined by {e['join_rule']}" for e in ets})
    low = [f"rank {e['rank']} {e['joined']}/{e['op_nodes']}" for e in ets if e["joined"] < e["op_nodes"] / 2]
    return (
        f"Execution traces: {len(ets)} file(s), {joined} of {total} ops joined to Kineto ops ({100 * joined / max(total, 1):.1f}%; "
        f"{'; '.join(how)})" + (f"; under half joined: {', '.join(low)}" if low else "")
    )


def _clock_line(hosts: list[HostClock]) -> str:
    """One line on the clock offsets applied per host."""
    moved = [
        f"host {h.host} (ranks {h.ranks[0]}-{h.ranks[-1]}) {h.offset_us / 1000:+.3f} ms (from {h.instances} collectives, spread {h.spread_us:.0f} us)"
        for h in hosts[1:]
    ]
    return f"Clocks: {len(hosts)} host(s), aligned to host {hosts[0].host}: " + ("; ".join(moved) or "nothing to align")


def _check_overlay_input(path: Path, table, perfetto: Path | None) -> None:
    if perfetto and table is None:
        _fail(f"{path}: --perfetto marks the critical path in a Kineto trace; Chakra ET input has none to annotate")


def _json_head(path: Path, table) -> dict:
    from bottleneck_oracle.analysis.checks import run_warnings
    from bottleneck_oracle.graph_pipeline.facts import run_facts

    run = run_facts(table) if table is not None else None
    return {
        "version": __version__,
        "input": str(path),
        "ranks": table.ranks if table else [],
        "run_facts": run.to_dict() if run is not None else None,
        "run_warnings": run_warnings(run),
    }


def _json_tail(table) -> dict:
    """What ``--json`` says of the whole input after its steps: execution traces, clocks."""
    tail = {}
    if table is not None and table.execution_traces:
        tail["execution_traces"] = table.execution_traces
    if table is not None and table.clocks is not None:
        tail["clocks"] = table.clocks
    return tail


def _print_table_lines(table) -> None:
    """The terminal's lines on the whole input after the steps: execution traces, clocks."""
    if table is not None and table.execution_traces:
        out.print(Text(_et_line(table.execution_traces)))
    if table is not None and table.clocks is not None and table.clocks.hosts:
        out.print(Text(_clock_line(table.clocks.hosts)))


class _Spool:
    """An unlinked temporary file for --json's steps; a temporary folder that is full or read-only
    is one OracleError saying so (not a bare "No space left on device")."""

    def __enter__(self) -> _Spool:
        with self._guard():
            self.file = tempfile.TemporaryFile(prefix="bottleneck-oracle-")  # noqa: SIM115 - closed in __exit__
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            where = tempfile.gettempdir()
            raise OracleError(
                f"{where}: cannot spool the --json output there ({exc.strerror or exc}); set TMPDIR to a folder with room"
            ) from None

    def write(self, data: bytes) -> None:
        with self._guard():
            self.file.write(data)

    def seek(self, pos: int) -> None:
        with self._guard():
            self.file.seek(pos)

    def read(self, n: int) -> bytes:
        with self._guard():
            return self.file.read(n)


def _analyze_stepwise(
    path: Path,
    steps,
    cfg: Config,
    et,
    executor: str,
    k: int,
    as_json: bool,
    perfetto: Path | None,
    detail: bool,
    references=None,
    full_path: bool = False,
) -> None:
    """``analyze`` without --html / --advise, one step at a time: each step leaves its JSON
    (spooled to a temporary file, printed once everything succeeded) or its steps-table row, and
    its critical events for --perfetto, computed where the step is built (analysis.stepwise); the
    terminal keeps the analyses of the slowest steps only."""
    from bottleneck_oracle.analysis.answer import MAX_BLAME_STEPS, answer_from, blame_sample
    from bottleneck_oracle.report.perfetto import write_overlay_paths
    from bottleneck_oracle.report.step_output import Wanted, output_of

    wanted = Wanted(json_top=k if as_json else None, full_path=full_path, row=not as_json, critical=perfetto is not None)
    sel: dict[str, Any] = {}

    def keep(numbers: list[int | None], table: EventTable | None) -> frozenset[int | None]:
        """The steps kept whole: those the run answer's blame replays (as many as RUN_ANSWER_EVENTS
        of events allow: none where a step is too large to hold beside the rest), and on the
        terminal every step of a short run."""
        per_step = len(table) / max(len(numbers), 1) if table is not None else 0.0
        n_blamed = min(MAX_BLAME_STEPS, int(RUN_ANSWER_EVENTS // max(per_step, 1.0)))
        sel["numbers"], sel["per_step"], sel["n_blamed"] = numbers, per_step, n_blamed
        sel["picked"] = blame_sample(list(numbers), n_blamed) if n_blamed else set()
        return frozenset(sel["picked"] | (set(numbers) if not as_json and len(numbers) <= MAX_STEP_DETAILS else set()))

    with _progress(f"reading {path}"):
        table, stream = api.analyze_map(path, partial(output_of, wanted), steps, cfg, et, executor, keep)
    _check_overlay_input(path, table, perfetto)
    numbers, picked = sel["numbers"], sel["picked"]
    rows, times, kept, paths, figures, blamed = [], [], {}, [], [], []
    with _Spool() if as_json else nullcontext() as spool, _progress(f"analysing {path}", len(numbers)) as bar:
        for n, (o, a) in enumerate(stream):
            figures.append(o.figures)
            if a is not None and o.step in picked:
                blamed.append(a)
            if spool is not None:  # --json
                assert o.json is not None
                spool.write((b",\n" if n else b"") + o.json)
            elif o.row is not None:
                rows.append(o.row)
                times.append(o.step_time)
                if a is not None:
                    kept[o.step] = a
            if perfetto and o.critical is not None:
                paths.append(o.critical)
            bar(n + 1)
        if perfetto and table is not None:  # (_check_overlay_input: a Chakra input has no table to overlay)
            with _progress(f"writing {perfetto}"):
                write_overlay_paths(table, paths, perfetto, gz=perfetto.name.endswith(".gz"))
        per_step = sel["per_step"]
        two = api.two_step_graphs(table, cfg) if per_step <= api.MULTI_STEP_EVENTS else None
        run = answer_from(figures, blamed, str(path), references, two)
        if not sel["n_blamed"] and len(table.ranks if table is not None else []) > 1:
            run.notes.append(
                f"No region search: {per_step:,.0f} events a step are too many to hold a step beside the run "
                "(blame --step N looks at one step)"
            )
        elif two is None and run.region is not None:
            run.notes.append(f"The saving is replayed in one step ({per_step:,.0f} events a step: too many to replay two at once)")
        if spool is not None:
            _print_json_spooled({**_json_head(path, table), "run": run}, spool, _json_tail(table))
            return
    slowest = _slowest(times)
    shown = [kept[numbers[i]] if numbers[i] in kept or table is None else api.step_analysis(table, numbers[i], cfg) for i in slowest]
    _print_summary(shown, str(path), k, rows, len(rows), run, detail)
    _print_table_lines(table)
    if perfetto:
        out.print(f"Perfetto trace: {perfetto}", highlight=False)


def _slowest(times: list[float]) -> list[int]:
    """Positions of the MAX_STEP_DETAILS slowest steps (the earlier of equal ones), in step order."""
    kept: list[int] = []
    for i in range(len(times)):
        kept.append(i)
        if len(kept) > MAX_STEP_DETAILS:  # keep the slowest (first ones on ties), in step order
            del kept[min(range(len(kept)), key=lambda j: (times[kept[j]], -j))]
    return kept


@contextmanager
def _progress(what: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for work that lasts more than PROGRESS_AFTER_S (rich's, shown only
    when stderr is a terminal, gone when the work ends); yields ``advance(done)``."""
    if not err.is_terminal:
        yield lambda done: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    bar = Progress(*columns, console=err, transient=True, auto_refresh=True)
    task = bar.add_task(shorten(plain(what), 80), total=total)
    t0 = time.monotonic()
    timer = threading.Timer(PROGRESS_AFTER_S, bar.start)  # a short job prints nothing
    timer.daemon = True
    timer.start()

    def advance(done: int) -> None:
        bar.update(task, completed=done)

    try:
        yield advance
    finally:
        timer.cancel()
        if time.monotonic() - t0 >= PROGRESS_AFTER_S:
            bar.stop()


PROGRESS_AFTER_S = 2.0  # seconds of work before a progress bar is shown


@app.command(rich_help_panel=ANALYSIS)
def analyze(
    path: Path = typer.Argument(..., metavar="PATH", help="A trace file (.json / .json.gz) or a folder of per-rank trace files."),
    step: list[int] = typer.Option(None, "--step", "-s", metavar="N", help=STEP_HELP),
    html: Path = typer.Option(None, "--html", metavar="PATH", help="Write a self-contained HTML report here."),
    perfetto: Path = typer.Option(
        None, "--perfetto", metavar="PATH", help="Write the trace with the critical path marked (opens in Perfetto)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON instead of the tables."),
    full_path: bool = typer.Option(
        False, "--full-path", help="In --json, each step's critical path segment by segment (default: its --top longest segments)."
    ),
    top: int = typer.Option(
        None, "--top", min=1, metavar="N", help="How many ops to list by critical-path time (default from config: 20)."
    ),
    et: Path = typer.Option(
        None,
        "--et",
        metavar="PATH",
        help="The run's PyTorch execution trace (file, or folder of rank-N files): adds tensor data dependencies.",
    ),
    with_advice: bool = typer.Option(
        False, "--advise", help="Add the blame and the validated advice of every step (also to --html and --json)."
    ),
    use_model: bool = typer.Option(False, "--model/--no-model", help=MODEL_HELP),
    detail: bool = typer.Option(False, "--detail", help="Also print each step's critical path, top ops, ranks and warnings."),
    baseline: Path = typer.Option(
        None,
        "--baseline",
        metavar="PATH",
        help="A run of the same job as it normally runs: the run answer holds each rank against its steps (needed where ranks have no peers: pipeline stages).",
    ),
    config: Path = typer.Option(None, "--config", metavar="PATH", help=CONFIG_HELP),
    ranks_per_host: int = typer.Option(None, "--ranks-per-host", metavar="N", min=0, help=HOSTS_HELP),
    steps_at: str = typer.Option(None, "--steps-at", metavar="NAME", help=STEPS_AT_HELP),
    executor: str = typer.Option("local", "--executor", metavar="local|dask|dask://HOST:PORT", help=EXECUTOR_HELP),
) -> None:
    """Step time, critical path, slack and per-rank skew of every step in PATH.

    PATH is a Kineto/Chrome trace (.json, .json.gz), a folder of per-rank traces, or
    MLCommons Chakra ET files (.et)."""
    cfg = _config(config, ranks_per_host, steps_at)
    k = top or cfg.analysis.top_k
    # before the analysis: a wrong output path fails at once, and no output replaces an input
    guard_outputs({"--html": html, "--perfetto": perfetto}, [path, et, config, baseline])
    references = _baseline_sample(baseline, cfg) if baseline is not None else None
    if not (html or with_advice):  # step by step: a long run's graphs are never all held
        _analyze_stepwise(path, step or None, cfg, et, executor, k, as_json, perfetto, detail, references, full_path)
        return
    with err.status(f"analysing {path} ...", spinner="dots") if not as_json and err.is_terminal else nullcontext():
        table, analyses = api.analyze(path, step or None, cfg, et, executor)
    _check_overlay_input(path, table, perfetto)
    from bottleneck_oracle.analysis.answer import run_answer

    run = run_answer(analyses, str(path), references, api.two_step_graphs(table, cfg))
    extras: dict[int | None, StepAdvice] = {}
    if with_advice:
        with err.status("blame and advice ...", spinner="dots") if not as_json and err.is_terminal else nullcontext():
            rows = api.advise_graphs(
                table, analyses, [a.graph for a in analyses], use_model=use_model, windows=api.steady_windows(table, cfg)
            )
        extras = {r.step: r for r in rows}
    if html or perfetto:  # both written, or neither: a failure leaves nothing behind
        with atomic_paths(html, perfetto) as (html_tmp, perfetto_tmp):
            if html_tmp is not None:
                from bottleneck_oracle.report.html import write_report

                write_report(analyses, str(path), html_tmp, k, extras, run, warnings=list(_SAID))
            if perfetto_tmp is not None and table is not None:
                from bottleneck_oracle.report.perfetto import write_overlay

                write_overlay(table, analyses, perfetto_tmp, gz=perfetto.name.endswith(".gz"))
    if as_json:
        doc = {**_json_head(path, table), "run": run, "steps": [a.to_dict(k, full_path) for a in analyses], **_json_tail(table)}
        for s_doc in doc["steps"]:
            if s_doc["step"] in extras:
                x = extras[s_doc["step"]]
                s_doc["blame"] = to_json(x.blame)
                s_doc["advice"] = {**to_json_object(x.advice), "references": x.references, "steady": x.steady}
        _print_json(doc)
        return
    _print_summary(analyses, str(path), k, run=run, detail=detail)
    _print_table_lines(table)
    from bottleneck_oracle.analysis.blame import noise_floor

    if len(extras) > 1:  # the advice once for the run; each step's only with --detail
        from bottleneck_oracle.llm.graphrag import run_advice

        overall = run_advice([x.advice for x in extras.values()], [x.steady for x in extras.values()])
        if overall:
            _print_run_advice(overall, len(extras))
    for step_no, x in extras.items():
        top_b = [n for n in x.blame.nodes[:3] if n.saving_us >= noise_floor(x.blame.makespan)]  # below: noise, none
        if top_b:
            out.print(
                Text(
                    f"{_step_title(step_no)} blame: "
                    + "; ".join(f"{shorten(n.name, 70)} (rank {n.rank}) {_ms(n.saving_us)} ms" for n in top_b)
                )
            )
        if x.blame.regions:
            out.print(
                Text(
                    f"{_step_title(step_no)} regions: "
                    + "; ".join(
                        f"{shorten(label, 50)} (rank {r.rank}) {_ms(r.saving_us)} ms"
                        for r, label in zip(x.blame.regions[:3], region_labels(x.blame.regions[:3]))
                    )
                )
            )
        for sug in x.advice.suggestions[:3] if detail or len(extras) == 1 else []:
            out.print(
                Text(
                    f"{_step_title(step_no)} advice: {sug.title} — replay saves {_ms(sug.replay_saving_us)} ms if we "
                    f"{'; '.join(sug.edits_in_words or sug.changes)} ({'; '.join(sug.changes)})"
                )
            )
    for label, target in (("HTML report", html), ("Perfetto trace", perfetto)):
        if target:
            out.print(f"{label}: {target}", highlight=False)


@app.command(rich_help_panel=ANALYSIS)
def parse(
    path: Path = typer.Argument(None, metavar="PATH", help="A trace file, a folder of per-rank trace files, or Chakra ET files."),
    input_: Path = typer.Option(None, "--input", "-i", metavar="PATH", hidden=True, help="The same as PATH (older spelling)."),
    output: Path = typer.Option(
        None,
        "--output",
        "-o",
        metavar="DIR",
        help="Folder for the graphs (step-N.npz) and graphs.json, written as a whole; a previous parse's folder is replaced "
        "(default: paths.graphs of the config).",
    ),
    step: list[int] = typer.Option(None, "--step", "-s", metavar="N", help=STEP_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    config: Path = typer.Option(None, "--config", metavar="PATH", help=CONFIG_HELP),
    ranks_per_host: int = typer.Option(None, "--ranks-per-host", metavar="N", min=0, help=HOSTS_HELP),
    steps_at: str = typer.Option(None, "--steps-at", metavar="NAME", help=STEPS_AT_HELP),
    executor: str = typer.Option("local", "--executor", metavar="local|dask|dask://HOST:PORT", help=EXECUTOR_HELP),
) -> None:
    """Build the ExecutionGraph of every step and save it (plain arrays, no pickles)."""
    if (path is None) == (input_ is None):
        _fail("parse takes one trace PATH" if path is None else "give the trace as PATH or --input, not both")
    source = path or input_
    cfg = _config(config, ranks_per_host, steps_at)
    output = output or Path(cfg.paths.graphs)
    guard_output_folder("--output", output, [source, config])
    guard_outputs({"--output": output / "graphs.json"}, [source, config])
    check_folder_target(output, PARSE_OUTPUTS)  # before the work: a folder of other things is not replaced
    _, graphs = api.build(source, step or None, cfg, None, executor)
    entries: list[dict[str, Any]] = []
    with atomic_folder(output, PARSE_OUTPUTS) as staged:  # all of it, or (killed, disk full) nothing
        for g in graphs:
            name = f"step-{g.step}.npz" if g.step is not None else "window.npz"
            g.save(staged / name)
            entries.append({"file": name, "step": g.step, "ranks": g.ranks, "measured_us": g.measured, **g.summary_counts()})
        manifest = {"version": __version__, "input": str(source), "graphs": entries}
        (staged / "graphs.json").write_text(json.dumps(manifest, indent=1))
    if as_json:
        _print_json(manifest)
    else:
        for e in entries:
            out.print(f"{output / e['file']}: {e['nodes']} nodes, {e['edges']} edges, ranks {e['ranks']}", highlight=False)


@app.command(rich_help_panel=DEVELOPER)
def generate(
    config: Path = typer.Option(Path("config.yaml"), "--config", metavar="PATH", help="Config whose grid section says what to record."),
    out_dir: Path = typer.Option(
        None, "--out", "-o", metavar="PATH", help="Folder for the runs and manifest.jsonl (default: paths.raw of the config)."
    ),
    paired: bool = typer.Option(
        False,
        "--paired",
        help="Record paired conditions instead: a slowdown in every step of a block between clean blocks (DP and PP layouts).",
    ),
    block: int = typer.Option(3, "--block", min=2, metavar="N", help="--paired: profiled steps per block (the first of each is dropped)."),
    repeats: int = typer.Option(6, "--repeats", min=1, metavar="N", help="--paired: slowed blocks per condition, each between clean ones."),
    bound: float = typer.Option(
        0.05,
        "--bound",
        min=0.0,
        metavar="FRACTION",
        help="--paired: re-record a launch whose clean blocks differ by more than this (median), then each condition still above it, alone.",
    ),
    retries: int = typer.Option(
        1, "--retries", min=0, metavar="N", help="--paired: re-recordings of a launch, and of a condition, above the bound, at most."
    ),
    knobs: bool = typer.Option(
        True,
        "--knobs/--no-knobs",
        help="--paired: also record knob changes (batch, sequence length, DDP bucket size, accumulation, checkpointing, micro-batches) as alternating launches (knobs.jsonl).",
    ),
    device: str = typer.Option(
        "cpu",
        "--device",
        metavar="cpu|cuda",
        help="--paired: where the DP job runs (cuda: every rank on a GPU, gloo through host memory; the pipeline stays on CPU).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Record the grid of profiled runs with injected delays (resumes: finished runs are skipped).

    With --paired: persistent conditions (stall, extra compute, slow collective, slow rank; every
    rank and delay of the grid), each in short blocks of steps interleaved with clean blocks of
    the same launch, ranks pinned to cores; paired.jsonl gets each condition's measured saving and the noise
    floor of its launch. A condition whose clean blocks differ by more than --bound is recorded
    again alone, and that recording replaces it (run again on a finished folder to apply a new bound). Then knob changes (batch, sequence length, DDP bucket size,
    gradient accumulation, activation checkpointing, micro-batches at the same global batch), each as launches alternating with its base setting; knobs.jsonl gets each
    change's measured step-time change and noise floor."""
    with _needs_lab():
        from bottleneck_oracle_lab.systems.generate import generate as run_grid

    cfg = _config(config)
    target = out_dir or Path(cfg.paths.raw)
    if paired:
        from bottleneck_oracle_lab.systems.paired import default_knobs, default_launches, generate_knobs, generate_paired

        if device not in ("cpu", "cuda"):
            raise OracleError(f"--device must be cpu or cuda (found {device!r})")
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise OracleError("--device cuda: torch sees no CUDA GPU on this machine")
        layouts = [x for x in cfg.grid.layouts if x.startswith(("dp2", "pp2"))]
        if device == "cuda":
            layouts = [x for x in layouts if x.startswith("dp")]
        if not layouts:
            raise OracleError(
                f"{config}: --paired records dp2 and pp2 layouts (dp2 only on cuda); grid.layouts has none of them ({cfg.grid.layouts})"
            )
        launches = default_launches(
            cfg.grid.sizes,
            layouts,
            cfg.grid.delays_ms,
            block=block,
            repeats=repeats,
            batch=cfg.grid.batch,
            seed=cfg.grid.seed,
            device=device,
        )
        with _recording_bar("launches", len(launches), as_json) as advance:
            summary = generate_paired(launches, target, bound=bound, retries=retries, progress=advance)
        if knobs and device == "cpu":
            changes = default_knobs(cfg.grid.sizes, layouts, batch=cfg.grid.batch, seed=cfg.grid.seed)
            with _recording_bar("knob changes", len(changes), as_json) as advance:
                summary["knobs"] = generate_knobs(changes, target, bound=bound, retries=retries, progress=advance)
        if as_json:
            _print_json(summary)
        else:
            out.print(
                f"{summary['recorded']} launches recorded, {summary['skipped']} already done; {summary['conditions']} conditions in "
                f"{summary['manifest']}; noise floor: clean blocks' spread {100 * (summary['median_clean_spread'] or 0):.1f}%, "
                f"clean vs clean {100 * (summary['median_clean_vs_clean'] or 0):.1f}% (medians); {summary['rerecorded_conditions']} conditions "
                f"taken from their lone re-recording, {summary['noisy_conditions']} still above the bound",
                highlight=False,
            )
            if "knobs" in summary:
                k = summary["knobs"]
                out.print(
                    f"{k['recorded']} knob changes recorded, {k['skipped']} already done, in {k['manifest']}; base launches differ by "
                    f"{100 * (k['median_clean_vs_clean'] or 0):.1f}% (median); {k['noisy']} above the bound",
                    highlight=False,
                )
        return
    with _recording_bar("runs", None, as_json) as progress:
        summary = run_grid(cfg.grid, target, progress)
    if as_json:
        _print_json(summary)
    else:
        out.print(
            f"{summary['recorded']} runs recorded, {summary['skipped']} already done; "
            f"{summary['steps']} profiled steps ({summary['perturbed_steps']} perturbed) in {summary['manifest']}",
            highlight=False,
        )


LAB_MISSING = (
    "the developer commands (generate, build-dataset, train, eval) are the lab's: pip install -e lab/ (in a clone of the repository)"
)


@contextmanager
def _needs_lab() -> Iterator[None]:
    """Around the lazy imports of a developer command: the lab not installed is one error line."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "bottleneck_oracle_lab":
            raise
        raise OracleError(LAB_MISSING) from None


@contextmanager
def _recording_bar(what: str, total: int | None, quiet: bool) -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar on stderr for a recording, and its callback (id now recording, done, total)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, disable=quiet
    ) as bar:
        task = bar.add_task(what, total=total)

        def advance(now: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=now or "done")

        yield advance


@app.command("build-dataset", rich_help_panel=DEVELOPER)
def build_dataset_cmd(
    raw: Path = typer.Argument(None, metavar="RAW", help="Folder written by `generate` (default: paths.raw of the config)."),
    out_dir: Path = typer.Option(
        None, "--out", "-o", metavar="PATH", help="Folder for the samples and dataset.jsonl (default: paths.graphs)."
    ),
    config: Path = typer.Option(None, "--config", metavar="PATH", help=CONFIG_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Turn generated runs into labelled PyG graphs (one per profiled step) with train/val/test and OOD splits."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with _needs_lab():
        from bottleneck_oracle_lab.training.dataset import build_dataset

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
        _print_json(summary)
    else:
        out.print(
            f"{summary['samples']} graphs ({summary['perturbed']} with injected culprits), held out {summary['held_out']}; {summary['dataset']}",
            highlight=False,
        )


@app.command(rich_help_panel=DEVELOPER)
def train(
    config: Path = typer.Option(Path("config.yaml"), "--config", metavar="PATH", help=CONFIG_HELP),
    dataset: Path = typer.Option(None, "--dataset", metavar="PATH", help="Folder written by `build-dataset` (default: paths.graphs)."),
    out_dir: Path = typer.Option(
        None, "--out", "-o", metavar="PATH", help="Folder for the checkpoints, one per split (default: paths.checkpoints)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Train the HeteroGAT variants, the MLP and XGBoost on a built dataset: one checkpoint per split."""
    with _needs_lab():
        from bottleneck_oracle_lab.training.train import train as run_train

    cfg = _config(config)
    with err.status("training") as status:
        summary = run_train(
            dataset or Path(cfg.paths.graphs),
            out_dir or Path(cfg.paths.checkpoints),
            cfg.models,
            None if as_json else (lambda msg: status.update(msg)),
        )
    if as_json:
        _print_json(summary)
        return
    for split, info in summary["checkpoints"].items():
        epochs = ", ".join(f"{v} {e}" for v, e in info["epochs"].items())
        out.print(
            f"{split}: {info['path']} in {info['seconds']:.0f} s — {info['train_whatif']} what-if + {info['train_graphs']} graphs to train on, "
            f"{info['test_whatif']} what-if held out; epochs: {epochs}",
            highlight=False,
        )


@app.command("eval", rich_help_panel=DEVELOPER)
def evaluate(
    checkpoint: Path = typer.Option(
        ..., "--checkpoint", metavar="PATH", help="A checkpoint written by `train`, or the folder of them (one per split)."
    ),
    dataset: Path = typer.Option(None, "--dataset", metavar="PATH", help="Folder written by `build-dataset` (default: paths.graphs)."),
    config: Path = typer.Option(None, "--config", metavar="PATH", help=CONFIG_HELP),
    markdown: Path = typer.Option(None, "--markdown", metavar="PATH", help="Also write the table as Markdown to this file."),
    json_file: Path = typer.Option(None, "--json-file", metavar="PATH", help="Also write the results as JSON to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Every model and baseline side by side per split: what-if against the measured re-runs, slack ρ, critical F1, speed."""
    with _needs_lab():
        from bottleneck_oracle_lab.training.eval import COLUMNS, rows_of, to_markdown
        from bottleneck_oracle_lab.training.eval import evaluate as run_eval

    cfg = _config(config)
    guard_outputs({"--markdown": markdown, "--json-file": json_file}, [checkpoint, dataset, config])
    with err.status("evaluating"):
        result = run_eval(checkpoint, dataset or Path(cfg.paths.graphs))
    if markdown:
        with atomic_path(markdown) as tmp:
            tmp.write_text(to_markdown(result))
    if json_file:
        with atomic_path(json_file) as tmp:
            tmp.write_text(json.dumps(result, indent=1) + "\n")
    if as_json:
        _print_json(result)
        return
    t = Table(title="What-if against measured re-runs (held-out part of each split)")
    for col in ["split", "model"] + [c[1] for c in COLUMNS]:
        t.add_column(col, justify="left" if col in ("split", "model") else "right")
    for r in rows_of(result):
        t.add_row(*r)
    out.print(t)


@app.command(rich_help_panel=ANALYSIS)
def whatif(
    trace: Path = typer.Argument(..., metavar="PATH", help="A trace file (.json / .json.gz) or a folder of per-rank trace files."),
    edit: list[str] = typer.Option(
        None,
        "--edit",
        "-e",
        metavar="EDIT",
        help="Edit, repeatable: selectors id=N[+M..], name=EXACT|GLOB and name~=SUBSTRING (ops as analyze lists them, an enclosing op's "
        "own time between its children included), rank=R, cat=CATEGORY, coll=KIND, max_us=US, min_bytes=B (collectives moving B bytes or more), "
        "phase=forward|backward|optimizer, module=NAME|GLOB (ops inside that range, e.g. an nn.Module's), gap=1 (the untraced time around the ops); changes scale=F, delay_ms=MS, detach=1. "
        'E.g. "name~=all_reduce,rank=1,scale=0.5"; every edit must select something (see docs/commands/whatif.md).',
    ),
    step: list[int] = typer.Option(None, "--step", "-s", metavar="N", help=STEP_HELP),
    knob: list[str] = typer.Option(
        None,
        "--set",
        metavar="KNOB=VALUE",
        help="A configuration change, repeatable: batch=OLD:NEW or batch=xRATIO (sequences per rank or per micro-batch), seq=OLD:NEW "
        "(sequence length), accum=N (gradient accumulation), checkpoint=on|off (activation checkpointing), bucket_mb=OLD:NEW "
        "(DDP's gradient bucket), microbatches=N (a pipeline's, same global batch). The step's graph is edited to match and "
        "replayed (see docs/commands/whatif.md).",
    ),
    microbatches: int = typer.Option(
        None,
        "--microbatches",
        min=1,
        help="Pipeline steps: re-split the batch into this many micro-batches (the same as --set microbatches=N).",
    ),
    batch: float = typer.Option(
        None,
        "--batch",
        metavar="RATIO",
        help="Scale the batch by this ratio (e.g. 2): the same as --set batch=xRATIO.",
    ),
    checkpoint: Path = typer.Option(
        None,
        "--checkpoint",
        metavar="PATH",
        help="Model checkpoint, a .pt (its .npz beside it is read without torch) or the .npz (default: the pretrained one shipped with the package).",
    ),
    use_model: bool = typer.Option(False, "--model/--no-model", help=MODEL_HELP),
    config: Path = typer.Option(None, "--config", metavar="PATH", help=CONFIG_HELP),
    ranks_per_host: int = typer.Option(None, "--ranks-per-host", metavar="N", min=0, help=HOSTS_HELP),
    steps_at: str = typer.Option(None, "--steps-at", metavar="NAME", help=STEPS_AT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Predict the step time after changing op durations or the job's configuration: the exact replay of the edited graph
    (in steady state, over the steps before it too, where the device's full launch queue paced the host)."""
    edit = edit or []
    knob = knob or []
    with _progress(f"replaying {trace}"):
        rows = api.whatif(
            trace,
            edit,
            step or None,
            _config(config, ranks_per_host, steps_at),
            checkpoint,
            use_model or checkpoint is not None,
            microbatches,
            batch,
            knobs=knob,
        )
    if as_json:
        _print_json({"trace": str(trace), "edits": edit, "set": knob, "steps": to_json(rows)})
        return
    from bottleneck_oracle.report.tables import Column, TableModel
    from bottleneck_oracle.report.terminal import print_table

    variants = list(rows[0].model.step_us) if rows and rows[0].model is not None else []
    corrected = any(r.corrected is not None and r.corrected.delta_us is not None for r in rows)
    spread = any(r.knobs_interval_us is not None for r in rows)
    described = rows[0].knobs if rows else []
    title = "; ".join(edit + described)
    t = TableModel(
        f"What-if: {title}",
        [Column("step", "key"), Column("edited"), Column("before", "ms"), Column("replay", "ms"), Column("Δ replay", "signed_ms")]
        + ([Column("90% interval", "text")] if spread else [])
        + ([Column("Δ corrected", "text"), Column("90% interval", "text")] if corrected else [])
        + [Column(f"{v}", "text") for v in variants]
        + [Column(f"Δ {v}", "text") for v in variants],
        caption="step times in ms; before: the step's time as analyze gives it (its period); Δ: the edited replay against the unedited one"
        + ("; 90% interval: of the step time after the configuration change, from recorded re-runs" if spread else "")
        + ("; corrected: the replay with per-node duration corrections learned from paired re-runs" if corrected else "")
        + ("; the model's: its edited against its unedited prediction" if variants else ""),
    )

    def label(r: StepWhatIf) -> str:
        return "whole trace" if r.step is None else str(r.step)

    def where(r: StepWhatIf) -> str:
        return "whole trace" if r.step is None else f"step {r.step}"

    for r in rows:
        m = r.model
        predicted = [_model_ms(m.step_us[v]) for v in variants] if m else []
        effects = [_model_ms(m.delta_us[v], signed=True) for v in variants] if m else []
        c = r.corrected
        fixes = []
        if corrected:
            if c is not None and c.delta_us is not None and c.interval_us is not None:
                fixes = [_model_ms(c.delta_us, signed=True), f"{c.interval_us[0] / 1000:+.3f} .. {c.interval_us[1] / 1000:+.3f}"]
            else:
                fixes = [_model_ms(None), "—"]
        iv = r.knobs_interval_us
        bounds = ([f"{iv[0] / 1000:.3f} .. {iv[1] / 1000:.3f}" if iv else "—"]) if spread else []
        t.rows.append([label(r), _edited(r), r.step_us, r.replay.step_us, r.replay.delta_us, *bounds, *fixes, *predicted, *effects])
    print_table(out, t)
    for r in rows:
        if r.corrected is not None and r.corrected.out_of_domain:
            out.print(Text(f"{where(r)}: corrections {r.corrected.out_of_domain}; the replay is the answer"))
            break
    for r in rows:
        if r.model is not None and r.model.out_of_domain:
            out.print(Text(f"{where(r)}: graph network {r.model.out_of_domain}; the replay is the answer"))
            break
    steady = [r for r in rows if r.steady is not None]
    if steady:
        alone = [r.steady.one_step_us for r in steady if r.steady is not None]
        out.print(
            Text(
                f"{_step_list([r.step for r in steady])}: a step's work carries into the next (its device began it still running "
                f"earlier steps' work, or its ranks meet at collectives), so the replay is of the steady state: the edits in the step and up to {max(r.steady.steps for r in steady if r.steady is not None) - 1} "
                f"before it, replayed together (in the step's own window alone, where earlier steps' work keeps its recorded "
                f"times: {_ms(min(alone))}{'' if max(alone) - min(alone) < 1 else f'-{_ms(max(alone))}'} ms); the critical "
                "paths below are of the steps replayed together"
                + (
                    f". Their mean change: {sum(r.replay.delta_us for r in steady) / len(steady) / 1000:+.3f} ms a step (one step's "
                    "period can rise while the next's falls where the host's steps vary: the mean is the loop's)"
                    if len(steady) > 1
                    else ""
                )
            )
        )
    if knob or microbatches or batch:
        out.print(
            "configuration changes: each op's fixed part stays and its work scales with the shapes it processes; how close that "
            "came on recorded CPU re-runs, per knob: docs/accuracy/reruns.md#knob-changes",
            highlight=False,
        )
    for r in rows:
        if r.microbatches is not None:
            mbx = r.microbatches
            out.print(
                f"{where(r)}: {mbx.old} -> {mbx.new} micro-batches over {mbx.stages} stages: "
                f"{mbx.formula_delta_us / 1000:+.3f} ms by the {mbx.schedule.upper()} schedule (included in the replay) -> {_ms(mbx.step_us)} ms",
                highlight=False,
            )
        cp = r.critical_path
        if cp.joined or cp.left:
            joined = ", ".join(f"{shorten(x.name, 50)} (rank {x.rank})" for x in cp.joined[:5]) or "—"
            left = ", ".join(f"{shorten(x.name, 50)} (rank {x.rank})" for x in cp.left[:5]) or "—"
            out.print(Text(f"{where(r)}: critical path {cp.nodes_before} -> {cp.nodes_after} nodes; joined: {joined}; left: {left}"))
        else:
            out.print(f"{where(r)}: critical path unchanged ({cp.nodes_after} nodes)", highlight=False)


def _edited(r: StepWhatIf) -> str:
    """What an edit changed, in words: nodes, untraced gaps, removed dependencies."""
    parts = [
        f"{r.edited_nodes} ops" if r.edited_nodes else "",
        f"{r.edited_own} ops' own time" if r.edited_own else "",
        f"{r.edited_gaps} gaps" if r.edited_gaps else "",
        f"{r.detached_edges} deps removed" if r.detached_edges else "",
        f"{r.microbatches.old} -> {r.microbatches.new} micro-batches" if r.microbatches is not None else "",
    ]
    return ", ".join(p for p in parts if p) or "nothing"


@app.command(rich_help_panel=ANALYSIS)
def blame(
    trace: Path = typer.Argument(..., metavar="PATH", help="A trace file (.json / .json.gz) or a folder of per-rank trace files."),
    baseline: Path = typer.Option(
        None, "--baseline", metavar="PATH", help="A trace of the same job as it normally runs (default: the trace's other steps)."
    ),
    step: list[int] = typer.Option(None, "--step", "-s", metavar="N", help=STEP_HELP),
    top: int = typer.Option(
        None, "--top", min=1, metavar="N", help="How many nodes and op kinds to list (default from config: 20, as analyze)."
    ),
    checkpoint: Path = typer.Option(
        None,
        "--checkpoint",
        metavar="PATH",
        help="Model checkpoint, a .pt (its .npz beside it is read without torch) or the .npz (default: the pretrained one shipped with the package).",
    ),
    use_model: bool = typer.Option(False, "--model/--no-model", help=MODEL_HELP),
    config: Path = typer.Option(None, "--config", metavar="PATH", help=CONFIG_HELP),
    ranks_per_host: int = typer.Option(None, "--ranks-per-host", metavar="N", min=0, help=HOSTS_HELP),
    steps_at: str = typer.Option(None, "--steps-at", metavar="NAME", help=STEPS_AT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Who is to blame: nodes, ranks and op kinds ranked by the step time restoring them to typical saves."""
    cfg = _config(config, ranks_per_host, steps_at)
    with _progress(f"blaming {trace}"):
        rows = api.blame(trace, baseline, step or None, cfg, top or cfg.analysis.top_k, checkpoint, use_model or checkpoint is not None)
    if as_json:
        _print_json({"trace": str(trace), "baseline": str(baseline) if baseline else None, "steps": to_json(rows)})
        return
    from bottleneck_oracle.report.tables import Column, TableModel, regions_table
    from bottleneck_oracle.report.terminal import print_table

    if len(rows) > MAX_STEP_DETAILS:  # a long run: the steps with the most to explain, not thousands of tables
        out.print(
            f"{len(rows)} steps; below the {MAX_STEP_DETAILS} with the most to explain (--step N for others, --json for every step)",
            highlight=False,
        )
        keep = {id(r) for r in sorted(rows, key=lambda r: -r.blame.excess)[:MAX_STEP_DETAILS]}
        rows = [r for r in rows if id(r) in keep]
    for r in rows:
        b = r.blame
        out.print(
            Text(_step_title(r.step), style="bold")
            + Text(
                f": {_ms(b.makespan)} ms"
                + (
                    f" (its period; its host's span {_ms(r.measured_us)} ms)"
                    if abs(b.makespan - r.measured_us) > 0.005 * r.measured_us
                    else ""
                )
                + f"; restoring every op to typical ({r.references}) "
                f"gives {_ms(b.restored_makespan)} ms: {_ms(b.excess)} ms to explain"
            )
        )
        with_model = r.model is not None
        with_corrected = any(x.corrected for x in b.nodes)
        t = TableModel(
            "Culprit ops (saving if restored to typical, ms)",
            [
                Column("#", "key"),
                Column("op", "name"),
                Column("rank", "int"),
                Column("saving", "ms"),
                Column("share", "pct"),
                Column("dur", "ms"),
                Column("typical", "ms"),
                Column("typical from"),
            ]
            + ([Column("model saving")] if with_model else [])
            + ([Column("corrected [90%]")] if with_corrected else []),
            caption="corrected: the replay's saving with per-node corrections learned from paired re-runs, and its 90% interval"
            if with_corrected
            else "",
        )
        from bottleneck_oracle.analysis.blame import noise_floor

        floor = noise_floor(b.makespan)
        shown = [x for x in b.nodes if x.saving_us >= floor]
        for k, x in enumerate(shown, 1):
            cells = [_model_ms(x.model_saving_us) if x.model_predicted else "—"] if with_model else []
            if with_corrected:
                iv = x.corrected_interval_us
                fix = (
                    "—"
                    if not x.corrected
                    else _model_ms(None)
                    if x.corrected_saving_us is None or iv is None
                    else (f"{x.corrected_saving_us / 1000:.3f} [{iv[0] / 1000:.3f}, {iv[1] / 1000:.3f}]")
                )
                cells.append(fix)
            t.rows.append([k, x.name, x.rank, x.saving_us, x.share, x.dur_us, x.typical_us, x.typical_from, *cells])
        if shown:
            print_table(out, t)
        else:
            out.print(
                f"No culprit op: none restored to its typical time saves {_ms(floor)} ms (1% of the "
                "step, its run-to-run noise) or more (--json lists the candidates)",
                highlight=False,
            )
        slow = "; ".join(
            f"{shorten(x.name, 50)} (rank {x.rank}) +{_ms(x.dur_us - x.typical_us)} ms, saves {_ms(x.saving_us)}" for x in b.anomalies[:5]
        )
        out.print(Text(f"Most slower than typical: {slow or '—'}"))
        regions = regions_table(b, 5)
        if regions is not None:
            print_table(out, regions)
        ranks = ", ".join(f"rank {x.rank} {_ms(x.saving_us)} ms ({100 * x.share:.0f}%)" for x in b.ranks)
        out.print(f"By rank: {ranks}", highlight=False)
        ops = "; ".join(f"{shorten(x.name, 50)} {_ms(x.saving_us)} ms ({100 * x.share:.0f}%)" for x in b.ops[:5])
        out.print(Text(f"By op kind: {ops}"))


def _print_run_advice(overall, n_steps: int, with_edits: bool = False) -> None:
    """The suggestions across steps (llm.graphrag.run_advice), the first three (``with_edits``:
    each with the what-if edits its saving was replayed with)."""
    of = overall[0].of if overall else n_steps
    out.print(Text(f"Across {of} steps" + (f" (the steady ones of {n_steps})" if of < n_steps else ""), style="bold"))
    for x in overall[:3]:
        sv = x.saving
        iv = f" [{_ms(sv.low_us)}, {_ms(sv.high_us)}]" if sv.low_us is not None and sv.high_us is not None else ""
        out.print(
            Text(f"- {x.title}: in {x.steps} of {x.of} steps, saves {_ms(sv.median_us)} ms{iv} a step ({100 * x.share:.0f}%) by replay")
        )
        if x.remedy:
            out.print(Text(f"  Remedy: {x.remedy}"))
        if with_edits and x.edits:
            out.print(Text(f"  What-if: {'; '.join(x.edits)}"))
    if len(overall) > 1:
        out.print(
            "Each saving is replayed alone against the recorded step: suggestions that change the same time "
            "(an optimizer that is the straggler's excess, two remedies of one all-reduce) do not add up.",
            highlight=False,
        )


@app.command(rich_help_panel=ANALYSIS)
def advise(
    trace: Path = typer.Argument(..., metavar="PATH", help="A trace file (.json / .json.gz) or a folder of per-rank trace files."),
    step: list[int] = typer.Option(None, "--step", "-s", metavar="N", help=STEP_HELP),
    baseline: Path = typer.Option(
        None, "--baseline", metavar="PATH", help="A normal run of the same job, for the blame's typical durations."
    ),
    llm_base_url: str = typer.Option(
        None,
        "--llm-base-url",
        metavar="URL",
        help="An OpenAI-compatible server, e.g. http://localhost:8000/v1 (default: the offline recipe engine).",
    ),
    llm_model: str = typer.Option("default", "--llm-model", metavar="TEXT", help="Model name to ask the server for."),
    llm_key_env: str = typer.Option(
        "OPENAI_API_KEY", "--llm-key-env", metavar="TEXT", help="Environment variable holding the server's API key."
    ),
    recipes: Path = typer.Option(
        None, "--recipes", metavar="PATH", help="Another recipe file in the format of the shipped llm/recipes.yaml."
    ),
    checkpoint: Path = typer.Option(
        None,
        "--checkpoint",
        metavar="PATH",
        help="Model checkpoint, a .pt (its .npz beside it is read without torch) or the .npz (default: the pretrained one shipped with the package).",
    ),
    use_model: bool = typer.Option(False, "--model/--no-model", help=MODEL_HELP),
    config: Path = typer.Option(None, "--config", metavar="PATH", help=CONFIG_HELP),
    ranks_per_host: int = typer.Option(None, "--ranks-per-host", metavar="N", min=0, help=HOSTS_HELP),
    steps_at: str = typer.Option(None, "--steps-at", metavar="NAME", help=STEPS_AT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    detail: bool = typer.Option(
        False, "--detail", help="Also print each step's suggestions (a run of several steps prints them once, across the steps)."
    ),
) -> None:
    """What to change: optimisation suggestions retrieved for the step's symptoms, each checked by replay and the model."""
    llm = None
    if llm_base_url:
        from bottleneck_oracle.llm.client import ChatClient

        llm = ChatClient(llm_base_url, llm_model, llm_key_env)
    from bottleneck_oracle.llm.graphrag import run_advice

    with _progress(f"advising on {trace}"):
        rows = api.advise(
            trace,
            step or None,
            _config(config, ranks_per_host, steps_at),
            baseline,
            checkpoint,
            use_model or checkpoint is not None,
            llm,
            recipes,
        )
    overall = run_advice([r.advice for r in rows], [r.steady for r in rows])
    if as_json:
        _print_json({"trace": str(trace), "run": to_json(overall), "steps": to_json(rows)})
        return
    if overall and len(rows) > 1:
        _print_run_advice(overall, len(rows), with_edits=True)
        out.print()
        if not detail:
            out.print("Each step's suggestions, explanations and rejected ones: --detail (or --json)", highlight=False)
            return
    for r in rows:
        a = r.advice
        out.print(Text(_step_title(a.step), style="bold") + Text(f": {_ms(a.makespan_us)} ms; suggestions by {a.generator}"))
        if not a.suggestions:
            out.print("  no suggestion survived validation", highlight=False)
        for k, s in enumerate(a.suggestions, 1):
            said = "out of domain" if s.model_out_of_domain else ", ".join(f"{v} {_model_ms(x)}" for v, x in s.model_saving_us.items())
            pct = 100 * s.replay_saving_us / max(a.makespan_us, 1.0)
            out.print(
                Text(
                    f"{k}. {s.title} — saves {_ms(s.replay_saving_us)} ms ({pct:.1f}%) by replay"
                    + (
                        f" (90% {_ms(s.saving_interval_us[0])} to {_ms(s.saving_interval_us[1])} ms, from re-runs)"
                        if s.saving_interval_us
                        else ""
                    )
                    + (f"; model: {said} ms" if said else "")
                )
            )
            out.print(Text(f"   {UNVERIFIED if s.explanation_by == 'llm' else ''}{s.explanation}"))
            if s.remedy:
                out.print(Text(f"   Remedy: {s.remedy}"))
            words = "; ".join(s.edits_in_words or s.changes)
            out.print(Text(f"   What-if: {words} ({'; '.join(s.changes)}, {s.edited_nodes} nodes)"))
        if a.rejected:
            out.print(f"  {len(a.rejected)} suggestion(s) rejected (see --json)", highlight=False)


@app.command(rich_help_panel=ANALYSIS)
def summary(
    path: Path = typer.Argument(..., metavar="PATH", help="A trace file or a folder of per-rank traces."),
    step: list[int] = typer.Option(None, "--step", "-s", metavar="N", help=STEP_HELP),
    config: Path = typer.Option(None, "--config", metavar="PATH", help=CONFIG_HELP),
    ranks_per_host: int = typer.Option(None, "--ranks-per-host", metavar="N", min=0, help=HOSTS_HELP),
    steps_at: str = typer.Option(None, "--steps-at", metavar="NAME", help=STEPS_AT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Every step against the run's median: the steady-state step time, and the unusual steps with their top cause."""
    from bottleneck_oracle.report.tables import Column, TableModel
    from bottleneck_oracle.report.terminal import print_table

    with _progress(f"summarising {path}"):
        s = api.summary(path, step or None, _config(config, ranks_per_host, steps_at))
    if as_json:
        _print_json(to_json(s))
        return
    steady = [x for x in s.steps if not x.warmup]
    out.print(
        Text(
            f"{path}: steady-state step time {_ms(s.median_us)} ms (median of {len(steady)} steps, spread ±{_ms(s.spread_us)} ms)"
            + (
                "; left out: " + ", ".join(f"step {x.step} ({x.left_out})" for x in s.steps if x.warmup)
                if len(steady) < len(s.steps)
                else ""
            )
        )
    )
    for said in (s.trend, s.groups):
        if said is not None:
            out.print(Text(said.line()))
    t = TableModel(
        "Steps against the run's median",
        [
            Column("step", "key"),
            Column("step ms", "ms"),
            Column("vs median", "signed_pct"),
            Column("unusual"),  # before the spans: a narrow terminal leaves out the rightmost columns first
            Column("span ms", "ms"),
            Column("untraced ms", "ms"),
            Column("most time on the critical path", "name"),
        ],
    )
    for x in s.steps:
        flag = x.left_out if x.warmup else ("OUTLIER" if x.outlier else "")
        t.rows.append([x.step if x.step is not None else "-", x.cpm_us, x.vs_median, flag, x.measured_us, x.untraced_us, x.top])
    print_table(out, t)
    for x in s.steps:
        if x.outlier:
            cause = x.cause
            why = (
                f"{cause.name} on rank {cause.rank} (restoring it saves {_ms(cause.saving_us)} ms)"
                if cause
                else "no single op (none restored to typical saves 1% of the step)"
            )
            where = f"in it: {x.in_it.words(_ms, 'the typical steps')}; " if x.in_it is not None else ""
            out.print(Text(f"step {x.step}: {100 * x.vs_median:+.1f}% vs median; {where}top cause: {why}"))
    if not any(x.outlier for x in s.steps):
        out.print("no outlier steps", highlight=False)


def _rank_list(ranks: list[int]) -> str:
    """Ranks as runs: [0, 1, 2, 5] -> "0-2, 5"."""
    parts: list[str] = []
    for r in ranks:
        if parts and parts[-1].split("-")[-1] == str(r - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{r}"
        else:
            parts.append(str(r))
    return ", ".join(parts)


@app.command(rich_help_panel=ANALYSIS)
def compare(
    baseline: Path = typer.Argument(
        ..., metavar="BASELINE", help="The run before the change: a trace file or a folder of per-rank traces."
    ),
    candidate: Path = typer.Argument(..., metavar="CANDIDATE", help="The run after the change."),
    fail_if_slower: float = typer.Option(
        None,
        "--fail-if-slower",
        min=0.0,
        metavar="PCT",
        help="Exit with status 1 if the candidate is called slower and by more than this many percent (a CI gate).",
    ),
    min_change: float = typer.Option(
        1.0,
        "--min-change",
        min=0.0,
        max=99.0,
        metavar="PCT",
        help="The smallest change in percent of the baseline's step that is called faster or slower (default 1).",
    ),
    force: bool = typer.Option(False, "--force", help="Compare runs that share almost no ops instead of refusing."),
    top: int = typer.Option(10, "--top", min=1, metavar="N", help="How many moves on the critical path to list."),
    config: Path = typer.Option(None, "--config", metavar="PATH", help=CONFIG_HELP),
    ranks_per_host: int = typer.Option(None, "--ranks-per-host", metavar="N", min=0, help=HOSTS_HELP),
    steps_at: str = typer.Option(None, "--steps-at", metavar="NAME", help=STEPS_AT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Did the change help, and why: step-time change with its interval and verdict, whether the runs compare, what moved on the critical path."""
    from bottleneck_oracle.report.tables import Column, TableModel
    from bottleneck_oracle.report.terminal import print_table

    with _progress(f"comparing {baseline} and {candidate}"):
        c = api.compare(baseline, candidate, _config(config, ranks_per_host, steps_at), top, min_change / 100, force)
    gate = fail_if_slower is not None and c.verdict == "slower" and 100 * c.delta_share > fail_if_slower
    if as_json:
        _print_json({**to_json_object(c), "gate_failed": gate})
    else:
        change = f"{c.delta_us / 1000:+.3f} ms ({100 * c.delta_share:+.1f}%)"
        interval = f", 95% interval [{c.interval_us[0] / 1000:+.3f}, {c.interval_us[1] / 1000:+.3f}] ms" if c.interval_us else ""
        head = {
            "faster": "candidate is faster than the baseline",
            "slower": "candidate is slower than the baseline",
            "within noise": "candidate is within noise of the baseline",
            "too few steps": "too few steps to tell",
        }[c.verdict]
        why = "" if c.verdict in ("faster", "slower") else f": {c.reason}"
        out.print(Text(f"{head}: {change}{interval}{why}", style="bold"))
        out.print(
            Text(
                f"baseline {_ms(c.baseline_median_us)} ms (median period of {c.baseline_steps} steps, spread ±{_ms(c.baseline_spread_us)}); "
                f"candidate {_ms(c.candidate_median_us)} ms (median period of {c.candidate_steps} steps, spread ±{_ms(c.candidate_spread_us)})"
            )
        )
        t = TableModel(
            "What moved on the critical path (ms per typical step)",
            [  # the change next to its row's name: a narrow terminal leaves out the rightmost columns first
                Column("what", "name"),
                Column("change", "signed_ms"),
                Column("baseline", "ms"),
                Column("candidate", "ms"),
                Column("ranks"),
                Column("kind"),
            ],
            caption="typical steps: those in each run's interquartile range; the change column adds up to the change of the medians",
        )
        t.rows = [[m.what, m.delta_us, m.baseline_us, m.candidate_us, _rank_list(m.ranks), m.kind] for m in c.moved]
        if abs(c.other_us) > 0.5:
            t.rows.append(["everything else on the path", c.other_us, None, None, "", ""])
        if abs(c.residual_us) > 0.5:
            t.rows.append(["typical steps against the medians", c.residual_us, None, None, "", ""])
        t.rows.append(["total: the change of the medians", c.delta_us, c.baseline_median_us, c.candidate_median_us, "", ""])
        print_table(out, t)
        t = TableModel(
            "By kind (ms per typical step)",
            [Column("kind", "key"), Column("baseline", "ms"), Column("candidate", "ms"), Column("change", "signed_ms")],
        )
        t.rows = [[k, v.baseline_us, v.candidate_us, v.delta_us] for k, v in c.by_kind.items()]
        print_table(out, t)
        if len(c.by_rank) > 1 and any(r.delta_us is not None for r in c.by_rank):
            t = TableModel(
                "By rank (median period ms)",
                [Column("rank", "key"), Column("baseline", "ms"), Column("candidate", "ms"), Column("change", "signed_ms")],
            )
            t.rows = [[r.rank, r.baseline_us, r.candidate_us, r.delta_us] for r in c.by_rank]
            print_table(out, t)
        if gate:
            _error(f"candidate is slower by {100 * c.delta_share:.1f}% (more than --fail-if-slower {fail_if_slower:g}%)")
    if gate:
        raise typer.Exit(1)


@app.command(rich_help_panel=ANALYSIS)
def version() -> None:
    """Print the version."""
    out.print(__version__)


def _print_version(value: bool) -> None:
    if value:
        out.print(__version__)
        raise typer.Exit()


@app.callback()
def _options(
    version_: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Critical path, slack and bottlenecks of (distributed) PyTorch training steps, from profiler traces."""


_SAID: list[str] = []
"""Every OracleWarning this command printed, once each, in order: also the ``warnings`` of its
``--json`` and of its HTML report (a warning about the input must reach every output, not only
the terminal)."""


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message)
    if isinstance(category, type) and issubclass(category, OracleWarning) and text not in _SAID:
        _SAID.append(text)
    err.print(Text("warning: ", style="bold yellow") + Text(text), soft_wrap=True)


def _with_warnings(doc: dict) -> dict:
    """``doc`` with the command's warnings (``_SAID``) under ``warnings``, after any it already
    lists (compare's)."""
    have = doc.get("warnings")
    said = list(have) if isinstance(have, list) else []
    return {**doc, "warnings": said + [w for w in _SAID if w not in said]}


def _interrupted_by(exc: BaseException) -> int:
    """The signal an exception was raised while unwinding from (its context chain), 0 if none."""
    seen: BaseException | None = exc.__context__
    for _ in range(20):
        if seen is None:
            return 0
        if isinstance(seen, Interrupted):
            return seen.signum
        if isinstance(seen, KeyboardInterrupt):
            return int(signal.SIGINT)
        seen = seen.__context__
    return 0


def _silence_stdout() -> None:
    """After stdout failed: point its file descriptor at /dev/null, so the interpreter's own flush at
    exit does not fail again with a message of its own (and exit status 120)."""
    real = sys.__stdout__
    if real is not None and sys.stdout is real:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), real.fileno())
        except (OSError, ValueError):
            pass


def main() -> None:
    """Entry point: library errors become one clean line and exit code 2; an interrupted command
    removes its temporary files and exits 128 + the signal's number."""
    warnings.showwarning = _show_warning
    warnings.simplefilter("always", OracleWarning)
    _SAID.clear()
    _first_run_notice(sys.argv[1:2])
    with unwinding_signals():
        _run()


def _run() -> None:
    try:
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
        stdout.flush()  # (a full disk or a closed pipe shows here at the latest, not in the interpreter's exit)
    except OutputError as exc:
        _error(str(exc))
        _silence_stdout()
        sys.exit(2)
    except OracleError as exc:
        _error(str(exc))
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Interrupted as exc:
        err.print(f"terminated by {signal.Signals(exc.signum).name}; no output was left half-written")
        sys.exit(128 + exc.signum)
    except OSError as exc:  # a file the library did not name in an OracleError (a name too long, no permission)
        _error(f"{exc.filename}: {exc.strerror or exc}" if exc.filename is not None else f"{exc.strerror or exc}")
        sys.exit(2)
    except MemoryError:
        _error("not enough memory for this input (see the limits in the README)")
        sys.exit(2)
    except Exception as exc:  # click usage errors carry their own message
        signum = _interrupted_by(exc)
        if signum:  # a library's own clean-up failed while a signal unwound it: still the signal
            err.print(f"terminated by {signal.Signals(signum).name}; no output was left half-written")
            sys.exit(128 + signum)
        usage, abort = _click_exceptions()
        if isinstance(exc, usage):  # one line, like every other error (usage: --help)
            _error(f"{exc.format_message()} (see bottleneck-oracle --help)")
            sys.exit(exc.exit_code)
        if isinstance(exc, abort):
            sys.exit(1)
        if os.environ.get("BOTTLENECK_ORACLE_DEBUG"):
            raise
        _error(f"internal error ({type(exc).__name__}: {first_line(exc)}): a bug; BOTTLENECK_ORACLE_DEBUG=1 shows where")
        sys.exit(70)


TRACE_COMMANDS = {"analyze", "parse", "whatif", "blame", "advise", "summary", "compare", "build-dataset"}


def _first_run_notice(command: list[str]) -> None:
    """At a terminal, the first trace command after an install says why it takes a while."""
    if not (command and command[0] in TRACE_COMMANDS and sys.stderr.isatty()):
        return
    from bottleneck_oracle.graph_pipeline.scan import cache_is_cold

    if cache_is_cold():
        err.print("compiling the trace scanner (the first run after an install; about 10 s, kept for later runs)")


def _click_exceptions() -> tuple[tuple[type[Any], ...], tuple[type[Any], ...]]:
    """Usage-error and abort classes of the click typer uses: newer typer vendors its own
    (typer._click), older ones use the click package, and both can be installed at once (Dask
    brings click): the classes of each that is present."""
    usage: list[type[Any]] = []
    abort: list[type[Any]] = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        usage.append(mod.ClickException)
        if hasattr(mod, "Abort"):
            abort.append(mod.Abort)
    try:
        from typer.exceptions import Abort as TyperAbort

        abort.append(TyperAbort)
    except ImportError:
        pass
    return tuple(usage), tuple(abort)

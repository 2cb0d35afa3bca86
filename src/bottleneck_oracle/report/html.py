"""Self-contained HTML report: the tables of report.tables and interactive plotly figures (the
plotly.js library is inlined once: nothing is fetched when the report is opened). Every trace
string goes through ``bottleneck_oracle.inert``: ``html_text`` in the page, ``plotly_text`` in the figures'
lane labels and hover texts (plotly renders a subset of HTML tags there: a thread named
``<a href=...>`` was a link in every lane).

Needs the ``report`` extra (plotly): ``pip install 'bottleneck-oracle[report]'``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from bottleneck_oracle import __version__
from bottleneck_oracle.analysis.results import StepAdvice
from bottleneck_oracle.analysis.segments import BREAKDOWN_KEYS
from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.inert import html_text, plotly_text
from bottleneck_oracle.report import tables
from bottleneck_oracle.report.tables import TableModel, fmt

MAX_STEP_SECTIONS = 20  # per-step sections (timeline, tables) for at most this many steps: the slowest
NAME_WIDTH = 100  # characters of an op's name in a table cell; the whole name is the cell's tooltip
MAX_TIMELINE_BARS = 20_000  # ops off the critical path beyond this are left out (the longest are kept)
_COLORS = {"compute": "#4c78a8", "communication": "#f58518", "cpu_overhead": "#72b7b2", "idle": "#bab0ac", "untraced": "#222222"}
_SEGMENT_COLORS = {"wait": "#ff9f1c", "framework": "#f4a6a6", "launch": "#f4a6a6", "untraced": "#222222"}
_CONFIG = {"displaylogo": False, "scrollZoom": True, "modeBarButtonsToRemove": ["sendDataToCloud"], "responsive": True}


def _plotly():
    try:
        import plotly.graph_objects as go
        import plotly.offline
    except ImportError:
        raise OracleError("--html needs plotly: pip install 'bottleneck-oracle[report]'") from None
    return go, plotly.offline


def _figure(fig) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, config=_CONFIG)


LONG_TEXT = 60  # characters: a cell this long may break inside a word


def _cell(value: object, c: tables.Column) -> str:
    """One cell; a name longer than NAME_WIDTH (a kernel's C++ signature runs to 1,500
    characters) shortened as the terminal does, the whole name its tooltip."""
    text = fmt(value, c.kind)
    if c.kind in ("name", "key") and len(text) > NAME_WIDTH:
        return f"<td title='{html_text(text)}'>{html_text(tables.shorten(text, NAME_WIDTH))}</td>"
    # (a long text, a what-if edit naming a Python frame's path, may break anywhere: the table fits the page)
    klass = "num" if c.kind in tables.NUMERIC else "long" if len(text) > LONG_TEXT else ""
    return f"<td class='{klass}'>{html_text(text)}</td>"


def _table(t: TableModel) -> str:
    head = "".join(f"<th>{html_text(c.header)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(_cell(v, c) for v, c in zip(row, t.columns)) + "</tr>" for row in t.rows)
    caption = f"<caption>{html_text(t.caption)}</caption>" if t.caption else ""
    return f"<h3>{html_text(t.title)}</h3><table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _lanes(a: StepAnalysis, nodes: np.ndarray) -> tuple[list[tuple], dict[tuple, str]]:
    g = a.graph
    n = g.nodes
    info = g.info
    lanes = sorted({(int(n["rank"][i]), bool(n["on_gpu"][i]), int(n["tid"][i])) for i in nodes.tolist()})
    label = {k: plotly_text(f"rank {k[0]} · {info.lane_name(k[0], k[2], k[1])}") for k in lanes}
    return lanes, label


def timeline(a: StepAnalysis) -> str:
    """One lane per (rank, thread or stream), named as the trace names it; zoom and pan with the
    mouse. Ops on the critical path in red, the path's waits orange, framework and launch time
    pink, untraced time black; other ops grey; a blocking op's waiting yellow."""
    go, _ = _plotly()
    g, r = a.graph, a.cpm
    n = g.nodes
    real = np.flatnonzero(n["event"] >= 0)
    crit = r.critical
    if len(real) > MAX_TIMELINE_BARS:
        keep_long = real[np.argsort(-n["dur"][real])[:MAX_TIMELINE_BARS]]
        real = np.union1d(keep_long, np.flatnonzero(crit & (n["event"] >= 0)))
    lanes, label = _lanes(a, real)
    fig = go.Figure()

    def bars(name: str, color: str, lane_keys, starts, durs, texts, width: float = 0.7) -> None:
        if not len(starts):
            return
        fig.add_trace(
            go.Bar(
                name=name,
                orientation="h",
                y=[label[k] for k in lane_keys],
                base=np.asarray(starts) / 1000,
                x=np.asarray(durs) / 1000,
                marker={"color": color, "line": {"width": 0}},
                width=width,
                hovertext=texts,
                hoverinfo="text",
            )
        )

    def key(i: int) -> tuple:
        return (int(n["rank"][i]), bool(n["on_gpu"][i]), int(n["tid"][i]))

    wait = n["mstart"][real] - n["start"][real]
    waiting = real[wait > 0]
    bars(
        "waiting (blocking op)",
        "#f2cf8a",
        [key(i) for i in waiting],
        n["start"][waiting],
        wait[wait > 0],
        [plotly_text(f"{g.node_name(i)}: waited {fmt(w, 'ms')} ms") for i, w in zip(waiting.tolist(), wait[wait > 0])],
    )
    for is_crit, name, color in ((False, "ops", "#9aa5b1"), (True, "critical path: ops", "#d62728")):
        sel = real[crit[real] == is_crit]
        bars(
            name,
            color,
            [key(i) for i in sel],
            n["mstart"][sel],
            n["mdur"][sel],
            [
                plotly_text(f"{g.node_name(i)} · {fmt(d, 'ms')} ms · slack {fmt(s, 'ms')} ms")
                for i, d, s in zip(sel.tolist(), n["mdur"][sel], r.slack[sel])
            ],
        )
    for kind, color in _SEGMENT_COLORS.items():
        segs = [s for s in a.segments() if s.kind == kind and (s.rank, s.on_gpu, s.tid) in label]
        bars(
            f"critical path: {kind}",
            color,
            [(s.rank, s.on_gpu, s.tid) for s in segs],
            [s.start for s in segs],
            [s.dur for s in segs],
            [
                plotly_text(f"{kind}: {s.name} · {fmt(s.dur, 'ms')} ms" + (f" · waited for {g.node_name(s.cause)}" if s.cause >= 0 else ""))
                for s in segs
            ],
            width=0.35,
        )
    step = g.step if g.step is not None else "(whole trace)"
    fig.update_layout(
        # the title at the top of the figure, the legend right above the lanes: apart at any height
        title={
            "text": plotly_text(f"step {step}: timeline and critical path (drag to zoom, double-click to reset)"),
            "x": 0,
            "xanchor": "left",
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            "pad": {"t": 12},
        },
        barmode="overlay",
        xaxis_title="time from step start (ms)",
        height=170 + 34 * len(lanes),
        margin={"l": 10, "r": 10, "t": 100, "b": 40},
        yaxis={"categoryorder": "array", "categoryarray": [label[k] for k in reversed(lanes)], "automargin": True},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1, "yref": "paper", "x": 0},
        hoverlabel={"namelength": -1},
    )
    return _figure(fig)


def breakdown_plot(analyses: list[StepAnalysis]) -> str:
    go, _ = _plotly()
    fig = go.Figure()
    steps = ["whole trace" if a.graph.step is None else str(a.graph.step) for a in analyses]
    for key in BREAKDOWN_KEYS:
        fig.add_trace(
            go.Bar(name=key, orientation="h", y=steps, x=[a.breakdown()[key] / 1000 for a in analyses], marker_color=_COLORS[key])
        )
    fig.update_layout(
        barmode="stack",
        xaxis_title="critical path (ms)",
        yaxis_title="step",
        height=160 + 22 * len(analyses),
        margin={"l": 10, "r": 10, "t": 30, "b": 40},
        title="the critical path by kind",
    )
    return _figure(fig)


def slack_plot(a: StepAnalysis) -> str:
    go, _ = _plotly()
    s = a.cpm.slack[a.graph.nodes["event"] >= 0]
    # slack to the nanosecond (a critical op's float noise, 1e-13 µs, made Plotly scale its axis to femto)
    x = np.log10(np.maximum(np.round(s, 3), 0.0) + 1.0)
    top = max(1.0, float(x.max(initial=0.0)))
    fig = go.Figure(go.Histogram(x=x, xbins={"start": 0.0, "end": top, "size": top / 50}, marker_color="#4c78a8"))
    fig.update_xaxes(range=[0.0, top * 1.02])
    fig.update_layout(
        xaxis_title="log10(slack µs + 1)",
        yaxis_title="ops",
        title="slack distribution",
        height=280,
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
    )
    return _figure(fig)


def _extras(x: StepAdvice) -> list[str]:
    """The blame and advice sections of one step (api.advise output)."""
    parts = []
    b = x.blame
    if b.nodes:
        parts.append("<h3>Blame: what restoring each op to its typical duration saves</h3>")
        parts.append(
            f"<p>Restoring everything: {b.restored_makespan / 1000:.3f} ms, {b.excess / 1000:.3f} ms to explain "
            f"(typical durations from {html_text(x.references)}).</p>"
        )
        t = TableModel(
            "Culprits",
            [
                tables.Column("op", "name"),
                tables.Column("rank", "int"),
                tables.Column("duration (ms)", "ms"),
                tables.Column("typical (ms)", "ms"),
                tables.Column("typical from"),
                tables.Column("saving (ms)", "ms"),
                tables.Column("share", "pct"),
            ],
        )
        t.rows = [[n.name, n.rank, n.dur_us, n.typical_us, n.typical_from, n.saving_us, n.share] for n in b.nodes]
        parts.append(_table(t))
        if b.anomalies:
            t = TableModel(
                "Slower than typical, whatever it cost (a delay that overlapped waiting saves nothing)",
                [
                    tables.Column("op", "name"),
                    tables.Column("rank", "int"),
                    tables.Column("slower by (ms)", "ms"),
                    tables.Column("saving (ms)", "ms"),
                    tables.Column("slack (ms)", "ms"),
                ],
            )
            t.rows = [[n.name, n.rank, n.dur_us - n.typical_us, n.saving_us, n.slack_us] for n in b.anomalies[:5]]
            parts.append(_table(t))
        t = TableModel("Ranks", [tables.Column("rank", "key"), tables.Column("saving (ms)", "ms"), tables.Column("share", "pct")])
        t.rows = [[r.rank, r.saving_us, r.share] for r in b.ranks]
        parts.append(_table(t))
    regions = tables.regions_table(b, 10)
    if regions is not None:
        parts.append(_table(regions))
    a = x.advice
    parts.append(f"<h3>Advice ({html_text(a.generator)}; every suggestion replayed)</h3>")
    if not a.suggestions:
        parts.append("<p>No suggestion survived validation.</p>")
    # the model's column only where a model answered (it is off by default: no empty column for it)
    modelled = any(sug.model_out_of_domain or any(v is not None for v in sug.model_saving_us.values()) for sug in a.suggestions)
    columns = [
        tables.Column("suggestion"),
        tables.Column("why"),
        tables.Column("remedy"),
        tables.Column("what-if edit"),
        tables.Column("replay saving (ms)", "ms"),
    ]
    t = TableModel("Suggestions", columns + ([tables.Column("model saving (ms)")] if modelled else []))
    for sug in a.suggestions:
        model = (
            "out of domain"
            if sug.model_out_of_domain
            else ", ".join(f"{v} {t_ / 1000:.3f}" for v, t_ in sug.model_saving_us.items() if t_ is not None)
        )
        words = "; ".join(f"{w} ({e})" for w, e in zip(sug.edits_in_words or sug.changes, sug.changes))
        why = (
            f"[LLM text, not verified: only the what-if edit was replayed] {sug.explanation}"
            if sug.explanation_by == "llm"
            else sug.explanation
        )
        if sug.saving_interval_us is not None:  # a configuration change: how far re-runs fell from the replay
            lo, hi = sug.saving_interval_us
            words += f" — 90% from re-runs: {lo / 1000:.3f} to {hi / 1000:.3f} ms"
        t.rows.append([sug.title, why, sug.remedy, words, sug.replay_saving_us] + ([model] if modelled else []))
    if t.rows:
        parts.append(_table(t))
    return parts


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:13px;max-width:100%}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}td.long{overflow-wrap:anywhere;min-width:14em}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}caption{caption-side:bottom;font-size:12px;color:#555}"
    "h2{margin-top:2em}.warn{background:#fff4d6;border-left:4px solid #f0ad4e;padding:6px 10px}"
)


def render(
    analyses: list[StepAnalysis],
    source: str,
    top: int = 20,
    extras: Mapping[int | None, StepAdvice] | None = None,
    run=None,
    warnings: list[str] | None = None,
) -> str:
    """The self-contained report: the run answer (``run``, analysis.answer) at the top, with the
    ``warnings`` the command gave about its input (ranks missing, events sampled or in categories
    not known, no step markers, ...), then the steps and the sections of the slowest steps."""
    _, offline = _plotly()
    if run is None:
        from bottleneck_oracle.analysis.answer import run_answer

        run = run_answer(analyses, source)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>BottleneckOracle report: {html_text(source)}</title>",
        f"<style>{_STYLE}</style>",
        f"<script type='text/javascript'>{offline.get_plotlyjs()}</script></head><body>",
        f"<h1>BottleneckOracle report</h1><p>Input: <code>{html_text(source)}</code> · version {__version__}</p>",
        "<h2>The run</h2><ul class='run'>" + "".join(f"<li>{html_text(line.strip())}</li>" for line in run.lines()) + "</ul>",
        "".join(f"<p class='warn'>warning: {html_text(w)}</p>" for w in warnings or []),
        "<h2>Steps</h2>",
        _table(tables.steps_table(analyses)),
        breakdown_plot(analyses),
    ]
    detailed = analyses
    if len(analyses) > MAX_STEP_SECTIONS:
        slowest = sorted(analyses, key=lambda a: -a.step_time)[:MAX_STEP_SECTIONS]
        detailed = [a for a in analyses if a in slowest]
        parts.append(
            f"<p>{len(analyses)} steps: the table above has every one; the sections below are the {MAX_STEP_SECTIONS} slowest "
            "(<code>--step N</code> selects others).</p>"
        )
    for a in detailed:
        label = a.graph.step if a.graph.step is not None else "(whole trace)"
        parts.append(f"<h2>Step {html_text(str(label))}</h2>")
        for w in a.warnings():
            if w:
                parts.append(f"<p class='warn'>{html_text(w)}</p>")
        parts.append(timeline(a))
        parts.append(_table(tables.top_ops_table(a, top)))
        for t in (tables.families_table(a), tables.comm_table(a), tables.overlap_table(a), tables.ranks_table(a)):
            if t is not None:
                parts.append(_table(t))
        s = a.straggler()
        if s and len(a.graph.ranks) > 1:
            parts.append(
                f"<p>Straggler: rank {s.rank} (the others waited up to {s.imposed_wait_us / 1000:.3f} ms for it at a collective on the critical path).</p>"
            )
        parts.append(slack_plot(a))
        if extras and a.graph.step in extras:
            parts += _extras(extras[a.graph.step])
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    analyses: list[StepAnalysis],
    source: str,
    out: str | Path,
    top: int = 20,
    extras: Mapping[int | None, StepAdvice] | None = None,
    run=None,
    warnings: list[str] | None = None,
) -> Path:
    out = Path(out)
    text = render(analyses, source, top, extras, run, warnings)
    with atomic_path(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return out

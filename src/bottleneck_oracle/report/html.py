"""Self-contained HTML report: summary tables and plots (PNG, inlined), all trace strings escaped."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from bottleneck_oracle import __version__  # noqa: E402
from bottleneck_oracle.analysis.summary import BREAKDOWN_KEYS, StepAnalysis  # noqa: E402
from bottleneck_oracle.atomic import atomic_path  # noqa: E402

MAX_TIMELINE_BARS = 20_000  # more bars make the PNG unreadable and slow to draw
_COLORS = {"compute": "#4c78a8", "communication": "#f58518", "cpu_overhead": "#72b7b2", "idle": "#bab0ac", "untraced": "#222222"}
_SEGMENT_COLORS = {"wait": "#ff9f1c", "framework": "#f4a6a6", "launch": "#f4a6a6", "untraced": "#222222"}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return '<img alt="plot" src="data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode() + '">'


def timeline_plot(a: StepAnalysis) -> str:
    """One lane per (rank, thread or stream), named as the trace names it; critical-path ops in red,
    the path's other segments on the lane they delay (waits orange, framework and launch time pink,
    untraced time black)."""
    g, r = a.graph, a.cpm
    n = g.nodes
    real = np.flatnonzero(n["event"] >= 0)
    crit = r.critical
    if len(real) > MAX_TIMELINE_BARS:
        keep_long = real[np.argsort(-n["dur"][real])[:MAX_TIMELINE_BARS]]
        real = np.union1d(keep_long, np.flatnonzero(crit & (n["event"] >= 0)))
    lanes = sorted({(int(n["rank"][i]), bool(n["on_gpu"][i]), int(n["tid"][i])) for i in real.tolist()})
    lane_of = {k: j for j, k in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(lanes) + 1.2))
    lane_idx = np.array([lane_of[(int(n["rank"][i]), bool(n["on_gpu"][i]), int(n["tid"][i]))] for i in real.tolist()])
    min_w = r.makespan / 4000  # so that µs-long ops stay visible
    wait = n["mstart"][real] - n["start"][real]
    waiting = wait > min_w
    if waiting.any():  # time a blocking op spent waiting for its peers or the GPU
        ax.barh(lane_idx[waiting], wait[waiting] / 1000, left=n["start"][real][waiting] / 1000, height=0.7, color="#f2cf8a", linewidth=0)
    for is_crit, color in ((False, "#9aa5b1"), (True, "#d62728")):
        sel = crit[real] == is_crit
        if sel.any():
            ax.barh(
                lane_idx[sel],
                np.maximum(n["mdur"][real][sel], min_w) / 1000,
                left=n["mstart"][real][sel] / 1000,
                height=0.7,
                color=color,
                linewidth=0,
            )
    for kind, color in _SEGMENT_COLORS.items():
        segs = [x for x in a.segments() if x.kind == kind and (x.rank, x.on_gpu, x.tid) in lane_of]
        if segs:
            ax.barh(
                [lane_of[(x.rank, x.on_gpu, x.tid)] for x in segs],
                [max(x.dur, min_w) / 1000 for x in segs],
                left=[x.start / 1000 for x in segs],
                height=0.35,
                color=color,
                linewidth=0,
            )
    names = {False: g.meta.get("thread_names", {}), True: g.meta.get("stream_names", {})}
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(
        [f"rank {rk} {names[gpu].get(f'{rk}:{tid}', ('stream ' if gpu else 'thread ') + str(tid))}" for rk, gpu, tid in lanes], fontsize=7
    )
    ax.invert_yaxis()
    ax.set_xlabel("time from step start (ms)")
    ax.set_title(
        f"step {g.step if g.step is not None else 'window'}: critical path in red (ops) and orange (waits), "
        "pink (framework, launch), black (untraced); blocking ops' waiting in yellow"
    )
    return _png(fig)


def slack_plot(a: StepAnalysis) -> str:
    s = a.cpm.slack[a.graph.nodes["event"] >= 0]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.hist(np.log10(s + 1.0), bins=50, color="#4c78a8")
    ax.set_xlabel("log10(slack µs + 1)")
    ax.set_ylabel("ops")
    ax.set_title("slack distribution")
    return _png(fig)


def breakdown_plot(analyses: list[StepAnalysis]) -> str:
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(analyses) + 1.5))
    left = np.zeros(len(analyses))
    labels = [str(a.graph.step) for a in analyses]
    for key in BREAKDOWN_KEYS:
        vals = np.array([max(a.breakdown()[key], 0.0) / 1000 for a in analyses])
        ax.barh(labels, vals, left=left, color=_COLORS[key], label=key)
        left += vals
    ax.set_xlabel("critical path (ms)")
    ax.set_ylabel("step")
    ax.legend(fontsize=7, loc="lower right")
    return _png(fig)


def _table(headers: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _extras(x: dict) -> list[str]:
    """The blame and advice sections of one step (api.advise output)."""
    parts = []
    b = x.get("blame")
    if b and b["nodes"]:
        parts.append("<h3>Blame: what restoring each op to its typical duration saves</h3>")
        parts.append(
            f"<p>Restoring everything: {b['restored_makespan_us'] / 1000:.3f} ms, {b['excess_us'] / 1000:.3f} ms to explain "
            f"(typical durations from {html.escape(str(x.get('references', '')))}).</p>"
        )
        parts.append(
            _table(
                ["op", "rank", "duration (ms)", "typical (ms)", "typical from", "saving (ms)", "share"],
                [
                    [
                        n["name"][:160],
                        n["rank"],
                        f"{n['dur_us'] / 1000:.3f}",
                        f"{n['typical_us'] / 1000:.3f}",
                        n["typical_from"],
                        f"{n['saving_us'] / 1000:.3f}",
                        f"{100 * n['share']:.0f}%",
                    ]
                    for n in b["nodes"]
                ],
            )  # fmt: skip
        )
        if b.get("anomalies"):
            parts.append("<p>Slower than typical, whatever it cost (a delay that overlapped waiting saves nothing):</p>")
            parts.append(
                _table(
                    ["op", "rank", "slower by (ms)", "saving (ms)", "slack (ms)"],
                    [
                        [
                            n["name"][:160],
                            n["rank"],
                            f"{(n['dur_us'] - n['typical_us']) / 1000:.3f}",
                            f"{n['saving_us'] / 1000:.3f}",
                            f"{n['slack_us'] / 1000:.3f}",
                        ]
                        for n in b["anomalies"][:5]
                    ],
                )  # fmt: skip
            )
        parts.append(
            _table(
                ["rank", "saving (ms)", "share"],
                [[r["rank"], f"{r['saving_us'] / 1000:.3f}", f"{100 * r['share']:.0f}%"] for r in b["ranks"]],
            )
        )
    a = x.get("advice")
    if a:
        parts.append(f"<h3>Advice ({html.escape(a['generator'])}; every suggestion replayed)</h3>")
        if not a["suggestions"]:
            parts.append("<p>No suggestion survived validation.</p>")
        rows = []
        for sug in a["suggestions"]:
            model = (
                "out of domain"
                if sug.get("model_out_of_domain")
                else ", ".join(f"{v} {t / 1000:.3f}" for v, t in sug["model_saving_us"].items() if t is not None)
            )
            rows.append(
                [sug["title"], sug["explanation"], sug["remedy"], "; ".join(sug["edits"]), f"{sug['replay_saving_us'] / 1000:.3f}", model]
            )
        if rows:
            parts.append(_table(["suggestion", "why", "remedy", "what-if edit", "replay saving (ms)", "model saving (ms)"], rows))
    return parts


def render(analyses: list[StepAnalysis], source: str, top: int = 20, extras: dict | None = None) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>BottleneckOracle report: {html.escape(source)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px}"
        "table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        "th{background:#f3f3f3}img{max-width:100%}h2{margin-top:2em}</style></head><body>",
        f"<h1>BottleneckOracle report</h1><p>Input: <code>{html.escape(source)}</code> · version {__version__}</p>",
        "<h2>Steps</h2>",
        _table(
            ["step", "ranks", "measured (ms)", "CPM (ms)", "error", "window (ms)", *BREAKDOWN_KEYS],
            [
                [
                    a.graph.step,
                    len(a.graph.ranks),
                    f"{a.measured / 1000:.3f}",
                    f"{a.step_time / 1000:.3f}",
                    f"{100 * (a.step_time - a.measured) / (a.measured or 1):+.2f}%",
                    f"{a.cpm.window / 1000:.3f}",
                    *[f"{a.breakdown()[k] / 1000:.3f}" for k in BREAKDOWN_KEYS],
                ]
                for a in analyses
            ],
        ),
        breakdown_plot(analyses),
    ]
    for a in analyses:
        label = a.graph.step if a.graph.step is not None else "(whole trace)"
        parts.append(f"<h2>Step {html.escape(str(label))}</h2>")
        parts.append(timeline_plot(a))
        parts.append(slack_plot(a))
        parts.append(f"<h3>Top {top} ops by time on the critical path</h3>")
        parts.append(
            _table(
                ["op", "count", "critical (ms)", "share"],
                [[o["name"][:160], o["count"], f"{o['critical_us'] / 1000:.3f}", f"{100 * o['share']:.1f}%"] for o in a.top_ops(top)],
            )
        )
        comm = a.lowest_slack_comm()
        if comm:
            parts.append("<h3>Lowest-slack communication</h3>")
            parts.append(
                _table(
                    ["op", "rank", "slack (ms)", "duration (ms)", "waiting (ms)", "bytes", "on critical path"],
                    [
                        [
                            c["name"],
                            c["rank"],
                            f"{c['slack_us'] / 1000:.3f}",
                            f"{c['dur_us'] / 1000:.3f}",
                            f"{c['wait_us'] / 1000:.3f}",
                            c["msg_bytes"] or "",
                            "yes" if c["critical"] else "",
                        ]
                        for c in comm
                    ],
                )
            )
        ranks = a.ranks()
        if len(ranks) > 1:
            parts.append("<h3>Ranks</h3>")
            parts.append(
                _table(
                    ["rank", "step (ms)", "collective wait (ms, sum)", "critical path share"],
                    [
                        [
                            x["rank"],
                            f"{x['step_us'] / 1000:.3f}",
                            f"{x['collective_wait_us'] / 1000:.3f}",
                            f"{100 * x['critical_share']:.1f}%",
                        ]
                        for x in ranks
                    ],
                )
            )
            s = a.straggler()
            if s:
                parts.append(
                    f"<p>Straggler: rank {s['rank']} (the others waited up to {s['imposed_wait_us'] / 1000:.3f} ms for it at a collective on the critical path).</p>"
                )
        if extras and a.graph.step in extras:
            parts += _extras(extras[a.graph.step])
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(analyses: list[StepAnalysis], source: str, out: str | Path, top: int = 20, extras: dict | None = None) -> Path:
    out = Path(out)
    text = render(analyses, source, top, extras)
    with atomic_path(out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return out

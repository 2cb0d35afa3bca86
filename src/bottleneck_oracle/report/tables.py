"""The tables a user reads, built once and rendered twice: in the terminal (report.terminal) and
in the HTML report (report.html). A table holds raw values and a kind per column; renderers
format them (µs shown as ms, shares as %), and shorten names to fit (the terminal to its width,
the HTML report to 100 characters, the whole name its tooltip).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bottleneck_oracle.analysis.blame import Blame, region_labels
from bottleneck_oracle.analysis.segments import BREAKDOWN_KEYS
from bottleneck_oracle.analysis.summary import StepAnalysis

KINDS = ("key", "name", "text", "int", "ms", "ms1", "signed_ms", "pct", "signed_pct")
NUMERIC = ("int", "ms", "ms1", "signed_ms", "pct", "signed_pct")


@dataclass(slots=True)
class Column:
    header: str
    kind: str = "text"  # one of KINDS; "key" columns identify the row (never left out at a narrow width)


@dataclass(slots=True)
class TableModel:
    title: str
    columns: list[Column]
    rows: list[list] = field(default_factory=list)
    caption: str = ""


def fmt(value: Any, kind: str) -> str:
    """A cell as text: ms with 3 decimals from µs, shares in %, None as "—"."""
    if value is None:
        return "—"
    if kind == "ms":
        return f"{float(value) / 1000:.3f}"
    if kind == "ms1":  # the steps table: one decimal, so that it fits 80 columns
        return f"{float(value) / 1000:.1f}"
    if kind == "signed_ms":
        return f"{float(value) / 1000:+.3f}"
    if kind == "pct":
        return f"{100 * float(value):.1f}%"
    if kind == "signed_pct":
        return f"{100 * float(value):+.2f}%"
    return str(value)


_PARAMS = re.compile(r"(?<=[\w>])\([^()]*\)\s*$")  # a C++ signature's parameter list, not "(after ...)"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+(?=>)")  # the object's address in a Python tracer's name
_QUALIFIER = re.compile(r" \([^()]*\)$")  # a trailing " (after ...)", " (from the step start to ...)"


def shorten(name: str, width: int) -> str:
    """A name cut to ``width`` characters, keeping what tells it apart. The rule, in order, while it
    is too long: drop a leading ``void ``; drop an object's address (`` at 0x7f...``, the Python
    tracer's); drop a trailing parameter list ``(...)``; collapse
    template arguments to ``<…>`` (innermost first); drop a trailing qualifier `` (after ...)`` to
    `` (…)`` (the op it qualifies is what a user knows); then keep the start and the end and cut
    the middle at ``…`` (``ncclKernel_SendRecv_R…_Sum_int8_t``: the collective is near the start;
    ``autograd::engine::ev…:autograd::AccumulateGrad``: the op is at the end)."""
    width = max(width, 4)
    if len(name) <= width:
        return name
    s = name[5:] if name.startswith("void ") else name
    s = _ADDRESS.sub("", s)  # "<built-in method acquire of _thread.lock object at 0x7f9f...>": the address tells nothing apart
    if len(s) > width:
        s = _PARAMS.sub("", s) or s
    while len(s) > width:  # innermost template arguments first; a collapsed "<…>" counts as one token
        t = s.replace("<…>", "\x00")
        m = re.search(r"<(?!built-in )[^<>]*>", t)  # (a Python built-in's name is not a template argument)
        if not m:
            break
        s = (t[: m.start()] + "\x00" + t[m.end() :]).replace("\x00", "<…>")
    qualifier = _QUALIFIER.search(s) if len(s) > width else None
    if qualifier:  # "own time of AddmmBackward0 (after aten::resolve_conj)": the op is what a user knows
        op = s[: qualifier.start()]
        if len(op) + 4 <= width:
            return op + " (…)"
        if len(op) + 1 <= width:
            return op + "…"
        s = op
    if len(s) > width:
        head = (width - 1) // 2
        s = s[:head] + "…" + s[len(s) - (width - 1 - head) :]
    return s


def step_row(a: StepAnalysis) -> list:
    """One row of the steps table (kept per step when the analyses themselves are not)."""
    b = a.breakdown()
    key: int | str = a.graph.step if a.graph.step is not None else "-"
    if a.cut_by_trace_end():  # (its figures are of the part the trace holds: said, left out of the run's)
        key = f"{key} (cut)"
    elif a.adds_nothing():  # (its host ended under earlier steps' device work: said, left out of the run's)
        key = f"{key} (hidden)"
    return [key, a.measured, a.period, a.step_time, *[b[k] for k in BREAKDOWN_KEYS]]


def steps_table(analyses: list[StepAnalysis], rows: list[list] | None = None) -> TableModel:
    """The steps table of ``analyses``, or of ``rows`` made by ``step_row``."""
    t = TableModel(
        "Steps (ms)",
        [Column("step", "key"), Column("span", "ms1"), Column("period", "ms1"), Column("CPM", "ms1")]
        + [Column(h, "ms1") for h in ("comp.", "comm", "cpu", "idle", "untr.")],
    )
    t.rows = rows if rows is not None else [step_row(a) for a in analyses]
    whole = bool(t.rows) and all(r[0] == "-" for r in t.rows)  # no ProfilerStep markers: one window, the whole trace
    cut = list(((analyses[0].graph.meta.get("run_facts") or {}).get("steps_from") or {}).values()) if analyses else []
    cut_at = " or ".join(sorted({f"{c['name']} {'ends' if c['at'] == 'end' else 'starts'}" for c in cut}))
    what = "it" if whole else "the step"
    t.caption = (
        (
            "step -: the whole trace (no ProfilerStep markers); span: from its first event to its last"
            if whole
            else f"step N: the N-th iteration, cut where {cut_at}; span: the slowest rank's step"
            if cut_at
            else "span: the slowest rank's ProfilerStep"
            if len(analyses[0].graph.ranks if analyses else []) < 2
            else "span: the ProfilerSteps', from the last rank's start to the last one's end (the slowest rank's in the trace's first step)"
        )
        + f"; period: from the end of the work before {what} (the last rank's, its queued device work included) to the end of its own "
        "(the span when nothing was queued ahead); CPM: the graph's step time, then its critical path: compute, communication, CPU overhead, waiting (idle), untraced"
        + (
            "; (cut): the trace ends inside the step, so only part of it is held (left out of the run's figures)"
            if any(str(r[0]).endswith(" (cut)") for r in t.rows)
            else ""
        )
        + (
            "; (hidden): its host ended before the device work queued in earlier steps did, launching none that ran later "
            "(its span here; left out of the run's figures)"
            if any(str(r[0]).endswith(" (hidden)") for r in t.rows)
            else ""
        )
    )
    return t


def top_ops_table(a: StepAnalysis, k: int) -> TableModel:
    t = TableModel(
        "Where the critical path's time goes (ops include their own time between their children)",
        [Column("op / time", "name"), Column("kind", "text"), Column("count", "int"), Column("critical ms", "ms"), Column("share", "pct")],
    )
    t.rows = [[o.name, o.kind, o.count, o.critical_us, o.share] for o in a.top_ops(k)]
    return t


def comm_table(a: StepAnalysis) -> TableModel | None:
    comm = a.lowest_slack_comm()
    if not comm:
        return None
    t = TableModel(
        "Lowest-slack communication",
        [
            Column("op", "name"),
            Column("rank", "int"),
            Column("slack ms", "ms"),
            Column("dur ms", "ms"),
            Column("waiting ms", "ms"),
            Column("bytes", "int"),
            Column("critical", "text"),
        ],
    )
    t.rows = [
        [x.name, x.rank, x.slack_us, x.dur_us, x.wait_us, None if x.msg_bytes is None else int(x.msg_bytes), "yes" if x.critical else ""]
        for x in comm
    ]
    return t


def families_table(a: StepAnalysis) -> TableModel | None:
    fams = a.kernel_families()
    if not fams:
        return None
    t = TableModel(
        "GPU time by kernel family",
        [Column("family", "name"), Column("kernels", "int"), Column("total ms", "ms"), Column("share", "pct"), Column("critical ms", "ms")],
    )
    t.rows = [[f.family, f.count, f.total_us, f.share, f.critical_us] for f in fams]
    return t


def overlap_table(a: StepAnalysis) -> TableModel | None:
    rows = a.overlap()
    if not rows:
        return None
    t = TableModel(
        "Communication hidden behind compute",
        [
            Column("rank", "key"),
            Column("communication ms", "ms"),
            Column("overlapped ms", "ms"),
            Column("exposed ms", "ms"),
            Column("of it waiting ms", "ms"),
            Column("overlapped", "pct"),
        ],
        caption="exposed: communication with no compute of its rank beside it; of it waiting: its ops waiting for their "
        "peers to arrive (a late rank, a pipeline's bubble), which neither a faster network nor more overlap saves",
    )
    t.rows = [[o.rank, o.communication_us, o.overlapped_us, o.exposed_us, o.waiting_us, o.overlap_share] for o in rows]
    return t


def regions_table(b: Blame, k: int) -> TableModel | None:
    """Blame's ``k`` most specific regions (terminal ``blame`` and the HTML report)."""
    if not b.regions:
        return None
    t = TableModel(
        "Regions (ranges, modules, parent ops) taking their typical time as a whole",
        [
            Column("region", "name"),
            Column("rank", "int"),
            Column("own time (ms)", "ms"),
            Column("typical (ms)", "ms"),
            Column("typical from"),
            Column("saving (ms)", "ms"),
            Column("of the step", "pct"),
            Column("ops", "int"),
        ],
    )
    shown = b.regions[:k]
    t.rows = [
        [label, r.rank, r.dur_us, r.typical_us, r.typical_from, r.saving_us, r.share, r.nodes]
        for r, label in zip(shown, region_labels(shown))
    ]
    return t


def ranks_table(a: StepAnalysis) -> TableModel | None:
    ranks = a.ranks()
    if len(ranks) < 2:
        return None
    t = TableModel(
        "Ranks",
        [
            Column("rank", "key"),
            Column("step ms", "ms"),
            Column("CPM step ms", "ms"),
            Column("collective wait ms (sum)", "ms"),
            Column("critical path share", "pct"),
        ],
    )
    t.rows = [[x.rank, x.step_us, x.predicted_step_us, x.collective_wait_us, x.critical_share] for x in ranks]
    return t

"""Tables in the terminal, at any width from 80 columns: numbers are never cut.

Every numeric column gets the width of its widest cell; name columns share what is left and
their names are shortened by ``tables.shorten`` (the full names are in ``--json`` and the HTML
report). Where the columns do not fit, the rightmost ones other than the row's key and name are
left out, and the caption says which: a table is never split. Trace strings are printed as plain text, never as Rich markup.
"""

from __future__ import annotations

import os

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from bottleneck_oracle.inert import plain
from bottleneck_oracle.report.tables import NUMERIC, TableModel, fmt, shorten

NAME_MIN = 16  # characters a name column keeps at least
NAME_SHARE = 0.35  # and, if its names are that long, this share of the width
_BORDER = 3  # characters a column adds: padding on both sides and one rule


def _widths(t: TableModel, cells: list[list[str]]) -> list[int]:
    out = []
    for j, c in enumerate(t.columns):
        longest = max((len(r[j]) for r in cells), default=0)
        header = max((len(w) for w in c.header.split()), default=0)  # headers may wrap between words
        out.append(max(longest, header, 1))
    return out


def _strip_common_prefix(t: TableModel, cells: list[list[str]]) -> list[str]:
    """Headers; a prefix that every name of a name column shares (up to a separator: ``ncclKernel_``)
    moves from the cells into the header, so the width goes to what differs."""
    headers = [c.header for c in t.columns]
    for j, c in enumerate(t.columns):
        names = {r[j] for r in cells}
        if c.kind != "name" or len(names) < 2 or max(len(n) for n in names) <= 2 * NAME_MIN:
            continue  # all alike, or short enough to show whole
        common = os.path.commonprefix([r[j] for r in cells])
        cut = max(common.rfind(sep) for sep in "_:. ")
        if cut >= 6 and all(len(r[j]) > cut + 1 for r in cells):
            for r in cells:
                r[j] = r[j][cut + 1 :]
            headers[j] = f"{c.header} ({common[: cut + 1]}…)"
    return headers


def print_table(console: Console, t: TableModel) -> None:
    cells = [[plain(fmt(v, c.kind)) for v, c in zip(row, t.columns)] for row in t.rows]
    headers = [plain(h) for h in _strip_common_prefix(t, cells)]
    width = max(console.width, 40)
    need = _widths(t, cells)
    names = [j for j, c in enumerate(t.columns) if c.kind == "name"]
    keys = [j for j, c in enumerate(t.columns) if c.kind == "key"] or names[:1]  # never left out
    fixed = [j for j in range(len(t.columns)) if j not in names]

    def size(cols: list[int], name_min: int) -> int:
        return sum(min(need[j], name_min) if j in names else need[j] for j in cols) + _BORDER * len(cols) + 1

    # one table, never split: the rightmost columns that are neither the row's key nor its name
    # are left out (said in the caption; --json has them) before names lose their share of the
    # width (a name cut to a few characters says nothing); names go down to NAME_MIN only where
    # the key and names alone do not fit
    cols = list(range(len(t.columns)))
    name_min = max(NAME_MIN, int(NAME_SHARE * width))
    left_out: list[int] = []
    droppable = [j for j in fixed if j not in keys]
    while size(cols, name_min) > width and droppable:
        j = droppable.pop()
        cols.remove(j)
        left_out.append(j)
    if size(cols, name_min) > width:
        name_min = NAME_MIN
    caption = t.caption
    if left_out:
        gone = ", ".join(plain(t.columns[j].header) for j in sorted(left_out))
        caption = (caption if caption.endswith((".", ")", ":")) else f"{caption}.") + " " if caption else ""
        caption += f"Not shown at {width} columns: {gone} (--json, or a wider terminal, shows them)."
    room = width - sum(need[j] for j in cols if j not in names) - _BORDER * len(cols) - 1
    name_cols = [j for j in cols if j in names]
    name_w = {j: max(min(need[j], room // max(len(name_cols), 1)), min(need[j], name_min)) for j in name_cols}
    table = Table(title=Text(plain(t.title)), caption=Text(plain(caption)) if caption else None, box=box.SQUARE, expand=False)
    for j in cols:
        c = t.columns[j]
        w = name_w.get(j, need[j])
        # cells fit their width (names are shortened to it); a header may wrap between its words
        table.add_column(headers[j], justify="right" if c.kind in NUMERIC else "left", width=w, overflow="fold")
    for r in cells:
        table.add_row(*[Text(shorten(r[j], name_w[j]) if j in name_w else r[j]) for j in cols])
    console.print(table)

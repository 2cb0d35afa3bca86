"""The evaluation table's columns and number format (``eval``'s terminal table and markdown,
and the manual's copy of it rendered by ``make figures``), without torch."""

from __future__ import annotations

from typing import Any

import numpy as np


def fmt(v: Any, pct: bool = False) -> str:
    """A metric as the table shows it: ints whole, percentages and values from 10 up with one
    decimal, smaller values with three; missing or NaN as "—"."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "—"
    if isinstance(v, int):
        return str(v)
    return f"{v:.1f}" if pct else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


COLUMNS = [  # (metric key, header, a percentage)
    ("n", "what-if n", False),
    ("step_mape", "step MAPE %", True),
    ("step_mse_ms2", "MSE ms²", True),
    ("dt_mape", "ΔT MAPE %", True),
    ("dt_median_ape", "ΔT median APE %", True),
    ("dt_mae_ms", "ΔT MAE ms", False),
    ("sign_acc", "sign acc", False),
    ("slack_rho", "slack ρ", False),
    ("critical_f1", "critical F1", False),
    ("ms_per_graph", "ms/graph", False),
]
HEAD = ["split", "model"] + [c[1] for c in COLUMNS]


def rows_of(result: dict[str, Any]) -> list[list[str]]:
    """One row per split and model of an evaluation result (``eval --json``, docs/eval.json)."""
    out = []
    for split in result["splits"]:
        for name, m in split["models"].items():
            out.append([split["split"], name] + [fmt(m.get(k), pct) for k, _, pct in COLUMNS])
    return out

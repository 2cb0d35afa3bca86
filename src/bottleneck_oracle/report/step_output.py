"""What ``analyze`` keeps of each step of a run it walks step by step (analysis.stepwise.map_steps):
the step's figures for the run answer, its ``--json`` entry already serialised, its row of the
steps table, its critical events for ``--perfetto``. Computed in the worker that built the step,
so that only these small pieces travel back, never the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from bottleneck_oracle import serial
from bottleneck_oracle.analysis.answer import StepFigures
from bottleneck_oracle.analysis.summary import StepAnalysis
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.report.perfetto import critical_events
from bottleneck_oracle.report.tables import step_row

JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(doc: object) -> bytes:
    """``doc`` as ``--json`` writes it (orjson, indented; results, dataclasses, as
    ``serial.to_json`` writes them); a value JSON cannot hold (NaN, infinity) is an OracleError,
    never invalid JSON."""
    try:
        return serial.dumps(doc, option=JSON_OPTIONS)
    except TypeError as exc:
        if "surrogates" in str(exc):  # a file name that is not UTF-8, a name with a lone surrogate: as escapes
            return dumps(_utf8(serial.to_json(doc)))
        raise OracleError(f"cannot write the result as JSON ({exc})") from None


def _utf8(doc: object) -> object:
    """``doc`` with every string's lone surrogates (a file name's undecodable bytes) as backslash escapes."""
    if isinstance(doc, str):
        return doc.encode("utf-8", errors="backslashreplace").decode("utf-8")
    if isinstance(doc, dict):
        return {_utf8(k): _utf8(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_utf8(v) for v in doc]
    return doc


@dataclass(frozen=True, slots=True)
class Wanted:
    """What to keep of each step."""

    json_top: int | None = None
    """The step's ``--json`` entry with this many top ops (and longest path segments); None: none."""
    full_path: bool = False
    """In the JSON entry, the critical path segment by segment (``--full-path``), not only its longest segments."""
    row: bool = False
    """Its row of the terminal's steps table."""
    critical: bool = False
    """Its critical events (``--perfetto``)."""


@dataclass(slots=True)
class StepOutput:
    step: int | None
    step_time: float  # µs
    figures: StepFigures
    json: bytes | None
    row: list | None
    critical: tuple[np.ndarray, np.ndarray] | None


def output_of(wanted: Wanted, a: StepAnalysis) -> StepOutput:
    """What ``wanted`` keeps of the analysed step ``a``."""
    return StepOutput(
        step=a.graph.step,
        step_time=a.step_time,
        figures=StepFigures.of(a),
        json=dumps(a.report(wanted.json_top, wanted.full_path)) if wanted.json_top is not None else None,
        row=step_row(a) if wanted.row else None,
        critical=critical_events(a) if wanted.critical else None,
    )

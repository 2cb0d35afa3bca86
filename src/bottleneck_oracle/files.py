"""Reading small input files (configs, recipe files) safely: a regular file, of bounded size, in
UTF-8 — anything else is one OracleError naming the file and the problem (a FIFO given as a
config would otherwise block forever, a binary file raise a decoding traceback)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from bottleneck_oracle.errors import OracleError

MAX_TEXT_BYTES = 16 * 2**20  # a config or recipe file larger than this is not one


def regular_file(path: str | Path, what: str) -> Path:
    """``path`` if it is a regular file; OracleError saying what it is instead."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise OracleError(f"{p}: {what} not found") from None
    except OSError as exc:
        raise OracleError(f"{p}: cannot read the {what} ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise OracleError(f"{p}: is a folder, expected a {what}")
    if not stat.S_ISREG(mode):
        raise OracleError(f"{p}: is not a regular file (a FIFO, device or socket), expected a {what}")
    return p


def read_text(path: str | Path, what: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of a small regular file."""
    p = regular_file(path, what)
    if p.stat().st_size > max_bytes:
        raise OracleError(f"{p}: larger than {max_bytes // 2**20} MiB, not a {what}")
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OracleError(f"{p}: the {what} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise OracleError(f"{p}: cannot read the {what} ({exc.strerror or exc})") from None


MAX_JSONL_BYTES = 1 << 30  # a manifest or dataset index larger than this is not one


def read_jsonl(path: str | Path, what: str, required: tuple[str, ...], remedy: str) -> list[dict]:
    """The rows of a JSON-lines file (a run manifest, a dataset index), each an object holding the
    ``required`` keys; a line that is not one is an OracleError naming the file, the line and the
    ``remedy``, not a KeyError later."""
    rows = []
    for n, line in enumerate(read_text(path, what, MAX_JSONL_BYTES).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise OracleError(f"{path}:{n}: not a JSON object ({remedy})") from None
        if not isinstance(row, dict):
            raise OracleError(f"{path}:{n}: not a JSON object ({remedy})")
        missing = [k for k in required if k not in row]
        if missing:
            raise OracleError(f"{path}:{n}: a row without {', '.join(missing)} ({remedy})")
        rows.append(row)
    return rows

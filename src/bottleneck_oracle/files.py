"""Reading small input files (configs, recipe files, archives of arrays) safely: a regular file,
of bounded size, in UTF-8 — anything else is one OracleError naming the file and the problem (a
FIFO given as a config would otherwise block forever, a binary file raise a decoding traceback).
Sizes are checked before anything is built from them: a YAML file's values with its aliases
expanded and its nesting, a zip archive's members as they declare themselves."""

from __future__ import annotations

import json
import stat
import zipfile
from pathlib import Path

import yaml

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


MAX_YAML_NODES = 100_000  # values a config or recipe file holds, aliases expanded (the shipped config: about 100)
MAX_YAML_DEPTH = 32  # nesting of lists and mappings (the shipped files: 4)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where installed: the same safe constructors, in C


def read_yaml(path: str | Path, what: str) -> object:
    """The YAML document of a small text file, built with the safe loader (no tags that run code)
    once its size is known to be sane (``check_yaml_size``)."""
    text = read_text(path, what)
    try:
        check_yaml_size(path, text)
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)
    except yaml.YAMLError as exc:
        raise OracleError(f"{path}: the {what} is not valid YAML ({exc.__class__.__name__})") from None


def check_yaml_size(path: str | Path, text: str) -> None:
    """Walk the YAML event stream (nothing is built, nothing recurses): OracleError past
    MAX_YAML_DEPTH levels of nesting, or past MAX_YAML_NODES values counting every alias as the
    values it repeats (``a: &a [x, x]``, ``b: &b [*a, *a]``, ... doubles at each line: a 1 KB
    file would otherwise expand to gigabytes wherever its value is listed or printed)."""
    sizes: dict[str, int] = {}  # anchor -> values under it, aliases expanded
    open_: list[tuple[str | None, int]] = []  # open lists and mappings: their anchor, the count when they opened
    count = 0
    for ev in yaml.parse(text, Loader=_LOADER):
        if isinstance(ev, yaml.AliasEvent):
            count += sizes.get(ev.anchor, 1)
        elif isinstance(ev, yaml.ScalarEvent):
            count += 1
            if ev.anchor:
                sizes[ev.anchor] = 1
        elif isinstance(ev, yaml.CollectionStartEvent):
            open_.append((ev.anchor, count))
            count += 1
            if len(open_) > MAX_YAML_DEPTH:
                raise OracleError(f"{path}: nested more than {MAX_YAML_DEPTH} levels deep")
        elif isinstance(ev, yaml.CollectionEndEvent) and open_:
            anchor, start = open_.pop()
            if anchor:
                sizes[anchor] = count - start
        if count > MAX_YAML_NODES:
            raise OracleError(f"{path}: holds more than {MAX_YAML_NODES:,} values once its aliases are expanded")


MAX_ARCHIVE_BYTES = 512 * 2**20  # what the members of a checkpoint, graph or corrections archive may declare, together
MAX_DEFLATE_RATIO = 200  # deflate of real arrays stays far below this; zeros reach 1000x


def check_archive(path: str | Path, what: str, max_bytes: int = MAX_ARCHIVE_BYTES) -> None:
    """Refuse, before a byte is inflated, a zip archive (``.npz``, torch's ``.pt``) whose members
    declare more than ``max_bytes`` together, or one compressed more than MAX_DEFLATE_RATIO times
    (a 6 MB member of zeros that declares 6 GiB). Readers never get more than a member declares
    (zipfile stops there), so the declared sizes bound the memory."""
    try:
        with zipfile.ZipFile(path) as zf:
            members = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise OracleError(f"{path}: not a {what} (not a zip archive: {exc.__class__.__name__})") from None
    total = sum(m.file_size for m in members)
    if total > max_bytes:
        raise OracleError(f"{path}: its members declare {total:,} bytes, more than a {what} holds ({max_bytes // 2**20} MiB)")
    for m in members:
        if m.file_size > 2**20 and m.file_size > MAX_DEFLATE_RATIO * max(m.compress_size, 1):
            raise OracleError(
                f"{path}: member {m.filename[:80]!r} inflates {m.compress_size:,} bytes to {m.file_size:,}: a decompression bomb, not a {what}"
            )

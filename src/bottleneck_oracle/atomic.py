"""Atomic file writes: write beside the target, then rename, so nothing is half-written.

The target must be a regular file or not exist yet: a folder, a FIFO or a device given as an
output is refused (the rename would replace ``/dev/null`` for a user who can write ``/dev``).
Files get the permissions a plain ``open`` would give them (0666 minus the umask), so a
colleague on a shared cluster can read the report, not the 0600 of a temporary file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bottleneck_oracle.errors import OracleError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_target(target: str | Path) -> Path:
    """The output path if a regular file may be written there; OracleError naming it otherwise."""
    target = Path(target)
    try:
        st = target.stat()
    except FileNotFoundError:
        parent = target.parent
        if parent.exists() and not parent.is_dir():
            raise OracleError(f"{target}: cannot write here, {parent} is not a folder") from None
        return target
    except OSError as exc:
        raise OracleError(f"{target}: cannot write here ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise OracleError(f"{target}: is a folder, expected a file name to write")
    if not stat.S_ISREG(st.st_mode):
        raise OracleError(f"{target}: is not a regular file (a device, FIFO or socket); refusing to replace it")
    return target


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success it replaces ``target``."""
    target = check_target(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise OracleError(f"{target}: cannot write here ({exc.strerror or exc})") from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EISDIR, errno.ENOTDIR):
            raise OracleError(f"{target}: cannot write ({exc.strerror or exc})") from None
        raise
    finally:
        Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_paths(*targets: str | Path | None) -> Iterator[list[Path | None]]:
    """Several outputs written together: every target is checked before anything is written,
    and none is replaced unless all were written (a failed run leaves nothing behind)."""
    for t in targets:
        if t is not None:
            check_target(t)
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(atomic_path(t)) if t is not None else None for t in targets]


# Names the trace loader reads in a folder (Kineto JSON, Chakra ET): an output with such a name
# inside a folder being analysed would be read as a rank's trace by every later run.
TRACE_NAMES = (".json", ".json.gz", ".et", ".et.gz")


def _identity(p: Path) -> tuple[int, int] | None:
    try:
        st = p.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _input_files(p: Path, depth: int = 2) -> Iterator[Path]:
    """The regular files under an input path, to the depth the loader reads (a folder of ranks,
    or one subfolder per rank)."""
    if depth < 0:
        return
    try:
        if not p.is_dir():
            yield p
            return
        entries = list(p.iterdir())
    except OSError:
        return
    for e in entries:
        yield from _input_files(e, depth - 1)


def guard_outputs(outputs: dict[str, Path | None], inputs: list[Path | None]) -> None:
    """Refuse, before any work, an output that would replace or join an input.

    Args:
        outputs: option name (``--html``) -> the path it writes, or None.
        inputs: the paths read (trace files or folders, execution traces, baselines, configs).

    Raises OracleError naming the option and the input when an output is (a link to, a hard link
    of) an input file, two outputs are the same file, or an output would land inside an input
    folder under a name the loader reads as a trace (a later run would read it as a rank)."""
    given = [(opt, Path(p)) for opt, p in outputs.items() if p is not None]
    seen: dict[str, str] = {}
    for opt, out in given:
        check_target(out)
        real = os.path.realpath(out)
        if real in seen:
            raise OracleError(f"{out}: {opt} and {seen[real]} name the same file; give each its own")
        seen[real] = opt
    for src in inputs:
        if src is None:
            continue
        src = Path(src)
        src_real = os.path.realpath(src)
        files = list(_input_files(src))
        ids = {i for f in files if (i := _identity(f)) is not None}
        reals = {os.path.realpath(f) for f in files}
        for opt, out in given:
            real = os.path.realpath(out)
            ident = _identity(out)
            if real in reals or (ident is not None and ident in ids) or real == src_real:
                raise OracleError(f"{out}: {opt} would overwrite the input {src}; write the output elsewhere")
            depth = len(Path(real).relative_to(src_real).parts) if src.is_dir() and Path(real).is_relative_to(src_real) else 0
            if 0 < depth <= 2 and out.name.endswith(TRACE_NAMES):  # where the loader looks: the folder, one subfolder per rank
                raise OracleError(
                    f"{out}: {opt} would write a trace-like file inside the input folder {src} "
                    "(later runs would read it as a rank); write it elsewhere or under another name"
                )


def guard_output_folder(opt: str, folder: Path | None, inputs: list[Path | None]) -> None:
    """Refuse an output folder that is an input or lies inside an input folder."""
    if folder is None:
        return
    real = os.path.realpath(folder)
    for src in inputs:
        if src is None:
            continue
        src_real = os.path.realpath(src)
        inside = real == src_real or real.startswith(src_real.rstrip(os.sep) + os.sep)
        if inside:
            raise OracleError(f"{folder}: {opt} would write into the input {src}; write the output elsewhere")

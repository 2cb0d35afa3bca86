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

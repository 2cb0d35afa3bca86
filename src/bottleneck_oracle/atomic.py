"""Atomic file writes: write beside the target, then rename, so nothing is half-written; a
folder of outputs (``atomic_folder``) is written into a hidden folder beside it and renamed as a
whole, so a run that stops half-way leaves no folder that looks like output.

The target must be a regular file or not exist yet: a folder, a FIFO or a device given as an
output is refused (the rename would replace ``/dev/null`` for a user who can write ``/dev``).
Files get the permissions a plain ``open`` would give them (0666 minus the umask), so a
colleague on a shared cluster can read the report, not the 0600 of a temporary file.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from bottleneck_oracle.errors import OracleError


class Interrupted(BaseException):
    """A signal that ends the process (SIGTERM, SIGHUP, ...) while ``unwinding_signals`` is on: it
    unwinds the command like Ctrl-C does, so every temporary file and folder of an output being
    written is removed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# signals whose default ends the process on the spot; SIGINT raises KeyboardInterrupt, as always
UNWINDING = tuple(
    getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGXCPU") if hasattr(signal, n)
)
_state = {"pid": os.getpid(), "held": 0, "pending": 0}


def _on_signal(signum: int, frame: object) -> None:
    if os.getpid() != _state["pid"]:  # a forked parse worker: nothing of its own to clean; it ends as the signal says
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _state["held"]:  # a temporary name is being created: raised once it is recorded (``uninterrupted``)
        _state["pending"] = signum
        return
    _raise(signum)


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(signum)


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A signal arriving in the block is raised at its end (only where ``unwinding_signals`` is
    on): for writers that cannot be stopped half-way cleanly (zipfile's, under ``np.savez``, fails
    again while closing), and for a temporary name between its creation and its recording."""
    _state["held"] += 1
    try:
        yield
    finally:
        _state["held"] -= 1
        if not _state["held"] and _state["pending"]:
            signum, _state["pending"] = _state["pending"], 0
            _raise(signum)


@contextlib.contextmanager
def unwinding_signals() -> Iterator[None]:
    """While the block runs, the UNWINDING signals raise (Interrupted, or KeyboardInterrupt for
    SIGINT) in the main thread, so ``atomic_path`` and ``atomic_folder`` remove what they were
    writing; the handlers from before are back after. (Not in other threads: Python handles
    signals in the main one.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["pid"] = os.getpid()
    previous = {s: signal.signal(s, _on_signal) for s in UNWINDING}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


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
    tmp = ""
    try:
        with uninterrupted():  # a signal between the file's creation and ``tmp`` naming it would leave it behind
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            except OSError as exc:
                raise OracleError(f"{target}: cannot write here ({exc.strerror or exc})") from None
            os.close(fd)
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except OSError as exc:  # a full disk, a quota, a file size limit, a read-only or vanished folder, ...
        if not _writing(exc, tmp, target):
            raise
        raise OracleError(f"{target}: cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)


def _writing(exc: OSError, *paths: str | Path) -> bool:
    """Whether ``exc`` is about writing an output: about one of ``paths`` (or a file in a folder
    among them), or a write's error, which names no file (an error reading some other file is not)."""
    if exc.filename is None:
        return True
    name = os.fsdecode(exc.filename) if isinstance(exc.filename, (str, bytes, os.PathLike)) else str(exc.filename)
    return any(name == str(p) or name.startswith(str(p) + os.sep) for p in paths)


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


def check_folder_target(target: Path, ours: re.Pattern[str]) -> None:
    """Refuse, before any work, an output folder that ``atomic_folder`` may not replace: one that
    is not a folder, or holds an entry whose name ``ours`` does not match (something other than
    a previous run's output would be deleted with it)."""
    try:
        st = target.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OracleError(f"{target}: cannot write here ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OracleError(f"{target}: is not a folder; give a folder name for the output")
    try:
        foreign = sorted(e.name for e in os.scandir(target) if not ours.fullmatch(e.name))
    except OSError as exc:
        raise OracleError(f"{target}: cannot list the output folder ({exc.strerror or exc})") from None
    if foreign:
        raise OracleError(
            f"{target}: the output folder holds {foreign[0]!r}{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}, "
            "which this command did not write; it replaces the folder as a whole: give a new or empty folder"
        )


@contextlib.contextmanager
def atomic_folder(target: str | Path, ours: re.Pattern[str]) -> Iterator[Path]:
    """Yield a hidden temporary folder beside ``target``; once the block succeeds it becomes
    ``target`` in one rename (an existing ``target``, which ``check_folder_target`` allows, is
    swapped out and deleted). A block that fails or is interrupted leaves ``target`` as it was
    and removes the temporary folder."""
    target = Path(target)
    if target.is_symlink():  # a link to a folder: the folder it names is the output (the link stays)
        target = Path(os.path.realpath(target))
    check_folder_target(target, ours)
    tmp: Path | None = None
    try:
        with uninterrupted():
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
            except OSError as exc:
                raise OracleError(f"{target}: cannot write here ({exc.strerror or exc})") from None
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        check_folder_target(target, ours)  # (still: nothing foreign appeared meanwhile)
        with uninterrupted():  # the commit is not cut in two
            if not target.exists():
                os.rename(tmp, target)
            elif not _exchange(tmp, target):  # no atomic swap here: the old one aside, the new one in
                old = tmp.with_name(tmp.name + ".old")
                os.rename(target, old)
                os.rename(tmp, target)
                tmp = old
    except OSError as exc:
        if not _writing(exc, *([tmp] if tmp else []), target):
            raise
        raise OracleError(f"{target}: cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0

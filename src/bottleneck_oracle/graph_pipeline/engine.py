"""Where the independent pieces of work run: per-rank parsing and per-step graph building.

    local        processes of this machine (forked: they share the parent's memory), the default
    dask         a Dask cluster: a LocalCluster of this machine's cores, or the scheduler at
                 ``dask://HOST:PORT`` / ``tcp://HOST:PORT`` (workers need bottleneck-oracle
                 installed and the trace files at the same path: a shared file system)
    an Executor  any ``concurrent.futures.Executor`` the API is given (a thread pool, a
                 ``distributed.Client().get_executor()``, an MPI pool, ...)

Every engine returns results in input order, so the answers do not depend on where the work ran.
Data every task needs (the event table, when graphs are built) is ``shared``: sent to each
worker once (Dask: scattered to every worker), not once per task.

A Dask address is checked before Dask is given it: its form, that something listens there, and
that what answers speaks Dask's protocol (a scheduler greets first; any other server would have
its first bytes read as a message length). A worker that dies mid-task has the task run again
elsewhere (the scheduler's ``distributed.scheduler.allowed-failures`` retries, 3 by default);
a task that kills every worker it runs on, or a scheduler that goes away, is one OracleError.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import multiprocessing
import os
import pickle
import socket
import struct
import tempfile
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, Executor, ProcessPoolExecutor
from typing import Any, TypeVar

from bottleneck_oracle.errors import OracleError, first_line

T = TypeVar("T")  # an item of imap/map
R = TypeVar("R")  # what fn makes of it
_SHARED: dict[str, Any] = {}  # per local worker process: the shared data its tasks read


def _init_shared(shared: Any) -> None:
    _SHARED["data"] = shared


def _call_with_shared(fn: Callable[[Any, Any], Any], item: Any) -> Any:
    return fn(_SHARED["data"], item)


class Engine:
    """An engine (module docstring). What every engine does with ``imap``: ``map`` lists it; ``close`` has nothing to free."""

    def imap(self, fn: Callable[[Any, T], R], items: Iterable[T], shared: Any = None, workers: int | None = None) -> Iterator[R]:
        raise NotImplementedError

    def map(self, fn: Callable[[Any, T], R], items: Iterable[T], shared: Any = None, workers: int | None = None) -> list[R]:
        """``[fn(shared, item) for item in items]``, where the engine runs its work."""
        return list(self.imap(fn, items, shared, workers))

    def close(self) -> None:
        pass


class LocalEngine(Engine):
    """Processes of this machine; one when ``workers`` is 1 (then nothing is copied)."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1

    def imap(self, fn: Callable[[Any, T], R], items: Iterable[T], shared: Any = None, workers: int | None = None) -> Iterator[R]:
        """The results of ``map`` one at a time, in input order, as they are ready."""
        items = list(items)
        n = min(workers or self.workers, len(items))
        if n < 2 or "fork" not in multiprocessing.get_all_start_methods():
            yield from (fn(shared, it) for it in items)
            return
        ctx = multiprocessing.get_context("fork")  # forked workers see ``shared`` without a copy
        pool = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_init_shared, initargs=(shared,))
        done = False
        try:
            yield from pool.map(_call_with_shared, [fn] * len(items), items, chunksize=max(1, min(16, len(items) // (4 * n))))
            done = True
        finally:  # a failed item (a bad file) stops the rest at once instead of waiting for every queued one
            pool.shutdown(wait=done, cancel_futures=not done)


class FuturesEngine(Engine):
    """Any concurrent.futures.Executor; ``shared`` travels with each task."""

    name = "executor"

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def imap(self, fn: Callable[[Any, T], R], items: Iterable[T], shared: Any = None, workers: int | None = None) -> Iterator[R]:
        items = list(items)
        yield from self.executor.map(fn, [shared] * len(items), items)


class DaskEngine(Engine):
    """A Dask distributed cluster: this machine's LocalCluster, or a scheduler's address."""

    name = "dask"

    def __init__(self, address: str | None = None, client: Any = None, workers: int | None = None, timeout: float = 20.0) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise OracleError("--executor dask needs Dask: pip install 'bottleneck-oracle[dask]'") from None
        # Dask logs what it retries or gives up on, tracebacks included, on stderr: what fails reaches
        # the caller as one OracleError instead (a lost worker's tasks are simply run again)
        for name in ["distributed", *logging.root.manager.loggerDict]:
            if name.split(".")[0] == "distributed":
                logging.getLogger(name).setLevel(logging.CRITICAL + 1)
        self._own = client is None
        self._cluster = None
        self._folder: tempfile.TemporaryDirectory[str] | None = None  # shared data for a LocalCluster's workers
        if client is not None:
            self.client = client
        elif address:
            host, port = dask_address(address)
            if address.startswith("tcp://"):
                probe_scheduler(host, port, min(timeout, PROBE_S))
            try:
                self.client = Client(address, timeout=timeout)  # type: ignore[no-untyped-call, unused-ignore]  # (strict mode only: Dask's constructors have no annotations)
            except Exception as exc:  # noqa: BLE001 - whatever Dask raises for an address it cannot use (TLS without certificates, ...)
                raise OracleError(f"cannot connect to the Dask scheduler at {address} ({type(exc).__name__}: {first_line(exc)})") from None
        else:
            n = workers or os.cpu_count() or 1
            self._cluster = LocalCluster(  # type: ignore[no-untyped-call, unused-ignore]  # (strict mode only: the same)
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50, memory_limit=0
            )
            self.client = Client(self._cluster)  # type: ignore[no-untyped-call, unused-ignore]  # (strict mode only: the same)

    def imap(self, fn: Callable[[Any, T], R], items: Iterable[T], shared: Any = None, workers: int | None = None) -> Iterator[R]:
        """Results in input order; each is released on the cluster once fetched."""
        items = list(items)
        if not items:
            return
        futures = self._submit(fn, items, shared)
        retried = False
        i = 0
        try:
            while i < len(items):
                # fetched GATHER at a time: one round trip per result made thousands of small tasks
                # (a folder of rank files) wait on the network more than on their work
                batch = futures[i : i + GATHER]
                try:
                    try:
                        results = self.client.gather(batch)
                    except Exception:  # noqa: BLE001 - one of them failed: each in input order, so that the first is the one raised
                        results = [futures[i].result()]
                except OracleError:  # the task's own answer: a bad file on that worker
                    raise
                except Exception as exc:  # noqa: BLE001 - the cluster's failures, whatever Dask raises for them
                    if retried or not self._lost_data(exc):
                        raise self._failed(exc) from None
                    retried = True  # the worker holding the only copy of a task's input died: once more, from here
                    try:
                        futures[i:] = self._submit(fn, items[i:], shared)
                    except OracleError:
                        raise self._failed(exc) from None
                    continue
                for result in results:
                    futures[i] = None
                    yield result
                    i += 1
        finally:
            del futures

    def _submit(self, fn: Callable[[Any, Any], Any], items: list[Any], shared: Any) -> list[Any]:
        """Futures of ``fn(shared, item)`` per item, ``shared`` scattered to every worker once; on
        this engine's own LocalCluster, written once to a file the workers map instead (the event
        table of thousands of ranks is gigabytes: sent to each worker, it cost more than the work)."""
        try:
            if self._cluster is not None and shared is not None and not isinstance(shared, (bool, int, str)):
                try:
                    path = self._shared_file(shared)
                except OSError:  # no room for it in the temporary folder: sent to each worker instead
                    path = None
                if path is not None:
                    return list(self.client.map(_call_with_file, [fn] * len(items), [path] * len(items), items, pure=False))
            ref = self.client.scatter(shared, broadcast=True, hash=False) if shared is not None else None
            futures: list[Any] = self.client.map(fn, [ref] * len(items), items, pure=False)
            return futures
        except Exception as exc:  # noqa: BLE001
            raise self._failed(exc) from None

    def _lost_data(self, exc: BaseException) -> bool:
        """A task cancelled because data it needed went with a dead worker, the scheduler still there."""
        from distributed.client import FutureCancelledError

        return isinstance(exc, FutureCancelledError) and getattr(self.client, "status", "") == "running"

    def _failed(self, exc: BaseException) -> OracleError:
        """A failure of the cluster, or of a task on it, as one OracleError."""
        import asyncio  # (here: a local run does not pay for importing it)

        from distributed.comm.core import CommClosedError
        from distributed.scheduler import KilledWorker

        where = getattr(self.client, "scheduler", None)
        where = getattr(where, "address", None) or "the Dask cluster"
        if isinstance(exc, KilledWorker):
            return OracleError(
                f"Dask: every worker that ran a task died during it ({first_line(exc)}); the scheduler gave up after "
                "distributed.scheduler.allowed-failures retries (out of memory? see the workers' logs)"
            )
        if isinstance(exc, (CommClosedError, CancelledError, asyncio.CancelledError, TimeoutError, OSError)):
            return OracleError(f"Dask: lost the scheduler at {where} during the run ({type(exc).__name__}: {first_line(exc)})")
        # a task that raised on a worker: another machine's environment (a different version installed, a
        # module missing), whose traceback says nothing here
        return OracleError(f"Dask: a task failed on a worker of {where} ({type(exc).__name__}: {first_line(exc)})")

    def _shared_file(self, shared: Any) -> str:
        """``shared`` written to a file of this engine's private folder (dump_shared); its path.
        A file that could not be written whole is removed (OSError raised)."""
        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory(prefix="bottleneck-oracle-dask-")
        path = os.path.join(self._folder.name, f"shared-{len(os.listdir(self._folder.name))}.bin")
        try:
            dump_shared(shared, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return path

    def close(self) -> None:
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
        if self._own:
            self.client.close()
            if self._cluster is not None:
                self._cluster.close()


def dump_shared(obj: Any, path: str) -> None:
    """Write ``obj`` for ``load_shared``: its pickle with the numpy arrays' bytes out of band, each
    aligned in the file, so that a worker maps them instead of reading them (this engine's own
    data between its own processes, in a folder only this user can read; never a user's file)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<QQ", len(head), len(buffers)))
        fh.write(head)
        for b in buffers:
            raw = b.raw()
            fh.write(b"\0" * (-fh.tell() % _ALIGN))
            fh.write(struct.pack("<Q", raw.nbytes))
            fh.write(b"\0" * (-fh.tell() % _ALIGN))
            fh.write(raw)


def load_shared(path: str) -> object:
    """What ``dump_shared`` wrote, its arrays over a private (copy-on-write) mapping of the file:
    the pages are the page cache's until a worker writes to them."""
    with open(path, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(m)
    n_head, n_buf = struct.unpack_from("<QQ", m, 0)
    at = 16
    head = view[at : at + n_head]
    at += n_head
    buffers = []
    for _ in range(n_buf):
        at += -at % _ALIGN
        (size,) = struct.unpack_from("<Q", m, at)
        at += 8
        at += -at % _ALIGN
        buffers.append(view[at : at + size])
        at += size
    return pickle.loads(head, buffers=buffers)


_ALIGN = 64
_LOADED: dict[str, Any] = {}  # per Dask worker process: the shared data of the latest file it was given


def _call_with_file(fn: Callable[[Any, Any], Any], path: str, item: Any) -> Any:
    if path not in _LOADED:
        _LOADED.clear()  # an earlier command's data is done with
        _LOADED[path] = load_shared(path)
    return fn(_LOADED[path], item)


GATHER = 32  # results fetched from a Dask cluster at once (in input order; memory: this many results)
PROBE_S = 5.0  # seconds a scheduler gets to greet a new connection (it does at once)
MAX_GREETING = 1 << 20  # bytes: a scheduler's greeting (its handshake) is a few hundred


def dask_address(address: str) -> tuple[str, int]:
    """(host, port) of ``tcp://HOST:PORT`` / ``tls://HOST:PORT``; OracleError if it is not one."""
    shown = repr(address[:200])
    if any(c.isspace() or not c.isprintable() for c in address):
        raise OracleError(f"Dask scheduler address {shown} holds spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(address)
        port = parts.port
    except ValueError as exc:
        raise OracleError(f"Dask scheduler address {shown} is not HOST:PORT ({exc})") from None
    if not parts.hostname or port is None or not 0 < port < 65536 or parts.path.strip("/") or parts.query or parts.fragment:
        raise OracleError(f"Dask scheduler address {shown} is not HOST:PORT (e.g. dask://10.0.0.5:8786)")
    return parts.hostname, port


def probe_scheduler(host: str, port: int, timeout: float = PROBE_S) -> None:
    """Check that a Dask scheduler answers at host:port before Dask connects: it must greet
    within ``timeout`` with one framed message (an 8-byte length, frame count and lengths that
    add up) of at most MAX_GREETING bytes. Dask itself would take the first 8 bytes of any other
    server as a length and allocate it (an HTTP server's reply read as 2.8 EiB)."""
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            head = _recv(sock, 8, where)
            (total,) = struct.unpack("<Q", head)
            if not 16 <= total <= MAX_GREETING:
                raise OracleError(f"{where} is not a Dask scheduler: it sent {head!r}, not a Dask message")
            body = _recv(sock, 8, where)
            (frames,) = struct.unpack("<Q", body)
            if not 0 < frames <= 64 or 8 * (frames + 1) > total:
                raise OracleError(f"{where} is not a Dask scheduler: its first message is not in Dask's framing")
    except TimeoutError:
        raise OracleError(f"{where} is not a Dask scheduler: nothing greeted within {timeout:g} s") from None
    except ConnectionError as exc:
        raise OracleError(f"cannot reach the Dask scheduler at tcp://{where} ({exc.strerror or type(exc).__name__})") from None
    except OSError as exc:  # no such host, no route
        raise OracleError(f"cannot reach the Dask scheduler at tcp://{where} ({exc.strerror or exc})") from None


def _recv(sock: socket.socket, n: int, where: str) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OracleError(f"{where} is not a Dask scheduler: it closed the connection without a greeting")
        data += chunk
    return data


def make_engine(spec: str | Executor | Any | None = None, workers: int | None = None) -> Engine:
    """An engine from ``local`` / ``dask`` / ``dask://HOST:PORT`` / ``tcp://HOST:PORT``, a
    concurrent.futures.Executor, a distributed.Client, or None (local)."""
    if spec is None or spec == "local":
        return LocalEngine(workers)
    if isinstance(spec, Engine):
        return spec
    if isinstance(spec, Executor):
        return FuturesEngine(spec)
    if isinstance(spec, str):
        if spec == "dask":
            return DaskEngine(workers=workers)
        if spec.startswith("dask://"):
            return DaskEngine(address="tcp://" + spec.removeprefix("dask://"))
        if spec.startswith(("tcp://", "tls://")):
            return DaskEngine(address=spec)
        raise OracleError(f"unknown executor {spec!r}: local, dask, or dask://HOST:PORT")
    if type(spec).__name__ == "Client" and hasattr(spec, "scatter"):
        return DaskEngine(client=spec)
    raise OracleError(f"unknown executor {spec!r}: local, dask, dask://HOST:PORT or a concurrent.futures.Executor")

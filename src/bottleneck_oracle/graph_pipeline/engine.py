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
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

from bottleneck_oracle.errors import OracleError

_SHARED: dict[str, Any] = {}  # per local worker process: the shared data its tasks read


def _init_shared(shared: Any) -> None:
    _SHARED["data"] = shared


def _call_with_shared(fn: Callable, item: Any) -> Any:
    return fn(_SHARED["data"], item)


class Engine:
    """An engine (module docstring). What every engine does with ``imap``: ``map`` lists it; ``close`` has nothing to free."""

    def imap(self, fn: Callable, items: Iterable, shared: Any = None, workers: int | None = None) -> Iterator:
        raise NotImplementedError

    def map(self, fn: Callable, items: Iterable, shared: Any = None, workers: int | None = None) -> list:
        """``[fn(shared, item) for item in items]``, where the engine runs its work."""
        return list(self.imap(fn, items, shared, workers))

    def close(self) -> None:
        pass


class LocalEngine(Engine):
    """Processes of this machine; one when ``workers`` is 1 (then nothing is copied)."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1

    def imap(self, fn: Callable, items: Iterable, shared: Any = None, workers: int | None = None) -> Iterator:
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

    def imap(self, fn: Callable, items: Iterable, shared: Any = None, workers: int | None = None) -> Iterator:
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
        self._own = client is None
        self._cluster = None
        if client is not None:
            self.client = client
        elif address:
            try:
                self.client = Client(address, timeout=timeout)
            except (OSError, TimeoutError) as exc:
                raise OracleError(f"cannot reach the Dask scheduler at {address} ({exc})") from None
        else:
            n = workers or os.cpu_count() or 1
            self._cluster = LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=50, memory_limit=0
            )
            self.client = Client(self._cluster)

    def imap(self, fn: Callable, items: Iterable, shared: Any = None, workers: int | None = None) -> Iterator:
        """Results in input order; each is released on the cluster once fetched."""
        items = list(items)
        if not items:
            return
        ref = self.client.scatter(shared, broadcast=True, hash=False) if shared is not None else None
        futures = self.client.map(fn, [ref] * len(items), items, pure=False)
        try:
            for i in range(len(futures)):
                yield futures[i].result()
                futures[i] = None
        finally:
            del futures, ref

    def close(self) -> None:
        if self._own:
            self.client.close()
            if self._cluster is not None:
                self._cluster.close()


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

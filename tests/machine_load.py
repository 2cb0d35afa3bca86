"""How busy the rest of the machine was while a test recorded a live run.

A live recording's timings depend on what else runs: on a loaded 2-core machine, one rank
sleeping lets the other take a core it was sharing, and part of an injected delay is absorbed.
``OtherLoad`` measures the CPU time that neither this process nor its children (the ranks) used
during a block, as a number of busy cores, so a test can tell a quiet machine from a loaded one
instead of guessing from the spread of its own steps."""

from __future__ import annotations

import os
import time


def _busy_seconds() -> float | None:
    """CPU time the whole machine has spent busy (all cores), from /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """``with OtherLoad() as load: ...``; then ``load.cores``: the average number of cores that
    other processes kept busy during the block (None where /proc/stat cannot be read)."""

    cores: float | None = None

    def __enter__(self) -> OtherLoad:
        self._busy, self._own, self._wall = _busy_seconds(), os.times(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        busy, own, wall = _busy_seconds(), os.times(), time.monotonic() - self._wall
        if busy is None or self._busy is None or wall <= 0:
            return
        mine = sum(own[:4]) - sum(self._own[:4])  # user + system, this process and its waited-for children
        self.cores = max(0.0, (busy - self._busy) - mine) / wall

"""Small array helpers for the per-step code paths, where numpy's general routines cost more in
their fixed overhead than in their work (a step's arrays hold a few thousand rows, and a long run
has thousands of steps)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import numba
import numpy as np


def isin_small(values: np.ndarray, members: Iterable[int]) -> np.ndarray:
    """``np.isin(values, members)`` for a handful of members: one comparison each (np.isin sorts)."""
    out = np.zeros(np.shape(values), dtype=bool)
    for m in np.asarray(list(members)).tolist():
        out |= values == m
    return out


def isin_sorted(values: np.ndarray, members_sorted: np.ndarray) -> np.ndarray:
    """``np.isin(values, members)`` where ``members_sorted`` is sorted ascending: a binary search."""
    if not len(members_sorted):
        return np.zeros(np.shape(values), dtype=bool)
    pos = np.minimum(np.searchsorted(members_sorted, values), len(members_sorted) - 1)
    found: np.ndarray = members_sorted[pos] == values
    return found


def groups(keys: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Each distinct key (ascending) and the positions holding it, in input order within a key
    (one stable sort: keys that come in blocks, a rank's events, sort in one pass)."""
    by = np.argsort(keys, kind="stable")
    k = keys[by]
    cuts = [0, *(np.flatnonzero(k[1:] != k[:-1]) + 1).tolist(), len(k)]
    return [(int(k[a]), by[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a]


def span_positions(
    group_s: np.ndarray, value_s: np.ndarray, spans: list[tuple[int, float, float]], end_side: Literal["left", "right"] = "left"
) -> list[tuple[int, int]]:
    """For each ``(group, lo, hi)`` of ``spans``: the positions [a, b) of the entries of that group
    with ``lo <= value < hi`` (``<= hi`` with ``end_side`` "right") in arrays sorted by group, then
    value (``group_s``, ``value_s``). One search of each group's range for all of its spans."""
    out = [(0, 0)] * len(spans)
    by: dict[int, list[int]] = {}
    for i, (g, _, _) in enumerate(spans):
        by.setdefault(g, []).append(i)
    for g, idx in by.items():
        key = group_s.dtype.type(g)  # of the array's type: a Python int would convert the whole array
        lo, hi = int(np.searchsorted(group_s, key, side="left")), int(np.searchsorted(group_s, key, side="right"))
        values = value_s[lo:hi]
        a = lo + np.searchsorted(values, [spans[i][1] for i in idx], side="left")
        b = lo + np.searchsorted(values, [spans[i][2] for i in idx], side=end_side)
        for i, x, y in zip(idx, a.tolist(), b.tolist()):
            out[i] = (x, y)
    return out


def in_read_order(idx: np.ndarray, layout: np.ndarray | None) -> np.ndarray:
    """``idx`` (distinct positions) in the order they were read, where ``layout`` gives each
    position's place as read (None: as they are, ascending)."""
    idx = np.sort(idx)
    if layout is None or len(idx) < 2:
        return idx
    read = layout[idx]
    if bool((read[1:] > read[:-1]).all()):  # (one step's rows: already in that order)
        return idx
    out: np.ndarray = idx[np.argsort(read, kind="stable")]
    return out


SHARED_MIN_BYTES = 1 << 16  # smaller arrays stay where they are: a page or two of each is not worth a move


class SharedArena:
    """Memory shared with the processes this one forks (one anonymous shared mapping, filled
    array by array). Fork copies the page tables of a process's private memory, so a forked child
    counts every page of its parent's arrays in its resident size from its first instant; a shared
    mapping's pages are counted only once the child reads them."""

    def __init__(self, nbytes: int) -> None:
        import mmap

        self._buf = mmap.mmap(-1, max(nbytes, 1))
        self._at = 0
        self._lock = threading.Lock()  # (take is called from several threads at once)

    def _reserve(self, nbytes: int) -> int:
        with self._lock:
            at = self._at
            self._at += _aligned(nbytes)
        return at

    @staticmethod
    def size_of(tree: object) -> int:
        """At least the bytes ``move`` or ``take`` will need for the arrays in ``tree`` (dicts, lists
        and tuples of them; an array of any size counts)."""
        return sum(_aligned(a.nbytes) for a in _arrays(tree))

    def move(self, tree: Any) -> Any:
        """``tree`` with each of its arrays of SHARED_MIN_BYTES or more replaced by a copy in the
        arena (dicts changed in place, one array at a time: the original can go as soon as it is
        copied; lists and tuples rebuilt)."""
        if isinstance(tree, np.ndarray):
            if tree.nbytes < SHARED_MIN_BYTES or tree.dtype.hasobject or self._holds(tree):
                return tree
            out = np.frombuffer(self._buf, dtype=tree.dtype, count=tree.size, offset=self._reserve(tree.nbytes)).reshape(tree.shape)
            out[...] = tree
            return out
        if isinstance(tree, dict):
            for k in list(tree):
                tree[k] = self.move(tree[k])
            return tree
        if isinstance(tree, (list, tuple)):
            return type(tree)(self.move(x) for x in tree)
        return tree

    def _holds(self, a: np.ndarray) -> bool:
        """Whether ``a`` is already in the arena (an array met twice is moved once)."""
        base: object = a
        while isinstance(base, np.ndarray):
            base = base.base
        return isinstance(base, memoryview) and base.obj is self._buf

    def take(self, a: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``a[rows]``, made in the arena (``rows`` a permutation of a's rows, or any index)."""
        out = np.frombuffer(self._buf, dtype=a.dtype, count=len(rows), offset=self._reserve(len(rows) * a.dtype.itemsize))
        np.take(a, rows, out=out)
        return out


def _aligned(n: int) -> int:
    return (n + 63) // 64 * 64


def _arrays(tree: object) -> Iterator[np.ndarray]:
    if isinstance(tree, np.ndarray):
        if not tree.dtype.hasobject:
            yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _arrays(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _arrays(v)


@numba.njit(cache=True)
def csr(n: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges grouped by ``keys`` (a node id per edge, below ``n``): (ptr, order), edge
    ``order[ptr[v]:ptr[v + 1]]`` those of node v, in input order within a node (a counting sort:
    the same order as a stable argsort, in linear time)."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    for k in keys:
        ptr[k + 1] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    order = np.empty(len(keys), dtype=np.int64)
    fill = ptr[:-1].copy()
    for e in range(len(keys)):
        order[fill[keys[e]]] = e
        fill[keys[e]] += 1
    return ptr, order


@numba.njit(cache=True)
def kahn(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Kahn's topological order of the nodes the edges ``src -> dst`` let through (fewer than
    ``n`` when they form a cycle: the nodes on or behind one are left out), and the out-edges'
    ``csr`` (ptr, order)."""
    out_ptr, out_order = csr(n, src)
    indeg = np.zeros(n, dtype=np.int64)
    for d in dst:
        indeg[d] += 1
    queue = np.empty(n, dtype=np.int64)
    head = 0
    tail = 0
    for v in range(n):
        if indeg[v] == 0:
            queue[tail] = v
            tail += 1
    while head < tail:
        v = queue[head]
        head += 1
        for j in range(out_ptr[v], out_ptr[v + 1]):
            d = dst[out_order[j]]
            indeg[d] -= 1
            if indeg[d] == 0:
                queue[tail] = d
                tail += 1
    return queue[:tail], out_ptr, out_order

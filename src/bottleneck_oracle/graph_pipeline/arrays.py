"""Small array helpers for the per-step code paths, where numpy's general routines cost more in
their fixed overhead than in their work (a step's arrays hold a few thousand rows, and a long run
has thousands of steps)."""

from __future__ import annotations

from collections.abc import Iterable

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

"""A compiled scanner for the traceEvents array of a Kineto/Chrome trace.

Decoding a million-event trace into Python dicts costs more than everything the graph
needs afterwards, so the events array is scanned straight from the bytes into columns:
per event the phase, category and name (as byte spans and 64-bit FNV-1a hashes of their
raw bytes), pid/tid (numbers, or hashes of strings), ts/dur (integer part and fraction
kept apart: µs timestamps near 1.7e15 keep their sub-µs digits), the flow id, the three
args the graph reads for every event (correlation, External id, stream) and the event's
byte span, so the few events whose args need more (CUDA syncs, collectives) are decoded
in full by orjson. Everything outside the events array is small and decoded by orjson.

The scanner validates the JSON it walks; on malformed input it returns an error code and
the byte offset, which the caller turns into a message naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np

from bottleneck_oracle.graph_pipeline import fields as F

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)

# error codes
OK, BAD_JSON, TRUNCATED, NOT_NUMBER, TOO_MANY, NOT_OBJECT, OUT_OF_RANGE = 0, 1, 2, 3, 4, 5, 6
ERRORS = {
    BAD_JSON: "not valid JSON",
    TRUNCATED: "truncated JSON (the file ends inside the events)",
    NOT_NUMBER: "an event has a non-numeric ts, dur, pid, tid or id",
    TOO_MANY: "more events than the scanner allotted",
    NOT_OBJECT: "traceEvents holds an element that is not an object",
    OUT_OF_RANGE: "an event has a pid, tid or id beyond the 64-bit integer range (-2^63 to 2^64-1)",
}
INT_LIMIT = 9.2e18  # a number whose magnitude reaches this is no 64-bit integer id
NO_ID = np.int64(-(2**63))
"""An event's flow id when it has none: -2^63, the bits of the unsigned 2^63. A flow id of -1 (or
2^64 - 1, the unsigned -1) is none too; any other, of either sign or written as an unsigned
64-bit value, is an id."""

# event keys and hot args, by hash of their bytes (the field contract: fields.py)
_KEYS = F.EVENT_KEYS
_ARG_KEYS = F.SCANNED_ARG_KEYS


def fnv1a(data: bytes) -> int:
    """The scanner's hash of a byte string, computed in Python (for known names)."""
    h = int(FNV_OFFSET)
    for b in data:
        h ^= b
        h = (h * int(FNV_PRIME)) & 0xFFFFFFFFFFFFFFFF
    return h


KEY_HASH = np.array([fnv1a(k.encode()) for k in _KEYS], dtype=np.uint64)
ARG_HASH = np.array([fnv1a(k.encode()) for k in _ARG_KEYS], dtype=np.uint64)


@numba.njit(cache=True, nogil=True)
def _ws(buf, i, n):
    while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
        i += 1
    return i


@numba.njit(cache=True, nogil=True)
def _string(buf, i, n):
    """buf[i] is the opening quote; returns (index after the closing quote, hash of the raw content) or (-1, 0)."""
    h = FNV_OFFSET
    i += 1
    while i < n:
        c = buf[i]
        if c == 34:  # "
            return i + 1, h
        if c == 92:  # backslash: the escaped byte is part of the raw content
            h = (h ^ np.uint64(c)) * FNV_PRIME
            i += 1
            if i >= n:
                return -1, h
            c = buf[i]
        h = (h ^ np.uint64(c)) * FNV_PRIME
        i += 1
    return -1, h


@numba.njit(cache=True, nogil=True)
def _string_end(buf, i, n):
    """buf[i] is the opening quote; the index after the closing quote, or -1 (_string without the hash)."""
    i += 1
    while i < n:
        c = buf[i]
        if c == 34:  # "
            return i + 1
        if c == 92:  # backslash: the escaped byte is part of the string
            i += 1
            if i >= n:
                return -1
        i += 1
    return -1


@numba.njit(cache=True, nogil=True)
def _skip_container(buf, i, n, split_at=None, split_pos=None, split_count=None):
    """Skip the object or array at buf[i]: (index after it or -2 if truncated, how many objects it
    holds directly: the events of an events array). With ``split_at`` (ascending byte offsets):
    ``split_pos[s]`` is the first of those objects to start at or after ``split_at[s]`` (-1: none)
    and ``split_count[s]`` how many objects precede it (where a scan of that part starts)."""
    depth = 0
    objects = 0
    s = 0
    while i < n:
        c = buf[i]
        if c == 34:
            i = _string_end(buf, i, n)
            if i < 0:
                return -2, objects
            continue
        if c == 123 or c == 91:
            if c == 123 and depth == 1:
                if split_at is not None:
                    while s < len(split_at) and i >= split_at[s]:
                        split_pos[s] = i
                        split_count[s] = objects
                        s += 1
                objects += 1
            depth += 1
        elif c == 125 or c == 93:
            depth -= 1
            if depth == 0:
                return i + 1, objects
        i += 1
    return -2, objects


@numba.njit(cache=True, nogil=True)
def _skip(buf, i, n):
    """Skip one JSON value at buf[i]; returns the index after it, -1 if malformed, -2 if truncated."""
    c = buf[i]
    if c == 34:
        j = _string_end(buf, i, n)
        return j if j >= 0 else -2
    if c == 123 or c == 91:  # { [
        return _skip_container(buf, i, n)[0]
    # number or literal (true / false / null, and the bare tokens profilers and Python's json write
    # though JSON has none: NaN, Infinity, inf, nan, N/A): up to the next delimiter
    if not (c == 45 or 48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122):
        return -1
    j = i
    while j < n:
        c = buf[j]
        if c == 44 or c == 125 or c == 93 or c == 32 or c == 10 or c == 13 or c == 9:
            break
        j += 1
    if j == i:
        return -1
    return j if j < n else -2


@numba.njit(cache=True, nogil=True)
def _number(buf, i, n):
    """Parse a JSON number: (index after, integer part, fraction incl. exponent, ok). An integer
    part beyond int64 is read as a float into the fraction (integer part 0), never wrapped."""
    neg = False
    if i < n and buf[i] == 45:
        neg = True
        i += 1
    start = i
    ip = np.int64(0)
    big = 0.0
    over = False
    while i < n and 48 <= buf[i] <= 57:
        if over:
            big = big * 10.0 + (buf[i] - 48)
        elif ip > 922337203685477579:  # (2**63 - 1 - 9) // 10: one more digit may not fit
            over = True
            big = float(ip) * 10.0 + (buf[i] - 48)
            ip = np.int64(0)
        else:
            ip = ip * 10 + (buf[i] - 48)
        i += 1
    if i == start:
        return i, np.int64(0), 0.0, False
    frac = 0.0
    if i < n and buf[i] == 46:
        i += 1
        scale = 0.1
        while i < n and 48 <= buf[i] <= 57:
            frac += (buf[i] - 48) * scale
            scale *= 0.1
            i += 1
    if i < n and (buf[i] == 101 or buf[i] == 69):  # exponent: fold everything into the fraction
        i += 1
        eneg = False
        if i < n and (buf[i] == 43 or buf[i] == 45):
            eneg = buf[i] == 45
            i += 1
        e = 0
        while i < n and 48 <= buf[i] <= 57:
            e = e * 10 + (buf[i] - 48)
            i += 1
        value = (ip + big + frac) * 10.0 ** (-e if eneg else e)
        ip = np.int64(0)
        frac = value
    elif over:
        ip = np.int64(0)
        frac += big
    if neg:
        return i, -ip, -frac, True
    return i, ip, frac, True


_UINT64_MAX_DIGITS = np.frombuffer(b"18446744073709551615", dtype=np.uint8).copy()


@numba.njit(cache=True, nogil=True)
def _uint64_bits(buf, i, j):
    """(the int64 holding the bits of the unsigned 64-bit integer written in ``buf[i:j]``, whether
    it is one: digits only, at most 2^64 - 1). A pid, tid or flow id written as an unsigned 64-bit
    value (a pointer, a hash) is read as the signed integer with its bits: distinct ids stay
    distinct, and 2^64 - 1, the unsigned -1, is -1."""
    n = j - i
    if n <= 0 or n > 20:
        return np.int64(0), False
    for t in range(i, j):
        if not 48 <= buf[t] <= 57:
            return np.int64(0), False
    if n == 20:
        for t in range(20):
            d, m = buf[i + t], _UINT64_MAX_DIGITS[t]
            if d < m:
                break
            if d > m:
                return np.int64(0), False
    v = np.uint64(0)
    for t in range(i, j):
        v = v * np.uint64(10) + np.uint64(buf[t] - 48)
    return np.int64(v), True


@numba.njit(cache=True, nogil=True, inline="always")
def _member(buf, i, n):
    """At a member's opening quote: (index of its value, hash of its key, error code)."""
    j, h = _string(buf, i, n)
    if j < 0:
        return j, h, TRUNCATED
    j = _ws(buf, j, n)
    if j < n and buf[j] != 58:
        return j, h, BAD_JSON
    j = _ws(buf, j + 1, n)
    if j >= n:
        return j, h, TRUNCATED
    return j, h, OK


@numba.njit(cache=True, nogil=True, inline="always")
def _lookup(hashes, h):
    """Index of ``h`` in ``hashes``, -1 if absent."""
    for q in range(len(hashes)):
        if hashes[q] == h:
            return q
    return -1


@numba.njit(cache=True, nogil=True, inline="always")
def _bom(buf, n):
    """3 if the text opens with UTF-8's byte order mark (an editor on Windows writes one; JSON
    readers may skip it), else 0."""
    return 3 if n >= 3 and buf[0] == 0xEF and buf[1] == 0xBB and buf[2] == 0xBF else 0


@numba.njit(cache=True, nogil=True)
def _find_events(buf, h_events, h_nodes, h_schema, split_at, split_pos, split_count):
    n = len(buf)
    i = _ws(buf, _bom(buf, n), n)
    if i >= n:
        return -1, -1, False, False, False, TRUNCATED, 0
    if buf[i] == 91:
        j, count = _skip_container(buf, i, n, split_at, split_pos, split_count)
        if j < 0:
            return -1, -1, False, False, False, TRUNCATED if j == -2 else BAD_JSON, 0
        return i, j, False, False, False, OK, count
    if buf[i] != 123:
        return -1, -1, False, False, False, BAD_JSON, 0
    return _members(buf, i + 1, n, h_events, h_nodes, h_schema, split_at, split_pos, split_count, False, False, False, False, -1, -1, 0)


@numba.njit(cache=True, nogil=True)
def _find_start(buf, h_events, h_nodes, h_schema):
    """_find_events up to the events array's '[' (not walked): (its index or -1, -1, is_object,
    has_nodes, has_schema so far, error, 0)."""
    n = len(buf)
    i = _ws(buf, _bom(buf, n), n)
    if i >= n:
        return -1, -1, False, False, False, TRUNCATED, 0
    if buf[i] == 91:
        return i, -1, False, False, False, OK, 0
    if buf[i] != 123:
        return -1, -1, False, False, False, BAD_JSON, 0
    return _members(buf, i + 1, n, h_events, h_nodes, h_schema, None, None, None, True, False, False, False, -1, -1, 0)


@numba.njit(cache=True, nogil=True)
def _rest(buf, hi, h_events, h_nodes, h_schema, has_nodes, has_schema):
    """The top-level object's members after its events array (which ends at ``hi``), stopping at
    a second events array (its '[': the caller takes the two-pass road)."""
    return _members(buf, hi, len(buf), h_events, h_nodes, h_schema, None, None, None, True, True, has_nodes, has_schema, -1, -1, 0)


_H_EVENTS, _H_NODES, _H_SCHEMA = np.uint64(fnv1a(b"traceEvents")), np.uint64(fnv1a(b"nodes")), np.uint64(fnv1a(b"schema"))
ONE_PASS_BYTES_PER_EVENT = 24  # room for an event per this many bytes: one-pass scans of real traces never run out


def scan_once(buf: np.ndarray) -> tuple[int, int, bool, bool, bool, int, int, dict[str, np.ndarray]] | None:
    """``count_events`` and ``scan`` in one pass over the bytes (no counting pass first: a folder
    of thousands of small rank files spent a sixth of its parsing counting): (lo, hi, is_object,
    has_nodes, has_schema, error, error position, columns). None where the one pass cannot answer
    as the two would (more events than it made room for, a second traceEvents array): the caller
    takes the two-pass road."""
    lo, _, is_object, nodes, schema, err, _ = _find_start(buf, _H_EVENTS, _H_NODES, _H_SCHEMA)
    if err != OK or lo < 0:
        return int(lo), -1, bool(is_object), bool(nodes), bool(schema), int(err), 0, {}
    cap = (len(buf) - lo) // ONE_PASS_BYTES_PER_EVENT + 16
    cols = _columns(cap)
    count, err, pos = scan_events(buf, lo, len(buf), KEY_HASH, ARG_HASH, *cols.values())
    if err == TOO_MANY:
        return None
    if err != OK:
        return int(lo), -1, bool(is_object), bool(nodes), bool(schema), int(err), int(pos), {}
    hi = int(pos)
    if is_object:
        again, _, _, nodes, schema, err, _ = _rest(buf, hi, _H_EVENTS, _H_NODES, _H_SCHEMA, nodes, schema)
        if err == OK and again >= 0:
            return None
        if err != OK:
            return int(lo), -1, True, bool(nodes), bool(schema), int(err), 0, {}
    return int(lo), hi, bool(is_object), bool(nodes), bool(schema), OK, 0, {k: v[:count] for k, v in cols.items()}


@numba.njit(cache=True, nogil=True)
def _members(
    buf, i, n, h_events, h_nodes, h_schema, split_at, split_pos, split_count, stop, after_value, has_nodes, has_schema, start, end, count
):
    """The top-level object's members from ``i`` (just past its '{', or with ``after_value`` just
    past a member's value); the events array's span and object count as _find_events gives them.
    With ``stop``, returns at the events array's '[' instead of walking it: (its position, -1, ...)."""
    if after_value:
        i = _ws(buf, i, n)
        if i < n and buf[i] == 44:
            i += 1
        elif i < n and buf[i] != 125:
            return -1, -1, True, has_nodes, has_schema, BAD_JSON, 0
    while True:
        i = _ws(buf, i, n)
        if i >= n:
            return -1, -1, True, has_nodes, has_schema, TRUNCATED, 0
        if buf[i] == 125:
            return start, end, True, has_nodes, has_schema, OK, count
        if buf[i] != 34:
            return -1, -1, True, has_nodes, has_schema, BAD_JSON, 0
        i, h, err = _member(buf, i, n)
        if err != OK:
            return -1, -1, True, has_nodes, has_schema, err, 0
        events = h == h_events and buf[i] == 91
        if events and stop:
            return i, -1, True, has_nodes, has_schema, OK, 0
        if events:
            j, objects = _skip_container(buf, i, n, split_at, split_pos, split_count)
        else:
            j = _skip(buf, i, n)
        if j < 0:
            return -1, -1, True, has_nodes, has_schema, TRUNCATED if j == -2 else BAD_JSON, 0
        if events:
            start, end, count = i, j, objects
        elif h == h_nodes:
            has_nodes = True
        elif h == h_schema:
            has_schema = True
        i = _ws(buf, j, n)
        if i < n and buf[i] == 44:
            i += 1
        elif i < n and buf[i] != 125:
            return -1, -1, True, has_nodes, has_schema, BAD_JSON, 0


@numba.njit(cache=True, nogil=True)
def _last_whole(buf, i, n):
    """From the events array's '[' at buf[i]: the index just past the last event object that the
    bytes hold whole (-1: none), whether or not the array and the document close after it."""
    depth = 0
    last = -1
    while i < n:
        c = buf[i]
        if c == 34:
            i = _string_end(buf, i, n)
            if i < 0:
                return last
            continue
        if c == 123 or c == 91:
            depth += 1
        elif c == 125 or c == 93:
            depth -= 1
            if depth == 1 and c == 125:
                last = i + 1
            elif depth <= 0:
                return last
        i += 1
    return last


def cut_at_last_event(buf: np.ndarray) -> tuple[int, bool]:
    """(the index just past the last whole event of a document cut short, whether its top level is
    an object), or (-1, ...) where the cut falls before the events array or its first event."""
    lo, _, is_object, _, _, err, _ = _find_start(buf, _H_EVENTS, _H_NODES, _H_SCHEMA)
    if err != OK or lo < 0:
        return -1, bool(is_object)
    return int(_last_whole(buf, lo, len(buf))), bool(is_object)


def find_events(buf: np.ndarray) -> tuple[int, int, bool, bool, bool, int]:
    """Span [start, end) of the top-level traceEvents array (or of a top-level array), whether the
    top level is an object, whether it has the 'nodes' and 'schema' keys of an execution trace,
    and an error code."""
    lo, hi, is_object, nodes, schema, err, _, _ = count_events(buf)
    return lo, hi, is_object, nodes, schema, err


def count_events(buf: np.ndarray, parts: int = 1) -> tuple[int, int, bool, bool, bool, int, int, list[tuple[int, int]]]:
    """``find_events``, how many objects the events array holds (the rows ``scan`` needs) and
    where ``scan`` can split it into ``parts`` for as many threads: ``(byte offset of an event,
    events before it)`` for each part after the first (splits the array does not reach are left
    out: a small array is one part). With ``parts`` > 1 the counting itself runs in parts, one
    thread each (``_count_parts``), and in one walk where a part's start turns out not to be an
    event's."""
    if parts > 1:
        counted = _count_parts(buf, parts)
        if counted is not None:
            return counted
    split_at = np.array([len(buf) * k // parts for k in range(1, parts)], dtype=np.int64)
    split_pos, split_count = np.full(len(split_at), -1, dtype=np.int64), np.zeros(len(split_at), dtype=np.int64)
    lo, hi, is_object, nodes, schema, err, count = _find_events(buf, _H_EVENTS, _H_NODES, _H_SCHEMA, split_at, split_pos, split_count)
    splits = sorted({(int(p), int(c)) for p, c in zip(split_pos, split_count) if lo < p < hi and 0 < c < count})
    return int(lo), int(hi), bool(is_object), bool(nodes), bool(schema), int(err), int(count), splits


def _count_parts(buf: np.ndarray, parts: int) -> tuple[int, int, bool, bool, bool, int, int, list[tuple[int, int]]] | None:
    """count_events with the events array walked in ``parts`` threads: each part after the first
    starts at the first '{' after its byte boundary that follows '}' and ',' (an event's start, or
    bytes inside a string that look like one); a part is taken only when the walk of the part
    before it, which knows where strings are, ends exactly there between two events. None when
    any does not (the caller walks the array in one thread) or when the document is not a plain
    trace (no events array, a second one, malformed JSON: the one walk names it)."""
    lo, _, is_object, nodes, schema, err, _ = _find_start(buf, _H_EVENTS, _H_NODES, _H_SCHEMA)
    if err != OK or lo < 0:
        return None
    n = len(buf)
    starts = [lo]
    for k in range(1, parts):
        p = int(_next_event_start(buf, lo + (n - lo) * k // parts, n))
        if p > starts[-1]:
            starts.append(p)
    if len(starts) == 1:
        return None
    stops = [*starts[1:], -1]
    with ThreadPoolExecutor(len(starts)) as pool:
        done = list(pool.map(lambda j: _count_span(buf, starts[j], stops[j], 0 if j == 0 else 1), range(len(starts))))
    for j, (_, end, depth, crossed) in enumerate(done):
        if j < len(starts) - 1 and (end != stops[j] or depth != 1 or crossed):
            return None  # not an event's start: one walk instead
    hi = int(done[-1][1])
    if hi < 0 or done[-1][2] != 0:
        return None
    before = np.cumsum([0] + [int(d[0]) for d in done]).tolist()
    count = before[-1]
    if is_object:
        again, _, _, nodes, schema, err, _ = _rest(buf, hi, _H_EVENTS, _H_NODES, _H_SCHEMA, nodes, schema)
        if err != OK or again >= 0:
            return None
    splits = [(p, c) for p, c in zip(starts[1:], before[1:-1]) if 0 < c < count]
    return int(lo), hi, bool(is_object), bool(nodes), bool(schema), OK, int(count), splits


@numba.njit(cache=True, nogil=True)
def _next_event_start(buf, i, n):
    """The first '{' at or after ``i`` whose previous non-blank bytes are ',' and '}' (-1: none
    within SPLIT_SEARCH bytes)."""
    end = min(n, i + SPLIT_SEARCH)
    while i < end:
        if buf[i] == 123:
            k = i - 1
            while k > 0 and (buf[k] == 32 or buf[k] == 10 or buf[k] == 13 or buf[k] == 9):
                k -= 1
            if k > 0 and buf[k] == 44:
                k -= 1
                while k > 0 and (buf[k] == 32 or buf[k] == 10 or buf[k] == 13 or buf[k] == 9):
                    k -= 1
                if buf[k] == 125:
                    return i
        i += 1
    return -1


@numba.njit(cache=True, nogil=True)
def _count_span(buf, i, stop, depth):
    """Walk from ``i`` at nesting ``depth`` (0 at the events array's '[', 1 at an event's '{')
    counting the objects directly inside the array, until ``stop`` (-1: none) or the array's ']':
    (objects, where it ended: ``stop``, the index after the ']' or -2 if the bytes ran out,
    depth there, whether a string ran past ``stop``)."""
    n = len(buf)
    objects = 0
    while i < n:
        if i == stop:
            return objects, i, depth, False
        c = buf[i]
        if c == 34:
            i = _string_end(buf, i, n)
            if i < 0:
                return objects, -2, depth, False
            if 0 <= stop < i:
                return objects, i, depth, True
            continue
        if c == 123 or c == 91:
            if c == 123 and depth == 1:
                objects += 1
            depth += 1
        elif c == 125 or c == 93:
            depth -= 1
            if depth == 0:
                return objects, i + 1, 0, False
        i += 1
    return objects, -2, depth, False


SPLIT_SEARCH = 1 << 20  # bytes searched after a part's boundary for an event's start


@numba.njit(cache=True, nogil=True)
def scan_events(
    buf,
    lo,
    hi,
    key_hash,
    arg_hash,
    ph,
    cat,
    name_hash,
    name_lo,
    name_hi,
    pid,
    tid,
    pid_str,
    tid_str,
    ts_i,
    ts_f,
    has_ts,
    dur_i,
    dur_f,
    has_dur,
    fid,
    corr,
    ext,
    stream,
    rfid,
    evidx,
    obj_lo,
    obj_hi,
):
    """Scan the events array buf[lo:hi] ('[' ... ']') into the given columns, one row per
    event, allocated by the caller (scan; the columns whose default is 0 zeroed, the others are
    written here). Returns (count, error, error position; on OK the index after the ']')."""
    cap = len(ph)
    count = 0
    i = _ws(buf, lo + 1, hi)
    if i < hi and buf[i] == 93:
        return count, OK, i + 1
    while i < hi:
        if buf[i] != 123:
            return count, NOT_OBJECT, i
        else:
            if count >= cap:
                return count, TOO_MANY, i
            k = count
            obj_lo[k] = i
            # the fields an event may lack start at their defaults (_FILL): no pass fills the columns first
            name_lo[k] = -1
            name_hi[k] = -1
            fid[k] = NO_ID
            corr[k] = -1
            ext[k] = -1
            stream[k] = -1
            rfid[k] = -1
            evidx[k] = -1
            i += 1
            while True:
                i = _ws(buf, i, hi)
                if i >= hi:
                    return count, TRUNCATED, i
                if buf[i] == 125:
                    i += 1
                    break
                if buf[i] != 34:
                    return count, BAD_JSON, i
                i, h, err = _member(buf, i, hi)
                if err != OK:
                    return count, err, i
                key = _lookup(key_hash, h)
                c = buf[i]
                err = OK
                if key == 0 and c == 34:  # ph
                    j, _ = _string(buf, i, hi)
                    ph[k] = buf[i + 1]
                elif key == 1 and c == 34:  # cat
                    j, cat[k] = _string(buf, i, hi)
                elif key == 2 and c == 34:  # name
                    j, name_hash[k] = _string(buf, i, hi)
                    name_lo[k] = i + 1
                    name_hi[k] = j - 1
                elif (key == 3 or key == 4) and c == 34:  # pid / tid as a string
                    j, hs = _string(buf, i, hi)
                    if key == 3:
                        pid_str[k] = hs
                    else:
                        tid_str[k] = hs
                elif key >= 3 and key <= 7 and (c != 34 or key == 5 or key == 6):
                    # pid tid ts dur id: numbers; ts and dur also as a string of one (Ascend's msprof: "ts": "1699529623106750.125")
                    j, ip, fp, ok = _number(buf, i + 1 if c == 34 else i, hi)
                    if c == 34 and not (ok and j < hi and buf[j] == 34):  # another string: skipped, the event has no ts (said later)
                        j, _ = _string(buf, i, hi)
                    elif not ok:
                        if c == 110 or c == 116 or c == 102:  # null / true / false
                            j = _skip(buf, i, hi)
                        else:
                            err = NOT_NUMBER
                    else:
                        if c == 34:
                            j += 1  # (the closing quote)
                        if key != 5 and key != 6 and not -INT_LIMIT < fp < INT_LIMIT:
                            ip, ok = _uint64_bits(buf, i, j)  # (a pid, tid or id written as an unsigned 64-bit value)
                            if not ok:
                                err = OUT_OF_RANGE
                        if err != OK:
                            pass
                        elif key == 3:
                            pid[k] = ip
                        elif key == 4:
                            tid[k] = ip
                        elif key == 5:
                            ts_i[k] = ip
                            ts_f[k] = fp
                            has_ts[k] = True
                        elif key == 6:
                            dur_i[k] = ip
                            dur_f[k] = fp
                            has_dur[k] = True
                        else:
                            fid[k] = ip
                elif key == 8 and c == 123:  # args: the three ids every event may carry
                    i += 1
                    while True:
                        i = _ws(buf, i, hi)
                        if i >= hi:
                            err = TRUNCATED
                            break
                        if buf[i] == 125:
                            j = i + 1
                            break
                        if buf[i] != 34:
                            err = BAD_JSON
                            break
                        i, h2, err = _member(buf, i, hi)
                        if err != OK:
                            break
                        a = _lookup(arg_hash, h2)
                        if a >= 0 and (buf[i] == 45 or 48 <= buf[i] <= 57):
                            j, ip, fp, ok = _number(buf, i, hi)
                            if not -INT_LIMIT < fp < INT_LIMIT:  # beyond int64: unknown (-1), not wrapped
                                pass
                            elif a == 0:
                                corr[k] = ip
                            elif a == 1:
                                ext[k] = ip
                            elif a == 2:
                                stream[k] = ip
                            elif a == 3:
                                rfid[k] = ip
                            else:
                                evidx[k] = ip
                        else:
                            j = _skip(buf, i, hi)
                            if j < 0:
                                err = TRUNCATED if j == -2 else BAD_JSON
                                break
                        i = _ws(buf, j, hi)
                        if i < hi and buf[i] == 44:
                            i += 1
                        elif i < hi and buf[i] != 125:
                            err = BAD_JSON
                            break
                else:
                    j = _skip(buf, i, hi)
                    if j < 0:
                        err = TRUNCATED if j == -2 else BAD_JSON
                if err != OK:
                    return count, err, i
                if j < 0:
                    return count, TRUNCATED, i
                i = _ws(buf, j, hi)
                if i < hi and buf[i] == 44:
                    i += 1
                elif i < hi and buf[i] != 125:
                    return count, BAD_JSON, i
            obj_hi[k] = i
            count += 1
            i = _ws(buf, i, hi)
        if i < hi and buf[i] == 44:
            i = _ws(buf, i + 1, hi)
        elif i < hi and buf[i] == 93:
            return count, OK, i + 1
        elif i < hi:
            return count, BAD_JSON, i
    return count, TRUNCATED, i


COLUMNS = (
    "ph",
    "cat",
    "name_hash",
    "name_lo",
    "name_hi",
    "pid",
    "tid",
    "pid_str",
    "tid_str",
    "ts_i",
    "ts_f",
    "has_ts",
    "dur_i",
    "dur_f",
    "has_dur",
    "fid",
    "corr",
    "ext",
    "stream",
    "rfid",
    "evidx",
    "obj_lo",
    "obj_hi",
)


_DTYPES = {
    "ph": np.uint8,
    "cat": np.uint64,
    "name_hash": np.uint64,
    "pid_str": np.uint64,
    "tid_str": np.uint64,
    "ts_f": np.float64,
    "dur_f": np.float64,
    "has_ts": np.bool_,
    "has_dur": np.bool_,
}
_FILL = {"name_lo": -1, "name_hi": -1, "fid": NO_ID, "corr": -1, "ext": -1, "stream": -1, "rfid": -1, "evidx": -1}


@numba.njit(cache=True, nogil=True)
def _count_at(buf, lo, hi, needle):
    n = len(needle)
    first = needle[0]
    total = 0
    i = lo
    while i <= hi - n:
        if buf[i] == first:
            j = 1
            while j < n and buf[i + j] == needle[j]:
                j += 1
            if j == n:
                total += 1
                i += n
                continue
        i += 1
    return total


def _count(buf: np.ndarray, lo: int, hi: int, needle: bytes) -> int:
    """Non-overlapping occurrences of ``needle`` in buf[lo:hi] (as ``bytes.count``), counted in
    place: no copy of the buffer, no temporary array."""
    return int(_count_at(buf, lo, hi, np.frombuffer(needle, dtype=np.uint8)))


def cache_is_cold(folder: Path | None = None) -> bool:
    """True when numba has not yet cached the scanner's machine code in this package's
    ``__pycache__`` for this source (the first run after an install compiles it, about 10 s; an
    index older than scan.py is from an earlier install): ``folder`` is that directory (for
    tests). False when it cannot tell (NUMBA_CACHE_DIR set, a read-only install)."""
    if folder is None:
        if os.environ.get("NUMBA_CACHE_DIR"):
            return False
        folder = Path(__file__).parent / "__pycache__"
    try:
        if folder.exists() and not os.access(folder, os.W_OK):
            return False
        source = Path(__file__).stat().st_mtime
        return not any(f.stat().st_mtime >= source for f in folder.glob("scan.scan_events-*.nbi"))  # older: from an earlier install
    except OSError:
        return False


SCAN_BLOCK = 1_000_000  # events scanned per call when the caller gives scanned bytes back as it goes


def scan(
    buf: np.ndarray,
    lo: int,
    hi: int,
    release: Callable[[int, int], None] | None = None,
    events: int | None = None,
    splits: list[tuple[int, int]] | None = None,
) -> tuple[int, int, dict[str, np.ndarray]]:
    """(error, error_pos, columns trimmed to the events found) of the events array buf[lo:hi].

    With ``release`` (a callable taking a byte range), the events are scanned SCAN_BLOCK at a time
    and ``release(start, pos)`` is called after each block with the bytes from the part's start to
    the next unscanned event: they are done with (a mapped trace gives their pages back).
    ``events``: how many objects the array holds (count_events), else counted here. ``splits``
    (count_events, with ``events``): the array is scanned in parts, one thread each (the scanner
    runs without the GIL), into the rows each part's events take; the answer is the one-thread
    scan's, and a part that meets anything but a clean end of its part is scanned again in one
    thread, so that errors are named as one scan names them."""
    # no more events than objects in the array, or than '"ph"' keys (every event has one; an args
    # object with one only adds room), counted in C without a temporary array the size of the trace
    cap = (events if events is not None else _count(buf, lo, hi, b'"ph"')) + 1
    cols = _columns(cap)
    if release is not None:
        release(0, hi)  # counting read every page: give them back, the blocks read them again one by one
    if splits and events is not None:
        parts = _parts(lo, hi, events, splits)
        with ThreadPoolExecutor(len(parts)) as pool:
            done = list(pool.map(lambda part: _scan_part(buf, part[0], part[1], part[2], part[3], cols, release), parts))
        if _clean(parts, done):
            return OK, 0, {k: v[:events] for k, v in cols.items()}
        cols = _columns(cap)
    count, err, pos = _scan_part(buf, lo, hi, 0, cap, cols, release)
    return err, pos, {k: v[:count] for k, v in cols.items()}


def _parts(lo: int, hi: int, events: int, splits: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """The parts of the events array buf[lo:hi] at ``splits`` (count_events): per part (the byte
    before its first event, where it ends: the byte before the next part's first event or ``hi``,
    its first row, the next part's first row or ``events``)."""
    firsts = [lo, *(p - 1 for p, _ in splits)]
    rows = [0, *(c for _, c in splits), events]
    return [(a, firsts[j + 1] if j + 1 < len(firsts) else hi, rows[j], rows[j + 1]) for j, a in enumerate(firsts)]


def _clean(parts: list[tuple[int, int, int, int]], done: list[tuple[int, int, int]]) -> bool:
    """Whether each part's walk, (objects, error, position), ended where the next part begins
    (TRUNCATED there; the last at the array's ']') with as many objects as its rows."""
    last = len(parts) - 1
    return all(
        n == end_row - row and ((err, pos) == (TRUNCATED, end) if j < last else err == OK)
        for j, ((_, end, row, end_row), (n, err, pos)) in enumerate(zip(parts, done))
    )


def _columns(cap: int) -> dict[str, np.ndarray]:
    """The scanner's columns for ``cap`` events: zeros where 0 is the default (pages the scan
    never writes, of fields most traces lack, are never touched); the others the scanner writes."""
    return {k: np.empty(cap, dtype=np.int64) if k in _FILL else np.zeros(cap, dtype=_DTYPES.get(k, np.int64)) for k in COLUMNS}


def _scan_part(
    buf: np.ndarray, lo: int, hi: int, row: int, end_row: int, cols: dict[str, np.ndarray], release: Callable[[int, int], None] | None
) -> tuple[int, int, int]:
    """Scan the events of buf[lo:hi] (lo: one byte before the first) into rows [row, end_row) of
    ``cols``: (events scanned, error, error position). A part that ends before the array's ']'
    ends with TRUNCATED at ``hi``."""
    if release is None:
        n, err, pos = scan_events(buf, lo, hi, KEY_HASH, ARG_HASH, *(v[row:end_row] for v in cols.values()))
        return int(n), int(err), int(pos)
    count, start = 0, lo
    while True:
        block = [v[row + count : min(row + count + SCAN_BLOCK, end_row)] for v in cols.values()]
        n, err, pos = scan_events(buf, start, hi, KEY_HASH, ARG_HASH, *block)
        count += n
        if err == TOO_MANY and row + count < end_row:  # the block is full: go on from the event that did not fit
            release(lo, pos)
            start = pos - 1  # the scanner starts one byte after ``lo`` (past the array's '[')
            continue
        return count, int(err), int(pos)


@numba.njit(cache=True, nogil=True)
def _object_bounds(buf, lo, hi, starts, ends):
    """Start and end (one past the '}') of each object of the array buf[lo:hi] ('[' ... ']')."""
    cap = len(starts)
    n = 0
    depth = 0
    in_str = False
    esc = False
    i = lo + 1
    while i < hi:
        c = buf[i]
        if in_str:
            if esc:
                esc = False
            elif c == 92:
                esc = True
            elif c == 34:
                in_str = False
        elif c == 34:
            in_str = True
        elif c == 123 or c == 91:
            if depth == 0:
                if c != 123:
                    return n, NOT_OBJECT, i
                if n >= cap:
                    return n, TOO_MANY, i
                starts[n] = i
            depth += 1
        elif c == 125 or c == 93:
            depth -= 1
            if depth < 0:
                return n, OK, 0
            if depth == 0:
                ends[n] = i + 1
                n += 1
        i += 1
    return n, TRUNCATED, i


def object_bounds(
    buf: np.ndarray, lo: int, hi: int, events: int | None = None, splits: list[tuple[int, int]] | None = None, text: bool = False
) -> tuple[int, int, np.ndarray, np.ndarray, tuple[int, int]]:
    """(error, error_pos, starts, ends, text problem) of the events of the array buf[lo:hi]: event i
    is buf[starts[i]:ends[i]], numbered as ``scan`` numbers them. Two int64 per event: an overlay
    can rewrite a few events and copy the rest as they are, without decoding the trace.
    ``events``/``splits`` as for ``scan`` (count_events): the parts are walked in threads. With
    ``text``, the array's bytes are also checked the way a strict JSON reader takes them
    (``text_problem``); else the text problem is (TEXT_OK, 0)."""
    cap = (events if events is not None else _count(buf, lo, hi, b'"ph"')) + 1
    starts = np.empty(cap, dtype=np.int64)
    ends = np.empty(cap, dtype=np.int64)
    parts = _parts(lo, hi, events, splits) if splits and events is not None else [(lo, hi, 0, cap)]

    def walk(part: tuple[int, int, int, int]) -> tuple[tuple[int, int, int], tuple[int, int]]:
        a, end, row, end_row = part
        n, err, pos = _object_bounds(buf, a, end, starts[row:end_row], ends[row:end_row])
        problem = _text_problem(buf, a, end) if text else (TEXT_OK, 0)
        return (int(n), int(err), int(pos)), (int(problem[0]), int(problem[1]))

    if len(parts) > 1:
        with ThreadPoolExecutor(len(parts)) as pool:
            done = list(pool.map(walk, parts))
        if not _clean(parts, [d for d, _ in done]):  # walked again in one thread: the error as one walk names it
            return object_bounds(buf, lo, hi, events, None, text)
        n, err, pos = sum(d[0] for d, _ in done), OK, 0
    else:
        done = [walk(parts[0])]
        n, err, pos = done[0][0]
    problem = next((p for _, p in done if p[0] != TEXT_OK), (TEXT_OK, 0))
    return err, pos, starts[:n].copy(), ends[:n].copy(), problem


TEXT_OK, NOT_UTF8, LONE_SURROGATE = 0, 1, 2


def text_problem(buf: np.ndarray, lo: int, hi: int) -> tuple[int, int]:
    """Whether bytes [lo, hi) of a JSON text are what a strict reader takes: (TEXT_OK, 0), or
    (NOT_UTF8, where the bad sequence starts) or (LONE_SURROGATE, where its escape starts): a
    \\uD800-\\uDBFF escape not followed by a \\uDC00-\\uDFFF one, or the latter alone."""
    kind, pos = _text_problem(buf, lo, hi)
    return int(kind), int(pos)


@numba.njit(cache=True, nogil=True)
def _hex4(buf, i, n):
    """The value of the four hex digits at buf[i:i+4], or -1."""
    if i + 4 > n:
        return -1
    v = 0
    for k in range(4):
        c = buf[i + k]
        if 48 <= c <= 57:
            d = c - 48
        elif 97 <= c <= 102:
            d = c - 87
        elif 65 <= c <= 70:
            d = c - 55
        else:
            return -1
        v = v * 16 + d
    return v


@numba.njit(cache=True, nogil=True)
def _text_problem(buf, lo, hi):
    """(TEXT_OK | NOT_UTF8 | LONE_SURROGATE, position) of bytes [lo, hi) (text_problem). A
    backslash only occurs inside strings in valid JSON, so escapes are read without tracking them."""
    i = lo
    while i < hi:
        c = buf[i]
        if c < 128:
            if c == 92 and i + 1 < hi:  # an escape
                if buf[i + 1] == 117:  # \uXXXX
                    v = _hex4(buf, i + 2, hi)
                    if 0xD800 <= v <= 0xDBFF:
                        if i + 7 < hi and buf[i + 6] == 92 and buf[i + 7] == 117 and 0xDC00 <= _hex4(buf, i + 8, hi) <= 0xDFFF:
                            i += 12
                            continue
                        return LONE_SURROGATE, i
                    if 0xDC00 <= v <= 0xDFFF:
                        return LONE_SURROGATE, i
                    i += 6 if v >= 0 else 2
                    continue
                i += 2
                continue
            i += 1
            continue
        # a multi-byte sequence (Unicode table 3-7: no overlong forms, surrogates or beyond U+10FFFF)
        if 0xC2 <= c <= 0xDF:
            need, a, b = 1, 0x80, 0xBF
        elif c == 0xE0:
            need, a, b = 2, 0xA0, 0xBF
        elif 0xE1 <= c <= 0xEC or c == 0xEE or c == 0xEF:
            need, a, b = 2, 0x80, 0xBF
        elif c == 0xED:
            need, a, b = 2, 0x80, 0x9F
        elif c == 0xF0:
            need, a, b = 3, 0x90, 0xBF
        elif 0xF1 <= c <= 0xF3:
            need, a, b = 3, 0x80, 0xBF
        elif c == 0xF4:
            need, a, b = 3, 0x80, 0x8F
        else:
            return NOT_UTF8, i
        if i + need >= hi:  # the sequence runs past the end
            return NOT_UTF8, i
        if not a <= buf[i + 1] <= b:
            return NOT_UTF8, i
        for k in range(2, need + 1):
            if not 0x80 <= buf[i + k] <= 0xBF:
                return NOT_UTF8, i
        i += need + 1
    return TEXT_OK, 0

"""The trace scanner against orjson and msgspec, side by side on the same bytes.

What each reads, from the same in-memory bytes of an uncompressed trace (the page cache and
gunzip left out: they are the same for all three):

- ``scanner``: graph_pipeline.scan (count_events + scan): the events array straight into the
  columns the graph needs (phase, category, name, pid/tid, ts/dur, flow id, three args, each
  event's byte span), validating the JSON it walks.
- ``orjson.loads``: the whole document into Python dicts and lists (what a notebook or HTA's
  loader starts from).
- ``msgspec (typed)``: ``msgspec.json.decode`` into a Struct holding only the fields the scanner
  reads (args kept raw): msgspec's fastest way to the same information.
- ``msgspec (untyped)``: ``msgspec.json.decode`` into dicts and lists, like orjson.

Each is run ``--repeat`` times per file (after one warm-up, which also compiles the scanner);
the median and the spread (min..max) are reported in MB/s of JSON. One process, nothing else
running is the intent; the machine's load is recorded beside the figures.

    python benchmarks/bench_scanner.py [FILE ...] [--repeat 5] [--json benchmarks/scanner_results.json]

Without FILEs: the bundled real traces of tests/data (gunzipped in memory), and the 1 GiB
synthetic one-rank trace of bench_ranks.py --one-file-gib 1 where it has been generated.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson

from bottleneck_oracle.graph_pipeline import scan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_FILES = [
    ROOT / "tests/data/public-gpu/diff_control_rank3of8.json.gz",
    ROOT / "tests/data/public-gpu/diff_test_rank1of2.json.gz",
    ROOT / "tests/data/real-gpu/train_1rank_5steps.json.gz",
    HERE / "out/one_file_1gib/rank-0.json",
]


class _Event(msgspec.Struct, omit_defaults=True):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    id: int | str | None = None
    args: msgspec.Raw = msgspec.Raw(b"null")


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] = []  # noqa: N815 (the trace's key)


_TYPED = msgspec.json.Decoder(_Trace)
_UNTYPED = msgspec.json.Decoder()


def _scanner(raw: bytes) -> int:
    buf = np.frombuffer(raw, dtype=np.uint8)
    lo, hi, _, _, _, err, count, _ = scan.count_events(buf)  # one thread, as the decoders beside it
    if err != scan.OK:
        raise ValueError(f"scanner error {err}")
    err, _, ev = scan.scan(buf, lo, hi, events=count)
    if err != scan.OK:
        raise ValueError(f"scanner error {err}")
    return len(next(iter(ev.values())))


def _orjson(raw: bytes) -> int:
    return len(orjson.loads(raw)["traceEvents"])


def _msgspec_typed(raw: bytes) -> int:
    return len(_TYPED.decode(raw).traceEvents)


def _msgspec_untyped(raw: bytes) -> int:
    return len(_UNTYPED.decode(raw)["traceEvents"])


READERS = {"scanner": _scanner, "orjson.loads": _orjson, "msgspec (typed)": _msgspec_typed, "msgspec (untyped)": _msgspec_untyped}


def _read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def bench(path: Path, repeat: int) -> dict[str, Any]:
    raw = _read(path)
    mb = len(raw) / 1e6
    row: dict[str, Any] = {"file": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path), "mb": mb, "readers": {}}
    for name, fn in READERS.items():
        n_events = fn(raw)  # warm-up (and the scanner's compilation)
        times = []
        for _ in range(repeat):
            gc.collect()
            t = time.perf_counter()
            fn(raw)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        row["readers"][name] = {
            "events": n_events,
            "median_s": med,
            "min_s": min(times),
            "max_s": max(times),
            "mb_per_s": mb / med,
            "mb_per_s_range": [mb / max(times), mb / min(times)],
        }
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", type=Path, default=HERE / "scanner_results.json")
    a = p.parse_args()
    files = a.files or [f for f in DEFAULT_FILES if f.exists()]
    rows = []
    for f in files:
        repeat = a.repeat if f.stat().st_size < 200e6 else max(1, a.repeat // 2)
        row = bench(f, repeat)
        rows.append(row)
        r = row["readers"]
        print(f"{row['file']} ({row['mb']:.0f} MB, {r['scanner']['events']:,} events):", flush=True)
        for name, v in r.items():
            print(
                f"  {name:18s} {v['mb_per_s']:7.0f} MB/s (range {v['mb_per_s_range'][0]:.0f}..{v['mb_per_s_range'][1]:.0f}; "
                f"{v['median_s']:.2f} s)  x{r['scanner']['mb_per_s'] / v['mb_per_s']:.2f} the scanner's time",
                flush=True,
            )
    doc = {
        "what": "MB/s of JSON, median of repeats, each reader from the same in-memory bytes",
        "versions": {"orjson": orjson.__version__, "msgspec": msgspec.__version__, "numpy": np.__version__},
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d"),
        "files": rows,
    }
    a.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written {a.json}")


if __name__ == "__main__":
    main()

"""Rank-scale benchmark: N ranks x 2 steps of the synthetic GPU job (benchmarks/synth_trace.py),
`bottleneck-oracle analyze DIR --json` end to end, with the local engine and with a Dask
LocalCluster (`--executor dask`), on this machine; optionally one rank's trace of a given size
(`analyze --json`, and with `--perfetto`), a long 2-rank run under `blame`, and the size of
`analyze --json` on a real trace against the trace.

    python benchmarks/bench_ranks.py --ranks 4096 --one-file-gib 1 --blame-steps 2000 --json-size --repeat 3

The figures of the run are written to benchmarks/ranks_results.json (committed: `make figures`
renders them into benchmarks/RESULTS.md and the docs) and appended to benchmarks/out/ranks.json.

Each run is its own process; its process tree is sampled every 0.2 s (psutil), so the figures
are the peak resident memory of the main process and of the largest worker (forked parse
workers, Dask workers). The answers of the two engines are compared (the whole --json output).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
CLI = [sys.executable, "-m", "bottleneck_oracle"]


def _synthetic(folder: Path, args: str) -> dict:
    """The synthetic job's traces in ``folder`` (``synth_trace.generate(folder, <args>)``, run in its
    own process; ``EVENTS_PER_STEP`` may be used in ``args``), written once: its summary."""
    if not (folder / "DONE").exists():
        code = (
            f"import json, sys; sys.path.insert(0, {str(HERE)!r}); from synth_trace import generate, EVENTS_PER_STEP; "
            f"print(json.dumps(generate({str(folder)!r}, {args})))"
        )
        t = time.perf_counter()
        info = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
        (folder / "DONE").write_text(json.dumps(info))
        print(
            f"generated {info['events']:,} events, {info['ranks']} ranks, {info['steps']} steps in {time.perf_counter() - t:.0f} s",
            flush=True,
        )
    info: dict = json.loads((folder / "DONE").read_text())
    return info


def _generate(ranks: int) -> tuple[Path, dict]:
    """``ranks`` ranks x 2 steps: the folder and its summary."""
    folder = OUT / f"ranks_{ranks}x2"
    return folder, _synthetic(folder, f"events={ranks} * 2 * EVENTS_PER_STEP, ranks={ranks}")


def _measure(args: list[str]) -> dict:
    """Run a command; wall time, peak RSS of the main process and of its largest descendant."""
    peak = {"main": 0, "worker": 0, "tree": 0}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                main = root.memory_info().rss
                kids = [k.memory_info().rss for k in root.children(recursive=True)]
            except psutil.Error:
                kids, main = [], peak["main"]
            peak["main"] = max(peak["main"], main)
            peak["worker"] = max([peak["worker"], *kids])
            peak["tree"] = max(peak["tree"], main + sum(kids))
            done.wait(0.2)

    t = time.perf_counter()
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t
    done.set()
    th.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    if args[len(CLI)] == "blame":
        return {
            "wall_s": wall,
            "peak_main_mb": peak["main"] / 2**20,
            "peak_worker_mb": peak["worker"] / 2**20,
            "peak_tree_mb": peak["tree"] / 2**20,
        }
    steps = json.loads(out)["steps"]
    return {
        "wall_s": wall,
        "peak_main_mb": peak["main"] / 2**20,
        "peak_worker_mb": peak["worker"] / 2**20,
        "peak_tree_mb": peak["tree"] / 2**20,
        "answer_sha": hashlib.sha256(json.dumps(steps, sort_keys=True).encode()).hexdigest()[:16],
        "steps": [(s["step"], s["step_time_us"], s["measured_us"], (s["straggler"] or {}).get("rank")) for s in steps],
    }


def _measure_n(args: list[str], n: int) -> dict:
    """``_measure`` ``n`` times in a row (this shared machine's speed drifts by more than the
    margins the figures are held to): the median wall time, every run's, the largest peaks; the
    answers of every run must agree."""
    runs = [_measure(args) for _ in range(n)]
    if len({r.get("answer_sha") for r in runs}) > 1:
        raise RuntimeError(f"{' '.join(args)}: the answers differ between runs")
    out = dict(runs[0])
    out["walls_s"] = [r["wall_s"] for r in runs]
    out["wall_s"] = statistics.median(out["walls_s"])
    for k in ("peak_main_mb", "peak_worker_mb", "peak_tree_mb"):
        out[k] = max(r[k] for r in runs)
    return out


EVENTS_PER_GIB = 6_920_000  # events of the synthetic job's one-rank trace per GiB of JSON (measured: 7,000,604 in 1.01 GiB)


def _one_file(gib: float) -> tuple[Path, dict]:
    """One rank's trace of about ``gib`` GiB of JSON (the same generator, one rank, many steps):
    the file and its summary."""
    folder = OUT / f"one_file_{gib:g}gib"
    return folder / "rank-0.json", _synthetic(folder, f"events={int(gib * EVENTS_PER_GIB)}, ranks=1")


def _long_run(steps: int) -> tuple[Path, dict]:
    """Two ranks of the synthetic job, ``steps`` steps of 2 layers (205 events a rank and step):
    the folder and its summary."""
    folder = OUT / f"steps_{steps}"
    return folder, _synthetic(folder, f"events={steps} * 2 * EVENTS_PER_STEP, ranks=2, layers=2")


REAL = HERE.parent / "tests/data/public-gpu/diff_control_rank3of8.json.gz"


def _json_size() -> dict:
    """`analyze --json` of a real trace, by default and with --full-path, against the trace's JSON."""
    import gzip

    trace = gzip.decompress(REAL.read_bytes())
    out = {"trace": str(REAL.relative_to(HERE.parent)), "trace_bytes": len(trace)}
    for key, extra in (("default", []), ("full_path", ["--full-path"])):
        r = subprocess.run([*CLI, "analyze", str(REAL), "--json", *extra], check=True, capture_output=True)
        out[f"{key}_bytes"] = len(r.stdout)
        out[f"{key}_share"] = len(r.stdout) / len(trace)
    return out


def _growth() -> None:
    """`analyze --json` (local engine) against the number of events: one rank of 1, 4 and 16 M
    events, and 1,024 and 4,096 ranks x 2 steps; cost per event beside each."""
    runs = [("one rank", _one_file(round(events / EVENTS_PER_GIB, 3))) for events in (1_000_000, 4_000_000, 16_000_000)]
    runs += [("ranks x 2 steps", _generate(ranks)) for ranks in (1024, 4096)]
    rows = []
    for shape, (path, info) in runs:
        m = _measure([*CLI, "analyze", str(path), "--json"])
        m.pop("steps")  # (each step's answer: not what this curve is about)
        rows.append({"shape": shape, "ranks": info["ranks"], "events": info["events"], "steps": info["steps"], **m})
    for r in rows:
        r["us_per_event"] = 1e6 * r["wall_s"] / r["events"]
        print(
            f"{r['shape']}, {r['ranks']} ranks, {r['events']:,} events: {r['wall_s']:.1f} s ({r['us_per_event']:.2f} µs an event), peak RSS {r['peak_main_mb']:.0f} MB",
            flush=True,
        )
    doc = {"command": "python benchmarks/bench_ranks.py --growth", "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "runs": rows}
    (HERE / "growth_results.json").write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="*", default=[1024])
    p.add_argument("--executors", nargs="+", default=["local", "dask"])
    p.add_argument("--one-file-gib", type=float, default=0, help="also one rank's trace of this many GiB: analyze --json and --perfetto")
    p.add_argument("--blame-steps", type=int, default=0, help="also `blame` on a 2-rank run of this many steps")
    p.add_argument("--json-size", action="store_true", help="also the size of analyze --json on a real trace")
    p.add_argument("--results", type=Path, default=HERE / "ranks_results.json", help="where this run's figures are written")
    p.add_argument("--repeat", type=int, default=1, help="runs of each command: the figure is their median wall time, every run listed")
    p.add_argument(
        "--growth",
        action="store_true",
        help="only the growth curve (1, 4, 16 M events in one file; 1,024 and 4,096 ranks): growth_results.json",
    )
    a = p.parse_args()
    OUT.mkdir(exist_ok=True)
    if a.growth:
        _growth()
        return
    results = []
    extra_figures: dict = {}
    if a.json_size:
        extra_figures["json_size"] = _json_size()
        j = extra_figures["json_size"]
        print(
            f"{j['trace']}: analyze --json {j['default_bytes']:,} bytes ({100 * j['default_share']:.2f}% of the trace's "
            f"{j['trace_bytes']:,}); --full-path {j['full_path_bytes']:,} ({100 * j['full_path_share']:.1f}%)",
            flush=True,
        )
    if a.blame_steps:
        folder, info = _long_run(a.blame_steps)
        r = _measure_n([*CLI, "blame", str(folder)], a.repeat)
        r.update(ranks=2, events=info["events"], steps=info["steps"], command="blame")
        extra_figures["blame"] = r
        print(
            f"blame, 2 ranks x {info['steps']} steps ({info['events']:,} events): {r['wall_s']:.1f} s, peak RSS {r['peak_main_mb']:.0f} MB",
            flush=True,
        )
    if a.one_file_gib:
        trace, info = _one_file(a.one_file_gib)
        for extra in ([], ["--perfetto", str(OUT / "overlay.json.gz")]):
            r = _measure_n([*CLI, "analyze", str(trace), "--json", *extra], a.repeat)
            r.update(ranks=1, events=info["events"], json_gib=trace.stat().st_size / 2**30, executor="local", options=extra[:1])
            results.append(r)
            print(
                f"one file, {info['events']:,} events ({r['json_gib']:.2f} GiB JSON, {info['steps']} steps), analyze --json {' '.join(extra[:1])}: "
                f"{r['wall_s']:.1f} s, peak RSS main {r['peak_main_mb']:.0f} MB, largest worker {r['peak_worker_mb']:.0f} MB",
                flush=True,
            )
    for n in a.ranks:
        folder, info = _generate(n)
        size = sum(f.stat().st_size for f in folder.glob("*.json")) / 2**30
        for ex in a.executors:
            subprocess.run(["sync"], check=False)
            r = _measure_n([*CLI, "analyze", str(folder), "--json", "--executor", ex], a.repeat)
            r.update(ranks=n, events=info["events"], json_gib=size, executor=ex, cores=os.cpu_count())
            results.append(r)
            print(
                f"{n} ranks, {info['events']:,} events ({size:.2f} GiB JSON), --executor {ex}: {r['wall_s']:.1f} s end to end, "
                f"peak RSS main {r['peak_main_mb']:.0f} MB, largest worker {r['peak_worker_mb']:.0f} MB, whole tree {r['peak_tree_mb']:.0f} MB; "
                f"answers {r['answer_sha']} steps {r['steps']}",
                flush=True,
            )
    with open(OUT / "ranks.json", "a") as fh:
        for r in results:
            fh.write(json.dumps({**r, "date": time.strftime("%Y-%m-%d")}) + "\n")
    doc = {
        "command": "python benchmarks/bench_ranks.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "cores": os.cpu_count(),
        "runs": [{k: v for k, v in r.items() if k != "steps"} for r in results],
        **extra_figures,
    }
    a.results.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"written {a.results}")


if __name__ == "__main__":
    main()

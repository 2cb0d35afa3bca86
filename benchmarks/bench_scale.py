"""Scale benchmark: a synthetic 1M-event, 8-rank Kineto trace through BottleneckOracle,
against HTA 0.5.0's trace load and networkx's longest path on the same input, on this machine.

    python benchmarks/bench_scale.py --events 1000000 --ranks 8

Each measurement runs in its own process (so peak RSS is that pipeline's alone). HTA runs in
its own virtual environment (its pandas pin conflicts with ours); pass --hta-python to use an
existing one, else benchmarks/out/hta-venv is created with `pip install holistictraceanalysis==0.5.0 "pandas<3"`.
Results are printed and written to benchmarks/out/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"

# ru_maxrss survives exec on Linux (a child would report its parent's peak): read VmHWM instead
VM_HWM = r"""
def vm_hwm_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""

OURS = (
    VM_HWM
    + r"""
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
from bottleneck_oracle.graph_pipeline.events import load_events
from bottleneck_oracle.graph_pipeline.builder import build_graphs
from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.analysis.summary import StepAnalysis
t_import = time.perf_counter() - t0
t = time.perf_counter(); table = load_events(sys.argv[1]); t_parse = time.perf_counter() - t
t = time.perf_counter(); graphs = build_graphs(table); t_build = time.perf_counter() - t
t = time.perf_counter(); results = [run_cpm(g) for g in graphs]; t_cpm = time.perf_counter() - t
print(json.dumps({
    "import_s": t_import, "parse_s": t_parse, "build_s": t_build, "cpm_s": t_cpm,
    "end_to_end_s": t_parse + t_build + t_cpm,
    "peak_rss_mb": vm_hwm_mb(),
    "peak_rss_parse_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    "table_events": len(table), "graphs": len(graphs),
    "nodes": sum(g.n_nodes for g in graphs), "edges": sum(g.n_edges for g in graphs),
    "step_time_error_max": max(abs(StepAnalysis(graph=g, cpm=r).step_time - max(g.measured.values())) / max(g.measured.values()) for g, r in zip(graphs, results)),
}))
"""
)

NETWORKX = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import networkx as nx, numpy as np
from bottleneck_oracle.graph_pipeline.events import load_events
from bottleneck_oracle.graph_pipeline.builder import build_graphs
from bottleneck_oracle.analysis.cpm import run_cpm
graphs = build_graphs(load_events(sys.argv[1]))
t_ours = t_build = t_path = 0.0
agree = True
for g in graphs:
    t = time.perf_counter(); ours = run_cpm(g).window; t_ours += time.perf_counter() - t  # the longest path from time 0
    t = time.perf_counter()
    H = nx.DiGraph()
    d = g.nodes["mdur"]
    # parallel edges (one pair joined by two dependencies): a DiGraph keeps one, so the heaviest is given
    w = {}
    for u, v, x in zip(g.edges["src"].tolist(), g.edges["dst"].tolist(), (d[g.edges["src"]] + g.edges["weight"]).tolist()):
        w[(u, v)] = max(x, w.get((u, v), -np.inf))
    H.add_weighted_edges_from((u, v, x) for (u, v), x in w.items())
    H.add_weighted_edges_from((v, "sink", float(d[v])) for v in range(g.n_nodes))
    H.add_weighted_edges_from(("source", int(v), float(g.release[v])) for v in np.flatnonzero(np.isfinite(g.release)))
    t_build += time.perf_counter() - t
    t = time.perf_counter(); length = nx.dag_longest_path_length(H, weight="weight"); t_path += time.perf_counter() - t
    agree &= abs(length - ours) <= 1e-6 * max(ours, 1.0)
print(json.dumps({"nx_build_s": t_build, "nx_longest_path_s": t_path, "ours_cpm_s": t_ours, "same_makespan": bool(agree)}))
"""

HTA = (
    VM_HWM
    + r"""
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
import logging; logging.disable(logging.WARNING)
t = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t_import = time.perf_counter() - t
t = time.perf_counter()
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
t_load = time.perf_counter() - t
rss = vm_hwm_mb()
rss_workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
# HTA's critical path runs per rank and per annotation instance: time it on rank 0's first steps
t = time.perf_counter()
done = sum(bool(analyzer.critical_path_analysis(rank=0, annotation=f"ProfilerStep#{i}", instance_id=0)[1]) for i in range(5))
t_cp = (time.perf_counter() - t) / 5
print(json.dumps({"hta_import_s": t_import, "hta_load_s": t_load, "hta_peak_rss_mb": rss, "hta_peak_rss_worker_mb": rss_workers, "hta_ranks": len(analyzer.t.traces),
                  "hta_cp_s_per_rank_step": t_cp, "hta_cp_steps_ok": done}))
"""
)


def _run(python: str, code: str, arg: str, timeout: int = 1800) -> dict:
    r = subprocess.run([python, "-c", code, arg], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{python} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def hta_python(given: str | None) -> str:
    if given:
        return given
    venv = OUT / "hta-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"creating {venv} for HTA 0.5.0 (once) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "holistictraceanalysis==0.5.0", "pandas<3"], check=True)
    return str(py)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--hta-python", help="python of an environment with holistictraceanalysis 0.5.0")
    p.add_argument("--skip-hta", action="store_true")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of our pipeline; the median is reported")
    a = p.parse_args()
    folder = OUT / f"trace_{a.events}_{a.ranks}r"
    t = time.perf_counter()
    # generated in a child process, so that this one stays small while it starts the measured ones
    gen = f"import json, sys; sys.path.insert(0, {str(HERE)!r}); from synth_trace import generate; print(json.dumps(generate({str(folder)!r}, events={a.events}, ranks={a.ranks})))"
    info = json.loads(subprocess.run([sys.executable, "-c", gen], check=True, capture_output=True, text=True).stdout)
    gen_s = time.perf_counter() - t
    size_mb = sum(f.stat().st_size for f in folder.glob("*.json")) / 2**20
    print(
        f"generated {info['events']:,} events, {a.ranks} ranks, {info['steps']} steps, {size_mb:.0f} MB JSON in {gen_s:.1f} s", flush=True
    )

    subprocess.run(["sync"], check=False)  # the trace just written is flushed before anything is timed
    cold = _run(sys.executable, OURS, str(folder))  # compiles the numba passes into the cache
    runs = [_run(sys.executable, OURS, str(folder)) for _ in range(a.repeat)]
    ours = sorted(runs, key=lambda r: r["end_to_end_s"])[len(runs) // 2]  # the median run
    nx_res = _run(sys.executable, NETWORKX, str(folder))
    hta = {} if a.skip_hta else _run(hta_python(a.hta_python), HTA, str(folder))

    res = {
        "input": info,
        "json_mb": size_mb,
        "ours_first_run": cold,
        "ours": ours,
        "ours_runs_s": [r["end_to_end_s"] for r in runs],
        "networkx": nx_res,
        "hta": hta,
    }
    if hta:
        res["speedup_vs_hta_load"] = hta["hta_load_s"] / ours["end_to_end_s"]
    res["speedup_vs_networkx_longest_path"] = nx_res["nx_longest_path_s"] / nx_res["ours_cpm_s"]
    OUT.mkdir(exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(res, indent=1))

    lines: list[str] = []

    def say(text: str) -> None:
        print(text)
        lines.append(text)

    say(
        f"BottleneckOracle (median of {a.repeat} runs: {', '.join(f'{r:.2f}' for r in res['ours_runs_s'])} s): parse {ours['parse_s']:.2f} s, build {ours['build_s']:.2f} s, CPM {ours['cpm_s']:.2f} s, "
        f"end-to-end {ours['end_to_end_s']:.2f} s (first run, compiling the CPM passes unless numba's cache has them: {cold['end_to_end_s']:.2f} s), peak RSS {ours['peak_rss_mb']:.0f} MB (each parse worker: {ours['peak_rss_parse_worker_mb']:.0f} MB)"
    )
    say(
        f"  {ours['graphs']} step graphs, {ours['nodes']:,} nodes, {ours['edges']:,} edges; max step-time error vs the slowest rank's measured step {100 * ours['step_time_error_max']:.2f}%"
    )
    say(
        f"networkx: graph build {nx_res['nx_build_s']:.2f} s, dag_longest_path_length {nx_res['nx_longest_path_s']:.2f} s "
        f"vs our CPM {nx_res['ours_cpm_s']:.3f} s ({res['speedup_vs_networkx_longest_path']:.0f}x); same makespan: {nx_res['same_makespan']}"
    )
    if hta:
        say(
            f"HTA 0.5.0: TraceAnalysis load {hta['hta_load_s']:.2f} s ({hta['hta_ranks']} ranks), peak RSS {hta['hta_peak_rss_mb']:.0f} MB "
            f"(+ {hta['hta_peak_rss_worker_mb']:.0f} MB per worker) "
            f"-> ours end-to-end is {res['speedup_vs_hta_load']:.1f}x faster than HTA's load alone"
        )
        say(
            f"  HTA critical_path_analysis: {hta['hta_cp_s_per_rank_step']:.2f} s per rank and step ({hta['hta_cp_steps_ok']}/5 succeeded); "
            f"one rank at a time, so {a.ranks} ranks x {info['steps']} steps would take about "
            f"{hta['hta_cp_s_per_rank_step'] * a.ranks * info['steps']:.0f} s (extrapolated)"
        )

    header = [
        "# Scale benchmark: measured results",
        "",
        f"Written by `python benchmarks/bench_scale.py --events {a.events} --ranks {a.ranks}` on {time.strftime('%Y-%m-%d')}: "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, numpy {numpy.__version__}.",
        f"Input: a synthetic {a.ranks}-rank data-parallel GPU trace (benchmarks/synth_trace.py), {info['events']:,} trace events, "
        f"{info['steps']} steps, {size_mb:.0f} MB of JSON. Every run also writes all its numbers to benchmarks/out/results.json (not committed).",
        "",
        "```",
        f"generated {info['events']:,} events in {gen_s:.1f} s",
    ]
    results = HERE / "RESULTS.md"
    kept = results.read_text().partition("\n## Huge traces")[1:] if results.exists() else ("", "")  # bench_ranks' part, kept
    results.write_text("\n".join([*header, *lines, "```", ""]) + "".join(kept))


if __name__ == "__main__":
    main()

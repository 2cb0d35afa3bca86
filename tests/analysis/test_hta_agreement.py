"""Our critical path against HTA's on simple_add_1gpu (HTA's overlay: events with args.critical=1)."""

from __future__ import annotations

import gzip
import json

from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.api import graphs
from bottleneck_oracle.graph_pipeline.events import ancestors_of, cpu_parents
from conftest import PUBLIC, cached_load

HTA_CATEGORIES = {"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"}


def _key(tid, ts, name):
    return (int(tid), round(float(ts), 1), name)


def critical_sets():
    table = cached_load(PUBLIC / "simple_add_1gpu.json.gz")
    g = graphs(table)[0]
    r = run_cpm(g)
    rows = g.nodes["event"][r.path]
    rows = ancestors_of(cpu_parents(table), rows[rows >= 0])  # an op is critical if time inside it is
    c = table.cols
    ours = {_key(c["tid"][i], c["ts"][i] + table.t0, table.names[c["name"][i]]) for i in rows.tolist()}
    doc = json.loads(gzip.open(PUBLIC / "simple_add_1gpu.hta_critical_path_overlay.json.gz").read())
    events = {_key(e["tid"], e["ts"], e["name"]): e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"}
    hta = {k for k, e in events.items() if e.get("args", {}).get("critical") == 1}
    # HTA's graph holds CPU ops, runtime calls and GPU ops of non-zero duration: compare on those
    comparable = {k for k, e in events.items() if e["cat"] in HTA_CATEGORIES and e["dur"] > 0}
    return ours & comparable, hta & comparable, ours, hta


def test_critical_events_agree_with_hta():
    ours, hta, ours_all, hta_all = critical_sets()
    jaccard = len(ours & hta) / len(ours | hta)
    assert jaccard >= 0.9, f"Jaccard {jaccard:.3f} ({len(ours)} ours, {len(hta)} HTA, {len(ours & hta)} shared)"
    # every HTA-critical event we miss is a GPU op that overlapped the CPU thread launching it
    missed = hta - ours
    assert all(k[0] < 1000 for k in missed), missed  # GPU streams have small tids, the CPU thread is a pid

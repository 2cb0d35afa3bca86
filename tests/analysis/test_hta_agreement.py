"""Our critical path against HTA's on simple_add_1gpu (HTA's overlay: events with args.critical=1)."""

from __future__ import annotations

from bottleneck_oracle.analysis.compare import hta_agreement
from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.api import graphs
from conftest import PUBLIC, cached_load


def test_critical_events_agree_with_hta():
    table = cached_load(PUBLIC / "simple_add_1gpu.json.gz")
    g = graphs(table)[0]
    a = hta_agreement(table, g, run_cpm(g), PUBLIC / "simple_add_1gpu.hta_critical_path_overlay.json.gz")
    assert a.jaccard >= 0.9, a
    # what HTA marks and we do not are GPU ops that ran while the CPU thread launching them was
    # itself on the path (the kernel starts before its launch call returns): both chains are tight
    assert a.categories_only_hta in ([], ["gpu_memset", "kernel"], ["kernel"])

"""A recipe is offered to a step the trace shows it applies to: "checkpoint selectively" is for a
step that recomputes activations. diff_test's backward is over half of its critical path, as a
backward twice its forward is without checkpointing; the advisor told it to checkpoint less."""

from __future__ import annotations

import gzip
import json

from tests.conftest import PUBLIC, REAL

from bottleneck_oracle.analysis.phases import node_phases
from bottleneck_oracle.api import analyze
from bottleneck_oracle.llm.graphrag import advise, symptoms

RECIPE = "backward-compute-bound"


def _raw_names(path) -> set[str]:
    with gzip.open(path, "rt") as f:
        return {str(e.get("name", "")) for e in json.load(f)["traceEvents"]}


def _offered(path) -> tuple[list[float], list[float], int]:
    table, analyses = analyze(path)
    shares, present, offered = [], [], 0
    for a in analyses:
        phases, _ = node_phases(table, a.graph)
        m, _ = symptoms(a, None, phases)
        shares.append(m.get("backward_share", 0.0))
        present.append(m.get("recompute_present", float("nan")))
        adv = advise(a, None, phases, table)
        offered += RECIPE in {x.source for x in adv.suggestions} | {x.source for x in adv.rejected}
    return shares, present, offered


def test_checkpointing_advice_needs_a_step_that_recomputes(tmp_path):
    path = PUBLIC / "diff_test_rank1of2.json.gz"
    assert not any("checkpoint" in n.lower() or "recompute" in n.lower() for n in _raw_names(path))  # (read from the raw JSON)
    shares, present, offered = _offered(path)
    assert min(shares) >= 0.5 and offered == 0
    assert present == [0.0] * len(shares)
    # the same trace with one frame of torch.utils.checkpoint's in it: offered in every step
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    step = next(e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    frame = {**step, "cat": "python_function", "name": "torch/utils/checkpoint.py(1111): unpack_hook", "ts": step["ts"] + 1, "dur": 1}
    frame["args"] = {}
    doc["traceEvents"].append(frame)
    out = tmp_path / "with_checkpoint.json.gz"
    with gzip.open(out, "wt") as f:
        json.dump(doc, f)
    shares, present, offered = _offered(out)
    assert present == [1.0] * len(shares) and offered == len(shares)


def test_a_checkpointed_job_shows_its_recomputation():
    """The MI300 ResNet runs with activation checkpointing (its raw JSON holds torch.utils.checkpoint's frames)."""
    from bottleneck_oracle.llm.graphrag import RECOMPUTE_NAME

    path = REAL / "mi300_resnet_actckpt_rank0of8.json.gz"
    assert any(RECOMPUTE_NAME.search(n) for n in _raw_names(path))
    _, present, _ = _offered(path)
    assert present and set(present) == {1.0}

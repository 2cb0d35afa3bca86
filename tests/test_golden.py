"""One golden end-to-end pair: `analyze --json` on a small real trace against a stored answer.

Regenerate deliberately, after an intended change, with: python tests/test_golden.py --update
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
INPUT = HERE / "data" / "public-gpu" / "cuda_event_sync_1gpu.json.gz"
GOLDEN = HERE / "data" / "golden" / "cuda_event_sync_1gpu.analyze.json"


def produce() -> dict:
    from bottleneck_oracle.api import analyze

    _, analyses = analyze(INPUT)
    return {"steps": [a.to_dict(20) for a in analyses]}


def _close(a, b, path="") -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys differ"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-6), path
    else:
        assert a == b, path


def test_analyze_matches_the_golden_answer():
    _close(json.loads(json.dumps(produce())), json.loads(GOLDEN.read_text()))


if __name__ == "__main__" and "--update" in sys.argv:
    GOLDEN.write_text(json.dumps(produce(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")

"""Blame's comparison of a rank with its peers gives the same floats whether each rank is held
against the others one by one or the whole peer group at once (thousands of ranks)."""

from __future__ import annotations

import numpy as np
import pytest

from bottleneck_oracle.analysis import blame


@pytest.mark.parametrize("with_references", [False, True])
def test_peer_groups_compared_at_once_match_one_by_one(monkeypatch, with_references):
    rng = np.random.default_rng(7)
    keys, values = [], []
    for op in range(30):
        ranks = int(rng.integers(2, 40))
        for r in range(ranks):
            keys.append((r, False, f"op{op % 7}", op))
            values.append(float(rng.choice([1.0, 2.0, 2.5, 10.0])) if op % 3 == 0 else float(rng.gamma(2.0, 50.0)))
    values[5] = -1.0  # no value: left out of the comparison
    values = np.array(values)
    references = []
    if with_references:
        for _ in range(3):
            references.append((keys, np.maximum(values + rng.normal(0, 5, len(values)), 0.0)))
    groups = {r: 0 for r in range(40)}
    at_once = blame._typical(values, keys, references, groups)
    monkeypatch.setattr(blame, "_MANY_PEERS", 10**9)
    one_by_one = blame._typical(values, keys, references, groups)
    for a, b in zip(at_once, one_by_one):
        assert np.array_equal(a, b)


def test_the_median_peer_count_without_a_rank_is_numpys():
    """The run answer's extra ops: each rank's peers' median count, per op name, read off the
    group's sorted counts, equals numpy's median of the group without that rank."""
    from bottleneck_oracle.analysis.answer import _median_without

    rng = np.random.default_rng(3)
    for _ in range(300):
        counts = rng.integers(0, 5, size=(int(rng.integers(2, 12)), int(rng.integers(1, 6))))
        look = rng.choice(len(counts), size=int(rng.integers(1, len(counts) + 1)), replace=False)
        got = _median_without(counts, counts[look])
        for row, r in zip(got, look):
            assert np.array_equal(row, np.median(np.delete(counts, r, axis=0), axis=0))


def test_a_long_run_blamed_in_chunks_gives_the_answer_of_one_pass(tmp_path, monkeypatch):
    """blame on a long run of small steps splits the steps into chunks, one per core, each building
    its own graphs and its neighbours': the JSON is the one pass over every step's, byte for byte
    (the same reference steps: the nearest ones, the run's first left out)."""
    from bottleneck_oracle import api
    from bottleneck_oracle.graph_pipeline.engine import LocalEngine
    from bottleneck_oracle.serial import dumps
    from synthetic_ranks import write_run

    write_run(tmp_path, steps=150, extra_pairs=3, extra_steps=(40, 41, 120, 149), seed=5)
    monkeypatch.setattr(LocalEngine, "__init__", lambda self, workers=None: setattr(self, "workers", 3))
    monkeypatch.setattr(api, "CHUNKED_BLAME_STEPS", 100)
    chunks = []
    whole = api._blame_in_chunks
    monkeypatch.setattr(api, "_blame_in_chunks", lambda *a: chunks.append(1) or whole(*a))
    chunked = dumps(api.blame(tmp_path))
    assert chunks  # the chunked path ran
    monkeypatch.setattr(api, "CHUNKED_BLAME_STEPS", 10**9)
    one_pass = dumps(api.blame(tmp_path))
    assert chunked == one_pass and len(chunked) > 10_000

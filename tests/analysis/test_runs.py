"""Across steps: outlier steps with their cause, on real recordings of the bundled DDP job
(tests/data/README.md says how each was recorded); compare: tests/analysis/test_change.py."""

from __future__ import annotations

import sys

import pytest

from bottleneck_oracle import api, cli
from conftest import DATA

STRAGGLER = DATA / "gloo_ddp_8steps_straggler"  # rank 1 sleeps 20 ms in every forward pass
STRAGGLER_AGAIN = DATA / "gloo_ddp_8steps_straggler_rerun"  # the same job, recorded again
CLEAN = DATA / "gloo_ddp_8steps_clean"  # the same job without the straggler
INJECTED = DATA / "gloo_ddp_10steps_injected"  # rank 1 sleeps 30 ms in its forward at steps 4 and 8


def test_summary_flags_the_injected_steps_with_their_cause():
    """Rank 1 sleeps 30 ms in its forward pass at steps 4 and 8 (run.yaml): those two steps, and
    only those, are outliers, each with the injected range as its top cause."""
    s = api.summary(INJECTED)
    assert s.steps[0].warmup and not s.steps[0].outlier
    flagged = [x for x in s.steps if x.outlier]
    assert [x.step for x in flagged] == [4, 8]
    for x in flagged:
        assert x.cause is not None and x.cause.rank == 1 and x.cause.name.startswith("oracle_inject:phase:forward")
        assert 25_000 <= x.cause.saving_us <= 35_000 and x.vs_median > 0.5
    assert s.median_us == pytest.approx(sorted(x.measured_us for x in s.steps[1:])[4], rel=1e-9)


@pytest.mark.parametrize("width", [80, 100, 160])
def test_no_number_is_cut_at_any_width(width, monkeypatch, capsys):
    import re

    from rich.console import Console

    monkeypatch.setattr(cli, "out", Console(width=width))
    old = sys.argv
    for args in (
        ["analyze", str(DATA / "gloo_ddp_2rank")],
        ["analyze", str(DATA / "real-gpu" / "dlrm_v100_8rank")],
        ["compare", str(STRAGGLER), str(CLEAN)],
        ["summary", str(STRAGGLER)],
    ):
        sys.argv = ["bottleneck-oracle", *args]
        try:
            cli.main()
        except SystemExit as exc:
            assert not exc.code
        finally:
            sys.argv = old
        out = capsys.readouterr().out
        assert not re.search(r"\d…|…\d", out), args
        assert max(len(line) for line in out.splitlines()) <= width

"""A recording's rank that fails or is killed is one clean error naming the folder and the rank."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import pytest

from bottleneck_oracle.errors import RunError
from bottleneck_oracle_lab.systems.launch import spawn


@dataclass
class _Run:
    out: str
    world: int = 1
    how: str = "raise"


def _failing_worker(rank: int, run: _Run, port: int) -> None:
    if run.how == "raise":
        raise ValueError("the model does not fit\nsecond line")
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer does


@pytest.mark.parametrize(
    "how, message",
    [("raise", "rank 0 failed: ValueError: the model does not fit"), ("kill", "rank 0 was killed by SIGKILL (out of memory?")],
)
def test_a_failed_rank_is_one_clean_error(tmp_path, how, message):
    with pytest.raises(RunError) as info:
        spawn(_failing_worker, _Run(out=str(tmp_path / "run"), how=how))
    text = str(info.value)
    assert text.startswith(str(tmp_path / "run")) and message in text and "Traceback" not in text, text
    assert not (tmp_path / "run" / "run.yaml").exists()  # nothing claims the run finished

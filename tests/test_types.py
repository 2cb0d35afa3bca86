"""mypy on the package: the public API (api.py and the results it returns) is clean under
--strict, and the whole package under the project's configuration (pyproject.toml [tool.mypy])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).parents[1]
PKG = ROOT / "src" / "bottleneck_oracle"
PUBLIC_API = [PKG / "api.py", PKG / "analysis" / "results.py", PKG / "analysis" / "blame.py", PKG / "analysis" / "runs.py",
              PKG / "analysis" / "summary.py"]  # fmt: skip


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_public_api_is_strictly_typed():
    """--strict on the API and its result types; the modules they import are checked, their
    errors not reported (follow-imports=silent): the whole package has its own test."""
    r = mypy("--strict", "--follow-imports=silent", *map(str, PUBLIC_API))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found in 5 source files" in r.stdout


@pytest.mark.slow
def test_the_package_type_checks():
    r = mypy()  # files and settings from pyproject.toml
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found" in r.stdout

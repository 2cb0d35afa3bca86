"""mypy on the package: the public API (what ``import bottleneck_oracle`` offers, the results it
returns and the types they expose) is clean under --strict, and no public function of it returns
``Any`` (no ``dict[str, Any]``: results are typed records); the whole package and the lab under the
project's configuration (pyproject.toml [tool.mypy])."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PKG = ROOT / "src" / "bottleneck_oracle"
PUBLIC_API = sorted(
    [
        PKG / "__init__.py",
        PKG / "api.py",  # the functions the CLI is thin over
        PKG / "serial.py",  # to_json: every result's --json
        PKG / "errors.py",
        PKG / "config.py",
        *(PKG / "analysis").glob("*.py"),  # the results and the analyses that make them
        PKG / "graph_pipeline" / "graph.py",  # ExecutionGraph and its typed meta
        PKG / "graph_pipeline" / "schema.py",
        PKG / "graph_pipeline" / "events.py",  # EventTable (api.load)
        PKG / "graph_pipeline" / "clocks.py",  # ClockReport (EventTable.clocks)
        PKG / "graph_pipeline" / "engine.py",  # Engine (api's executor)
        PKG / "models" / "predict.py",  # Predictor, ModelAnswer's producer
        PKG / "models" / "corrections.py",  # Corrections, CorrectedSaving
        PKG / "llm" / "client.py",  # ChatClient (api.advise)
    ]
)


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_public_api_is_strictly_typed():
    """--strict on the public API; the modules it imports are checked, their errors not reported
    (follow-imports=silent): the whole package has its own test."""
    r = mypy("--strict", "--follow-imports=silent", *map(str, PUBLIC_API))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Success: no issues found in {len(PUBLIC_API)} source files" in r.stdout


def _public_returns(path: Path) -> list[tuple[str, str]]:
    """(where, return annotation) of every public function and method of a module."""
    out = []
    for node in ast.parse(path.read_text()).body:
        scopes = [(node.name, n) for n in node.body] if isinstance(node, ast.ClassDef) and not node.name.startswith("_") else [("", node)]
        for owner, fn in scopes:
            if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_") and fn.returns is not None:
                out.append((f"{path.relative_to(PKG)}:{fn.lineno} {owner + '.' if owner else ''}{fn.name}", ast.unparse(fn.returns)))
    return out


def test_no_public_function_returns_an_untyped_value():
    found = [(where, ann) for f in PUBLIC_API for where, ann in _public_returns(f)]
    assert len(found) > 150  # the scan sees the API
    untyped = [f"{where} -> {ann}" for where, ann in found if "Any" in ann or ann in ("dict", "list", "tuple")]
    assert not untyped, "\n".join(untyped)


@pytest.mark.slow
def test_the_package_type_checks():
    r = mypy()  # files and settings from pyproject.toml: the product and the lab
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found" in r.stdout

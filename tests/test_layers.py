"""The package's layers import only downward (deferred imports inside functions included):

    base (errors, atomic, files, config, inert, the package version)
    < graph_pipeline < analysis < models < training < llm, report, systems < api < cli

so there is no import cycle, and the analysis commands never need the learned models' stack.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "src" / "bottleneck_oracle"
LAYERS = [
    {"errors", "atomic", "files", "config", "inert", "__init__", "py"},
    {"graph_pipeline"},
    {"analysis"},
    {"models"},
    {"training"},
    {"llm", "report", "systems"},
    {"api"},
    {"cli", "__main__"},
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _imports(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "bottleneck_oracle":
            parts = node.module.split(".")
            out.append((parts[1] if len(parts) > 1 else "__init__", node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "bottleneck_oracle":
                    out.append((parts[1] if len(parts) > 1 else "__init__", node.lineno))
    return out


def _facade_lines(path: Path) -> set[int]:
    """Lines of the imports inside the package root's module ``__getattr__`` (names imported on first
    use: the top-level API re-exported, nothing imported when the package is)."""
    tree = ast.parse(path.read_text())
    out: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            out |= {n.lineno for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def test_every_layer_imports_only_downward():
    bad = []
    for f in sorted(PACKAGE.rglob("*.py")):
        rel = f.relative_to(PACKAGE)
        own = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        assert own in RANK, f"{rel}: a package that no layer names"
        facade = _facade_lines(f) if rel.name == "__init__.py" and len(rel.parts) == 1 else set()
        for target, line in _imports(f):
            if target == own or line in facade:  # the package root's lazy facade: ``bottleneck_oracle.analyze`` is the API's
                continue
            sideways = RANK.get(target) == RANK[own] and 0 < RANK[own] < len(LAYERS) - 1  # llm, report and systems stay apart
            if RANK.get(target, len(LAYERS)) > RANK[own] or sideways:
                bad.append(f"{rel}:{line} imports {target} (layer {RANK.get(target)}) from layer {RANK[own]}")
    assert not bad, "\n".join(bad)


def test_the_analysis_commands_import_no_torch():
    code = (
        "import sys; from bottleneck_oracle import api, cli; "
        "from bottleneck_oracle.analysis import blame, phases, runs, whatif; from bottleneck_oracle.report import terminal, tables; "
        "bad = sorted(m for m in ('torch', 'torch_geometric', 'plotly', 'matplotlib', 'google.protobuf') if m in sys.modules); "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_importing_the_package_imports_no_layer_above_it():
    """``import bottleneck_oracle`` loads the root only; its API names load the API on first use."""
    code = "import sys, bottleneck_oracle as bo; assert not [m for m in sys.modules if m.startswith('bottleneck_oracle.')], sorted(sys.modules); bo.analyze; assert 'bottleneck_oracle.api' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)

"""Two packages, each layered, each layer importing only downward (deferred imports inside
functions included), so there is no import cycle:

    the product, bottleneck_oracle:
        base (errors, atomic, files, config, inert, serial, the package version)
        < graph_pipeline < analysis < models < llm, report < api < cli
    the lab, bottleneck_oracle_lab (recording, training, the torch models), over the product:
        models < training, systems

The product never imports the lab, except the CLI's developer commands, inside the commands
(``pip install .`` of the product alone runs every analysis command); the analysis commands
import no torch; and the product's wheel holds no recording, training or benchmark code.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "src" / "bottleneck_oracle"
LAB = ROOT / "lab" / "src" / "bottleneck_oracle_lab"
LAYERS = [
    {"errors", "atomic", "files", "config", "inert", "serial", "__init__", "py"},
    {"graph_pipeline"},
    {"analysis"},
    {"models"},
    {"llm", "report"},
    {"api"},
    {"cli", "__main__"},
]
LAB_LAYERS = [{"__init__"}, {"models"}, {"training", "systems"}]
PRODUCT = "bottleneck_oracle"
LAB_NAME = "bottleneck_oracle_lab"


def _rank(layers: list[set[str]]) -> dict[str, int]:
    return {name: i for i, names in enumerate(layers) for name in names}


def _imports(path: Path) -> list[tuple[str, str, int, bool]]:
    """(package, its first-level module, line, at module level) of every import of either package."""
    tree = ast.parse(path.read_text())
    top: set[int] = set()  # the nodes run when the module is imported: outside every function
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        top.add(id(node))
        stack += [c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] in (PRODUCT, LAB_NAME):
                out.append((parts[0], parts[1] if len(parts) > 1 else "__init__", node.lineno, id(node) in top))
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


def _own(root: Path, f: Path) -> str:
    rel = f.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_every_layer_of_the_product_imports_only_downward():
    rank, bad = _rank(LAYERS), []
    for f in sorted(PACKAGE.rglob("*.py")):
        rel, own = f.relative_to(PACKAGE), _own(PACKAGE, f)
        assert own in rank, f"{rel}: a package that no layer names"
        facade = _facade_lines(f) if rel.name == "__init__.py" and len(rel.parts) == 1 else set()
        for package, target, line, top in _imports(f):
            if package == LAB_NAME:
                if own != "cli" or top:  # the developer commands only, imported when one runs
                    bad.append(f"{rel}:{line} imports the lab ({LAB_NAME}.{target})" + (" at module level" if top else ""))
                continue
            if target == own or line in facade:  # the package root's lazy facade: ``bottleneck_oracle.analyze`` is the API's
                continue
            sideways = rank.get(target) == rank[own] and 0 < rank[own] < len(LAYERS) - 1  # llm and report stay apart
            if rank.get(target, len(LAYERS)) > rank[own] or sideways:
                bad.append(f"{rel}:{line} imports {target} (layer {rank.get(target)}) from layer {rank[own]}")
    assert not bad, "\n".join(bad)


def test_every_layer_of_the_lab_imports_only_downward():
    rank, bad = _rank(LAB_LAYERS), []
    for f in sorted(LAB.rglob("*.py")):
        rel, own = f.relative_to(LAB), _own(LAB, f)
        assert own in rank, f"{rel}: a package that no layer of the lab names"
        for package, target, line, _ in _imports(f):
            if package == PRODUCT:
                if target in ("cli", "__main__"):
                    bad.append(f"{rel}:{line} imports the product's CLI (the lab is below it)")
                continue
            if target == own:
                continue
            sideways = rank.get(target) == rank[own]  # training and systems stay apart
            if rank.get(target, len(LAB_LAYERS)) > rank[own] or sideways:
                bad.append(f"{rel}:{line} imports {target} (lab layer {rank.get(target)}) from lab layer {rank[own]}")
    assert not bad, "\n".join(bad)


def test_the_analysis_commands_import_no_torch_and_no_lab():
    code = (
        "import sys; from bottleneck_oracle import api, cli; "
        "from bottleneck_oracle.analysis import blame, phases, runs, whatif; from bottleneck_oracle.report import terminal, tables; "
        "from bottleneck_oracle.models import corrections, predict; "
        "bad = sorted(m for m in ('torch', 'torch_geometric', 'plotly', 'matplotlib', 'google.protobuf', 'bottleneck_oracle_lab') "
        "if m in sys.modules); print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_importing_the_package_imports_no_layer_above_it():
    """``import bottleneck_oracle`` loads the root only; its API names load the API on first use."""
    code = "import sys, bottleneck_oracle as bo; assert not [m for m in sys.modules if m.startswith('bottleneck_oracle.')], sorted(sys.modules); bo.analyze; assert 'bottleneck_oracle.api' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_products_wheel_holds_no_lab_code(tmp_path):
    """``pip install .`` installs the product alone: its wheel (built here from the checkout) holds
    the analysis package and its data, and no recording, training, benchmark or torch model code,
    and the graph network's weights once (the .npz inference reads)."""
    pytest.importorskip("setuptools")
    source = tmp_path / "checkout"  # a copy: setuptools writes its build folders beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-cache-dir",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,) = tmp_path.glob("bottleneck_oracle-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    code = sorted(n for n in names if n.endswith(".py"))
    assert code and all(n.startswith("bottleneck_oracle/") for n in code), code[:5]
    assert not [n for n in names if n.startswith(LAB_NAME)]
    for lab_part in ("systems/", "training/", "benchmarks/", "hetero_gat", "baselines", "pyg.py"):
        assert not [n for n in names if lab_part in n], lab_part
    weights = sorted(n for n in names if n.endswith((".pt", ".npz")))
    assert weights == ["bottleneck_oracle/models/corrections.npz", "bottleneck_oracle/models/pretrained.npz"], weights
    shipped = {n.removeprefix("bottleneck_oracle/") for n in code}
    on_disk = {str(f.relative_to(PACKAGE)) for f in PACKAGE.rglob("*.py")}
    assert shipped == on_disk, sorted(shipped ^ on_disk)
    # installed alone, the package is whole: every module of it, and nothing of the lab
    target = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    code = (
        "import pkgutil, sys, bottleneck_oracle as bo; "
        f"assert bo.__file__.startswith({str(target)!r}), bo.__file__; "
        "names = sorted(m.name for m in pkgutil.walk_packages(bo.__path__, 'bottleneck_oracle.')); "
        "print('\\n'.join(names))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    modules = r.stdout.split()
    assert "bottleneck_oracle.api" in modules and "bottleneck_oracle.models.predict" in modules
    assert not [m for m in modules if m.split(".")[1] in ("systems", "training") or m.endswith(("hetero_gat", "baselines"))], modules

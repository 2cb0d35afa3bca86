"""The manual (mkdocs.yml, docs/): it builds with warnings as errors, every figure it and the README
quote is what ``make figures`` renders from the committed results, and every command and public API
function has its page or reference entry."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from bottleneck_oracle import api, cli

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"


def _figures():
    spec = importlib.util.spec_from_file_location("figures", ROOT / "benchmarks" / "figures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands() -> dict[str, typer.models.CommandInfo]:
    return {c.name or c.callback.__name__.replace("_", "-"): c for c in cli.app.registered_commands}


def _public_api() -> list[str]:
    return sorted(
        name for name, obj in vars(api).items() if not name.startswith("_") and inspect.isfunction(obj) and obj.__module__ == api.__name__
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built by ``mkdocs build --strict`` (a warning fails it) into a temporary folder."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs and mkdocstrings are not installed (the [dev] extra installs them)")
    out = tmp_path_factory.mktemp("site")
    mkdocs = [sys.executable, "-m", "mkdocs"]
    run = subprocess.run(
        [*mkdocs, "build", "--strict", "--site-dir", str(out), "--config-file", str(ROOT / "mkdocs.yml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    assert not re.search(r"^(WARNING|ERROR)", run.stderr, re.M), run.stderr
    return out


def test_the_manual_builds_with_warnings_as_errors_and_includes_every_figure(site):
    pages = list(site.rglob("*.html"))
    assert len(pages) > 30
    leftovers = [p.relative_to(site) for p in pages if "--8&lt;--" in p.read_text() or "--8<--" in p.read_text()]
    assert not leftovers, f"snippets not included: {leftovers}"
    assert not (site / "figures").exists(), "the figure snippets are included into pages, not pages of their own"


def test_the_committed_figures_are_what_make_figures_renders():
    """Every docs/figures/*.md and the README's figure blocks equal a fresh render from the
    committed results (run `make figures` after changing a result file or the analysis output)."""
    rendered = _figures().render(ROOT)
    stale = [str(rel) for rel, text in rendered.items() if not (ROOT / rel).is_file() or (ROOT / rel).read_text() != text]
    assert not stale, f"out of date, run `make figures`: {stale}"
    committed = {p.relative_to(ROOT) for p in (DOCS / "figures").glob("*.md")}
    assert committed == {rel for rel in rendered if rel.parts[:2] == ("docs", "figures")}, (
        "docs/figures/ holds a file make figures does not write"
    )


def test_every_figure_is_quoted_and_every_quoted_figure_exists():
    figures = {p.stem for p in (DOCS / "figures").glob("*.md")}
    quoted = set()
    for page in DOCS.rglob("*.md"):
        if page.parent.name != "figures":
            quoted |= set(re.findall(r'^--8<-- "docs/figures/([\w-]+)\.md"$', page.read_text(), re.M))
    readme = (ROOT / "README.md").read_text()
    quoted |= set(re.findall(r"<!-- figure:([\w-]+) -->", readme))
    assert quoted <= figures, f"quoted but not generated: {sorted(quoted - figures)}"
    assert figures <= quoted, f"generated but quoted nowhere: {sorted(figures - quoted)}"


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert "make demo" in readme and "make test" in readme
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), f"README links to a missing page: {link}"


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_command_has_a_page_naming_each_of_its_options(command, site):
    page = DOCS / "commands" / f"{command}.md"
    assert page.is_file(), f"{command} has no page in docs/commands/"
    assert (site / "commands" / f"{command}.html").is_file(), f"docs/commands/{command}.md is not in the site's navigation"
    text = page.read_text()
    click_command = typer.main.get_command(cli.app).commands[command]  # type: ignore[attr-defined]
    options = [o for p in click_command.params if not getattr(p, "hidden", False) for o in p.opts if o.startswith("--") and o != "--help"]
    missing = [o for o in options if o not in text]
    assert not missing, f"docs/commands/{command}.md does not document {missing}"


def test_every_public_api_function_is_in_the_reference(site):
    html = (site / "reference" / "api.html").read_text()
    missing = [name for name in _public_api() if f'id="bottleneck_oracle.api.{name}"' not in html]
    assert not missing, f"not in the API reference: {missing}"
    assert {"analyze", "whatif", "blame", "advise", "summary", "compare"} <= set(_public_api())


def test_the_site_is_built_from_local_files_only():
    """No plugin that fetches from the network at build time; no fonts from a CDN in the pages."""
    text = (ROOT / "mkdocs.yml").read_text()
    assert "privacy" not in text and re.search(r"^\s+font: false", text, re.M)
    assert shutil.which("git") is None or "site/" in (ROOT / ".gitignore").read_text()

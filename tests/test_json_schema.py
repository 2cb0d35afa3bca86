"""The keys of every command's --json are the ones the manual documents (docs/json.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import DATA, SAMPLE, run_cli

DOCUMENTED = Path(__file__).parents[1] / "docs" / "json.md"
STRAGGLER = DATA / "gloo_ddp_8steps_straggler"
CLEAN = DATA / "gloo_ddp_8steps_clean"


def documented() -> dict[str, tuple[set[str], set[str]]]:
    """object -> (required keys, optional keys) from the manual's table."""
    text = DOCUMENTED.read_text()
    table = text[text.index("<!-- json-schema:start -->") : text.index("<!-- json-schema:end -->")]
    out = {}
    for line in table.splitlines():
        m = re.fullmatch(r"\| `(\w+)`( [a-z_]+)? \| (.+) \|", line)
        if not m:
            continue
        keys = re.findall(r"`(\w+)(\?)?`", re.sub(r"\([^)]*\)", "", m.group(3)))  # notes in parentheses are not keys
        out[m.group(1) + (m.group(2) or "")] = ({k for k, opt in keys if not opt}, {k for k, opt in keys if opt})
    return out


SCHEMA = documented()


def check(name: str, obj: dict) -> None:
    required, optional = SCHEMA[name]
    assert isinstance(obj, dict), name
    assert required <= set(obj), f"{name}: documented keys missing from the output: {sorted(required - set(obj))}"
    assert set(obj) <= required | optional, f"{name}: undocumented keys: {sorted(set(obj) - required - optional)}"


def json_of(args: list[str], capsys) -> dict:
    code, out, err = run_cli([*args, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def test_the_manual_documents_every_command():
    assert {"analyze", "whatif", "blame", "advise", "summary", "compare", "blame node", "advise suggestion"} <= set(SCHEMA)
    assert "model" in SCHEMA["blame step"][1] and "gate_failed" in SCHEMA["compare"][0]


def test_blame_and_advise_json_have_the_documented_keys(capsys):
    doc = json_of(["blame", str(STRAGGLER), "--step", "3", "--model"], capsys)  # with the shipped model: model keys too
    check("blame", doc)
    seen_model = False
    for step in doc["steps"]:
        check("blame step", step)
        for x in step["nodes"] + step["anomalies"]:
            check("blame node", x)
            seen_model |= "model_saving_us" in x
        for x in step["ranks"]:
            check("blame rank", x)
        for x in step["ops"]:
            check("blame op", x)
        for x in step["regions"]:
            check("blame region", x)
        assert step["regions"] and step["regions"][0]["name"] == "forward"  # the straggler's sleep is in its forward range
        check("blame model", step["model"])
    assert seen_model
    doc = json_of(["advise", str(STRAGGLER), "--step", "3", "--no-model"], capsys)
    check("advise", doc)
    for step in doc["steps"]:
        check("advise step", step)
        check("advise blame", step["blame"])
        assert step["suggestions"]
        for s in step["suggestions"]:
            check("advise suggestion", s)


def test_analyze_with_advice_json_has_the_documented_keys(capsys):
    doc = json_of(["analyze", str(SAMPLE), "--advise", "--no-model"], capsys)
    check("analyze", doc)
    for step in doc["steps"]:
        check("analyze step", step)
        for f in step["facts"]["ranks"]:
            check("analyze rank_facts", f)
        check("advise blame", step["blame"])
        advice = step["advice"]
        check("advise step", {**advice, "blame": step["blame"]})
        for s in advice["suggestions"]:
            check("advise suggestion", s)


def test_whatif_json_has_the_documented_keys(capsys, generated_grid):
    doc = json_of(["whatif", str(SAMPLE), "--step", "2", "--edit", "name~=all_reduce,scale=2", "--model"], capsys)
    check("whatif", doc)
    for step in doc["steps"]:
        check("whatif step", step)
        check("whatif replay", step["replay"])
        check("whatif model", step["model"])
        check("whatif corrected", step["corrected"])
        check("whatif critical_path", step["critical_path"])
        for x in step["critical_path"]["joined"] + step["critical_path"]["left"]:
            assert set(x) == {"id", "name", "rank"}
    raw, _ = generated_grid
    pp = next(p for p in raw.iterdir() if "pp2-1f1b" in p.name)
    (step,) = json_of(["whatif", str(pp), "--step", "4", "--microbatches", "8", "--no-model"], capsys)["steps"]
    check("whatif step", step)
    check("whatif microbatches", step["microbatches"])
    (step, *_) = json_of(["whatif", str(SAMPLE), "--set", "batch=x2", "--no-model"], capsys)["steps"]
    check("whatif step", step)


@pytest.mark.parametrize("command", ["summary", "compare"])
def test_summary_and_compare_json_have_the_documented_keys(command, capsys):
    if command == "summary":
        doc = json_of(["summary", str(DATA / "gloo_ddp_10steps_injected")], capsys)
        check("summary", doc)
        for step in doc["steps"]:
            check("summary step", step)
        causes = [step["cause"] for step in doc["steps"] if step["cause"] is not None]
        assert causes  # the injected steps are outliers
        for cause in causes:
            check("summary cause", cause)
    else:
        doc = json_of(["compare", str(CLEAN), str(STRAGGLER)], capsys)
        check("compare", doc)
        assert doc["moved"] and doc["by_kind"] and doc["by_rank"]
        for m in doc["moved"]:
            check("compare moved", m)
        for k in doc["by_kind"].values():
            check("compare by_kind", k)
        for r in doc["by_rank"]:
            check("compare by_rank", r)

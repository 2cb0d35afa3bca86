"""Dataset generation: a grid of real profiled runs with injected delays.

Every cell of size × layout × injection kind is one launch. In a launch, every third step
carries an injection (a random rank, target and delay from the grid, seeded per run) and the
steps between are unperturbed, so each perturbed step has unperturbed neighbours to pair
with. A finished run leaves a ``DONE`` file; runs that have one are skipped, so an
interrupted generation resumes. The dataset manifest (``manifest.jsonl``, one line per
profiled step) is rewritten atomically after every run.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.config import GridConfig
from bottleneck_oracle.graph_pipeline.events import EventTable, load_events
from bottleneck_oracle_lab.systems.ddp import DDPRun
from bottleneck_oracle_lab.systems.ddp import record as record_ddp
from bottleneck_oracle_lab.systems.inject import Injection, read_manifest
from bottleneck_oracle_lab.systems.model import SIZES
from bottleneck_oracle_lab.systems.pipeline import PipelineRun
from bottleneck_oracle_lab.systems.pipeline import record as record_pipeline
from bottleneck_oracle_lab.systems.tensor import TensorRun
from bottleneck_oracle_lab.systems.tensor import record as record_tp

MANIFEST = "manifest.jsonl"
LAYOUT = re.compile(r"^(dp|tp|pp)(\d+)(?:-(afab|1f1b))?$")


def world_of(layout: str) -> int:
    m = LAYOUT.match(layout)
    if m is None:
        raise ValueError(f"not a layout (dpN, tpN, ppN or ppN-afab|1f1b): {layout!r}")
    return int(m.group(2))


def stage_layers(layout: str, size: str, rank: int) -> range:
    """The layers a rank runs: all of them under DP and TP, its stage's under PP."""
    n = SIZES[size].layers
    if layout.startswith("pp"):
        world = world_of(layout)
        return range(rank * n // world, (rank + 1) * n // world)
    return range(n)


def step_times(table: EventTable) -> dict[int, float]:
    """Step time (µs) of every profiled step of a recorded run: the slowest rank's ProfilerStep span."""
    per: dict[int, float] = {}
    for s in table.steps:
        per[s.number] = max(per.get(s.number, 0.0), s.span)
    return per


def cells(grid: GridConfig) -> list[dict]:
    """The launches of a grid: one per size x layout x injection kind (collective: DP only)."""
    out = []
    for size in grid.sizes:
        for layout in grid.layouts:
            for kind in grid.injection_kinds:
                if kind == "collective" and not layout.startswith("dp"):
                    continue  # the collective injection hooks DDP's gradient all-reduce
                out.append({"run_id": f"{size}-{layout}-{kind}", "size": size, "layout": layout, "kind": kind})
    return out


def injections_for(cell: dict, grid: GridConfig, seed: int) -> tuple[Injection, ...]:
    """Every third step from step 3 on: one injection, drawn with the run's seed."""
    rng = random.Random(seed)
    layers = SIZES[cell["size"]].layers
    world = world_of(cell["layout"])
    out = []
    for step in range(3, grid.steps + 1, 3):
        rank = rng.randrange(world)
        delay = rng.choice(grid.delays_ms)
        kind = cell["kind"]
        if kind in ("module", "compute"):
            if cell["layout"].startswith("pp"):  # the layers a stage holds
                held = stage_layers(cell["layout"], cell["size"], rank)
                layer = rng.randrange(held.start, held.stop)
            else:
                layer = rng.randrange(layers)
            target = f"layers.{layer}.{rng.choice(['attn', 'mlp'])}"
        elif kind == "phase":
            target = rng.choice(["forward", "backward", "optimizer"]) if not cell["layout"].startswith("pp") else "optimizer"
        else:
            target = ""
        out.append(Injection(kind=kind, target=target, rank=rank, step=step, delay_ms=delay))
    return tuple(out)


def run_cell(cell: dict, grid: GridConfig, out: Path, seed: int) -> Path:
    """Record one launch into ``out`` (replacing a partial earlier attempt); returns the folder."""
    folder = out / cell["run_id"]
    if folder.exists():
        shutil.rmtree(folder)  # a run without DONE was interrupted: start it again
    layout = cell["layout"]
    world = world_of(layout)
    injections = injections_for(cell, grid, seed)
    if layout.startswith("tp"):
        record_tp(
            TensorRun(out=str(folder), world=world, size=cell["size"], batch=grid.batch, steps=grid.steps, seed=seed, injections=injections)
        )
    elif layout.startswith("dp"):
        record_ddp(
            DDPRun(
                out=str(folder),
                world=world,
                steps=grid.steps,
                size=cell["size"],
                batch=grid.batch,
                bucket_mb=25.0,
                seed=seed,
                injections=injections,
            )
        )
    else:
        schedule = layout.split("-", 1)[1]
        record_pipeline(
            PipelineRun(
                out=str(folder),
                world=world,
                size=cell["size"],
                schedule=schedule,
                microbatches=grid.microbatches,
                batch=grid.batch,
                steps=grid.steps,
                seed=seed,
                injections=injections,
            )
        )
    (folder / "DONE").write_text(json.dumps({**cell, "seed": seed}))
    return folder


def manifest_rows(folder: Path, cell: dict) -> list[dict]:
    """One row per profiled step of a finished run: measured step time and its injection."""
    table = load_events(folder)
    step_time = step_times(table)
    injected: dict[int, dict] = {}
    for r in read_manifest(folder):  # a module runs once per micro-batch: one record per call
        inj = injected.setdefault(
            r["step"], {**{k: r[k] for k in ("kind", "target", "rank", "delay_ms", "where")}, "slept_ms": 0.0, "calls": 0}
        )
        inj["slept_ms"] += r["slept_ms"]
        inj["calls"] += 1
    rows = []
    for step in sorted(step_time):
        got = injected.get(step)
        rows.append(
            {
                **cell,
                "step": step,
                "ranks": len(table.ranks),
                "step_time_us": step_time[step],
                "path": str(folder),
                "injection": got,
                "baseline_step": None if got is None else step - 1,
            }
        )
    return rows


def generate(grid: GridConfig, out: str | Path, progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Record every run of the grid not yet done, then write the dataset manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = cells(grid)
    done = skipped = 0
    rows: list[dict] = []
    for i, cell in enumerate(todo):
        folder = out / cell["run_id"]
        if (folder / "DONE").exists():
            skipped += 1
        else:
            if progress:
                progress(cell["run_id"], i, len(todo))
            run_cell(cell, grid, out, seed=grid.seed + i)
            done += 1
        rows.extend(manifest_rows(folder, cell))
        with atomic_path(out / MANIFEST) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if progress:
        progress("", len(todo), len(todo))
    perturbed = sum(r["injection"] is not None for r in rows)
    return {
        "runs": len(todo),
        "recorded": done,
        "skipped": skipped,
        "steps": len(rows),
        "perturbed_steps": perturbed,
        "manifest": str(out / MANIFEST),
        "grid": asdict(grid),
    }

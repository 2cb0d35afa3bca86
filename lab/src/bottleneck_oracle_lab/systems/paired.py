"""Paired conditions: a slowdown in every step of a block, measured against clean blocks around it.

The ground truth that what-if and blame are checked against. A launch runs short blocks of
``block`` profiled steps, interleaved: clean, slowed, clean, slowed, ... — ``repeats`` slowed
blocks per condition, then the next condition's — every rank pinned to a core of its own with
one thread (``launch.pin_to_core``; a DDP rank's gloo socket thread at idle priority,
``launch.idle_gloo_loops``), the warm-up step discarded, and the first step of every
block too (where the job changes from one condition to the next). Short interleaved blocks
cancel the machine's drift, which long blocks do not: on the 2-core recording machine, the
medians of two 11-step clean blocks 3 s apart differed by 8% (median over 112 pairs), while the
same steps split into alternate halves differed by 3.6%. A condition is a slowdown on one rank
in every step of its blocks:

- ``stall``: a sleep after a module's forward (a hook that blocks, a slow data fetch in a module);
- ``compute``: real extra work after a module's forward, small matmul + tanh pairs (many small
  ops, no single one of which explains the slowdown);
- ``collective``: a sleep before DDP's gradient all-reduce is issued (DP layouts only);
- ``rank``: a sleep at the start of the step (a slow rank).

In a pipeline, module slowdowns run once per micro-batch, so each call gets ``delay_ms /
microbatches`` and the step carries ``delay_ms`` in all.

Measured (``conditions.jsonl`` in the launch folder, one line per condition): the step time of a
step is the slowest rank's ``ProfilerStep`` span; a condition's measured saving (what removing it
saves) is the median of its slowed steps minus the mean of the medians of its two clean groups
(the clean blocks around its slowed ones, taken alternately: ``Launch.clean_blocks``). The noise
floor: each clean group's robust relative spread (1.4826 x MAD / median) and the clean-vs-clean
difference of the two groups (|second - first| / first). Beside the saving, a second estimate
that a transient of the machine cannot move the way it moves pooled medians: ``local_saving_us``,
the median over the slowed blocks of each block's median minus the mean of the two clean blocks
beside it (the clean-vs-clean figure cannot see a transient that both clean groups share). A launch whose median clean-vs-clean difference is above ``bound`` is
recorded again, at most ``retries`` times; its rows say ``noisy: true`` if it still was. Then each
condition whose own clean groups still differ by more than ``bound`` is recorded again alone (a
launch of that one condition, same settings: ``alone``), at most ``retries`` times, and that
recording's row takes its place in ``paired.jsonl`` (with ``replaces``: the launch, index,
clean-vs-clean and saving of the row it replaced; the launch's own ``conditions.jsonl`` keeps the
first; ``tried_clean_vs_clean``: every recording's figure, the kept one last, so that what the
bound selected from stays on record). The drift of a 2-core machine comes and goes over minutes: within one 8-condition
launch, one condition's clean groups can differ by 10% while the next's differ by 1%.

Knob changes (``KnobChange``: the batch size, DDP's gradient bucket size, the number of
micro-batches of a pipeline step at the same global batch) cannot be switched within a launch:
they are recorded as launches of their own, alternately with the base setting (base, changed,
base, changed, ...: ``pairs`` of each), pinned like the conditions, the warm-up step of every
launch dropped. The measured change is the median of the changed launches' steps minus the
median of the base launches' steps; the noise floor is the same two figures, the base launches
taken in two alternating groups (``knobs.jsonl``).
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol, TypeVar

from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.graph_pipeline.events import load_events
from bottleneck_oracle_lab.systems.ddp import DDPRun
from bottleneck_oracle_lab.systems.ddp import record as record_ddp
from bottleneck_oracle_lab.systems.generate import stage_layers, step_times, world_of
from bottleneck_oracle_lab.systems.inject import Injection
from bottleneck_oracle_lab.systems.model import SIZES
from bottleneck_oracle_lab.systems.pipeline import PipelineRun
from bottleneck_oracle_lab.systems.pipeline import record as record_pipeline


class _Launched(Protocol):
    @property
    def launch_id(self) -> str: ...


T = TypeVar("T")
Item = TypeVar("Item", bound=_Launched)

KINDS = ("stall", "compute", "collective", "rank")
KNOBS = ("batch", "bucket_mb", "microbatches", "seq", "accum", "checkpoint")
CONDITIONS = "conditions.jsonl"
PAIRED = "paired.jsonl"
KNOB_ROWS = "knob.json"
KNOB_CHANGES = "knobs.jsonl"


@dataclass(frozen=True, kw_only=True, slots=True)
class Condition:
    kind: str
    """stall | compute | collective | rank"""
    rank: int
    delay_ms: float
    """Added time per step, ms."""
    target: str = ""
    """The module of a stall or compute condition (e.g. ``layers.0.mlp``)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} (found {self.kind!r})")
        if self.kind in ("stall", "compute") and not self.target:
            raise ValueError(f"a {self.kind} condition needs a target module")
        if not self.delay_ms > 0:
            raise ValueError(f"delay_ms must be > 0 (found {self.delay_ms})")


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    """One launch of paired conditions."""

    launch_id: str
    layout: str
    """dp2 or pp2-1f1b / pp2-afab (world 2)."""
    size: str
    conditions: tuple[Condition, ...]
    block: int = 3
    """Profiled steps per block (the first of each is dropped)."""
    repeats: int = 6
    """Slowed blocks per condition, each followed by a clean block (the clean blocks between them
    are shared: clean, slowed, clean, slowed, ..., clean)."""
    batch: int = 4
    microbatches: int = 4
    seed: int = 0
    device: str = "cpu"
    """cpu, or cuda (DP layouts: ``DDPRun.device``)."""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda (found {self.device!r})")
        if self.device == "cuda" and not self.layout.startswith("dp"):
            raise ValueError(f"{self.launch_id}: the pipeline runs on CPU only; device cuda needs a DP layout")

    @property
    def world(self) -> int:
        return world_of(self.layout)

    @property
    def steps(self) -> int:
        return self.block * (2 * len(self.conditions) * self.repeats + 1)

    @property
    def window(self) -> int | None:
        """Profiled steps per trace window (whole blocks: a window's export falls on the first step
        of a block, which ``measure`` drops), or None where the launch is one window."""
        w = self.block * -(-WINDOW_STEPS // self.block)
        return w if self.steps > w else None

    def block_steps(self, b: int) -> list[int]:
        """Profiled steps of block ``b`` (even: clean; odd: slowed, see ``slowed_blocks``)."""
        return list(range(1 + b * self.block, 1 + (b + 1) * self.block))

    def slowed_blocks(self, k: int) -> list[int]:
        """The blocks of condition ``k``: 2 (k R + j) + 1 for j < R (R = repeats)."""
        return [2 * (k * self.repeats + j) + 1 for j in range(self.repeats)]

    def clean_blocks(self, k: int) -> tuple[list[int], list[int]]:
        """The clean blocks around condition ``k``'s, in two alternating groups (before each of
        its slowed blocks, and the one after the last, taken in turn): the clean-vs-clean
        comparison is between the groups, interleaved like the slowed blocks."""
        blocks = [b - 1 for b in self.slowed_blocks(k)] + [self.slowed_blocks(k)[-1] + 1]
        return blocks[0::2], blocks[1::2]

    def injections(self) -> tuple[Injection, ...]:
        per_call = self.microbatches if self.layout.startswith("pp") else 1
        kind = {"stall": "module", "compute": "compute", "collective": "collective", "rank": "rank"}
        out = []
        for k, c in enumerate(self.conditions):
            delay = c.delay_ms / per_call if c.kind in ("stall", "compute") else c.delay_ms
            for step in (s for b in self.slowed_blocks(k) for s in self.block_steps(b)):
                out.append(Injection(kind=kind[c.kind], target=c.target, rank=c.rank, step=step, delay_ms=delay))
        return tuple(out)


WINDOW_STEPS = 300
"""Steps per profiling window of a launch (rounded up to whole blocks). The profiler keeps every
event of a window until it ends: in one window, 1,587 steps of the small model took 12 GB per
rank and filled the 24 GB recording machine."""


def default_launches(
    sizes: Sequence[str],
    layouts: Sequence[str],
    delays_ms: list[float],
    per_launch: int = 8,
    block: int = 3,
    repeats: int = 6,
    batch: int = 4,
    seed: int = 0,
    device: str = "cpu",
) -> list[Launch]:
    """Every kind x rank x delay on every size x layout, ``per_launch`` conditions to a launch (in
    an order that mixes kinds within a launch)."""
    out: list[Launch] = []
    for size in sizes:
        for layout in layouts:
            world = world_of(layout)
            conds: list[Condition] = []
            for delay in delays_ms:
                for rank in range(world):
                    layers = stage_layers(layout, size, rank)
                    for kind in KINDS:
                        if kind == "collective" and not layout.startswith("dp"):
                            continue
                        target = f"layers.{layers[0]}.mlp" if kind in ("stall", "compute") else ""
                        conds.append(Condition(kind=kind, rank=rank, delay_ms=float(delay), target=target))
            for i in range(0, len(conds), per_launch):
                out.append(
                    Launch(
                        launch_id=f"{size}-{layout}-{i // per_launch}",
                        layout=layout,
                        size=size,
                        conditions=tuple(conds[i : i + per_launch]),
                        block=block,
                        repeats=repeats,
                        batch=batch,
                        seed=seed + len(out),
                        device=device,
                    )
                )
    return out


def _record_job(
    folder: Path,
    layout: str,
    size: str,
    steps: int,
    seed: int,
    batch: int,
    microbatches: int,
    bucket_mb: float = 25.0,
    injections: tuple[Injection, ...] = (),
    window: int | None = None,
    device: str = "cpu",
    seq: int | None = None,
    accum: int = 1,
    checkpoint: bool = False,
) -> None:
    """One pinned launch of the DDP job or the pipeline (``batch``: per rank, or per micro-batch)."""
    if layout.startswith("dp"):
        record_ddp(
            DDPRun(
                out=str(folder),
                world=world_of(layout),
                steps=steps,
                size=size,
                batch=batch,
                bucket_mb=bucket_mb,
                seed=seed,
                injections=injections,
                pin=True,
                window=window,
                device=device,
                seq=seq,
                accum=accum,
                checkpoint=checkpoint,
            )
        )
    else:
        if accum != 1:
            raise ValueError("accum is a DP setting (a pipeline accumulates over its micro-batches)")
        record_pipeline(
            PipelineRun(
                out=str(folder),
                world=world_of(layout),
                size=size,
                schedule=layout.split("-", 1)[1],
                microbatches=microbatches,
                batch=batch,
                steps=steps,
                seed=seed,
                injections=injections,
                pin=True,
                window=window,
                seq=seq,
                checkpoint=checkpoint,
            )
        )


def _record(launch: Launch, folder: Path) -> None:
    batch = launch.batch if launch.layout.startswith("dp") else max(1, launch.batch // 2)
    _record_job(
        folder,
        launch.layout,
        launch.size,
        launch.steps,
        launch.seed,
        batch,
        launch.microbatches,
        injections=launch.injections(),
        window=launch.window,
        device=launch.device,
    )


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def spread(xs: list[float]) -> float:
    """Robust relative spread: 1.4826 x MAD / median."""
    m = _median(xs)
    return 1.4826 * _median([abs(x - m) for x in xs]) / m if m > 0 else 0.0


def local_saving(blocks: list[list[list[float]]]) -> float | None:
    """The local estimate of a saving from (clean before, slowed, clean after) step times per slowed
    block: the median over blocks of the slowed block's median minus the mean of its neighbours'
    (blocks with an empty side are left out; None if none is left)."""
    diffs = [_median(sl) - (_median(cb) + _median(ca)) / 2 for cb, sl, ca in blocks if cb and sl and ca]
    return _median(diffs) if diffs else None


def measure(launch: Launch, times: dict[int, float]) -> list[dict]:
    """One row per condition: block medians, measured saving, the noise floor around it."""

    def steps(blocks: list[int]) -> list[int]:
        return [s for b in blocks for s in launch.block_steps(b)[1:] if s in times]  # a block's first step is a transition

    rows = []
    for k, c in enumerate(launch.conditions):
        first, second = launch.clean_blocks(k)
        slowed, before, after = steps(launch.slowed_blocks(k)), steps(first), steps(second)
        cb, cp, ca = (_median([times[s] for s in x]) for x in (before, slowed, after))
        around = [[[times[s] for s in steps([b + d])] for d in (-1, 0, 1)] for b in launch.slowed_blocks(k)]
        rows.append(
            {
                "launch_id": launch.launch_id,
                "layout": launch.layout,
                "size": launch.size,
                "device": launch.device,
                "index": k,
                "condition": asdict(c),
                "steps": slowed,
                "clean_steps": before + after,
                "clean_groups": [before, after],
                "perturbed_us": cp,
                "clean_before_us": cb,
                "clean_after_us": ca,
                "measured_saving_us": cp - (cb + ca) / 2,
                "clean_vs_clean": abs(ca - cb) / cb,
                "clean_spread": max(spread([times[s] for s in x]) for x in (before, after)),
                "perturbed_spread": spread([times[s] for s in slowed]),
                "local_saving_us": local_saving(around),
            }
        )
    return rows


def _until_quiet(folder: Path, record: Callable[[], T], noise: Callable[[T], float], bound: float, retries: int) -> tuple[T, int, float]:
    """Record into ``folder`` (emptied first) until ``noise`` of the result is at most ``bound``,
    at most ``retries`` more times: (the last result, attempts, its noise)."""
    attempts = 0
    while True:
        if folder.exists():
            shutil.rmtree(folder)
        result = record()
        attempts += 1
        level = noise(result)
        if level <= bound or attempts > retries:
            return result, attempts, level


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))


def record_launch(launch: Launch, out: Path, bound: float = 0.05, retries: int = 1, extra: dict | None = None) -> list[dict]:
    """Record a launch into ``out / launch_id`` (again while its clean-vs-clean difference is above
    ``bound``, at most ``retries`` more times); writes and returns its condition rows (with the
    keys of ``extra`` added)."""
    folder = out / launch.launch_id
    tried: list[list[float]] = []  # each recording's clean-vs-clean, by condition: what the bound selected from

    def record() -> list[dict]:
        _record(launch, folder)
        rows = measure(launch, step_times(load_events(folder)))
        tried.append([r["clean_vs_clean"] for r in rows])
        return rows

    rows, attempts, noise = _until_quiet(folder, record, lambda rs: _median([r["clean_vs_clean"] for r in rs]), bound, retries)
    for k, r in enumerate(rows):
        r.update(
            path=str(folder),
            attempts=attempts,
            launch_clean_vs_clean=noise,
            noisy=noise > bound,
            bound=bound,
            tried_clean_vs_clean=[t[k] for t in tried],
            **(extra or {}),
        )
    _write_jsonl(folder / CONDITIONS, rows)
    return rows


def alone(launch: Launch, k: int) -> Launch:
    """Condition ``k`` of ``launch`` in a launch of its own (``<launch_id>.c<k>``), every other setting the same."""
    return replace(launch, launch_id=f"{launch.launch_id}.c{k}", conditions=(launch.conditions[k],))


def requiet(
    launch: Launch,
    rows: list[dict],
    out: Path,
    bound: float,
    retries: int,
    record: Callable[..., list[dict]] = record_launch,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """The rows of ``launch`` with each condition whose clean groups differ by more than ``bound``
    replaced by the row of that condition recorded alone, at most ``retries`` recordings of it in
    all: a lone recording already in ``out`` is kept where it is within ``bound`` or has had its
    recordings (a resumed run, or one with the same bound, records nothing), and recorded again
    where a tighter bound or more retries leave it some (``attempts`` counts them all)."""
    kept = []
    for r in rows:
        if r["clean_vs_clean"] <= bound or retries < 1:
            kept.append(r)
            continue
        solo = alone(launch, r["index"])
        have = read_rows(out / solo.launch_id) if (out / solo.launch_id / CONDITIONS).exists() else []
        before = have[0]["attempts"] if have else 0
        if have and (have[0]["clean_vs_clean"] <= bound or before >= retries):
            kept.extend(have)
            continue
        if progress:
            progress(f"{solo.launch_id} (clean blocks {100 * (have or [r])[0]['clean_vs_clean']:.1f}% apart)")
        replaces = {k: r[k] for k in ("launch_id", "index", "clean_vs_clean", "measured_saving_us")}
        new = record(solo, out, bound, retries - before - 1, extra={"replaces": replaces, "earlier_attempts": before})
        for x in new:
            x["attempts"] += before
            x["tried_clean_vs_clean"] = (
                have[0].get("tried_clean_vs_clean", [have[0]["clean_vs_clean"]]) + x["tried_clean_vs_clean"]
                if have
                else x["tried_clean_vs_clean"]
            )
        if before:  # the folder's own record says the same
            _write_jsonl(out / solo.launch_id / CONDITIONS, new)
        kept.extend(new)
    return kept


@dataclass(frozen=True, kw_only=True, slots=True)
class KnobChange:
    """A knob of the job changed from ``base`` to ``changed``, recorded as alternating launches."""

    launch_id: str
    layout: str
    """dp2 or pp2-1f1b / pp2-afab."""
    size: str
    knob: str
    """batch (sequences per rank, or per micro-batch in a pipeline) | bucket_mb (DDP's gradient
    bucket, MB; DP layouts) | microbatches (pipeline layouts, same global batch) | seq (sequence
    length) | accum (gradient accumulation: passes per optimizer step; DP layouts) | checkpoint
    (activation checkpointing, 0 off / 1 on)."""
    base: float
    changed: float
    pairs: int = 3
    """Launches of each setting."""
    steps: int = 7
    """Profiled steps per launch (the first is dropped)."""
    batch: int = 4
    microbatches: int = 4
    bucket_mb: float = 25.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.knob not in KNOBS:
            raise ValueError(f"knob must be one of {KNOBS} (found {self.knob!r})")
        if self.knob == "bucket_mb" and not self.layout.startswith("dp"):
            raise ValueError("bucket_mb is a DP knob")
        if self.knob == "microbatches" and not self.layout.startswith("pp"):
            raise ValueError("microbatches is a pipeline knob")
        if self.knob == "accum" and not self.layout.startswith("dp"):
            raise ValueError("accum is a DP knob")
        if self.knob == "checkpoint":
            if {self.base, self.changed} != {0, 1}:
                raise ValueError(f"checkpoint goes from 0 (off) to 1 (on) or back (found {self.base}, {self.changed})")
        elif not (self.base > 0 and self.changed > 0 and self.base != self.changed):
            raise ValueError(f"base and changed must be different values > 0 (found {self.base}, {self.changed})")

    @property
    def world(self) -> int:
        return world_of(self.layout)

    def settings(self, value: float) -> dict:
        """batch, microbatches and bucket_mb of a launch with the knob at ``value`` (a pipeline's
        micro-batch count changes at the same global batch: sequences per micro-batch follow)."""
        pp = self.layout.startswith("pp")
        out: dict = {
            "batch": max(1, self.batch // 2) if pp else self.batch,
            "microbatches": self.microbatches,
            "bucket_mb": self.bucket_mb,
            "seq": None,
            "accum": 1,
            "checkpoint": False,
        }
        if self.knob == "microbatches":
            total = out["batch"] * self.microbatches
            out.update(microbatches=int(value), batch=max(1, total // int(value)))
        elif self.knob == "bucket_mb":
            out["bucket_mb"] = float(value)
        elif self.knob == "checkpoint":
            out["checkpoint"] = bool(value)
        else:  # batch, seq, accum
            out[self.knob] = int(value)
        return out

    def order(self) -> list[tuple[str, float]]:
        """(folder name, value) of the launches in recording order: base-0, changed-0, base-1, ..."""
        return [(f"{w}-{i}", v) for i in range(self.pairs) for w, v in (("base", self.base), ("changed", self.changed))]


def default_knobs(
    sizes: Sequence[str],
    layouts: Sequence[str],
    batch: int = 4,
    seed: int = 0,
    only: Sequence[tuple[str, float, float]] | None = None,
) -> list[KnobChange]:
    """Ten changes per size and layout. DP: batch doubled, halved and x1.5; sequence length
    doubled and halved; buckets from one (25 MB) to many (0.05 MB) and to 1 MB; gradient
    accumulation 1 -> 2 and 1 -> 4; activation checkpointing on. Pipeline: micro-batches 4 -> 2,
    8 and 1 at the same global batch; sequences per micro-batch doubled and x1.5, halved;
    sequence length doubled, halved and x1.5; activation checkpointing on. ``only``: these
    (knob, base, changed) instead, for every size and layout."""
    out: list[KnobChange] = []
    for size in sizes:
        seq = SIZES[size].seq
        for layout in layouts:
            if only is not None:
                changes = list(only)
            elif layout.startswith("dp"):
                changes = [
                    ("batch", batch, 2 * batch),
                    ("batch", batch, max(1, batch // 2)),
                    ("batch", batch, batch + max(1, batch // 2)),
                    ("seq", seq, 2 * seq),
                    ("seq", seq, seq // 2),
                    ("bucket_mb", 25.0, 0.05),
                    ("bucket_mb", 25.0, 1.0),
                    ("accum", 1, 2),
                    ("accum", 1, 4),
                    ("checkpoint", 0, 1),
                ]
            else:
                half = max(1, batch // 2)
                changes = [
                    ("microbatches", 4, 2),
                    ("microbatches", 4, 8),
                    ("microbatches", 4, 1),
                    ("batch", half, 2 * half),
                    ("batch", half, half + max(1, half // 2)),
                    ("batch", half, max(1, half // 2)),
                    ("seq", seq, 2 * seq),
                    ("seq", seq, seq // 2),
                    ("seq", seq, seq + seq // 2),
                    ("checkpoint", 0, 1),
                ]
            for knob, a, b in changes:
                out.append(
                    KnobChange(
                        launch_id=f"knob-{size}-{layout}-{knob}-{a:g}-{b:g}",
                        layout=layout,
                        size=size,
                        knob=knob,
                        base=a,
                        changed=b,
                        batch=batch,
                        seed=seed + len(out),
                    )
                )
    return out


def _record_knob(change: KnobChange, value: float, folder: Path) -> None:
    st = change.settings(value)
    _record_job(
        folder,
        change.layout,
        change.size,
        change.steps,
        change.seed,
        st["batch"],
        st["microbatches"],
        st["bucket_mb"],
        seq=st["seq"],
        accum=st["accum"],
        checkpoint=st["checkpoint"],
    )


def measure_knob(change: KnobChange, times: dict[str, dict[int, float]]) -> dict:
    """The knob's measured change from the step times of its launches (folder name -> step -> µs;
    each launch's first profiled step dropped)."""

    def kept(names: list[str]) -> list[float]:
        return [t for n in names for s, t in sorted(times[n].items())[1:]]

    base = [n for n, _ in change.order() if n.startswith("base")]
    changed = [n for n, _ in change.order() if n.startswith("changed")]
    first, second = base[0::2], base[1::2]
    mb, mc = _median(kept(base)), _median(kept(changed))
    ca, cb = _median(kept(first)), _median(kept(second)) if second else _median(kept(first))
    return {
        "launch_id": change.launch_id,
        "layout": change.layout,
        "size": change.size,
        "knob": change.knob,
        "base": change.base,
        "changed": change.changed,
        "settings": {"base": change.settings(change.base), "changed": change.settings(change.changed)},
        "base_paths": base,
        "changed_paths": changed,
        "base_us": mb,
        "changed_us": mc,
        "measured_change_us": mc - mb,
        "clean_vs_clean": abs(cb - ca) / ca,
        "clean_spread": max(spread(kept([n])) for n in base),
        "changed_spread": spread(kept(changed)),
    }


def record_knob(change: KnobChange, out: Path, bound: float = 0.05, retries: int = 1) -> dict:
    """Record a knob change's launches into ``out / launch_id`` (again while its base launches
    differ by more than ``bound``, at most ``retries`` more times); writes and returns its row."""
    folder = out / change.launch_id

    def record() -> dict:
        times = {}
        for name, value in change.order():
            _record_knob(change, value, folder / name)
            times[name] = step_times(load_events(folder / name))
        return measure_knob(change, times)

    row, attempts, noise = _until_quiet(folder, record, lambda r: r["clean_vs_clean"], bound, retries)
    row.update(path=str(folder), attempts=attempts, noisy=noise > bound, bound=bound)
    with atomic_path(folder / KNOB_ROWS) as tmp:
        tmp.write_text(json.dumps(row))
    return row


def _record_all(
    items: list[Item],
    out: Path,
    manifest: Path,
    done: Callable[[Item], list[dict] | None],
    record: Callable[[Item], list[dict]],
    progress: Callable[[str, int, int], None] | None,
) -> tuple[list[dict], int, int]:
    """Record every item ``done`` has no rows for (an interrupted run resumes), rewriting
    ``manifest`` with all rows after each: (rows, recorded, skipped)."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    recorded = skipped = 0
    for i, item in enumerate(items):
        kept = done(item)
        if kept is not None:
            rows.extend(kept)
            skipped += 1
            continue
        if progress:
            progress(item.launch_id, i, len(items))
        rows.extend(record(item))
        recorded += 1
        _write_jsonl(manifest, rows)
    _write_jsonl(manifest, rows)
    if progress:
        progress("", len(items), len(items))
    return rows, recorded, skipped


def generate_knobs(
    changes: list[KnobChange],
    out: str | Path,
    bound: float = 0.05,
    retries: int = 1,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Record every knob change not yet done (those with a knob.json are kept), then write
    ``knobs.jsonl`` and return a summary with the noise floor."""
    out = Path(out)

    def done(change: KnobChange) -> list[dict] | None:
        row = out / change.launch_id / KNOB_ROWS
        return [json.loads(row.read_text())] if row.exists() else None

    rows, recorded, skipped = _record_all(changes, out, out / KNOB_CHANGES, done, lambda c: [record_knob(c, out, bound, retries)], progress)
    return {
        "knob_changes": len(rows),
        "recorded": recorded,
        "skipped": skipped,
        "manifest": str(out / KNOB_CHANGES),
        "median_clean_vs_clean": _median([r["clean_vs_clean"] for r in rows]) if rows else None,
        "noisy": sum(r["noisy"] for r in rows),
    }


def read_rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / CONDITIONS).read_text().splitlines() if line.strip()]


def generate_paired(
    launches: list[Launch], out: str | Path, bound: float = 0.05, retries: int = 1, progress: Callable[[str, int, int], None] | None = None
) -> dict:
    """Record every launch not yet done (those with a conditions.jsonl are kept), then write
    ``paired.jsonl`` (all conditions) and return a summary with the noise floor."""
    out = Path(out)

    def again(launch: Launch) -> Callable[[str], None] | None:
        return (lambda now: progress(now, launches.index(launch), len(launches))) if progress else None

    def done(launch: Launch) -> list[dict] | None:
        if not (out / launch.launch_id / CONDITIONS).exists():
            return None
        return requiet(launch, read_rows(out / launch.launch_id), out, bound, retries, progress=again(launch))

    def record(launch: Launch) -> list[dict]:
        return requiet(launch, record_launch(launch, out, bound, retries), out, bound, retries, progress=again(launch))

    rows, recorded, skipped = _record_all(launches, out, out / PAIRED, done, record, progress)
    return {
        "launches": len(launches),
        "recorded": recorded,
        "skipped": skipped,
        "conditions": len(rows),
        "manifest": str(out / PAIRED),
        "median_clean_spread": _median([r["clean_spread"] for r in rows]) if rows else None,
        "median_clean_vs_clean": _median([r["clean_vs_clean"] for r in rows]) if rows else None,
        "noisy_launches": len({r["launch_id"] for r in rows if r["noisy"] and "replaces" not in r}),
        "rerecorded_conditions": sum("replaces" in r for r in rows),
        "noisy_conditions": sum(r["clean_vs_clean"] > bound for r in rows),
    }

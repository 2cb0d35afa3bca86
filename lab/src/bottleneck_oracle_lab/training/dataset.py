"""build-dataset: generated runs -> one labelled PyG graph per profiled step, with splits.

Each sample is a HeteroData (models.hetero) saved as plain tensors (loadable with
torch.load(weights_only=True)), labelled with the measured step time, per-node slack, EST and
criticality from the CPM, the injected culprit nodes (the ``oracle_inject:*`` ranges on the
injected rank) and the paired baseline sample (the unperturbed step before). ``dataset.jsonl``
lists every sample with its splits: random 70/15/15 (seeded) and out-of-distribution ones that
hold out one model size, one layout and one injection kind for testing.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bottleneck_oracle.analysis.cpm import run_cpm
from bottleneck_oracle.analysis.phases import formula_step, is_pipeline, node_phases
from bottleneck_oracle.analysis.whatif import main_thread, thread_chain, with_durations
from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.errors import OracleError, first_line
from bottleneck_oracle.files import read_jsonl
from bottleneck_oracle.graph_pipeline.builder import build_graphs
from bottleneck_oracle.graph_pipeline.events import load_events
from bottleneck_oracle.graph_pipeline.graph import ExecutionGraph
from bottleneck_oracle_lab.models.checkpoint import safe_load
from bottleneck_oracle_lab.models.pyg import from_tensors, to_heterodata, to_tensors

DATASET = "dataset.jsonl"


def _random_split(sample_id: str, seed: int) -> str:
    u = int(hashlib.sha256(f"{seed}:{sample_id}".encode()).hexdigest()[:8], 16) / 16**8
    return "train" if u < 0.70 else "val" if u < 0.85 else "test"


def held_out(values: list[str], preferred: str) -> str:
    """The value an OOD split tests on: ``preferred`` if present, else the last one."""
    present = sorted(set(values))
    return preferred if preferred in present else present[-1]


def culprits(g, injection: dict | None) -> list[int]:
    """Node ids of the injected delay: its ``oracle_inject:<kind>:`` ranges on the injected rank."""
    if not injection:
        return []
    prefix = f"oracle_inject:{injection['kind']}:"
    ids = [i for i in range(g.n_nodes) if g.nodes["rank"][i] == injection["rank"] and g.node_name(i).startswith(prefix)]
    return ids


def injection_sites(base: ExecutionGraph, perturbed: ExecutionGraph, culprit_ids: list[int]) -> list[int]:
    """The nodes of ``base`` (an unperturbed step of the same run) that precede, on their thread,
    each injected delay that ``perturbed`` carries: the op the delay follows, found by name and
    occurrence on the same rank's training-loop thread (a module called once per micro-batch is
    delayed once per call). Lengthening them by the delay is the what-if of the injection."""
    if not culprit_ids:
        raise OracleError(f"step {perturbed.step} carries no injected delay")
    p = perturbed.nodes
    sites = []
    for c in sorted(culprit_ids, key=lambda i: p["start"][i]):
        rank, tid = int(p["rank"][c]), int(p["tid"][c])
        chain = [i for i in thread_chain(perturbed, rank, tid) if not perturbed.node_name(i).startswith("oracle_inject:")]
        before = [i for i in chain if p["start"][i] < p["start"][c]]
        target = thread_chain(base, rank, main_thread(base, rank))
        if not before:
            sites.append(int(target[0]))
            continue
        name = perturbed.node_name(before[-1])
        occurrence = sum(perturbed.node_name(i) == name for i in before)
        same = [i for i in target if base.node_name(i) == name]
        if len(same) < occurrence:
            raise OracleError(f"step {base.step} has {len(same)} {name!r} on rank {rank}, step {perturbed.step} has {occurrence}")
        sites.append(int(same[occurrence - 1]))
    return sites


def build_dataset(raw: str | Path, out: str | Path, seed: int = 0, progress: Callable[[int, int], None] | None = None) -> dict:
    raw, out = Path(raw), Path(out)
    manifest = raw / "manifest.jsonl"
    if not manifest.is_file():
        raise OracleError(f"{raw}: no manifest.jsonl (run `bottleneck-oracle generate` first)")
    rows = read_jsonl(
        manifest,
        "run manifest",
        ("run_id", "size", "layout", "kind", "step", "step_time_us", "path", "injection", "baseline_step"),
        "the manifest is damaged: record the runs again with `generate`",
    )
    if not rows:
        raise OracleError(f"{manifest}: holds no steps")
    ood = {
        "size": held_out([r["size"] for r in rows], "medium"),
        "layout": held_out([r["layout"] for r in rows], "pp2-afab"),
        "kind": held_out([r["kind"] for r in rows], "rank"),
    }
    samples = []
    by_run: dict[str, list[dict]] = {}
    for r in rows:
        by_run.setdefault(r["run_id"], []).append(r)
    done = 0
    for run_id, run_rows in by_run.items():
        table = load_events(run_rows[0]["path"])
        graphs = build_graphs(table)
        by_step = {g.step: g for g in graphs}
        for r in run_rows:
            sid = f"{run_id}/step-{r['step']}"
            path = out / f"{sid}.pt"
            g = by_step[r["step"]]
            ids = culprits(g, r["injection"])
            measured = max(g.measured.values())
            # always rewritten: a sample left from an older graph builder or CPM would silently mix in
            _save(path, g, run_cpm(g), ids, ref=measured, replay=measured, formula=measured, edit_us=0.0, y=measured)
            whatif = None
            if ids and r["baseline_step"] is not None:
                whatif = _whatif_sample(out / f"{sid}.whatif.pt", table, by_step[r["baseline_step"]], g, ids, r, is_pipeline(g, table))
            samples.append(
                {
                    "id": sid,
                    "path": str(path),
                    "trace": r["path"],
                    "run_id": run_id,
                    "size": r["size"],
                    "layout": r["layout"],
                    "kind": r["kind"],
                    "step": r["step"],
                    "step_time_us": r["step_time_us"],
                    "injection": r["injection"],
                    "culprit_ids": ids,
                    "culprit_names": sorted({g.node_name(i) for i in ids}),
                    "baseline": None if r["baseline_step"] is None else f"{run_id}/step-{r['baseline_step']}",
                    "whatif": whatif,
                    "split_random": _random_split(sid, seed),
                    "split_ood_size": "test" if r["size"] == ood["size"] else "train",
                    "split_ood_layout": "test" if r["layout"] == ood["layout"] else "train",
                    "split_ood_injection": "test" if r["kind"] == ood["kind"] else "train",
                }
            )
            done += 1
            if progress:
                progress(done, len(rows))
    with atomic_path(out / DATASET) as tmp:
        tmp.write_text("".join(json.dumps(s) + "\n" for s in samples))
    splits = {
        k: dict(zip(*np.unique([s[k] for s in samples], return_counts=True)))
        for k in ("split_random", "split_ood_size", "split_ood_layout", "split_ood_injection")
    }
    return {
        "samples": len(samples),
        "perturbed": sum(bool(s["culprit_ids"]) for s in samples),
        "held_out": ood,
        "splits": {k: {str(a): int(b) for a, b in v.items()} for k, v in splits.items()},
        "dataset": str(out / DATASET),
    }


def _save(path: Path, g, cpm, culprit: list[int], *, ref: float, replay: float, formula: float, edit_us: float, y: float) -> None:
    tensors = to_tensors(to_heterodata(g, cpm))
    tensors["culprit"] = torch.tensor(culprit, dtype=torch.int64)
    for key, value in (("y_step", y), ("ref_step", ref), ("replay_step", replay), ("formula_step", formula), ("edit_us", edit_us)):
        tensors[key] = torch.tensor([value], dtype=torch.float32)
    with atomic_path(path) as tmp:
        torch.save(tensors, tmp)


def _whatif_sample(path: Path, table, base, perturbed, culprit: list[int], row: dict, pipeline: bool) -> dict:
    """The what-if of an injected step: its paired baseline step with the op the delay follows
    lengthened by the requested delay; labelled with the perturbed step's measured time and the
    replay's and the formula's predictions of it."""
    sites = injection_sites(base, perturbed, culprit)
    delta = float(row["injection"]["delay_ms"]) * 1000.0
    d0 = base.nodes["mdur"].astype(np.float64)
    d1 = d0.copy()
    np.add.at(d1, sites, delta)
    edited = with_durations(base, d1)
    cpm0 = run_cpm(base)
    t0 = time.perf_counter()
    cpm1 = run_cpm(edited)
    replay_ms = 1000 * (time.perf_counter() - t0)
    phase, mb = node_phases(table, base)
    ref = max(base.measured.values())
    replay_dt = cpm1.makespan - cpm0.makespan
    formula_dt = formula_step(base, d1, phase, mb, pipeline) - formula_step(base, d0, phase, mb, pipeline)
    measured = max(perturbed.measured.values())
    _save(path, edited, cpm1, sites, ref=ref, replay=ref + replay_dt, formula=ref + formula_dt, edit_us=delta * len(sites), y=measured)
    return {
        "path": str(path),
        "sites": sites,
        "site_names": [base.node_name(i) for i in sites],
        "delta_us": delta,
        "measured_dt_us": measured - ref,
        "replay_dt_us": replay_dt,
        "formula_dt_us": formula_dt,
        "replay_ms": replay_ms,
    }


def load_sample(path: str | Path):
    """A saved sample as HeteroData (no pickled code is run: weights_only)."""
    tensors = safe_load(Path(path), "dataset sample")
    if not isinstance(tensors, dict):
        raise OracleError(f"{path}: not a dataset sample (rebuild the dataset with `build-dataset`)")
    culprit = tensors.pop("culprit", torch.zeros(0, dtype=torch.int64))
    try:
        data = from_tensors(tensors)
    except Exception as exc:  # noqa: BLE001 - PyG's validation raises several types for a damaged sample
        raise OracleError(f"{path}: not a dataset sample ({first_line(exc)}; rebuild the dataset with `build-dataset`)") from None
    data.culprit = culprit
    return data

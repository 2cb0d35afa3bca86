"""How often ``compare`` calls a real slowdown slower, and clean against clean different (issue 28).

Real recordings of the bundled 2-rank gloo DDP job (the MLP of ``tests/data/gloo_ddp_8steps_*``)
on this machine, with other work running on it. A slowdown is a sleep of ``delay_ms`` at the start
of rank 1's backward pass (``systems.inject``, kind ``phase``: a slow backward hook of one rank).

- ``clean``, ``clean2``: no slowdown.
- ``inter_D``: every pair of consecutive steps has one step slowed by D ms, which one drawn at
  random (seeded): slowed and clean steps interleaved in one recording.
- ``persist_D``: every step slowed by D ms (a separate recording, as a user compares two runs).

Conditions are pairs of disjoint windows of steps cut from these recordings (steps 1-10 of each
recording left out as warm-up):

- **interleaved** (the primary design): n consecutive pairs of steps of ``inter_D`` give n clean
  against n slowed steps over the same stretch of time; clean against clean the same way from
  ``clean``, each pair's steps put on the two sides at random. Windows of one n are disjoint; the
  windows of different n reuse the same steps.
- **back to back**: n consecutive steps against the next n of ``clean`` (clean against clean), and
  window k of ``clean`` against window k of ``persist_D`` or of ``clean2`` (two recordings made a
  few minutes apart): whatever the machine did in between counts as a change.

For the conditions across two recordings, the script also counts how often ``compare`` would warn
that the ops themselves ran longer or shorter like the step (``change.alike``: a machine that
changed speed). Each condition is judged by the verdict ``compare`` gives (``analysis.change.verdict`` on the
windows' step times, the default minimum change of 1%). The true slowdown of ``inter_D`` is the
difference of the medians of all its slowed and all its clean steps; its standard error for a
condition of n against n steps is the spread (standard deviation) of the difference of medians of
n steps drawn with replacement from each of those two populations (numpy only: independent of the
code under test). Acceptance 2 counts the conditions whose true slowdown is at least 2 standard
errors and at least 1%.

    python benchmarks/compare_verdicts.py                 # record (about 10 min) and evaluate
    python benchmarks/compare_verdicts.py --traces DIR    # evaluate recordings made before
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "compare_verdicts_results.json"
TRACES = ROOT / "benchmarks" / "out" / "compare_verdicts"
STEPS = 400  # profiled steps per recording
WARMUP = 10  # first steps of each recording left out
DELAYS_MS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # interleaved slowdowns
PERSIST_MS = 8.0  # the separate, persistently slowed recording
WINDOWS = (5, 10, 20)  # steps a side per condition
RESAMPLES = 4000
SEED = 28


def _recordings() -> dict[str, dict]:
    out = {"clean": {"delay_ms": 0.0, "design": "clean"}, "clean2": {"delay_ms": 0.0, "design": "clean"}}
    out |= {f"inter_{d:g}": {"delay_ms": d, "design": "interleaved"} for d in DELAYS_MS}
    out[f"persist_{PERSIST_MS:g}"] = {"delay_ms": PERSIST_MS, "design": "persistent"}
    return out


def slowed_steps(name: str, spec: dict, steps: int) -> list[int]:
    """The ProfilerStep numbers a recording slows."""
    if spec["design"] == "persistent":
        return list(range(1, steps + 1))
    if spec["design"] != "interleaved":
        return []
    rng = np.random.default_rng([SEED, int(1000 * spec["delay_ms"])])
    return [2 * k + 1 + int(rng.integers(2)) for k in range(steps // 2)]


def record(folder: Path, steps: int) -> dict[str, dict]:
    """Every recording, in the order of ``_recordings`` (clean first, clean2 last but one)."""
    from bottleneck_oracle_lab.systems.ddp import DDPRun
    from bottleneck_oracle_lab.systems.ddp import record as record_run
    from bottleneck_oracle_lab.systems.inject import Injection

    done = {}
    order = list(_recordings().items())
    order.append(order.pop(1))  # clean2 after the others: minutes after clean
    for name, spec in order:
        inj = tuple(
            Injection(kind="phase", rank=1, step=s, target="backward", delay_ms=spec["delay_ms"]) for s in slowed_steps(name, spec, steps)
        )
        load0, t0 = os.getloadavg()[0], time.time()
        record_run(DDPRun(out=str(folder / name), world=2, steps=steps, injections=inj, window=100))
        done[name] = {**spec, "seconds": round(time.time() - t0, 1), "load_before": load0, "load_after": os.getloadavg()[0]}
        print(f"recorded {name} in {done[name]['seconds']:.0f} s (load {load0:.1f} -> {done[name]['load_after']:.1f})", flush=True)
    (folder / "recordings.json").write_text(json.dumps(done, indent=1))
    return done


def analyses_of(folder: Path) -> dict:
    """ProfilerStep number -> its StepAnalysis, past the warm-up steps."""
    from bottleneck_oracle import api

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, analyses = api.analyze(folder)
    return {a.graph.step: a for a in analyses if a.graph.step is not None and a.graph.step > WARMUP}


def step_times(analyses: dict) -> dict[int, float]:
    """ProfilerStep number -> step time (µs) as ``compare`` reads it (``change.step_time``: the period)."""
    from bottleneck_oracle.analysis.change import step_time

    return {s: step_time(a) for s, a in analyses.items()}


def machine_said(analyses: dict, a: list[int], b: list[int]) -> bool:
    """Does ``compare`` warn that the ops themselves changed like the step (``change.alike``)?"""
    from bottleneck_oracle.analysis.change import alike, op_speed, step_time

    sa, sb = [analyses[0][s] for s in a], [analyses[1][s] for s in b]
    ma, mb = np.median([step_time(x) for x in sa]), np.median([step_time(x) for x in sb])
    return alike(op_speed(sa, sb), float(mb / ma - 1)) is not None


def _call(tb: np.ndarray, tc: np.ndarray) -> str:
    from bottleneck_oracle.analysis.change import verdict

    return verdict(tb, tc)[0]


def se_of_median_difference(a: np.ndarray, b: np.ndarray, n: int, rng: np.random.Generator) -> float:
    """Standard deviation of median(n draws of b) - median(n draws of a), draws with replacement."""
    ma = np.median(rng.choice(a, (RESAMPLES, n)), axis=1)
    mb = np.median(rng.choice(b, (RESAMPLES, n)), axis=1)
    return float(np.std(mb - ma))


def interleaved(
    times: dict[int, float], slowed: set[int], n: int, rng: np.random.Generator | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Disjoint windows of n consecutive step pairs: (the pairs' clean steps, their slowed steps).
    Without ``slowed`` steps (a clean recording), each pair's steps go to the two sides at random."""
    pairs = [(s, s + 1) for s in range(WARMUP + 1 if WARMUP % 2 == 0 else WARMUP + 2, max(times) + 1, 2) if s in times and s + 1 in times]
    out = []
    for w in range(len(pairs) // n):
        a, b = [], []
        for s, t in pairs[w * n : (w + 1) * n]:
            first = (t in slowed) if slowed else bool(rng.integers(2))
            a.append(times[s] if first else times[t])
            b.append(times[t] if first else times[s])
        out.append((np.array(a), np.array(b)))
    return out


def contiguous(times: dict[int, float], n: int) -> list[list[int]]:
    """Disjoint windows of n consecutive steps (their ProfilerStep numbers)."""
    steps = sorted(times)
    return [steps[w * n : (w + 1) * n] for w in range(len(steps) // n)]


def _times(times: dict[int, float], steps: list[int]) -> np.ndarray:
    return np.array([times[s] for s in steps])


def _share(calls: list[str], what: tuple[str, ...]) -> dict:
    k = sum(c in what for c in calls)
    return {"conditions": len(calls), "called": k, "fraction": k / len(calls) if calls else None}


def evaluate(folder: Path, recordings: dict[str, dict], steps: int) -> dict:
    rng = np.random.default_rng(SEED)
    kept = {"clean", "clean2", f"persist_{PERSIST_MS:g}"}
    times, analyses = {}, {}
    for name in recordings:
        a = analyses_of(folder / name)
        times[name] = step_times(a)
        if name in kept:  # for the warning that the ops themselves changed (the rest: step times only)
            analyses[name] = a
    rows, clean_rows = [], []
    for name, spec in recordings.items():
        if spec["design"] != "interleaved":
            continue
        slowed = set(slowed_steps(name, spec, steps))
        t = times[name]
        slow_pop = np.array([v for s, v in t.items() if s in slowed])
        clean_pop = np.array([v for s, v in t.items() if s not in slowed])
        true = float(np.median(slow_pop) - np.median(clean_pop))
        for n in WINDOWS:
            se = se_of_median_difference(clean_pop, slow_pop, n, rng)
            conds = interleaved(t, slowed, n)
            calls = [_call(a, b) for a, b in conds]
            diffs = [float(np.median(b) - np.median(a)) for a, b in conds]
            rows.append(
                {
                    "recording": name,
                    "delay_ms": spec["delay_ms"],
                    "n": n,
                    "true_delta_us": true,
                    "true_share": true / float(np.median(clean_pop)),
                    "se_us": se,
                    "true_in_se": true / se,
                    "empirical_sd_us": float(np.std(diffs, ddof=1)) if len(diffs) > 1 else None,
                    "conditions": len(calls),
                    "slower": calls.count("slower"),
                    "faster": calls.count("faster"),
                    "within_noise": calls.count("within noise"),
                    "too_few": calls.count("too few steps"),
                }
            )
    for n in WINDOWS:
        conds = interleaved(times["clean"], set(), n, rng)
        calls = [_call(a, b) for a, b in conds]
        clean_rows.append({"design": "interleaved", "recording": "clean", "n": n, **_share(calls, ("slower", "faster"))})
        wins = contiguous(times["clean"], n)
        calls = [_call(_times(times["clean"], wins[i]), _times(times["clean"], wins[i + 1])) for i in range(0, len(wins) - 1, 2)]
        clean_rows.append({"design": "back to back, one recording", "recording": "clean", "n": n, **_share(calls, ("slower", "faster"))})
        other = contiguous(times["clean2"], n)
        pairs = list(zip(wins, other))
        calls = [_call(_times(times["clean"], a), _times(times["clean2"], b)) for a, b in pairs]
        said = [machine_said((analyses["clean"], analyses["clean2"]), a, b) for a, b in pairs]
        clean_rows.append(
            {
                "design": "two recordings",
                "recording": "clean vs clean2",
                "n": n,
                **_share(calls, ("slower", "faster")),
                "called_and_ops_said_alike": sum(c != "within noise" and c != "too few steps" and w for c, w in zip(calls, said)),
            }
        )
    persist = f"persist_{PERSIST_MS:g}"
    separate = []
    for n in WINDOWS:
        pairs = list(zip(contiguous(times["clean"], n), contiguous(times[persist], n)))
        calls = [_call(_times(times["clean"], a), _times(times[persist], b)) for a, b in pairs]
        said = [machine_said((analyses["clean"], analyses[persist]), a, b) for a, b in pairs]
        separate.append(
            {
                "recording": f"clean vs {persist}",
                "n": n,
                **_share(calls, ("slower",)),
                "called_and_ops_said_alike": sum(c == "slower" and w for c, w in zip(calls, said)),
            }
        )
    eligible = [r for r in rows if r["true_in_se"] >= 2 and r["true_share"] >= 0.01]
    called = sum(r["slower"] for r in eligible)
    total = sum(r["conditions"] for r in eligible)
    bins = []
    for lo, hi in ((2, 3), (3, 4), (4, 6), (6, None)):
        sel = [r for r in eligible if r["true_in_se"] >= lo and (hi is None or r["true_in_se"] < hi)]
        k, m = sum(r["slower"] for r in sel), sum(r["conditions"] for r in sel)
        bins.append({"true_in_se": [lo, hi], "conditions": m, "called_slower": k, "fraction": k / m if m else None})
    inter_clean = [r for r in clean_rows if r["design"] == "interleaved"]
    ck, cm = sum(r["called"] for r in inter_clean), sum(r["conditions"] for r in inter_clean)
    medians = {name: float(np.median(list(t.values()))) for name, t in times.items()}
    return {
        "command": "python benchmarks/compare_verdicts.py",
        "job": "2-rank gloo DDP MLP (hidden 512, batch 64, bucket 0.5 MB) on this machine's 2 shared cores; "
        "slowdown: a sleep at the start of rank 1's backward pass",
        "method": "verdict of analysis.change.verdict (Mann-Whitney interval of the shift excludes 0 and |difference of medians| >= 1%) "
        "on each condition's step times (periods); true slowdown and its standard error from the whole interleaved recording",
        "steps_per_recording": steps,
        "warmup_steps_left_out": WARMUP,
        "recordings": {name: {**spec, "median_step_us": medians[name], "steps": len(times[name])} for name, spec in recordings.items()},
        "slowed": rows,
        "clean": clean_rows,
        "separate_recordings_slowed": separate,
        "acceptance": {
            "slower_when_at_least_2se_and_1pct": {
                "conditions": total,
                "called_slower": called,
                "fraction": called / total if total else None,
            },
            "slower_by_size_in_se": bins,
            "clean_called_different_interleaved": {"conditions": cm, "called": ck, "fraction": ck / cm if cm else None},
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", type=Path, default=None, help="evaluate the recordings in this folder (made before) instead of recording")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()
    if a.traces is None:
        folder = TRACES
        folder.mkdir(parents=True, exist_ok=True)
        recordings = record(folder, a.steps)
    else:
        folder = a.traces
        recordings = json.loads((folder / "recordings.json").read_text())
    doc = evaluate(folder, recordings, a.steps)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    acc = doc["acceptance"]
    print(json.dumps(acc, indent=1))


if __name__ == "__main__":
    main()

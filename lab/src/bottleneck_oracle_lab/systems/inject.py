"""Delay injection into a real training loop, recorded in a manifest beside the trace.

An ``Injection`` slows one thing on one rank at one step: a module (by name pattern, e.g.
``layers.1.mlp``: after its forward), a phase (``forward`` / ``backward`` / ``optimizer``: at its
start), a collective (DDP's gradient all-reduce: before it is issued), or the whole rank (at the
start of the step); ``compute`` adds real work instead of a sleep after a module's forward: small
matmul + tanh pairs, as many as take ``delay_ms`` on this rank when nothing else runs (timed once
per process), the "many small ops" kind of slowdown no single op explains. The amount is ``delay_ms``, or for a module ``factor`` times its own forward
time. On CPU the delay is a sleep; on a CUDA module (or a collective's CUDA bucket) it is a
device-side sleep (``torch.cuda._sleep``), so the GPU is delayed, not only the launch, and it is
not waited for: a slow kernel, not a synchronisation. Extra compute runs on the job's device.
Every injection runs inside a ``oracle_inject:<what>`` profiler
range, so the culprit is visible in the trace (unless ``label=False``: a code path nothing in the
trace names), and is written to
``injections-rank-<rank>.jsonl`` (what, where, step, requested and actual delay).
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.profiler import record_function

from bottleneck_oracle.atomic import atomic_path
from bottleneck_oracle.config import INJECTION_KINDS
from bottleneck_oracle_lab.systems.profiler import phase

KINDS = INJECTION_KINDS
PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True, kw_only=True, slots=True)
class Injection:
    kind: str
    """module | phase | collective | rank | compute"""
    rank: int
    """The rank that is slowed."""
    step: int
    """The training step (= its ProfilerStep number) that is slowed."""
    target: str = ""
    """Module name pattern (fnmatch) for kind=module and kind=compute, a phase name for kind=phase."""
    delay_ms: float = 0.0
    """Added time, ms."""
    factor: float = 1.0
    """kind=module only: slow the module to factor x its own forward time."""
    backward: bool = False
    """kind=module and kind=compute: in a backward hook of the module (its gradient), not after its forward."""
    label: bool = True
    """False: no ``oracle_inject`` profiler range around the added time — a code path of the user's
    that nothing in the trace names (what a tool meets in a real job)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} (found {self.kind!r})")
        if self.kind == "phase" and self.target not in PHASES:
            raise ValueError(f"target of a phase injection must be one of {PHASES} (found {self.target!r})")
        if self.kind in ("module", "compute") and not self.target:
            raise ValueError(f"a {self.kind} injection needs a target pattern, e.g. 'layers.1.mlp'")
        if self.delay_ms < 0 or self.factor < 1:
            raise ValueError(f"delay_ms must be >= 0 and factor >= 1 (found {self.delay_ms}, {self.factor})")
        if self.delay_ms == 0 and self.factor == 1:
            raise ValueError("an injection needs delay_ms > 0 or factor > 1")
        if self.factor != 1 and self.kind != "module":
            raise ValueError("factor applies to module injections only")
        if self.backward and (self.kind not in ("module", "compute") or self.factor != 1):
            raise ValueError("backward applies to module and compute injections with a delay_ms")


def _delay(seconds: float, like: torch.Tensor | None) -> None:
    if like is not None and like.is_cuda:
        torch.cuda._sleep(int(seconds * _cycles_per_second(like.device)))
    else:
        time.sleep(seconds)


_CYCLES: dict[str, float] = {}
PAIR = 64  # side of the square matrices of the extra compute's matmul + tanh pairs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pair_seconds(device: torch.device) -> float:
    """Seconds one matmul + tanh pair takes here, on ``device`` (median of 5 timings of 50 pairs,
    after a warm-up; on a GPU, launched and finished: the GPU drained before and after)."""
    a, w = torch.randn(PAIR, PAIR, device=device), torch.randn(PAIR, PAIR, device=device) / PAIR
    for _ in range(20):
        a = torch.tanh(a @ w)
    times = []
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(50):
            a = torch.tanh(a @ w)
        _sync(device)
        times.append((time.perf_counter() - t0) / 50)
    return sorted(times)[2]


def _compute(pairs: int, device: torch.device) -> None:
    a, w = torch.ones(PAIR, PAIR, device=device), torch.full((PAIR, PAIR), 1.0 / PAIR, device=device)
    for _ in range(pairs):
        a = torch.tanh(a @ w)


def _cycles_per_second(device: torch.device) -> float:
    """GPU clock cycles per second for torch.cuda._sleep, measured once per device."""
    key = str(device)
    if key not in _CYCLES:
        with torch.cuda.device(device):
            cycles = 50_000_000
            for _ in range(2):  # the first wakes an idle GPU's clock up (an H200 idles at 345 MHz): the second is timed
                torch.cuda.synchronize()
                start = time.perf_counter()
                torch.cuda._sleep(cycles)
                torch.cuda.synchronize()
                _CYCLES[key] = cycles / (time.perf_counter() - start)
    return _CYCLES[key]


class Injector:
    """Applies the injections of one rank to a model and a training loop.

    Call ``at_step(step)`` at the start of every training step, wrap phases in
    ``phase(name)``, and for collectives install ``ddp_comm_hook`` on the DDP model."""

    def __init__(self, injections: list[Injection], rank: int, out_dir: str | Path, device: str | torch.device = "cpu") -> None:
        self.mine = [i for i in injections if i.rank == rank]
        self.rank = rank
        self.out = Path(out_dir)
        self.device = torch.device(device)
        """Where extra compute runs (the job's device)."""
        self.step = -1
        self.records: list[dict] = []
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._pair_s = _pair_seconds(self.device) if any(i.kind == "compute" for i in self.mine) else 0.0
        if self.device.type == "cuda" and any(i.kind in ("module", "collective") for i in self.mine):
            _cycles_per_second(self.device)  # timed now, not inside the first slowed step

    def _due(self, kind: str, target: str = "") -> list[Injection]:
        return [i for i in self.mine if i.step == self.step and i.kind == kind and (not target or fnmatch.fnmatchcase(target, i.target))]

    def _apply(self, inj: Injection, seconds: float, where: str, like: torch.Tensor | None = None) -> None:
        start = time.perf_counter()
        extra: dict = {}
        with record_function(f"oracle_inject:{inj.kind}:{where}") if inj.label else nullcontext():
            if inj.kind == "compute":
                extra["pairs"] = max(1, round(seconds / self._pair_s))
                _compute(extra["pairs"], self.device)
            else:
                _delay(seconds, like)
        on_gpu = (like is not None and like.is_cuda) or (inj.kind == "compute" and self.device.type == "cuda")
        if on_gpu:
            # queued on the GPU, not waited for: the job runs as it would with a slow kernel (no
            # synchronisation the clean job lacks); slept_ms is then the requested time
            extra["on_gpu"] = True
        slept = seconds if on_gpu and inj.kind != "compute" else time.perf_counter() - start
        self.records.append({**asdict(inj), "where": where, "slept_ms": 1000 * slept, **extra})

    def attach(self, model: nn.Module) -> None:
        """Hooks on every module that a module injection of this rank names."""
        patterns = {i.target for i in self.mine if i.kind in ("module", "compute") and not i.backward}
        backward = {i.target for i in self.mine if i.kind in ("module", "compute") and i.backward}
        for name, module in model.named_modules():
            name = name.removeprefix("module.")  # DDP wraps the model as .module
            if any(fnmatch.fnmatchcase(name, p) for p in patterns):
                self._handles.append(module.register_forward_pre_hook(self._pre(name)))
                self._handles.append(module.register_forward_hook(self._post(name)))
            if any(fnmatch.fnmatchcase(name, p) for p in backward):
                self._handles.append(module.register_full_backward_hook(self._grad(name)))

    def _pre(self, name: str) -> Callable:
        def hook(module, args):
            module._oracle_t0 = time.perf_counter()

        return hook

    def _post(self, name: str) -> Callable:
        def hook(module, args, output):
            own = time.perf_counter() - getattr(module, "_oracle_t0", time.perf_counter())
            for inj in (i for i in self._due("module", name) + self._due("compute", name) if not i.backward):
                seconds = inj.delay_ms / 1000 + (inj.factor - 1) * own
                self._apply(inj, seconds, name, output if isinstance(output, torch.Tensor) else None)

        return hook

    def _grad(self, name: str) -> Callable:
        def hook(module, grad_input, grad_output):
            for inj in (i for i in self._due("module", name) + self._due("compute", name) if i.backward):
                self._apply(inj, inj.delay_ms / 1000, f"{name}.backward")

        return hook

    def at_step(self, step: int) -> None:
        self.step = step
        for inj in self._due("rank"):
            self._apply(inj, inj.delay_ms / 1000, f"rank{self.rank}")

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The phase's profiler range (profiler.phase); a phase injection delays its start."""
        with phase(name):
            for inj in self._due("phase", name):
                self._apply(inj, inj.delay_ms / 1000, name)
            yield

    def ddp_comm_hook(self, process_group=None) -> Callable:
        """A DDP comm hook: the gradient all-reduce, delayed before it is issued when due."""

        def hook(state, bucket):
            for inj in self._due("collective"):
                self._apply(inj, inj.delay_ms / 1000, f"all_reduce.bucket{bucket.index()}", bucket.buffer())
            group = process_group or torch.distributed.group.WORLD
            world = torch.distributed.get_world_size(group)
            fut = torch.distributed.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0].div_(world))

        return hook

    def write_manifest(self) -> Path:
        path = self.out / f"injections-rank-{self.rank}.jsonl"
        with atomic_path(path) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        return path


def read_manifest(folder: str | Path) -> list[dict]:
    """Every injection recorded in a trace folder, all ranks."""
    out: list[dict] = []
    for f in sorted(Path(folder).glob("injections-rank-*.jsonl")):
        out.extend(json.loads(line) for line in f.read_text().splitlines() if line.strip())
    return out

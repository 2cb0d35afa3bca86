"""Typed configuration, read from config.yaml (YAML, parsed safely; no code is executed)."""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, get_args

from bottleneck_oracle.errors import ConfigError, OracleError
from bottleneck_oracle.files import read_yaml

# Names the config validates against, defined here so that reading a config needs neither torch
# nor PyG; the modules that implement them import these (systems.model.SIZES has one GPT per size).
ModelSize = Literal["tiny", "small", "medium"]
MODEL_SIZES: tuple[ModelSize, ...] = get_args(ModelSize)
InjectionKind = Literal["module", "phase", "collective", "rank", "compute"]
INJECTION_KINDS: tuple[InjectionKind, ...] = get_args(InjectionKind)
GATVariant = Literal["bidirectional", "directed", "correction"]
GAT_VARIANTS: tuple[GATVariant, ...] = get_args(GATVariant)
# a parallel layout of the reference workloads: dpN data parallel on N ranks, tpN tensor parallel,
# ppN-afab / ppN-1f1b N pipeline stages with that schedule
Layout = Literal[
    "dp2",
    "dp3",
    "dp4",
    "dp5",
    "dp6",
    "dp7",
    "dp8",
    "tp2",
    "tp3",
    "tp4",
    "tp5",
    "tp6",
    "tp7",
    "tp8",
    "pp2-afab",
    "pp2-1f1b",
    "pp3-afab",
    "pp3-1f1b",
    "pp4-afab",
    "pp4-1f1b",
    "pp5-afab",
    "pp5-1f1b",
    "pp6-afab",
    "pp6-1f1b",
    "pp7-afab",
    "pp7-1f1b",
    "pp8-afab",
    "pp8-1f1b",
]


def _shown(value: object) -> str:
    """A config value in an error message, bounded (a list of a billion aliases shows a few items)."""
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxstring, r.maxother, r.maxlong = 3, 8, 8, 80, 80, 40
    return r.repr(value)


def _lists(section: str, obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        if not isinstance(getattr(obj, name), list):
            raise ConfigError(f"{section}.{name} must be a list (found {_shown(getattr(obj, name))})")


def _non_negative(section: str, obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        v = getattr(obj, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):
            raise ConfigError(f"{section}.{name} must be a number >= 0 (found {_shown(v)})")


@dataclass(kw_only=True, slots=True)
class GraphConfig:
    feeds_resume_us: float = 5000.0
    """µs: a thread idle when a collective completes (or another thread hands over) and resuming within this waited for it."""
    idle_gap_us: float = 50.0
    """µs: a thread with nothing opening or closing for this long was idle (it may be waiting for another thread)."""
    stream_wait_us: float = 50.0
    """µs: traces without cuda_sync events: an op on another stream that ended at most this long before a late GPU op released it."""
    clock_tolerance_us: float = 5.0
    """µs: how far a rank's CPU and GPU clocks may disagree; an edge running back in time by more is dropped."""
    ranks_per_host: int = 0
    """Ranks per host (ranks 0..N-1 on the first): each host's clock is aligned to the first's from the
    collectives they ran together. 0: every rank shares one clock (one host, or synchronised clocks)."""
    steps_at: str = ""
    """A shell-style pattern of host op names (``execute_*``): each op it names starts a step, in
    place of the ProfilerStep markers (an inference loop's own annotations). "": the markers, or
    where a trace has none, its optimizer's steps."""

    def __post_init__(self) -> None:
        _non_negative("graph", self, ("feeds_resume_us", "idle_gap_us", "stream_wait_us", "clock_tolerance_us"))
        if not isinstance(self.ranks_per_host, int) or isinstance(self.ranks_per_host, bool) or self.ranks_per_host < 0:
            raise ConfigError(f"graph.ranks_per_host must be an integer >= 0 (found {_shown(self.ranks_per_host)})")
        if not isinstance(self.steps_at, str):
            raise ConfigError(f"graph.steps_at must be a string (found {_shown(self.steps_at)})")


@dataclass(kw_only=True, slots=True)
class AnalysisConfig:
    top_k: int = 20
    """How many ops the summary lists by time on the critical path."""
    untraced_gap_us: float = 1000.0
    """µs: time between ops on a thread, inside no op, longer than this is untraced (shorter: framework time)."""

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 1:
            raise ConfigError(f"analysis.top_k must be an integer >= 1 (found {_shown(self.top_k)})")
        _non_negative("analysis", self, ("untraced_gap_us",))


@dataclass(kw_only=True, slots=True)
class PathsConfig:
    graphs: str = "data/graphs"
    """Where `parse` writes graphs when --output is not given."""
    raw: str = "data/raw"
    """Where `generate` writes its runs when --out is not given."""
    checkpoints: str = "data/checkpoints"
    """Where `train` writes one checkpoint per split."""

    def __post_init__(self) -> None:
        for name in ("graphs", "raw", "checkpoints"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v or "\0" in v or len(v) > 4096:
                raise ConfigError(f"paths.{name} must be a folder name (found {_shown(v)})")


@dataclass(kw_only=True, slots=True)
class GridConfig:
    sizes: list[ModelSize] = field(default_factory=lambda: ["tiny", "small", "medium"])
    """GPT sizes (systems.model.SIZES)."""
    layouts: list[Layout] = field(default_factory=lambda: ["dp2", "tp2", "pp2-1f1b", "pp2-afab"])
    """dpN: data parallel on N ranks; tpN: tensor parallel; ppN-1f1b / ppN-afab: N pipeline stages."""
    injection_kinds: list[InjectionKind] = field(default_factory=lambda: ["module", "phase", "collective", "rank"])
    """What the injections slow (systems.inject.KINDS); collective runs on DP layouts only."""
    steps: int = 18
    """Profiled steps per launch; every third one from step 3 carries an injection."""
    delays_ms: list[float] = field(default_factory=lambda: [5.0, 10.0, 20.0, 40.0])
    """Injected delays to draw from, ms."""
    batch: int = 4
    """Sequences per step (DP) or per micro-batch (PP)."""
    microbatches: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        _lists("grid", self, ("sizes", "layouts", "injection_kinds", "delays_ms"))
        for name, values, known in (("sizes", self.sizes, MODEL_SIZES), ("injection_kinds", self.injection_kinds, INJECTION_KINDS)):
            bad = [v for v in values if v not in known]
            if bad or not values:
                raise ConfigError(f"grid.{name} must be a non-empty list from {sorted(known)} (found {_shown(values)})")
        bad_layouts = [v for v in self.layouts if v not in get_args(Layout)]
        if bad_layouts or not self.layouts:
            raise ConfigError(f"grid.layouts must be like dp2, tp2, pp2-1f1b, pp4-afab (found {_shown(bad_layouts or self.layouts)})")
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 4:
            raise ConfigError(f"grid.steps must be an integer >= 4 (found {_shown(self.steps)})")
        if not self.delays_ms or any(
            not isinstance(d, (int, float)) or isinstance(d, bool) or not 0 < d < float("inf") for d in self.delays_ms
        ):
            raise ConfigError(f"grid.delays_ms must be positive numbers (found {_shown(self.delays_ms)})")
        for name, low in (("batch", 1), ("microbatches", 1), ("seed", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ConfigError(f"grid.{name} must be an integer >= {low} (found {_shown(v)})")


Split = Literal["random", "ood_size", "ood_layout", "ood_injection"]
SPLITS: tuple[Split, ...] = get_args(Split)


@dataclass(kw_only=True, slots=True)
class ModelsConfig:
    variants: list[GATVariant] = field(default_factory=lambda: ["bidirectional", "directed", "correction"])
    """HeteroGAT variants to train (models.hetero_gat.VARIANTS)."""
    hidden: int = 32
    layers: int = 3
    heads: int = 2
    dropout: float = 0.0
    epochs: int = 20
    """Upper bound; training stops early when the validation loss has not improved for `patience` epochs."""
    patience: int = 4
    lr: float = 0.003
    batch: int = 8
    """Graphs per optimisation step."""
    plain_per_epoch: int = 40
    """Unedited graphs drawn per epoch beside every what-if sample (they teach slack and criticality)."""
    loss_step: float = 1.0
    """Weight of the step-time loss (MSE of log(step / reference))."""
    loss_slack: float = 0.05
    """Weight of the node slack loss (MSE of log1p(slack ms))."""
    loss_critical: float = 0.05
    """Weight of the criticality loss (binary cross-entropy)."""
    splits: list[Split] = field(default_factory=lambda: list(SPLITS))
    """Which splits to train a checkpoint for: random, ood_size, ood_layout, ood_injection."""
    seed: int = 0

    def __post_init__(self) -> None:
        _lists("models", self, ("variants", "splits"))
        bad = [v for v in self.variants if v not in GAT_VARIANTS]
        if bad or not self.variants:
            raise ConfigError(f"models.variants must be a non-empty list from {list(GAT_VARIANTS)} (found {_shown(self.variants)})")
        bad_splits = [v for v in self.splits if v not in SPLITS]
        if bad_splits or not self.splits:
            raise ConfigError(f"models.splits must be a non-empty list from {list(SPLITS)} (found {_shown(self.splits)})")
        for name in ("hidden", "layers", "heads", "epochs", "patience", "batch", "seed", "plain_per_epoch"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name in ("seed", "plain_per_epoch") else 1):
                raise ConfigError(f"models.{name} must be a positive integer (found {_shown(v)})")
        if self.hidden % self.heads:
            raise ConfigError(f"models.hidden ({self.hidden}) must be a multiple of models.heads ({self.heads})")
        for name in ("dropout", "lr", "loss_step", "loss_slack", "loss_critical"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 <= v < float("inf") or (name == "dropout" and v >= 1) or (name == "lr" and v == 0):
                raise ConfigError(f"models.{name} must be a number >= 0 (found {_shown(v)})")


@dataclass(kw_only=True, slots=True)
class Config:
    graph: GraphConfig = field(default_factory=GraphConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    grid: GridConfig = field(default_factory=GridConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)


_SECTIONS = {"graph": GraphConfig, "analysis": AnalysisConfig, "paths": PathsConfig, "grid": GridConfig, "models": ModelsConfig}


def load_config(path: str | Path | None) -> Config:
    """Config from a YAML file (missing keys take defaults); ConfigError names a bad key."""
    if path is None:
        return Config()
    p = Path(path)
    try:
        raw = read_yaml(p, "config file") or {}
    except OracleError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a mapping of sections, found {type(raw).__name__}")
    sections = {}
    for name, value in raw.items():
        cls = _SECTIONS.get(name)
        if cls is None:
            raise ConfigError(f"{p}: unknown section {_shown(name)} (known: {', '.join(_SECTIONS)})")
        if not isinstance(value, dict):
            raise ConfigError(f"{p}: section {_shown(name)} must be a mapping")
        known = {f.name for f in fields(cls)}
        unknown = [k for k in value if k not in known]
        if unknown:  # (keys of several types do not sort: the first one in the file is named)
            raise ConfigError(
                f"{p}: unknown key {name}.{unknown[0] if isinstance(unknown[0], str) else _shown(unknown[0])} (known: {', '.join(sorted(known))})"
            )
        try:
            sections[name] = cls(**value)
        except ConfigError as exc:
            raise ConfigError(f"{p}: {exc}") from None
    return Config(**sections)

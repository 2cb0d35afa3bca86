"""The per-step results the API returns for what-if, blame and advice, as typed records.

They sit below every renderer (the CLI's terminal tables, report.html) so each reads them by
attribute; ``to_dict()`` of each is its ``--json`` form (the keys are listed in the manual,
docs/json.md). Keys that only some steps have (a graph network's answer, a pipeline re-split,
the op enclosing an untraced gap) are left out of the JSON where the field is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from bottleneck_oracle.analysis.blame import Blame
from bottleneck_oracle.analysis.whatif import Edit
from bottleneck_oracle.errors import OracleError

# ---------------------------------------------------------------- what-if


@dataclass(slots=True)
class NodeRef:
    """A node named for people: its id in the step's graph, its name and rank."""

    id: int
    name: str
    rank: int

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "rank": self.rank}


@dataclass(slots=True)
class PathChange:
    """How the critical path changed under an edit: its size before and after, and the (at most
    ten, longest first) nodes that joined it and left it."""

    nodes_before: int
    nodes_after: int
    joined: list[NodeRef]
    left: list[NodeRef]

    def to_dict(self) -> dict[str, Any]:
        return {"nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
                "joined": [x.to_dict() for x in self.joined], "left": [x.to_dict() for x in self.left]}  # fmt: skip


@dataclass(slots=True)
class Replay:
    """The exact replay's answer: the edited step time (measured + delta) and the delta, in µs."""

    step_us: float
    delta_us: float

    def to_dict(self) -> dict[str, Any]:
        return {"step_us": self.step_us, "delta_us": self.delta_us}


@dataclass(slots=True)
class Corrected:
    """The replay with per-node duration corrections (models.corrections): the edited step time,
    the delta and its 90% interval; or None for all three and ``out_of_domain`` saying why."""

    step_us: float | None
    delta_us: float | None
    interval_us: tuple[float, float] | None
    out_of_domain: str | None
    trained_on: str

    def to_dict(self) -> dict[str, Any]:
        return {"step_us": self.step_us, "delta_us": self.delta_us, "interval_us": list(self.interval_us) if self.interval_us else None,
                "out_of_domain": self.out_of_domain, "trained_on": self.trained_on}  # fmt: skip


@dataclass(slots=True)
class Resplit:
    """A pipeline step re-split from ``old`` to ``new`` micro-batches over ``stages`` stages, by the 1F1B formula."""

    old: int
    new: int
    stages: int
    formula_delta_us: float
    step_us: float

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.old, "to": self.new, "stages": self.stages, "formula_delta_us": self.formula_delta_us, "step_us": self.step_us}


@dataclass(slots=True)
class BatchScale:
    """The batch scaled by ``ratio``: the step between two replays, the forward and backward
    passes' CPU ops scaled alone (``ops_alone_step_us``) and with their regions' own time between
    them (``with_own_time_step_us``). Ops have a fixed per-call part a trace cannot separate from
    the part that scales: on paired CPU re-runs the measured step fell between the two on most
    batch changes (the manual's accuracy pages, docs/accuracy/reruns.md, "Knob changes")."""

    ratio: float
    ops_alone_step_us: float
    with_own_time_step_us: float

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "ops_alone_step_us": self.ops_alone_step_us, "with_own_time_step_us": self.with_own_time_step_us}


@dataclass(slots=True)
class StepWhatIf:
    """One step under the edits (api.whatif)."""

    step: int | None
    measured_us: float
    edited_nodes: int
    edited_gaps: int
    edited_own: int  # enclosing op instances whose own time (between their children) the edits changed
    detached_edges: int
    added_us: float  # the time the edits added to ops, gaps and thread starts (negative: removed)
    replay: Replay
    critical_path: PathChange
    model: dict[str, Any] | None = None  # the graph network's answer (models.predict.Predictor.effect)
    microbatches: Resplit | None = None
    corrected: Corrected | None = None
    batch: BatchScale | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step": self.step, "measured_us": self.measured_us, "edited_nodes": self.edited_nodes,
                             "edited_gaps": self.edited_gaps, "edited_own": self.edited_own, "detached_edges": self.detached_edges, "added_us": self.added_us}  # fmt: skip
        if self.model is not None:
            d["model"] = self.model
        d["replay"] = self.replay.to_dict()
        if self.corrected is not None:
            d["corrected"] = self.corrected.to_dict()
        if self.microbatches is not None:
            d["microbatches"] = self.microbatches.to_dict()
        if self.batch is not None:
            d["batch"] = self.batch.to_dict()
        d["critical_path"] = self.critical_path.to_dict()
        return d


# ---------------------------------------------------------------- blame


@dataclass(slots=True)
class BlameModel:
    """Which graph network predicted the top culprits' savings, and why it refused if it did."""

    checkpoint: str
    variant: str
    out_of_domain: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "variant": self.variant, "out_of_domain": self.out_of_domain}


@dataclass(slots=True)
class StepBlame:
    """One step's blame (api.blame): the analysis.blame result with the measured step time and
    where the typical durations came from."""

    blame: Blame
    measured_us: float
    references: str  # "baseline", "N other steps" or "peer ranks"
    model: BlameModel | None = None

    @property
    def step(self) -> int | None:
        return self.blame.step

    def to_dict(self) -> dict[str, Any]:
        d = self.blame.to_dict()
        d["measured_us"] = self.measured_us
        d["references"] = self.references
        if self.model is not None:
            d["model"] = self.model.to_dict()
        return d


# ---------------------------------------------------------------- advice


@dataclass(slots=True)
class Suggestion:
    """One optimisation suggestion with its what-if edits and, once validated, their savings."""

    source: str  # recipe id, or "llm"
    title: str
    explanation: str
    edits: list[str]
    remedy: str = ""
    replay_saving_us: float = 0.0
    model_saving_us: dict[str, float | None] = field(default_factory=dict)
    model_out_of_domain: str | None = None  # why the graph network gave no answer (Predictor.refusal)
    edited_nodes: int = 0
    references: list[str] = field(default_factory=list)
    explanation_by: Literal["recipe", "llm"] = "recipe"
    """Who wrote the explanation: a shipped recipe, or an LLM (free text nothing checked: shown as unverified)."""

    @property
    def edits_in_words(self) -> list[str]:
        return [_in_words(e) for e in self.edits]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "title": self.title, "explanation": self.explanation, "remedy": self.remedy, "edits": self.edits,
                "edits_in_words": self.edits_in_words,
                "edited_nodes": self.edited_nodes, "replay_saving_us": self.replay_saving_us, "model_saving_us": self.model_saving_us,
                "model_out_of_domain": self.model_out_of_domain, "references": self.references,
                "explanation_by": self.explanation_by}  # fmt: skip


def _in_words(edit: str) -> str:
    try:
        return Edit.parse(edit).describe()
    except OracleError:
        return edit


@dataclass(slots=True)
class Advice:
    """The validated suggestions for one step (llm.graphrag.advise), best replay saving first."""

    step: int | None
    makespan_us: float
    metrics: dict[str, float]
    retrieved: list[dict[str, Any]]  # {id, score, holds} of each recipe retrieval ranked
    suggestions: list[Suggestion]
    rejected: list[dict[str, Any]]  # {reason, round} or {source, edits, reason}
    generator: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "makespan_us": self.makespan_us, "generator": self.generator, "metrics": self.metrics,
                "retrieved": self.retrieved, "suggestions": [s.to_dict() for s in self.suggestions], "rejected": self.rejected}  # fmt: skip


@dataclass(slots=True)
class StepAdvice:
    """One step's advice (api.advise) with the blame it is based on."""

    advice: Advice
    blame: Blame
    references: str

    @property
    def step(self) -> int | None:
        return self.advice.step

    def to_dict(self) -> dict[str, Any]:
        return {**self.advice.to_dict(), "blame": self.blame.to_dict(), "references": self.references}

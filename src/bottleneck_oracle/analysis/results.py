"""The per-step results the API returns for what-if, blame and advice, as typed records.

They sit below every renderer (the CLI's terminal tables, report.html) so each reads them by
attribute; ``serial.to_json`` of each is its ``--json`` form (the keys are listed in the manual,
docs/json.md). Keys that only some steps have (a graph network's answer, a pipeline re-split,
the op enclosing an untraced gap) are left out of the JSON where the field is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from bottleneck_oracle.analysis.answer import Estimate
from bottleneck_oracle.analysis.blame import Blame
from bottleneck_oracle.analysis.whatif import Edit
from bottleneck_oracle.errors import OracleError
from bottleneck_oracle.serial import Computed, json_meta

# ---------------------------------------------------------------- what-if


@dataclass(frozen=True, slots=True)
class NodeRef:
    """A node named for people: its id in the step's graph, its name and rank."""

    id: int
    name: str
    rank: int


@dataclass(frozen=True, slots=True)
class PathChange:
    """How the critical path changed under an edit: its size before and after, and the (at most
    ten, longest first) nodes that joined it and left it."""

    nodes_before: int
    nodes_after: int
    joined: list[NodeRef]
    left: list[NodeRef]


@dataclass(frozen=True, slots=True)
class Replay:
    """The exact replay's answer: the edited step time (the step's time + delta) and the delta, in µs."""

    step_us: float
    delta_us: float


@dataclass(frozen=True, slots=True)
class SteadyReplay:
    """A step the device carried earlier work into (analysis.whatif.carried_in), replayed in steady
    state: the edits applied to ``steps`` consecutive steps ending with it (from ``first``), the
    step's period the last step's (api.whatif). ``one_step_us``: the edited step time in the
    step's window alone, where the earlier steps' work, and the host it held back, keep their
    recorded times."""

    first: int
    steps: int
    one_step_us: float


@dataclass(frozen=True, slots=True)
class ModelAnswer:
    """What the graph network says an edit does (models.predict.Predictor.effect): per variant the
    measured step plus the predicted effect and the effect (edited - unedited prediction), µs; or
    None for every variant and ``out_of_domain`` saying why it does not answer."""

    checkpoint: str
    out_of_domain: str | None
    step_us: dict[str, float | None]
    delta_us: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class Corrected:
    """The replay with per-node duration corrections (models.corrections): the edited step time,
    the delta and its 90% interval; or None for all three and ``out_of_domain`` saying why."""

    step_us: float | None
    delta_us: float | None
    interval_us: tuple[float, float] | None
    out_of_domain: str | None
    trained_on: str


@dataclass(frozen=True, slots=True)
class Resplit:
    """A pipeline step re-split from ``old`` to ``new`` micro-batches over ``stages`` stages, its
    ``schedule`` (``1f1b`` or ``afab``, read from the trace) replayed stage by stage."""

    old: int = field(metadata=json_meta(key="from"))
    new: int = field(metadata=json_meta(key="to"))
    stages: int
    schedule: str
    formula_delta_us: float
    step_us: float


@dataclass(frozen=True, kw_only=True, slots=True)
class StepWhatIf:
    """One step under the edits (api.whatif)."""

    step: int | None
    measured_us: float  # the ProfilerStep spans (ExecutionGraph.span)
    step_us: float  # the step's time before the edits, as analyze gives it (its period; the replayed base)
    edited_nodes: int
    edited_gaps: int
    edited_own: int  # enclosing op instances whose own time (between their children) the edits changed
    detached_edges: int
    added_us: float  # the time the edits added to ops, gaps and thread starts (negative: removed)
    model: ModelAnswer | None = field(default=None, metadata=json_meta(omit_none=True))  # the graph network's answer
    replay: Replay
    steady: SteadyReplay | None = field(default=None, metadata=json_meta(omit_none=True))
    """Set where the replay is of the steady state over several steps (the device carried earlier work into the step)."""
    corrected: Corrected | None = field(default=None, metadata=json_meta(omit_none=True))
    microbatches: Resplit | None = field(default=None, metadata=json_meta(omit_none=True))
    knobs: list[str] = field(default_factory=list)
    """The configuration changes replayed (``whatif --set``), in words."""
    knobs_interval_us: tuple[float, float] | None = field(default=None, metadata=json_meta(omit_none=True))
    """With ``--set`` on a CPU step: the 90% interval of the step time, from how far recorded CPU
    re-runs fell from the prediction (``analysis.knobs.interval``); None on a step with device work."""
    critical_path: PathChange


# ---------------------------------------------------------------- blame


@dataclass(slots=True)
class BlameModel:
    """Which graph network predicted the top culprits' savings, and why it refused if it did."""

    checkpoint: str
    variant: str
    out_of_domain: str | None = None


@dataclass(slots=True)
class StepBlame:
    """One step's blame (api.blame): the analysis.blame result (its keys first in the JSON) with the
    measured step time and where the typical durations came from."""

    blame: Blame = field(metadata=json_meta(inline=True))
    measured_us: float
    references: str  # "baseline", "N other steps" or "peer ranks"
    model: BlameModel | None = field(default=None, metadata=json_meta(omit_none=True))

    @property
    def step(self) -> int | None:
        return self.blame.step


# ---------------------------------------------------------------- advice


@dataclass(kw_only=True, slots=True)
class Suggestion:
    """One optimisation suggestion with its what-if edits and, once validated, their savings."""

    source: str  # recipe id, or "llm"
    title: str
    explanation: str
    remedy: str = ""
    edits: list[str]
    knobs: list[str] = field(default_factory=list)
    """Configuration changes the remedy makes (``whatif --set`` syntax), replayed after the edits."""
    edited_nodes: int = 0
    replay_saving_us: float = 0.0
    saving_interval_us: tuple[float, float] | None = field(default=None, metadata=json_meta(omit_none=True))
    """A configuration change's saving on a CPU step: its 90% interval from recorded re-runs (``analysis.knobs.interval``)."""
    model_saving_us: dict[str, float | None] = field(default_factory=dict)
    model_out_of_domain: str | None = None  # why the graph network gave no answer (Predictor.refusal)
    references: list[str] = field(default_factory=list)
    explanation_by: Literal["recipe", "llm"] = "recipe"
    """Who wrote the explanation: a shipped recipe, or an LLM (free text nothing checked: shown as unverified)."""

    JSON_COMPUTED: ClassVar[tuple[Computed, ...]] = (Computed("edits_in_words", "edits_in_words", after="edits"),)

    @property
    def edits_in_words(self) -> list[str]:
        """Each edit, then each configuration change, in words."""
        return [_in_words(e) for e in self.edits] + [_knob_in_words(k) for k in self.knobs]

    @property
    def changes(self) -> list[str]:
        """The edits and the configuration changes as a user would type them (``--set KNOB=VALUE``)."""
        return list(self.edits) + [f"--set {k}" for k in self.knobs]


def _knob_in_words(knob: str) -> str:
    from bottleneck_oracle.analysis.knobs import Knob

    try:
        return Knob.parse(knob).describe()
    except OracleError:
        return knob


def _in_words(edit: str) -> str:
    try:
        return Edit.parse(edit).describe()
    except OracleError:
        return edit


@dataclass(frozen=True, slots=True)
class Retrieved:
    """A recipe the retrieval ranked: its id, BM25 score (3 decimals) and whether its thresholds hold."""

    id: str
    score: float
    holds: bool


@dataclass(frozen=True, slots=True)
class Rejected:
    """Why a suggestion was rejected: a reply of the LLM that was not a suggestion (``round``: 1 or 2),
    or a suggestion whose validation failed (its ``source`` and ``edits``)."""

    source: str | None = field(default=None, metadata=json_meta(omit_none=True))
    edits: list[str] | None = field(default=None, metadata=json_meta(omit_none=True))
    reason: str = ""
    round: int | None = field(default=None, metadata=json_meta(omit_none=True))


@dataclass(kw_only=True, slots=True)
class Advice:
    """The validated suggestions for one step (llm.graphrag.advise), best replay saving first."""

    step: int | None
    makespan_us: float
    generator: str
    metrics: dict[str, float]
    retrieved: list[Retrieved]  # each recipe the retrieval ranked
    suggestions: list[Suggestion]
    rejected: list[Rejected]


@dataclass(frozen=True, slots=True)
class RunSuggestion:
    """One suggestion across the steps of a run (llm.graphrag.run_advice): by its recipe (or its edits,
    for an LLM's own), in how many steps it survived validation and its replayed saving per step."""

    source: str
    title: str
    remedy: str
    edits: list[str]
    steps: int  # steps it survived validation in
    of: int  # steps advised on
    saving: Estimate  # the replayed saving, median over those steps with its 95% interval
    share: float  # median saving / step time


@dataclass(slots=True)
class StepAdvice:
    """One step's advice (api.advise) with the blame it is based on."""

    advice: Advice = field(metadata=json_meta(inline=True))
    blame: Blame
    references: str
    steady: bool = True  # one of the run's steady steps (analysis.runs.steady): what the run's advice reads

    @property
    def step(self) -> int | None:
        return self.advice.step

"""What stages hand later stages and the reports, typed: the figures a stage measured, the pictures it drew, what an
item tells the report, and the outcomes the report names.

A stage that measures what another reads (forward's loss at init, backward's gradient norm, overfit's loss curve)
returns it as one of these classes in `StageResult.measured`; the reader takes the attribute, never a string key.
`StageResult.figures` holds the same numbers by name (and any other figure a stage adds) for the JSON and HTML reports.
An item's `ItemFacts` travel from the xdist worker that ran it to the report as strict JSON, and its `Pictures` (JSON
values too) as an attribute of its report, which `report.html` draws.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from dataclasses import dataclass, field
from typing import Any, TypedDict


@dataclass(frozen=True)
class Measured:
    """Figures of one stage, by name, for the reports."""

    def figures(self) -> dict[str, float]:
        return {field.name: float(getattr(self, field.name)) for field in dataclasses.fields(self)}


@dataclass(frozen=True)
class Forward(Measured):
    #: The loss of the fixed batch at the starting weights.
    loss_at_init: float


@dataclass(frozen=True)
class Backward(Measured):
    #: The norm of every trainable parameter's gradient together, after one backward pass on the fixed batch.
    gradient_norm: float
    #: How many numbers the optimizer trains.
    trainable_parameters: int


@dataclass(frozen=True)
class Overfit(Measured):
    #: The fixed batch's loss before and after the overfitting steps.
    loss_before: float
    loss_after: float
    #: How many steps were taken, at which (peak) learning rate.
    overfit_steps: int
    learning_rate: float


@dataclass(frozen=True)
class Sampling(Measured):
    #: The seconds generation and the reward functions took to sample the completions of an online RL batch (once for
    #: every item: the report names the price).
    sampling_seconds: float


class Outcome(str, enum.Enum):
    """How an item ended, as the reports name it."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value

    @property
    def bad(self) -> bool:
        """A failure of the test itself, or an error around it."""
        return self in (Outcome.FAILED, Outcome.ERROR)


@dataclass
class ItemFacts:
    """What the report needs of one item, in plain values that travel from xdist workers (as JSON)."""

    script: str
    stage: str
    device: str
    #: The setting that turns the stage on, where it runs only when asked, else "".
    opt_in: str = ""
    #: Skipped because a stage it needs failed.
    blocked: bool = False
    #: Skipped because its device is not on this machine.
    unavailable: bool = False
    #: The cause and fix of its failure, and whether only the library's own error could be shown.
    diagnosis: str = ""
    fix: str = ""
    unexplained: bool = False
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The seconds sampling an online RL batch took in this item (`Sampling`), else 0.
    sampling_seconds: float = 0.0

    def to_json(self) -> str:
        return to_json(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ItemFacts:
        data = json.loads(text)
        known = {item.name for item in dataclasses.fields(cls)}
        facts = cls(**{key: value for key, value in data.items() if key in known})
        facts.figures = {name: float(value) for name, value in facts.figures.items()}  # "nan" back to a float
        return facts


def to_json(value: Any, indent: int | None = None) -> str:
    """Strict JSON, which any program parses: a non-finite figure (a NaN loss) is the string "nan", "inf" or "-inf"
    (Python's json would write NaN, which JSON has not)."""

    def finite(item: Any) -> Any:
        if isinstance(item, float) and not math.isfinite(item):
            return str(item)
        if isinstance(item, dict):
            return {key: finite(inner) for key, inner in item.items()}
        if isinstance(item, (list, tuple)):
            return [finite(inner) for inner in item]
        return item

    return json.dumps(finite(value), indent=indent, sort_keys=True, allow_nan=False)


class RowPicture(TypedDict, total=False):
    """A row of a batch as the model is fed it (`report.pictures`)."""

    #: Its tokens in words (padding left out), at most `report.pictures.TOKENS` of them.
    tokens: list[str]
    #: Which tokens are trained (a label other than -100 at their position).
    trained: list[bool]
    #: The row's target where it is not one per token: a class, a score, a decoded target sequence.
    target: str
    #: The prompt inference gives the model for the same conversation, in words.
    asked: list[str]
    #: How many tokens were left out at the end.
    cut: int


class Attempt(TypedDict):
    """One try at overfitting the fixed batch: its learning rate, the loss before and after, the loss at each step."""

    rate: float
    before: float
    after: float
    curve: list[float]


class LossCurve(TypedDict):
    """The overfit stage's tries: what the loss is of (`what`), and each try."""

    what: str
    tries: list[Attempt]


class EvaluationMemory(TypedDict):
    """What an evaluation gathers for compute_metrics, in bytes, over how many rows."""

    gathered: int
    peak: int
    rows: int


class MemoryPicture(TypedDict, total=False):
    """One training step's memory by part, its peak, the GPU's budget, and what a real step measured, in bytes."""

    parts: dict[str, int]
    peak: int
    budget: int | None
    measured: int
    evaluation: EvaluationMemory


class RewardsPicture(TypedDict):
    """An online RL batch's rewards, group by group (one group per prompt), in total and per reward function (None: a
    reward the trainer left missing), and which completions ended."""

    total: list[list[float | None]]
    functions: dict[str, list[list[float | None]]]
    ended: list[bool]


class Pictures(TypedDict, total=False):
    """What a stage drew for the reports, by name."""

    rows: list[RowPicture]
    asked: list[RowPicture]
    loss_curve: LossCurve
    memory: MemoryPicture
    rewards: RewardsPicture

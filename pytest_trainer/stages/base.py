"""What a stage is: its declaration (`Stage`, one per stage module) and what it produces (`StageResult`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_trainer.devices import DEVICES
from pytest_trainer.schema import Measured, Pictures

if TYPE_CHECKING:
    from pytest_trainer.diagnosis import TrainerError
    from pytest_trainer.families import Family
    from pytest_trainer.pipeline import Pipeline
    from pytest_trainer.tasks import Task

E = TypeVar("E", bound="TrainerError")
M = TypeVar("M", bound=Measured)


@dataclass
class StageResult:
    """What a stage produced, for the user's own assertions and for the report."""

    stage: str
    device: str
    batch: dict[str, Any] | None = None
    outputs: Any = None
    loss: float | None = None
    gradients: dict[str, Any] | None = None
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: What the reports draw, as JSON values by name (`schema.Pictures`): see `report.pictures`.
    pictures: Pictures = field(default_factory=lambda: Pictures())
    #: What later stages read of this one, typed (`schema`); its numbers are in `figures` too, for the reports.
    measured: Measured | None = None

    def __post_init__(self) -> None:
        if self.measured is not None:
            self.figures = {**self.measured.figures(), **self.figures}

    def measured_as(self, kind: type[M]) -> M:
        """What this stage measured, as the `schema` class `kind` its stage returns."""
        if not isinstance(self.measured, kind):
            raise TypeError(f"the {self.stage} stage measured {self.measured!r}, not {kind.__name__}")
        return self.measured


Check = Callable[["Pipeline", str], StageResult]


def with_pictures(failure: E, result: StageResult) -> E:
    """`failure`, carrying what `result` had drawn before it was found (the curve that did not fall, say)."""
    failure.pictures.update(result.pictures)
    return failure


def everywhere(task: Task, family: Family) -> str | None:
    """A stage that applies to every task and every trainer family."""
    return None


def row_by_row(task: Task, family: Family) -> str | None:
    """Why rows cannot be cut and padded one by one, or None: the model takes a token sequence and the trainer
    batches rows (the `lengths` and `padding` properties)."""
    return family.builds_own_batches or task.no_sequence()


@dataclass(frozen=True)
class Stage:
    """A stage as its module declares it: `STAGE = Stage(...)`. The plan orders stages and items from these alone."""

    name: str
    #: Where it runs among the stages of a device: after every stage of a lower rank.
    rank: int
    #: Checks the pipeline on a device; raises a failure with cause and fix, or returns what it produced.
    run: Check
    #: The stages whose failure makes this one meaningless: it is then skipped as blocked, not failed again.
    needs: tuple[str, ...] = ()
    #: The devices it can run on.
    devices: tuple[str, ...] = DEVICES
    #: Why its result is the same on every device (it reads the data, or writes files): it runs on the first device
    #: selected only and skips on the others with this reason. Empty: it runs on every device.
    same_on_every_device: str = ""
    #: The setting that turns it on (a stage only some runs want); None: it runs unless --trainer-stages leaves it out.
    opt_in: str | None = None
    #: The first item of a script, once, on its first device (the script's load): every other item needs it.
    first: bool = False
    #: Why it does not apply to a task or a trainer family (the item is skipped with that reason), or None.
    applies: Callable[[Task, Family], str | None] = everywhere
    #: Why it has nothing to check in this run and could only report (a forecast with no budget to hold it to), or
    #: None. Such an item is skipped with that reason unless the stage was named (--trainer-stages, a marker).
    idle: Callable[[Pipeline], str | None] | None = None

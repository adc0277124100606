"""What stages hand later stages and the reports, typed: the figures a stage measured.

A stage that measures what another reads (forward's loss at init, backward's gradient norm, overfit's loss curve)
returns it as one of these classes in `StageResult.measured`; the reader takes the attribute, never a string key.
`StageResult.figures` holds the same numbers by name (and any other figure a stage adds) for the JSON and HTML reports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


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

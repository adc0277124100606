"""What makes a loss trainable: one finite number attached to the model, over at least one supervised target.

Shared by every stage that takes a loss (forward, the training run, the property stages).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis
from pytest_trainer.catalogue import RUN, checks
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    import torch

    from pytest_trainer.tasks import Task


def has_targets(batch: dict[str, Any], task: Task) -> bool:
    """Whether the batch supervises any position: a loss over no target is NaN by definition, not a bug."""
    import torch

    labels = batch.get("labels")
    if not torch.is_tensor(labels) or labels.dtype.is_floating_point:
        return True
    if task.shifts_labels and labels.dim() >= 2:
        labels = labels[..., 1:]
    return bool((labels != IGNORE_INDEX).any())


@checks("forward", "labels", "lengths", reads=RUN)
def checked_loss(loss: torch.Tensor | None) -> float:
    """The loss as a number, or a failure saying why it cannot be trained on."""
    import torch

    if loss is None:
        raise diagnosis.PipelineFailure(
            "compute_loss returned None instead of a loss tensor",
            "return the loss tensor from compute_loss (and give the model labels)",
        )
    if not torch.is_tensor(loss) or loss.numel() != 1:
        shape = list(loss.shape) if torch.is_tensor(loss) else type(loss).__name__
        raise diagnosis.PipelineFailure(
            f"the loss is not a scalar (shape {shape}), so backward() cannot start from it",
            "reduce it to one number in compute_loss, e.g. loss.mean()",
        )
    value = float(loss.detach().float().item())
    if not math.isfinite(value):
        raise diagnosis.PipelineFailure(
            f"the loss on the first batch is {value} before any training step",
            "look for NaN or infinite values in the inputs or labels, and for a custom loss that divides by zero "
            "or takes the log of 0",
        )
    return value


def detached_loss() -> diagnosis.PipelineFailure:
    return diagnosis.PipelineFailure(
        "the loss is detached from the model (it has no grad_fn), so backward() reaches no parameter",
        "compute the loss from the model's outputs without torch.no_grad(), .detach(), .item() or "
        "numpy in between, and return that tensor from compute_loss",
    )

"""`forward`: the model on the device takes the batch and returns a finite scalar loss."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, model_facts, tasks
from pytest_trainer.stages import StageResult

if TYPE_CHECKING:
    import torch

    from pytest_trainer.pipeline import Pipeline
    from pytest_trainer.tasks import Task


def run(pipeline: Pipeline, device: str) -> StageResult:
    model = pipeline.model_on(device)
    batch = pipeline.batch_on(device)
    loss, outputs = pipeline.eval_loss(model, batch)
    value = checked_loss(loss)
    pipeline.remember_starting_loss(device, value)
    result = StageResult("forward", device, batch=batch, outputs=outputs, loss=value, figures={"loss_at_init": value})
    if pipeline.task.labels == tasks.PREFERENCE:
        check_preference(pipeline, result)
    classes = model_facts.class_count(model)
    if classes:
        result.notes.append(f"loss at init {value:.3f}; a fresh {classes}-class head gives about ln {classes} = "
                            f"{math.log(classes):.3f}")
    return result


def check_preference(pipeline: Pipeline, result: StageResult) -> None:
    """A preference batch gives finite log-probabilities of the chosen and the rejected answers."""
    figures = tasks.preference_figures(pipeline.trainer)
    result.figures.update(figures)
    broken = {name: value for name, value in figures.items() if not math.isfinite(value)}
    if broken:
        raise diagnosis.PipelineFailure(
            f"the preference batch gives non-finite figures: {broken}",
            "look for empty chosen or rejected answers after truncation (max_length, max_prompt_length) and for "
            "rows whose answer tokens are all masked",
        )
    if figures:
        shown = ", ".join(f"{name} {value:.4g}" for name, value in sorted(figures.items()) if "logps" in name)
        result.notes.append(f"preference batch: {shown}")


def has_targets(batch: dict[str, Any], task: Task) -> bool:
    """Whether the batch supervises any position: a loss over no target is NaN by definition, not a bug."""
    import torch

    labels = batch.get("labels")
    if not torch.is_tensor(labels) or labels.dtype.is_floating_point:
        return True
    if task.shifts_labels and labels.dim() >= 2:
        labels = labels[..., 1:]
    return bool((labels != -100).any())


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

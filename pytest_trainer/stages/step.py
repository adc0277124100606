"""`step`: the Trainer's own optimizer and scheduler take one step that changes the weights."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis
from pytest_trainer.stages import StageResult
from pytest_trainer.stages.forward import checked_loss

if TYPE_CHECKING:
    import torch

    from pytest_trainer.pipeline import Pipeline


def fingerprints(parameters: Sequence[torch.Tensor]) -> list[tuple[float, float]]:
    """Two float64 sums per parameter: any update changes them, without keeping a copy of the weights."""
    import torch

    with torch.no_grad():
        return [(float(p.double().sum()), float(p.double().square().sum())) for p in parameters]


def at_peak_learning_rate(optimizer: Any) -> tuple[float, bool]:
    """Set every group to its peak learning rate; a warmup that starts at 0 must not hide it.

    Returns the peak and whether the schedule had started below it. A peak of 0 is a failure.
    """
    peak = max(group.get("initial_lr", group["lr"]) for group in optimizer.param_groups)
    if peak == 0:
        raise diagnosis.PipelineFailure(
            "the learning rate is 0, so no optimizer step can change the weights",
            "set learning_rate in TrainingArguments (fine-tuning usually takes 1e-5 to 5e-5)",
        )
    below = max(group["lr"] for group in optimizer.param_groups) < peak
    for group in optimizer.param_groups:
        group["lr"] = group.get("initial_lr", group["lr"])
    return peak, below


def one_step(
    pipeline: Pipeline, model: torch.nn.Module, batch: dict[str, Any], optimizer: Any, scheduler: Any
) -> float:
    """One training step as the Trainer takes it: loss, backward, optimizer and scheduler step; returns the loss."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = pipeline.loss(model, batch)[0]  # the outputs are dropped before backward, as in the Trainer's step
    value = checked_loss(loss)
    with diagnosis.pipeline_part("backward() through the model"):
        loss.backward()
    with diagnosis.pipeline_part("the optimizer's step"):
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return value


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    model = pipeline.model_on(device)
    batch = pipeline.batch_on(device)
    result = StageResult("step", device, batch=batch)
    with pipeline.weights_kept(model), pipeline.trainer_optimizer(model) as (optimizer, scheduler):
        peak, below = at_peak_learning_rate(optimizer)
        if below:
            result.notes.append(f"the schedule starts below its peak (warmup); the step used the peak {peak:g}")
        trainable = {name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad}
        before = dict(zip(trainable, fingerprints(list(trainable.values())), strict=True))
        result.loss = one_step(pipeline, model, batch, optimizer, scheduler)
        after = dict(zip(trainable, fingerprints(list(trainable.values())), strict=True))
        changed = [name for name in trainable if after[name] != before[name]]
        broken = [name for name, parameter in trainable.items() if not torch.isfinite(parameter.detach()).all()]
    if not changed:
        raise diagnosis.PipelineFailure(
            f"one optimizer step left all {len(trainable)} trainable parameters unchanged "
            f"(learning rate {peak:g})",
            "check learning_rate, the optimizer given to the Trainer, and that the loss depends on the parameters",
        )
    if broken:
        raise diagnosis.PipelineFailure(
            f"one optimizer step made {len(broken)} parameters non-finite (NaN or inf), e.g. {broken[0]}",
            "lower the learning rate, clip gradients (max_grad_norm), or look for NaN inputs",
        )
    result.figures.update({"learning_rate": float(peak), "parameters_changed": float(len(changed))})
    return result

"""`step`: the Trainer's own optimizer and scheduler take one step that changes the weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_trainer import diagnosis
from pytest_trainer.stages.base import Stage, StageResult
from pytest_trainer.training import non_finite

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline


def run(pipeline: Pipeline, device: str) -> StageResult:
    run = pipeline.trajectory(device, within=0)  # steps with the backward stage's gradients
    model = run.model
    result = StageResult("step", device, batch=run.batch)
    result.loss = run.step()
    if run.warmup:
        result.notes.append(f"the schedule starts below its peak (warmup); the step used the peak {run.peak:g}")
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    changed = pipeline.changed_weights(model)
    if not changed:
        raise diagnosis.PipelineFailure(
            f"one optimizer step left all {len(trainable)} trainable parameters unchanged "
            f"(learning rate {run.peak:g})",
            "check learning_rate, the optimizer given to the Trainer, and that the loss depends on the parameters",
        )
    broken = non_finite((name, parameter) for name, parameter in model.named_parameters() if parameter.requires_grad)
    if broken:
        raise diagnosis.PipelineFailure(
            f"one optimizer step made {len(broken)} parameters non-finite (NaN or inf), e.g. {broken[0]}",
            "lower the learning rate, clip gradients (max_grad_norm), or look for NaN inputs",
        )
    result.figures.update({"learning_rate": float(run.peak), "parameters_changed": float(len(changed))})
    return result


STAGE = Stage("step", rank=60, run=run, needs=("backward",))

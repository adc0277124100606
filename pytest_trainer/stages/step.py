"""`step`: the Trainer's own optimizer and scheduler take one step that changes the weights, and keeps its updates
(weights in bf16 or fp16 updated in place lose an update below half their rounding step); the learning rate over the
whole run reaches its peak and stays above 0 to the end (`schedules`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, schedules
from pytest_trainer.catalogue import RUN, checks
from pytest_trainer.stages.base import Stage, StageResult
from pytest_trainer.training import non_finite

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline

#: A step that leaves this share of the elements it pushed (a gradient other than 0) where they were spoils training.
LOST = 0.5
#: A tensor with this share of its pushed elements unchanged did not move.
STUCK = 0.9


def run(pipeline: Pipeline, device: str) -> StageResult:
    run = pipeline.fixed_batch_run(device, within=0)  # steps with the backward stage's gradients
    model = run.model
    result = StageResult("step", device, batch=run.batch)
    result.loss = run.step()
    if run.warmup:
        result.notes.append(f"the schedule starts below its peak (warmup); the step used the peak {run.peak:g}")
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    changed = pipeline.changed_weights(model)
    if not changed:
        raise diagnosis.PipelineFailure(
            f"one optimizer step left all {len(trainable)} trainable parameters unchanged (learning rate {run.peak:g})",
            "check learning_rate, the optimizer given to the Trainer, and that the loss depends on the parameters",
        )
    broken = non_finite((name, parameter) for name, parameter in model.named_parameters() if parameter.requires_grad)
    if broken:
        raise diagnosis.PipelineFailure(
            f"one optimizer step made {len(broken)} parameters non-finite (NaN or inf), e.g. {broken[0]}",
            "lower the learning rate, clip gradients (max_grad_norm), or look for NaN inputs",
        )
    result.figures.update({"learning_rate": float(run.peak), "parameters_changed": float(len(changed))})
    diagnosis.findings_last(
        [lambda: check_updates_kept(pipeline, model, run.peak, result), lambda: check_schedule(pipeline, model, result)]
    )
    return result


@checks("step", reads=RUN)
def check_schedule(pipeline: Pipeline, model: Any, result: StageResult) -> None:
    """The learning rate over the whole run: a warmup longer than the run, a scheduler made for fewer steps."""
    finding, notes = schedules.check(pipeline, model)
    result.notes.extend(notes)
    if finding is not None:
        raise finding


@checks("step", reads=RUN)
def check_updates_kept(pipeline: Pipeline, model: Any, rate: float, result: StageResult) -> None:
    """Weights held in bf16 or fp16 and updated in place keep an update only above half their rounding step (2**-8 of
    the weight in bf16): at fine-tuning rates most of them, and every norm weight near 1, never move."""
    unmoved = pipeline.unmoved_weights(model)
    pushed = sum(count for _, _, count in unmoved)
    if not pushed:
        return
    kept = sum(same for _, same, _ in unmoved)
    stuck = [(name, same / count) for name, same, count in unmoved if same >= STUCK * count]
    result.figures.update({"low_precision_updates_lost": kept / pushed})
    dtype = str(next(parameter.dtype for parameter in model.parameters() if parameter.requires_grad)).split(".")[-1]
    moved = (
        f"{len(stuck)} of {len(unmoved)} tensors did not move, e.g. {', '.join(name for name, _ in stuck[:3])}"
        if stuck
        else f"each of the {len(unmoved)} tensors moved somewhere"
    )
    line = (
        f"{kept} of {pushed} {dtype} weight elements with a gradient kept their value after one step at learning "
        f"rate {rate:g} ({moved})"
    )
    deepspeed = pipeline.asked_deepspeed.master_weights if pipeline.asked_deepspeed else None
    if deepspeed:  # this run steps the weights themselves: the script's does not
        line += (
            f"; the script trains with DeepSpeed in {deepspeed}, which steps float32 master copies of the weights, so "
            "its run keeps these updates"
        )
    if kept < LOST * pushed or deepspeed:
        result.notes.append(line)
        return
    raise diagnosis.Finding(
        f"{line}: the trainable weights are {dtype} and the optimizer updates them in place, so an update below half "
        f"a weight's rounding step ({dtype} keeps about {_digits(dtype)} significant bits) rounds away and training "
        "barely moves them",
        "keep the trainable weights in float32 (load the model with dtype=torch.float32, torch_dtype= before "
        "transformers 5, or call model.float()) "
        "and train with bf16=True: autocast computes in bf16 while the optimizer updates float32 weights; or use an "
        "optimizer that keeps float32 master weights",
    )


def _digits(dtype: str) -> int:
    return {"bfloat16": 8, "float16": 11}.get(dtype, 24)


STAGE = Stage("step", rank=60, run=run, needs=("backward",))

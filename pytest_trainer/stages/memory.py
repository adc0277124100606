"""`memory`: one training step and the evaluation fit in the GPU's memory, forecast without allocating it.

The forecast takes the script's own per-device batch size, the longest rows of its data as its collator
batches them, its optimizer, mixed precision, gradient checkpointing and adapters (see `memory_forecast`). The
evaluation's peak adds what the Trainer gathers for compute_metrics: every evaluation row's logits,
unless preprocess_logits_for_metrics reduces them or eval_accumulation_steps moves them off the GPU.
The budget is --trainer-gpu-memory, else the GPU present. Without either there is nothing to hold the forecast to:
the item is skipped with the reason, and runs to report the forecast alone when the stage is named. On CUDA the step
is also taken for real and its measured peak reported beside the forecast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_trainer import diagnosis, training
from pytest_trainer.schema import EvaluationMemory, MemoryPicture
from pytest_trainer.stages.base import Stage, StageResult, with_pictures

if TYPE_CHECKING:
    from pytest_trainer import memory_forecast
    from pytest_trainer.fed_data import FedSplit
    from pytest_trainer.pipeline import Pipeline

GIB = 2**30


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    from pytest_trainer import memory_forecast

    model = pipeline.model_on(device)
    args = pipeline.trainer.args
    result = StageResult("memory", device)
    per_device = int(args.per_device_train_batch_size)
    batch, length = longest_batch(pipeline, pipeline.training, per_device, device)
    mixed = pipeline.precision()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mixed or "")
    twin = _twin_trained(pipeline)
    if twin is not None:  # the twin's own step says nothing of the GPU the checkpoint needs
        try:
            step = memory_forecast.checkpoint_step(pipeline, twin, batch, dtype)
        except Exception as error:  # the twin's own step tells the pipeline's failure from the forecast's limit
            memory_forecast.training_step(pipeline, model, batch, dtype)
            pytest.skip(
                f"{twin.name} could not be forecast at full size on fake tensors ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}); its twin's step runs, and says nothing of the "
                "GPU the checkpoint needs"
            )
    else:
        step = memory_forecast.training_step(pipeline, model, batch, dtype)
    at = f"per_device_train_batch_size={per_device}" + (
        f" and the longest sequence of the data ({length} tokens)" if length else ""
    )
    if twin is not None:
        at = f"{twin.name}'s full size, {at}"
    result.figures.update(
        {
            "train_step_gib": step.peak / GIB,
            "sequence_length": float(length),
            **{f"{'_'.join(part.split())}_gib": value / GIB for part, value in step.parts.items()},
        }
    )
    budget = _budget(pipeline, device)
    fits = f", within the {memory_forecast.size(budget)} of GPU memory" if budget and step.peak <= budget else ""
    result.notes.append(  # said in the terminal too: the figure a budget is given for
        f"memory[{device}]: one training step at {at}{f' in {mixed}' if mixed else ''}: about {step.describe()}"
        f"{fits}, from {step.how}"
    )
    picture = result.pictures["memory"] = MemoryPicture(
        parts={part: int(value) for part, value in step.parts.items()},
        peak=int(step.peak),
        budget=int(budget) if budget else None,
    )
    sharding = sharded(pipeline)
    if sharding:
        result.notes.append(
            f"the forecast is of one GPU holding the whole training state; {sharding[0]} shards it over the "
            "processes, so each holds less"
        )
    over = bool(budget) and step.peak > budget
    held = _unsharded(step, sharding[1]) if sharding else step.peak
    if over and held > budget:
        kept = "its activations" + (
            " and its weights, which it keeps whole on each GPU," if sharding and sharding[1] else ""
        )
        cause = (
            f"one training step needs about {memory_forecast.size(held)} on each GPU at {at} even with "
            f"{sharding[0]}: {kept} are not sharded; more than the {memory_forecast.size(budget)} of GPU memory "
            f"(the whole step: {step.describe()})"
            if sharding
            else f"one training step needs about {memory_forecast.size(step.peak)} at {at}, more than the "
            f"{memory_forecast.size(budget)} of GPU memory: {step.describe()}"
        )
        raise with_pictures(
            diagnosis.PipelineFailure(
                cause,
                "lower per_device_train_batch_size and raise gradient_accumulation_steps to keep the effective batch, "
                "cap the sequence length (max_length), turn on gradient_checkpointing, train in bf16, or train "
                "adapters (LoRA) instead of every weight",
            ),
            result,
        )
    unknown = (
        [
            f"one GPU holding the whole training state needs about {memory_forecast.size(step.peak)} at {at}, more "
            f"than the {memory_forecast.size(budget)} of GPU memory ({step.describe()})"
        ]
        if over
        else []
    )
    evaluation = _evaluation(pipeline, model, step, device)
    if evaluation is not None:
        gathered, peak, rows, per_row = evaluation
        result.figures.update({"eval_gathered_gib": gathered / GIB, "eval_peak_gib": peak / GIB})
        picture["evaluation"] = EvaluationMemory(gathered=int(gathered), peak=int(peak), rows=int(rows))
        result.notes.append(
            f"evaluation gathers {memory_forecast.size(per_row)} of predictions per row for compute_metrics "
            f"({rows} rows here: {memory_forecast.size(gathered)} on the GPU)"
        )
        if budget and peak > budget and sharding and gathered <= budget:  # every process gathers them whole
            unknown.append(
                f"evaluation on one GPU holding the whole model needs about {memory_forecast.size(peak)}, of which "
                f"{memory_forecast.size(gathered)} are the predictions gathered for compute_metrics"
            )
        elif budget and peak > budget:
            raise with_pictures(
                diagnosis.PipelineFailure(
                    f"evaluation keeps the predictions of every row on the GPU for compute_metrics: {rows} rows x "
                    f"{memory_forecast.size(per_row)} = {memory_forecast.size(gathered)} beside the model and its "
                    "optimizer state, "
                    f"{memory_forecast.size(peak)} in all, more than the {memory_forecast.size(budget)} of GPU memory",
                    "reduce the logits before they are gathered with preprocess_logits_for_metrics (e.g. return "
                    "logits.argmax(-1)), or set eval_accumulation_steps to move them to the CPU every few batches",
                ),
                result,
            )
    if unknown and sharding:
        pytest.skip(
            f"{'; '.join(unknown)}; the script shards the training state with {sharding[0]} over its processes, and "
            f"what each of them holds is not forecast (its activations alone take about {memory_forecast.size(held)})"
        )
    if device == "cuda" and twin is not None:
        result.notes.append("not measured on this GPU: the model here is the twin, not the checkpoint")
    elif device == "cuda":
        measured = _measured_step(pipeline, model, batch, dtype)
        result.figures["train_step_measured_gib"] = measured / GIB
        picture["measured"] = int(measured)
        result.notes.append(
            f"measured on this GPU: {memory_forecast.size(measured)} (forecast {memory_forecast.size(step.peak)})"
        )
    if pipeline.settings.batch_size:
        result.notes.append("the batch size is the one --trainer-batch-size sets, not the script's")
    return result


def _twin_trained(pipeline: Pipeline) -> Any:
    """The twin that stands for the model the Trainer trains, or None where that model is the script's own."""
    from pytest_trainer import model_facts

    trained = type(model_facts.base_model(pipeline.model)).__name__
    return next((twin for twin in pipeline.twins if twin.model_class == trained and twin.builder is not None), None)


def longest_batch(pipeline: Pipeline, split: FedSplit, rows: int, device: str) -> tuple[dict[str, Any], int]:
    """A batch of the `rows` longest rows read of `split`, made by the Trainer's collator; and its length."""
    import numpy as np
    import torch

    from pytest_trainer import tables

    table = split.table
    column = pipeline.task.sequence
    count = table.num_rows
    if column is not None and column in table.column_names and tables.depth(table.schema.field(column).type) > 0:
        lengths = tables.row_lengths(table, column)
        indices = sorted(int(index) for index in np.argsort(-lengths, kind="stable")[:rows])
    else:
        indices = list(range(min(rows, count)))
    while len(indices) < rows and count:  # a split smaller than one batch is repeated, as training would not
        indices.append(indices[len(indices) % count])
    batch = pipeline.batches.collate([dict(row) for row in split.samples(indices)], device)
    found = batch.get(column) if column else None
    length = int(found.shape[-1]) if torch.is_tensor(found) and found.dim() > 1 else 0
    return batch, length


def idle(pipeline: Pipeline) -> str | None:
    """Why the forecast has no budget to be held to on this machine, or None."""
    if _budget(pipeline, "cpu"):
        return None
    return (
        "no GPU memory to forecast against: give the GiB of the GPU you train on with --trainer-gpu-memory=GIB "
        "to check that a training step fits it (--trainer-stages=memory reports the forecast alone)"
    )


def sharded(pipeline: Pipeline) -> tuple[str, bool] | None:
    """How the script shards its training state over its processes (FSDP, DeepSpeed's ZeRO), whether or not this
    machine runs it, and whether each process still holds the whole weights (ZeRO stages 1 and 2); None where each
    holds all of it."""
    if pipeline.asked_fsdp is not None or getattr(pipeline.trainer.args, "fsdp", None):
        return "FSDP", False
    stage = pipeline.asked_deepspeed.stage if pipeline.asked_deepspeed else 0
    return (f"DeepSpeed's ZeRO stage {stage}", stage < 3) if stage >= 1 else None


def _unsharded(step: memory_forecast.Forecast, whole_weights: bool) -> int:
    """What each process holds of a step however many share it: the activations (the step's transient memory but its
    gradients) and buffers, and the weights where the sharding keeps them whole."""
    transient = max(0, step.parts.get("activations and gradients", 0) - step.gradients)
    return transient + step.parts.get("buffers", 0) + (step.parts.get("weights", 0) if whole_weights else 0)


def _budget(pipeline: Pipeline, device: str) -> int:
    """Bytes of GPU memory to forecast against: the option, else the GPU present, else 0 (report only)."""
    import torch

    if pipeline.settings.gpu_memory:
        return int(pipeline.settings.gpu_memory * GIB)
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(torch.device(device if device == "cuda" else "cuda")).total_memory)
    return 0


def _evaluation(
    pipeline: Pipeline, model: Any, step: memory_forecast.Forecast, device: str
) -> tuple[int, int, int, int] | None:
    """(bytes gathered, peak bytes, rows, bytes per row) of an evaluation that gathers predictions, else None."""
    from pytest_trainer import memory_forecast

    trainer, args = pipeline.trainer, pipeline.trainer.args
    if trainer.compute_metrics is None or args.prediction_loss_only:
        return None
    split = next((split for split in pipeline.splits if split.description != "training"), None)
    if split is None or not len(split):
        return None
    per_device = int(args.per_device_eval_batch_size)
    batch, _ = longest_batch(pipeline, split, per_device, device)
    per_row = memory_forecast.eval_outputs_per_row(pipeline, model, batch, device)
    try:  # the Trainer gathers every row of the split, not only the ones the plugin read
        rows = len(split.given)
    except TypeError:  # a stream: the rows read
        rows = len(split)
    if args.eval_accumulation_steps:
        rows = min(rows, int(args.eval_accumulation_steps) * per_device)
    gathered = per_row * rows
    resident = sum(step.parts.get(part, 0) for part in ("weights", "buffers", "optimizer state"))
    return gathered, resident + gathered, rows, per_row


def _measured_step(pipeline: Pipeline, model: Any, batch: dict[str, Any], dtype: Any) -> int:
    """The peak memory the CUDA allocator saw in a real second training step of the batch."""
    import torch

    with pipeline.weights_kept(model), training.trainer_optimizer(pipeline.trainer, model) as (optimizer, _):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            training.one_step(pipeline.loss_only, model, batch, optimizer, None)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()  # with what is on the GPU beside the step (a copy of the weights)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            training.one_step(pipeline.loss_only, model, batch, optimizer, None)
        torch.cuda.synchronize()
        resident = {id(t): t for t in [*model.parameters(), *model.buffers()] if t.is_cuda}
        resident.update(
            {id(t): t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t) and t.is_cuda}
        )
        held = sum(t.numel() * t.element_size() for t in resident.values())
        return held + int(torch.cuda.max_memory_allocated()) - before


STAGE = Stage("memory", rank=110, run=run, needs=("step",), idle=idle)

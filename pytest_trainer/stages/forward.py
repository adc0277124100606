"""`forward`: the model on the device takes the batch and returns a finite scalar loss; in a packed batch, each
document's logits are those it gets alone (documents kept apart)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pytest_trainer import schema
from pytest_trainer.losses import checked_loss
from pytest_trainer.stages.base import Stage, StageResult
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline


def run(pipeline: Pipeline, device: str) -> StageResult:
    model = pipeline.model_on(device)
    batch = pipeline.batches.first_on(device)
    loss, outputs = pipeline.eval_loss(model, batch)
    value = checked_loss(loss)
    pipeline.remember_starting_loss(device, value)
    result = StageResult("forward", device, batch=batch, outputs=outputs, loss=value, measured=schema.Forward(value))
    figures, notes = pipeline.family.after_forward(pipeline.trainer)  # what the trainer logged of the batch
    result.figures.update(figures)
    result.notes.extend(notes)
    classes = pipeline.task.classes
    if classes:
        result.notes.append(
            f"loss at init {value:.3f}; a fresh {classes}-class head gives about ln {classes} = {math.log(classes):.3f}"
        )
    from pytest_trainer.asked import packing

    checkpointing = bool(getattr(pipeline.trainer.args, "gradient_checkpointing", False))
    apart = packing.check_documents_apart(model, batch, checkpointing)
    if apart:
        result.notes.append(apart)
    elif pipeline.task.shifts_labels and not pipeline.family.builds_own_batches:
        unmarked = _unmarked_documents(pipeline, model, device)
        if unmarked:
            result.notes.append(unmarked)
    return result


def _unmarked_documents(pipeline: Pipeline, model: Any, device: str) -> str | None:
    """Two training samples collated alone: packed into one sequence with no boundary, the second sees the first."""
    from pytest_trainer import fed_data
    from pytest_trainer.asked import packing

    found = pipeline.batches.spread(2)
    if len(found) != 1 or fed_data.packed(found[0][1], len(found[0][0])) is None:
        return None
    samples, batch, stored = found[0]
    conversations = any(
        isinstance(row, dict) and (row.get("messages") or row.get("completion")) for row in stored
    ) or any(_answers_a_prompt(sample) for sample in samples)
    return packing.check_unmarked_documents(model, samples, fed_data.moved(batch, device), conversations)


STAGE = Stage("forward", rank=40, run=run, needs=("collate",))


def _answers_a_prompt(sample: dict[str, Any]) -> bool:
    """Whether a sample's labels leave a prompt out (-100 first, then trained tokens): an example of its own."""
    labels: Any = sample.get("labels")
    listed = labels.tolist() if hasattr(labels, "tolist") else labels
    return (
        isinstance(listed, list)
        and len(listed) > 1
        and listed[0] == IGNORE_INDEX
        and any(label != IGNORE_INDEX for label in listed if isinstance(label, int))
    )

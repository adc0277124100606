"""`padding` (property): padding an example inside a batch does not change what the model computes for it.

A real row, cut shorter, is batched by the Trainer's own collator beside a longer row; the padded
row is then compared, in eval mode, with the same row without its padding (taken from that same
batch, so any random masking is held fixed). Logits at its real positions and its loss must agree
within TOLERANCE. Finds a missing attention_mask, labels on padding that are not -100, and a
padding side that shifts positions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_trainer import diagnosis, model_facts
from pytest_trainer.catalogue import TEMPLATE, checks
from pytest_trainer.losses import has_targets
from pytest_trainer.stages.base import Stage, StageResult, row_by_row
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    from pytest_trainer.families import Family
    from pytest_trainer.pipeline import Pipeline
    from pytest_trainer.tasks import Task

#: Largest difference allowed between padded and unpadded outputs, relative to the largest logit (at
#: least 1): float32 noise between sequence lengths is far below it, leaked padding far above it.
TOLERANCE = 1e-4


def run(pipeline: Pipeline, device: str) -> StageResult:
    from pytest_trainer import fed_data, strategies
    from pytest_trainer.property_runs import search

    if pipeline.family.padded_by_library:
        pipeline.model_on(device).eval()
        return StageResult(
            "padding", device, notes=[pipeline.family.check_padding(pipeline.trainer, pipeline.training) or ""]
        )
    strategies.require_sequences(pipeline)
    model_input = pipeline.task.sequence or ""
    check_pad_token(pipeline)
    if len(pipeline.training) >= 2:
        how = fed_data.packed(pipeline.batches.collate(pipeline.batches.rows([0, 1]), "cpu"), 2)
        if how is not None:
            pytest.skip(f"the collator packs rows into one sequence ({how}): no row is padded beside another")
    model = pipeline.model_on(device)
    model.eval()
    padded = [0]
    refused: list[str] = []

    def invariant(example: tuple[int, int, int]) -> None:
        short, longer, cut = example
        features = pipeline.batches.rows([short, longer])
        features[0] = strategies.resize(features[0], cut, pipeline)
        try:
            batch = pipeline.batches.collate(features, device)
        except (ValueError, RuntimeError, TypeError) as error:  # a collator that does not pad rows of other lengths
            refused.append(
                f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            )
            return
        padded[0] += compare(pipeline, model, batch, model_input, short, cut)

    key = f"{pipeline.name}::padding[{device}]"
    search(strategies.padding_pairs(pipeline), invariant, key, pipeline.settings.examples)
    if not padded[0] and refused:
        pytest.skip(
            f"the collator does not pad: it refuses a row cut shorter beside a longer one ({refused[0]}), so every "
            "row it batches in training has one length and no padding is fed to the model"
        )
    if not padded[0]:
        pytest.skip("no row drawn was padded beside a longer one: the training rows leave no length to vary")
    return StageResult("padding", device)


@checks("padding", reads=TEMPLATE)
def check_pad_token(pipeline: Pipeline) -> None:
    """The model must know the tokenizer's pad id: some models find the end of the text by it."""
    tokenizer = getattr(pipeline.trainer, "processing_class", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    configured = getattr(getattr(pipeline.model, "config", None), "pad_token_id", None)
    if isinstance(pad, int) and isinstance(configured, int) and pad != configured:
        raise diagnosis.PipelineFailure(
            f"the model's config.pad_token_id is {configured} but the tokenizer pads with {pad}: the model "
            "takes the padding for text (a GPT-2-style classifier even reads its prediction off a pad token)",
            "model.config.pad_token_id = tokenizer.pad_token_id before building the Trainer",
        )


def compare(pipeline: Pipeline, model: Any, batch: dict[str, Any], model_input: str, row: int, length: int) -> bool:
    """Whether the row was padded, and so compared with itself alone (a difference fails)."""
    import torch

    padded = {key: value[:1] if torch.is_tensor(value) else value for key, value in batch.items()}
    width = padded[model_input].shape[1]
    if width == length:
        return False
    real = _real_positions(padded, model_input, length, pipeline)
    task = pipeline.task
    alone = {
        key: value[:, real]
        if torch.is_tensor(value) and value.dim() >= 2 and value.shape[1] == width and task.along_sequence(key)
        else value
        for key, value in padded.items()
    }
    with torch.no_grad():
        padded_loss, padded_out = pipeline.loss(model, padded)
        alone_loss, alone_out = pipeline.loss(model, alone)
    padded_logits, alone_logits = model_facts.logits_of(padded_out), model_facts.logits_of(alone_out)
    if padded_logits is not None and alone_logits is not None:
        if padded_logits.dim() >= 3 and padded_logits.shape[1] == width and task.along_sequence("labels"):
            padded_logits = padded_logits[:, real]
        gap = float((padded_logits.float() - alone_logits.float()).abs().max())
        if gap > model_facts.output_tolerance(model, TOLERANCE) * max(1.0, float(alone_logits.float().abs().max())):
            raise _changed(pipeline, padded, model_input, row, length, width, f"logits differ by {gap:.3g}")
    if padded_loss is not None and alone_loss is not None and has_targets(alone, pipeline.task):
        gap = abs(float(padded_loss) - float(alone_loss))
        if gap > model_facts.output_tolerance(model, TOLERANCE) * max(1.0, abs(float(alone_loss))):
            raise _changed(
                pipeline,
                padded,
                model_input,
                row,
                length,
                width,
                f"the loss differs ({float(alone_loss):.5g} alone, {float(padded_loss):.5g} padded)",
            )
    return True


def _real_positions(padded: dict[str, Any], model_input: str, length: int, pipeline: Pipeline) -> Any:
    import torch

    mask = padded.get("attention_mask")
    if mask is not None and int(mask[0].sum()) == length:
        return mask[0].bool()
    width = padded[model_input].shape[1]
    left = getattr(getattr(pipeline.trainer, "processing_class", None), "padding_side", "right") == "left"
    positions = torch.zeros(width, dtype=torch.bool, device=padded[model_input].device)
    positions[width - length :] = left
    positions[:length] = not left
    return positions


def _changed(
    pipeline: Pipeline, padded: dict[str, Any], model_input: str, row: int, length: int, width: int, what: str
) -> diagnosis.PipelineFailure:
    mask = padded.get("attention_mask")
    text = pipeline.decoded(padded[model_input][0][mask[0].bool()].tolist() if mask is not None else [])
    cut = f"{length} token" if length == 1 else f"{length} tokens"
    where = f"row {row} cut to {cut} gives other results alone and padded to {width} beside a longer row"
    labels = padded.get("labels") if pipeline.task.along_sequence("labels") else None
    tokenizer = getattr(pipeline.trainer, "processing_class", None)
    if "attention_mask" not in padded:
        cause, fix = (
            "the batch has no attention_mask, so the model attends to the padding",
            ("return attention_mask from the tokenizer and keep it through the collator"),
        )
    elif (
        labels is not None
        and labels.dim() >= 2
        and labels.shape[1] == width
        and bool((labels[0][padded["attention_mask"][0] == 0] != IGNORE_INDEX).any())
    ):
        pad_labels = sorted({int(v) for v in labels[0][padded["attention_mask"][0] == 0].tolist()})
        cause, fix = (
            f"labels on padded positions are {pad_labels}, not -100, so the loss counts the padding",
            (
                "pad labels with -100 (DataCollatorForTokenClassification and DataCollatorForSeq2Seq do, "
                "label_pad_token_id=-100)"
            ),
        )
    elif (
        getattr(tokenizer, "padding_side", "right") == "left"
        and what.startswith("the loss")
        and pipeline.task.shifts_labels
    ):
        cause, fix = (
            (
                "the tokenizer pads on the left, so the first real token keeps its label and is predicted "
                "from a pad position: each padded row trains one more prediction, made without any context"
            ),
            ("pad on the right for training: tokenizer.padding_side = 'right' (left padding is for generation)"),
        )
    elif getattr(tokenizer, "padding_side", "right") == "left":
        cause, fix = (
            "the tokenizer pads on the left, which shifts this model's positions",
            ("pad on the right for training: tokenizer.padding_side = 'right'"),
        )
    else:
        cause, fix = (
            "padding changes the model's outputs",
            ("make padded positions invisible to the model (attention_mask) and to the loss (labels -100)"),
        )
    details = [f"shortest failing row as text: {text!r}"] if text else []
    return diagnosis.PipelineFailure(f"{where}: {what}; {cause}", fix, details)


def applies(task: Task, family: Family) -> str | None:
    if family.padded_by_library:
        return None
    reason = row_by_row(task, family)
    if reason is None and task.positions:
        return (
            "question answering: the softmax over answer positions spans the padding too (transformers' QA "
            "heads do not mask it), so padded and unpadded losses differ by design"
        )
    if reason is None and task.nested:
        return (
            "multiple choice pads every choice of a row to one length: the padding property does not cover a "
            "choices axis"
        )
    return reason


STAGE = Stage("padding", rank=140, run=run, needs=("forward",), applies=applies)

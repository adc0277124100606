"""`labels` (property): every value of the label domain is accepted by the model's loss.

The first batches rarely contain every class; a class the split never showed, or a ClassLabel with
more names than the head has outputs, crashes training much later. Values are drawn from the
domain, put on real rows, batched by the Trainer's collator and run through the forward pass: all of them
in batches of the training batch size, and one by one (to shrink) only when that fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_trainer import diagnosis, model_facts
from pytest_trainer.catalogue import MODEL, checks
from pytest_trainer.losses import checked_loss, has_targets
from pytest_trainer.stages.base import Stage, StageResult
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    from pytest_trainer import strategies
    from pytest_trainer.families import Family
    from pytest_trainer.pipeline import Pipeline
    from pytest_trainer.tasks import Task


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch
    from hypothesis import strategies as st

    from pytest_trainer import strategies
    from pytest_trainer.property_runs import search

    domain = strategies.label_domain(pipeline)
    column = pipeline.label_column(pipeline.training.table)
    if pipeline.training.opaque and column is None:
        pytest.skip(
            f"the training samples cannot be read as columns ({', '.join(pipeline.training.opaque)}): "
            "their labels are out of the plugin's reach"
        )
    if domain is None or column is None:
        pytest.skip("the training data has no labels to vary (the collator or the loss makes its own)")
    check_domain_fits_head(pipeline, domain)
    model = pipeline.model_on(device)
    model.eval()

    def loss_of(examples: list[tuple[Any, int]]) -> None:
        features = pipeline.batches.rows([row for _, row in examples])
        for feature, (value, _) in zip(features, examples, strict=True):
            feature[column] = _relabel(feature[column], value)
        batch = pipeline.batches.collate(features, device)
        with torch.no_grad():
            loss, _ = pipeline.loss_only(model, batch)
        if has_targets(batch, pipeline.task):
            checked_loss(loss)

    def accepts(example: tuple[Any, int]) -> None:
        try:
            loss_of([example])
        except Exception as error:
            if not diagnosis.owned_by_pipeline(error):
                raise
            raise _rejected(pipeline, domain, *example, error) from error

    def all_accepted(examples: list[tuple[Any, int]]) -> bool:
        size = max(1, int(pipeline.trainer.args.train_batch_size))  # batches as large as training's
        try:
            for start in range(0, len(examples), size):
                loss_of(examples[start : start + size])
        except Exception as error:
            if not diagnosis.owned_by_pipeline(error):
                raise
            return False
        return True

    search(
        st.tuples(strategies.label_values(pipeline), strategies.rows(pipeline)),
        accepts,
        f"{pipeline.name}::labels[{device}]",
        pipeline.settings.examples,
        all_accepted,
    )
    return StageResult("labels", device, figures={"label_values": float(len(domain.values))})


@checks("labels", reads=MODEL)
def check_domain_fits_head(pipeline: Pipeline, domain: strategies.LabelDomain) -> None:
    """Integer class ids of the domain fit the head's width and its id2label."""
    width = pipeline.task.classes
    if width is None or not all(isinstance(value, int) for value in domain.values):
        return
    high = max(domain.values)
    if high >= width:
        from pytest_trainer.fed_checks import labels_beyond_head

        raise labels_beyond_head(
            min(domain.values),
            high,
            width,
            f", from {domain.source}",
            pipeline.task.auto_class,
            model_facts.built_from_config(pipeline.model),
        )
    id2label = getattr(pipeline.model.config, "id2label", None) or {}
    if id2label and len(id2label) != width:
        raise diagnosis.PipelineFailure(
            f"the model's id2label names {len(id2label)} classes but its head has {width} outputs",
            f"build the model with num_labels={width} and an id2label of {width} entries (or neither)",
        )


def _relabel(current: Any, value: Any) -> Any:
    """Put `value` on a sample: every labelled position of a token-level label, or the label itself."""
    if isinstance(current, list):
        return [item if item == IGNORE_INDEX else value for item in current]
    return value


def _rejected(
    pipeline: Pipeline, domain: strategies.LabelDomain, value: Any, row: int, error: Exception
) -> diagnosis.PipelineFailure:
    from pytest_trainer.explanations import pipeline_rows

    explained = pipeline_rows.explain(error, pipeline)
    if explained is not None and "problem_type" in explained.cause:
        return diagnosis.PipelineFailure(f"label {value!r} (row {row}): {explained.cause}", explained.fix)
    config = getattr(pipeline.model, "config", None)
    width = pipeline.task.classes or getattr(config, "num_labels", None)
    message = str(error)
    return diagnosis.PipelineFailure(
        f"label {value!r} of the domain {domain.describe()} is rejected by the loss on row {row}: "
        f"the model's head has {width} outputs ({type(error).__name__}: {message.splitlines()[0] if message else ''})",
        f"build the model with num_labels={max(domain.values) + 1} (classes 0..{max(domain.values)})"
        if all(isinstance(v, int) for v in domain.values)
        else "make the labels fit the model's head",
    )


def applies(task: Task, family: Family) -> str | None:
    return task.not_classes()


STAGE = Stage("labels", rank=120, run=run, needs=("forward",), applies=applies)

"""`dataset`: every row of every split, as the Trainer will feed it, fits the model.

The checks themselves are in `fed_checks`, shared with the `eval` stage, which runs them on every evaluation split.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_trainer.stages.base import Stage, StageResult

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline


def run(pipeline: Pipeline, device: str) -> StageResult:
    """Check the training split; the evaluation splits get the same checks at the `eval` stage."""
    from pytest_trainer import fed_checks

    split = pipeline.training
    notes: list[str] = []
    table = fed_checks.check_split(
        pipeline,
        split,
        lambda: fed_checks.check_labels_present(pipeline, split.table),
        lambda: fed_checks.check_labels_vary(pipeline, split),
        lambda: notes.extend(pipeline.family.check_training(pipeline.trainer, split)),
        lambda: notes.extend(_overlaps(pipeline)),
    )
    result = StageResult("dataset", device, figures={"rows_training": float(table.num_rows)})
    result.notes.append(f"task: {pipeline.task.name}")
    result.notes.extend(notes)
    if split.transformed:
        total = f" spread over its {len(split.dataset)} rows" if hasattr(split.dataset, "__len__") else ""
        result.notes.append(f"{table.num_rows} training samples read through the dataset's transform{total}")
        if split.whole.column_names:
            result.notes.append(f"read as stored over every row: {', '.join(split.whole.column_names)}")
    if split.opaque:
        result.notes.append(f"not checked (values Arrow cannot hold): {', '.join(split.opaque)}")
    return result


def _overlaps(pipeline: Pipeline) -> list[str]:
    """Notes of evaluation rows that are training rows; a finding where they spoil an evaluation split's metrics, which
    carries the notes of the other splits."""
    from pytest_trainer import diagnosis, metric_settings, overlap

    column = pipeline.task.sequence
    evaluation = [split for split in pipeline.splits if split.description != "training"]
    if column is None or not evaluation:
        return []
    trainer = pipeline.trainer
    targets = [*(getattr(trainer, "label_names", None) or ["labels"]), "label", "label_ids", *overlap.SUPERVISION]
    train_rows = overlap.fed(pipeline.training, column, targets)
    callbacks = list(getattr(getattr(trainer, "callback_handler", None), "callbacks", []))
    notes: list[str] = []
    findings: list[diagnosis.Finding] = []
    for split in evaluation:
        acting = metric_settings.acting(trainer.args, callbacks, split.key)
        try:
            notes += overlap.check(pipeline.training, train_rows, split, acting, pipeline.decoded)
        except diagnosis.Finding as finding:
            findings.append(finding)
    if findings:
        found = diagnosis.combined(findings)
        shown = [f"note: {note.removeprefix(overlap.SUMMARY).strip()}" for note in notes]
        raise diagnosis.Finding(found.cause, found.fix, [*found.details, *shown])
    return notes


STAGE = Stage("dataset", rank=10, run=run)

"""`dataset`: every row of every split, as the Trainer will feed it, fits the model.

The splits are read after the Trainer's own removal of unused columns. Each check covers the whole
split with Arrow, and names the first bad row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pytest_trainer import diagnosis, model_facts, tables
from pytest_trainer.stages import StageResult

if TYPE_CHECKING:
    import pyarrow as pa

    from pytest_trainer.pipeline import Pipeline

#: Label value that the losses of transformers ignore.
IGNORE_INDEX = -100


def run(pipeline: Pipeline, device: str) -> StageResult:
    """Check the training split; the evaluation splits get the same checks at the `eval` stage."""
    dataset = pipeline.trainer.train_dataset
    if dataset is None:
        raise diagnosis.PipelineFailure("the Trainer has no train_dataset", "pass train_dataset= to the Trainer")
    table = check_split(pipeline, "training", dataset)
    check_labels_present(pipeline, table)
    check_labels_vary(pipeline, table)
    return StageResult("dataset", device, figures={"rows_training": float(table.num_rows)})


def check_split(pipeline: Pipeline, description: str, dataset: object) -> pa.Table:
    """Every check that holds for any split; returns the split as fed, as an Arrow table."""
    table = _fed_table(pipeline, description, dataset)
    check_inputs(pipeline, description, dataset, table)
    check_finite(description, table)
    check_labels(pipeline, description, table)
    check_tokens(pipeline, description, table)
    check_token_labels(pipeline, description, table)
    return table


def _fed_table(pipeline: Pipeline, description: str, dataset: object) -> pa.Table:
    try:
        return pipeline.table(description, dataset)
    except ValueError as error:
        if "No columns in the dataset match" not in str(error):
            raise
        raw = tables.as_table(dataset, 1)
        text = [name for name in raw.column_names if tables.is_text(raw.schema.field(name).type)]
        model_input = model_facts.main_input(pipeline.model)
        failure = (
            diagnosis.untokenized(description, text, model_input)
            if text
            else diagnosis.missing_input(description, model_input, raw.column_names)
        )
        raise failure from error


def check_inputs(pipeline: Pipeline, description: str, dataset: object, table: pa.Table) -> None:
    """The model's main input is there, and no text reaches the collator."""
    model_input = model_facts.main_input(pipeline.model)
    if model_input not in table.column_names and "inputs_embeds" not in table.column_names:
        raw = tables.as_table(dataset, 1)
        text = [name for name in raw.column_names if tables.is_text(raw.schema.field(name).type)]
        if text:
            raise diagnosis.untokenized(description, text, model_input)
        raise diagnosis.missing_input(description, model_input, table.column_names)
    text = [name for name in table.column_names if tables.is_text(table.schema.field(name).type)]
    if text:
        raise diagnosis.PipelineFailure(
            f"text column(s) {', '.join(map(repr, text))} of the {description} dataset reach the collator, "
            "which can only batch numbers",
            f"drop them before building the Trainer (dataset.remove_columns({text!r})), "
            "or keep remove_unused_columns=True in TrainingArguments",
        )


def check_labels_present(pipeline: Pipeline, table: pa.Table) -> None:
    """A model trained with the Trainer's own loss needs labels, unless the collator makes them."""
    trainer = pipeline.trainer
    from transformers import DataCollatorWithPadding, Trainer, default_data_collator

    own_loss = type(trainer).compute_loss is Trainer.compute_loss and trainer.compute_loss_func is None
    plain_collator = trainer.data_collator is default_data_collator or isinstance(
        trainer.data_collator, DataCollatorWithPadding
    )
    takes_labels = "labels" in model_facts.forward_parameters(pipeline.model)
    if own_loss and plain_collator and takes_labels and pipeline.label_column(table) is None:
        raise diagnosis.PipelineFailure(
            f"the training dataset has no labels (columns: {', '.join(table.column_names)}), "
            "so the model returns no loss to train on",
            "keep the target column and name it 'labels' (or 'label'); for language modelling use "
            "DataCollatorForLanguageModeling, which makes labels from input_ids",
        )


def check_labels(pipeline: Pipeline, description: str, table: pa.Table) -> None:
    """Class ids fit the classification head: integers in [0, num_labels), or -100 to ignore a position."""
    width = model_facts.class_count(pipeline.model)
    column = pipeline.label_column(table)
    if width is None or column is None or table.num_rows == 0:
        return
    values, row_of = tables.flatten(table, column)
    if values.dtype.kind == "f":
        raise diagnosis.PipelineFailure(
            f"the {description} labels are floats but the model is a {width}-class classifier, which needs "
            "integer class ids (float labels make transformers switch to multi-label loss)",
            f"cast the label column to integers, e.g. dataset.cast_column({column!r}, Value('int64'))",
        )
    used = values[values != IGNORE_INDEX]
    if used.size == 0:
        return
    too_high = np.flatnonzero((values >= width) & (values != IGNORE_INDEX))
    if too_high.size:
        index = int(too_high[0])
        where = f" (row {row_of(index)} of the {description} dataset has label {values[index]})"
        auto_class = (
            "AutoModelForTokenClassification"
            if model_facts.is_token_classifier(pipeline.model)
            else "AutoModelForSequenceClassification"
        )
        raise diagnosis.labels_beyond_head(int(used.min()), int(used.max()), width, where, auto_class)
    negative = np.flatnonzero((values < 0) & (values != IGNORE_INDEX))
    if negative.size:
        index = int(negative[0])
        raise diagnosis.negative_label(int(values[index]), f" in row {row_of(index)} of the {description} dataset")


def check_tokens(pipeline: Pipeline, description: str, table: pa.Table) -> None:
    """Token ids are rows of the input embedding, and sequences fit the model's positions."""
    column = model_facts.main_input(pipeline.model)
    if column not in table.column_names or not tables.is_numeric(table.schema.field(column).type):
        return
    rows = model_facts.vocabulary_rows(pipeline.model)
    values, row_of = tables.flatten(table, column)
    if rows is not None and values.size and values.max() >= rows:
        index = int(np.argmax(values >= rows))
        raise diagnosis.token_beyond_vocabulary(
            int(values[index]), rows, f" in row {row_of(index)} of the {description} dataset"
        )
    limit = model_facts.position_limit(pipeline.model)
    if limit is None:
        return
    counts, row_of = tables.lengths(table, column)
    if counts.size and counts.max() > limit:
        index = int(np.argmax(counts > limit))
        raise diagnosis.sequence_too_long(
            int(counts[index]), limit, f" in row {row_of(index)} of the {description} dataset"
        )


def check_labels_vary(pipeline: Pipeline, table: pa.Table) -> None:
    """A classifier trained on one class only learns to predict that class."""
    column = pipeline.label_column(table)
    if model_facts.class_count(pipeline.model) is None or column is None or table.num_rows < 2:
        return
    values, _ = tables.flatten(table, column)
    used = np.unique(values[values != IGNORE_INDEX])
    if used.size == 1:
        raise diagnosis.PipelineFailure(
            f"every label of the training dataset is {used[0]}: the model can only learn to predict that class",
            "check the label column and any filtering, sorting or slicing that kept a single class",
        )


def check_finite(description: str, table: pa.Table) -> None:
    """NaN or infinite numbers in inputs or labels turn the loss into NaN at the first step that meets them."""
    for column in table.column_names:
        column_type = table.schema.field(column).type
        if not tables.is_numeric(column_type):
            continue
        values, row_of = tables.flatten(table, column)
        if values.dtype.kind != "f":
            continue
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            index = int(bad[0])
            raise diagnosis.PipelineFailure(
                f"column {column!r} of the {description} dataset holds {values[index]} in row {row_of(index)} "
                f"({bad.size} non-finite values in all): the loss becomes NaN where it meets them",
                "drop or repair those rows before training (dataset.filter(...))",
            )


def check_token_labels(pipeline: Pipeline, description: str, table: pa.Table) -> None:
    """In token classification, one label per token, and -100 on [CLS], [SEP] and padding."""
    column = pipeline.label_column(table)
    model_input = model_facts.main_input(pipeline.model)
    if column is None or model_input not in table.column_names or not model_facts.is_token_classifier(pipeline.model):
        return
    token_counts, _ = tables.lengths(table, model_input)
    label_counts, _ = tables.lengths(table, column)
    if token_counts.shape == label_counts.shape and (token_counts != label_counts).any():
        row = int(np.argmax(token_counts != label_counts))
        raise diagnosis.PipelineFailure(
            f"row {row} of the {description} dataset has {label_counts[row]} labels for {token_counts[row]} tokens: "
            "token-classification labels must be aligned with the tokens, not with the words",
            "align the labels with the tokens: use encoding.word_ids() to give each token its word's label "
            "(or -100), as in the token-classification example",
        )
    tokenizer = getattr(pipeline.trainer, "processing_class", None)
    special = getattr(tokenizer, "all_special_ids", None)
    if tokenizer is None or not special:
        return
    ids, row_of = tables.flatten(table, model_input)
    labels, _ = tables.flatten(table, column)
    if ids.shape != labels.shape:
        return
    wrong = np.flatnonzero(np.isin(ids, special) & (labels != IGNORE_INDEX))
    if wrong.size:
        index = int(wrong[0])
        token = tokenizer.convert_ids_to_tokens(int(ids[index]))
        raise diagnosis.PipelineFailure(
            f"positions of {token} carry label {labels[index]} (row {row_of(index)} of the {description} dataset, "
            f"{wrong.size} special-token positions in all)",
            f"set the labels of special tokens to -100 so the loss ignores them (word_ids() is None for {token})",
        )

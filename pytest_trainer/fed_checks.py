"""Checks of the data as the Trainer feeds it: every split (as `dataset` and `eval` read it) and a collated batch.

The splits are read after the Trainer's own removal of unused columns (`fed_data.FedSplit`). A column fed as
stored (the class ids, most often) is checked over every row of the split; what a transform computes
is checked on rows spread over it. Each check names the first bad row by its index in the dataset.
`label_problem` and `token_problem` tell why a library's error about labels or token ids was raised.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_trainer import diagnosis, fed_data, model_facts, tables, task_checks, tasks
from pytest_trainer.catalogue import BATCH, SPLIT, checks, message
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    import pyarrow as pa

    from pytest_trainer.fed_data import FedSplit
    from pytest_trainer.pipeline import Pipeline


@checks("dataset", "eval", reads=SPLIT)
def check_split(pipeline: Pipeline, split: FedSplit, *also: Callable[[], None]) -> pa.Table:
    """Every check that holds for any split, and `also`; returns the split as fed, as an Arrow table.

    A problem that breaks training is raised first; the findings that leave it running (a supervision mistake)
    are reported together once every check ran.
    """
    table = fed_table(pipeline, split)
    diagnosis.findings_last(
        [
            lambda: check_inputs(pipeline, split, table),
            lambda: check_finite(split.description, table, split.row),
            lambda: check_finite(split.description, split.whole),
            lambda: check_labels(pipeline, split),
            lambda: check_tokens(pipeline, split),
            *(
                functools.partial(check, pipeline, split)
                for check in task_checks.FOR_TASK.get(pipeline.task.labels, ())
            ),
            *also,
        ]
    )
    return table


def fed_table(pipeline: Pipeline, split: FedSplit) -> pa.Table:
    """The split as fed, or a failure saying why the Trainer cannot read it."""
    try:
        return split.table
    except ValueError as error:
        if "No columns in the dataset match" not in str(error):
            raise _transform_failed(split, error) from error
        raw = tables.stored(split.given, 1)
        text = [name for name in raw.column_names if tables.is_text(raw.schema.field(name).type)]
        model_input = model_facts.main_input(pipeline.model)
        from pytest_trainer import vision_text

        images = vision_text.images_dropped(pipeline, split, raw.column_names)
        if images is not None:
            raise images from error
        if text and pipeline.task.conventional:
            raise untokenized(split.description, text, model_input) from error
        named = model_facts.unnamed_inputs(pipeline.model)
        if named is not None:
            raise unnamed_inputs(
                type(model_facts.base_model(pipeline.model)).__name__, named, raw.column_names
            ) from error
        signature = fed_data.signature_columns(pipeline.trainer)
        taken = [name for name in signature if name not in ("args", "kwargs")]
        raise no_matching_columns(split.description, raw.column_names, taken) from error
    except Exception as error:
        raise _transform_failed(split, error) from error


def _transform_failed(split: FedSplit, error: Exception) -> Exception:
    if diagnosis.part_of(error) is None or not split.transformed:
        return error
    key = error.args[0] if isinstance(error, KeyError) and error.args else None
    if key in split.removed:
        return diagnosis.PipelineFailure(
            f"the {split.description} dataset's transform raised KeyError: {key!r}: the Trainer removed the column "
            f"{key!r} before the transform could read it, because the model's forward does not take it "
            "(remove_unused_columns=True)",
            "set remove_unused_columns=False in TrainingArguments, and have the transform or the collator return "
            "only what the model takes",
        )
    return diagnosis.raised_by(error, f"the {split.description} dataset's transform")


@checks("dataset", "eval", reads=SPLIT)
def check_inputs(pipeline: Pipeline, split: FedSplit, table: pa.Table) -> None:
    """The model's main input is there, and no text reaches a collator that pads, where the collator only batches."""
    collator = pipeline.trainer.data_collator
    if not pipeline.task.conventional or not model_facts.batches_given_features(collator):
        return  # a collator of a trainer or of your own builds the inputs: the collate stage judges its batch
    model_input = model_facts.main_input(pipeline.model)
    if model_input not in table.column_names and "inputs_embeds" not in table.column_names:
        raw = tables.stored(split.given, 1) if not split.transformed else table
        text = [name for name in raw.column_names if tables.is_text(raw.schema.field(name).type)]
        if text:
            raise untokenized(split.description, text, model_input)
        raise missing_input(split.description, model_input, table.column_names)
    text = [name for name in table.column_names if tables.is_text(table.schema.field(name).type)]
    if text and model_facts.pads(collator):
        raise diagnosis.PipelineFailure(
            f"text column(s) {', '.join(map(repr, text))} of the {split.description} dataset reach the collator, "
            "which can only batch numbers",
            f"drop them before building the Trainer (dataset.remove_columns({text!r})), "
            "or keep remove_unused_columns=True in TrainingArguments",
        )


@checks("dataset", reads=SPLIT)
def check_labels_present(pipeline: Pipeline, table: pa.Table) -> None:
    """A model trained with the Trainer's own loss needs labels, unless the collator makes them."""
    trainer = pipeline.trainer
    from transformers import DataCollatorWithPadding, Trainer, default_data_collator

    if not pipeline.task.conventional:
        return
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


@checks("dataset", "eval", reads=SPLIT)
def check_labels(pipeline: Pipeline, split: FedSplit) -> None:
    """Class ids fit the head (or the choices): integers in [0, width), or -100 to ignore a position."""
    task, description = pipeline.task, split.description
    column = pipeline.label_column(split.table)
    if task.labels not in tasks.CLASS_IDS or column is None or split.table.num_rows == 0:
        return
    choices = task.labels == tasks.CHOICE
    width = _choices(split.table, task.sequence) if choices else pipeline.task.classes
    if width is None:
        return
    table, dataset_row = split.column(column)
    values, table_row = tables.flatten(table, column)

    def row_of(index: int) -> int:
        return dataset_row(table_row(index))

    if values.dtype.kind == "f" and task.labels != tasks.CHOICE:
        if _multi_hot(pipeline, table, column, values, width, description):
            return  # rows of one value per class, which transformers trains as multi-label classification
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
        if task.labels == tasks.CHOICE:
            raise diagnosis.PipelineFailure(
                f"labels range {int(used.min())}..{int(used.max())} but each example has {width} choices "
                f"(labels 0..{width - 1}){where}",
                f"a multiple-choice label is the index of the right choice, 0..{width - 1}: check the label column "
                "and how the choices were built",
            )
        raise labels_beyond_head(
            int(used.min()),
            int(used.max()),
            width,
            where,
            task.auto_class,
            model_facts.built_from_config(pipeline.model),
            column if task.labels == tasks.CLASS else None,
        )
    negative = np.flatnonzero((values < 0) & (values != IGNORE_INDEX))
    if negative.size:
        index = int(negative[0])
        raise negative_label(int(values[index]), f" in row {row_of(index)} of the {description} dataset")


def _multi_hot(
    pipeline: Pipeline, table: pa.Table, column: str, values: np.ndarray, width: int, description: str
) -> bool:
    """Whether float labels are rows of one value per class, which a head with no problem_type trains as multi-label
    classification (transformers reads float labels so). Under problem_type='single_label_classification', rows that
    set several classes are a finding: a softmax over one class per row cannot learn them."""
    if tables.depth(table.schema.field(column).type) != 1:
        return False
    counts, _ = tables.lengths(table, column)
    if not counts.size or (counts != width).any():
        return False
    rows = values.reshape(-1, width)
    config = getattr(model_facts.base_model(pipeline.model), "config", None)
    several = np.flatnonzero((rows > 0).sum(axis=1) > 1)
    if getattr(config, "problem_type", None) == "single_label_classification" and several.size:
        row = int(several[0])
        raise diagnosis.Finding(
            f"the {description} labels are rows of {width} values, one per class, and row {row} sets "
            f"{int((rows[row] > 0).sum())} classes ({several.size} rows set several), but "
            "problem_type='single_label_classification' trains a softmax that picks one class per row, so it cannot "
            "learn them",
            "build the model with problem_type='multi_label_classification' (one sigmoid per class, "
            "BCEWithLogitsLoss), e.g. from_pretrained(..., num_labels=..., problem_type='multi_label_classification')",
        )
    return True


def _choices(table: pa.Table, column: str | None) -> int | None:
    """The number of choices of every row (multiple choice), when the rows agree on it."""
    if column is None or column not in table.column_names or tables.depth(table.schema.field(column).type) < 2:
        return None
    counts = tables.outer_lengths(table, column)
    return int(counts[0]) if counts.size and (counts == counts[0]).all() else None


@checks("dataset", "eval", reads=SPLIT)
def check_tokens(pipeline: Pipeline, split: FedSplit) -> None:
    """Token ids are rows of the input embedding, and sequences fit the model's positions."""
    table, task, description = split.table, pipeline.task, split.description
    columns = [
        name
        for name in table.column_names
        if name in task.token_columns and tables.is_numeric(table.schema.field(name).type)
    ]
    rows = model_facts.vocabulary_rows(pipeline.model)
    for column in columns:
        values, row_of = tables.flatten(table, column)
        if rows is not None and values.size and values.max() >= rows:
            index = int(np.argmax(values >= rows))
            where = f" in row {split.row(row_of(index))} of the {description} dataset"
            raise token_beyond_vocabulary(
                int(values[index]), rows, where if column == task.sequence else f"{where} ({column!r})"
            )
    limit = model_facts.position_limit(pipeline.model)
    if limit is None or task.sequence is None or task.sequence not in columns:
        return
    counts = tables.row_lengths(table, task.sequence)
    if counts.size and counts.max() > limit:
        index = int(np.argmax(counts > limit))
        raise sequence_too_long(int(counts[index]), limit, f" in row {split.row(index)} of the {description} dataset")


@checks("dataset", reads=SPLIT)
def check_labels_vary(pipeline: Pipeline, split: FedSplit) -> None:
    """A classifier trained on one class only learns to predict that class; one whose labels count from 1 over a head
    with an output more never trains output 0 (on the whole training split: a sampled one may miss a rare class)."""
    column = pipeline.label_column(split.table)
    if (
        pipeline.task.labels not in (tasks.CLASS, tasks.TOKEN_CLASS)
        or pipeline.task.classes is None
        or column is None
        or split.table.num_rows < 2
    ):
        return
    values, _ = tables.flatten(split.column(column)[0], column)
    used = np.unique(values[values != IGNORE_INDEX])
    if used.size == 1:
        raise diagnosis.Finding(
            f"every label of the training dataset is {used[0]}: the model can only learn to predict that class",
            "check the label column and any filtering, sorting or slicing that kept a single class",
        )
    width = pipeline.task.classes
    counted_from_one = used.size == width - 1 and used.tolist() == list(range(1, width))
    if pipeline.task.labels == tasks.CLASS and counted_from_one and values.size >= 2 * width and not pipeline.cuts:
        raise diagnosis.Finding(
            f"class 0 has no row in the training dataset, while each of classes 1..{width - 1} has: the labels are "
            f"counted from 1 and the head was given an output more (num_labels={width}), so output 0 is never "
            "trained, and names given by position (id2label, a ClassLabel) sit one class off",
            f"shift the class ids to start at 0 where the labels are made, e.g. dataset = dataset.map(lambda row: "
            f"{{{column!r}: row[{column!r}] - 1}}), and give the head num_labels={width - 1}",
        )


@checks("dataset", "eval", reads=SPLIT)
def check_finite(description: str, table: pa.Table, dataset_row: Callable[[int], int] = int) -> None:
    """NaN or infinite numbers in inputs or labels turn the loss into NaN at the first step that meets them.

    `dataset_row` gives the dataset row of each row of `table` (rows spread over the split)."""
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
            row = dataset_row(row_of(index))
            raise diagnosis.PipelineFailure(
                f"column {column!r} of the {description} dataset holds {values[index]} in row {row} "
                f"({bad.size} non-finite values in all): the loss becomes NaN where it meets them",
                "drop or repair those rows before training (dataset.filter(...))",
            )


@checks("collate", reads=BATCH)
def check_batch_tokens(pipeline: Pipeline, batch: dict) -> None:
    """Token ids of the batch are rows of the input embedding (where the collator itself tokenizes, say)."""
    import torch

    rows = model_facts.vocabulary_rows(pipeline.model)
    if rows is None:
        return
    for key in pipeline.task.token_columns:
        ids = batch.get(key)
        if torch.is_tensor(ids) and not ids.dtype.is_floating_point and ids.numel() and int(ids.max()) >= rows:
            row = int(torch.nonzero(ids >= rows)[0][0])
            where = f" in row {row} of the first batch the collator made ({key!r})"
            raise token_beyond_vocabulary(int(ids.max()), rows, where)


def label_problem(pipeline: Pipeline) -> diagnosis.PipelineFailure | None:
    """Why labels crash the loss, read from the whole training split."""
    return _first_failure(lambda: check_labels(pipeline, pipeline.training))


def token_problem(pipeline: Pipeline) -> diagnosis.PipelineFailure | None:
    """Why an embedding lookup is out of range: a token id or a position too large."""
    return _first_failure(lambda: check_tokens(pipeline, pipeline.training)) or _first_failure(
        lambda: check_batch_tokens(pipeline, pipeline.batches.first())
    )


def _first_failure(action: Callable[[], Any]) -> diagnosis.PipelineFailure | None:
    """The failure a check of the data finds, if any; a check that cannot read the data finds none."""
    try:
        action()
    except diagnosis.PipelineFailure as failure:
        return failure
    except Exception as error:
        if diagnosis.part_of(error) is None:
            raise
    return None


# ---- the failures these checks raise, in the user's terms ----------------------------------------------------------


@message
def labels_beyond_head(
    low: int,
    high: int,
    width: int,
    where: str = "",
    auto_class: str = "AutoModelForSequenceClassification",
    built_from: str | None = None,
    column: str | None = None,
) -> diagnosis.PipelineFailure:
    """Class ids beyond the head; the fix builds the model as the script does: `from_pretrained`, or from the
    config class `built_from` (a model trained from scratch). One class id per row in `column`, counted from `low` > 0
    and fitting the head from 0, is shifted instead: another output would leave classes below `low` without a row."""
    if column is not None and low > 0 and high - low + 1 == width:
        return diagnosis.PipelineFailure(
            f"labels range {low}..{high}: {width} classes counted from {low}, but class ids run from 0 to "
            f"num_labels - 1, so label {high} is beyond the model's {width} outputs{where}",
            f"shift the class ids to start at 0 where the labels are made, e.g. dataset = dataset.map(lambda row: "
            f"{{{column!r}: row[{column!r}] - {low}}}) (another output would leave class 0 without a row)",
        )
    classes = high + 1
    example = (
        f"{built_from}(..., num_labels={classes})"
        if built_from
        else f"{auto_class}.from_pretrained(..., num_labels={classes})"
    )
    return diagnosis.PipelineFailure(
        f"labels range {low}..{high} ({classes} classes) but the model has {width} outputs{where}",
        f"pass num_labels={classes} when building the model, e.g. {example}",
    )


@message
def negative_label(value: int, where: str) -> diagnosis.PipelineFailure:
    return diagnosis.PipelineFailure(
        f"label {value}{where} is negative: class ids run from 0 to num_labels - 1",
        "map the labels to 0..C-1 (use -100 only for positions the loss must ignore)",
    )


@message
def token_beyond_vocabulary(token_id: int, rows: int, where: str) -> diagnosis.PipelineFailure:
    return diagnosis.PipelineFailure(
        f"token id {token_id}{where} but the model's input embedding has {rows} rows (ids 0..{rows - 1})",
        "tokenize with the model's own tokenizer; if you added tokens to it, call "
        "model.resize_token_embeddings(len(tokenizer)) before building the Trainer",
    )


@message
def sequence_too_long(length: int, limit: int, where: str) -> diagnosis.PipelineFailure:
    return diagnosis.PipelineFailure(
        f"a sequence of {length} tokens{where} but the model has only {limit} positions",
        f"tokenize with truncation=True (and max_length={limit} or less)",
    )


@message
def untokenized(split: str, text_columns: Sequence[str], model_input: str) -> diagnosis.PipelineFailure:
    quoted = ", ".join(repr(name) for name in text_columns)
    call_args = ", ".join(f'batch["{name}"]' for name in text_columns[:2])
    return diagnosis.PipelineFailure(
        f"the {split} dataset has text columns {quoted} but no {model_input!r}: "
        "the model reads token ids, not text, so the Trainer was given the raw, untokenized split",
        f"tokenize it first, e.g. tokenized = raw.map(lambda batch: tokenizer({call_args}, truncation=True), "
        f"batched=True), and pass the tokenized split to the Trainer",
    )


@message
def no_matching_columns(split: str, columns: Sequence[str], taken: Sequence[str]) -> diagnosis.PipelineFailure:
    return diagnosis.PipelineFailure(
        f"no column of the {split} dataset ({', '.join(columns)}) is a parameter of the model's forward "
        f"({', '.join(taken)}), so the Trainer's remove_unused_columns drops them all",
        "name the columns after the forward's parameters, or set remove_unused_columns=False in TrainingArguments "
        "and give the Trainer a data_collator that builds the model's inputs",
    )


@message
def unnamed_inputs(
    model: str, parameters: Sequence[str], dropped: Sequence[str], columns: Sequence[str] = ()
) -> diagnosis.PipelineFailure:
    """A forward(**inputs) names no input: the Trainer keeps only the columns a forward names, and the labels.
    `columns` are the split's columns as stored (the fix names them all), `dropped` those the Trainer dropped."""
    return diagnosis.PipelineFailure(
        f"{model}.forward({', '.join(parameters)}) names no input: the Trainer keeps only the columns the forward's "
        f"signature names (and the labels), so it dropped {', '.join(repr(name) for name in dropped)}; without "
        "'labels' in the signature the evaluation also computes no loss",
        f"name the inputs: def forward(self, {', '.join(_parameters(columns or dropped))}), or keep every column with "
        "TrainingArguments(remove_unused_columns=False, label_names=['labels'])",
    )


def _parameters(columns: Sequence[str]) -> list[str]:
    """The parameters a forward names to take these columns: the labels last (a collator renames 'label')."""
    labels = {"label", "labels", "label_ids"}
    inputs = [name for name in columns if name not in labels]
    return [*inputs, *(["labels=None"] if labels & set(columns) else [])]


@message
def missing_input(split: str, model_input: str, columns: Sequence[str]) -> diagnosis.PipelineFailure:
    return diagnosis.PipelineFailure(
        f"the {split} dataset has no {model_input!r} column, which the model needs "
        f"(columns the Trainer keeps: {', '.join(columns) or 'none'})",
        f"produce {model_input!r} in your preprocessing, or if the column has another name, "
        "rename it with dataset.rename_column(...)",
    )

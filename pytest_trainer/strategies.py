"""Hypothesis strategies over a Trainer's own data: label values, rows, lengths and padding pairs.

Public, for your own property tests (`from pytest_trainer import strategies`, or the
`trainer_strategies` fixture). Every strategy draws from the training split as the Trainer feeds
it, so what it finds is a real row or a real label value, shrunk to the smallest failing one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from hypothesis import strategies as st

from pytest_trainer import model_facts, tables, tasks

if TYPE_CHECKING:
    from transformers import Trainer

    from pytest_trainer.pipeline import Pipeline

#: Columns that mark where the documents packed into one row begin (TRL's packing).
PACKING_COLUMNS = ("seq_lengths", "cu_seq_lens", "cu_seqlens")
#: Rows always in reach of `rows()`: the longest ones, where length bugs live.
LONGEST_ROWS = 8


@dataclass(frozen=True)
class LabelDomain:
    """The label values the pipeline can meet, and where they were read."""

    values: tuple[Any, ...]
    source: str

    def describe(self) -> str:
        shown = self.values if len(self.values) <= 6 else (*self.values[:3], "...", *self.values[-2:])
        return f"{{{', '.join(map(str, shown))}}} ({self.source})"


def label_domain(trainer: Trainer | Pipeline) -> LabelDomain | None:
    """A ClassLabel's classes, else the values seen in the split, else the model's configured labels."""
    pipeline = _pipeline(trainer)
    table = pipeline.training.table
    column = pipeline.label_column(table)
    if column is None:
        return None
    if pipeline.task.labels == tasks.CHOICE:
        sequence = pipeline.task.sequence or ""
        choices = (
            int(tables.outer_lengths(table, sequence)[0]) if sequence in table.column_names and table.num_rows else 0
        )
        return LabelDomain(tuple(range(choices)), f"the {choices} choices of each example") if choices else None
    feature = _feature(pipeline, column)
    class_names = getattr(feature, "names", None) or getattr(getattr(feature, "feature", None), "names", None)
    if class_names:
        return LabelDomain(tuple(range(len(class_names))), f"the ClassLabel of {column!r}: {len(class_names)} classes")
    values, _ = tables.flatten(table, column)
    if values.dtype.kind in "iu":
        seen = np.unique(values[values != tasks.IGNORE_INDEX])
        if seen.size:
            return LabelDomain(tuple(int(value) for value in seen), f"values of {column!r} in the training split")
    if values.dtype.kind == "f":
        finite = values[np.isfinite(values)]
        if finite.size:
            low, high = float(finite.min()), float(finite.max())
            return LabelDomain((low, high), f"range of {column!r} in the training split")
    count = getattr(getattr(pipeline.model, "config", None), "num_labels", None)
    return LabelDomain(tuple(range(count)), "the model's num_labels") if count else None


def label_values(trainer: Trainer | Pipeline) -> st.SearchStrategy[Any]:
    """Label values of the domain; shrinks towards the smallest."""
    domain = label_domain(trainer)
    if domain is None:
        return st.nothing()
    if all(isinstance(value, float) for value in domain.values):
        low, high = domain.values[0], domain.values[-1]
        return st.floats(low, high, allow_nan=False) if low < high else st.just(low)
    return st.sampled_from(domain.values)


def rows(trainer: Trainer | Pipeline) -> st.SearchStrategy[int]:
    """Indices of training rows, any of them, with the longest always within reach."""
    pipeline = _pipeline(trainer)
    count = pipeline.training.table.num_rows
    return st.one_of(st.sampled_from(longest_rows(pipeline)), st.integers(0, count - 1)) if count else st.nothing()


def lengths(trainer: Trainer | Pipeline) -> st.SearchStrategy[int]:
    """Sequence lengths from 1 to the model's position limit (or twice the longest row without one).

    Any length up to the longest row read (of the rows --trainer-sample keeps); past it, where only repeated rows reach,
    far fewer and far between: the lengths doubling from the longest row, and the limit itself. They come last in the
    order hypothesis shrinks by, so a failure past the longest row is reported at the first of them that fails.
    """
    pipeline = _pipeline(trainer)
    limit = length_limit(pipeline)
    near = min(longest_row(pipeline), limit)
    far = far_lengths(near, limit)
    return st.integers(1, near + len(far)).map(lambda drawn: drawn if drawn <= near else far[drawn - near - 1])


def length_limit(trainer: Trainer | Pipeline) -> int:
    """The longest sequence to try: the model's position limit, or twice the longest row read without one."""
    pipeline = _pipeline(trainer)
    return model_facts.position_limit(pipeline.model) or 2 * longest_row(pipeline)


def longest_row(trainer: Trainer | Pipeline) -> int:
    """The token length of the longest row read (at least 1)."""
    return max(int(_row_lengths(_pipeline(trainer)).max(initial=1)), 1)


def far_lengths(longest: int, limit: int) -> list[int]:
    """Lengths past the longest row up to `limit`: doubling from it, and `limit` itself."""
    found = []
    length = 2 * longest
    while length < limit:
        found.append(length)
        length *= 2
    return [*found, limit] if limit > longest else []


@st.composite
def batches(draw: st.DrawFn, trainer: Trainer | Pipeline, max_rows: int = 2) -> ResizedBatch:
    """A few real rows, all cut or repeated to one drawn length (so no padding is needed)."""
    pipeline = _pipeline(trainer)
    indices = draw(st.lists(rows(pipeline), min_size=1, max_size=max_rows))
    return resized_batch(pipeline, indices, draw(lengths(pipeline)))


def resized_batch(trainer: Trainer | Pipeline, indices: list[int], length: int) -> ResizedBatch:
    """The rows at `indices`, every one cut or repeated to `length` tokens."""
    pipeline = _pipeline(trainer)
    chosen = pipeline.batches.rows(indices)
    return ResizedBatch(tuple(indices), length, tuple(resize(row, length, pipeline) for row in chosen))


def longest_rows(trainer: Trainer | Pipeline, count: int = LONGEST_ROWS) -> list[int]:
    """Indices of the `count` longest rows read, longest first."""
    return [int(index) for index in np.argsort(-_row_lengths(_pipeline(trainer)), kind="stable")[:count]]


@dataclass(frozen=True)
class ResizedBatch:
    rows: tuple[int, ...]
    length: int
    features: tuple[dict[str, Any], ...]


@st.composite
def padding_pairs(draw: st.DrawFn, trainer: Trainer | Pipeline) -> tuple[int, int, int]:
    """(short row, longer row, short length): the short row, cut to that length, gets padded beside the other."""
    pipeline = _pipeline(trainer)
    counts = _row_lengths(pipeline)
    short = draw(rows(pipeline))
    longer = draw(rows(pipeline).filter(lambda index: index != short or len(counts) == 1))
    top = max(int(counts[longer]) - 1, 1)
    cut = draw(st.integers(1, min(int(counts[short]), top)))
    return short, longer, cut


def resize(row: dict[str, Any], length: int, pipeline: Pipeline) -> dict[str, Any]:
    """The row with every per-token column cut or repeated to `length` tokens (each choice's, under a choices axis).

    A row that ends with a special token (`[SEP]`, `</s>`) keeps it at its end, as a tokenizer's truncation does:
    some models (BART's and T5's classification heads) read their prediction off the end-of-sequence token.
    """
    sequence = _plain(row[pipeline.task.sequence or ""])
    kept = _kept_end(sequence, pipeline)
    resized = {}
    for key, value in row.items():
        plain = _plain(value)
        resized[key] = _resized(plain, length, kept) if _same_shape(plain, sequence) else value
        if key in pipeline.task.positions and isinstance(plain, int) and plain >= length:
            resized[key] = 0  # an answer cut off points at [CLS], as the question-answering example does
    return resized


def _kept_end(sequence: Any, pipeline: Pipeline) -> int:
    """1 when the token sequence (the first choice's, under a choices axis) ends with a special token other than
    padding (a row padded when tokenized ends with pad ids, which resizing cuts or repeats like any token), else 0."""
    while isinstance(sequence, list) and sequence and isinstance(sequence[0], list):
        sequence = sequence[0]
    tokenizer = getattr(pipeline.trainer, "processing_class", None)
    ends = set(getattr(tokenizer, "all_special_ids", None) or []) - {getattr(tokenizer, "pad_token_id", None)}
    return int(isinstance(sequence, list) and len(sequence) > 1 and sequence[-1] in ends)


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def _same_shape(value: Any, sequence: Any) -> bool:
    """Whether `value` has one entry per token of `sequence` (nested lists compared level by level)."""
    if not isinstance(value, list) or not isinstance(sequence, list) or len(value) != len(sequence):
        return False
    if sequence and isinstance(sequence[0], list):
        return all(_same_shape(item, inner) for item, inner in zip(value, sequence, strict=True))
    return not value or not isinstance(value[0], list)


def _resized(value: list[Any], length: int, kept: int = 0) -> list[Any]:
    if value and isinstance(value[0], list):
        return [_resized(item, length, kept) for item in value]
    body, end = (value[:-kept], value[-kept:]) if kept and len(value) > kept else (value, [])
    if length <= len(end):
        return end[-length:]
    return (body * ((length - len(end)) // max(len(body), 1) + 1))[: length - len(end)] + end


def require_sequences(pipeline: Pipeline) -> None:
    """Skip a property that needs token sequences when the training rows have none to cut or pad."""
    column = pipeline.task.sequence or ""
    table = pipeline.training.table
    if column not in table.column_names or not tables.is_list(table.schema.field(column).type):
        pytest.skip(f"the training samples have no token sequence {column!r} whose length could vary")
    packed = [name for name in PACKING_COLUMNS if name in table.column_names]
    if packed:
        pytest.skip(
            f"the training rows are packed ({packed[0]!r} marks the documents in each row): cutting or "
            "padding a row would split its documents; the dataset check covers their lengths"
        )


def _row_lengths(pipeline: Pipeline) -> np.ndarray:
    table = pipeline.training.table
    column = pipeline.task.sequence or ""
    if column not in table.column_names or not tables.is_list(table.schema.field(column).type):
        return np.ones(table.num_rows, dtype=np.int64)
    return tables.row_lengths(table, column)


def _feature(pipeline: Pipeline, column: str) -> Any:
    features = getattr(pipeline.trainer.train_dataset, "features", None) or {}
    return features.get(column) if hasattr(features, "get") else None


def _pipeline(trainer: Trainer | Pipeline) -> Pipeline:
    from pytest_trainer.pipeline import Pipeline

    return trainer if isinstance(trainer, Pipeline) else Pipeline(trainer, type(trainer).__name__)


class TrainerStrategies:
    """This module's strategies with the Trainer already given: what the trainer_strategies fixture returns."""

    def __init__(self, trainer: Trainer | Pipeline) -> None:
        self._pipeline = _pipeline(trainer)

    def label_values(self) -> st.SearchStrategy[Any]:
        return label_values(self._pipeline)

    def rows(self) -> st.SearchStrategy[int]:
        return rows(self._pipeline)

    def lengths(self) -> st.SearchStrategy[int]:
        return lengths(self._pipeline)

    def batches(self, max_rows: int = 2) -> st.SearchStrategy[ResizedBatch]:
        return batches(self._pipeline, max_rows)

    def padding_pairs(self) -> st.SearchStrategy[tuple[int, int, int]]:
        return padding_pairs(self._pipeline)

"""Evaluation rows that are also training rows, token for token as the model is fed them.

Such rows inflate every metric the run reports, and the best checkpoint and early stopping those metrics drive. A
split made after augmentation, or from a file with repeated rows, makes them silently. The whole of both splits is
compared at the cost of hashing them: one 64-bit hash per row of the fed token ids, computed on the flat Arrow
values at once, then a sorted membership test. A few short rows (a greeting, a one-word answer) repeat in any
corpus: below `SHARE` of the evaluation rows, or when every repeated row is short, the overlap is a note.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_trainer import diagnosis, tables

if TYPE_CHECKING:
    from pytest_trainer.fed_data import FedSplit

#: Rows of fewer fed tokens than this repeat naturally (special tokens included).
SHORT = 8
#: The share of an evaluation split's rows, repeated from training and not short, from which the overlap fails.
SHARE = 0.01
#: Examples named in a finding or a note.
SHOWN = 3

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class Rows:
    """The token ids of every row of a split as fed: the flat values and where each row starts and ends."""

    values: np.ndarray
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    @functools.cached_property
    def hashes(self) -> np.ndarray:
        """One uint64 per row, from its ids and their positions (equal rows, equal hashes); empty rows hash to 0."""
        lengths = self.lengths
        if not self.values.size:
            return np.zeros(len(lengths), dtype=np.uint64)
        positions = np.arange(self.values.size, dtype=np.uint64) - np.repeat(self.offsets[:-1], lengths).astype(
            np.uint64
        )
        with np.errstate(over="ignore"):
            mixed = _finalise((self.values.astype(np.uint64) + np.uint64(1)) * _MULTIPLIER + positions)
            starts = self.offsets[:-1][lengths > 0]
            hashed = np.zeros(len(lengths), dtype=np.uint64)
            hashed[lengths > 0] = _finalise(np.add.reduceat(mixed, starts) ^ lengths[lengths > 0].astype(np.uint64))
        return hashed


def _finalise(values: np.ndarray) -> np.ndarray:
    """splitmix64's mixing of each value (numpy's uint64 arithmetic wraps, as the mix wants)."""
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def fed_rows(split: FedSplit, column: str) -> Rows | None:
    """Every row's token ids of `column` as fed, read as stored over the whole split; None where they are computed (a
    transform, a torch Dataset) or are no flat list of integers."""
    import datasets
    import pyarrow as pa

    dataset = split.dataset
    if split.transformed or not isinstance(dataset, datasets.Dataset) or column not in dataset.column_names:
        return None
    array = tables.stored_rows(dataset, None, [column]).column(column).combine_chunks()
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)) or not pa.types.is_integer(
        array.type.value_type
    ):
        return None
    offsets = array.offsets.to_numpy()
    values = array.flatten().to_numpy(zero_copy_only=False)
    return Rows(values.astype(np.int64, copy=False), (offsets - offsets[0]).astype(np.int64))


@dataclass(frozen=True)
class Overlap:
    """Evaluation rows found in training: (evaluation row, training row) pairs, and the evaluation split's size."""

    pairs: list[tuple[int, int]]
    rows: int
    short: int

    @property
    def long(self) -> int:
        return len(self.pairs) - self.short


def between(training: Rows, evaluation: Rows) -> Overlap:
    """The evaluation rows (not empty) whose ids equal a training row's."""
    known = training.hashes
    if not known.size:
        return Overlap([], len(evaluation.lengths), 0)
    order = np.argsort(known, kind="stable")
    ordered = known[order]
    hashed = evaluation.hashes
    at = np.searchsorted(ordered, hashed).clip(max=len(ordered) - 1)
    candidates = np.flatnonzero((evaluation.lengths > 0) & (ordered[at] == hashed))
    pairs = [
        (int(row), int(order[at[row]]))
        for row in candidates
        if np.array_equal(evaluation.row(int(row)), training.row(int(order[at[row]])))
    ]
    short = sum(1 for row, _ in pairs if evaluation.lengths[row] < SHORT)
    return Overlap(pairs, len(evaluation.lengths), short)


def check(training: FedSplit, train_rows: Rows | None, split: FedSplit, column: str, decode: Any = None) -> str | None:
    """A finding where many rows of the evaluation `split` are training rows; a note for a few, or for the
    training split itself given as the evaluation split; None where there is none or the rows are computed.
    `train_rows` are the training split's (`fed_rows`), read and hashed once for every evaluation split."""
    same = (
        f"the {split.description} dataset is the training dataset: its metrics measure how well the model fits "
        "its training rows, not how it does on rows it has not seen"
    )
    if split.given is training.given:
        return same
    eval_rows = fed_rows(split, column)
    if train_rows is None or eval_rows is None:
        return None
    found = between(train_rows, eval_rows)
    if not found.pairs:
        return None
    if len(found.pairs) == found.rows == len(train_rows.lengths):
        return same  # the same rows, prepared for each split apart (as TRL's trainers do)
    share = len(found.pairs) / max(found.rows, 1)
    examples = "; ".join(
        f"{split.description} row {row} = training row {source}" + _text(decode, eval_rows.row(row))
        for row, source in found.pairs[:SHOWN]
    )
    if found.long < 2 or found.long < SHARE * found.rows:
        return (
            f"{len(found.pairs)} of the {found.rows} rows of the {split.description} dataset are also training "
            f"rows ({found.short} of them short, under {SHORT} tokens), e.g. {examples}: too few to sway its "
            "metrics"
        )
    raise diagnosis.Finding(
        f"{len(found.pairs)} of the {found.rows} rows of the {split.description} dataset ({share:.0%}) are also "
        f"training rows, token for token as the model is fed them (e.g. {examples}): its metrics, and the best "
        "checkpoint and early stopping they drive, score rows the model has trained on",
        "make the splits disjoint: de-duplicate the data and split it before any augmentation, or drop those rows "
        f"from the evaluation split: seen = set(map(tuple, train_dataset[{column!r}])); eval_dataset = "
        f"eval_dataset.filter(lambda row: tuple(row[{column!r}]) not in seen)",
    )


def _text(decode: Any, ids: np.ndarray) -> str:
    """The row's text as the tokenizer shows it, cut short; nothing where it cannot."""
    try:
        text = str(decode(ids.tolist())).strip()
    except Exception:
        return ""
    return f" {text[:60] + ('...' if len(text) > 60 else '')!r}" if text else ""

"""Evaluation rows that are training rows: the same input and the same targets, as the model is fed them.

Such rows let an evaluation score what the model has trained on, and the best checkpoint, early stopping and a plateau
scheduler act on that score. But every real corpus of short texts repeats some rows across its splits (a greeting, a
generic review), and the same input under another label is no row the model trained on. The rule, said for users in
docs/stages.md ("Evaluation rows that are training rows"):

- A row is every column the collator is fed, its targets included (the label columns, and the masks that choose the
  supervised tokens). Where the collator makes the targets from the input (a language model), the input is the row.
  An evaluation input found in training under other targets only is a conflicting label: a note; so are inputs
  labelled several times (raters who agree repeat a row with its label, those who disagree give it others).
- The training split given for evaluation, or a selection of it (every evaluation row a training row), is a finding
  where a setting acts on its metrics and a note the terminal summary shows otherwise: evaluating on training rows to
  watch the fit is a choice, picking a checkpoint by it is a defect.
- Otherwise the repeated rows of at least `SHORT` tokens (padding left out) count. From `MADE` of the evaluation rows,
  no natural repeat explains them: the split was made from training rows (its data held copies when it was split), a
  finding, unless a split so small could hold as many by chance (`BY_CHANCE`). From `SWAY`, where a setting acts on
  the metrics, a finding too. Below, a note with the numbers.

Both splits are compared whole, at the cost of hashing them: one 64-bit hash per row of the token ids and of the
targets, computed on the flat Arrow values at once, then a sorted membership test; the rows found are compared value for
value in every column.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_trainer import diagnosis, tables
from pytest_trainer.catalogue import SPLIT, checks

if TYPE_CHECKING:
    from pytest_trainer.fed_data import FedSplit

#: Rows of fewer tokens than this (special tokens included, padding not) are generic: they repeat in any corpus.
SHORT = 8
#: The share of an evaluation split's rows, repeated from training and not short, from which the split was made from
#: training rows: twice the highest natural rate measured between the splits of real corpora (9.6% of MASSIVE's
#: short commands in one language, 9.5% of TNews' headlines, on the input alone; most curated splits 0 to 1%, see
#: docs/stages.md), where splits made from training rows give 20 to 100%.
MADE = 0.2
#: The share from which the repeated rows sway the metric that a setting acts on (the best checkpoint, early stopping):
#: the highest natural rate.
SWAY = 0.1
#: Fewer repeated rows than this are a note, whatever their share of a small split.
FEW = 3
#: How unlikely the repeated rows must be under the highest natural rate (SWAY) for a small split's share to say it
#: was made from training rows: 3 of 13 rows (23%) come that often by chance one time in seven, 8 of 9 never.
BY_CHANCE = 0.01
#: The share of an evaluation split's rows with a training row's input under other targets from which the terminal
#: summary shows them.
CONFLICTING = 0.1
#: The share of the evaluation inputs found in training that carry other targets there, from which the data labels its
#: inputs several times (raters, annotators): rows repeated with their targets are then agreement, not copies
#: (natural label noise leaves a few: 5 of CoNLL-2003's 78 test sentences found in training).
VARIED = 0.25
#: Examples named in a finding or a note.
SHOWN = 3
#: Fed columns beside the labels that say which tokens are supervised (TRL's completion-only and assistant-only loss).
SUPERVISION = ("completion_mask", "assistant_masks")
#: The start of a note that the terminal summary shows (`report.summary.changed_notes`).
SUMMARY = "evaluation:"

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class Rows:
    """The values of one column of every row of a split: the flat values and where each row starts and ends (a
    column of one value per row has rows of length 1)."""

    values: np.ndarray
    offsets: np.ndarray
    #: Whether each row holds a list (token ids, per-token labels), not one value (a class id, a score).
    listed: bool = True

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]

    @functools.cached_property
    def hashes(self) -> np.ndarray:
        """One uint64 per row, from its values and their positions (equal rows, equal hashes); empty rows hash to 0."""
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


def _combined(columns: Sequence[Rows]) -> np.ndarray:
    """One uint64 per row from the hashes of several columns, in their order."""
    hashed = np.zeros(len(columns[0].lengths), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for index, column in enumerate(columns, start=1):
            hashed = _finalise(hashed ^ (column.hashes + np.uint64(index) * _MULTIPLIER))
    return hashed


@dataclass(frozen=True)
class Fed:
    """A split's rows as the collator is fed them: the token ids of `name` and the targets, hashed; every other
    column (`others`, values by row: Arrow columns or lists), compared only on the rows found. `shown` holds the
    targets' values as the data holds them, for the examples."""

    name: str
    sequence: Rows
    targets: dict[str, Rows] = field(default_factory=dict)
    others: dict[str, Any] = field(default_factory=dict)
    shown: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def row_keys(self) -> np.ndarray:
        return _combined([self.sequence, *self.targets.values()]) if self.targets else self.sequence.hashes

    def tokens(self, row: int) -> int:
        """The row's tokens that are not padding (its attention mask's, where it has one)."""
        mask = self.others.get("attention_mask")
        return int(sum(_plain(mask[row]))) if mask is not None else int(self.sequence.lengths[row])


def rows_of(values: Sequence[Sequence[float]] | Sequence[float]) -> Rows:
    """A column from Python values: one number per row, or a list of numbers per row."""
    lists = [list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value] for value in values]
    flat = np.array([number for value in lists for number in value], dtype=np.float64)
    offsets = np.concatenate([[0], np.cumsum([len(value) for value in lists])]).astype(np.int64)
    return Rows(
        _as_integers(flat), offsets, listed=any(isinstance(value, (list, tuple, np.ndarray)) for value in values)
    )


def _as_integers(values: np.ndarray) -> np.ndarray:
    """Whole numbers as int64 (a label 2 and 2.0 alike), any other as the bits of its float32 (what a loss reads:
    a score stored in float64 in one split and float32 in the other alike)."""
    if np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_:
        return values.astype(np.int64, copy=False)
    as_float = values.astype(np.float64)
    whole = np.isfinite(as_float) & (as_float == np.round(as_float)) & (np.abs(as_float) < 2**53)
    with np.errstate(over="ignore", invalid="ignore"):
        coded = as_float.astype(np.float32).view(np.int32).astype(np.int64) + 2**60  # beyond every whole number kept
    coded[whole] = as_float[whole].astype(np.int64)
    return coded


def _plain(value: Any) -> Any:
    """A value of a column by row as Python holds it (an Arrow scalar's)."""
    return value.as_py() if hasattr(value, "as_py") else value


@dataclass(frozen=True)
class Overlap:
    """Evaluation rows found in training, as (evaluation row, training row) pairs: `leaked`, the whole row;
    `conflicting`, the inputs only, under other targets. `rows` counts the evaluation rows that are not empty, `short`
    the leaked ones of fewer than `SHORT` tokens."""

    leaked: list[tuple[int, int]]
    conflicting: list[tuple[int, int]]
    rows: int
    short: int

    @property
    def long(self) -> int:
        return len(self.leaked) - self.short


def _matches(known: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each wanted hash, whether a known one equals it, and the index of such a known row."""
    order = np.argsort(known, kind="stable")
    ordered = known[order]
    at = np.searchsorted(ordered, wanted).clip(max=len(ordered) - 1)
    return ordered[at] == wanted, order[at]


def _same(evaluation: Fed, training: Fed, row: int, source: int, targets: bool) -> bool:
    """Whether evaluation `row` holds the inputs (and the `targets`) of training row `source`, value for value."""
    hashed = [(evaluation.sequence, training.sequence)]
    if targets:
        hashed += [(rows, training.targets[name]) for name, rows in evaluation.targets.items()]
    return all(np.array_equal(mine.row(row), theirs.row(source)) for mine, theirs in hashed) and all(
        values[row] == training.others[name][source] for name, values in evaluation.others.items()
    )


def between(training: Fed, evaluation: Fed) -> Overlap:
    """The evaluation rows (not empty) whose inputs are a training row's, with its targets or under others."""
    present = evaluation.sequence.lengths > 0
    if not len(training.sequence.lengths):
        return Overlap([], [], int(present.sum()), 0)
    whole, whole_source = _matches(training.row_keys, evaluation.row_keys)
    inputs, inputs_source = (
        _matches(training.sequence.hashes, evaluation.sequence.hashes) if evaluation.targets else (whole, whole_source)
    )
    leaked = [
        (int(row), int(whole_source[row]))
        for row in np.flatnonzero(present & whole)
        if _same(evaluation, training, int(row), int(whole_source[row]), targets=True)
    ]
    conflicting = [
        (int(row), int(inputs_source[row]))
        for row in np.flatnonzero(present & inputs & ~whole)
        if _same(evaluation, training, int(row), int(inputs_source[row]), targets=False)
    ]
    short = sum(1 for row, _ in leaked if evaluation.tokens(row) < SHORT)
    return Overlap(leaked, conflicting, int(present.sum()), short)


# ---- reading the splits --------------------------------------------------------------------------------------------


def fed(split: FedSplit, sequence: str, targets: Sequence[str]) -> Fed | None:
    """Every row of `split` as its collator is fed them, over the whole split: the token ids of `sequence` and the
    `targets`, hashed, and every other column it keeps (an image, pixel values: compared, never hashed), read as
    stored. None where the rows are computed (a transform, a torch Dataset), or the sequence or a target holds what is
    no number nor a flat list of numbers, or a null."""
    import datasets

    dataset = split.dataset
    if split.transformed or not isinstance(dataset, datasets.Dataset) or sequence not in dataset.column_names:
        return None
    schema = dataset.features.arrow_schema
    hashed = [sequence, *(name for name in dict.fromkeys(targets) if name in schema.names and name != sequence)]
    kinds = {name: _kind(schema.field(name).type) for name in hashed}
    if kinds[sequence] != "integers" or None in kinds.values():
        return None
    table = tables.stored_rows(dataset, None, None)
    read = {name: _column(table.column(name).combine_chunks(), kinds[name] != "number") for name in hashed}
    rows = {name: value for name, value in read.items() if value is not None}
    if len(rows) < len(read):
        return None
    return Fed(
        sequence,
        rows.pop(sequence),
        rows,
        {name: table.column(name) for name in table.column_names if name not in hashed},
        {name: table.column(name) for name in rows},
    )


def _kind(kind: Any) -> str | None:
    """ "number" (one per row), "integers" or "numbers" (a flat list of them per row), or None for anything else."""
    import pyarrow as pa

    def numeric(inner: Any) -> bool:
        return bool(pa.types.is_integer(inner) or pa.types.is_floating(inner) or pa.types.is_boolean(inner))

    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = kind.value_type
        return "integers" if pa.types.is_integer(inner) else "numbers" if numeric(inner) else None
    return "number" if numeric(kind) else None


def _column(array: Any, listed: bool) -> Rows | None:
    """One column's values as `Rows` (a list per row where `listed`), or None where one is null."""
    values = array.flatten() if listed else array
    if array.null_count or values.null_count:
        return None
    if listed:
        offsets = array.offsets.to_numpy()
        return Rows(_as_integers(values.to_numpy(zero_copy_only=False)), (offsets - offsets[0]).astype(np.int64))
    return Rows(_as_integers(values.to_numpy(zero_copy_only=False)), np.arange(len(array) + 1, dtype=np.int64), False)


# ---- the verdict ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluated:
    """One evaluation split against the training split, in the terms a finding gives: its name, the settings that act
    on its metrics, and how its rows read (`shown`: an example pair in words; `key`: a row's key in Python)."""

    description: str
    acting: Sequence[str]
    training_rows: int
    shown: Callable[[int, int], str]
    key: str
    targets: Sequence[str] = ()


@checks("dataset", reads=SPLIT)
def judge(found: Overlap, split: Evaluated, given_is_training: bool = False) -> list[str]:
    """The notes an evaluation split's rows shared with training give; a finding where they spoil the run (the rule
    of the module's docstring)."""
    conflicting = _conflicting(found, split)
    also = [f"also: {conflicting}"] if conflicting else []
    whole = found.rows >= FEW and len(found.leaked) == found.rows
    if given_is_training or (whole and found.rows == split.training_rows):
        what = f"the {split.description} dataset is the training dataset"
    elif whole:
        what = (
            f"every one of the {found.rows} rows of the {split.description} dataset is a training row (the training "
            "split or a selection of it)"
        )
    else:
        return _repeated(found, split, also)
    if split.acting:
        raise diagnosis.Finding(
            f"{what}, and {_settings(split.acting)} on its metrics, which measure how well the model fits the rows it "
            "trains on: overfitting looks like progress there, so the checkpoint picked is the one that has memorised "
            "its training rows best",
            "evaluate on rows held out of training: split the data before training, e.g. parts = "
            "data.train_test_split(test_size=0.1, seed=0), then train_dataset=parts['train'], "
            "eval_dataset=parts['test']",
            also,
        )
    fit = f"{SUMMARY} {what}: its metrics measure how well the model fits its training rows, not rows it has not seen"
    return [fit, *([conflicting] if conflicting else [])]


def chance(repeated: int, rows: int, rate: float = SWAY) -> float:
    """How often a split of `rows` rows holds `repeated` or more training rows by chance, when each row repeats one at
    the natural `rate`: the binomial tail, summed in logarithms (a split may hold millions of rows)."""
    if repeated <= 0:
        return 1.0
    total, log_rate, log_rest = 0.0, math.log(rate), math.log1p(-rate)
    for count in range(repeated, rows + 1):
        log_term = (
            math.lgamma(rows + 1)
            - math.lgamma(count + 1)
            - math.lgamma(rows - count + 1)
            + count * log_rate
            + (rows - count) * log_rest
        )
        term = math.exp(log_term)
        total += term
        if count > rows * rate and term < total * 1e-12:
            break
    return min(total, 1.0)


def _repeated(found: Overlap, split: Evaluated, also: list[str]) -> list[str]:
    """Some evaluation rows repeated from training: natural repeats, inputs labelled several times, or a split made
    from training rows."""
    notes = [also[0].removeprefix("also: ")] if also else []
    if not found.leaked:
        return notes
    share = found.long / max(found.rows, 1)
    repeated = (
        f"{len(found.leaked)} of the {found.rows} rows of the {split.description} dataset "
        f"({len(found.leaked) / max(found.rows, 1):.0%}) are training rows, {_alike(split.targets)} as the model is "
        f"fed them{f' ({found.short} of them short, under {SHORT} tokens)' if found.short else ''}"
    )
    many = found.long >= FEW and share >= SWAY
    if many and len(found.conflicting) >= VARIED * (len(found.leaked) + len(found.conflicting)):
        shared = len(found.leaked) + len(found.conflicting)
        return [
            f"{SUMMARY} {shared} of the {found.rows} rows of the {split.description} dataset "
            f"({shared / max(found.rows, 1):.0%}) have the input of a training row, {len(found.leaked)} with its "
            f"{' and '.join(split.targets)} and {len(found.conflicting)} under others ({_examples(found.leaked, split)}"
            "): the data labels its inputs several times (several raters or annotators) and was split by row, so its "
            "metrics score inputs the model has trained on; to score unseen inputs, split by input (every row of an "
            "input on the same side)"
        ]
    examples = [f"e.g. {split.shown(row, source)}" for row, source in found.leaked[:SHOWN]]
    if many and share >= MADE and chance(found.long, found.rows) < BY_CHANCE:
        acting = f", and {_settings(split.acting)} on them" if split.acting else ""
        raise diagnosis.Finding(
            f"the {split.description} dataset was made from training rows: {repeated}, far more than natural repeats "
            "give; the data held copies of its rows when it was split (oversampled, augmented, or repeated in its "
            f"source), so its metrics score rows the model has trained on{acting}",
            "de-duplicate the data, then split it, and oversample or augment the training split only: key = lambda "
            f"row: {split.key}; first = {{}}; [first.setdefault(key(row), index) for index, row in enumerate(data)]; "
            "data = data.select(sorted(first.values()))",
            [*examples, *also],
        )
    if many and split.acting:
        raise diagnosis.Finding(
            f"{_settings(split.acting)} on metrics of training rows: {repeated}; a checkpoint that memorises "
            "them scores better on them, so the one picked is the one that fits its training rows best",
            "drop those rows from the evaluation split (or de-duplicate the data before it is split): key = lambda "
            f"row: {split.key}; seen = set(map(key, train_dataset)); eval_dataset = eval_dataset.filter(lambda row: "
            "key(row) not in seen)",
            [*examples, *also],
        )
    shown = f"{repeated}, {_examples(found.leaked, split)}"
    if many:
        return [f"{SUMMARY} {shown}: no setting picks a checkpoint by its metrics, which they inflate", *notes]
    if found.short and len(found.leaked) >= SWAY * found.rows:
        ending = "natural repeats, short rows that any corpus repeats, too few long ones to sway its metrics"
        return [f"{shown}: {ending}", *notes]
    return [f"{shown}: natural repeats, too few to sway its metrics", *notes]


def _conflicting(found: Overlap, split: Evaluated) -> str | None:
    """The note of evaluation rows whose input a training row has under other targets."""
    if not found.conflicting:
        return None
    share = len(found.conflicting) / max(found.rows, 1)
    note = (
        f"{len(found.conflicting)} of the {found.rows} rows of the {split.description} dataset ({share:.0%}) have "
        f"the input of a training row under other {' and '.join(split.targets)} ("
        f"{_examples(found.conflicting, split)}): not rows the model trained on, since it learns other targets for "
        "those inputs than it is scored against"
    )
    return f"{SUMMARY} {note}" if share >= CONFLICTING else note


def _settings(acting: Sequence[str]) -> str:
    return f"{', '.join(acting)} {'acts' if len(acting) == 1 else 'act'}"


def _alike(targets: Sequence[str]) -> str:
    return f"input and {' and '.join(targets)} alike," if targets else "token for token"


def _examples(pairs: list[tuple[int, int]], split: Evaluated) -> str:
    return "e.g. " + "; ".join(split.shown(row, source) for row, source in pairs[:SHOWN])


# ---- one evaluation split ------------------------------------------------------------------------------------------


def check(
    training: FedSplit,
    train_rows: Fed | None,
    split: FedSplit,
    acting: Sequence[str],
    decode: Callable[[list[int]], str] | None = None,
) -> list[str]:
    """The notes of the rows the evaluation `split` shares with training; a finding where they spoil the run. Its
    rows are read as `train_rows` were (`fed`), which are read and hashed once for every evaluation split."""
    counted = training.given if hasattr(training.given, "__len__") else ()
    if split.given is training.given:
        return judge(Overlap([], [], 0, 0), Evaluated(split.description, acting, len(counted), _nothing, ""), True)
    if train_rows is None:
        return []
    eval_rows = fed(split, train_rows.name, list(train_rows.targets))
    if eval_rows is None or (list(eval_rows.targets), list(eval_rows.others)) != (
        list(train_rows.targets),
        list(train_rows.others),
    ):
        return []
    found = between(train_rows, eval_rows)
    parts = [f"tuple(row[{train_rows.name!r}])"]
    parts += [f"tuple(row[{name!r}])" if rows.listed else f"row[{name!r}]" for name, rows in train_rows.targets.items()]
    return judge(
        found,
        Evaluated(
            split.description,
            acting,
            len(counted),
            functools.partial(_example, split.description, eval_rows, train_rows, decode),
            f"({', '.join(parts)})" if train_rows.targets else parts[0],
            list(train_rows.targets),
        ),
    )


def _nothing(row: int, source: int) -> str:
    return ""


def _example(
    description: str, evaluation: Fed, training: Fed, decode: Callable[[list[int]], str] | None, row: int, source: int
) -> str:
    """An evaluation row and the training row it repeats, in words: its text, and its first target where it reads
    (one label, or per-token labels where they differ)."""
    said = f"{description} row {row} = training row {source}{_text(decode, evaluation.sequence.row(row))}"
    if not evaluation.targets:
        return said
    name = next(iter(evaluation.targets))
    mine, theirs = _plain(evaluation.shown[name][row]), _plain(training.shown[name][source])
    if not isinstance(mine, list) or not isinstance(theirs, list):
        return f"{said} ({name} {mine})" if mine == theirs else f"{said} ({name} {mine} against {theirs})"
    if mine == theirs:
        return said
    pairs = zip(mine, theirs, strict=False)
    differ = next((index for index, (one, other) in enumerate(pairs) if one != other), min(len(mine), len(theirs)))
    return f"{said} ({name} from token {differ}: {_short(mine[differ:])} against {_short(theirs[differ:])})"


def _short(values: list[Any]) -> str:
    """Per-token labels, cut short."""
    return f"[{', '.join(map(str, values[:6]))}{', ...' if len(values) > 6 else ''}]"


def _text(decode: Callable[[list[int]], str] | None, ids: np.ndarray) -> str:
    """The row's text as the tokenizer shows it, cut short; nothing where it cannot."""
    if decode is None:
        return ""
    try:
        text = str(decode(ids.tolist())).strip()
    except Exception:
        return ""
    return f" {text[:60] + ('...' if len(text) > 60 else '')!r}" if text else ""

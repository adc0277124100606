"""Evaluation rows that are training rows, as fed, over the whole splits (`dataset`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import GOOD_SCRIPT, outcomes, run_script, write

from pytest_trainer import overlap

#: The data oversampled (every row twice), then split: most evaluation rows have their copy in training.
SPLIT_AFTER_OVERSAMPLING = """
    import tiny
    from datasets import concatenate_datasets
    from transformers import Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(count=200, seed=3), tok)
    {split}
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=train, eval_dataset=dev, processing_class=tok)
"""
OVERSAMPLED_FIRST = """parts = concatenate_datasets([data, data]).train_test_split(test_size=0.2, seed=0)
    train, dev = parts["train"], parts["test"]"""
SPLIT_FIRST = """parts = data.train_test_split(test_size=0.2, seed=0)
    train, dev = concatenate_datasets([parts["train"], parts["train"]]), parts["test"]"""


def test_evaluation_rows_repeated_from_training_are_found(project: pytest.Pytester) -> None:
    write(project, "train.py", SPLIT_AFTER_OVERSAMPLING.format(split=OVERSAMPLED_FIRST))
    result = run_script(project, "--trainer-stages=dataset")
    assert outcomes(result) == {"dataset[cpu]": "FAILED"}
    result.stdout.fnmatch_lines([
        "dataset[[]cpu[]] failed: * of the 80 rows of the evaluation dataset (*%) are also training rows, token for "
        "token as the model is fed them (e.g. evaluation row * = training row * '*'*): its metrics, and the best "
        "checkpoint and early stopping they drive, score rows the model has trained on",
        "  fix: make the splits disjoint: de-duplicate the data and split it before any augmentation, or drop those "
        "rows from the evaluation split: seen = set(map(tuple, train_dataset[[]'input_ids'[]])); *"])


def test_splitting_before_oversampling_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", SPLIT_AFTER_OVERSAMPLING.format(split=SPLIT_FIRST))
    result = run_script(project, "--trainer-stages=dataset")
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    assert "training rows" not in result.stdout.str()


def test_a_few_short_rows_repeated_are_a_note(project: pytest.Pytester) -> None:
    short = SPLIT_FIRST + """
    dev = concatenate_datasets([dev, train.filter(lambda row: len(row["input_ids"]) < 6).select(range(1))])"""
    write(project, "train.py", SPLIT_AFTER_OVERSAMPLING.format(split=short))
    result = run_script(project, "--trainer-stages=dataset", "--trainer-report=report.json")
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    dataset = next(item for item in json.loads((project.path / "report.json").read_text())["items"]
                   if item["stage"] == "dataset")
    # One short row of the split repeats a training row by chance; the second was added.
    assert any(note.startswith("2 of the 41 rows of the evaluation dataset are also training rows (2 of them short, "
                               "under 8 tokens), e.g. ") and note.endswith(": too few to sway its metrics")
               for note in dataset["notes"]), \
        dataset["notes"]


def test_the_training_split_given_for_evaluation_is_a_note(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)  # eval_dataset=data, the training split
    result = run_script(project, "--trainer-stages=dataset", "--trainer-report=report.json")
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    dataset = next(item for item in json.loads((project.path / "report.json").read_text())["items"]
                   if item["stage"] == "dataset")
    assert "the evaluation dataset is the training dataset: its metrics measure how well the model fits its training " \
           "rows, not how it does on rows it has not seen" in dataset["notes"], dataset["notes"]


def rows(*sequences: list[int]) -> overlap.Rows:
    lengths = [len(sequence) for sequence in sequences]
    return overlap.Rows(np.array([token for sequence in sequences for token in sequence], dtype=np.int64),
                        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def test_equal_rows_hash_equal_and_order_matters() -> None:
    hashed = rows([5, 6, 7], [7, 6, 5], [5, 6, 7], [], [5, 6], [5, 6, 7, 0]).hashes
    assert hashed[0] == hashed[2]
    assert len({int(hashed[index]) for index in (0, 1, 4, 5)}) == 4
    assert hashed[3] == 0


def test_overlap_pairs_each_evaluation_row_with_its_training_row() -> None:
    training = rows([1, 2, 3, 4, 5, 6, 7, 8, 9], [2, 3], [4, 4, 4, 4, 4, 4, 4, 4])
    evaluation = rows([9, 9], [2, 3], [], [4, 4, 4, 4, 4, 4, 4, 4], [1, 2, 3, 4, 5, 6, 7, 8])
    found = overlap.between(training, evaluation)
    assert found.pairs == [(1, 1), (3, 2)]
    assert (found.rows, found.short, found.long) == (5, 1, 1)


def test_overlap_over_many_rows_finds_exactly_the_copied_ones() -> None:
    generator = np.random.default_rng(0)
    training = [list(generator.integers(0, 50, generator.integers(1, 40))) for _ in range(5000)]
    evaluation = [list(generator.integers(0, 50, generator.integers(1, 40))) for _ in range(500)]
    copied = [3, 77, 499]
    for row in copied:
        evaluation[row] = training[row * 7]
    found = overlap.between(rows(*training), rows(*evaluation))
    assert [row for row, _ in found.pairs if len(evaluation[row]) > 2] == copied

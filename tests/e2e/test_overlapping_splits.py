"""Evaluation rows that are training rows, as fed, over the whole splits (`dataset`)."""

from __future__ import annotations

import json

import pytest
from conftest import GOOD_SCRIPT, outcomes, run_script, write

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
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: * of the 80 rows of the evaluation dataset (*%) are also training rows, token for "
            "token as the model is fed them (e.g. evaluation row * = training row * '*'*): its metrics, and the best "
            "checkpoint and early stopping they drive, score rows the model has trained on",
            "  fix: make the splits disjoint: de-duplicate the data and split it before any augmentation, or drop those "
            "rows from the evaluation split: seen = set(map(tuple, train_dataset[[]'input_ids'[]])); *",
        ]
    )


def test_splitting_before_oversampling_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", SPLIT_AFTER_OVERSAMPLING.format(split=SPLIT_FIRST))
    result = run_script(project, "--trainer-stages=dataset")
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    assert "training rows" not in result.stdout.str()


def test_a_few_short_rows_repeated_are_a_note(project: pytest.Pytester) -> None:
    short = (
        SPLIT_FIRST
        + """
    dev = concatenate_datasets([dev, train.filter(lambda row: len(row["input_ids"]) < 6).select(range(1))])"""
    )
    write(project, "train.py", SPLIT_AFTER_OVERSAMPLING.format(split=short))
    result = run_script(project, "--trainer-stages=dataset", "--trainer-report=report.json")
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    dataset = next(
        item for item in json.loads((project.path / "report.json").read_text())["items"] if item["stage"] == "dataset"
    )
    # One short row of the split repeats a training row by chance; the second was added.
    assert any(
        note.startswith(
            "2 of the 41 rows of the evaluation dataset are also training rows (2 of them short, under 8 tokens), e.g. "
        )
        and note.endswith(": too few to sway its metrics")
        for note in dataset["notes"]
    ), dataset["notes"]


def test_the_training_split_given_for_evaluation_is_a_note(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)  # eval_dataset=data, the training split
    result = run_script(project, "--trainer-stages=dataset", "--trainer-report=report.json")
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    dataset = next(
        item for item in json.loads((project.path / "report.json").read_text())["items"] if item["stage"] == "dataset"
    )
    assert (
        "the evaluation dataset is the training dataset: its metrics measure how well the model fits its training "
        "rows, not how it does on rows it has not seen" in dataset["notes"]
    ), dataset["notes"]

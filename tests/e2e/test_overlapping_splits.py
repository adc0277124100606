"""Evaluation rows that are training rows, input and targets as fed, over the whole splits (`dataset`): a split made
from training rows and the training split evaluated under a setting that acts on its metrics fail; natural repeats,
the same inputs under other labels and the training split watched for its fit pass, with a note."""

from __future__ import annotations

import json

import pytest
from pipeline_runs import GOOD_SCRIPT, outcomes, run_script, write

#: A classifier on 200 sentences; `split` makes `train` and `dev`, `settings` are more TrainingArguments.
SPLITS = """
    import tiny
    from datasets import concatenate_datasets
    from transformers import EarlyStoppingCallback, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(count=200, seed=3), tok)
    {split}
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none"{settings})
    trainer = Trainer(model=tiny.classifier(num_labels={labels}), args=args, train_dataset=train, eval_dataset=dev,
                      processing_class=tok)
"""
#: The data oversampled (every row twice), then split: most evaluation rows have their copy in training.
OVERSAMPLED_FIRST = """parts = concatenate_datasets([data, data]).train_test_split(test_size=0.2, seed=0)
    train, dev = parts["train"], parts["test"]"""
SPLIT_FIRST = """parts = data.train_test_split(test_size=0.2, seed=0)
    train, dev = concatenate_datasets([parts["train"], parts["train"]]), parts["test"]"""
#: Long training rows (8 tokens or more) added to the 40 held-out ones, as a corpus repeats generic texts.
REPEATS = (
    SPLIT_FIRST
    + """
    dev = concatenate_datasets([dev, train.filter(lambda row: len(row["input_ids"]) >= 8).select(range({count}))])"""
)
#: The best checkpoint picked by the evaluation loss.
BEST = ', eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True'


def run_split(project: pytest.Pytester, split: str, settings: str = "", labels: int = 3) -> pytest.RunResult:
    write(project, "train.py", SPLITS.format(split=split, settings=settings, labels=labels))
    return run_script(project, "--trainer-stages=dataset", "--trainer-report=report.json")


def dataset_notes(project: pytest.Pytester) -> list[str]:
    items = json.loads((project.path / "report.json").read_text())["items"]
    return next(item for item in items if item["stage"] == "dataset")["notes"]


def passes_with_note(project: pytest.Pytester, script: str, start: str) -> None:
    """`script`'s dataset item passes, with a note of the JSON report that starts with `start`."""
    write(project, "train.py", script)
    result = run_script(project, "--trainer-stages=dataset", "--trainer-report=report.json")
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    assert any(note.startswith(start) for note in dataset_notes(project)), dataset_notes(project)


def test_a_split_made_from_oversampled_rows_fails(project: pytest.Pytester) -> None:
    result = run_split(project, OVERSAMPLED_FIRST)
    assert outcomes(result) == {"dataset[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the evaluation dataset was made from training rows: * of the 80 rows of the "
            "evaluation dataset (*%) are training rows, input and label alike, as the model is fed them (* of them "
            "short, under 8 tokens), far more than natural repeats give; the data held copies of its rows when it was "
            "split (oversampled, augmented, or repeated in its source), so its metrics score rows the model has "
            "trained on",
            "  fix: de-duplicate the data, then split it, and oversample or augment the training split only: key = "
            "lambda row: (tuple(row[[]'input_ids'[]]), row[[]'label'[]]); first = {}; [[]first.setdefault(key(row), "
            "index) for index, row in enumerate(data)[]]; data = data.select(sorted(first.values()))",
            "  e.g. evaluation row * = training row * '[[]CLS[]] *' (label *)",
        ]
    )


def test_splitting_before_oversampling_passes(project: pytest.Pytester) -> None:
    result = run_split(project, SPLIT_FIRST, BEST)
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    assert "training rows" not in result.stdout.str()


@pytest.mark.parametrize("settings", ["", BEST], ids=["no-setting", "best-model"])
def test_natural_repeats_are_a_note(project: pytest.Pytester, settings: str) -> None:
    result = run_split(project, REPEATS.format(count=3), settings)
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    assert "training rows" not in result.stdout.str()  # not in the terminal summary
    assert any(
        note.startswith("3 of the 43 rows of the evaluation dataset (7%) are training rows, input and label alike")
        and note.endswith(": natural repeats, too few to sway its metrics")
        for note in dataset_notes(project)
    ), dataset_notes(project)


def test_repeats_that_sway_the_best_checkpoint_fail_where_it_is_picked(project: pytest.Pytester) -> None:
    result = run_split(project, REPEATS.format(count=6), BEST)
    assert outcomes(result) == {"dataset[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: load_best_model_at_end acts on metrics of training rows: 6 of the 46 rows of the "
            "evaluation dataset (13%) are training rows, input and label alike, as the model is fed them; a checkpoint that memorises them scores better on them, so the one picked is the "
            "one that fits its training rows best",
        ]
    )
    result = run_split(project, REPEATS.format(count=6))
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    result.stdout.fnmatch_lines(
        ["evaluation: 6 of the 46 rows of the evaluation dataset (13%) are training rows, * no setting picks a *"]
    )


#: A regression split whose inputs are training inputs, scored otherwise: not rows the model trained on.
RESCORED = """data = data.map(lambda row: {"label": float(len(row["input_ids"])) / 10})
    train = data.select(range(150))
    dev = train.select(range(50)).map(lambda row: {"label": row["label"] + 0.5})"""
#: Every evaluation input a training input, rated alike by half the raters and otherwise by the others.
RATED = """train = data.select(range(150))
    dev = train.select(range(60)).map(lambda row, index: {"label": (row["label"] + index % 2) % 3}, with_indices=True)"""


@pytest.mark.parametrize(
    ("split", "labels", "note"),
    [
        (
            RESCORED,
            1,
            "evaluation: 50 of the 50 rows of the evaluation dataset (100%) have the input of a training row under "
            "other label (e.g. evaluation row 0 = training row 0 '[[]CLS[]] *' (label * against *); *): not rows the "
            "model trained on, since it learns other targets for those inputs than it is scored against",
        ),
        (
            RATED,
            3,
            "evaluation: 60 of the 60 rows of the evaluation dataset (100%) have the input of a training row, 30 with "
            "its label and 30 under others (e.g. *): the data labels its inputs several times (several raters or "
            "annotators) and was split by row, *",
        ),
    ],
    ids=["rescored", "several-raters"],
)
def test_inputs_found_under_other_labels_pass_with_a_note(
    project: pytest.Pytester, split: str, labels: int, note: str
) -> None:
    result = run_split(project, split, BEST, labels=labels)
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    result.stdout.fnmatch_lines([note])


def test_sentences_tagged_otherwise_pass(project: pytest.Pytester) -> None:
    """A token-classification split of training sentences with other tags, and a few natural repeats."""
    tagged = """
    import tiny
    from transformers import BertForTokenClassification, DataCollatorForTokenClassification, Trainer, TrainingArguments

    tok = tiny.tokenizer()

    def tagger(shift):
        def tag(batch):
            encoded = tok(batch["text"], truncation=True)
            encoded["labels"] = [[-100 if word is None else (word + shift) % 4 for word in encoded.word_ids(i)]
                                 for i in range(len(batch["text"]))]
            return encoded
        return tag

    raw = tiny.text_dataset(count=120, seed=5)
    train = raw.select(range(100)).map(tagger(0), batched=True, remove_columns=["text", "label"])
    dev = raw.select(range(60, 120)).map(tagger(1), batched=True, remove_columns=["text", "label"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none",
                             eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True)
    trainer = Trainer(model=BertForTokenClassification(tiny.config(num_labels=4)), args=args, train_dataset=train,
                      eval_dataset=dev, processing_class=tok, data_collator=DataCollatorForTokenClassification(tok))
    """
    write(project, "train.py", tagged)
    result = run_script(project, "--trainer-stages=dataset")
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    result.stdout.fnmatch_lines(
        ["evaluation: 40 of the 60 rows of the evaluation dataset (67%) have the input of a training row under other "
         "labels (e.g. evaluation row 0 = training row 60 * (labels from token 1: [[]1, 2, *] against [[]0, 1, *]); *"]
    )  # fmt: skip


def test_a_language_model_repeating_a_few_texts_passes(project: pytest.Pytester) -> None:
    """A masked LM's targets are made from its input by the collator: a row is its tokens."""
    masked = """
    import tiny
    from datasets import concatenate_datasets
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(count=120, seed=7), tok).remove_columns(["label"])
    train = data.select(range(80))
    dev = concatenate_datasets([data.select(range(80, 118)), train.filter(lambda row: len(row["input_ids"]) >= 8)
                                .select(range(2))])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none",
                             eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True)
    trainer = Trainer(model=BertForMaskedLM(tiny.config()), args=args, train_dataset=train, eval_dataset=dev,
                      processing_class=tok, data_collator=DataCollatorForLanguageModeling(tok))
    """
    passes_with_note(
        project, masked, "2 of the 40 rows of the evaluation dataset (5%) are training rows, token for token as the "
    )


def test_the_training_split_evaluated_is_shown_and_fails_where_a_setting_acts_on_it(project: pytest.Pytester) -> None:
    fit = (
        "evaluation: the evaluation dataset is the training dataset: its metrics measure how well the model fits its "
        "training rows, not rows it has not seen"
    )
    write(project, "train.py", GOOD_SCRIPT)  # eval_dataset=data, the training split
    result = run_script(project, "--trainer-stages=dataset")
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    result.stdout.fnmatch_lines(["--* pytest-trainer: train.py -*", "*", f"{fit}"])

    write(project, "train.py", GOOD_SCRIPT.replace('report_to="none"', 'report_to="none"' + BEST))
    result = run_script(project, "--trainer-stages=dataset")
    assert outcomes(result) == {"dataset[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the evaluation dataset is the training dataset, and load_best_model_at_end acts "
            "on its metrics, which measure how well the model fits the rows it trains on: overfitting looks like "
            "progress there, so the checkpoint picked is the one that has memorised its training rows best",
            "  fix: evaluate on rows held out of training: split the data before training, e.g. parts = "
            "data.train_test_split(test_size=0.1, seed=0), then train_dataset=parts[[]'train'[]], "
            "eval_dataset=parts[[]'test'[]]",
        ]
    )


@pytest.mark.parametrize("settings", ["", BEST], ids=["no-setting", "best-model"])
def test_a_selection_of_the_training_split_evaluated(project: pytest.Pytester, settings: str) -> None:
    result = run_split(project, "train, dev = data, data.select(range(0, 200, 5))", settings)
    selection = (
        "every one of the 40 rows of the evaluation dataset is a training row (the training split or a selection of it)"
    )
    if settings:
        assert outcomes(result) == {"dataset[cpu]": "FAILED"}
        result.stdout.fnmatch_lines([f"dataset[[]cpu[]] failed: {selection}, and load_best_model_at_end acts on *"])
    else:
        assert outcomes(result) == {"dataset[cpu]": "PASSED"}
        result.stdout.fnmatch_lines([f"evaluation: {selection}: its metrics measure how well the model fits *"])


def test_of_a_dict_of_splits_only_the_one_a_setting_reads_fails(project: pytest.Pytester) -> None:
    """Watching the fit on the training split beside a held-out split that picks the best checkpoint is correct."""
    both = (
        SPLIT_FIRST
        + """
    dev = {"train": train, "test": dev}"""
    )
    picked_by = (
        ', eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True, metric_for_best_model={!r}'
    )
    result = run_split(project, both, picked_by.format("test_loss"))
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    result.stdout.fnmatch_lines(["evaluation: the evaluation 'train' dataset is the training dataset: its metrics *"])
    result = run_split(project, both, picked_by.format("train_loss"))
    assert outcomes(result) == {"dataset[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the evaluation 'train' dataset is the training dataset, and load_best_model_at_end *"
        ]
    )


def test_a_finding_keeps_the_notes_of_the_other_splits(project: pytest.Pytester) -> None:
    splits = (
        OVERSAMPLED_FIRST
        + """
    dev = {"copied": dev, "fit": train.select(range(40))}"""
    )
    result = run_split(project, splits)
    assert outcomes(result) == {"dataset[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the evaluation 'copied' dataset was made from training rows: *",
            "  note: every one of the 40 rows of the evaluation 'fit' dataset is a training row *",
        ]
    )


def test_short_rows_padded_to_a_length_are_still_short(project: pytest.Pytester) -> None:
    """Greetings repeated in a held-out split, every row padded to 24 tokens: natural repeats, not copies."""
    padded = """raw = tiny.text_dataset(count=200, seed=3)
    data = raw.map(lambda batch: tok(batch["text"], padding="max_length", max_length=24, truncation=True),
                   batched=True, remove_columns=["text"])
    parts = data.train_test_split(test_size=0.2, seed=0)
    train, dev = parts["train"], parts["test"]
    short = train.filter(lambda row: sum(row["attention_mask"]) < 6).select(range(12))
    dev = concatenate_datasets([dev, short])"""
    result = run_split(project, padded, BEST)
    assert outcomes(result) == {"dataset[cpu]": "PASSED"}
    assert any(
        "12 of them short, under 8 tokens" in note and note.endswith("too few long ones to sway its metrics")
        for note in dataset_notes(project)
    ), dataset_notes(project)


def test_a_split_in_torch_format_is_compared_as_stored(project: pytest.Pytester) -> None:
    """Per-token labels that the split gives as tensors: the examples read them as stored."""
    tagged = """
    import tiny
    from datasets import concatenate_datasets
    from transformers import BertForTokenClassification, DataCollatorForTokenClassification, Trainer, TrainingArguments

    tok = tiny.tokenizer()

    def tag(batch):
        encoded = tok(batch["text"], truncation=True)
        encoded["labels"] = [[-100 if word is None else word % 4 for word in encoded.word_ids(i)]
                             for i in range(len(batch["text"]))]
        return encoded

    data = tiny.text_dataset(count=120, seed=5).map(tag, batched=True, remove_columns=["text", "label"])
    train = data.select(range(80))
    dev = concatenate_datasets([data.select(range(80, 120)), train.select(range(1))])
    train.set_format("torch")
    dev.set_format("torch")
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=BertForTokenClassification(tiny.config(num_labels=4)), args=args, train_dataset=train,
                      eval_dataset=dev, processing_class=tok, data_collator=DataCollatorForTokenClassification(tok))
    """
    passes_with_note(
        project, tagged, "1 of the 41 rows of the evaluation dataset (2%) are training rows, input and labels alike"
    )

"""The three bugs of the course lesson, each caught at its stage with its cause and fix."""

from __future__ import annotations

import pytest
import torch
from pipeline_runs import GOOD_SCRIPT, ITEMS, failures, outcomes, run_script, write


def test_correct_script_passes_every_cpu_stage_and_skips_cuda(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    result = project.runpytest("--trainer-module=train.py", "-v", "-rs")
    statuses = outcomes(result)
    idle = set() if torch.cuda.is_available() else {"memory[cpu]"}  # no GPU: the forecast has no budget
    assert {item for item, outcome in statuses.items() if outcome == "PASSED"} == {
        f"{stage}[cpu]"
        for stage in ITEMS
        if stage != "targets"  # targets audits causal LMs only
    } - idle
    assert statuses["targets[cpu]"] == "SKIPPED"
    assert {outcome for item, outcome in statuses.items() if item.endswith("[cuda]")} == {"SKIPPED"}
    result.stdout.fnmatch_lines(["*SKIPPED*CUDA is not available on this machine*"])


def test_raw_text_dataset_fails_at_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("train_dataset=data", "train_dataset=tiny.text_dataset()"))
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the training dataset has text columns 'text' but no 'input_ids'*",
            '*fix: tokenize it first*raw.map(lambda batch: tokenizer(batch[[]"text"[]], truncation=True)*',
            "*SKIPPED*blocked by dataset[[]cpu[]]*",
        ]
    )


def test_unpadded_samples_without_tokenizer_fail_at_collate(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace(", processing_class=tok", ""))
    result = run_script(project)
    assert failures(result) == ["collate[cpu]"]
    assert outcomes(result)["forward[cpu]"] == "SKIPPED"
    result.stdout.fnmatch_lines(
        [
            "collate[[]cpu[]] failed: samples of different lengths (input_ids lengths of the first rows: *, *) reach a "
            "collator that does not pad*",
            "*fix: pass the tokenizer to the Trainer (processing_class=tokenizer*DataCollatorWithPadding(tokenizer)*",
            "original error:",
            "*ValueError: expected sequence of length*",
        ]
    )


def test_tokenizer_without_pad_token_is_named(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("tok = tiny.tokenizer()", "tok = tiny.tokenizer(pad=False)"))
    result = run_script(project)
    assert failures(result) == ["collate[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "collate[[]cpu[]] failed: *the tokenizer (*) has no pad token*",
            "*fix: *tokenizer.pad_token = tokenizer.eos_token*",
        ]
    )


THREE_LABELS_TWO_OUTPUTS = GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(num_labels=2)")


def test_labels_beyond_the_head_fail_at_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", THREE_LABELS_TWO_OUTPUTS)
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: labels range 0..2 (3 classes) but the model has 2 outputs (row 2 of the training*",
            "*fix: pass num_labels=3 when building the model*",
        ]
    )


def test_labels_counted_from_one_are_shifted_not_given_an_output(project: pytest.Pytester) -> None:
    """Three classes stored as 1..3 for a head of 3: the fix is to shift them, not to add an output for a class 0
    that has no row."""
    counted_from_one = GOOD_SCRIPT.replace(
        "data = tiny.tokenized(tiny.text_dataset(), tok)",
        'data = tiny.tokenized(tiny.text_dataset(), tok).map(lambda row: {"label": row["label"] + 1})',
    )
    write(project, "train.py", counted_from_one)
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: labels range 1..3: 3 classes counted from 1, but class ids run from 0 to "
            "num_labels - 1, so label 3 is beyond the model's 3 outputs (row 2 of the training dataset has label 3)",
            "  fix: shift the class ids to start at 0 where the labels are made, e.g. dataset = dataset.map(lambda "
            "row: {'label': row[[]'label'[]] - 1}) (another output would leave class 0 without a row)",
        ]
    )
    shifted = counted_from_one.replace('row["label"] + 1', 'row["label"] + 1 - 1')
    write(project, "train.py", shifted)
    assert outcomes(run_script(project, "--trainer-stages=dataset")) == {"dataset[cpu]": "PASSED"}


def test_labels_counted_from_one_given_an_output_more_leave_class_0_without_a_row(project: pytest.Pytester) -> None:
    """The other fix of labels 1..3, an output more (num_labels=4), trains without an error and never trains
    output 0; a head of 4 over classes 0..2, whose last output has no row, is a head a little wide, and passes."""
    wider = GOOD_SCRIPT.replace(
        "data = tiny.tokenized(tiny.text_dataset(), tok)",
        'data = tiny.tokenized(tiny.text_dataset(), tok).map(lambda row: {"label": row["label"] + 1})',
    ).replace("tiny.classifier()", "tiny.classifier(num_labels=4)")
    write(project, "train.py", wider)
    result = run_script(project, "--trainer-stages=dataset")
    assert failures(result) == ["dataset[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: class 0 has no row in the training dataset, while each of classes 1..3 has: the "
            "labels are counted from 1 and the head was given an output more (num_labels=4)*",
            "*fix: shift the class ids to start at 0 * and give the head num_labels=3",
        ]
    )
    write(project, "train.py", GOOD_SCRIPT.replace("tiny.classifier()", "tiny.classifier(num_labels=4)"))
    assert outcomes(run_script(project, "--trainer-stages=dataset")) == {"dataset[cpu]": "PASSED"}


#: A ClassLabel of three names, and a head whose id2label names them in `order`.
NAMED = GOOD_SCRIPT.replace(
    "data = tiny.tokenized(tiny.text_dataset(), tok)",
    "from datasets import ClassLabel\n"
    "    data = tiny.tokenized(tiny.text_dataset(), tok).cast_column('label', ClassLabel(names=['cat', 'dog', 'bird']))\n"
    "    names = {order}",
).replace(
    "tiny.classifier()",
    "tiny.classifier(id2label=dict(enumerate(names)), label2id={{n: i for i, n in enumerate(names)}})",
)


@pytest.mark.parametrize(
    ("order", "outcome"),
    [("['dog', 'cat', 'bird']", "FAILED"), ("['Cat', 'dog', 'bird']", "PASSED"), ("['a', 'b', 'c']", "PASSED")],
    ids=["swapped", "same-order", "names-of-its-own"],
)
def test_class_names_in_another_order_than_the_dataset_s_are_found(
    project: pytest.Pytester, order: str, outcome: str
) -> None:
    write(project, "train.py", NAMED.format(order=order))
    result = run_script(project, "--trainer-stages=dataset")
    assert outcomes(result) == {"dataset[cpu]": outcome}
    if outcome == "FAILED":
        result.stdout.fnmatch_lines(
            [
                "dataset[[]cpu[]] failed: the model's id2label names the classes in another order than the training "
                "dataset's 'label' ClassLabel: class 0 is 'cat' in the data but id2label[[]0[]] = 'dog', so every "
                "prediction of the trained model carries the wrong name",
                "  fix: build both maps from the dataset's names: names = dataset.features[[]'label'[]].names; "
                "id2label = dict(enumerate(names)); *",
            ]
        )


def test_labels_beyond_the_head_are_explained_at_forward_too(project: pytest.Pytester) -> None:
    write(project, "train.py", THREE_LABELS_TWO_OUTPUTS)
    result = run_script(project, "--trainer-stages=forward")
    assert failures(result) == ["forward[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "forward[[]cpu[]] failed: labels range 0..2 (3 classes) but the model has 2 outputs*",
            "*fix: pass num_labels=3*",
            "original error:",
            "*IndexError: Target 2 is out of bounds*",
        ]
    )

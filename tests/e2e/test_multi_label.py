"""Multi-label classification: rows of one value per class, against the head's problem_type (`dataset`, `forward`).

transformers trains float rows as multi-label classification where the config names no problem_type, so such rows
are no error; a softmax asked to learn rows that set several classes is."""

from __future__ import annotations

import pytest
from pipeline_runs import failures, run_script, write

SCRIPT = """
    import tiny
    from transformers import Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok)

    def hot(row):
        values = [0.0, 0.0, 0.0]
        values[row["label"]] = 1.0
        values[(row["label"] + 1) % 3] = float(row["input_ids"][1] % 2)  # a second class in some rows
        return {{"labels": {rows}}}

    data = data.map(hot).remove_columns(["label"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none")
    trainer = Trainer(model=tiny.classifier({head}), args=args, train_dataset=data, eval_dataset=data,
                      processing_class=tok)
    trainer.train()
"""
MULTI = 'problem_type="multi_label_classification"'
SINGLE = 'problem_type="single_label_classification"'
STAGES = "--trainer-stages=dataset,forward,backward,step,eval"


@pytest.mark.parametrize("head", ["", MULTI], ids=["problem-type-unset", "multi-label"])
def test_float_rows_of_one_value_per_class_train_as_multi_label(project: pytest.Pytester, head: str) -> None:
    write(project, "train.py", SCRIPT.format(rows="values", head=head))
    assert failures(run_script(project, STAGES)) == []


def test_a_softmax_asked_to_learn_rows_that_set_several_classes_fails_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", SCRIPT.format(rows="values", head=SINGLE))
    result = run_script(project, STAGES)
    assert "dataset[cpu]" in failures(result)
    result.stdout.fnmatch_lines(
        [
            "dataset[[]cpu[]] failed: the training labels are rows of 3 values, one per class, and row * sets 2 "
            "classes (* rows set several), but problem_type='single_label_classification' trains a softmax*",
            "*fix: build the model with problem_type='multi_label_classification'*",
        ]
    )


def test_integer_rows_under_multi_label_fail_forward_with_the_cast(project: pytest.Pytester) -> None:
    write(project, "train.py", SCRIPT.format(rows="[int(value) for value in values]", head=MULTI))
    result = run_script(project, STAGES)
    assert failures(result) == ["forward[cpu]"]
    result.stdout.fnmatch_lines(["*fix: make the label rows floats*"])

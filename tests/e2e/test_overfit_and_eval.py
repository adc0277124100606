"""Silent bugs found before training: overfitting one batch, the evaluation path, and data that cannot train."""

from __future__ import annotations

import textwrap

import pytest
from pipeline_runs import GOOD_SCRIPT, KIND_SCRIPTS, failures, outcomes, run_script, write


@pytest.mark.parametrize("kind", sorted(KIND_SCRIPTS))
def test_correct_pipelines_of_every_kind_pass_every_stage(project: pytest.Pytester, kind: str) -> None:
    write(project, "train.py", KIND_SCRIPTS[kind])
    statuses = outcomes(run_script(project))
    # A language model's labels are token ids: the labels property skips them, with that reason; targets audits
    # the supervision of causal LMs, and skips for the others.
    expected = {"labels[cpu]": "SKIPPED"} if kind in ("causal-lm", "causal-lm-packed", "masked-lm") else {}
    if not kind.startswith("causal-lm"):
        expected["targets[cpu]"] = "SKIPPED"
    if kind == "causal-lm-packed":  # blocks of one length, stacked by the default collator: none is ever padded
        expected["padding[cpu]"] = "SKIPPED"
    assert {item: status for item, status in statuses.items() if status != "PASSED"} == expected
    assert statuses["overfit[cpu]"] == statuses["eval[cpu]"] == "PASSED"


def test_eval_is_skipped_without_an_eval_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace(", eval_dataset=data", ""))
    result = run_script(project, "--trainer-stages=eval")
    result.assert_outcomes(passed=1, skipped=1)  # load passed
    result.stdout.fnmatch_lines(["*SKIPPED*the Trainer has no eval_dataset*"])


def test_diverging_learning_rate_fails_overfit(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace('report_to="none"', 'report_to="none", learning_rate=30.0'))
    result = run_script(project, "--trainer-stages=overfit")
    result.assert_outcomes(passed=1, failed=1)  # load passed
    result.stdout.fnmatch_lines(
        [
            "overfit[[]cpu[]] failed: the loss *: loss * -> * after 1 step (train-mode loss:*) at learning rate 30",
            # the tiny model is built from its config: no fine-tuning rate is advised to a model trained from scratch
            "  fix: lower learning_rate (now 30): a model trained from scratch (built from its config) usually takes 1e-4 "
            "to 1e-3, with warmup",
        ]
    )


def test_tiny_learning_rate_does_not_learn_one_batch(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace('report_to="none"', 'report_to="none", learning_rate=1e-9'))
    result = run_script(project, "--trainer-stages=overfit")
    result.assert_outcomes(passed=1, failed=1)  # load passed
    result.stdout.fnmatch_lines(
        [
            "overfit[[]cpu[]] failed: the model does not learn one fixed batch (the loss barely "
            "moves): loss * -> * after 150 steps*at learning rate 1e-09*"
        ]
    )


def test_lr_zero_fails_step_and_blocks_overfit_but_not_eval(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        KIND_SCRIPTS["classification"].replace('report_to="none"', 'report_to="none", learning_rate=0.0'),
    )
    result = run_script(project)
    assert failures(result) == ["step[cpu]"]
    assert outcomes(result)["overfit[cpu]"] == "SKIPPED"
    assert outcomes(result)["eval[cpu]"] == "PASSED"
    result.stdout.fnmatch_lines(["*SKIPPED*blocked by step[[]cpu[]]*"])


def test_constant_labels_fail_dataset(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT.replace("tiny.text_dataset()", "tiny.text_dataset(classes=1)"))
    result = run_script(project, "--trainer-stages=dataset")
    result.assert_outcomes(passed=1, failed=1)  # load passed
    result.stdout.fnmatch_lines(
        ["*every label of the training dataset is 0: the model can only learn to predict that class*"]
    )


def test_nan_label_fails_dataset(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        KIND_SCRIPTS["regression"].replace(
            "/ 10.0})", '/ 10.0 if row["text"] != tiny.sentences(48)[7] else float("nan")})'
        ),
    )
    result = run_script(project, "--trainer-stages=dataset")
    result.assert_outcomes(passed=1, failed=1)  # load passed
    result.stdout.fnmatch_lines(
        ["*column 'label' of the training dataset holds nan in row 7 (1 non-finite values in all)*"]
    )


def test_token_labels_on_special_tokens(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        KIND_SCRIPTS["token-classification"].replace(
            "-100 if word is None else (i + word) % 4", "3 if word is None else (i + word) % 4"
        ),
    )
    result = run_script(project, "--trainer-stages=dataset")
    result.assert_outcomes(passed=1, failed=1)  # load passed
    result.stdout.fnmatch_lines(
        [
            "*positions of [[]CLS[]] carry label 3 (row 0 of the training dataset, * special-token positions in all)*",
            "*fix: set the labels of special tokens to -100*",
        ]
    )


def test_untokenized_eval_split_fails_eval_not_training(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        GOOD_SCRIPT.replace("eval_dataset=data", "eval_dataset={'dev': data, 'test': tiny.text_dataset()}"),
    )
    result = run_script(project)
    assert failures(result) == ["eval[cpu]"]
    result.stdout.fnmatch_lines(
        ["eval[[]cpu[]] failed: the evaluation 'test' dataset has text columns 'text' but no 'input_ids'*"]
    )


METRICS_SCRIPT = """
    import numpy as np
    import tiny
    from transformers import Trainer, TrainingArguments

    def compute_metrics(prediction):
        predictions, labels = prediction
        {body}

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok)
    args = TrainingArguments(output_dir="out", per_device_eval_batch_size=8)
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                      compute_metrics=compute_metrics, {extra})
"""


@pytest.mark.parametrize(
    ("body", "extra", "outcome", "expected"),
    [
        ("return {'accuracy': float((predictions.argmax(-1) == labels).mean())}", "", "passed", None),
        (
            "return {'accuracy': float((predictions == labels).mean())}",
            "preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1)",
            "passed",
            None,
        ),
        (
            "return {'accuracy': (predictions.argmax(-1) == labels).sum() / 0}",
            "",
            "failed",
            "*compute_metrics returned values that are not finite numbers: {'accuracy': *inf*}*",
        ),
        (
            "return {'f1': predictions[:, 5].mean()}",
            "",
            "failed",
            "eval[[]cpu[]] failed: compute_metrics raised IndexError on the evaluation predictions (predictions (16, 3), "
            "label_ids (16,))*",
        ),
    ],
    ids=["accuracy", "preprocessed-logits", "division-by-zero", "wrong-shape"],
)
def test_compute_metrics_runs_on_real_shapes(
    project: pytest.Pytester, body: str, extra: str, outcome: str, expected: str | None
) -> None:
    write(project, "train.py", textwrap.dedent(METRICS_SCRIPT).format(body=body, extra=extra))
    result = run_script(project, "--trainer-stages=eval")
    assert outcomes(result) == {"eval[cpu]": outcome.upper()}
    if expected:
        result.stdout.fnmatch_lines([expected])

"""The settings that read an evaluation's metrics, held against what the evaluation returns (`eval`).

`metric_for_best_model` naming a metric compute_metrics does not return crashes a real run at its first evaluation,
an epoch in; `greater_is_better` against the metric keeps the worst checkpoint; a run that never evaluates keeps none.
"""

from __future__ import annotations

import textwrap

import pytest
from pipeline_runs import outcomes, run_script, write

SCRIPT = """
    import tiny
    from transformers import EarlyStoppingCallback, Trainer, TrainingArguments

    def compute_metrics(prediction):
        predictions, labels = prediction
        return {{"macro_f1": float((predictions.argmax(-1) == labels).mean())}}

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok)
    args = TrainingArguments(output_dir="out", per_device_eval_batch_size=8, report_to="none", {settings})
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, eval_dataset={evaluation},
                      processing_class=tok, compute_metrics=compute_metrics{callbacks})
"""

BEST = 'eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True, '


def run_eval(
    project: pytest.Pytester, settings: str, evaluation: str = "data", callbacks: str = ""
) -> pytest.RunResult:
    write(
        project,
        "train.py",
        textwrap.dedent(SCRIPT).format(settings=settings, evaluation=evaluation, callbacks=callbacks),
    )
    return run_script(project, "--trainer-stages=eval")


@pytest.mark.parametrize(
    "settings",
    [
        BEST + 'metric_for_best_model="macro_f1"',
        BEST + 'metric_for_best_model="eval_macro_f1"',
        BEST.replace("True", "True, eval_steps=2, save_steps=2").replace(
            '"epoch"', '"steps"'
        ),  # eval_loss, the default
        'eval_strategy="epoch", metric_for_best_model="eval_loss"',
    ],
    ids=["named", "prefixed", "default-loss", "no-reader"],
)
def test_settings_reading_returned_metrics_pass(project: pytest.Pytester, settings: str) -> None:
    result = run_eval(project, settings)
    assert outcomes(result) == {"eval[cpu]": "PASSED"}, result.stdout.str()


def test_best_metric_compute_metrics_does_not_return_is_named(project: pytest.Pytester) -> None:
    result = run_eval(project, BEST + 'metric_for_best_model="f1"')
    assert outcomes(result) == {"eval[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "eval[[]cpu[]] failed: metric_for_best_model='f1' (load_best_model_at_end): the Trainer reads 'eval_f1' from "
            "each evaluation's metrics, which hold eval_loss, eval_macro_f1; the run crashes with a KeyError at its first "
            "evaluation (the end of the first epoch)",
            "  fix: metric_for_best_model='macro_f1', a metric it returns",
        ]
    )


def test_early_stopping_on_a_metric_of_a_split_dict_names_the_split(project: pytest.Pytester) -> None:
    result = run_eval(
        project,
        BEST + 'metric_for_best_model="loss"',
        evaluation="{'dev': data, 'test': data}",
        callbacks=", callbacks=[EarlyStoppingCallback(early_stopping_patience=2)]",
    )
    assert outcomes(result) == {"eval[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "eval[[]cpu[]] failed: metric_for_best_model='loss' (load_best_model_at_end, EarlyStoppingCallback): the "
            "Trainer reads 'eval_loss' from *eval_dev_loss*",
            "  fix: with several evaluation splits each metric is named by its split: metric_for_best_model="
            "'eval_dev_loss'",
        ]
    )


def test_greater_is_better_against_a_loss_like_metric(project: pytest.Pytester) -> None:
    result = run_eval(project, BEST + 'metric_for_best_model="loss", greater_is_better=True')
    assert outcomes(result) == {"eval[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "eval[[]cpu[]] failed: metric_for_best_model='loss' is a metric where lower is better, but "
            "greater_is_better=True: the best model (load_best_model_at_end) is the one with the highest loss, the worst",
            "  fix: set greater_is_better=False in TrainingArguments",
        ]
    )


def test_best_model_of_a_run_that_never_evaluates(project: pytest.Pytester) -> None:
    result = run_eval(project, 'load_best_model_at_end=True, metric_for_best_model="macro_f1", save_strategy="no"')
    assert outcomes(result) == {"eval[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "eval[[]cpu[]] failed: the run's evaluations drive load_best_model_at_end, but eval_strategy='no': it never "
            "evaluates, so no checkpoint is ever the best",
            "  fix: evaluate during training: eval_strategy='epoch' (and save_strategy='epoch' for "
            "load_best_model_at_end), or 'steps' with eval_steps",
        ]
    )

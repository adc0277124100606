"""The settings that read an evaluation's metrics held against the metrics it returns (`metric_settings`), on plain
settings: a metric's direction read from its name, greater_is_better and a plateau scheduler against it, best-model
settings without evaluations. The end-to-end runs are in tests/e2e/test_metric_settings_in_runs.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_trainer import diagnosis, metric_settings


def args(**settings: object) -> SimpleNamespace:
    base = {
        "metric_for_best_model": None,
        "greater_is_better": None,
        "load_best_model_at_end": False,
        "save_strategy": "no",
        "eval_strategy": "epoch",
        "eval_steps": None,
        "lr_scheduler_type": "linear",
        "lr_scheduler_kwargs": {},
        "prediction_loss_only": False,
        "eval_on_start": False,
    }
    return SimpleNamespace(**{**base, **settings})


RETURNED = metric_settings.returned([metric_settings.Evaluated("eval", True, ("wer",))])


@pytest.mark.parametrize(
    ("name", "higher"),
    [
        ("eval_loss", False),
        ("wer", False),
        ("eval_cer", False),
        ("eval_mean_token_accuracy", True),
        ("f1", True),
        ("rougeL", True),
        ("eval_sts-dev_spearman_cosine", True),
        ("rewards/margins", None),
        ("score", None),
        ("loss_accuracy", None),
        ("neg_loss", None),
        ("one_minus_wer", None),
    ],
)
def test_direction_of_a_metric_is_read_from_its_words(name: str, higher: bool | None) -> None:
    assert metric_settings.direction(name) is higher


def test_plateau_scheduler_against_the_metric_direction() -> None:
    plateau = args(metric_for_best_model="wer", greater_is_better=False, lr_scheduler_type="reduce_lr_on_plateau")
    assert metric_settings.check(plateau, [], RETURNED) is None
    plateau.lr_scheduler_kwargs = {"mode": "max"}
    with pytest.raises(diagnosis.PipelineFailure, match=r"cuts the learning rate while the model improves"):
        metric_settings.check(plateau, [], RETURNED)


def test_greater_is_better_left_to_its_default_for_an_error_rate_says_so() -> None:
    """TrainingArguments makes greater_is_better True for any name that does not end in 'loss': 'wer' among them."""
    with pytest.raises(diagnosis.PipelineFailure) as raised:
        metric_settings.check(
            args(metric_for_best_model="wer", greater_is_better=True, load_best_model_at_end=True), [], RETURNED
        )
    assert raised.value.cause == (
        "metric_for_best_model='wer' is a metric where lower is better, but greater_is_better=True (the default for a "
        "name that does not end in 'loss'): the best model (load_best_model_at_end) is the one with the highest wer, "
        "the worst"
    )
    assert raised.value.fix == "set greater_is_better=False in TrainingArguments"


def test_save_best_without_evaluations_saves_nothing() -> None:
    with pytest.raises(diagnosis.PipelineFailure, match=r"eval_strategy='no'.*and none is saved"):
        metric_settings.check(
            args(metric_for_best_model="wer", greater_is_better=False, save_strategy="best", eval_strategy="no"),
            [],
            RETURNED,
        )


def test_a_trainer_adding_metrics_of_its_own_gets_a_note_not_a_failure() -> None:
    note = metric_settings.check(
        args(metric_for_best_model="bleu", greater_is_better=True, load_best_model_at_end=True),
        [],
        RETURNED,
        unknown=["MyTrainer.log"],
    )
    assert note == (
        "metric_for_best_model='bleu' not held against the metrics: MyTrainer.log adds metrics of its own "
        "to each evaluation"
    )


def test_metrics_without_compute_metrics_name_it_as_the_fix() -> None:
    with pytest.raises(diagnosis.PipelineFailure) as raised:
        metric_settings.check(
            args(metric_for_best_model="accuracy", greater_is_better=True, load_best_model_at_end=True),
            [],
            metric_settings.returned([metric_settings.Evaluated("eval", True, ())]),
            computes_metrics=False,
        )
    assert raised.value.fix == "pass compute_metrics= a function returning {'accuracy': ...}"


def test_the_settings_that_act_on_an_evaluation_split() -> None:
    best = {"load_best_model_at_end": True, "metric_for_best_model": "test_loss"}
    assert metric_settings.acting(args(**best), []) == ["load_best_model_at_end"]
    # Of a dict of evaluation splits, only the one metric_for_best_model names is acted on.
    assert metric_settings.acting(args(**best), [], "test") == ["load_best_model_at_end"]
    assert metric_settings.acting(args(**best), [], "train") == []
    assert metric_settings.acting(args(**{**best, "metric_for_best_model": "eval_train_accuracy"}), [], "train") == [
        "load_best_model_at_end"
    ]
    assert metric_settings.acting(args(metric_for_best_model="f1"), []) == ["metric_for_best_model='f1'"]
    assert metric_settings.acting(args(**best, eval_strategy="no"), []) == []  # it never evaluates
    assert metric_settings.acting(args(), []) == []

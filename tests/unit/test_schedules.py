"""The learning rate over the whole run (`schedules`): judged on the rates of each optimizer step, the run's length
read from the arguments and the data, estimated where --trainer-sample cut the training split."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_trainer.schedules import RunLength, judge, run_length
from pytest_trainer.script_runner import Cut

PEAK = 1e-3


def linear(steps: int, warmup: int, made_for: int | None = None) -> list[float]:
    """The rates of transformers' linear schedule made for `made_for` steps (the run's own by default), over `steps`."""
    total = made_for or steps
    return [
        PEAK * step / max(1, warmup) if step < warmup else PEAK * max(0.0, (total - step) / max(1, total - warmup))
        for step in range(steps)
    ]


@pytest.mark.parametrize(
    ("rates", "run"),
    [
        (linear(100, 10), RunLength(100)),
        (linear(6, 0), RunLength(6)),  # a short run without warmup
        ([PEAK] * 50, RunLength(50)),  # constant
        (linear(100, 99), RunLength(100)),  # the peak at the last step of the warmup
        (linear(1, 5), RunLength(1)),  # one step: nothing to judge
        (linear(100, 95, made_for=98), RunLength(100)),  # two steps at 0 out of 100: rounding of the epoch's length
    ],
    ids=["linear", "no-warmup", "constant", "peak-at-the-end", "one-step", "short-tail"],
)
def test_a_schedule_that_reaches_its_peak_and_runs_to_the_end_is_silent(rates: list[float], run: RunLength) -> None:
    assert judge(rates, PEAK, run) is None


def test_a_warmup_longer_than_the_run_never_reaches_the_peak() -> None:
    found = judge(linear(6, 500), PEAK, RunLength(6))
    assert found is not None
    assert found.cause.startswith("the learning rate never reaches its peak 0.001: over the run's 6 optimizer steps")
    assert "1% of the peak" in found.cause
    assert "warmup_steps well below 6" in found.fix and "(warmup_ratio=0.05)" in found.fix


def test_an_estimated_run_needs_a_clear_miss() -> None:
    estimated = RunLength(100, "estimated")
    assert judge(linear(100, 105), PEAK, estimated) is None  # 95% of the peak: the estimate may be that far off
    assert judge(linear(100, 200), PEAK, estimated) is not None


def test_a_scheduler_made_for_one_epoch_of_three_leaves_two_at_zero() -> None:
    found = judge(linear(18, 0, made_for=6), PEAK, RunLength(18))
    assert found is not None
    assert found.cause.startswith("the learning rate reaches 0 at step 6 of the run's 18 optimizer steps: the last 12")
    assert "num_training_steps=18" in found.fix


def arguments(**given: object) -> SimpleNamespace:
    defaults = {"max_steps": -1, "train_batch_size": 8, "gradient_accumulation_steps": 1, "num_train_epochs": 1}
    return SimpleNamespace(**{**defaults, **given})


def trainer(rows: int, **given: object) -> SimpleNamespace:
    return SimpleNamespace(args=arguments(**given), train_dataset=[None] * rows)


def test_the_run_length_is_max_steps_else_epochs_over_the_data() -> None:
    assert run_length(trainer(48, max_steps=7), ()) == RunLength(7)
    assert run_length(trainer(48, num_train_epochs=3), ()) == RunLength(18)
    assert run_length(trainer(48, gradient_accumulation_steps=4, num_train_epochs=2), ()) == RunLength(4)
    assert run_length(trainer(50, dataloader_drop_last=True), ()) == RunLength(6)


def test_a_sampled_training_split_is_scaled_back_to_its_stored_rows() -> None:
    found = run_length(trainer(64), (Cut("train", 64, 600), Cut("test", 64, 100)))
    assert isinstance(found, RunLength)
    assert found.steps == 75
    assert "estimated from the 600 stored rows of train, which --trainer-sample cut to 64" in found.estimated
    assert run_length(trainer(64), (Cut("data.jsonl", 64, 600),)).steps == 75  # type: ignore[union-attr]


def test_a_run_whose_length_cannot_be_known_is_said() -> None:
    assert "none is named train" in str(run_length(trainer(64), (Cut("a", 64, 600), Cut("b", 64, 100))))
    unsized = SimpleNamespace(args=arguments(), train_dataset=iter(()))
    assert run_length(unsized, ()) == "the training data has no length and max_steps is not set"

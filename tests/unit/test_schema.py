"""What stages hand later stages (`schema`): typed figures, read by attribute, and the same numbers by name for the
reports."""

from __future__ import annotations

import json
import math

import pytest

from pytest_trainer import schema
from pytest_trainer.stages.base import StageResult


def test_measured_figures_reach_the_report_by_name_beside_the_stages_own() -> None:
    result = StageResult("overfit", "cpu", figures={"extra": 2.0}, measured=schema.Overfit(2.3, 0.4, 16, 1e-3))
    assert result.figures == {
        "loss_before": 2.3,
        "loss_after": 0.4,
        "overfit_steps": 16.0,
        "learning_rate": 1e-3,
        "extra": 2.0,
    }
    assert result.measured_as(schema.Overfit).loss_after == 0.4


def test_a_stage_read_as_another_kind_is_refused_naming_it() -> None:
    result = StageResult("forward", "cpu", measured=schema.Forward(1.1))
    with pytest.raises(TypeError, match="the forward stage measured Forward"):
        result.measured_as(schema.Backward)
    with pytest.raises(TypeError, match="measured None"):
        StageResult("collate", "cpu").measured_as(schema.Forward)


def test_item_facts_travel_as_strict_json_and_come_back_whole() -> None:
    facts = schema.ItemFacts("train.py", "overfit", "cpu", diagnosis="the loss grew", fix="lower the rate")
    facts.figures = {"loss_after": float("nan"), "loss_before": 2.5}
    text = facts.to_json()
    assert "NaN" not in text and '"nan"' in text  # strict JSON: any program parses it
    back = schema.ItemFacts.from_json(text)
    assert back.figures["loss_before"] == 2.5 and back.figures["loss_after"] != back.figures["loss_after"]
    assert (back.script, back.stage, back.device, back.diagnosis, back.fix) == (
        "train.py",
        "overfit",
        "cpu",
        "the loss grew",
        "lower the rate",
    )


def test_the_price_of_sampling_travels_typed_to_the_report() -> None:
    """The targets stage of an online RL trainer measures what sampling the batch's completions cost: the report
    reads it by attribute from the item's facts, and the JSON report still shows it by name."""
    result = StageResult("targets", "cpu", figures={"completions": 8.0}, measured=schema.Sampling(3.5))
    assert result.figures == {"sampling_seconds": 3.5, "completions": 8.0}
    facts = schema.ItemFacts(
        "grpo.py", "targets", "cpu", sampling_seconds=result.measured_as(schema.Sampling).sampling_seconds
    )
    assert schema.ItemFacts.from_json(facts.to_json()).sampling_seconds == 3.5
    assert schema.ItemFacts.from_json('{"script": "a.py", "stage": "load", "device": "cpu"}').sampling_seconds == 0.0


def test_facts_of_a_newer_writer_keep_what_this_reader_knows() -> None:
    back = schema.ItemFacts.from_json('{"script": "a.py", "stage": "load", "device": "cpu", "added_later": 1}')
    assert (back.script, back.blocked, back.notes) == ("a.py", False, [])


def test_only_failures_and_errors_are_bad_outcomes() -> None:
    assert [outcome.value for outcome in schema.Outcome if outcome.bad] == ["failed", "error"]
    assert f"{schema.Outcome.SKIPPED}" == "skipped"


def test_a_non_finite_figure_is_still_strict_json() -> None:
    """Figures reach the reports from items that passed, where they are finite; should a NaN ever reach one, the
    junit property, the JSON report and the step summary stay JSON a strict parser reads."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    facts = {
        "stage": "forward",
        "figures": {"loss": math.nan, "norm": math.inf, "low": -math.inf, "ok": 1.5},
        "notes": [],
        "rows": [[math.nan, 2]],
    }
    assert json.loads(schema.to_json(facts), parse_constant=refuse) == {
        "stage": "forward",
        "figures": {"loss": "nan", "norm": "inf", "low": "-inf", "ok": 1.5},
        "notes": [],
        "rows": [["nan", 2]],
    }

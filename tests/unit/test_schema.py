"""What stages hand later stages (`schema`): typed figures, read by attribute, and the same numbers by name for the
reports."""

from __future__ import annotations

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

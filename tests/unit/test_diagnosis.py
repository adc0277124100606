"""The errors a user is shown (`pytest_trainer.diagnosis`): the cause first, the fix, and no finding hidden behind another.

Pinned: a failure renders its cause, then "fix:", then its details; a finding blocks nothing, a pipeline failure blocks
the stages that need it; findings of one stage are reported together, the first first, with their pictures; a failure
that breaks training carries the findings found beside it, an internal error stays as it is; `findings_last` runs
every check, raises a breaking failure at once and the findings after the last check; an exception is the pipeline's
when a part of it raised it (the innermost part names it), else the plugin's own; a library error nothing explains
names that part and says it is unexplained; a bug of the plugin says so and names the check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_trainer import diagnosis
from pytest_trainer.diagnosis import Finding, PipelineFailure


def test_a_failure_shows_its_cause_then_its_fix_then_its_details() -> None:
    failure = PipelineFailure("the labels hold the pad id", "pad with -100", ["row 3: [5, 0, 0]"])
    assert str(failure) == "the labels hold the pad id\n  fix: pad with -100\n  row 3: [5, 0, 0]"
    assert failure.blocks and not Finding("a", "b").blocks


def test_findings_of_one_stage_are_one_failure_the_first_first_with_every_picture() -> None:
    first, second = Finding("cause one", "fix one", ["row 1"]), Finding("cause two", "fix two", ["row 2"])
    first.pictures["rows"] = []
    second.pictures["asked"] = []
    found = diagnosis.combined([first, second])
    assert (found.cause, found.fix) == ("cause one", "fix one")
    assert found.details == ("row 1", "also: cause two", "  fix: fix two", "  row 2")
    assert set(found.pictures) == {"rows", "asked"}
    assert not found.blocks


def test_a_breaking_failure_carries_the_findings_found_beside_it() -> None:
    broken = PipelineFailure("no labels", "add a labels column")
    broken.unexplained = True
    made = diagnosis.also(broken, [Finding("a frozen head", "unfreeze it")])
    assert type(made) is PipelineFailure and made.unexplained
    assert made.details == ("also: a frozen head", "  fix: unfreeze it")
    assert diagnosis.also(broken, []) is broken
    internal = diagnosis.InternalError("collate", KeyError("x"))
    assert diagnosis.also(internal, [Finding("a", "b")]) is internal


def test_findings_last_runs_every_check_and_raises_the_findings_together() -> None:
    ran: list[str] = []

    def finds(name: str) -> None:
        ran.append(name)
        raise Finding(f"{name} found", "fix")

    with pytest.raises(Finding) as found:
        diagnosis.findings_last([lambda: finds("one"), lambda: ran.append("quiet"), lambda: finds("two")])
    assert ran == ["one", "quiet", "two"]
    assert found.value.cause == "one found" and "also: two found" in found.value.details


def test_findings_last_raises_a_breaking_failure_at_once() -> None:
    ran: list[str] = []

    def breaks() -> None:
        raise PipelineFailure("no batch", "fix the collator")

    with pytest.raises(PipelineFailure, match="no batch") as raised:
        diagnosis.findings_last([lambda: ran.append("first"), breaks, lambda: ran.append("after")])
    assert ran == ["first"] and not isinstance(raised.value, Finding)
    diagnosis.findings_last([lambda: None])  # nothing found: nothing raised


def test_an_exception_is_the_pipeline_s_when_a_part_of_it_raised_it_and_the_innermost_part_names_it() -> None:
    with (
        pytest.raises(ValueError) as raised,
        diagnosis.pipeline_part("the collator"),
        diagnosis.pipeline_part("the dataset's transform"),
    ):
        raise ValueError("bad row")
    assert diagnosis.part_of(raised.value) == "the dataset's transform"
    assert diagnosis.owned_by_pipeline(raised.value)
    plugin_bug = KeyError("stage")
    assert diagnosis.part_of(plugin_bug) is None and not diagnosis.owned_by_pipeline(plugin_bug)
    assert diagnosis.owned_by_pipeline(PipelineFailure("a", "b"))


def test_a_library_error_nothing_explains_names_the_part_and_is_counted_as_unexplained() -> None:
    failure = diagnosis.raised_by(RuntimeError("shape mismatch\nmore lines"), "the model's forward")
    assert failure.cause == "the model's forward raised RuntimeError: shape mismatch"
    assert failure.fix.startswith("the traceback below shows the call in which the model's forward raised it")
    assert failure.unexplained
    assert diagnosis.raised_by(RuntimeError(), "the loss").cause == "the loss raised RuntimeError: (no message)"


def test_a_bug_of_the_plugin_says_so_and_names_the_check() -> None:
    error = diagnosis.InternalError("targets", AttributeError("'NoneType' object has no attribute 'ids'\nmore"))
    assert error.cause == (
        "internal error of pytest-trainer in the targets check (AttributeError: 'NoneType' object has no attribute 'ids')"
    )
    assert "bug of pytest-trainer, not of your pipeline" in error.fix


def test_a_script_error_names_the_script_or_the_command_and_where() -> None:
    error = diagnosis.ScriptError(Path("/repo/train.py"), "the script built no Trainer", "build one", "train.py:12")
    assert str(error) == "train.py: the script built no Trainer\n  at train.py:12\n  fix: build one"
    error.name = "`accelerate launch train.py`"
    assert error.render().startswith("`accelerate launch train.py`: the script built no Trainer")

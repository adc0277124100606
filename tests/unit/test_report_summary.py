"""The report of the pipeline items (`pytest_trainer.report.summary`), from the reports pytest makes of each phase.

Pinned, on `pytest.TestReport`s built with the facts an item carries (`schema.ItemFacts`, as the plugin attaches them):
a record gathers an item's phases (its failure's cause from the facts, else the first line pytest shows; a skip's
reason); the stage-by-device grid numbers each skip reason once; what did not run is one line per device and cause;
the price of an opt-in stage and of sampling completions is said; a script where nothing failed is one line; the
notes of how the pipeline was run differently are said once; the GitHub step summary shows the table, each failure's
cause and fix, and the items as strict JSON. That pytest prints them is held by tests/e2e/test_report_summary.py.
"""

from __future__ import annotations

import json

import pytest

from pytest_trainer.report.summary import PROPERTY, Grid, PipelineReport, count, not_run
from pytest_trainer.schema import ItemFacts, Outcome


def report(
    stage: str,
    device: str = "cpu",
    outcome: str = "passed",
    when: str = "call",
    longrepr: object = None,
    duration: float = 0.5,
    **facts: object,
) -> pytest.TestReport:
    """pytest's report of one phase of `train.py::stage[device]`, carrying the item's facts."""
    carried = ItemFacts("train.py", stage, device, **facts)  # type: ignore[arg-type]
    return pytest.TestReport(
        f"train.py::{stage}[{device}]",
        ("train.py", None, f"{stage}[{device}]"),
        {},
        outcome,  # type: ignore[arg-type]
        longrepr,  # type: ignore[arg-type]
        when,  # type: ignore[arg-type]
        duration=duration,
        user_properties=[(PROPERTY, carried.to_json())],
    )


def gathered(*reports: pytest.TestReport) -> PipelineReport:
    found = PipelineReport()
    for made in reports:
        found.add(made)
    return found


def text(lines: list) -> list[str]:
    return ["".join(piece for piece, _ in line) for line in lines]


def section(found: PipelineReport) -> list[str]:
    (title, lines), *_ = found.terminal_sections()
    assert title == "pytest-trainer: train.py"
    return text(lines)


def test_a_failure_keeps_the_cause_and_fix_its_facts_carry_and_its_phases_add_up() -> None:
    found = gathered(
        report("collate", when="setup", duration=0.25),
        report("collate", outcome="failed", diagnosis="labels hold the pad id", fix="pad with -100", duration=1.0),
    )
    (record,) = found.records()
    assert (record.outcome, record.diagnosis, record.fix, record.duration) == (
        Outcome.FAILED,
        "labels hold the pad id",
        "pad with -100",
        1.25,
    )


def test_a_failure_without_facts_of_its_own_shows_the_first_line_pytest_shows() -> None:
    (record,) = gathered(report("forward", outcome="failed", longrepr="\n  AssertionError: loss is nan\n")).records()
    assert record.diagnosis == "AssertionError: loss is nan"
    (errored,) = gathered(report("forward", outcome="failed", when="setup", longrepr="E")).records()
    assert errored.outcome == Outcome.ERROR


def test_a_report_without_facts_is_no_pipeline_item() -> None:
    plain = pytest.TestReport("test_x.py::test_y", ("test_x.py", 1, "test_y"), {}, "passed", None, "call")
    assert gathered(plain).records() == []


def test_the_grid_numbers_each_skip_reason_once() -> None:
    skip = ("train.py", 1, "Skipped: no token sequence")
    found = gathered(
        report("dataset"),
        report("padding", outcome="skipped", when="setup", longrepr=skip),
        report("lengths", outcome="skipped", when="setup", longrepr=skip),
        report("forward", outcome="failed", diagnosis="the loss is NaN", fix="lower the learning rate"),
    )
    grid = Grid.of(found.records())
    assert grid.devices == ["cpu"]
    assert [(stage, cells[0].text) for stage, cells in grid.rows] == [
        ("dataset", "passed"),
        ("padding", "skipped [1]"),
        ("lengths", "skipped [1]"),
        ("forward", "FAILED"),
    ]
    assert grid.reasons == {"no token sequence": 1}
    lines = section(found)
    assert "  [1] no token sequence" in lines


def test_what_did_not_run_is_one_line_per_device_and_cause() -> None:
    blocked = ("train.py", 1, "Skipped: blocked by forward[cpu]")
    missing = ("train.py", 1, "Skipped: no CUDA on this machine")
    found = gathered(
        report("backward", outcome="skipped", when="setup", longrepr=blocked, blocked=True),
        report("step", outcome="skipped", when="setup", longrepr=blocked, blocked=True),
        report("forward", "cuda", outcome="skipped", when="setup", longrepr=missing, unavailable=True),
        report("backward", "cuda", outcome="skipped", when="setup", longrepr=missing, unavailable=True),
    )
    assert not_run(found.records()) == [
        ("cpu: 2 items not run, ", "blocked by forward[cpu]: backward, step"),
        ("cuda: 2 items not run: ", "no CUDA on this machine"),
    ]


def test_a_script_where_nothing_failed_is_one_line_with_its_skips() -> None:
    skip = ("train.py", 1, "Skipped: no token sequence")
    lines = section(gathered(report("dataset"), report("padding", outcome="skipped", when="setup", longrepr=skip)))
    assert lines == ["the 1 item that ran passed", "  skipped padding[cpu]: no token sequence"]
    assert section(gathered(report("dataset"), report("collate")))[0] == "all 2 items that ran passed"


def test_the_price_of_an_opt_in_stage_and_of_sampling_is_said() -> None:
    found = gathered(
        report("distributed", opt_in="processes", duration=21.0),
        report("targets", sampling_seconds=3.25),
    )
    lines = section(found)
    assert "  distributed[cpu] took 21.0 s (opt-in: --trainer-processes)" in lines
    assert (
        "  sampling completions took 3.2 s (generation and reward functions, once for every item; in targets[cpu])"
        in lines
    )


def test_how_the_pipeline_was_run_differently_is_said_once_per_script() -> None:
    twin = "model: the twin of org/model (2 layers)"
    found = gathered(
        report("load", notes=[twin, "a note of the stage's own"]),
        report("forward", notes=[twin, "precision: bf16 turned off: this machine has no GPU"]),
    )
    lines = section(found)
    assert lines.count(twin) == 1
    assert "precision: bf16 turned off: this machine has no GPU" in lines
    assert "a note of the stage's own" not in lines


def test_failures_shown_with_the_library_s_own_error_are_counted() -> None:
    found = gathered(
        report("forward", outcome="failed", diagnosis="RuntimeError: boom", fix="fix it", unexplained=True)
    )
    assert [record.name for record in found.unexplained()] == ["forward[cpu]"]
    assert section(found)[-1].startswith("1 failure shown with the library's own error only")


def test_the_step_summary_shows_the_table_each_failure_and_strict_json() -> None:
    found = gathered(
        report("dataset"),
        report("forward", outcome="failed", diagnosis="the loss is NaN", fix="lower the learning rate"),
    )
    found.add(report("step", figures={"loss_after": float("nan")}))
    markdown = found.markdown()
    assert "| stage | cpu |" in markdown and "| forward | **FAILED** |" in markdown
    assert "**forward[cpu]**: the loss is NaN  \nfix: lower the learning rate" in markdown
    data = markdown.split("```json\n")[1].split("\n```")[0]

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    items = json.loads(data, parse_constant=refuse)  # strict: NaN is written "nan"
    assert [item["stage"] for item in items] == ["dataset", "forward", "step"]
    assert items[2]["figures"] == {"loss_after": "nan"}


def test_count_says_one_item_and_several_items() -> None:
    assert (count(1, "item"), count(0, "item"), count(3, "item")) == ("1 item", "0 items", "3 items")

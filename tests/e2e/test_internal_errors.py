"""A bug of pytest-trainer is reported as one, never as the user's pipeline failure; the user's errors are named."""

from __future__ import annotations

import json
import textwrap

import pytest
from pipeline_runs import GOOD_SCRIPT, outcomes, run_script, write

#: A conftest that plants a bug in the plugin's own code (a helper of the lengths property).
PLANTED_BUG = """
    import pytest
    import pytest_trainer.strategies

    @pytest.fixture(autouse=True)
    def planted_bug(monkeypatch):
        def resize(row, length, pipeline):
            raise ZeroDivisionError("planted bug")
        monkeypatch.setattr(pytest_trainer.strategies, "resize", resize)
"""


def test_an_exception_in_the_plugin_is_an_internal_error(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    project.makeconftest(textwrap.dedent(PLANTED_BUG))
    result = run_script(project, "--trainer-stages=forward,lengths", "--trainer-report=report.json")
    assert outcomes(result) == {"forward[cpu]": "PASSED", "lengths[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "lengths[[]cpu[]]: internal error of pytest-trainer in the lengths check (ZeroDivisionError: planted bug)",
            "*fix: this is a bug of pytest-trainer, not of your pipeline: please report it with the traceback below",
            '*raise ZeroDivisionError("planted bug")*',
        ]
    )
    result.stdout.no_fnmatch_line("*lengths*failed:*")
    item = next(
        entry
        for entry in json.loads((project.path / "report.json").read_text())["items"]
        if entry["stage"] == "lengths"
    )
    assert item["diagnosis"].startswith("internal error of pytest-trainer in the lengths check")


def test_an_exception_in_the_users_collator_names_the_collator(project: pytest.Pytester) -> None:
    write(
        project,
        "train.py",
        textwrap.dedent(GOOD_SCRIPT).replace(
            "trainer = Trainer(",
            "def collate(features):\n"
            "    raise RuntimeError('my collator is broken')\n"
            "trainer = Trainer(data_collator=collate, ",
        ),
    )
    result = run_script(project, "--trainer-stages=dataset,collate")
    assert outcomes(result) == {"dataset[cpu]": "PASSED", "collate[cpu]": "FAILED"}
    result.stdout.fnmatch_lines(
        [
            "collate[[]cpu[]] failed: the training dataloader (its dataset and data_collator) raised RuntimeError: my collator is broken",
            "*fix: *",
        ]
    )
    result.stdout.no_fnmatch_line("*internal error*")

"""A newcomer's first slips, answered with the command that does what was meant: a training script given to pytest
as a test file (not imported: it would train), a misspelt option, a -k expression that deselects every pipeline
item. The pure logic is in tests/unit/test_usage.py."""

from __future__ import annotations

import pytest
from pipeline_runs import GOOD_SCRIPT, run_script, write


def test_a_training_script_given_as_a_test_file_is_not_run_and_gets_the_command(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT + '\nopen("trained", "w").write("the script ran")\n')
    result = project.runpytest("train.py")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*ERROR collecting train.py*",
            "train.py is a training script, not a test file: pytest would import it and run its training. To test "
            "its pipeline: pytest --trainer-module=train.py",
        ]
    )
    assert not (project.path / "trained").exists()


def test_a_test_file_that_builds_a_trainer_is_still_a_test_file(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_trainer="""
        from transformers import Trainer

        def build():
            return Trainer  # Trainer(...) built and .train() called in a real test

        def test_it():
            assert build().train
        """
    )
    project.runpytest("test_trainer.py").assert_outcomes(passed=1)


def test_a_misspelt_option_is_a_usage_error_with_the_option_meant(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    result = project.runpytest("--trainer-modul=train.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --trainer-modul is no option of pytest-trainer; did you mean --trainer-module? --trainer-module=train.py"
        ]
    )


def test_a_keyword_that_deselects_every_pipeline_item_says_what_it_meant(project: pytest.Pytester) -> None:
    write(project, "train.py", GOOD_SCRIPT)
    result = run_script(project, "-k", "fowrard")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(
        [
            "pytest-trainer: -k 'fowrard' deselected every pipeline item: they are named by stage and device, "
            "load[[]cpu[]], dataset[[]cpu[]], *; did you mean -k 'forward'?"
        ]
    )
    assert "deselected every pipeline item" not in run_script(project, "-k", "forward").stdout.str()

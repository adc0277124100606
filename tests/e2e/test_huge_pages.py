"""The script runs with torch's huge pages asked for from the start of the session, unless the user or the command
under test said otherwise; the session leaves the environment as it found it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pipeline_runs import GOOD_SCRIPT, write

from pytest_trainer.huge_pages import VARIABLE

#: The smallest correct script, which writes down the setting it was run with.
SEEING_SCRIPT = (
    """
    import os, pathlib
    pathlib.Path(os.environ["SEEN_AT"]).write_text(os.environ.get("THP_MEM_ALLOC_ENABLE", "unset"))
"""
    + GOOD_SCRIPT
)
#: The setting once pytest has collected, before any script runs (a test of the user's own could allocate then).
COLLECTING_CONFTEST = """
    import os, pathlib

    def pytest_collection_finish(session):
        pathlib.Path(os.environ["COLLECTED_AT"]).write_text(os.environ.get("THP_MEM_ALLOC_ENABLE", "unset"))
"""


def _seen(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, given: str) -> tuple[str, str]:
    """The setting at the end of collection and the one the script ran with."""
    monkeypatch.setenv("SEEN_AT", str(tmp_path / "seen.txt"))
    monkeypatch.setenv("COLLECTED_AT", str(tmp_path / "collected.txt"))
    write(project, "train.py", SEEING_SCRIPT)
    write(project, "conftest.py", COLLECTING_CONFTEST)
    result = project.runpytest(given, "--trainer-devices=cpu", "--trainer-stages=forward")
    assert result.ret == 0, result.stdout.str()
    return (tmp_path / "collected.txt").read_text(), (tmp_path / "seen.txt").read_text()


def test_huge_pages_are_asked_for_as_pytest_starts_and_the_environment_is_put_back(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    assert _seen(project, monkeypatch, tmp_path, "--trainer-module=train.py") == ("1", "1")
    assert VARIABLE not in os.environ


def test_a_users_own_setting_is_what_the_script_runs_with(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(VARIABLE, "0")
    assert _seen(project, monkeypatch, tmp_path, "--trainer-module=train.py") == ("0", "0")
    assert os.environ[VARIABLE] == "0"


def test_a_command_that_sets_it_is_left_to_set_it(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    given = f"--trainer-command={VARIABLE}=0 python train.py"
    assert _seen(project, monkeypatch, tmp_path, given) == ("unset", "0")
    assert VARIABLE not in os.environ

"""The script runs with torch's huge pages asked for, unless the user said otherwise; the session leaves the environment
as it found it."""

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


def _seen(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    seen = tmp_path / "seen.txt"
    monkeypatch.setenv("SEEN_AT", str(seen))
    write(project, "train.py", SEEING_SCRIPT)
    result = project.runpytest("--trainer-module=train.py", "--trainer-devices=cpu", "--trainer-stages=forward")
    assert result.ret == 0, result.stdout.str()
    return seen.read_text()


def test_the_script_runs_with_huge_pages_asked_for_and_the_environment_is_put_back(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    assert _seen(project, monkeypatch, tmp_path) == "1"
    assert VARIABLE not in os.environ


def test_a_users_own_setting_is_what_the_script_runs_with(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(VARIABLE, "0")
    assert _seen(project, monkeypatch, tmp_path) == "0"
    assert os.environ[VARIABLE] == "0"

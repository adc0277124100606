"""The user's folders put back as they were before the script ran (`pytest_trainer.user_files`), in a temporary tree.

Pinned: in an output folder that was there, a file the run created is removed, a small file it changed gets its old
content back (an unchanged one is left alone), a large file rewritten is named as what cannot be put back, and the
report line says so before anything is changed; a folder the run created is removed whole; the folder that holds the
script is the project, never watched; what the run made in the working directory is removed, unless other pytest
processes share it (pytest-xdist), where it is left and said.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pytest_trainer import user_files
from pytest_trainer.user_files import UserFolders


def old(path: Path, content: bytes) -> Path:
    """A file written well before the script started."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    past = time.time_ns() - 60 * 10**9
    os.utime(path, ns=(past, past))
    return path


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with its script, an output folder from an earlier run, and a working directory of its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    old(tmp_path / "project" / "train.py", b"import transformers\n")
    old(tmp_path / "outputs" / "config.yaml", b"lr: 1e-4\n")
    old(tmp_path / "outputs" / "kept.txt", b"unchanged\n")
    return tmp_path


def folders(tree: Path) -> UserFolders:
    return UserFolders(tree / "project" / "train.py", tree / "sandbox")


def test_an_output_folder_that_was_there_gets_its_files_back(tree: Path) -> None:
    watched = folders(tree)
    watched.watch("outputs")
    (tree / "outputs" / "config.yaml").write_bytes(b"lr: 0\n")
    (tree / "outputs" / "tokenizer.json").write_bytes(b"{}")
    (tree / "outputs" / "logs").mkdir()
    (tree / "outputs" / "logs" / "run.log").write_bytes(b"started\n")
    (line,) = watched.written()
    assert line == (
        f"{tree / 'outputs'}: written by the script before train(); 2 new files removed; 1 changed files put back "
        "when the session ends"
    )
    assert (tree / "outputs" / "tokenizer.json").exists()  # only said, not done yet
    watched.restore()
    assert sorted(path.name for path in (tree / "outputs").iterdir()) == ["config.yaml", "kept.txt"]
    assert (tree / "outputs" / "config.yaml").read_bytes() == b"lr: 1e-4\n"


def test_a_large_file_rewritten_is_named_as_what_cannot_be_put_back(tree: Path) -> None:
    big = old(tree / "outputs" / "model.safetensors", b"0" * (user_files.KEPT_FILE_BYTES + 1))
    watched = folders(tree)
    watched.watch("outputs")
    big.write_bytes(b"1" * 10)
    (line,) = watched.written()
    assert line.endswith("rewritten and too large to put back: model.safetensors when the session ends")


def test_a_folder_the_run_created_is_removed_whole(tree: Path) -> None:
    watched = folders(tree)
    watched.watch("runs/today")
    (tree / "runs" / "today").mkdir(parents=True)
    (tree / "runs" / "today" / "args.json").write_text("{}")
    (line,) = watched.written()
    assert line.startswith(f"{tree / 'runs'}: created by the script before train(), with 1 files")
    watched.restore()
    assert not (tree / "runs").exists()


def test_the_folder_that_holds_the_script_is_never_watched(tree: Path) -> None:
    watched = folders(tree)
    watched.watch("project")
    watched.watch(".")
    (tree / "project" / "notes.md").write_text("mine")
    assert watched.written() == []
    watched.restore()
    assert (tree / "project" / "notes.md").exists()


def test_what_the_run_made_in_the_working_directory_is_removed(tree: Path) -> None:
    watched = folders(tree)
    (tree / "last_run_prepared").mkdir()
    (tree / "last_run_prepared" / "data.arrow").write_bytes(b"x")
    (tree / ".pytest_cache").mkdir()  # a test tool's, never the script's
    assert watched.written() == [
        f"{tree / 'last_run_prepared'}: made by the script before train(), in the working directory; removed when "
        "the session ends"
    ]
    watched.restore()
    assert not (tree / "last_run_prepared").exists() and (tree / ".pytest_cache").exists()


def test_under_xdist_what_the_run_made_in_the_working_directory_is_left_and_said(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watched = folders(tree)
    (tree / "cache").mkdir()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert watched.written() == [
        f"{tree / 'cache'}: made by the script before train(); left, as other pytest processes work in this directory "
        "too"
    ]
    watched.restore()
    assert (tree / "cache").exists()

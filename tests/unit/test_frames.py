"""Whose code a frame runs (`pytest_trainer.frames`): one rule for the script runner, the judges of several processes
and the failures' tracebacks."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

import pytest_trainer
from pytest_trainer import frames

PLUGIN_FILE = str(Path(pytest_trainer.__file__).parent / "distributed" / "rank.py")
STDLIB = sysconfig.get_paths()["stdlib"]


@pytest.mark.parametrize(
    ("path", "owner"),
    [
        ("/venv/lib/python3.11/site-packages/transformers/trainer.py", "transformers"),
        ("/usr/lib/python3/dist-packages/torch/nn/modules/module.py", "torch"),
        ("/venv/lib/python3.11/site-packages/six.py", "six"),
        ("/venv/lib/python3.11/site-packages/_pytest/python.py", "_pytest"),
        (PLUGIN_FILE, frames.PLUGIN),
        ("/venv/lib64/python3.11/site-packages/pytest_trainer/items.py", frames.PLUGIN),  # installed, through a link
        (f"{STDLIB}/threading.py", frames.PYTHON),
        (f"{STDLIB}/runpy.py", "runpy"),
        ("<frozen runpy>", "runpy"),
        ("<string>", frames.PYTHON),
        ("/home/me/repo/train.py", frames.USER),
        ("/tmp/pytest-of-me/pytest-3/test_pytest_trainer0/train.py", frames.USER),  # the plugin's name, not its code
    ],
)
def test_each_frame_has_one_owner(path: str, owner: str) -> None:
    assert frames.owner(path) == owner


def test_a_library_is_named_and_the_user_s_code_is_not() -> None:
    assert frames.library("/venv/lib/python3.11/site-packages/peft/tuners/lora/model.py") == "peft"
    assert frames.library("/home/me/repo/train.py") is None
    assert frames.library(PLUGIN_FILE) is None
    assert frames.is_users("/home/me/repo/data/collate.py")
    assert not frames.is_users(f"{STDLIB}/threading.py")


def test_plumbing_is_the_plugin_pytest_and_runpy_only() -> None:
    assert frames.is_plumbing(PLUGIN_FILE)
    assert frames.is_plumbing("/venv/lib/python3.11/site-packages/pluggy/_callers.py")
    assert frames.is_plumbing(f"{STDLIB}/runpy.py")
    assert not frames.is_plumbing("/venv/lib/python3.11/site-packages/transformers/trainer.py")
    assert not frames.is_plumbing("/home/me/repo/train.py")

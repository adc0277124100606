"""Whose code a stack frame runs: the user's, an installed library's, Python's own, or this plugin's.

One rule for every place that reads a traceback or a stack dump: the library whose code raised a script's error, the
frames of a rank's stack that are the user's, the plumbing folded out of a failure's traceback.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path, PurePath

#: The owner of this plugin's own frames.
PLUGIN = "pytest-trainer"
#: The owner of the standard library's frames.
PYTHON = "python"
#: The owner of every other frame: the script, or a file of the user's repository.
USER = "user"
#: Frames that only carry a call to the user's code or from it: this plugin's, pytest's, pluggy's and runpy's.
PLUMBING = frozenset({PLUGIN, "_pytest", "pytest", "pluggy", "runpy"})

#: This package's folder, as imported and as resolved (a virtualenv's lib64 is often a link to its lib).
_PACKAGES = (PurePath(__file__).parent, Path(__file__).resolve().parent)
_INSTALLED = ("site-packages", "dist-packages")
_STANDARD = tuple(PurePath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib"))


def owner(path: str | PurePath) -> str:
    """PLUGIN, the installed package's top-level name (`transformers`, `torch`, `_pytest`), `runpy`, PYTHON or USER."""
    if str(path).startswith("<"):  # `<frozen runpy>`, `<string>`: code Python made, not a file of anyone's
        return "runpy" if "runpy" in str(path) else PYTHON
    where = PurePath(path)
    if any(where.is_relative_to(package) for package in _PACKAGES):
        return PLUGIN
    parts = where.parts
    for marker in _INSTALLED:
        if marker in parts and parts.index(marker) + 1 < len(parts):
            name = parts[parts.index(marker) + 1].removesuffix(".py")
            return PLUGIN if name == _PACKAGES[0].name else name
    if any(where.is_relative_to(root) for root in _STANDARD):
        return "runpy" if where.stem == "runpy" else PYTHON
    return USER


def library(path: str | PurePath) -> str | None:
    """The installed package the code at `path` belongs to, or None (the user's, Python's or this plugin's)."""
    found = owner(path)
    return None if found in (PLUGIN, PYTHON, USER, "runpy") else found


def is_users(path: str | PurePath) -> bool:
    return owner(path) == USER


def is_plumbing(path: str | PurePath) -> bool:
    return owner(path) in PLUMBING

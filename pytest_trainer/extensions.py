"""What other packages add to pytest-trainer: trainer families and stages, declared as entry points.

A package that ships a Trainer of its own (a framework, a lab's training library) tells pytest-trainer how to feed
and score it, and may add a stage, in its `pyproject.toml`:

    [project.entry-points."pytest_trainer.families"]
    my_trainer = "my_package.testing:MyTrainerFamily"   # a subclass of pytest_trainer.Family

    [project.entry-points."pytest_trainer.stages"]
    my_stage = "my_package.testing:STAGE"               # a pytest_trainer.Stage

Installed, it is found in every run; a family it adds is tried before the built-in ones, so it may take over a
trainer class a built-in family covers. What cannot be loaded is not dropped in silence: `problems()` names each
entry point, the package that declares it and what went wrong, and pytest stops with it before collecting.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

#: The entry-point group of trainer families: each names a subclass of `pytest_trainer.Family`.
FAMILIES = "pytest_trainer.families"
#: The entry-point group of stages: each names a `pytest_trainer.Stage`.
STAGES = "pytest_trainer.stages"

_problems: list[str] = []


def _origin(entry: metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    name = getattr(dist, "name", None)
    return f"the package {name}" if name else "an installed package"


def loaded(group: str, wanted: str, fits: Callable[[Any], bool]) -> list[tuple[metadata.EntryPoint, Any]]:
    """The entry points of `group` and the objects they name, in the order of their names, those that `fits`
    accepts; a problem recorded (`problems`) for each other, naming it and `wanted`."""
    found = []
    for entry in sorted(metadata.entry_points(group=group), key=lambda entry: entry.name):
        try:
            value = entry.load()
        except Exception as error:
            refuse(entry, f"loading it raised {type(error).__name__}: {error}")
            continue
        if not fits(value):
            refuse(entry, f"it is {value!r}, not {wanted}")
            continue
        found.append((entry, value))
    return found


def refuse(entry: metadata.EntryPoint, why: str) -> None:
    """Record what is wrong with what an entry point names."""
    _problems.append(
        f"{_origin(entry)} declares {entry.name} = {entry.value!r} in the entry-point group {entry.group!r}, and {why}"
    )


def problems() -> list[str]:
    """What could not be taken from the installed packages, each with its package and the remedy."""
    return [
        f"{problem}. Fix or update that package, or uninstall it: pytest-trainer does not run without what it adds"
        for problem in dict.fromkeys(_problems)
    ]

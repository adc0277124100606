"""The ordered plan of pipeline items: which stage runs on which device, and in what order.

Read from the stages' own declarations (`stages.registry`), so adding a stage adds it to the plan. Pure and cheap
(no torch import), so collection is fast and identical on every xdist worker.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from pytest_trainer.devices import DEVICES
from pytest_trainer.stages import registry

_DECLARED = registry()
#: The stages in pipeline order: a stage only makes sense once the ones it needs work.
STAGES: tuple[str, ...] = tuple(name for name, stage in _DECLARED.items() if not stage.first and not stage.opt_in)
#: Stages that run only when a setting turns them on, and that setting's name.
OPT_IN: dict[str, str] = {name: stage.opt_in for name, stage in _DECLARED.items() if stage.opt_in}
#: Running the script up to trainer.train(): the first item of a script, once, on its first device. When it fails,
#: every other item of the script is skipped: there is no Trainer to test.
LOAD: str = next(name for name, stage in _DECLARED.items() if stage.first)
#: What each stage needs: when one of these fails, the stage is skipped as blocked instead of failing again.
NEEDS: dict[str, tuple[str, ...]] = {name: stage.needs for name, stage in _DECLARED.items() if stage.needs}

__all__ = ["DEVICES", "LOAD", "NEEDS", "OPT_IN", "STAGES", "Step", "blocked_by", "cpu_first", "plan"]


@dataclass(frozen=True)
class Step:
    """One item of the plan: a stage of one pipeline on one device."""

    stage: str
    device: str

    @property
    def name(self) -> str:
        """Item name in `--trainer-module` mode: `forward[cpu]`."""
        return f"{self.stage}[{self.device}]"

    @property
    def marker_id(self) -> str:
        """Parametrization id in marker mode: `forward-cpu`."""
        return f"{self.stage}-{self.device}"


def blocked_by(failed: str) -> set[str]:
    """Every stage that needs `failed`, directly or through another stage."""
    blocked: set[str] = set()
    for stage in _DECLARED:  # rank order: a stage's needs come before it
        if any(need == failed or need in blocked for need in NEEDS.get(stage, ())):
            blocked.add(stage)
    return blocked


def plan(stages: Iterable[str], devices: Iterable[str]) -> list[Step]:
    """A script's steps: its load, then device by device, stages in rank order within a device."""
    stage_set, on = set(stages), [device for device in DEVICES if device in set(devices)]
    if not stage_set or not on:
        return []
    return [Step(LOAD, on[0])] + [
        Step(name, device)
        for device in on
        for name, stage in _DECLARED.items()
        if name in stage_set and not stage.first and device in stage.devices
    ]


T = TypeVar("T")


def cpu_first(items: list[T], step_of: dict[int, Step]) -> list[T]:
    """Move the pipeline items so every CPU one comes before any CUDA one, leaving other items in place.

    `step_of` maps `id(item)` to its step for the pipeline items only.
    """
    slots = [index for index, item in enumerate(items) if id(item) in step_of]
    ordered = sorted((items[index] for index in slots), key=lambda item: DEVICES.index(step_of[id(item)].device))
    result = list(items)
    for index, item in zip(slots, ordered, strict=True):
        result[index] = item
    return result

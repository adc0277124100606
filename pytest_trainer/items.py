"""The collector of a `--trainer-module` script and its stage items, which are real `pytest.Function`s."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_trainer import frames, usage
from pytest_trainer.commands import Command, script_command
from pytest_trainer.diagnosis import InternalError, ScriptError, TrainerError
from pytest_trainer.plan import Step, plan
from pytest_trainer.session import session_of


class TrainerScript(pytest.File):
    """A training script given with --trainer-module: one item per stage and device, never imported as tests."""

    @property
    def command(self) -> Command:
        """How the script runs: `python SCRIPT --trainer-args`."""
        return script_command(self.path.resolve(), session_of(self.config).settings.script_args)

    def collect(self) -> Iterator[StageItem]:
        settings = session_of(self.config).settings
        for step in plan(settings.stages, settings.devices):
            yield StageItem.from_parent(self, name=step.name, callobj=check_stage, step=step)


class TrainerCommand(TrainerScript):
    """A command given with --trainer-command (`axolotl train config.yml`): named after the command, collected from
    the file it runs first, with the items of a script."""

    def __init__(self, *, command: Command, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._command = command

    @property
    def command(self) -> Command:
        return self._command


class GivenScript(pytest.File):
    """A training script given to pytest as a test file: never imported (it would train), one collection error that
    gives the command that tests its pipeline."""

    def collect(self) -> Iterator[pytest.Item]:
        raise self.CollectError(usage.script_given(os.path.relpath(self.path, self.config.invocation_params.dir)))


def check_stage(trainer_stage: Any) -> None:
    """Run this item's stage; the `trainer_stage` fixture knows which one."""
    __tracebackhide__ = True
    trainer_stage.run()


class StageItem(pytest.Function):
    """`train.py::forward[cpu]`: a stage of a script's pipeline on a device, reported in plain words."""

    def __init__(self, *, step: Step, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step = step
        parent_id = getattr(self.parent, "id", None)
        if parent_id is not None:  # pytest 9 node ids are structured: the device is the param, as --lf expects
            self._id = parent_id.child(step.stage).with_params(step.device)

    def reportinfo(self) -> tuple[Any, int, str]:
        of = f"`{self.parent.name}`" if isinstance(self.parent, TrainerCommand) else self.path.name
        return self.path, 0, f"{self.step.name} of {of}"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:  # type: ignore[override]
        if not isinstance(excinfo.value, TrainerError):
            return super().repr_failure(excinfo)
        return stated_failure(self.step.name, excinfo.value, self.path)


def stated_failure(name: str, error: TrainerError, path: Any) -> Any:
    """A failure of item `name` as pytest shows it: the cause, the fix and the library's original error in the item's
    report, the cause alone as its line of pytest's short summary."""
    if isinstance(error, InternalError):
        info = pytest.ExceptionInfo.from_exception(error.error)
        text = f"{name}: {error}\n\n" + str(info.getrepr(style="short", chain=True))
    else:
        text = f"{name} failed: {error.render()}"
        if error.__cause__ is not None:
            script = error.script if isinstance(error, ScriptError) else None
            text += "\n\noriginal error:\n" + original_error(error.__cause__, script)
    return _stated(text, error.cause, path)


def _stated(text: str, cause: str, path: Any) -> Any:
    """The failure as pytest shows it: `text` whole in the item's report, and its cause alone as the one line of
    pytest's short summary (on CI and with -vv too, which otherwise print a failure's whole text there).

    Built of pytest's own report parts, so that it travels from pytest-xdist workers unchanged.
    """
    from _pytest._code.code import ReprEntryNative, ReprExceptionInfo, ReprFileLocation, ReprTraceback

    first = cause.splitlines()[0] if cause else text.splitlines()[0]
    return ReprExceptionInfo(
        reprtraceback=ReprTraceback([ReprEntryNative([text + "\n"])], None, "native"),
        reprcrash=ReprFileLocation(str(path), 0, first),
    )


def original_error(error: BaseException, script: Any = None) -> str:
    """The library's own exception, short, without plumbing frames; under a script, its own frames first."""
    info = pytest.ExceptionInfo.from_exception(error)
    entries = info.traceback.filter(lambda entry: not frames.is_plumbing(entry.path))
    folded = 0
    if script is not None and len(entries) > 1:
        kept = [entry for entry in entries[:-1] if str(entry.path) == str(script)] + [entries[-1]]
        folded = len(entries) - len(kept)
        entries = type(entries)(kept)
    info.traceback = entries
    text = str(info.getrepr(style="short", chain=False))
    return text + (f"\n({folded} library frames folded; --fulltrace shows them)" if folded else "")

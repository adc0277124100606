"""State of one pytest process: the pipelines it loaded, the failures that block later stages, CUDA's health."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_trainer import gc_freezer, huge_pages
from pytest_trainer.commands import Command, Launch
from pytest_trainer.diagnosis import ScriptError
from pytest_trainer.plan import blocked_by
from pytest_trainer.script_runner import Sandbox, load_trainer, script_modules
from pytest_trainer.timeouts import time_limit
from pytest_trainer.user_files import UserFolders

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Origin, Pipeline
    from pytest_trainer.settings import Settings

#: Stands for every device or every stage, when the Trainer itself could not be had.
ALL = "*"
_SESSION = pytest.StashKey["TrainerSession"]()


def session_of(config: pytest.Config) -> TrainerSession:
    """The session of a pytest run (set up by the plugin's pytest_configure)."""
    return config.stash[_SESSION]


def start_session(config: pytest.Config, settings: Settings) -> TrainerSession:
    session = config.stash[_SESSION] = TrainerSession(settings, config.rootpath)
    # Called before pytest's own plugins configure, so this cleanup runs after theirs: pytest's last garbage
    # collections (unraisable exceptions) still skip the frozen objects.
    config.add_cleanup(session.freezer.thaw)
    return session


def has_session(config: pytest.Config) -> bool:
    return _SESSION in config.stash


class TrainerSession:
    def __init__(self, settings: Settings, rootpath: Path) -> None:
        self.settings = settings
        self.rootpath = rootpath
        self._scripts: dict[tuple[Command, str], Pipeline | ScriptError] = {}
        self._fixture_pipelines: dict[int, tuple[Any, Pipeline]] = {}
        self._blocked: dict[tuple[str, str, str], str] = {}
        self.cuda_broken: str | None = None
        self._output = tempfile.TemporaryDirectory(prefix="pytest-trainer-")
        #: The modules the scripts ran as, importable (so that what they define pickles) until the session ends.
        self._modules: set[str] = set()
        #: What the scripts wrote into the user's tree before train(), put back when the session ends.
        self._written: list[UserFolders] = []
        #: The libraries and the Trainers under test live as long as the session: out of the garbage collector's way.
        self.freezer = gc_freezer.Freezer()
        self.huge_pages = huge_pages.HugePages(
            commanded=any(
                name == huge_pages.VARIABLE for command in settings.commands for name, _ in command.environment
            )
        )
        if settings.modules or settings.commands:  # before anything the session collects can allocate a tensor
            self.huge_pages.enable()
        self._imported = False

    def import_libraries(self) -> None:
        """Import torch and transformers, which every stage needs, before the first one runs (once, the collector off:
        see `gc_freezer`), with huge pages asked for torch's large tensors (see `huge_pages`)."""
        if not self._imported:
            self._imported = True
            self.huge_pages.enable()
            try:
                self.freezer.import_quietly("transformers.trainer")
            except Exception:  # a broken install: the load item imports it again and says so, as a failure of its own
                return

    def script_pipeline(
        self, command: Command, factory: str | None, model: str | None = None, device: str | None = None
    ) -> Pipeline:
        """The pipeline of a script (or a command), which runs once per process however many items use it (once per way
        its model is built, where a marker's model= differs from --trainer-model).

        On a machine with a GPU, `auto` builds a model of 1B parameters or more at full size for the cuda items; the
        cpu items get its twin, as a machine without a GPU would (the script runs once more for them).
        """
        key = (command, model or self.settings.model)
        if key not in self._scripts:
            try:
                self._scripts[key] = self._load(command, factory, key[1])
            except ScriptError as error:
                self._scripts[key] = error
        found = self._scripts[key]
        if isinstance(found, ScriptError):
            raise found
        if device == "cpu" and key[1] == "auto" and _too_large_for_cpu(found):
            from pytest_trainer.twin.loading import CPU_ITEMS

            return self.script_pipeline(command, factory, CPU_ITEMS)
        return found

    def _load(self, command: Command, factory: str | None, model: str) -> Pipeline:
        script = command.file

        def hung() -> ScriptError:
            return ScriptError(
                script,
                f"the script did not build its Trainer within {self.settings.timeout:g} s",
                "look for work before trainer.train() that never ends, cut the data with --trainer-sample, "
                "or raise --trainer-timeout",
            )

        self.huge_pages.enable()  # a marked test's script (the `trainer` fixture's too) may come before any stage
        output_dir = Path(self._output.name) / f"{len(self._scripts)}-{script.stem}"
        sandbox = Sandbox(output_dir, self.settings.sample, self.settings.batch_size, model=model)
        known = script_modules()
        try:
            with time_limit(self.settings.timeout, hung):
                loaded = load_trainer(command, factory, sandbox)
        except ScriptError as error:
            if command.read_launches:
                error.name = f"`{command.text}`"
            raise
        finally:
            self._modules |= script_modules() - known
        name = script.relative_to(self.rootpath).as_posix() if script.is_relative_to(self.rootpath) else script.name
        notes = [
            *(twin.line() for twin in loaded.twins),
            *(f"not exercised: {line}" for twin in loaded.twins for line in twin.replaced),
            *(f"sampled by --trainer-sample: {line}" for line in loaded.sampled),
            *(f"precision: {line}" for line in loaded.precision),
            *(f"not exercised: {line}" for line in loaded.unexercised),
            *(f"the libraries said while the Trainer was built: {line}" for line in loaded.said),
            *(f"in this process: `{line}`, which the command starts as a new process" for line in loaded.started_here),
            *launch_notes(loaded.launches, self.settings.processes),
        ]
        if loaded.folders is not None:
            self._written.append(loaded.folders)
            notes.extend(f"put back: {line}" for line in loaded.folders.written())
        from pytest_trainer.pipeline import Origin

        origin = Origin(
            command=command,
            factory=factory,
            asked_fsdp=loaded.fsdp,
            asked_deepspeed=loaded.deepspeed,
            cuts=loaded.cuts,
            sources=loaded.sources,
            asked_precision=loaded.asked_precision,
            twins=loaded.twins,
            notes=tuple(notes),
            findings=loaded.findings,
        )
        return self._pipeline(loaded.trainer, name, origin)

    def fixture_pipeline(self, trainer: Any, name: str) -> Pipeline:
        """The pipeline of a Trainer made by a `trainer` fixture; kept per Trainer object."""
        known = self._fixture_pipelines.get(id(trainer))
        if known is None or known[0] is not trainer:
            known = (trainer, self._pipeline(trainer, name))
            self._fixture_pipelines[id(trainer)] = known
        return known[1]

    def _pipeline(self, trainer: Any, name: str, origin: Origin | None = None) -> Pipeline:
        from pytest_trainer.pipeline import Origin, Pipeline

        self.freezer.freeze()  # the Trainer and what its script made stay alive until the session ends
        return Pipeline(trainer, name, self.settings, origin or Origin())

    def blocker(self, key: str, device: str, stage: str) -> str | None:
        """Why this stage of this pipeline on this device should not run, or None."""
        if device == "cuda" and self.cuda_broken:
            return f"the CUDA context is unusable after {self.cuda_broken}"
        return self._blocked.get((key, ALL, ALL)) or self._blocked.get((key, device, stage))

    def block(self, key: str, device: str, failed: str, reason: str) -> None:
        """Skip, with `reason`, the stages that need the one that failed (all of them when `failed` is ALL)."""
        for stage in [ALL] if failed == ALL else blocked_by(failed):
            self._blocked.setdefault((key, device, stage), reason)

    def close(self) -> None:
        self.huge_pages.restore()
        for folders in self._written:
            folders.restore()
        self._output.cleanup()
        for name in self._modules:
            sys.modules.pop(name, None)


def _too_large_for_cpu(pipeline: Pipeline) -> bool:
    """Whether the pipeline's real model is one a machine without a GPU would have built as a twin."""
    import torch

    from pytest_trainer.twin.checkpoint import CPU_LIMIT

    if pipeline.twins or not torch.cuda.is_available():
        return False
    return sum(parameter.numel() for parameter in pipeline.model.parameters()) >= CPU_LIMIT


def launch_notes(launches: tuple[Launch, ...], processes: int) -> list[str]:
    """What the launchers in front of the script ask for that one process does not do, and the option that does it."""
    notes = []
    for launch in launches:
        if launch.processes is None or launch.processes > 1:
            count = launch.processes or 2
            asked = f"{launch.processes} processes" if launch.processes else "a process per GPU"
            given = f" ({launch.asked})" if launch.asked else ""
            tested = (
                f"the distributed items train it in {processes}"
                if processes > 1
                else f"--trainer-processes={count} trains it in {count} on this machine (DDP on gloo)"
            )
            notes.append(f"launcher: {launch.launcher} asks for {asked}{given}; the items run in one, and {tested}")
        if launch.engine:
            notes.append(
                f"not exercised: {launch.launcher} sets up {launch.engine}, which needs several processes on GPUs"
            )
    return notes

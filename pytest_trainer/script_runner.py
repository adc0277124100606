"""Run a user's training script up to `trainer.train()` and keep the Trainer it built.

The script runs as `python train.py` would run it (as `__main__`, its folder on `sys.path`, its own
`sys.argv`), but nothing is trained and nothing is written where the user would see it: output
goes to a temporary folder, reporting integrations and the hub are off, and the process state the
script changed (working directory, argv, path, environment, random state, logging levels, warning
filters) is put back afterwards.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import functools
import importlib
import importlib.util
import io
import itertools
import logging
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import traceback
import types
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from pytest_trainer import base_frame, commands, engines, frames, user_files
from pytest_trainer.commands import Command, CommandError, Launch
from pytest_trainer.devices import GPU_PRECISION
from pytest_trainer.diagnosis import Finding, ScriptError
from pytest_trainer.explanations import script_rows
from pytest_trainer.twin.loading import Twin, TwinError, Twins

if TYPE_CHECKING:
    from transformers import Trainer

#: Seed of the random state a script starts from (the script's own set_seed still applies).
SCRIPT_SEED = 0
#: Trainer methods that start real work; the first call stops the script.
STOP_METHODS = ("train", "evaluate", "predict", "hyperparameter_search")
#: Lines of a library's message shown as the cause of a script error (the whole error is shown below it).
MESSAGE_LINES = 4


class _StopScript(BaseException):
    """Raised from `trainer.train()`; a BaseException so a script's `except Exception` lets it through."""


class _Capture:
    """Which Trainers the script built, which one it asked to train, and how its data was sampled."""

    def __init__(self, folders: user_files.UserFolders) -> None:
        #: What the script writes into the user's tree (the output folders it names), put back when the session ends.
        self.folders = folders
        self.built: list[Trainer] = []
        self.started: Trainer | None = None
        self.sampled: list[str] = []
        #: The splits --trainer-sample cut, with the rows kept and stored.
        self.cuts: list[Cut] = []
        #: Mixed-precision settings turned off because this machine has no GPU, one line per arguments object.
        self.precision: list[str] = []
        #: The precision settings the script asked for, among GPU_PRECISION.
        self.asked: set[str] = set()
        #: Engines the script asked for that this machine cannot run, turned off: one line each.
        self.unexercised: list[str] = []
        #: What the configs of those engines get wrong, by the arguments that asked for them: the load item reports
        #: those of the Trainer's own arguments (a script may build others it does not train with).
        self.findings: list[tuple[Any, list[Finding]]] = []
        #: The DeepSpeed configs arguments asked for, by the arguments (the Trainer's own are the pipeline's).
        self.deepspeed: list[tuple[Any, engines.DeepSpeed]] = []
        #: The fsdp_config of arguments that ask for FSDP, turned off in one process (None: none asks for it).
        self.fsdp: dict[str, Any] | None = None
        #: What the libraries logged at WARNING or above while the script ran ("trl: ..."), each once.
        self.said: list[str] = []
        #: The launchers in front of what ran (the command's own, and those of the commands it started).
        self.launches: list[Launch] = []
        #: The training commands the command started as new processes, read and run in this process instead.
        self.started_here: list[str] = []
        #: The datasets map() made others from, and those in scope where train() was called.
        self.sources: list[Any] = []

    @property
    def trainer(self) -> Trainer | None:
        return self.started or (self.built[-1] if self.built else None)


@dataclass(frozen=True)
class Sandbox:
    """How the script's run is contained and cut down."""

    output_dir: Path
    #: Rows kept of each split that datasets.load_dataset returns (0 keeps all).
    sample: int = 0
    #: per_device_train_batch_size forced on the Trainer (0 keeps the script's).
    batch_size: int = 0
    #: Seed of the random state the script starts from. Each rank of `distributed` gets its own (SCRIPT_SEED + rank),
    #: as each process of a real torchrun job starts from its own OS entropy: unseeded shuffles and splits differ there.
    seed: int = SCRIPT_SEED
    #: How the script's models are built: `auto`, `twin` or `real` (see `twin.loading`).
    model: str = "auto"

    @property
    def twins(self) -> Path:
        """The folder of the twins' weights, shared by the scripts of the session."""
        return self.output_dir.parent / "twins"


@dataclass(frozen=True)
class Cut:
    """A split --trainer-sample cut: its name ("train", or the source's), the rows kept and the rows stored."""

    split: str
    kept: int
    stored: int


@dataclass(frozen=True)
class LoadedScript:
    trainer: Trainer
    #: What --trainer-sample cut, one line per split, for the report.
    sampled: tuple[str, ...]
    #: The splits --trainer-sample cut, with the rows kept and stored.
    cuts: tuple[Cut, ...] = ()
    #: Mixed precision asked for by the script and turned off on this machine without a GPU.
    precision: tuple[str, ...] = ()
    #: The precision settings the script asked for (bf16, fp16, ...), whether or not this machine could keep them.
    asked_precision: frozenset[str] = frozenset()
    #: Engines the script asked for that this machine cannot run (vLLM, DeepSpeed), turned off and not exercised.
    unexercised: tuple[str, ...] = ()
    #: The fsdp_config of a script that asks for FSDP, which one process cannot run (None: it does not ask).
    fsdp: dict[str, Any] | None = None
    #: What the script wrote into the user's tree before train() (its output folders, the working directory), to be
    #: put back once the session no longer needs it: `UserFolders.restore`.
    folders: user_files.UserFolders | None = None
    #: The warnings the libraries logged while the script built its Trainer, which pytest would show only on a failure.
    said: tuple[str, ...] = ()
    #: The models the script asked for that were built as twins.
    twins: tuple[Twin, ...] = ()
    #: The launchers in front of what ran, whose process count and engine one process does not run.
    launches: tuple[Launch, ...] = ()
    #: The training commands the command started as new processes, run in this process instead.
    started_here: tuple[str, ...] = ()
    #: The datasets a map() of the script turned into others of as many rows without some columns, and those the scope
    #: that called train() holds: the data as stored before map() turned it into features, which a check may read
    #: back against the split's rows.
    sources: tuple[Any, ...] = ()
    #: What the configs of the engines the script asks for get wrong, which the load item reports.
    findings: tuple[Finding, ...] = ()
    #: The DeepSpeed config the Trainer's arguments ask for, run here or not (None: they ask for none).
    deepspeed: engines.DeepSpeed | None = None


def load_trainer(command: Command, factory: str | None, sandbox: Sandbox) -> LoadedScript:
    """Run `command` (or call its script's `factory`) and return its Trainer, contained by `sandbox`."""
    script = command.file
    if not script.is_file():
        raise ScriptError(
            script,
            f"{script} does not exist",
            "check the path: a marker's module= is taken from the test file's folder, else from the rootdir",
        )
    capture = _Capture(user_files.UserFolders(script, sandbox.output_dir))
    if command.launch is not None:
        capture.launches.append(command.launch)
    output = _Tail()
    twins = Twins(sandbox.model, sandbox.twins)
    with (
        _folders_put_back_on_error(capture.folders),
        _process_state_restored(command, sandbox.seed),
        _sandboxed_transformers(sandbox, capture),
        _sampled_datasets(sandbox.sample, capture),
        _mapped_datasets(capture),
        _library_records(capture.said),
        twins.installed(),
        _launches_read(command, capture, sandbox.seed),
        output,
    ):
        try:
            if factory:
                _call_factory(script, factory, capture)
            else:
                run_command(command)
        except _StopScript:
            pass
        except ScriptError:
            raise
        except (TwinError, engines.EngineError) as error:
            raise ScriptError(script, error.cause, error.fix, _script_frame(script, error)) from error
        except SystemExit as exit:
            raise _exit_error(command, exit, output.lines()) from None
        except SyntaxError as error:
            where = f"{error.filename}:{error.lineno}" if error.filename else None
            raise ScriptError(script, f"syntax error: {error.msg}", "fix the syntax of the script", where) from error
        except ImportError as error:
            explained = script_rows.explain(error)  # a name a newer release of the library no longer has
            if explained is not None:
                raise ScriptError(script, explained.cause, explained.fix, _script_frame(script, error)) from error
            message, needed = _import_failure(error)
            raise ScriptError(
                script,
                f"import failed: {message}",
                f"install the missing package in the test environment ({needed or 'see below'}) or fix the import",
                _script_frame(script, error),
            ) from error
        except Exception as error:
            explained = script_rows.explain(error)
            if explained is not None:
                raise ScriptError(script, explained.cause, explained.fix, _script_frame(script, error)) from error
            raise _raised(script, error) from error
    trainer = capture.trainer
    if trainer is None:
        capture.folders.restore()
        raise ScriptError(
            script,
            "the script finished without building a transformers.Trainer",
            'build a Trainer at the top level or in a main() under `if __name__ == "__main__":`, '
            "or name a function that returns one with --trainer-factory=NAME",
        )
    for name in STOP_METHODS:
        trainer.__dict__.pop(name, None)
    return LoadedScript(
        trainer,
        tuple(capture.sampled),
        tuple(capture.cuts),
        tuple(capture.precision),
        frozenset(capture.asked),
        tuple(capture.unexercised),
        capture.fsdp,
        capture.folders,
        tuple(capture.said),
        tuple(twins.made),
        tuple(dict.fromkeys(capture.launches)),
        tuple(capture.started_here),
        tuple({id(source): source for source in capture.sources}.values()),
        tuple(found for arguments, findings in capture.findings if arguments is trainer.args for found in findings),
        next((config for arguments, config in capture.deepspeed if arguments is trainer.args), None),
    )


def datasets_in_scope(frame: types.FrameType) -> list[Any]:
    """The `datasets.Dataset`s a frame's variables and its module's hold (each split of a DatasetDict), each once."""
    import datasets

    found: dict[int, Any] = {}
    for scope in (frame.f_locals, frame.f_globals):
        for value in list(scope.values()):
            for dataset in value.values() if isinstance(value, datasets.DatasetDict) else [value]:
                if isinstance(dataset, datasets.Dataset):
                    found.setdefault(id(dataset), dataset)
    return list(found.values())


#: The libraries whose logged warnings are kept: their root loggers (transformers' does not propagate to the root).
LIBRARIES = ("transformers", "trl", "peft", "accelerate", "datasets", "sentence_transformers")


#: Terminal colour codes some libraries put in their log messages.
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: accelerate's logger adapter puts the process first ("[RANK 0] ...").
RANK = re.compile(r"^\[RANK \d+\] ")
#: transformers' report of the weights a checkpoint lacked or held beyond the model's.
LOAD_REPORT = re.compile(r"LOAD REPORT")


class _Said(logging.Handler):
    """Keeps each warning a library logs, once, as "library: message"."""

    def __init__(self, said: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.said = said

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = RANK.sub("", " ".join(ANSI.sub("", record.getMessage()).split()))
        except Exception:  # a record whose arguments do not format: the library's own problem, not the script's
            return
        if LOAD_REPORT.search(message) and not re.search(r"\b(UNEXPECTED|MISMATCH\w*)\b", message):
            return  # weights newly initialised for a new head: what fine-tuning a head expects
        line = f"{record.name.split('.')[0]}: {message}"
        if line not in self.said:
            self.said.append(line)


@contextmanager
def _library_records(said: list[str]) -> Iterator[None]:
    """Keep what the libraries log at WARNING or above while the script builds its Trainer; pytest shows captured logs
    only for a failed item, and `load` passes. The loggers' own handlers and levels are left as they are."""
    handler = _Said(said)
    loggers = [logging.getLogger(name) for name in LIBRARIES]
    for found in loggers:
        found.addHandler(handler)
    try:
        yield
    finally:
        for found in loggers:
            found.removeHandler(handler)


@contextmanager
def _folders_put_back_on_error(folders: user_files.UserFolders) -> Iterator[None]:
    """Put what the script wrote back at once where it fails: nothing later reads it. (Where it builds its Trainer, the
    session puts it back at its end, since the stages may read it: a base model the script saved and loaded.)"""
    try:
        yield
    except BaseException:
        folders.restore()
        raise


def _call_factory(script: Path, factory: str, capture: _Capture) -> None:
    from transformers import Trainer

    namespace = vars(run_script(script, script.stem))
    function = namespace.get(factory)
    if not callable(function):
        found = sorted(name for name, value in namespace.items() if isinstance(value, types.FunctionType))
        raise ScriptError(
            script,
            f"no function {factory!r} in the script",
            f"--trainer-factory names one of its functions: {', '.join(found) or 'it defines none'}",
        )
    made = base_frame.call_at_base(function)
    if not isinstance(made, Trainer):
        raise ScriptError(
            script,
            f"{factory}() returned {type(made).__name__}, not a transformers.Trainer",
            f"make {factory}() return the Trainer it builds",
        )
    capture.started = made


#: Names the scripts' modules are importable under in this process, one per script run.
_SCRIPT_NAMES = itertools.count()
SCRIPT_MODULE_PREFIX = "__trainer_script_"


def script_modules() -> set[str]:
    """The names of the scripts' modules importable now (see `run_script`)."""
    return {name for name in sys.modules if name.startswith(SCRIPT_MODULE_PREFIX)}


def run_command(command: Command) -> None:
    """Run what `command` runs, as Python runs it: a file or a module as `__main__`, or a console script's function."""
    if command.kind == "entry point":
        module_name, _, attribute = command.target.partition(":")
        function: Any = functools.reduce(getattr, attribute.split("."), importlib.import_module(module_name))
        code: Any = base_frame.call_at_base(function)
        if code not in (None, 0):  # the console script passes what its function returns to sys.exit
            raise SystemExit(code)
    elif command.kind == "module":
        parent = command.target.rpartition(".")[0]
        if parent:  # as `python -m` does, the module's package first
            importlib.import_module(parent)
        run_script(command.file, "__main__", command.target)
    else:
        run_script(command.file, "__main__")


def run_script(script: Path, name: str, module_name: str | None = None) -> types.ModuleType:
    """Run `script` as the module `name` (`__main__`, as `python train.py` runs it) and keep it importable.

    While it runs, the script is `sys.modules[name]`, as in a direct run (`module_name`: run as `python -m` runs that
    module). Afterwards the name goes back to its owner
    (pytest's own `__main__`), and the module stays importable under a name of its own, which the classes and
    functions it defined now carry: pickle finds them by that name, so a `TrainingArguments` subclass, a collator
    dataclass or a callback of the script survives `torch.save` and checkpoints as in a direct run. The module is
    kept even when the script stops with an error, for the same reason.
    """
    module = types.ModuleType(name)
    module.__file__ = str(script)
    module.__dict__.update(__builtins__=builtins, __spec__=None, __loader__=None, __package__=None)
    if module_name is not None:  # `python -m pkg.mod`: its spec and package, so that its relative imports work
        module.__spec__ = importlib.util.spec_from_file_location(module_name, script)
        module.__package__ = module_name.rpartition(".")[0]
    with io.open_code(str(script)) as source:
        code = compile(source.read(), str(script), "exec")
    owner = sys.modules.get(name)
    sys.modules[name] = module
    try:
        base_frame.call_at_base(exec, code, module.__dict__)  # where `python train.py` runs it: see `base_frame`
    finally:
        if owner is not None:
            sys.modules[name] = owner
        else:
            sys.modules.pop(name, None)
        _keep_importable(module, name)
    return module


def _keep_importable(module: types.ModuleType, name: str) -> None:
    """Register `module` under a name of its own and give that name to what it defined as `name`."""
    alias = f"{SCRIPT_MODULE_PREFIX}{next(_SCRIPT_NAMES)}__"
    sys.modules[alias] = module
    namespace = vars(module)
    namespace["__name__"] = alias  # what the script defines later (in a function the plugin calls) carries it too
    seen: set[int] = set()
    pending = [value for value in list(namespace.values()) if isinstance(value, (type, types.FunctionType))]
    while pending:
        value = pending.pop()
        if id(value) in seen or getattr(value, "__module__", None) != name:
            continue
        if isinstance(value, types.FunctionType) and value.__globals__ is not namespace:
            continue
        seen.add(id(value))
        with contextlib.suppress(AttributeError, TypeError):  # a class whose __module__ cannot be set stays as it is
            value.__module__ = alias
        if isinstance(value, type):  # nested classes, and methods that pickle by reference
            pending.extend(member for member in vars(value).values() if isinstance(member, (type, types.FunctionType)))


#: The fix of an error no explanation row knows, raised while the script built its Trainer: in the script's own code,
#: or in a library the script's line called.
SCRIPT_FIX = "fix the script at the line above, so that `python {script}` gets as far as trainer.train()"
LIBRARY_FIX = (
    "the message comes from {library}, called by the script's line above while it built its objects: change what "
    "that line passes, as the message says"
)


def _raised(script: Path, error: Exception) -> ScriptError:
    """An error nothing explains: the raiser's own message first, then where the script called it."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    message = "\n    ".join(lines[:MESSAGE_LINES]) + (" ..." if len(lines) > MESSAGE_LINES else "") or "(no message)"
    where = _script_frame(script, error)
    library = _library_of(error)
    fix = SCRIPT_FIX.format(script=script.name) if library is None else LIBRARY_FIX.format(library=library)
    found = ScriptError(script, f"{type(error).__name__}: {message}", fix, where)
    found.unexplained = True  # counted in the report, so that the table of explained errors can grow
    return found


def _library_of(error: BaseException) -> str | None:
    """The installed package whose code raised `error` (its innermost frame), or None for the script's own code."""
    trace = error.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    if trace is None:
        return None
    return frames.library(trace.tb_frame.f_code.co_filename)


def _exit_error(command: Command, exit: SystemExit, last_lines: list[str]) -> ScriptError:
    output = "\n".join(f"    | {line}" for line in last_lines) or "    (no output)"
    script, given = command.file, list(command.args)
    if exit.code == 2 and any("usage:" in line or "error:" in line for line in last_lines):
        fix = (
            f"the script's argument parser rejected {given}: give the arguments it needs with "
            '--trainer-args="--name value ..." (or the trainer_args ini key)'
            if not command.read_launches
            else f"the command's argument parser rejected {given}: change them in `{command.text}` until the "
            "command runs as it is"
        )
    else:
        fix = "let the script reach trainer.train() without exiting, or use --trainer-factory=NAME"
    return ScriptError(
        script,
        f"the script exited (sys.exit with code {exit.code!r}) before building a Trainer; its last output:\n{output}",
        fix,
    )


def _import_failure(error: ImportError) -> tuple[str, str | None]:
    """An ImportError's first sentence on one line (transformers starts its backend errors with a line break), and the
    package it names: the module not found, or the library transformers says a class requires."""
    words = " ".join(str(error).split())
    first = re.match(r"(.+?[.!])(?:\s|$)", words)
    named = re.search(r"requires (?:the )?(\S+) library", words)
    return (first.group(1) if first else words), error.name or (named.group(1) if named else None)


def _script_frame(script: Path, error: BaseException) -> str | None:
    """`path:line: code` of the deepest frame of the script itself, where the user should look."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if Path(frame.filename) == script]
    if not frames:
        return None
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"


@contextmanager
def _sandboxed_transformers(sandbox: Sandbox, capture: _Capture) -> Iterator[None]:
    """Point every TrainingArguments at the sandbox, record each Trainer, stop at the first train()."""
    import torch
    from transformers import Trainer, TrainingArguments

    original_post_init = TrainingArguments.__post_init__
    original_init = Trainer.__init__

    def post_init(self: Any) -> None:
        if self.output_dir:
            capture.folders.watch(self.output_dir)
        processes = next((launch.processes for launch in reversed(capture.launches) if launch.processes), None)
        asked_engines = engines.for_this_machine(self, processes)  # the script's own values, before any is changed
        capture.unexercised += [line for line in asked_engines.unexercised if line not in capture.unexercised]
        if asked_engines.findings:
            capture.findings.append((self, asked_engines.findings))
        if asked_engines.deepspeed is not None:
            capture.deepspeed.append((self, asked_engines.deepspeed))
        launched = launcher_precision_for_this_machine(self)
        asked = precision_for_this_machine(self)
        original_post_init(self)
        fsdp = fsdp_for_this_machine(self)
        if fsdp is not None:
            capture.fsdp = fsdp
        sandbox_arguments(self, sandbox)
        capture.asked.update(asked + launched)
        wants = [f"{name}=True" for name in asked] + [f"mixed_precision={name} (its launcher's)" for name in launched]
        line = (
            f"the script asks for {', '.join(wants)}; this machine has no GPU, so "
            "the items run in fp32 and the precision stage checks the script's own precision"
        )
        if wants and not torch.cuda.is_available() and line not in capture.precision:
            capture.precision.append(line)

    # Frameworks read these signatures (to choose between processing_class= and tokenizer=, say): each replacement
    # keeps the original's name, docstring and signature.
    @functools.wraps(original_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        arguments = kwargs.get("args", args[1] if len(args) > 1 else None)
        if arguments is not None:  # the script may have changed them after they were built
            if arguments.output_dir:
                capture.folders.watch(arguments.output_dir)
            sandbox_arguments(arguments, sandbox)
        original_init(self, *args, **kwargs)
        capture.built.append(self)
        for name in STOP_METHODS:  # also stops subclasses that override train() without super()
            setattr(self, name, types.MethodType(stops[name], self))

    def stopping(method: Any) -> Any:
        @functools.wraps(method)
        def stop(self: Any, *args: Any, **kwargs: Any) -> None:
            capture.started = self
            capture.sources += datasets_in_scope(sys._getframe(1))
            raise _StopScript

        return stop

    stops = {name: stopping(getattr(Trainer, name)) for name in STOP_METHODS}
    with ExitStack() as stack:
        stack.enter_context(
            mock.patch.object(TrainingArguments, "__post_init__", functools.wraps(original_post_init)(post_init))
        )
        stack.enter_context(mock.patch.object(Trainer, "__init__", init))
        for name in STOP_METHODS:
            stack.enter_context(mock.patch.object(Trainer, name, stops[name]))
        yield


def precision_for_this_machine(args: Any) -> list[str]:
    """Without a GPU, turn the script's mixed precision off so that it builds its Trainer; return what it asked for.

    The CPU items then run in fp32 (the precision stage checks the script's own precision); on a machine with a GPU
    nothing changes.
    """
    import torch

    if torch.cuda.is_available():
        return []
    asked = [name for name in GPU_PRECISION if getattr(args, name, None)]
    for name in asked:
        setattr(args, name, None if name == "tf32" else False)
    return asked


def launcher_precision_for_this_machine(args: Any) -> list[str]:
    """The mixed precision a launcher set for the script (`accelerate launch --mixed_precision bf16` sets
    ACCELERATE_MIXED_PRECISION, which the Trainer follows where the arguments ask for none); without a GPU it is
    turned off for this run, as the arguments' own precision is."""
    import torch

    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").lower()
    if launched not in ("bf16", "fp16") or any(getattr(args, name, None) for name in ("bf16", "fp16")):
        return []
    if not torch.cuda.is_available():
        os.environ["ACCELERATE_MIXED_PRECISION"] = "no"  # put back with the rest of the environment after the script
    return [launched]


def fsdp_for_this_machine(args: Any) -> dict[str, Any] | None:
    """Turn off the FSDP a script asks for where it runs in one process (the Trainer refuses FSDP outside distributed
    training) or without GPUs (accelerate sets FSDP up on GPU-like devices only: transformers 5 falls back to DDP,
    4.57 stops); return its fsdp_config, or None where it asks for none or runs as asked, on GPUs under torchrun."""
    import torch

    distributed = os.environ.get("WORLD_SIZE", "1") != "1"
    if not getattr(args, "fsdp", None) or (distributed and torch.cuda.is_available()):
        return None
    config = dict(getattr(args, "fsdp_config", None) or {})
    args.fsdp = False if isinstance(args.fsdp, bool) else type(args.fsdp)()
    if hasattr(args, "fsdp_plugin_args"):
        args.fsdp_plugin_args = None
    os.environ.pop("ACCELERATE_USE_FSDP", None)  # put back with the rest of the environment after the script
    return config


def sandbox_arguments(args: Any, sandbox: Sandbox) -> None:
    """Make training arguments harmless: no user folder, no reporting, no hub, no worker processes."""
    args.output_dir = str(sandbox.output_dir)
    if hasattr(args, "logging_dir"):
        args.logging_dir = str(sandbox.output_dir / "logs")
    if sandbox.batch_size:
        args.per_device_train_batch_size = sandbox.batch_size
    args.report_to = []
    args.push_to_hub = False
    # No worker processes, and so none of the settings only workers take (DataLoader refuses a prefetch factor
    # without workers).
    args.dataloader_num_workers = 0
    args.dataloader_persistent_workers = False
    if hasattr(args, "dataloader_prefetch_factor"):
        args.dataloader_prefetch_factor = None
    args.dataloader_pin_memory = False


#: Dropped columns that the checks read back against the rows made from them: a question (its answers with it) and a
#: sampling rate. Audio and word lists are told by their features.
READ_BACK = ("question", "sampling_rate")


def kept_as_stored(dataset: Any, dropped: set[str]) -> bool:
    """Whether a dataset whose columns `dropped` a map() turned into others holds what a check reads back: audio (an
    Audio feature, values with an array, or arrays beside a sampling_rate column), word lists (sequences of strings),
    or a column of READ_BACK. Any other is let go, so that the text a map() tokenized is not kept alive."""
    import datasets

    features = getattr(dataset, "features", None) or {}
    for name in dropped:
        feature = features.get(name)
        inner = getattr(feature, "feature", None)
        if (
            name in READ_BACK
            or isinstance(feature, datasets.Audio)
            or (isinstance(feature, dict) and "array" in feature)
            or getattr(inner, "dtype", None) in ("string", "large_string")
            or ("sampling_rate" in features and str(getattr(inner, "dtype", "")).startswith("float"))
        ):
            return True
    return False


@contextmanager
def _mapped_datasets(capture: _Capture) -> Iterator[None]:
    """Keep each dataset a map() turned into one of as many rows without some of its columns (audio turned into
    features, answers into positions): the data as stored, row for row, once the script has dropped it."""
    import datasets

    original = datasets.Dataset.map

    @functools.wraps(original)
    def map(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = original(self, *args, **kwargs)
        dropped = set(self.column_names) - set(getattr(made, "column_names", None) or ())
        if isinstance(made, datasets.Dataset) and len(made) == len(self) and kept_as_stored(self, dropped):
            capture.sources.append(self)
        return made

    with mock.patch.object(datasets.Dataset, "map", map):
        yield


@contextmanager
def _sampled_datasets(rows: int, capture: _Capture) -> Iterator[None]:
    """Cut every split that datasets.load_dataset returns to `rows`, before the script maps it."""
    import datasets

    if rows <= 0:
        yield
        return
    original = datasets.load_dataset

    def load_dataset(*args: Any, **kwargs: Any) -> Any:
        return _sample(original(*args, **kwargs), rows, capture, str(args[0]) if args else "load_dataset")

    with mock.patch.object(datasets, "load_dataset", load_dataset):
        yield


def _sample(loaded: Any, rows: int, capture: _Capture, source: str, split: str = "") -> Any:
    import datasets

    from pytest_trainer import tables

    if isinstance(loaded, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        return type(loaded)({name: _sample(part, rows, capture, source, name) for name, part in loaded.items()})
    where = f"{source}[{split}]" if split else source
    if isinstance(loaded, datasets.Dataset) and len(loaded) > rows:
        # Spread over the split: stored data is often sorted (an image folder by class, a corpus by source).
        capture.sampled.append(f"{where}: {rows} of {len(loaded)} rows, evenly spaced")
        capture.cuts.append(Cut(split or source, rows, len(loaded)))
        return loaded.select(tables.spread(len(loaded), rows))
    if isinstance(loaded, datasets.IterableDataset):
        capture.sampled.append(f"{where}: first {rows} rows of the stream")
        return loaded.take(rows)
    return loaded


@contextmanager
def _process_state_restored(command: Command, seed: int = SCRIPT_SEED) -> Iterator[None]:
    """Give the script the process its command would (`python script`), and take back everything it changed (signal
    handlers included)."""
    import numpy
    import torch

    saved_cwd, saved_argv, saved_path = os.getcwd(), sys.argv[:], sys.path[:]
    saved_environ = os.environ.copy()
    saved_random = (random.getstate(), numpy.random.get_state(), torch.random.get_rng_state())
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    saved_levels = [(logger, logger.level) for logger in loggers]
    # A framework may catch Ctrl-C to save its model where its config says (axolotl does): that is for a real run.
    handled = [signal.SIGINT, signal.SIGTERM] if threading.current_thread() is threading.main_thread() else []
    saved_handlers = [(number, signal.getsignal(number)) for number in handled]
    sys.argv = list(command.argv)
    if command.cwd is not None:
        os.chdir(command.cwd)
    os.environ.update(dict(command.environment))
    if command.kind == "script":  # python puts the script's folder first on the path; `python -m` the working one
        sys.path.insert(0, str(command.file.parent))
    elif command.kind == "module":
        sys.path.insert(0, os.getcwd())
    # A fresh process would start from the same random state whatever ran before: so does the script,
    # so a model it builds before seeding anything gets the same weights in every run.
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)
    try:
        with warnings.catch_warnings():
            yield
    finally:
        os.chdir(saved_cwd)
        sys.argv[:], sys.path[:] = saved_argv, saved_path
        os.environ.clear()
        os.environ.update(saved_environ)
        random.setstate(saved_random[0])
        numpy.random.set_state(saved_random[1])
        torch.random.set_rng_state(saved_random[2])
        for logger, level in saved_levels:
            logger.setLevel(level)
        for number, handler in saved_handlers:
            if handler is not None:
                signal.signal(number, handler)


@contextmanager
def _launches_read(command: Command, capture: _Capture, seed: int) -> Iterator[None]:
    """Where a command starts its training as a new process (`axolotl train` execs `accelerate launch -m
    axolotl.cli.train ...`, `swift sft` runs `python .../sft.py ...`), read that command and run it here instead, as
    the launcher in front of a command is read. Only a Python or launcher command whose output is not captured is
    taken; any other (a git call, a `python -c` probe) runs as asked."""
    if not command.read_launches:
        yield
        return

    def training(args: Any, cwd: Any = None, env: Any = None) -> Command | None:
        words = shlex.split(args) if isinstance(args, str) else [os.fspath(word) for word in args]
        changed = {name: value for name, value in (env or {}).items() if os.environ.get(name) != value}
        try:
            return commands.read(words, Path(cwd or os.getcwd()), changed)
        except CommandError as error:
            if commands.launcher_of(words) is None:
                return None  # not a training command (a `python -c` probe, a tool): it runs as asked
            raise ScriptError(  # a launcher that would refuse what it is given: the run would stop there
                command.file,
                f"the command starts `{shlex.join(words)}`, and {error}",
                f"change what `{command.text}` passes on to {commands.launcher_of(words)} (a framework's CLI passes "
                "the options it does not know to its launcher): give them in the form the framework's own options "
                "take",
            ) from None
        except IndexError:
            return None

    def run_here(started: Command) -> None:
        capture.started_here.append(started.text)
        if started.launch is not None:
            capture.launches.append(started.launch)
        with _process_state_restored(started, seed):
            run_command(started)

    def calling(original: Any) -> Any:
        @functools.wraps(original)
        def call(args: Any, *rest: Any, **kwargs: Any) -> Any:
            captured = kwargs.get("capture_output") or subprocess.PIPE in (kwargs.get("stdout"), kwargs.get("stderr"))
            started = None if captured or kwargs.get("shell") else training(args, kwargs.get("cwd"), kwargs.get("env"))
            if started is None:
                return original(args, *rest, **kwargs)
            run_here(started)  # it stops at trainer.train(); a command that returns built no Trainer
            return subprocess.CompletedProcess(args, 0) if original is subprocess.run else 0

        return call

    def replacing(original: Any, with_environment: bool) -> Any:
        @functools.wraps(original)
        def replace(path: Any, args: Any, *env: Any) -> Any:
            started = training(args, None, env[0] if with_environment and env else None)
            if started is None:
                return original(path, args, *env)
            run_here(started)
            raise SystemExit(0)  # the process was replaced by one that ended

        return replace

    with ExitStack() as patches:
        for name in ("run", "call", "check_call"):
            patches.enter_context(mock.patch.object(subprocess, name, calling(getattr(subprocess, name))))
        for name, with_environment in (("execv", False), ("execve", True), ("execvp", False), ("execvpe", True)):
            patches.enter_context(mock.patch.object(os, name, replacing(getattr(os, name), with_environment)))
        yield


class _Tail:
    """Pass the script's stdout and stderr through, keeping the last lines for error messages."""

    def __init__(self, keep: int = 15) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._streams: list[Any] = []

    def lines(self) -> list[str]:
        return list(self._lines)

    def __enter__(self) -> _Tail:
        self._streams = [sys.stdout, sys.stderr]
        sys.stdout, sys.stderr = _TeeStream(sys.stdout, self._lines), _TeeStream(sys.stderr, self._lines)
        return self

    def __exit__(self, *exc_info: object) -> None:
        sys.stdout, sys.stderr = self._streams


class _TeeStream(io.TextIOBase):
    def __init__(self, stream: Any, lines: collections.deque[str]) -> None:
        self._stream, self._lines = stream, lines

    def write(self, text: str) -> int:
        self._lines.extend(line for line in text.splitlines() if line.strip())
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

"""Every option, ini key and marker of the plugin: one table that registers and resolves them all.

Each row of `OPTIONS` is one setting of `Settings`: its `--trainer-*` option, its `trainer_*` ini key, its help,
and the converter that reads a raw value. A setting comes from the command line, else from the ini file, else
from its default; a bad value is reported with where it came from, so the user knows which line to fix.
"""

from __future__ import annotations

import difflib
import math
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_trainer import settings as defaults
from pytest_trainer.commands import Command
from pytest_trainer.plan import DEVICES, LOAD, OPT_IN, STAGES
from pytest_trainer.settings import Settings

__all__ = ["MARKER_LINE", "OPTIONS", "Option", "Settings", "parse_choices", "register", "resolve"]

MARKER_LINE = (
    "trainer_pipeline(module=None, command=None, stages=None, devices=None, factory=None, model=None): run the test "
    "once per pipeline stage and device of a Trainer, given through the trainer_stage fixture (with module= or "
    "command=, the script's load first, unless stages= leaves it out). Without either, the Trainer comes from a "
    "`trainer` fixture you define. command= is a command as you run it (`axolotl train config.yml`), run from the "
    "rootdir. model= builds the script's models as --trainer-model does (auto, twin, real)."
)


@dataclass(frozen=True)
class Raw:
    """A value as given, and where: the phrase a message names, and the folder a relative path is taken from."""

    value: Any
    source: str
    base: Path


#: Reads a raw value into the setting's value, or raises pytest.UsageError naming its source.
Convert = Callable[[Raw], Any]


@dataclass(frozen=True)
class Option:
    """One setting: `--trainer-<name>` on the command line and `trainer_<name>` in the ini file."""

    name: str
    help: str
    convert: Convert
    metavar: str = "VALUE"
    #: How the ini file holds it (pytest's ini types); None: the command line only.
    ini: str | None = "string"
    #: `--trainer-module` may be given several times.
    repeated: bool = False
    #: A switch without a value (store_true).
    switch: bool = False

    @property
    def flag(self) -> str:
        return f"--trainer-{self.name.replace('_', '-')}"

    @property
    def key(self) -> str:
        return f"trainer_{self.name}"

    def raw(self, config: pytest.Config) -> Raw | None:
        """The value given for it, command line over ini file; None when neither gives one."""
        given = config.getoption(self.key)
        if given not in (None, [], False):
            return Raw(given, f"{self.flag} on the command line", config.invocation_params.dir)
        if self.ini is None:
            return None
        base = config.inipath.parent if config.inipath else config.rootpath
        try:
            ini_value = config.getini(self.key)
        except (ValueError, pytest.UsageError) as error:  # a bool key that is not one
            raise pytest.UsageError(f"{self.key} in {config.inipath or 'the ini file'}: {error}") from None
        if ini_value in ("", [], None) or ini_value is False:
            return None
        return Raw(ini_value, f"{self.key} in {config.inipath or 'the ini file'}", base)


# ---- converters -------------------------------------------------------------------------------------------------


def _scripts(raw: Raw) -> tuple[Path, ...]:
    paths = [Path(os.path.normpath(raw.base / path)) for path in raw.value]
    for path in paths:
        if path.is_dir():
            raise pytest.UsageError(
                f"{raw.source}: {path} is a folder, not a script; give the path of the training script (a .py file)"
            )
        if not path.is_file():
            raise pytest.UsageError(
                f"{raw.source}: {path} does not exist{_near_miss(path)}; give the path of the "
                "training script (a .py file)"
            )
        if path.suffix != ".py":
            raise pytest.UsageError(
                f"{raw.source}: {path} is not a Python file; give the path of the training script "
                "(a .py file), which the plugin runs up to trainer.train()"
            )
    return tuple(dict.fromkeys(path.resolve() for path in paths))


def _commands(raw: Raw) -> tuple[Command, ...]:
    """Each command read from the folder it is taken from (where pytest was started, or the ini file's)."""
    from pytest_trainer.commands import CommandError, parse

    given = [raw.value] if isinstance(raw.value, str) else list(raw.value)
    found = []
    for text in given:
        try:
            found.append(parse(text, raw.base))
        except CommandError as error:
            raise pytest.UsageError(f"{raw.source}: {error}") from None
    return tuple(dict.fromkeys(found))


def _near_miss(path: Path) -> str:
    """ ", did you mean train.py?" for a script of the same folder whose name is close to the one given."""
    folder = path.parent
    if not folder.is_dir():
        return ""
    scripts = sorted(entry.name for entry in folder.glob("*.py"))
    close = difflib.get_close_matches(path.name, scripts, n=1, cutoff=0.6)
    return f" (did you mean {folder / close[0]}?)" if close else ""


def _arguments(raw: Raw) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(raw.value))
    except ValueError as error:
        raise pytest.UsageError(f"{raw.source}: cannot split {raw.value!r} into arguments: {error}") from None


def _text(raw: Raw) -> str:
    return str(raw.value)


def _count(allow_zero: bool = False) -> Convert:
    def convert(raw: Raw) -> int:
        try:
            value = int(raw.value)
        except ValueError:
            value = -1
        if value < (0 if allow_zero else 1):
            kind = "a whole number (0 for all)" if allow_zero else "a positive whole number"
            raise pytest.UsageError(f"{raw.source}: {raw.value!r} is not {kind}")
        return value

    return convert


def _number(kind: str) -> Convert:
    def convert(raw: Raw) -> float:
        try:
            value = float(raw.value)
        except ValueError:
            value = -1.0
        if not 0 <= value < math.inf:
            raise pytest.UsageError(f"{raw.source}: {raw.value!r} is not {kind}")
        return value

    return convert


def _path(raw: Raw) -> Path:
    """A path relative to where pytest was started (command line) or to the ini file."""
    return (raw.base / raw.value).resolve()


def _choices(allowed: tuple[str, ...]) -> Convert:
    return lambda raw: parse_choices(raw.value, allowed, raw.source)


def _choice(allowed: tuple[str, ...]) -> Convert:
    def convert(raw: Raw) -> str:
        value = str(raw.value).strip()
        if value not in allowed:
            raise pytest.UsageError(f"{raw.source}: unknown {value!r}; choose one of {', '.join(allowed)}")
        return value

    return convert


def _devices(raw: Raw) -> tuple[str, ...]:
    """Devices asked for by name must be here: a GPU gate that skips every item for want of a GPU is no gate."""
    from pytest_trainer.devices import unavailable_reason

    chosen = parse_choices(raw.value, DEVICES, raw.source)
    for device in chosen:
        reason = unavailable_reason(device)
        if reason:
            others = [other for other in DEVICES if other != device]
            raise pytest.UsageError(
                f"{raw.source} asks for {device}, but {reason}. Run it on a machine with a GPU, or leave {device} "
                f"out (--trainer-devices={','.join(others)}); without the option, missing devices are skipped"
            )
    return chosen


def _switch(raw: Raw) -> bool:
    return bool(raw.value)


def parse_choices(raw: str | list[str] | tuple[str, ...], allowed: tuple[str, ...], source: str) -> tuple[str, ...]:
    """Split a comma-separated list and check each name; keep the canonical order."""
    names = raw.split(",") if isinstance(raw, str) else list(raw)
    chosen = {name.strip() for name in names if name.strip()}
    unknown = sorted(chosen - set(allowed))
    if unknown:
        raise pytest.UsageError(f"{source}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(allowed)}")
    return tuple(name for name in allowed if name in chosen)


#: The stages --trainer-stages may name once the settings that turn on opt-in stages are known.
_STAGE_CHOICES = (LOAD, *STAGES, *OPT_IN)

OPTIONS: tuple[Option, ...] = (
    Option(
        "module",
        "training script whose Trainer is tested stage by stage (repeatable). The script runs as "
        "__main__ and stops where it calls trainer.train().",
        _scripts,
        "PATH",
        ini="paths",
        repeated=True,
    ),
    Option(
        "command",
        "a command as you run it, as one shell-quoted string, tested stage by stage like a --trainer-module script "
        "(repeatable; the ini key takes one per line): a console script (`axolotl train config.yml`), `python "
        "train.py ...`, `python -m pkg.train ...`, or one of those behind `accelerate launch`, `torchrun` or "
        "`deepspeed`, whose process count and precision are read as the script's intent, not run.",
        _commands,
        "COMMAND",
        ini="linelist",
        repeated=True,
    ),
    Option(
        "args",
        "command-line arguments given to the script, as one shell-quoted string (its sys.argv[1:]).",
        _arguments,
        "ARGS",
    ),
    Option(
        "factory",
        "name of a function in the script that returns a Trainer; it is called instead of running "
        "the script as __main__.",
        _text,
        "NAME",
    ),
    Option(
        "stages",
        f"comma-separated stages to run (default: all of {', '.join(STAGES)}); the script's {LOAD} "
        "item always runs first.",
        _choices(_STAGE_CHOICES),
        "STAGES",
    ),
    Option(
        "devices",
        f"comma-separated devices to run on (default: {', '.join(DEVICES)}, a device this machine lacks "
        "skipped with the reason); a device named here that this machine lacks is an error.",
        _devices,
        "DEVICES",
    ),
    Option(
        "overfit_steps",
        "most optimizer steps the overfit stage takes on one batch; it stops as soon as the loss "
        f"has fallen by a thousandth (default: {defaults.OVERFIT_STEPS}).",
        _count(),
        "N",
    ),
    Option(
        "examples",
        "hypothesis examples per property item (labels, lengths, padding); derandomized when the CI "
        f"variable is set (default: {defaults.EXAMPLES}).",
        _count(),
        "N",
    ),
    Option(
        "timeout",
        "seconds the script may take to build its Trainer, and each stage to run, before it fails as "
        f"hung (default: {defaults.TIMEOUT:g}; 0 for no limit).",
        _number("a number of seconds (0 for no limit)"),
        "SECONDS",
    ),
    Option(
        "sample",
        "rows kept of every split that datasets.load_dataset returns to the script, before it maps "
        f"them (default: {defaults.SAMPLE}; 0 keeps every row).",
        _count(allow_zero=True),
        "N",
    ),
    Option(
        "batch_size",
        "batch size of the fixed batch the stages use (default: the script's per_device_train_batch_size).",
        _count(),
        "N",
    ),
    Option(
        "gpu_memory",
        "GiB of GPU memory the memory stage forecasts against: a training step or an evaluation "
        "that needs more fails (default: the memory of the GPU present; without one the forecast is only "
        "reported).",
        _number("a number of GiB"),
        "GIB",
    ),
    Option(
        "report",
        "write a JSON report of every pipeline item (outcome, diagnosis, fix, figures) to this path.",
        _path,
        "PATH",
    ),
    Option(
        "html",
        "write a self-contained HTML report to this path: every pipeline item with its cause and fix, "
        "the rows of the first batch with the tokens trained on, the overfitting loss curve, the memory forecast "
        "and the rewards per group (where pytest-html is installed, its --html report shows them too).",
        _path,
        "PATH",
    ),
    Option(
        "baseline",
        "folder of regression baselines, one text file per script: the first run records the "
        "pipeline's key figures, later runs fail when one moved (adds the baseline[cpu] item).",
        _path,
        "DIR",
    ),
    Option(
        "processes",
        "train the script in N processes under torch.distributed.run (DDP on gloo on the CPU, NCCL "
        "on N GPUs) and check what only several processes break: adds the distributed items (default: 1, which "
        "adds nothing).",
        _count(),
        "N",
    ),
    Option(
        "model",
        "how the script's models are built: auto (default) builds a twin (the checkpoint's architecture, narrow, with "
        "random weights; its real config, tokenizer and data) where the weights are not on this machine, or where the "
        "model has 1B parameters or more and there is no GPU; twin always; real never.",
        _choice(defaults.MODELS),
        "auto|twin|real",
    ),
    Option("baseline_update", "rewrite the baselines with the figures of this run.", _switch, ini=None, switch=True),
    Option(
        "baseline_strict",
        "fail the baseline item of a script that has no baseline yet, instead of recording "
        "one (for CI, where a baseline recorded on the runner is never committed).",
        _switch,
        ini="bool",
        switch=True,
    ),
)
#: Settings named differently from their option.
_FIELDS = {"module": "modules", "command": "commands", "args": "script_args"}


def register(parser: pytest.Parser) -> None:
    group = parser.getgroup("trainer", "pytest-trainer: pipeline tests for Hugging Face training scripts")
    for option in OPTIONS:
        if option.switch:
            group.addoption(option.flag, action="store_true", default=False, help=option.help)
        elif option.repeated:
            group.addoption(option.flag, action="append", default=[], metavar=option.metavar, help=option.help)
        else:
            group.addoption(option.flag, metavar=option.metavar, help=option.help)
        if option.ini is not None:
            default = {"paths": [], "linelist": [], "bool": False}.get(option.ini, "")
            parser.addini(option.key, type=option.ini, default=default, help=option.help)  # type: ignore[arg-type]


def resolve(config: pytest.Config) -> Settings:
    """Read every setting once, command line over ini file over default."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw = option.raw(config)
        if raw is not None:
            values[_FIELDS.get(option.name, option.name)] = option.convert(raw)
    values["devices_named"] = "devices" in values
    values["stages_named"] = "stages" in values
    if values.get("processes") == 1:
        del values["processes"]  # one process is the default: no distributed item
    stages = values.get("stages", ())
    unset = [name for name, setting in OPT_IN.items() if name in stages and not values.get(setting)]
    if unset:  # an opt-in stage runs only where its setting is given
        raw = next(option for option in OPTIONS if option.name == "stages").raw(config)
        allowed = tuple(name for name in _STAGE_CHOICES if name not in unset)
        parse_choices(raw.value if raw else "", allowed, raw.source if raw else "--trainer-stages")
    if not stages:
        values["stages"] = (LOAD, *STAGES, *(name for name, setting in OPT_IN.items() if values.get(setting)))
    return Settings(**values)

"""A command as the user runs it (`--trainer-command`), read down to the Python file it runs and that file's argv.

`axolotl train config.yml`, `llamafactory-cli train sft.yaml`, `python -m pkg.train --lr 1e-4`,
`accelerate launch --num_processes 2 train.py`, `torchrun --nproc_per_node 8 train.py`, `NPROC_PER_NODE=2 swift sft
...`: each is read, never run, into a `Command`, the file Python runs first and the `sys.argv` it sees:

- a console script, through its installed entry point (the function it calls, and the module file defining it);
- `python FILE ...` and `python -m MODULE ...`, with the interpreter's own options skipped;
- a launcher in front (`torchrun`, `python -m torch.distributed.run`, `accelerate launch`, `deepspeed`), read with
  the launcher's own argument parser where it has one: what it would start becomes the command, and what it asks for
  (its process count, its mixed precision, an engine) is kept as the script's intent (`Launch`).

Nothing here imports a training library: a module is found without being imported.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import importlib.metadata
import importlib.util
import io
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

__all__ = ["Command", "CommandError", "Launch", "launcher_of", "parse", "read", "script_command"]

#: `NAME=value` before the command, as a shell reads it.
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
#: `python`, `python3`, `python3.12`, as a word or the last part of a path.
PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
#: The interpreter's options that take a value (`-W ignore`, `-X dev`); the others are single letters.
PYTHON_VALUE_OPTIONS = ("-W", "-X", "--check-hash-based-pycs")
#: Modules that are a launcher when run with `python -m`.
LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torchrun",
    "accelerate.commands.launch": "accelerate launch",
    "deepspeed.launcher.runner": "deepspeed",
}
#: deepspeed's runner options that take a value (the runner is read without deepspeed installed).
DEEPSPEED_VALUE_OPTIONS = frozenset(
    [
        "-H",
        "--hostfile",
        "-i",
        "--include",
        "-e",
        "--exclude",
        "--num_nodes",
        "--min_elastic_nodes",
        "--max_elastic_nodes",
        "--num_gpus",
        "--num_accelerators",
        "--master_port",
        "--master_addr",
        "--node_rank",
        "--launcher",
        "--launcher_args",
        "--venv_script",
        "--autotuning",
        "--bind_core_list",
        "--ssh_port",
        "--comment",
        "--enable_each_rank_log",
    ]
)
#: The forms a command may take, for the message of one that cannot be read.
FORMS = (
    "a console script (`axolotl train config.yml`), `python train.py ...`, `python -m pkg.train ...`, or one of "
    "those behind `accelerate launch`, `torchrun` or `deepspeed`"
)


class CommandError(ValueError):
    """A command that cannot be read; the message names what was tried and the form that works."""


@dataclass(frozen=True)
class Launch:
    """What a launcher in front of the script asks for: the script's intent for several processes and precision."""

    #: The launcher as the user typed it: "torchrun", "accelerate launch", "deepspeed".
    launcher: str
    #: Processes in all (per machine x machines); None where the launcher decides from the machine ("auto", "gpu").
    processes: int | None = None
    #: How the processes were asked for, as given ("--nproc_per_node 8", "num_processes: 2 in accelerate.yaml").
    asked: str = ""
    #: The mixed precision it sets for the script (accelerate's "bf16", "fp16", "fp8"), None for none.
    mixed_precision: str | None = None
    #: An engine it sets up that one process on this machine does not run ("DeepSpeed", "FSDP"), or None.
    engine: str | None = None


@dataclass(frozen=True)
class Command:
    """What runs: a Python file, as `python FILE`, `python -m MODULE` or a console script runs it."""

    #: The command as given (the items' name), or the script's path for --trainer-module.
    text: str
    #: The file Python runs first: the script, the module's file, or the file defining the entry point's function.
    file: Path
    #: `sys.argv` as that file sees it (argv[0] included).
    argv: tuple[str, ...]
    #: "script" (`python FILE`), "module" (`python -m MODULE`) or "entry point" (a console script).
    kind: Literal["script", "module", "entry point"] = "script"
    #: The module's name ("module"), or "module:function" ("entry point").
    target: str = ""
    #: The folder the command runs from; None: wherever pytest runs.
    cwd: Path | None = None
    #: Environment variables the command sets: `NAME=value` before it, and what a launcher sets for the script.
    environment: tuple[tuple[str, str], ...] = ()
    #: The launcher in front of it, if any.
    launch: Launch | None = None
    #: A training command the run starts as a new process (a framework's CLI starting `accelerate launch ...`) is
    #: read and run in this process instead (`--trainer-command`; a --trainer-module script runs as it is).
    read_launches: bool = False

    @property
    def args(self) -> tuple[str, ...]:
        return self.argv[1:]

    def to_json(self) -> dict[str, Any]:
        """Plain values, for a job file that another process reads back with `from_json`."""
        return {
            "text": self.text,
            "file": str(self.file),
            "argv": list(self.argv),
            "kind": self.kind,
            "target": self.target,
            "cwd": str(self.cwd) if self.cwd else None,
            "environment": [list(pair) for pair in self.environment],
            "read_launches": self.read_launches,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Command:
        return cls(
            data["text"],
            Path(data["file"]),
            tuple(data["argv"]),
            data["kind"],
            data["target"],
            Path(data["cwd"]) if data["cwd"] else None,
            tuple((name, value) for name, value in data["environment"]),
            read_launches=data["read_launches"],
        )


def script_command(script: Path, args: tuple[str, ...] = ()) -> Command:
    """The command of `--trainer-module=SCRIPT --trainer-args=ARGS`: `python SCRIPT ARGS`."""
    return Command(str(script), script, (str(script), *args))


def parse(text: str, cwd: Path) -> Command:
    """Read a command given as one shell-quoted string, run from `cwd`."""
    try:
        words = shlex.split(text)
    except ValueError as error:
        raise CommandError(f"cannot split {text!r} into words: {error}") from None
    if not words:
        raise CommandError(f"the command is empty; give {FORMS}")
    return replace(read(words, cwd), text=text.strip(), read_launches=True)


def read(words: list[str], cwd: Path, environment: dict[str, str] | None = None) -> Command:
    """Read a command's words (a shell's argv) run from `cwd`, down to the Python file it runs."""
    environment = dict(environment or {})
    while words and ASSIGNMENT.match(words[0]):
        name, _, value = words[0].partition("=")
        environment[name] = value
        words = words[1:]
    if not words:
        raise CommandError(f"only environment variables were given; give {FORMS} after them")
    head, rest = words[0], words[1:]
    name = Path(head).name
    text = shlex.join(words)
    if PYTHON.match(name) or _same_file(head, sys.executable):
        return _python(rest, cwd, environment, text)
    if name == "torchrun":
        return _launched("torchrun", rest, cwd, environment, text)
    if name == "accelerate":
        if not rest or rest[0] != "launch":
            sub = rest[0] if rest else "(nothing)"
            raise CommandError(
                f"`accelerate {sub}` starts no training script; give `accelerate launch [options] train.py ...`"
            )
        return _launched("accelerate launch", rest[1:], cwd, environment, text)
    if name == "deepspeed":
        return _launched("deepspeed", rest, cwd, environment, text)
    if head.endswith(".py"):
        return _script(head, rest, cwd, environment, text)
    return _entry_point(head, rest, cwd, environment, text)


def launcher_of(words: list[str]) -> str | None:
    """The launcher a command's words start (`torchrun`, `accelerate launch`, `deepspeed`, or one run with
    `python -m`), or None."""
    words = [word for word in words if not ASSIGNMENT.match(word)]
    name = Path(words[0]).name if words else ""
    if name in ("torchrun", "deepspeed"):
        return name
    if name == "accelerate":
        return "accelerate launch"
    if (PYTHON.match(name) or name == Path(sys.executable).name) and "-m" in words:
        module = words[words.index("-m") + 1] if words.index("-m") + 1 < len(words) else ""
        return LAUNCHER_MODULES.get(module)
    return None


def _python(words: list[str], cwd: Path, environment: dict[str, str], text: str) -> Command:
    """`python [options] FILE ...` or `python [options] -m MODULE ...`."""
    index = 0
    while index < len(words):
        word = words[index]
        if word == "-m" or (word.startswith("-m") and not word.startswith("--")):
            module = words[index + 1] if word == "-m" and index + 1 < len(words) else word[2:]
            rest = words[index + 2 :] if word == "-m" else words[index + 1 :]
            if not module:
                raise CommandError(f"`{text}`: -m names no module")
            if module in LAUNCHER_MODULES:
                return _launched(LAUNCHER_MODULES[module], rest, cwd, environment, text)
            return _module(module, rest, cwd, environment, text)
        if word == "-c" or word.startswith("-c"):
            raise CommandError(
                f"`{text}` runs code given on the command line, not a training script; put that code in a file "
                "and give `python FILE`"
            )
        if word in ("-", "--"):
            raise CommandError(f"`{text}` reads the program from its input; give `python FILE` or `python -m MODULE`")
        if word in PYTHON_VALUE_OPTIONS:
            index += 2
            continue
        if word.startswith("-"):
            index += 1
            continue
        return _script(word, words[index + 1 :], cwd, environment, text)
    raise CommandError(f"`{text}` names no script; give `python train.py ...` or `python -m pkg.train ...`")


def _script(path: str, args: list[str], cwd: Path, environment: dict[str, str], text: str) -> Command:
    file = Path(os.path.normpath(cwd / path))
    if not file.is_file():
        raise CommandError(f"`{text}` runs {path}, which is not a file under {cwd}; give the training script's path")
    return Command(text, file, (path, *args), "script", cwd=cwd, environment=tuple(environment.items()))


def _module(name: str, args: list[str], cwd: Path, environment: dict[str, str], text: str) -> Command:
    file = module_file(name, cwd)
    if file is None:
        raise CommandError(
            f"`{text}` runs the module {name}, which is not found from {cwd} nor in this environment; "
            "install its package here, or run pytest from the folder that holds it"
        )
    if file.name == "__init__.py":  # `python -m pkg` runs pkg/__main__.py
        main = file.with_name("__main__.py")
        if not main.is_file():
            raise CommandError(f"`{text}`: {name} is a package without a __main__ module, so Python cannot run it")
        file, name = main, f"{name}.__main__"
    return Command(text, file, (str(file), *args), "module", name, cwd, tuple(environment.items()))


def _entry_point(head: str, args: list[str], cwd: Path, environment: dict[str, str], text: str) -> Command:
    name = Path(head).name
    found = [point for point in importlib.metadata.entry_points(group="console_scripts") if point.name == name]
    if not found:
        where = shutil.which(head)
        what = f"{where} is not a console script of this Python environment" if where else "no such command here"
        raise CommandError(
            f"`{text}`: {name} is not a console script installed in this Python environment ({what}); "
            f"install its package in the environment pytest runs in, or give {FORMS}"
        )
    point = found[0]
    file = module_file(point.module, cwd)
    if file is None:
        raise CommandError(f"`{text}`: the module of {name}'s entry point ({point.value}) is not found")
    argv0 = shutil.which(head) or head
    target = f"{point.module}:{point.attr}"
    return Command(text, file, (argv0, *args), "entry point", target, cwd, tuple(environment.items()))


def module_file(name: str, cwd: Path) -> Path | None:
    """The file of module `name`, found from `cwd` (as `python -m` finds it) or the environment, not imported."""
    parts = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], [str(cwd)])
    if spec is None:
        try:
            spec = importlib.util.find_spec(parts[0])
        except (ImportError, ValueError):
            spec = None
    for index in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(
            ".".join(parts[: index + 1]), list(spec.submodule_search_locations)
        )
    if spec is None or not spec.origin or not spec.has_location:
        return None
    return Path(spec.origin)


# ---- launchers ----------------------------------------------------------------------------------------------------


def _launched(launcher: str, words: list[str], cwd: Path, environment: dict[str, str], text: str) -> Command:
    """What `launcher` would start, read with its own parser, and what it asks for."""
    script, args, module, no_python, launch, sets = _LAUNCHERS[launcher](words, cwd)
    if script is None:
        raise CommandError(f"`{text}` names no script for {launcher} to start; give `{launcher} [options] train.py`")
    environment = {**environment, **sets}
    inner = [script, *args] if no_python else [sys.executable, *(["-m"] if module else []), script, *args]
    command = read(inner, cwd, environment)
    return replace(command, text=text, launch=launch)


def _parsed(parser: argparse.ArgumentParser, words: list[str], launcher: str) -> argparse.Namespace:
    errors = io.StringIO()
    parser.prog = launcher
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(errors):
            return parser.parse_args(words)
    except SystemExit:
        said = [line.split("error:", 1)[1].strip() for line in errors.getvalue().splitlines() if "error:" in line]
        raise CommandError(f"{launcher} refuses these arguments: {' '.join(said) or 'see its --help'}") from None


Read = tuple[str | None, list[str], bool, bool, Launch, dict[str, str]]


def _torchrun(words: list[str], cwd: Path) -> Read:
    from torch.distributed.run import get_args_parser

    parsed = _parsed(get_args_parser(), words, "torchrun")
    per_node, span = str(parsed.nproc_per_node), str(parsed.nnodes).split(":")
    nodes = span[-1] if len(set(span)) == 1 else ""  # an elastic range (1:4): as many nodes as join
    processes = int(per_node) * int(nodes) if per_node.isdigit() and nodes.isdigit() else None
    asked = f"--nproc_per_node {per_node}" + (f" --nnodes {parsed.nnodes}" if nodes != "1" else "")
    launch = Launch("torchrun", processes, asked)
    return parsed.training_script, list(parsed.training_script_args), parsed.module, parsed.no_python, launch, {}


def _accelerate(words: list[str], cwd: Path) -> Read:
    from accelerate.commands.launch import launch_command_parser

    parsed = _parsed(launch_command_parser(), words, "accelerate launch")
    config = _accelerate_config(parsed.config_file, cwd)
    processes = parsed.num_processes or (config.get("num_processes") if config else None)
    where = "--num_processes" if parsed.num_processes else f"num_processes in {config.get('file')}" if config else ""
    precision = parsed.mixed_precision or (config.get("mixed_precision") if config else None)
    distributed = str(config.get("distributed_type", "")) if config else ""
    engine = (
        "DeepSpeed"
        if parsed.use_deepspeed or "DEEPSPEED" in distributed
        else "FSDP"
        if parsed.use_fsdp or "FSDP" in distributed
        else None
    )
    count = int(processes) if processes else None  # every machine's together, as accelerate counts them
    asked = f"{where} {processes}" if processes else ""
    precision = str(precision).lower() if precision and str(precision).lower() != "no" else None
    launch = Launch("accelerate launch", count, asked, precision, engine)
    sets = {"ACCELERATE_MIXED_PRECISION": precision} if precision else {}
    return parsed.training_script, list(parsed.training_script_args), parsed.module, parsed.no_python, launch, sets


def _accelerate_config(given: str | None, cwd: Path) -> dict[str, Any] | None:
    """What accelerate's config file (the one given, else the machine's default one) sets, or None without one."""
    from accelerate.commands.config.config_args import default_config_file, load_config_from_file

    path = Path(cwd / given) if given else Path(default_config_file)
    if not path.is_file():
        if given:
            raise CommandError(f"accelerate launch --config_file {given}: no such file under {cwd}")
        return None
    loaded = load_config_from_file(str(path))
    return {
        "file": str(given or path),
        "num_processes": getattr(loaded, "num_processes", None),
        "mixed_precision": getattr(loaded, "mixed_precision", None),
        "distributed_type": getattr(loaded, "distributed_type", ""),
    }


def _deepspeed(words: list[str], cwd: Path) -> Read:
    """deepspeed's runner, read without deepspeed: its options, then the script and the script's arguments."""
    options: dict[str, str] = {}
    flags: set[str] = set()
    index = 0
    while index < len(words) and words[index].startswith("-"):
        word = words[index]
        name, equals, value = word.partition("=")
        if name in DEEPSPEED_VALUE_OPTIONS and not equals:
            value = words[index + 1] if index + 1 < len(words) else ""
            index += 1
        if name in DEEPSPEED_VALUE_OPTIONS:
            options[name] = value
        else:
            flags.add(name)
        index += 1
    script = words[index] if index < len(words) else None
    gpus = options.get("--num_gpus") or options.get("--num_accelerators")
    hosts = any(name in options for name in ("-H", "--hostfile", "-i", "--include", "-e", "--exclude"))
    nodes = options.get("--num_nodes", "" if hosts else "1")  # the hosts a hostfile names: unknown here
    processes = int(gpus) * int(nodes) if gpus and gpus.isdigit() and nodes.isdigit() else None
    asked = f"--num_gpus {gpus}" if gpus else ""
    launch = Launch("deepspeed", processes, asked, engine="DeepSpeed")
    return script, words[index + 1 :], "--module" in flags, "--no_python" in flags, launch, {}


_LAUNCHERS = {"torchrun": _torchrun, "accelerate launch": _accelerate, "deepspeed": _deepspeed}


def _same_file(word: str, path: str) -> bool:
    found = shutil.which(word) if os.sep not in word else word
    return found is not None and os.path.realpath(found) == os.path.realpath(path)

"""Every option, ini key and marker of the plugin, registered and resolved in one place.

A setting comes from the command line, else from the ini file, else from its default; a bad value
is reported with where it came from, so the user knows which line to fix.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_trainer.plan import BASELINE, DEVICES, LOAD, STAGES

#: Defaults of --trainer-overfit-steps and --trainer-examples (kept here: reading options imports no torch).
OVERFIT_STEPS = 150
EXAMPLES = 20
TIMEOUT = 600.0
SAMPLE = 256

MODULE_HELP = (
    "training script whose Trainer is tested stage by stage (repeatable). "
    "The script runs as __main__ and stops where it calls trainer.train()."
)
ARGS_HELP = "command-line arguments given to the script, as one shell-quoted string (its sys.argv[1:])."
FACTORY_HELP = (
    "name of a function in the script that returns a Trainer; it is called instead of running "
    "the script as __main__."
)
STAGES_HELP = (f"comma-separated stages to run (default: all of {', '.join(STAGES)}); the script's {LOAD} item "
               "always runs first.")
DEVICES_HELP = f"comma-separated devices to run on (default: {', '.join(DEVICES)})."
OVERFIT_STEPS_HELP = (
    "most optimizer steps the overfit stage takes on one batch; it stops as soon as the loss has fallen "
    "by a thousandth (default: 150)."
)
TIMEOUT_HELP = (
    "seconds the script may take to build its Trainer, and each stage to run, before it fails as hung "
    "(default: 600; 0 for no limit)."
)
SAMPLE_HELP = (
    "rows kept of every split that datasets.load_dataset returns to the script, before it maps them "
    "(default: 256; 0 keeps every row)."
)
GPU_MEMORY_HELP = (
    "GiB of GPU memory the memory stage forecasts against: a training step or an evaluation that needs more fails "
    "(default: the memory of the GPU present; without one the forecast is only reported)."
)
REPORT_HELP = "write a JSON report of every pipeline item (outcome, diagnosis, fix, figures) to this path."
BASELINE_HELP = (
    "folder of regression baselines, one text file per script: the first run records the pipeline's key "
    "figures, later runs fail when one moved (adds the baseline[cpu] item)."
)
BASELINE_UPDATE_HELP = "rewrite the baselines with the figures of this run."
BATCH_SIZE_HELP = "batch size of the fixed batch the stages use (default: the script's per_device_train_batch_size)."
EXAMPLES_HELP = (
    "hypothesis examples per property item (labels, lengths, padding); derandomized when the CI "
    "variable is set (default: 20)."
)
MARKER_LINE = (
    "trainer_pipeline(module=None, stages=None, devices=None, factory=None): run the test once per "
    "pipeline stage and device of a Trainer, given through the trainer_stage fixture. Without "
    "module=, the Trainer comes from a `trainer` fixture you define."
)


def register(parser: pytest.Parser) -> None:
    group = parser.getgroup("trainer", "pytest-trainer: pipeline tests for Hugging Face training scripts")
    group.addoption("--trainer-module", action="append", default=[], metavar="PATH", help=MODULE_HELP)
    group.addoption("--trainer-args", metavar="ARGS", help=ARGS_HELP)
    group.addoption("--trainer-factory", metavar="NAME", help=FACTORY_HELP)
    group.addoption("--trainer-stages", metavar="STAGES", help=STAGES_HELP)
    group.addoption("--trainer-devices", metavar="DEVICES", help=DEVICES_HELP)
    group.addoption("--trainer-overfit-steps", metavar="N", help=OVERFIT_STEPS_HELP)
    group.addoption("--trainer-examples", metavar="N", help=EXAMPLES_HELP)
    group.addoption("--trainer-timeout", metavar="SECONDS", help=TIMEOUT_HELP)
    group.addoption("--trainer-sample", metavar="N", help=SAMPLE_HELP)
    group.addoption("--trainer-batch-size", metavar="N", help=BATCH_SIZE_HELP)
    group.addoption("--trainer-gpu-memory", metavar="GIB", help=GPU_MEMORY_HELP)
    group.addoption("--trainer-report", metavar="PATH", help=REPORT_HELP)
    group.addoption("--trainer-baseline", metavar="DIR", help=BASELINE_HELP)
    group.addoption("--trainer-baseline-update", action="store_true", default=False, help=BASELINE_UPDATE_HELP)
    parser.addini("trainer_module", type="paths", default=[], help=MODULE_HELP)
    parser.addini("trainer_args", type="string", default="", help=ARGS_HELP)
    parser.addini("trainer_factory", type="string", default="", help=FACTORY_HELP)
    parser.addini("trainer_stages", type="string", default="", help=STAGES_HELP)
    parser.addini("trainer_devices", type="string", default="", help=DEVICES_HELP)
    parser.addini("trainer_overfit_steps", type="string", default="", help=OVERFIT_STEPS_HELP)
    parser.addini("trainer_examples", type="string", default="", help=EXAMPLES_HELP)
    parser.addini("trainer_timeout", type="string", default="", help=TIMEOUT_HELP)
    parser.addini("trainer_sample", type="string", default="", help=SAMPLE_HELP)
    parser.addini("trainer_batch_size", type="string", default="", help=BATCH_SIZE_HELP)
    parser.addini("trainer_gpu_memory", type="string", default="", help=GPU_MEMORY_HELP)
    parser.addini("trainer_report", type="string", default="", help=REPORT_HELP)
    parser.addini("trainer_baseline", type="string", default="", help=BASELINE_HELP)


@dataclass(frozen=True)
class Settings:
    """Every setting, resolved; the defaults are those of a run with no option and no ini key."""

    modules: tuple[Path, ...] = ()
    script_args: tuple[str, ...] = ()
    factory: str | None = None
    stages: tuple[str, ...] = STAGES
    devices: tuple[str, ...] = DEVICES
    overfit_steps: int = OVERFIT_STEPS
    examples: int = EXAMPLES
    timeout: float = TIMEOUT
    sample: int = SAMPLE
    batch_size: int = 0
    #: GiB of GPU memory to forecast against (0: the GPU present, if any).
    gpu_memory: float = 0.0
    report: Path | None = None
    baseline: Path | None = None
    baseline_update: bool = False


def resolve(config: pytest.Config) -> Settings:
    """Read every setting once, command line over ini file over default."""
    invocation_dir = config.invocation_params.dir
    cli_modules = [invocation_dir / path for path in config.getoption("trainer_module")]
    modules = cli_modules or list(config.getini("trainer_module"))
    source = "--trainer-module on the command line" if cli_modules else f"trainer_module in {config.inipath}"
    for path in modules:
        if not Path(path).is_file():
            what = "is a folder, not a script" if Path(path).is_dir() else "does not exist"
            raise pytest.UsageError(f"{source}: {path} {what}; give the path of the training script (a .py file)")
    args, args_source = _pick(config, "trainer_args")
    try:
        script_args = tuple(shlex.split(args or ""))
    except ValueError as error:
        raise pytest.UsageError(f"{args_source}: cannot split {args!r} into arguments: {error}") from None
    factory, _ = _pick(config, "trainer_factory")
    baseline = _path(config, "trainer_baseline")
    allowed = (LOAD, *STAGES, BASELINE) if baseline else (LOAD, *STAGES)
    return Settings(
        modules=tuple(dict.fromkeys(Path(path).resolve() for path in modules)),
        script_args=script_args,
        factory=factory or None,
        stages=_choices(config, "trainer_stages", allowed),
        devices=_choices(config, "trainer_devices", DEVICES),
        overfit_steps=_count(config, "trainer_overfit_steps", OVERFIT_STEPS),
        examples=_count(config, "trainer_examples", EXAMPLES),
        timeout=_number(config, "trainer_timeout", TIMEOUT, "a number of seconds (0 for no limit)"),
        sample=_count(config, "trainer_sample", SAMPLE, allow_zero=True),
        batch_size=_count(config, "trainer_batch_size", 0),
        gpu_memory=_number(config, "trainer_gpu_memory", 0.0, "a number of GiB"),
        report=_path(config, "trainer_report"),
        baseline=baseline,
        baseline_update=bool(config.getoption("trainer_baseline_update")),
    )


def _pick(config: pytest.Config, name: str) -> tuple[str | None, str]:
    """The raw value of a setting and a phrase saying where it came from."""
    value = config.getoption(name)
    if value is not None:
        return value, f"--{name.replace('_', '-')} on the command line"
    ini_value = config.getini(name)
    return (ini_value or None), f"{name} in {config.inipath or 'the ini file'}"


def _count(config: pytest.Config, name: str, default: int, allow_zero: bool = False) -> int:
    raw, source = _pick(config, name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < (0 if allow_zero else 1):
        kind = "a whole number (0 for all)" if allow_zero else "a positive whole number"
        raise pytest.UsageError(f"{source}: {raw!r} is not {kind}")
    return value


def _path(config: pytest.Config, name: str) -> Path | None:
    """A path from the command line (relative to where pytest was started) or the ini file (relative to it)."""
    value = config.getoption(name)
    if value:
        return (config.invocation_params.dir / value).resolve()
    ini_value = config.getini(name)
    if ini_value:
        return ((config.inipath.parent if config.inipath else config.rootpath) / ini_value).resolve()
    return None


def _number(config: pytest.Config, name: str, default: float, kind: str) -> float:
    raw, source = _pick(config, name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:
        raise pytest.UsageError(f"{source}: {raw!r} is not {kind}")
    return value


def _choices(config: pytest.Config, name: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    raw, source = _pick(config, name)
    if not raw:
        return allowed
    return parse_choices(raw, allowed, source)


def parse_choices(raw: str | list[str] | tuple[str, ...], allowed: tuple[str, ...], source: str) -> tuple[str, ...]:
    """Split a comma-separated list and check each name; keep the canonical order."""
    names = raw.split(",") if isinstance(raw, str) else list(raw)
    chosen = {name.strip() for name in names if name.strip()}
    unknown = sorted(chosen - set(allowed))
    if unknown:
        raise pytest.UsageError(
            f"{source}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(allowed)}"
        )
    return tuple(name for name in allowed if name in chosen)

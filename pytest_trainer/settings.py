"""Every setting of a run, resolved (by `options`): what the lower layers read, with no pytest in sight."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_trainer.commands import Command
from pytest_trainer.devices import DEVICES

#: Defaults of the settings (kept here: reading options imports no torch).
OVERFIT_STEPS = 150
EXAMPLES = 20
TIMEOUT = 600.0
SAMPLE = 256
#: How the script's models may be built (--trainer-model): see `twin.loading`.
MODELS = ("auto", "twin", "real")


@dataclass(frozen=True)
class Settings:
    """Every setting, resolved; the defaults are those of a run with no option and no ini key."""

    modules: tuple[Path, ...] = ()
    script_args: tuple[str, ...] = ()
    #: Commands as the user runs them (`--trainer-command`), each read down to the Python file it runs.
    commands: tuple[Command, ...] = ()
    factory: str | None = None
    #: The stages selected, in plan order (empty: every stage).
    stages: tuple[str, ...] = ()
    #: Whether the stages were named (--trainer-stages, trainer_stages): a stage with nothing to check in this run
    #: then still runs and reports, instead of being skipped with the reason.
    stages_named: bool = False
    devices: tuple[str, ...] = DEVICES
    #: Whether the devices were named (--trainer-devices, trainer_devices): a named device this machine lacks is an
    #: error, while a default one is skipped with the reason.
    devices_named: bool = False
    overfit_steps: int = OVERFIT_STEPS
    examples: int = EXAMPLES
    timeout: float = TIMEOUT
    sample: int = SAMPLE
    batch_size: int = 0
    #: GiB of GPU memory to forecast against (0: the GPU present, if any).
    gpu_memory: float = 0.0
    report: Path | None = None
    html: Path | None = None
    baseline: Path | None = None
    baseline_update: bool = False
    #: A script without a baseline fails instead of recording one.
    baseline_strict: bool = False
    #: How the script's models are built: `auto` (a twin where the real model cannot be built here), `twin`, `real`.
    model: str = "auto"
    #: Processes the distributed item trains with under torch.distributed.run (1: no distributed item).
    processes: int = 1

"""Start the script in several processes with torch.distributed.run, as users start their real runs, and collect
what each rank recorded (`rank`), within a time limit that a hung or dead rank cannot outlast.

torchrun runs in a session of its own, so that on time out its whole process group (torchrun and the ranks) is
killed. Before that, each rank is asked for its Python stack (faulthandler on SIGUSR1): where a rank waits is
where it hung.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_trainer.commands import Command

#: Lines of torchrun's output kept for a failure's details.
TAIL = 25
#: A rank of the table of failures torchrun prints as it exits: `rank : 1 (local_rank: 1)`, then
#: `exitcode : -9 (pid: 123)` (a signal as its negative number).
FAILED_RANK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
#: The heading of the failure torchrun observed first.
ROOT_CAUSE = "Root Cause (first observed failure)"


@dataclass(frozen=True)
class Job:
    """What every rank runs: the script as the pytest process loaded it, and what to do with its Trainer."""

    #: The command that built the Trainer (a --trainer-module script is `python SCRIPT ARGS`).
    command: Command
    factory: str | None
    sample: int
    batch_size: int
    processes: int
    device: str
    #: Optimizer steps each rank takes through the Trainer's own train().
    steps: int
    #: The job's folder: the job file, each rank's record and stack, the shared output folder, the fixed batch.
    folder: Path
    #: The layer classes to shard with fully_shard, where the script asks for FSDP (None: it does not).
    fsdp_layers: list[str] | None = None
    #: How the script's models are built (`--trainer-model`): each rank builds the twin the pytest process built.
    model: str = "auto"

    @property
    def output_dir(self) -> Path:
        return self.folder / "output"

    @property
    def batch(self) -> Path:
        return self.folder / "batch.pt"


@dataclass
class Ranks:
    """What came back: each rank's record (its facts, progress and error) and how the job ended."""

    records: list[dict[str, Any]]
    returncode: int | None
    timed_out: bool
    seconds: float
    output: list[str] = field(default_factory=list)
    stacks: dict[int, str] = field(default_factory=dict)
    #: How each rank that torchrun saw fail ended (`exits`), the failure it observed first first.
    exits: dict[int, int] = field(default_factory=dict)

    def errors(self) -> list[tuple[int, dict[str, Any]]]:
        return [(record["rank"], record["error"]) for record in self.records if record.get("error")]


def run(job: Job, timeout: float) -> Ranks:
    job.folder.mkdir(parents=True, exist_ok=True)
    job.output_dir.mkdir(exist_ok=True)
    job_file = job.folder / "job.json"
    job_file.write_text(
        json.dumps(
            {
                "command": job.command.to_json(),
                "factory": job.factory,
                "sample": job.sample,
                "batch_size": job.batch_size,
                "steps": job.steps,
                "folder": str(job.folder),
                "output_dir": str(job.output_dir),
                "batch": str(job.batch),
                "fsdp_layers": job.fsdp_layers,
                "model": job.model,
            }
        )
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={job.processes}",
        "-m",
        "pytest_trainer.distributed.rank",
        str(job_file),
    ]
    log = job.folder / "torchrun.log"
    started = time.monotonic()
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=_environment(job.device),
            start_new_session=True,
            cwd=job.folder,
        )
        timed_out = False
        try:
            process.wait(timeout=timeout if timeout > 0 else None)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            stacks = _stop(process, job) if timed_out or process.poll() is None else {}
    lines = log.read_text(errors="replace").splitlines()
    records = [_read(job.folder / f"rank-{rank}.json", rank) for rank in range(job.processes)]
    stacks = stacks or {}
    return Ranks(
        records,
        None if timed_out else process.returncode,
        timed_out,
        time.monotonic() - started,
        [line for line in lines if line.strip()][-TAIL:],
        stacks,
        exits(lines),
    )


def exits(lines: list[str]) -> dict[int, int]:
    """Each rank's exit code in the table of failures torchrun prints when a rank fails, the failure it observed first
    first: a rank that died by a signal has its negative number (-9 killed, -15 stopped by torchrun itself once
    another rank had failed), one that raised exits with 1. Empty where torchrun printed no table (a job that
    finished, or one stopped on time out)."""
    text = "\n".join(lines)
    start = text.rfind(ROOT_CAUSE)
    root = FAILED_RANK.findall(text[start:]) if start >= 0 else []
    table = text[:start] if start >= 0 else text
    others = FAILED_RANK.findall(table[table.rfind("Failures:") :]) if "Failures:" in table else []
    return {int(rank): int(code) for rank, code in [*root, *others]}


def _environment(device: str) -> dict[str, str]:
    environment = dict(os.environ)
    environment.setdefault("OMP_NUM_THREADS", "1")
    if device == "cpu":
        # Without it, transformers gives each process world_size=1 on a machine without a GPU: each would train alone.
        environment["ACCELERATE_USE_CPU"] = "true"
        environment["CUDA_VISIBLE_DEVICES"] = ""
    return environment


def _stop(process: subprocess.Popen[bytes], job: Job) -> dict[int, str]:
    """Ask each rank where it is, then kill torchrun's whole process group."""
    stacks: dict[int, str] = {}
    pids = {rank: _read(job.folder / f"rank-{rank}.json", rank).get("pid") for rank in range(job.processes)}
    for pid in pids.values():
        if isinstance(pid, int):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)
    for rank in pids:
        path = job.folder / f"stack-{rank}.txt"
        if path.is_file():
            stacks[rank] = path.read_text(errors="replace")
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in pids.values():  # a rank that left torchrun's group
        if isinstance(pid, int):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    process.wait()
    return stacks


def _read(path: Path, rank: int) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"rank": rank, "progress": "not started"}
    return found if isinstance(found, dict) else {"rank": rank, "progress": "not started"}

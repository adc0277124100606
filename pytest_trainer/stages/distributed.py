"""`distributed` (with --trainer-processes=N): the script's Trainer trained by N processes under torch.distributed.

The script runs again in N fresh interpreters started by torch.distributed.run, the engine users run (gloo on the
CPU, NCCL on GPUs), and each rank trains a few steps through the Trainer's own train() (its DDP wrapper, gradient
checkpointing and find_unused_parameters as it sets them), evaluates once and saves one checkpoint
(`distributed.rank`). What only exists with several processes is then judged (`distributed.judges`): DDP's errors,
ranks that build different data, train on the same rows, drift apart or hang, an evaluation that miscounts rows,
files written twice, a checkpoint that does not reload, and, where FSDP is asked for, a state dict that does not
survive sharding.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_trainer import diagnosis
from pytest_trainer.distributed import judges, processes, sharding
from pytest_trainer.stages.base import Stage, StageResult
from pytest_trainer.timeouts import TIMEOUT

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline

#: Optimizer steps each rank takes: DDP's unused-parameter error surfaces at the second.
STEPS = 3
#: Share of --trainer-timeout the processes get; the rest is for judging what they recorded.
SHARE = 0.8


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    count = pipeline.settings.processes
    if pipeline.command is None:
        pytest.skip(
            "distributed runs a script in new processes: a Trainer from a `trainer` fixture has none "
            "(give the marker module=)"
        )
    if device == "cuda" and torch.cuda.device_count() < count:
        pytest.skip(
            f"distributed[cuda] needs {count} GPUs (one per process, NCCL); this machine has "
            f"{torch.cuda.device_count()}"
        )
    args, model = pipeline.trainer.args, pipeline.model
    result = StageResult("distributed", device)
    backend = "gloo" if device == "cpu" else "nccl"
    result.notes.append(f"engine: {count} processes under torch.distributed.run, DDP on {backend}, {STEPS} steps")
    layers, unexercised, wrong = _engines(args, pipeline.asked_fsdp, model, device)
    result.notes.extend(f"not exercised: {line}" for line in unexercised)
    with tempfile.TemporaryDirectory(prefix="pytest-trainer-ranks-") as folder:
        job = processes.Job(
            pipeline.command,
            pipeline.factory,
            pipeline.settings.sample,
            pipeline.settings.batch_size,
            count,
            device,
            STEPS,
            Path(folder),
            layers,
            pipeline.settings.model,
        )
        job.folder.mkdir(exist_ok=True)
        torch.save(pipeline.batches.first_on("cpu"), job.batch)
        timeout = pipeline.settings.timeout * SHARE if pipeline.settings.timeout else TIMEOUT
        ranks = processes.run(job, timeout)
        result.figures["distributed_seconds"] = round(ranks.seconds, 2)
        try:
            judges.stopped(pipeline, ranks, job)
            result.notes.extend(judges.findings(pipeline, ranks, job))
        except diagnosis.TrainerError as failure:
            raise diagnosis.also(failure, [wrong] if wrong else []) from failure.__cause__
    if wrong is not None:
        raise wrong
    return result


def _engines(
    args: object, fsdp: dict[str, Any] | None, model: object, device: str
) -> tuple[list[str] | None, list[str], diagnosis.Finding | None]:
    """The layer classes to shard where the script asks for FSDP (None: it does not), what will not be run as the
    script asks, and the finding where FSDP names layer classes the model does not have (accelerate stops there on
    GPUs)."""
    unexercised: list[str] = []
    if getattr(args, "deepspeed", None):
        unexercised.append(
            "the script asks for DeepSpeed; this run trains with DDP, so DeepSpeed's ZeRO sharding, "
            "offload and its checkpoints are not exercised"
        )
    if fsdp is None:
        return None, unexercised, None
    if device == "cpu":
        unexercised.append(
            "the script asks for FSDP; accelerate sets FSDP up on GPUs only, so on the CPU the Trainer "
            "trains with DDP; FSDP's state dict is checked through fully_shard on gloo"
        )
    layers = sharding.layers_to_wrap(fsdp, model)
    missing = [name for name in layers if name not in sharding.classes_in(model)]
    if not missing:
        return layers, unexercised, None
    present = sorted(sharding.classes_in(model) & set(getattr(model, "_no_split_modules", None) or []))
    kept = [name for name in layers if name not in missing]
    return (
        kept,
        unexercised,
        diagnosis.Finding(
            f"fsdp_config's transformer_layer_cls_to_wrap names {', '.join(missing)}, which {type(model).__name__} "
            'does not have: on GPUs accelerate stops with "Could not find the transformer layer class ... in the '
            'model"',
            f"name the model's own layer class: transformer_layer_cls_to_wrap={present or ['<the decoder layer>']}",
        ),
    )


STAGE = Stage("distributed", rank=150, run=run, needs=("step",), opt_in="processes")

"""`load`: the script runs up to `trainer.train()` and builds its Trainer.

The script itself runs when the pipeline is first asked for (a failure there is a `ScriptError`, which skips every
other item of the script); this stage reports what was built, and what the script's settings get wrong that stops the
real run once it trains (a DeepSpeed config at odds with the arguments: `engines`), which blocks no other item.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_trainer import diagnosis
from pytest_trainer.stages.base import Stage, StageResult

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline


def run(pipeline: Pipeline, device: str) -> StageResult:
    trainer, model = pipeline.trainer, pipeline.model
    parameters = list(model.parameters())
    trainable = sum(parameter.numel() for parameter in parameters if parameter.requires_grad)
    result = StageResult(
        "load",
        device,
        figures={
            "parameters": float(sum(parameter.numel() for parameter in parameters)),
            "trainable_parameters": float(trainable),
        },
    )
    result.notes.append(f"{type(trainer).__name__} of {type(model).__name__}")
    if pipeline.load_findings:  # the Trainer is built: every other item still runs
        raise diagnosis.combined(pipeline.load_findings)
    return result


STAGE = Stage("load", rank=0, run=run, first=True)

"""`baseline` (with --trainer-baseline=DIR): the pipeline's key figures against the ones recorded before.

One reviewable text file per script, one figure a line in a fixed order, so a change that moves
the training numbers (a tenfold learning rate, a new head, other data) shows up in review and
fails the suite with the figure that moved. The first run records; --trainer-baseline-update
rewrites. Figures are measured on the CPU, where they are deterministic for the same library
versions.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_trainer import diagnosis, schema
from pytest_trainer.stages.backward import STAGE as BACKWARD
from pytest_trainer.stages.base import Stage, StageResult
from pytest_trainer.stages.forward import STAGE as FORWARD
from pytest_trainer.stages.overfit import STAGE as OVERFIT

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline

#: Relative difference allowed for measured numbers (losses, norms); counts, shapes and settings must match.
TOLERANCE = 1e-3
#: The figures, in file order, and whether each is a measured number compared within TOLERANCE.
FIGURES = {
    "parameters": False,
    "trainable_parameters": False,
    "output_shape": False,
    "learning_rate": False,
    "loss_at_init": True,
    "gradient_norm_at_init": True,
    "overfit_steps": False,
    "loss_after_overfit": True,
}


def run(pipeline: Pipeline, device: str) -> StageResult:
    directory = pipeline.settings.baseline
    if directory is None or device != "cpu":
        pytest.skip("baselines are recorded on the CPU, with --trainer-baseline=DIR")
    current = measure(pipeline)
    path = file_for(Path(directory), pipeline.name)
    result = StageResult("baseline", device, figures={k: float(v) for k, v in current.items() if _number(v)})
    if not path.exists() and pipeline.settings.baseline_strict and not pipeline.settings.baseline_update:
        raise diagnosis.PipelineFailure(
            f"no baseline of {pipeline.name} at {path}, and --trainer-baseline-strict (trainer_baseline_strict) "
            "asks for one: a baseline recorded by this run would pass whatever the figures are",
            f"record it where the change is reviewed: run once without --trainer-baseline-strict (or with "
            f"--trainer-baseline-update) and commit {path.name} in {path.parent}",
        )
    if pipeline.settings.baseline_update or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(current))
        result.notes.append(
            f"baseline: recorded {len(current)} figures to {path}: commit it, so that later runs compare against it"
        )
        return result
    moved = compare(parse(path.read_text()), current)
    if moved:
        raise diagnosis.PipelineFailure(
            f"the pipeline's figures moved from the baseline {path}:\n" + "\n".join(f"    {line}" for line in moved),
            "if the change is intended, rewrite the baseline with --trainer-baseline-update and commit it",
        )
    return result


def measure(pipeline: Pipeline) -> dict[str, Any]:
    """The figures of the baseline, measured with the stages' own checks on the CPU."""
    model = pipeline.model_on("cpu")
    forward_result = FORWARD.run(pipeline, "cpu")
    forward = forward_result.measured_as(schema.Forward)
    backward = BACKWARD.run(pipeline, "cpu").measured_as(schema.Backward)
    overfit = OVERFIT.run(pipeline, "cpu").measured_as(schema.Overfit)
    logits = forward_result.outputs.get("logits") if isinstance(forward_result.outputs, dict) else None
    return {
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "trainable_parameters": backward.trainable_parameters,
        "output_shape": "x".join(map(str, logits.shape)) if logits is not None else "none",
        "learning_rate": f"{overfit.learning_rate:g}",
        "loss_at_init": forward.loss_at_init,
        "gradient_norm_at_init": backward.gradient_norm,
        "overfit_steps": overfit.overfit_steps,
        "loss_after_overfit": overfit.loss_after,
    }


def file_for(directory: Path, script: str) -> Path:
    """`examples/train.py` -> `DIR/examples_train.txt`: one file per script, named after its path."""
    return directory / (re.sub(r"[^\w.-]+", "_", script.removesuffix(".py")).strip("_") + ".txt")


def render(figures: dict[str, Any]) -> str:
    lines = [f"{name}: {_format(figures[name])}" for name in FIGURES if name in figures]
    return "# pytest-trainer baseline: rewrite with --trainer-baseline-update\n" + "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, str]:
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


def compare(recorded: dict[str, str], current: dict[str, Any]) -> list[str]:
    """One line per figure that moved: `name: recorded -> current (how much)`."""
    moved = []
    for name, measured in FIGURES.items():
        if name not in recorded or name not in current:
            continue
        before, after = recorded[name], _format(current[name])
        if measured and _number(before):
            old, new = float(before), float(current[name])
            if math.isclose(old, new, rel_tol=TOLERANCE, abs_tol=1e-12):
                continue
            change = f" ({(new - old) / old:+.1%})" if old else ""
            moved.append(f"{name}: {before} -> {after}{change}")
        elif before != after:
            moved.append(f"{name}: {before} -> {after}")
    return moved


def _format(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


# Runs only with --trainer-baseline, on the CPU only, after everything else.
STAGE = Stage("baseline", rank=200, run=run, needs=("overfit",), devices=("cpu",), opt_in="baseline")

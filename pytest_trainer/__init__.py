"""pytest-trainer: a Hugging Face training script's pipeline as pytest items, checked stage by stage."""

from pytest_trainer.diagnosis import Finding, PipelineFailure, ScriptError, TrainerError
from pytest_trainer.families import Family
from pytest_trainer.stages import Stage, StageResult, TrainerStage

__all__ = [
    "Family",
    "Finding",
    "PipelineFailure",
    "ScriptError",
    "Stage",
    "StageResult",
    "TrainerError",
    "TrainerStage",
]
__version__ = "0.1.0"

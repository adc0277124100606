"""pytest-trainer: a Hugging Face training script's pipeline as pytest items, checked stage by stage."""

from pytest_trainer.diagnosis import PipelineFailure
from pytest_trainer.loading import ScriptError
from pytest_trainer.stages import StageResult, TrainerStage

__all__ = ["PipelineFailure", "ScriptError", "StageResult", "TrainerStage"]
__version__ = "0.1.0"

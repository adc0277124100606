"""The pipeline of the `trainer` fixture, one test per stage and device, with assertions of our own."""

import pytest


@pytest.mark.trainer_pipeline
def test_pipeline(trainer_stage):
    """Every stage passes its built-in checks."""
    trainer_stage.run()


@pytest.mark.trainer_pipeline(stages=["forward"])
def test_logits_cover_both_classes(trainer_stage, train_batch):
    """Our own assertion on what the forward stage produced."""
    result = trainer_stage.run()
    assert result.outputs.logits.shape == (train_batch["input_ids"].shape[0], 2)

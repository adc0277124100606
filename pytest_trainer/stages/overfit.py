"""`overfit`: a few optimizer steps on one fixed batch make its loss fall.

A pipeline that cannot overfit one batch cannot learn (Karpathy's "Recipe for Training Neural
Networks"; the Hugging Face course). The loss is judged in eval mode, before and after, so dropout
noise cannot decide the outcome; the steps themselves run in train mode, as training would.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pytest_trainer import diagnosis
from pytest_trainer.stages import StageResult
from pytest_trainer.stages.forward import checked_loss
from pytest_trainer.stages.step import at_peak_learning_rate, fingerprints

if TYPE_CHECKING:
    import torch

    from pytest_trainer.pipeline import Pipeline

#: The loss is judged after steps 1, 2, 4, 8, ... and the last: a pretrained model stops after a step or
#: two, a slow tiny one after a few dozen, and judging costs a forward pass each time.
FIRST_CHECK = 1
#: Relative fall of the loss that counts as learning the batch: after <= before * (1 - FALL).
#: Calibrated on correct pipelines at their learning rates, over several seeds: a tiny random BERT
#: classifier at 5e-5 falls 0.1% in 35 to 40 steps (its slowest: tiny logits), tiny regression, token
#: classification, masked LM and GPT-2 (padded and packed) at 5e-5 within 5, the pretrained MiniLM at
#: 2e-5 within 5. Learning rate 0 or 1e-9, frozen or detached models move it by less than 1e-6.
FALL = 0.001
#: Relative growth that counts as divergence: after >= before * (1 + GROWTH).
GROWTH = 0.5


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    model = pipeline.model_on(device)
    batch = pipeline.batch_on(device)
    result = StageResult("overfit", device, batch=batch)
    max_steps = pipeline.settings.overfit_steps
    clip = float(getattr(pipeline.trainer.args, "max_grad_norm", 0) or 0)
    with pipeline.weights_kept(model), pipeline.trainer_optimizer(model) as (optimizer, _):
        peak, _ = at_peak_learning_rate(optimizer)
        result.notes.append(f"steps used the peak learning rate {peak:g}, without the schedule")
        trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
        start = fingerprints(trainable)
        before = _eval_loss(pipeline, model, batch)
        after, curve, check_at = before, [], FIRST_CHECK
        for step in range(1, max_steps + 1):
            model.train()
            optimizer.zero_grad(set_to_none=True)
            loss, _ = pipeline.loss(model, batch)
            curve.append(float(loss.detach().float()))
            if not math.isfinite(curve[-1]):
                break
            with diagnosis.pipeline_part("backward() through the model"):
                loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(trainable, clip)
            with diagnosis.pipeline_part("the optimizer's step"):
                optimizer.step()
            if step in (check_at, max_steps):
                check_at *= 2
                after = _eval_loss(pipeline, model, batch, allow_nan=True)
                if not math.isfinite(after) or not before * (1 - FALL) < after < before * (1 + GROWTH):
                    break
        moved = fingerprints(trainable) != start
    steps = len(curve)
    shown = f"loss {before:.4g} -> {after:.4g} after {steps} steps (train-mode curve: first {curve[0]:.4g}, " \
            f"lowest {min(curve):.4g}, last {curve[-1]:.4g}) at learning rate {peak:g}"
    result.figures.update({"loss_before": before, "loss_after": after, "overfit_steps": float(steps),
                           "learning_rate": float(peak)})
    result.loss = after
    if not math.isfinite(after) or not all(map(math.isfinite, curve)):
        raise diagnosis.PipelineFailure(
            f"the loss became non-finite while overfitting one batch: {shown}",
            "lower learning_rate, keep gradient clipping on (max_grad_norm), and look for NaN inputs or labels",
        )
    if after >= before * (1 + GROWTH):
        raise diagnosis.PipelineFailure(
            f"the loss grows instead of falling on one batch, so training diverges: {shown}",
            f"lower learning_rate (now {peak:g}); typical fine-tuning rates are 1e-5 to 5e-5",
        )
    if after > before * (1 - FALL):
        cause = "no trainable parameter changed" if not moved else "the loss barely moves"
        raise diagnosis.PipelineFailure(
            f"the model does not learn one fixed batch ({cause}): {shown}; expected a fall of {FALL:.0%}",
            "check that the labels belong to the inputs, that the layers that should train are not frozen, "
            f"and the learning rate ({peak:g})",
        )
    return result


def _eval_loss(pipeline: Pipeline, model: torch.nn.Module, batch: dict, allow_nan: bool = False) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        loss, _ = pipeline.loss(model, batch)
    return float(loss.detach().float()) if allow_nan else checked_loss(loss)

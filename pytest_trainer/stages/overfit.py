"""`overfit`: a few optimizer steps on one fixed batch make its loss fall.

A pipeline that cannot overfit one batch cannot learn (Karpathy's "Recipe for Training Neural
Networks"; the Hugging Face course). The loss is judged in eval mode, before and after, so dropout
noise cannot decide the outcome; the steps themselves run in train mode, as training would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_trainer import diagnosis, model_facts, schema
from pytest_trainer.stages.base import Stage, StageResult, with_pictures

if TYPE_CHECKING:
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
#: Faster rates tried when the script's own rate moves the weights but not the loss: a random tiny model at a
#: fine-tuning rate learns too slowly to show it in OVERFIT steps (a tiny BERT for multiple choice at 5e-5 moves
#: its loss by 4e-5 in 300 steps, and falls 0.1% in about 55 at 1e-3), while a pipeline that cannot learn
#: (lr 1e-9, labels cut from the graph) does not move at any of them.
ESCALATION = (10, 100)
#: Steps of the first try, at the script's own rate, on the twin of a real checkpoint. Its random weights learn at a
#: fine-tuning rate as slowly as a tiny random model, and each step pays for the checkpoint's whole vocabulary, so the
#: faster rates decide sooner. Twins of correct scripts, at their own rates: SFT of Qwen2.5 7B with QLoRA at 2e-4, of
#: Llama 3.1 8B in full at 5e-5, an encoder of BERT-large's sizes at 2e-5 and a LoRA of every linear layer at 1e-4
#: fell 0.1% within 2, 2, 4 and 4 steps; a full SFT of Mistral 7B at 1e-5, a LoRA DPO of Llama 3.1 8B at 5e-6 and
#: GRPO at 1e-6 did not within 16, and did at 10x within 1, 8 and 8.
TWIN_STEPS = 4


@dataclass
class Attempt:
    """One try at overfitting the batch at one learning rate."""

    rate: float
    before: float
    after: float
    curve: list[float]
    moved: bool
    #: What the batch is judged by: the loss, or the figure the trainer family names.
    what: str = "loss"

    @property
    def finite(self) -> bool:
        return math.isfinite(self.after) and all(map(math.isfinite, self.curve))

    @property
    def learned(self) -> bool:
        return self.finite and self.after <= self.before * (1 - FALL)

    def picture(self) -> schema.Attempt:
        return {"rate": self.rate, "before": self.before, "after": self.after, "curve": list(self.curve)}

    def shown(self) -> str:
        curve = self.curve or [self.before]
        return (
            f"{self.what} {self.before:.4g} -> {self.after:.4g} after {_steps(len(self.curve))} (train-mode loss: "
            f"first {curve[0]:.4g}, lowest {min(curve):.4g}, last {curve[-1]:.4g}) at learning rate {self.rate:g}"
        )


def _steps(count: int) -> str:
    return f"{count} step" if count == 1 else f"{count} steps"


def run(pipeline: Pipeline, device: str) -> StageResult:
    first = _attempt(pipeline, device)
    measured = schema.Overfit(first.before, first.after, len(first.curve), float(first.rate))
    result = StageResult("overfit", device, batch=pipeline.batches.first_on(device), measured=measured)
    result.notes.append(f"steps used the peak learning rate {first.rate:g}, without the schedule")
    result.loss = first.after
    curve = result.pictures["loss_curve"] = schema.LossCurve(what=first.what, tries=[first.picture()])
    if not first.finite:
        raise with_pictures(
            diagnosis.PipelineFailure(
                f"the loss became non-finite while overfitting one batch: {first.shown()}",
                "lower learning_rate, keep gradient clipping on (max_grad_norm), and look for NaN inputs or labels",
            ),
            result,
        )
    if first.after >= first.before * (1 + GROWTH):
        raise with_pictures(
            diagnosis.PipelineFailure(
                f"the loss grows instead of falling on one batch, so training diverges: {first.shown()}",
                f"lower learning_rate (now {first.rate:g}): {model_facts.usual_learning_rates(pipeline.model)}",
            ),
            result,
        )
    if first.learned:
        return result
    # Learning that is only slow (a small random model at a fine-tuning rate) is no defect: a faster rate tells
    # it from a pipeline that cannot learn, which no rate moves.
    for factor in ESCALATION if first.moved else ():
        faster = _attempt(pipeline, device, factor)
        curve["tries"].append(faster.picture())
        if faster.learned:
            why = (
                "a twin's random weights learn slowly at a fine-tuning rate, which says nothing of the checkpoint's"
                if pipeline.twins
                else "the rate may be low for this model"
            )
            result.notes.append(
                f"the loss fell only at {factor}x the learning rate ({faster.shown()}); at the script's rate: "
                f"{first.shown()}. The pipeline learns; {why}"
            )
            return result
    cause = "no trainable parameter changed" if not first.moved else "the loss barely moves"
    tried = f", nor at {' or '.join(f'{first.rate * f:g}' for f in ESCALATION)}" if first.moved else ""
    raise with_pictures(
        diagnosis.PipelineFailure(
            f"the model does not learn one fixed batch ({cause}): {first.shown()}{tried}; "
            f"expected a fall of {FALL:.1%}",
            "check that the labels belong to the inputs, that the layers that should train are not frozen, "
            f"and the learning rate ({first.rate:g})",
        ),
        result,
    )


def _attempt(pipeline: Pipeline, device: str, factor: float = 1.0) -> Attempt:
    """Steps on the batch (at `factor` x the peak learning rate) until its loss falls, diverges or steps run out.

    At the script's rate the run continues the step stage's: its first step is that one.
    """
    run = pipeline.fixed_batch_run(device, factor, within=FIRST_CHECK)
    before = run.starting_loss()
    last = pipeline.settings.overfit_steps
    if pipeline.twins and factor == 1:
        last = min(last, TWIN_STEPS)
    after, check_at, taken = before, FIRST_CHECK, 0
    for step in range(1, last + 1):
        if run.steps < step:
            run.step()
        taken = step
        if not math.isfinite(run.curve[step - 1]):
            break
        if step in (check_at, last):
            check_at *= 2
            after = run.eval_loss()
            if not math.isfinite(after) or not before * (1 - FALL) < after < before * (1 + GROWTH):
                break
    moved = bool(pipeline.changed_weights(run.model))
    return Attempt(run.rate, before, after, run.curve[:taken], moved, pipeline.family.judged_as)


STAGE = Stage("overfit", rank=70, run=run, needs=("step",))

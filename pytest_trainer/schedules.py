"""The learning rate over the whole run, computed from the Trainer's own scheduler, not trained: a warmup as long as
the run never reaches the peak, and a schedule made for fewer steps than the run trains the rest at 0.

The run's length is the script's: `max_steps`, else its epochs over the training split, whose length is estimated
from the stored rows where --trainer-sample cut them (a schedule judged on the sample alone would look far shorter).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis
from pytest_trainer.catalogue import RUN, checks

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline
    from pytest_trainer.script_runner import Cut

#: A top rate this close to the peak reached it (the rounding of the last warmup step).
REACHED = 0.99
#: Where the run's length is estimated (a sampled split), the top rate must be this far below the peak to count.
REACHED_ESTIMATED = 0.9
#: Steps at a rate of 0 at the end of the run that spoil it: this share of the run, and at least MIN_IDLE steps.
IDLE_SHARE = 0.05
MIN_IDLE = 2
#: Runs longer than this are not stepped through (a million scheduler steps take about ten seconds).
MOST_STEPS = 1_000_000
#: Schedulers that follow a metric, not the step count: nothing to compute ahead of the run.
BY_METRIC = ("reduce_lr_on_plateau", "greedy")


@dataclass(frozen=True)
class RunLength:
    """The optimizer steps of the script's run, and how they were had ("" where exact)."""

    steps: int
    estimated: str = ""


@checks("step", reads=RUN)
def judge(
    rates: Sequence[float], peak: float, run: RunLength, share: str = "warmup_ratio=0.05"
) -> diagnosis.Finding | None:
    """The finding about a run that takes the learning rates `rates` (one per optimizer step) toward `peak`, or
    None; `share` is how the arguments give a warmup as a share of the run."""
    steps = len(rates)
    if steps < 2 or peak <= 0:
        return None
    top = max(rates)
    how = f" ({run.estimated})" if run.estimated else ""
    if top < (REACHED_ESTIMATED if run.estimated else REACHED) * peak:
        first = next(index for index, rate in enumerate(rates) if rate == top)
        return diagnosis.Finding(
            f"the learning rate never reaches its peak {peak:g}: over the run's {steps} optimizer steps{how} the "
            f"schedule rises to {top:.3g} at most (step {first}), {top / peak:.0%} of the peak, so the warmup is "
            "longer than the run",
            f"make the warmup a part of the run: warmup_steps well below {steps}, or a share of the run, which "
            f"follows its length ({share})",
        )
    active = max((index for index, rate in enumerate(rates) if rate > 0), default=-1) + 1
    idle = steps - active
    if idle >= max(MIN_IDLE, IDLE_SHARE * steps):
        return diagnosis.Finding(
            f"the learning rate reaches 0 at step {active} of the run's {steps} optimizer steps{how}: the last "
            f"{idle} steps ({idle / steps:.0%} of the run) change nothing, because the scheduler was made for a "
            "shorter run",
            f"make the scheduler for the whole run, num_training_steps={steps} (the steps of one epoch x "
            f"num_train_epochs, after gradient accumulation), or let the Trainer make it from lr_scheduler_type and "
            f"a warmup ({share})",
        )
    return None


def run_length(trainer: Any, cuts: Sequence[Cut]) -> RunLength | str:
    """The optimizer steps the script's run takes, or why they cannot be known here."""
    args = trainer.args
    if args.max_steps > 0:
        return RunLength(int(args.max_steps))
    try:
        rows = len(trainer.train_dataset)
    except TypeError:
        return "the training data has no length and max_steps is not set"
    estimated = ""
    if cuts:
        named = [cut for cut in cuts if cut.split == "train"] or (list(cuts) if len(cuts) == 1 else [])
        if len(named) != 1:
            return "--trainer-sample cut several splits and none is named train, so the run's length is unknown"
        cut = named[0]
        rows = math.ceil(rows * cut.stored / cut.kept)
        estimated = (
            f"the training split's length estimated from the {cut.stored} stored rows of {cut.split}, which "
            f"--trainer-sample cut to {cut.kept}"
        )
    # As the Trainer counts them: the batches of an epoch, a last partial accumulation an update of its own.
    divide = math.floor if getattr(args, "dataloader_drop_last", False) else math.ceil
    batches = divide(rows / args.train_batch_size)
    per_epoch = max(1, math.ceil(batches / args.gradient_accumulation_steps))
    return RunLength(max(1, math.ceil(args.num_train_epochs * per_epoch)), estimated)


def check(pipeline: Pipeline, model: Any) -> tuple[diagnosis.Finding | None, list[str]]:
    """The schedule's finding (or None) and notes: the Trainer's own optimizer and scheduler for `model`, made for the
    run's length and stepped through it. A scheduler the script made itself is stepped too and put back."""
    from pytest_trainer import training

    trainer = pipeline.trainer
    kind = str(getattr(getattr(trainer.args, "lr_scheduler_type", ""), "value", trainer.args.lr_scheduler_type))
    if kind in BY_METRIC and trainer.lr_scheduler is None:
        return None, [f"not checked: the learning rate over the run ({kind} follows a metric, not the steps)"]
    run = run_length(trainer, pipeline.cuts)
    if isinstance(run, str):
        return None, [f"not checked: the learning rate over the run ({run})"]
    if run.steps > MOST_STEPS:
        return None, [f"not checked: the learning rate over the run ({run.steps} steps, more than {MOST_STEPS})"]
    optimizer, scheduler, put_back = training.optimizer_for(trainer, model, run.steps)
    if scheduler is None or not callable(getattr(scheduler, "get_last_lr", None)):
        put_back()
        return None, []
    saved = (scheduler.state_dict(), [group["lr"] for group in optimizer.param_groups])
    peak = max(group.get("initial_lr", group["lr"]) for group in optimizer.param_groups)
    rates = []
    own = trainer.lr_scheduler is scheduler  # the script's own, which the stages may have stepped: from its start
    try:
        with warnings.catch_warnings():  # torch warns of a scheduler stepped before its optimizer
            warnings.simplefilter("ignore")
            if own:
                for group in optimizer.param_groups:
                    group["lr"] = group.get("initial_lr", group["lr"])
                scheduler.last_epoch = -1
                scheduler.step()
            for _ in range(run.steps):
                rates.append(max(scheduler.get_last_lr()))
                scheduler.step()
    except TypeError:  # a scheduler that wants a metric
        return None, ["not checked: the learning rate over the run (the scheduler steps on a metric)"]
    finally:
        scheduler.load_state_dict(saved[0])
        for group, rate in zip(optimizer.param_groups, saved[1], strict=True):
            group["lr"] = rate
        put_back()
    how = f" ({run.estimated})" if run.estimated else ""
    note = f"schedule: {run.steps} optimizer steps{how}, peak {peak:g}, last rate {rates[-1]:.3g}"
    fields = getattr(type(trainer.args), "__dataclass_fields__", {})
    share = "warmup_ratio=0.05" if "warmup_ratio" in fields else "warmup_steps=0.05: below 1, a share of the run"
    return judge(rates, peak, run, share), [note]

"""The settings that read an evaluation's metrics, held against the metrics the evaluation returns.

`metric_for_best_model` is read at every evaluation of the training loop (the best checkpoint, `save_strategy='best'`,
`load_best_model_at_end`, early stopping, a plateau scheduler): a name the evaluation does not return crashes the run
with a KeyError at its first evaluation, an epoch in. `greater_is_better` against a metric's direction keeps the worst
checkpoint as the best, silently. A run that never evaluates (eval_strategy='no') keeps no best checkpoint at all. (A
step-based run whose eval_steps exceed its steps evaluates at its end with transformers 5, not with 4.x: not judged.)

Pure logic on what the `eval` stage read: the Trainer's arguments, its callbacks and the metric names it returned.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_trainer import diagnosis
from pytest_trainer.catalogue import SETTINGS, checks

#: What `Trainer.evaluate` adds to every evaluation's metrics, beside the loss and compute_metrics' own.
SPEED = ("runtime", "samples_per_second", "steps_per_second")

#: Words of a metric's name that say which way it improves; a name with words of both, or of neither, is not judged.
LOWER_IS_BETTER = frozenset({"loss", "perplexity", "ppl", "wer", "cer", "mse", "mae", "rmse", "mape", "error"})
HIGHER_IS_BETTER = frozenset(
    {
        "accuracy",
        "accuracies",
        "acc",
        "f1",
        "precision",
        "recall",
        "bleu",
        "sacrebleu",
        "rouge1",
        "rouge2",
        "rougel",
        "rougelsum",
        "auc",
        "mrr",
        "ndcg",
        "map",
        "spearman",
        "pearson",
        "matthews",
        "correlation",
        "exact",
        "chrf",
        "meteor",
    }
)


@dataclass(frozen=True)
class Evaluated:
    """What one evaluation split returned, as the Trainer prefixes it (`eval`, or `eval_<name>` for a dict)."""

    prefix: str
    loss: bool
    metrics: tuple[str, ...]

    def keys(self) -> set[str]:
        own = [*(["loss"] if self.loss else []), *self.metrics, *SPEED]
        return {name if name.startswith(f"{self.prefix}_") else f"{self.prefix}_{name}" for name in own}


def returned(splits: Sequence[Evaluated], logged: Iterable[str] = ()) -> set[str]:
    """Every metric name an evaluation of all the splits hands to the settings: the splits' own, and what the trainer
    logs into the same dict (`logged`, e.g. TRL's token accuracy, a sentence-transformers evaluator's), and `epoch`."""
    found = {"epoch"}
    for split in splits:
        found |= split.keys()
    return found | {name if name.startswith("eval_") else f"eval_{name}" for name in logged}


#: Words that turn a metric around ("neg_loss"): a name with one of them is not judged.
TURNED = frozenset({"neg", "negative", "inverse", "inv", "minus", "one"})


def direction(name: str) -> bool | None:
    """Whether higher values of the metric `name` are better, where its words say so; else None."""
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    if words & TURNED:
        return None
    lower, higher = bool(words & LOWER_IS_BETTER), bool(words & HIGHER_IS_BETTER)
    return None if lower == higher else higher


def readers(args: Any, callbacks: Sequence[Any]) -> list[str]:
    """The settings that act on the metric of `metric_for_best_model`, in the user's terms."""
    found = []
    if getattr(args, "load_best_model_at_end", False):
        found.append("load_best_model_at_end")
    if _value(getattr(args, "save_strategy", None)) == "best":
        found.append("save_strategy='best'")
    if any(type(callback).__name__ == "EarlyStoppingCallback" for callback in callbacks):
        found.append("EarlyStoppingCallback")
    if _value(getattr(args, "lr_scheduler_type", None)) in ("reduce_lr_on_plateau", "greedy"):
        found.append(f"lr_scheduler_type={_value(args.lr_scheduler_type)!r}")
    return found


def acting(args: Any, callbacks: Sequence[Any], split: str | None = None) -> list[str]:
    """The settings that act during training on what an evaluation returns: the `readers`, or `metric_for_best_model`
    alone (the best checkpoint is tracked, and kept when older ones are deleted); none where the run never
    evaluates. Of a dict of evaluation splits, they act on the `split` whose metric `metric_for_best_model` names
    (`eval_<split>_...`) only."""
    if _value(getattr(args, "eval_strategy", None)) == "no":
        return []
    metric = getattr(args, "metric_for_best_model", None)
    key = "" if metric is None else metric if metric.startswith("eval_") else f"eval_{metric}"
    if split is not None and not key.startswith(f"eval_{split}_"):
        return []
    found = readers(args, callbacks)
    if metric is not None and not found:
        found.append(f"metric_for_best_model={metric!r}")
    return found


@checks("eval", reads=SETTINGS)
def check(
    args: Any,
    callbacks: Sequence[Any],
    names: set[str],
    *,
    splits: Sequence[str] = (),
    computes_metrics: bool = True,
    unknown: Sequence[str] = (),
) -> str | None:
    """Raise a failure where a setting reads a metric the evaluation does not return, or reads it the wrong way, or
    waits for an evaluation the run never makes. `names` is what `returned` gave; `splits` the names of a dict of
    evaluation splits; `unknown` the trainer classes that add metrics of their own (their evaluation or log
    overridden): a name not found is then a note, not a failure."""
    metric = getattr(args, "metric_for_best_model", None)
    reading = readers(args, callbacks)
    strategy = _value(getattr(args, "eval_strategy", None))
    if reading and metric is not None:
        _check_evaluates(reading, strategy)
    if metric is None or strategy == "no":
        return None
    key = metric if metric.startswith("eval_") else f"eval_{metric}"
    if key not in names and unknown:
        return (
            f"metric_for_best_model={metric!r} not held against the metrics: {', '.join(unknown)} "
            "adds metrics of its own to each evaluation"
        )
    if key not in names:
        raise diagnosis.PipelineFailure(*_missing(metric, key, names, reading, splits, computes_metrics, args))
    better = direction(key.removeprefix("eval_"))
    if better is not None and reading and bool(args.greater_is_better) != better:
        default = (
            " (the default for a name that does not end in 'loss')"
            if args.greater_is_better and not metric.endswith("loss")
            else ""
        )
        raise diagnosis.PipelineFailure(
            f"metric_for_best_model={metric!r} is a metric where {'higher' if better else 'lower'} is better, but "
            f"greater_is_better={bool(args.greater_is_better)}{default}: the best model ({', '.join(reading)}) is the "
            f"one with the {'lowest' if better else 'highest'} {metric}, the worst",
            f"set greater_is_better={better} in TrainingArguments",
        )
    if better is not None and "lr_scheduler_type='reduce_lr_on_plateau'" in reading:
        mode = dict(getattr(args, "lr_scheduler_kwargs", None) or {}).get("mode", "min")
        if (mode == "max") != better:
            raise diagnosis.PipelineFailure(
                f"the plateau scheduler lowers the learning rate when {metric} stops "
                f"{'falling' if mode == 'min' else 'rising'} (mode={mode!r}), but {metric} improves as it "
                f"{'rises' if better else 'falls'}: it cuts the learning rate while the model improves",
                f"set lr_scheduler_kwargs={{'mode': {'max' if better else 'min'!r}}} in TrainingArguments",
            )
    return None


def _check_evaluates(reading: list[str], strategy: str | None) -> None:
    settings = ", ".join(reading)
    if strategy == "no":
        raise diagnosis.PipelineFailure(
            f"the run's evaluations drive {settings}, but eval_strategy='no': it never evaluates, so no "
            "checkpoint is ever the best" + (" and none is saved" if "save_strategy='best'" in reading else ""),
            "evaluate during training: eval_strategy='epoch' (and save_strategy='epoch' for "
            "load_best_model_at_end), or 'steps' with eval_steps",
        )


def _missing(
    metric: str, key: str, names: set[str], reading: list[str], splits: Sequence[str], computes_metrics: bool, args: Any
) -> tuple[str, str, list[str]]:
    shown = sorted(name for name in names if name != "epoch" and not name.endswith(SPEED))
    when = f"every {args.eval_steps:g} steps" if _value(args.eval_strategy) == "steps" else "the end of the first epoch"
    acting = f" ({', '.join(reading)})" if reading else ""
    cause = (
        f"metric_for_best_model={metric!r}{acting}: the Trainer reads {key!r} from each evaluation's metrics, "
        f"which hold {', '.join(shown) or 'no metric'}; the run crashes with a KeyError at its first evaluation "
        f"({when})"
    )
    base = key.removeprefix("eval_")
    split_keys = [f"eval_{split}_{base}" for split in splits if f"eval_{split}_{base}" in names]
    close = difflib.get_close_matches(key, shown, n=1, cutoff=0.6)
    if split_keys:
        fix = (
            f"with several evaluation splits each metric is named by its split: metric_for_best_model={split_keys[0]!r}"
        )
    elif base == "loss":
        fix = (
            "the evaluation computes no loss (its batches have no labels the model reads): give the evaluation "
            "split labels, or name a metric compute_metrics returns"
        )
    elif not computes_metrics:
        fix = (
            f"pass compute_metrics= a function returning {{{base!r}: ...}}"
            if not getattr(args, "prediction_loss_only", False)
            else "drop prediction_loss_only=True: with it the Trainer never calls compute_metrics"
        )
    elif close:
        fix = f"metric_for_best_model={close[0].removeprefix('eval_')!r}, a metric it returns"
    else:
        fix = f"return {base!r} from compute_metrics, or set metric_for_best_model to one of the names above"
    return cause, fix, []


def _value(setting: Any) -> str | None:
    """A strategy or scheduler setting as its string value (the enums' `.value`)."""
    return None if setting is None else str(getattr(setting, "value", setting))

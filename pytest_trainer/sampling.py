"""Online RL's batch, made as its trainer makes it: prompts drawn, completions sampled, rewards scored.

TRL's online trainers (GRPO, RLOO) draw a group of prompts from their dataloader, sample `num_generations`
completions of each with the model, score every completion with each reward function and turn the rewards of a
group into advantages. `sample` runs the trainer's own code for that once, with a fixed seed, and keeps what the
checks need besides the batch: the completions, each reward function's raw answer and the arguments it was given
(so a check can call it again on other completions), the rewards per function, and which completions ended.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis
from pytest_trainer.catalogue import COMPLETIONS, checks

if TYPE_CHECKING:
    import torch

#: Seed of the prompts drawn and of the completions sampled, so every stage and every run sees the same batch.
SEED = 0
#: Prompts whose completions the audit reads: generation batches are drawn until this many groups are sampled,
#: and at most DRAWS of them (the first is the batch the training stages step on).
GROUPS = 8
DRAWS = 4
#: Arguments the trainer passes to a reward function that are not data (callbacks, the trainer's state).
NOT_DATA = ("trainer_state", "log_extra", "log_metric", "environments")


@dataclass
class Call:
    """One call of a reward function: what it was given and what it returned, as it returned it."""

    arguments: dict[str, Any]
    answer: Any


@dataclass
class Sampled:
    """The completions sampled for one generation batch, and how the trainer scored them."""

    #: The reward functions' names, as the trainer logs them, and their weights.
    names: list[str]
    weights: list[float]
    #: The functions themselves (plain Python ones only; a reward model is scored by the trainer alone).
    functions: dict[str, Callable[..., Any]]
    #: Completions sampled per prompt: the rewards of each group of this many rows are compared.
    group: int
    max_completion_length: int | None
    completions: list[Any] = field(default_factory=list)
    #: One row per completion, one column per reward function (NaN where a function returned None).
    rewards: list[list[float]] = field(default_factory=list)
    #: Whether each completion ended with an end-of-sequence token within max_completion_length.
    ended: list[bool] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    #: Every call of each reward function, by name: one per generation batch drawn.
    calls: dict[str, list[Call]] = field(default_factory=dict)
    #: Wall seconds the sampling took: the trainer's generation and its reward functions, every batch drawn.
    seconds: float = 0.0
    #: Whether the trainer drops the completions cut at max_completion_length from the loss.
    masks_truncated: bool = False
    #: The policy's mean next-token entropy over the chosen batch's completions, as a share of the uniform
    #: distribution's (ln of the vocabulary): near 1 for a policy at a random start (None where it was not measured).
    entropy_share: float | None = None

    @property
    def conversational(self) -> bool:
        first = self.completions[0] if self.completions else None
        return isinstance(first, list) and all(isinstance(message, dict) for message in first)

    def total(self) -> list[float]:
        """Each completion's reward as the trainer sums it (weighted, NaN counted as missing)."""
        totals = []
        for row in self.rewards:
            present = [value * weight for value, weight in zip(row, self.weights, strict=True) if not math.isnan(value)]
            totals.append(sum(present) if present else math.nan)
        return totals

    def groups(self, values: list[float]) -> list[list[float]]:
        return [values[start : start + self.group] for start in range(0, len(values), self.group)]


def sample(trainer: Any) -> tuple[dict[str, Any], Sampled]:
    """A generation batch of the trainer (its prompts, sampled completions and advantages): the first one drawn that
    has an advantage to train on, else the first; and what made the batches drawn, up to GROUPS prompts."""
    import torch

    names = list(getattr(trainer, "reward_func_names", []))
    weights = [float(weight) for weight in getattr(trainer, "reward_weights", torch.ones(0)).tolist()]
    sampled = Sampled(
        names=names,
        weights=weights if len(weights) == len(names) else [1.0] * len(names),
        functions={},
        group=int(getattr(trainer, "num_generations", 1) or 1),
        max_completion_length=getattr(trainer.args, "max_completion_length", None),
        masks_truncated=bool(getattr(trainer.args, "mask_truncated_completions", False)),
    )
    model = trainer.model
    was_training = model.training
    # The trainer samples on its own device (its prompts go there); a CPU item of a GPU machine moved the model.
    where = next((parameter.device for parameter in model.parameters()), None)
    home = trainer.accelerator.device
    started = time.perf_counter()
    with torch.random.fork_rng(devices=_cuda_devices(home)), _recorded(trainer, sampled):
        torch.manual_seed(SEED)
        model.train()  # the trainer samples in training mode, with the training batch sizes
        if where is not None and where != home:
            model.to(home)
        try:
            with diagnosis.pipeline_part("the training dataloader (its dataset and data_collator)"):
                loader = iter(trainer.get_train_dataloader())
                chosen = _scored(trainer, next(loader))
            for _ in range(DRAWS - 1):
                if len(sampled.completions) >= GROUPS * sampled.group:
                    break
                with diagnosis.pipeline_part("the training dataloader (its dataset and data_collator)"):
                    prompts = next(loader, None)
                if prompts is None:
                    break
                scored = _scored(trainer, prompts)
                if not has_advantage(chosen) and has_advantage(scored):
                    chosen = scored
            if sampled.ended and not any(sampled.ended):
                sampled.entropy_share = entropy_share(model, chosen)
        finally:
            model.train(was_training)
            if where is not None and where != home:
                model.to(where)
    sampled.seconds = time.perf_counter() - started
    return dict(chosen), sampled


def entropy_share(model: Any, batch: Any) -> float | None:
    """The policy's mean next-token entropy over the completions of a scored batch, as a share of ln(vocabulary size);
    None where the batch or the model's outputs are not of the usual shape (a vision-language batch, say)."""
    import torch

    was_training = model.training
    try:
        prompt, completion = batch["prompt_ids"], batch["completion_ids"]
        ids = torch.cat([prompt, completion], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        model.eval()  # the policy's own distribution, without dropout
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits[:, prompt.size(1) - 1 : -1].float()
        entropy = -(logits.log_softmax(-1) * logits.softmax(-1)).sum(-1)
        kept = batch["completion_mask"].bool()
        return float(entropy[kept].mean()) / math.log(logits.size(-1)) if kept.any() else None
    except (KeyError, AttributeError, TypeError, ValueError, RuntimeError):
        return None
    finally:
        model.train(was_training)


def has_advantage(batch: Any) -> bool:
    """Whether some completion of a scored batch has a non-zero advantage (a gradient to train on)."""
    advantages = batch.get("advantages")
    return advantages is None or bool(advantages.abs().sum() > 0)


def _scored(trainer: Any, prompts: list[dict[str, Any]]) -> Any:
    with diagnosis.pipeline_part("sampling completions and scoring them with the reward functions"):
        return trainer._generate_and_score_completions(prompts)


def _cuda_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


@contextmanager
def _recorded(trainer: Any, sampled: Sampled) -> Iterator[None]:
    """The trainer's reward functions and its scoring, recorded while they run; put back afterwards."""
    import torch

    functions = list(trainer.reward_funcs)
    score = trainer._calculate_rewards

    def recorder(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            try:
                with diagnosis.pipeline_part(f"the reward function `{name}`"):
                    answer = function(*args, **kwargs)
            except (TypeError, AttributeError, KeyError) as error:
                wrong = other_format(name, error, kwargs.get("completions") or [])
                if wrong is None:
                    raise
                raise wrong from error
            sampled.calls.setdefault(name, []).append(Call(dict(kwargs), answer))
            check_answer(name, answer, len(kwargs.get("completions") or ()))
            return answer

        return recorded

    def scored(inputs: Any, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]]) -> Any:
        rewards = score(inputs, prompts, completions, completion_ids)
        sampled.completions.extend(completions)
        sampled.rewards.extend(rewards.detach().float().cpu().tolist())
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        ends = set(getattr(trainer, "eos_token_ids", None) or [getattr(tokenizer, "eos_token_id", None)])
        sampled.lengths.extend(len(ids) for ids in completion_ids)
        sampled.ended.extend(bool(ids) and int(ids[-1]) in ends for ids in completion_ids)
        return rewards

    for index, (name, function) in enumerate(zip(sampled.names, functions, strict=False)):
        plain = callable(function) and not isinstance(function, torch.nn.Module) and not _is_async(function)
        if plain:
            sampled.functions[name] = function
            trainer.reward_funcs[index] = recorder(name, function)
    trainer._calculate_rewards = scored
    try:
        yield
    finally:
        trainer.reward_funcs[:] = functions
        del trainer._calculate_rewards  # the class's own method again


def _is_async(function: Any) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(type(function).__call__)


@checks("collate", reads=COMPLETIONS)
def check_answer(name: str, answer: Any, expected: int) -> None:
    """A reward function returns one number (or None) per completion: anything else fails with the cause."""
    fix = (
        f"return a list with one float per completion from `{name}`, e.g. "
        "`return [score(completion) for completion in completions]`"
    )
    if isinstance(answer, (str, bytes)) or not hasattr(answer, "__len__"):
        raise diagnosis.PipelineFailure(
            f"the reward function `{name}` returns {type(answer).__name__} {answer!r:.60}, not a list with one reward "
            f"for each of the {expected} completions",
            fix,
        )
    values = list(answer)
    if len(values) != expected:
        raise diagnosis.PipelineFailure(
            f"the reward function `{name}` returns {len(values)} rewards for {expected} completions: the trainer "
            "needs one per completion (it is called with every completion of the batch at once)",
            fix,
        )
    for index, value in enumerate(values):
        number = value.item() if hasattr(value, "item") and getattr(value, "ndim", 0) == 0 else value
        if number is None:
            continue  # the function does not apply to this completion: TRL allows it
        if not isinstance(number, numbers.Real):
            raise diagnosis.PipelineFailure(
                f"the reward function `{name}` returns {type(value).__name__} {value!r:.60} for completion {index}, "
                "not a number",
                fix,
            )
        if not math.isfinite(float(number)):
            raise diagnosis.PipelineFailure(
                f"the reward function `{name}` returns {float(number)} for completion {index}: a non-finite reward "
                "turns the advantages of its whole group into NaN",
                f"make `{name}` return a finite float for every completion (return None where it does not apply)",
            )


#: What a function that takes a string for a list of messages, or the other way round, raises.
READS_MESSAGES = ("string indices must be integers", "'str' object has no attribute 'get'")
READS_TEXT = ("list indices must be integers", "'list' object has no attribute", "can only concatenate list")


def other_format(name: str, error: BaseException, completions: list[Any]) -> diagnosis.PipelineFailure | None:
    """A reward function that reads completions in the other format than the dataset's prompts produce."""
    message = str(error)
    conversational = bool(completions) and isinstance(completions[0], list)
    if not conversational and any(sign in message for sign in READS_MESSAGES):
        return diagnosis.PipelineFailure(
            f"the reward function `{name}` reads each completion as a list of chat messages "
            f"(completion[0]['content']), but the dataset's prompts are plain text, so completions are strings "
            f"({type(error).__name__}: {message})",
            "give the dataset conversational prompts ([{'role': 'user', 'content': ...}]) for this function, or "
            f"make `{name}` read completions as strings",
        )
    if conversational and any(sign in message for sign in READS_TEXT):
        return diagnosis.PipelineFailure(
            f"the reward function `{name}` reads each completion as a string, but the dataset's prompts are chat "
            f"messages, so each completion is a list of messages ({type(error).__name__}: {message})",
            f"read the text as completion[0]['content'] in `{name}`, or give the dataset plain-text prompts",
        )
    return None

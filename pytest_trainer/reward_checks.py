"""What online RL trains toward: the rewards of the completions the model samples, group by group.

GRPO and RLOO compare the rewards of the completions of one prompt: a completion better than its group's mean is
made more likely, a worse one less. Where a group's completions all get the same reward, its advantages are 0 and it
teaches nothing; where every group's do, the loss and its gradient are 0 at every step while the run looks healthy.
The audit reads the rewards the trainer gave the sampled batch, and calls each reward function again on other
completions (other prompts', an empty one, the dataset's own answers, one following the format the prompts ask for)
to tell a function that does not read the completion from a model that has not yet earned a sparse reward.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pytest_trainer import diagnosis
from pytest_trainer.sampling import NOT_DATA, Sampled
from pytest_trainer.schema import RewardsPicture

#: Rewards closer than this are the same reward (as TRL tells a group with no spread).
SAME = 1e-6
#: A policy whose next-token entropy is this share of a uniform choice's or more samples as an untrained model does.
UNTRAINED_ENTROPY = 0.9
#: Arguments of a reward function that are the completion, not data of the row.
COMPLETION_ARGUMENTS = ("prompts", "completions", "completion_ids")


def audit(sampled: Sampled, figures: dict[str, float], notes: list[str]) -> None:
    """Report the rewards of the sampled batch in `figures` and `notes`; fail where they cannot train (see the
    module's docstring)."""
    count = len(sampled.completions)
    ended = sum(sampled.ended)
    totals = sampled.total()
    spreads = [_spread(group) for group in sampled.groups(totals)]
    figures.update(
        {
            "completions": float(count),
            "completions_ended": float(ended),
            "truncated_share": (count - ended) / max(count, 1),
            "mean_completion_length": sum(sampled.lengths) / max(count, 1),
            "reward_mean": _mean(totals),
            "groups_with_spread": float(sum(spread > SAME for spread in spreads)),
        }
    )
    for index, name in enumerate(sampled.names):
        values = [row[index] for row in sampled.rewards]
        figures[f"reward_{name}_mean"] = _mean(values)
    notes.append(
        f"{count} completions of {len(spreads)} prompts ({sampled.group} each); reward spread (max - min) per group: "
        + ", ".join(f"{spread:.3g}" for spread in spreads)
    )
    notes.append(
        f"{ended} of {count} completions end within max_completion_length={sampled.max_completion_length} "
        f"(mean length {figures['mean_completion_length']:.1f} tokens)"
    )
    carrying = _carrying(sampled, spreads)
    figures["completions_with_gradient"] = float(carrying)
    notes.append(
        f"{carrying} of {count} completions carry a gradient (in a group whose rewards differ"
        + (", and ended: mask_truncated_completions=True drops the cut ones)" if sampled.masks_truncated else ")")
    )
    findings: list[diagnosis.Finding] = []  # both are reported: neither hides the other
    if count and not ended:
        _unended(sampled, count, findings, notes)
    elif sampled.masks_truncated and not carrying and any(spread > SAME for spread in spreads):
        findings.append(
            diagnosis.Finding(
                f"every group whose rewards differ holds only completions cut at max_completion_length="
                f"{sampled.max_completion_length}, and mask_truncated_completions=True drops those from the loss; the "
                f"{ended} that end sit in groups whose rewards do not differ: no completion carries a gradient, so "
                "the steps train nothing",
                f"raise max_completion_length (now {sampled.max_completion_length}) so that more answers end within "
                "it, or turn mask_truncated_completions off while the policy still learns to end its answers",
            )
        )
    if any(spread > SAME for spread in spreads):
        _note_deaf(sampled, notes)
    else:
        deaf = _unread(sampled, notes)
        if deaf is not None:
            findings.append(deaf)
    if findings:
        raise diagnosis.combined(findings)


def _unended(sampled: Sampled, count: int, findings: list[diagnosis.Finding], notes: list[str]) -> None:
    """No completion ends within max_completion_length: a failure where it costs the run its signal (the cut ones are
    masked out of the loss) or where the policy has learned to end answers; a note for a policy at a random start,
    which almost never samples its end token at any length."""
    cut = f"none of the {count} sampled completions ends within max_completion_length={sampled.max_completion_length}"
    share = sampled.entropy_share
    if sampled.masks_truncated:
        findings.append(
            diagnosis.Finding(
                f"{cut}, and mask_truncated_completions=True drops every cut completion from the loss: no completion "
                "carries a gradient, so the steps train nothing",
                f"raise max_completion_length (now {sampled.max_completion_length}) so that answers end within it, or "
                "turn mask_truncated_completions off while the policy still learns to end its answers",
            )
        )
    elif share is not None and share >= UNTRAINED_ENTROPY:
        notes.append(
            f"{cut}: the policy samples as a model at its random start does (next-token entropy "
            f"{share:.0%} of a uniform choice), which almost never draws its end token; with a pretrained "
            "policy this is checked"
        )
    else:
        findings.append(
            diagnosis.Finding(
                f"{cut}: every one is cut before an end-of-sequence token, so the reward functions never see a "
                "finished answer",
                f"raise max_completion_length (now {sampled.max_completion_length}), and check that the model's "
                "generation_config.eos_token_id is the token the tokenizer ends its answers with",
            )
        )


def _carrying(sampled: Sampled, spreads: list[float]) -> int:
    """How many completions get an advantage other than 0 and stay in the loss: those of a group with a reward spread,
    less the cut ones where the trainer masks them."""
    flags = [1.0 if ended or not sampled.masks_truncated else 0.0 for ended in sampled.ended]
    return int(sum(sum(group) for group, spread in zip(sampled.groups(flags), spreads, strict=False) if spread > SAME))


def picture(sampled: Sampled) -> RewardsPicture:
    """The rewards of the sampled batch, group by group (one group per prompt), in total and per reward function;
    a reward the trainer left missing (NaN) is None."""

    def plain(values: list[float]) -> list[list[float | None]]:
        return [[value if math.isfinite(value) else None for value in group] for group in sampled.groups(values)]

    return {
        "total": plain(sampled.total()),
        "functions": {
            name: plain([float(row[index]) for row in sampled.rewards]) for index, name in enumerate(sampled.names)
        },
        "ended": [bool(ended) for ended in sampled.ended],
    }


def _unread(sampled: Sampled, notes: list[str]) -> diagnosis.Finding | None:
    """Every group's rewards are equal: the reward functions that read no completion, or a note that they do."""
    probed = {name: _responds(sampled, name) for name in sampled.functions}
    heard = [f"`{name}` responded to {probe}" for name, probe in probed.items() if probe]
    models = [f"`{name}`" for name in sampled.names if name not in sampled.functions]
    if heard or models or not probed:
        said = "; ".join(heard + ([f"{', '.join(models)} (a reward model, not probed)"] if models else []))
        notes.append(
            "every group's completions got the same total reward, so this batch has no advantage to train on; the "
            f"reward functions do score completions ({said}): the model at its starting weights never earns a "
            "different reward. The stages that step on the gradient skip"
        )
        return None
    deaf = list(probed)
    shown = "; ".join(f"`{name}` gives {_constant(sampled, name)}" for name in deaf)
    calls = sampled.calls.get(deaf[0]) or []
    tried = ", ".join(what for what, _ in _probes(sampled, calls[0].arguments)) if calls else "none"
    return diagnosis.Finding(
        f"the reward function{'s' if len(deaf) > 1 else ''} {_listed(deaf)} give{'' if len(deaf) > 1 else 's'} "
        f"every completion of a prompt the same reward ({shown}), and the same to other completions of the same "
        f"rows ({tried}): the completion is not read, so every advantage is 0 and the policy loss has no gradient "
        "at any step",
        f"score each completion in {_listed(deaf)}: "
        + (
            "completions are lists of messages here, so read the text as completion[0]['content']"
            if sampled.conversational
            else "completions are strings here"
        )
        + "; return one reward per completion that depends on it",
    )


def _note_deaf(sampled: Sampled, notes: list[str]) -> None:
    """A function that gives one reward to everything, beside others that train: worth a look, not a failure."""
    for name in sampled.functions:
        index = sampled.names.index(name)
        values = [row[index] for row in sampled.rewards]
        if _spread(values) <= SAME and not _responds(sampled, name):
            notes.append(
                f"`{name}` gave every completion and every probe the same reward "
                f"({_constant(sampled, name)}): check that it reads the completions"
            )


def _responds(sampled: Sampled, name: str) -> str:
    """The first probe on which reward function `name` answers otherwise than on the sampled completions ("" for
    none): a function that reads the completion answers other completions otherwise."""
    function = sampled.functions[name]
    for call in sampled.calls.get(name, []):
        arguments = {
            **call.arguments,
            "log_extra": lambda *args, **kwargs: None,
            "log_metric": lambda *args, **kwargs: None,
        }
        for what, probe in _probes(sampled, call.arguments):
            try:
                answer = list(function(**{**arguments, **probe}))
            except Exception:  # a probe the function cannot read tells nothing
                continue
            if len(answer) == len(call.answer) and any(
                not _same(a, b) for a, b in zip(answer, call.answer, strict=False)
            ):
                return what
    return ""


def _probes(sampled: Sampled, arguments: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Other completions for the same rows, each named: other prompts', empty ones, each text column of the rows,
    and the tagged format the prompts ask for (`<think>...</think>`)."""
    completions = arguments.get("completions") or []
    count = len(completions)
    ids = arguments.get("completion_ids")
    texts: list[tuple[str, list[str], Any]] = []
    if count > sampled.group:
        order = [(index + sampled.group) % count for index in range(count)]
        texts.append(
            (
                "other prompts' completions",
                [_text(completions[index]) for index in order],
                [ids[index] for index in order] if isinstance(ids, list) and len(ids) == count else ids,
            )
        )
    texts.append(("empty completions", [""] * count, [[] for _ in range(count)]))
    for key, values in arguments.items():
        if key in COMPLETION_ARGUMENTS or key in NOT_DATA or not isinstance(values, list) or len(values) != count:
            continue
        if all(isinstance(value, str) for value in values):
            texts.append((f"the rows' `{key}`", list(values), ids))
    tags = _tags(arguments.get("prompts") or [])
    if tags:
        answers = next((values for what, values, _ in texts if what.startswith("the rows'")), ["42"] * count)
        formatted = ["\n".join(f"<{tag}>\n{answer}\n</{tag}>" for tag in tags) for answer in answers]
        texts.append((f"completions in the prompts' format ({' '.join(f'<{tag}>' for tag in tags)})", formatted, ids))
    return [
        (
            what,
            {
                "completions": [_as_completion(text, sampled.conversational) for text in values],
                "completion_ids": token_ids,
            },
        )
        for what, values, token_ids in texts
    ]


def _tags(prompts: list[Any]) -> list[str]:
    """XML-like tags the prompts ask for (`<think>` ... `</think>`), in order of appearance."""
    found: list[str] = []
    for prompt in prompts:
        for tag in re.findall(r"<([A-Za-z_][\w-]*)>", _text(prompt)):
            if f"</{tag}>" in _text(prompt) and tag not in found:
                found.append(tag)
    return found


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(
            _text(message.get("content", "")) if isinstance(message, dict) else _text(message) for message in value
        )
    return str(value)


def _as_completion(text: str, conversational: bool) -> Any:
    return [{"role": "assistant", "content": text}] if conversational else text


def _same(a: Any, b: Any) -> bool:
    a, b = _number(a), _number(b)
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= SAME


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _constant(sampled: Sampled, name: str) -> str:
    index = sampled.names.index(name)
    values = {round(row[index], 6) for row in sampled.rewards}
    return f"{values.pop():g}" if len(values) == 1 else "one reward per prompt"


def _spread(values: list[float]) -> float:
    present = [value for value in values if not math.isnan(value)]
    return max(present) - min(present) if len(present) > 1 else 0.0


def _mean(values: list[float]) -> float:
    present = [value for value in values if not math.isnan(value)]
    return sum(present) / len(present) if present else math.nan


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)

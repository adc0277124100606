"""The judges of online RL's rewards (`reward_checks`), on batches GRPO really sampled and scored.

Each data file is the `Sampled` of a real run of conftest_examples/grpo/train.py (TRL's GRPOTrainer, a tiny Llama
built from a config, 2 reward functions, 4 completions per prompt), loaded as the plugin loads a script and sampled
by `sampling.sample` with its fixed seed, as the `targets` item does; a variant of the script changes a reward
function or the generation settings (kept in the file's `script`). tests/unit/record.py regenerates them. The reward
functions are not in the data: they are defined here as the scripts define them, and the judges call them again on
other completions, as they do in a run. No torch here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# One module a line, so that a module that moves is renamed with one sed.
from pytest_trainer import diagnosis, reward_checks, sampling

DATA = Path(__file__).parent / "data"


# ---- the reward functions of the recorded scripts -----------------------------------------------------------------


def names_the_animal(completions, answer, **kwargs):
    """The example's: 1 when the answer names the animal of the sentence, else 0."""
    return [
        float(animal in completion[0]["content"].split())
        for completion, animal in zip(completions, answer, strict=True)
    ]


def short_answer(completions, **kwargs):
    """The example's: answers of two words score 1; each word more or less costs a quarter."""
    return [1.0 - abs(len(completion[0]["content"].split()) - 2) / 4 for completion in completions]


def counts_messages(completions, answer, **kwargs):
    """grpo_reads_no_completion's `names_the_animal`: len() of a chat completion is its count of messages, 1."""
    return [float(len(completion)) for completion in completions]


def exact_animal(completions, answer, **kwargs):
    """grpo_sparse's `names_the_animal`: 1 for the exact answer only, which an untrained model never samples."""
    return [
        float(completion[0]["content"].strip() == animal)
        for completion, animal in zip(completions, answer, strict=True)
    ]


def always_one(completions, **kwargs):
    """grpo_one_deaf's third reward function."""
    return [1.0 for _ in completions]


EXAMPLE = {"names_the_animal": names_the_animal, "short_answer": short_answer}


def recorded(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def sampled_of(name: str, functions: dict[str, Any]) -> sampling.Sampled:
    """The recorded `Sampled`, with the reward functions the recorded script used (`functions`, by name)."""
    found = recorded(name)
    assert sorted(functions) == found["functions"], "the functions must be those the recorded script used"
    return sampling.Sampled(
        names=found["names"],
        weights=found["weights"],
        functions=functions,
        group=found["group"],
        max_completion_length=found["max_completion_length"],
        completions=found["completions"],
        rewards=[[math.nan if value is None else value for value in row] for row in found["rewards"]],
        ended=found["ended"],
        lengths=found["lengths"],
        calls={
            function: [sampling.Call(dict(found["batches"][call["batch"]]), call["answer"]) for call in calls]
            for function, calls in found["calls"].items()
        },
        seconds=found["seconds"],
        masks_truncated=found["masks_truncated"],
        entropy_share=found["entropy_share"],
    )


def audited(sampled: sampling.Sampled) -> tuple[dict[str, float], list[str]]:
    figures: dict[str, float] = {}
    notes: list[str] = []
    reward_checks.audit(sampled, figures, notes)
    return figures, notes


# ---- the example as it is: no alarm --------------------------------------------------------------------------------


def test_the_examples_rewards_pass_with_their_spread_reported() -> None:
    """grpo_example: the example as it is; its rewards differ within groups, so the audit passes."""
    sampled = sampled_of("grpo_example", EXAMPLE)
    figures, notes = audited(sampled)
    assert figures["completions"] == len(sampled.completions) == 8 * 4  # GROUPS prompts of num_generations each
    assert figures["groups_with_spread"] >= 1
    assert figures["completions_with_gradient"] >= 4
    assert any("reward spread (max - min) per group" in note for note in notes)
    assert not any("check that it reads the completions" in note for note in notes)


def test_the_examples_reward_functions_answer_the_probes_otherwise() -> None:
    """grpo_example: each of the example's functions reads the completion, so some probe changes its answer."""
    sampled = sampled_of("grpo_example", EXAMPLE)
    assert reward_checks._responds(sampled, "names_the_animal") != ""
    assert reward_checks._responds(sampled, "short_answer") != ""


def test_the_picture_groups_rewards_by_prompt() -> None:
    """grpo_example: one group of 4 rewards per prompt, in total and per function."""
    sampled = sampled_of("grpo_example", EXAMPLE)
    picture = reward_checks.picture(sampled)
    assert [len(group) for group in picture["total"]] == [4] * 8
    assert set(picture["functions"]) == {"names_the_animal", "short_answer"}
    assert len(picture["ended"]) == 32


# ---- a reward function that does not read the completion ---------------------------------------------------------


def test_a_reward_that_does_not_read_the_completion_is_named() -> None:
    """grpo_reads_no_completion: the example's `names_the_animal` reading a chat completion as a string (its len()
    is 1), alone: every group's rewards are equal, and every probe gets 1 too."""
    sampled = sampled_of("grpo_reads_no_completion", {"names_the_animal": counts_messages})
    with pytest.raises(diagnosis.Finding) as found:
        audited(sampled)
    cause = found.value.cause
    assert cause.startswith("the reward function `names_the_animal` gives every completion of a prompt the same reward")
    assert "`names_the_animal` gives 1" in cause
    assert "every advantage is 0" in cause
    assert "completion[0]['content']" in found.value.fix  # the prompts are conversational


def test_a_sparse_reward_the_untrained_model_never_earns_is_a_note() -> None:
    """grpo_sparse: `names_the_animal` asks for the exact answer, which the random policy never samples: every reward
    is 0, but the function reads the completion (the rows' own `answer` earns 1), so nothing fails."""
    sampled = sampled_of("grpo_sparse", {"names_the_animal": exact_animal})
    assert {value for row in sampled.rewards for value in row} == {0.0}
    figures, notes = audited(sampled)
    assert figures["groups_with_spread"] == 0
    assert any("`names_the_animal` responded to the rows' `answer`" in note for note in notes), notes


def test_a_reward_that_gives_everything_one_score_beside_others_is_a_note() -> None:
    """grpo_one_deaf: the example with a third function that returns 1 for every completion; the others train."""
    functions = {**EXAMPLE, "always_one": always_one}
    figures, notes = audited(sampled_of("grpo_one_deaf", functions))
    assert figures["groups_with_spread"] >= 1
    deaf = [note for note in notes if "check that it reads the completions" in note]
    assert len(deaf) == 1 and deaf[0].startswith("`always_one` gave every completion and every probe the same reward")


# ---- completions that never end ----------------------------------------------------------------------------------


def test_completions_cut_and_masked_out_of_the_loss_are_named() -> None:
    """grpo_never_ends_masked: max_completion_length=3 with the end token suppressed, and
    mask_truncated_completions=True: no completion ends, so none stays in the loss."""
    sampled = sampled_of("grpo_never_ends_masked", EXAMPLE)
    assert not any(sampled.ended)
    with pytest.raises(diagnosis.Finding) as found:
        audited(sampled)
    cause = found.value.cause
    assert "none of the 32 sampled completions ends within max_completion_length=3" in cause
    assert "mask_truncated_completions=True" in cause
    assert "max_completion_length (now 3)" in found.value.fix


def test_masked_cut_completions_that_are_the_only_ones_with_a_spread_are_named() -> None:
    """grpo_example, its first group's completions given one reward and taken as ended, the others as cut and masked
    (as when only the long answers, which the length cuts, score otherwise): the completions that end teach nothing,
    their group's rewards being equal."""
    sampled = sampled_of("grpo_example", EXAMPLE)
    size = sampled.group
    sampled.rewards[:size] = [list(sampled.rewards[0]) for _ in range(size)]
    sampled.ended = [index < size for index in range(len(sampled.completions))]
    sampled.masks_truncated = True
    with pytest.raises(diagnosis.Finding) as found:
        audited(sampled)
    assert found.value.cause.startswith(
        "every group whose rewards differ holds only completions cut at max_completion_length="
    )
    assert "no completion carries a gradient" in found.value.cause
    sampled.masks_truncated = False  # without the mask the cut completions carry the gradient
    audited(sampled)


def test_completions_of_a_random_policy_that_never_end_are_a_note() -> None:
    """grpo_never_ends: the same without the mask; the policy samples as at its random start (its next-token entropy
    near a uniform choice's), so the cut completions are noted, not failed."""
    sampled = sampled_of("grpo_never_ends", EXAMPLE)
    assert not any(sampled.ended)
    assert sampled.entropy_share is not None and sampled.entropy_share >= reward_checks.UNTRAINED_ENTROPY
    figures, notes = audited(sampled)
    assert figures["completions_ended"] == 0
    assert any("the policy samples as a model at its random start does" in note for note in notes), notes


def test_completions_of_a_trained_policy_that_never_end_are_named() -> None:
    """grpo_never_ends, its entropy taken as a pretrained policy's (sharp): the same cut completions now fail."""
    sampled = sampled_of("grpo_never_ends", EXAMPLE)
    sampled.entropy_share = 0.3
    with pytest.raises(diagnosis.Finding) as found:
        audited(sampled)
    assert "every one is cut before an end-of-sequence token" in found.value.cause


# ---- one reward per completion, in the prompts' format -----------------------------------------------------------


def test_the_recorded_answers_are_one_finite_reward_per_completion() -> None:
    """grpo_example: what each function returned to the trainer passes `check_answer`."""
    sampled = sampled_of("grpo_example", EXAMPLE)
    for name, calls in sampled.calls.items():
        for call in calls:
            sampling.check_answer(name, call.answer, len(call.arguments["completions"]))


def test_a_reward_function_that_returns_one_number_for_the_batch_is_named() -> None:
    """A reward function of the user's that sums the batch, called on the arguments GRPO gave the example's."""

    def total_length(completions, **kwargs):
        return [float(sum(len(completion[0]["content"]) for completion in completions))]

    arguments = sampled_of("grpo_example", EXAMPLE).calls["short_answer"][0].arguments
    with pytest.raises(diagnosis.PipelineFailure) as found:
        sampling.check_answer("total_length", total_length(**arguments), len(arguments["completions"]))
    assert found.value.cause.startswith("the reward function `total_length` returns 1 rewards for")


def test_a_reward_function_that_reads_chat_completions_as_text_is_named() -> None:
    """A reward function of the user's written for plain-text prompts, called on the example's chat completions."""

    def word_count(completions, **kwargs):
        return [float(len(completion.split())) for completion in completions]

    arguments = sampled_of("grpo_example", EXAMPLE).calls["short_answer"][0].arguments
    with pytest.raises(AttributeError) as error:
        word_count(**arguments)
    found = sampling.other_format("word_count", error.value, arguments["completions"])
    assert found is not None
    assert found.cause.startswith("the reward function `word_count` reads each completion as a string")
    assert sampling.other_format("short_answer", error.value, ["plain text"]) is None  # text prompts: no such cause


# ---- no torch ---------------------------------------------------------------------------------------------------


def test_judging_the_recorded_batches_imports_no_torch() -> None:
    """The audit's paths the tests take, in a fresh interpreter: rewards that train, and a function that reads none."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import test_reward_judges as t; "
        "t.audited(t.sampled_of('grpo_example', t.EXAMPLE)); "
        "t.test_a_reward_that_does_not_read_the_completion_is_named(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    checked = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stderr

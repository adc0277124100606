"""Online RL (TRL's GRPO and RLOO): the batch is made as the trainer makes it, prompts drawn, completions sampled
with the script's generation settings and scored by its reward functions; the rewards are audited in `targets`,
and the policy loss is checked through forward, backward, step and overfit.
"""

from __future__ import annotations

import json

import pytest
from pipeline_runs import failures, outcomes, run_script, write
from task_scripts import LM
from trl import GRPOTrainer  # noqa: F401  (imported once, before pytester's in-process runs)

GRPO = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer


    def longer_is_better(completions, **kwargs):
        return [float(len(completion.split())) for completion in completions]


    data = Dataset.from_dict({"prompt": tiny.sentences(16, seed=5, shortest=2, longest=5)})
    args = GRPOConfig(output_dir="out", per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                      report_to=[])
    trainer = GRPOTrainer(lm.model(), reward_funcs=longer_is_better, args=args, train_dataset=data,
                          processing_class=lm.tokenizer())
    trainer.train()
"""

#: The items that check an online RL script on the CPU; the others skip with their reason.
CHECKED = ("dataset", "collate", "targets", "forward", "backward", "step", "overfit", "precision")
STEPPING = ("backward", "step", "overfit")


def checked(result: pytest.RunResult) -> dict[str, str]:
    return {item: outcome for item, outcome in outcomes(result).items() if item[: -len("[cpu]")] in CHECKED}


def run_grpo(project: pytest.Pytester, source: str, *args: str) -> tuple[pytest.RunResult, dict[str, dict]]:
    project.makepyfile(lm=LM)
    write(project, "train.py", source)
    result = run_script(project, "--trainer-report=report.json", *args)
    report = json.loads((project.path / "report.json").read_text())["items"]
    return result, {item["stage"]: item for item in report if item["device"] == "cpu"}


def test_a_correct_grpo_script_passes_with_its_rewards_and_completions_reported(project: pytest.Pytester) -> None:
    result, report = run_grpo(project, GRPO)
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert checked(result) == {f"{item}[cpu]": "PASSED" for item in CHECKED}
    targets = report["targets"]
    assert targets["figures"]["completions"] == 16  # 4 prompts of 4 completions each, over the first batches
    assert targets["figures"]["groups_with_spread"] >= 1
    assert any("reward spread (max - min) per group" in note for note in targets["notes"])
    assert any("end within max_completion_length=8" in note for note in targets["notes"])
    assert targets["figures"]["sampling_seconds"] > 0  # what generation cost, in the summary too
    result.stdout.fnmatch_lines(
        [
            "  sampling completions took *.* s (generation and reward functions, once for every "
            "item; in targets[[]cpu[]])"
        ]
    )
    assert report["backward"]["figures"]["gradient_norm"] > 0
    assert targets["figures"]["completions_with_gradient"] == 4 * targets["figures"]["groups_with_spread"]
    overfit = report["overfit"]
    assert overfit["figures"]["loss_after"] < overfit["figures"]["loss_before"]
    skipped = {stage: item["reason"] for stage, item in report.items() if item["outcome"] == "skipped"}
    assert "does not check eval of these trainers yet" in skipped["eval"]
    assert "online RL samples its completions" in skipped["lengths"]


CONVERSATIONAL = (
    GRPO.replace(
        'data = Dataset.from_dict({"prompt": tiny.sentences(16, seed=5, shortest=2, longest=5)})',
        'data = Dataset.from_dict({"prompt": [[{"role": "user", "content": text}]\n'
        "                                         for text in tiny.sentences(16, seed=5, shortest=2, longest=5)]})\n"
        "    tokenizer = lm.tokenizer()\n"
        '    tokenizer.model_input_names = ["input_ids", "attention_mask"]  # a causal LM takes no token_type_ids\n'
        "    tokenizer.chat_template = \"{% for message in messages %}{{ message['content'] }} {% endfor %}\"",
    )
    .replace(
        "def longer_is_better(completions, **kwargs):\n        return [float(len(completion.split())) for completion in completions]",
        "def longer_is_better(completions, **kwargs):\n"
        '        return [float(len(completion[0]["content"].split())) for completion in completions]',
    )
    .replace("processing_class=lm.tokenizer()", "processing_class=tokenizer")
)


def test_a_correct_grpo_script_on_conversational_prompts_passes(project: pytest.Pytester) -> None:
    assert CONVERSATIONAL.count("tokenizer.chat_template") == 1 and 'completion[0]["content"]' in CONVERSATIONAL
    result, _ = run_grpo(project, CONVERSATIONAL)
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert checked(result) == {f"{item}[cpu]": "PASSED" for item in CHECKED}


def test_a_correct_conversational_grpo_script_with_weighted_rewards_passes(project: pytest.Pytester) -> None:
    """Two reward functions, one of which gives most completions the same score, weighted: the sum still differs
    within groups, so the completions carry a gradient."""
    weighted = (
        CONVERSATIONAL.replace(
            "    data = Dataset.from_dict(",
            "    def mentions_a_dog(completions, **kwargs):\n"
            '        return [float("dog" in completion[0]["content"]) for completion in completions]\n\n\n'
            "    data = Dataset.from_dict(",
        )
        .replace("reward_funcs=longer_is_better", "reward_funcs=[longer_is_better, mentions_a_dog]")
        .replace("max_completion_length=8,", "max_completion_length=8, reward_weights=[1.0, 0.5],")
    )
    assert weighted.count("mentions_a_dog") == 2 and "reward_weights" in weighted
    result, report = run_grpo(project, weighted)
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert checked(result) == {f"{item}[cpu]": "PASSED" for item in CHECKED}
    assert report["targets"]["figures"]["completions_with_gradient"] >= 4


def test_a_correct_grpo_script_with_lora_passes_and_trains_the_adapters(project: pytest.Pytester) -> None:
    lora = GRPO.replace(
        "from trl import GRPOConfig, GRPOTrainer",
        "from peft import LoraConfig\n    from trl import GRPOConfig, GRPOTrainer",
    ).replace(
        "processing_class=lm.tokenizer())",
        "processing_class=lm.tokenizer(),\n                          peft_config=LoraConfig(r=4, "
        'target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))',
    )
    assert "peft_config" in lora
    result, report = run_grpo(project, lora)
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert checked(result) == {f"{item}[cpu]": "PASSED" for item in CHECKED}
    assert "LoRA adapters on q_proj, v_proj" in " ".join(report["backward"]["notes"])


def test_a_reward_that_reads_a_chat_completion_as_a_string_fails_targets_naming_it(project: pytest.Pytester) -> None:
    """len() of a conversational completion is its number of messages: 1 for every completion, so every group's
    rewards are equal, every advantage is 0 and nothing trains while the run looks healthy."""
    broken = CONVERSATIONAL.replace('float(len(completion[0]["content"].split()))', "float(len(completion))")
    assert broken != CONVERSATIONAL
    result, report = run_grpo(project, broken)
    assert failures(result) == ["targets[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        [
            "*targets[[]cpu[]] failed: the reward function `longer_is_better` gives every completion of a prompt the same "
            "reward (`longer_is_better` gives 1)*every advantage is 0*",
            "*fix: score each completion in `longer_is_better`: completions are lists of messages here, so read the text "
            "as completion[[]0[]][[]'content'[]]*",
        ]
    )
    for stage in STEPPING:
        assert report[stage]["outcome"] == "skipped"
        assert "every advantage of the sampled batches is 0" in report[stage]["reason"]


def test_a_sparse_reward_the_untrained_model_never_earns_is_no_failure(project: pytest.Pytester) -> None:
    """A reward for the exact answer is 0 for every completion of a random model: the function reads the completion
    (the dataset's answer earns it), so targets passes and says why nothing steps, and the stepping stages skip."""
    sparse = GRPO.replace(
        "def longer_is_better(completions, **kwargs):\n        return [float(len(completion.split())) for completion in "
        "completions]",
        "def longer_is_better(completions, answer, **kwargs):\n"
        "        return [float(completion.strip() == wanted) for completion, wanted in zip(completions, answer)]",
    ).replace(
        'data = Dataset.from_dict({"prompt": tiny.sentences(16, seed=5, shortest=2, longest=5)})',
        'data = Dataset.from_dict({"prompt": tiny.sentences(16, seed=5, shortest=2, longest=5),\n'
        '                          "answer": ["the big red dog sat on the log"] * 16})',
    )
    assert sparse.count("answer") == 3
    result, report = run_grpo(project, sparse)
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert report["targets"]["outcome"] == "passed"
    assert any("responded to the rows' `answer`" in note for note in report["targets"]["notes"])
    assert report["targets"]["figures"]["completions_with_gradient"] == 0
    assert any(note.startswith("0 of 16 completions carry a gradient") for note in report["targets"]["notes"])
    for stage in STEPPING:
        assert "every advantage of the sampled batches is 0" in report[stage]["reason"]


ONE_PER_COMPLETION = "*fix: return a list with one float per completion from `longer_is_better`*"


@pytest.mark.parametrize(
    ("reward", "cause", "fix"),
    [
        (
            "return 1.0",
            "*the reward function `longer_is_better` returns float 1.0, not a list with one reward for each of "
            "the 4 completions*",
            ONE_PER_COMPLETION,
        ),
        (
            "return [1.0]",
            "*the reward function `longer_is_better` returns 1 rewards for 4 completions*",
            ONE_PER_COMPLETION,
        ),
        (
            "return [float('nan')] * len(completions)",
            "*the reward function `longer_is_better` returns nan for completion 0*",
            "*fix: make `longer_is_better` return a finite float for every completion (return None where it does not apply)",
        ),
    ],
    ids=["one-number", "one-per-batch", "nan"],
)
def test_a_reward_function_that_does_not_return_one_finite_reward_per_completion_fails_collate(
    project: pytest.Pytester, reward: str, cause: str, fix: str
) -> None:
    broken = GRPO.replace("return [float(len(completion.split())) for completion in completions]", reward)
    assert broken != GRPO
    result, report = run_grpo(project, broken)
    assert failures(result) == ["collate[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines([cause, fix.replace("(", "(")])
    assert "blocked by collate[cpu]" in report["forward"]["reason"]


def test_a_reward_of_none_where_a_function_does_not_apply_passes(project: pytest.Pytester) -> None:
    partial = GRPO.replace(
        "return [float(len(completion.split())) for completion in completions]",
        "return [float(len(c.split())) if len(c.split()) > 3 else None for c in completions]",
    )
    assert partial != GRPO
    result, _ = run_grpo(project, partial)
    assert failures(result) == [], result.stdout.str()[-4000:]


#: Completions of 3 tokens that can never end: the eos token is suppressed in generation.
NEVER_ENDS = GRPO.replace(
    "max_completion_length=8,",
    "max_completion_length=3,\n                      "
    'generation_kwargs={"suppress_tokens": [lm.tokenizer().eos_token_id]},',
)


#: The same with a policy whose next-token choice is sharp, as a pretrained one's is.
PEAKED_NEVER_ENDS = NEVER_ENDS.replace("GRPOTrainer(lm.model(),", "GRPOTrainer(lm.peaked(),")


def test_completions_that_never_end_fail_targets_where_the_policy_is_past_its_random_start(
    project: pytest.Pytester,
) -> None:
    assert PEAKED_NEVER_ENDS.count("lm.peaked()") == 1
    result, _ = run_grpo(project, PEAKED_NEVER_ENDS)
    assert "targets[cpu]" in failures(result), result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        [
            "*targets[[]cpu[]] failed: none of the 16 sampled completions ends within max_completion_length=3*",
            "*fix: raise max_completion_length (now 3)*",
        ]
    )


def test_a_random_policy_that_never_ends_its_completions_is_a_note(project: pytest.Pytester) -> None:
    """A policy built from a config samples almost uniformly, so it almost never draws its end token: CI smoke tests
    run exactly such models, and the cut completions still carry their gradient."""
    result, report = run_grpo(project, NEVER_ENDS)
    assert failures(result) == [], result.stdout.str()[-4000:]
    notes = " ".join(report["targets"]["notes"])
    assert (
        "none of the 16 sampled completions ends within max_completion_length=3: the policy samples as a model "
        "at its random start does" in notes
    )


def test_cut_completions_masked_out_of_the_loss_fail_targets_even_for_a_random_policy(project: pytest.Pytester) -> None:
    masked = NEVER_ENDS.replace("max_completion_length=3,", "max_completion_length=3, mask_truncated_completions=True,")
    assert masked.count("mask_truncated_completions=True") == 1
    result, _ = run_grpo(project, masked)
    assert "targets[cpu]" in failures(result), result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        [
            "*targets[[]cpu[]] failed: none of the 16 sampled completions ends within max_completion_length=3, and "
            "mask_truncated_completions=True drops every cut completion from the loss: no completion carries a gradient*",
            "*fix: raise max_completion_length (now 3) so that answers end within it*",
        ]
    )


#: RLOO's KL term (beta=0.05 by default) loads a reference model by the model's name, which a model built from a
#: config has not: beta=0 leaves it out.
RLOO = (
    GRPO.replace("GRPOConfig, GRPOTrainer", "RLOOConfig, RLOOTrainer")
    .replace("GRPOConfig(", "RLOOConfig(beta=0.0, ")
    .replace("GRPOTrainer(", "RLOOTrainer(")
)


def test_a_correct_rloo_script_passes(project: pytest.Pytester) -> None:
    assert "RLOOTrainer(" in RLOO
    result, _ = run_grpo(project, RLOO)
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert checked(result) == {f"{item}[cpu]": "PASSED" for item in CHECKED}


def test_a_nan_in_a_column_grpo_feeds_its_reward_functions_fails_dataset(project: pytest.Pytester) -> None:
    """The prompts' rows are checked as fed (GRPO hands every column to the reward functions): a NaN there fails
    `dataset`."""
    project.makepyfile(lm=LM)
    broken = GRPO.replace(
        'data = Dataset.from_dict({"prompt": tiny.sentences(16, seed=5, shortest=2, longest=5)})',
        'data = Dataset.from_dict({"prompt": tiny.sentences(16, seed=5, shortest=2, longest=5),\n'
        '                          "reward_bonus": [float("nan")] * 16})',
    )
    assert broken != GRPO
    write(project, "train.py", broken)
    result = run_script(project)
    assert "dataset[cpu]" in failures(result), result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(["*dataset[[]cpu[]] failed*'reward_bonus'*nan*"])


def test_a_marked_test_gets_the_sampled_grpo_batch(project: pytest.Pytester) -> None:
    project.makepyfile(lm=LM)
    write(project, "train.py", GRPO)
    write(
        project,
        "test_grpo.py",
        """
        import pytest

        @pytest.mark.trainer_pipeline(module="train.py", stages=["dataset"], devices=["cpu"])
        def test_batch(trainer_stage, train_batch):
            assert train_batch["completion_ids"].shape[0] == 4
            assert train_batch["advantages"].shape == (4,)
    """,
    )
    result = project.runpytest("test_grpo.py", "-rs")
    result.assert_outcomes(passed=1)


def test_use_vllm_on_a_machine_without_it_samples_with_generate_and_says_vllm_is_not_exercised(
    project: pytest.Pytester,
) -> None:
    with_vllm = GRPO.replace("max_completion_length=8,", "max_completion_length=8, use_vllm=True,")
    assert with_vllm != GRPO
    result, _ = run_grpo(project, with_vllm)
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert checked(result) == {f"{item}[cpu]": "PASSED" for item in CHECKED}
    result.stdout.fnmatch_lines(
        [
            "not exercised: the script asks for use_vllm=True; vLLM is not installed, so "
            "completions are sampled with the model's own generate*vLLM itself is not exercised"
        ]
    )


def test_rloo_with_its_default_kl_term_on_a_model_built_from_a_config_fails_load_with_the_cause(
    project: pytest.Pytester,
) -> None:
    """RLOO's beta=0.05 loads a reference model by the policy's name, which a model built from a config has not."""
    default_beta = RLOO.replace("RLOOConfig(beta=0.0, ", "RLOOConfig(")
    assert default_beta != RLOO
    project.makepyfile(lm=LM)
    write(project, "train.py", default_beta)
    result = run_script(project)
    assert failures(result) == ["load[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        [
            "*load[[]cpu[]] failed: *with beta=0.05, the trainer builds a reference model for its KL term by loading the "
            "policy model's checkpoint by name (''), which a model built from a config does not have*",
            "*fix: set beta=0.0 in the config*",
        ]
    )


def test_the_batch_stepped_on_is_the_first_drawn_with_an_advantage(project: pytest.Pytester) -> None:
    """A first batch whose completions tie (here: the reward of the first call) teaches nothing; a later batch drawn
    for the audit does, and the training stages step on that one rather than skip."""
    tied_first = GRPO.replace(
        "def longer_is_better(completions, **kwargs):\n        return",
        "calls = []\n\n\n    def longer_is_better(completions, **kwargs):\n        calls.append(1)\n"
        "        if len(calls) == 1:\n            return [1.0] * len(completions)\n        return",
    )
    assert tied_first.count("calls") == 3
    result, report = run_grpo(project, tied_first)
    assert failures(result) == [], result.stdout.str()[-4000:]
    assert checked(result) == {f"{item}[cpu]": "PASSED" for item in CHECKED}
    assert report["backward"]["figures"]["gradient_norm"] > 0


def test_completions_that_never_end_do_not_hide_a_reward_that_reads_none(project: pytest.Pytester) -> None:
    both = PEAKED_NEVER_ENDS.replace(
        "return [float(len(completion.split())) for completion in completions]", "return [1.0] * len(completions)"
    )
    assert both.count("suppress_tokens") == 1 and "[1.0] * len(completions)" in both
    result, _ = run_grpo(project, both)
    assert failures(result) == ["targets[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        [
            "*targets[[]cpu[]] failed: none of the 16 sampled completions ends within max_completion_length=3*",
            "*also: the reward function `longer_is_better` gives every completion of a prompt the same reward (`longer_is_"
            "better` gives 1), and the same to other completions of the same rows (empty completions)*",
        ]
    )

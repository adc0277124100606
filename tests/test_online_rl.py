"""Online RL (TRL's GRPO): its family is known, so a correct script is never failed for a batch it does not make.

GRPO's dataloader yields prompts; the completions are sampled and scored inside training. Until the plugin samples
them, the script's load and its prompts are checked and every stage that needs a batch skips with the reason.
"""

from __future__ import annotations

import json

import pytest
from conftest import ITEMS, failures, outcomes, run_script, write
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

NOT_SAMPLED = "online RL (GRPO, RLOO) makes its batches by sampling completions from the model"


def test_a_grpo_script_loads_its_prompts_are_checked_and_the_batch_stages_skip_with_the_reason(
        project: pytest.Pytester) -> None:
    project.makepyfile(lm=LM)
    write(project, "train.py", GRPO)
    result = run_script(project, "--trainer-report=report.json")
    assert failures(result) == [], result.stdout.str()[-4000:]
    statuses = outcomes(result, load=True)
    assert statuses.pop("load[cpu]") == "PASSED"
    assert statuses.pop("dataset[cpu]") == "PASSED"
    assert statuses == {f"{item}[cpu]": "SKIPPED" for item in ITEMS if item != "dataset"}
    report = json.loads((project.path / "report.json").read_text())["items"]
    reasons = {item["stage"]: item["reason"] for item in report if item["outcome"] == "skipped"}
    assert set(reasons) == set(ITEMS) - {"dataset"}
    assert all(NOT_SAMPLED in reason for reason in reasons.values()), reasons
    dataset = next(item for item in report if item["stage"] == "dataset")
    assert "task: online RL (prompts, sampled completions, rewards)" in dataset["notes"]


def test_a_nan_in_a_column_grpo_feeds_its_reward_functions_fails_dataset(project: pytest.Pytester) -> None:
    """The prompts' rows are checked as fed (GRPO hands every column to the reward functions): a NaN there fails
    `dataset`, and the batch stages still skip with their reason."""
    project.makepyfile(lm=LM)
    broken = GRPO.replace(
        'data = Dataset.from_dict({"prompt": tiny.sentences(16, seed=5, shortest=2, longest=5)})',
        'data = Dataset.from_dict({"prompt": tiny.sentences(16, seed=5, shortest=2, longest=5),\n'
        '                          "reward_bonus": [float("nan")] * 16})')
    assert broken != GRPO
    write(project, "train.py", broken)
    result = run_script(project)
    assert failures(result) == ["dataset[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(["*dataset[[]cpu[]] failed*'reward_bonus'*nan*"])


def test_a_marked_test_asking_a_grpo_pipeline_for_its_batch_is_skipped_with_the_reason(
        project: pytest.Pytester) -> None:
    project.makepyfile(lm=LM)
    write(project, "train.py", GRPO)
    write(project, "test_grpo.py", """
        import pytest

        @pytest.mark.trainer_pipeline(module="train.py", stages=["dataset"], devices=["cpu"])
        def test_batch(trainer_stage, train_batch):
            assert train_batch
    """)
    result = project.runpytest("test_grpo.py", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines([f"SKIPPED*{NOT_SAMPLED}*"])

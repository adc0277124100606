"""TRL's own training scripts (`trl/scripts/grpo.py`, `rloo.py`, `kto.py` from the installed trl), run unmodified on
a tiny model saved to a folder and local JSONL data, as their users run them with their own arguments."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trl
from pipeline_runs import TINY, failures, outcomes, write
from task_scripts import LM
from trl import GRPOConfig, GRPOTrainer, KTOConfig, KTOTrainer, RLOOConfig, RLOOTrainer  # noqa: F401

# The trainers and configs the scripts import are imported here, before pytester's in-process runs, for the reason
# conftest gives (a checkpoint pickles the config: its class must be the one sys.modules keeps).

SCRIPTS = Path(trl.__file__).parent / "scripts"

SAVED = """
    import json
    import os

    import lm
    import tiny

    from transformers import PreTrainedTokenizerFast

    # What a decoder takes, kept by save_pretrained (a causal LM's tokenizer returns no token_type_ids).
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=lm.tokenizer().backend_tokenizer, model_max_length=64,
                                        pad_token="[PAD]", unk_token="[UNK]", bos_token="[CLS]", eos_token="[SEP]",
                                        model_input_names=["input_ids", "attention_mask"])
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }} {% endfor %}"
    lm.model().save_pretrained("model")
    tokenizer.save_pretrained("model")
    rows = tiny.sentences(24, seed=3, shortest=2, longest=5)
    for folder, row in (
        ("chat", lambda text, index: {"prompt": [{"role": "user", "content": text}]}),
        ("plain", lambda text, index: {"prompt": text}),
        ("kto", lambda text, index: {"prompt": text, "completion": rows[-index - 1], "label": index % 2 == 0}),
    ):
        os.makedirs(folder)
        with open(f"{folder}/train.jsonl", "w") as file:
            file.writelines(json.dumps(row(text, index)) + "\\n" for index, text in enumerate(rows))
"""

REWARDS = """
    def brevity(completions, **kwargs):
        \"\"\"Answers of about four words score best.\"\"\"
        texts = [completion[0]["content"] if isinstance(completion, list) else completion for completion in completions]
        return [-abs(len(text.split()) - 4) / 4 for text in texts]
"""

GENERATION = "--per_device_train_batch_size 4 --num_generations 4 --max_completion_length 8"


@pytest.fixture(scope="session")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where `make_data.py` saved the model and wrote the data, once for the session (in a process of its
    own, as a user's script would)."""
    folder = tmp_path_factory.mktemp("trl_scripts")
    for name, source in (("tiny.py", TINY), ("lm.py", LM), ("make_data.py", SAVED)):
        (folder / name).write_text(textwrap.dedent(source))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "make_data.py"], cwd=folder, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return folder


@pytest.fixture
def saved(project: pytest.Pytester, made: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A tiny Llama and its tokenizer saved in `model/`, prompts in `chat/`, `plain/` and `kto/`, rewards in
    `my_rewards.py`."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    project.makepyfile(lm=LM)
    for folder in ("model", "chat", "plain", "kto"):
        shutil.copytree(made / folder, project.path / folder)
    write(project, "my_rewards.py", REWARDS)
    return project


def run_trl(project: pytest.Pytester, script: str, arguments: str) -> tuple[pytest.RunResult, dict[str, dict]]:
    result = project.runpytest(
        f"--trainer-module={SCRIPTS / script}",
        "--trainer-devices=cpu",
        "-v",
        "-rs",
        f"--trainer-args={arguments} --output_dir out --report_to none",
        "--trainer-report=report.json",
    )
    report = json.loads((project.path / "report.json").read_text())["items"]
    return result, {item["stage"]: item for item in report}


@pytest.mark.parametrize("script", ["grpo.py", "rloo.py"])
def test_trl_online_rl_script_with_a_reward_of_your_own_and_think_format_reward_passes(
    saved: pytest.Pytester, script: str
) -> None:
    result, report = run_trl(
        saved,
        script,
        f"--model_name_or_path model --dataset_name chat {GENERATION} "
        "--reward_funcs my_rewards.brevity think_format_reward",
    )
    assert failures(result, script) == [], result.stdout.str()[-4000:]
    passed = {item for item, outcome in outcomes(result, script).items() if outcome == "PASSED"}
    assert passed == {
        f"{stage}[cpu]"
        for stage in ("dataset", "collate", "targets", "forward", "backward", "step", "overfit", "precision")
    }
    notes = " ".join(report["targets"]["notes"])
    assert "`think_format_reward` gave every completion and every probe the same reward (0)" in notes


#: Generation that never samples the end token ([SEP], id 3) within 16 tokens, as a random policy over a real
#: vocabulary almost never does.
UNENDING = (
    "--per_device_train_batch_size 4 --num_generations 4 --max_completion_length 16 "
    "--generation_kwargs '{\"suppress_tokens\":[3]}'"
)


@pytest.mark.parametrize("script", ["grpo.py", "rloo.py"])
def test_trl_online_rl_script_on_a_random_policy_that_never_ends_passes_with_a_note(
    saved: pytest.Pytester, script: str
) -> None:
    result, report = run_trl(
        saved, script, f"--model_name_or_path model --dataset_name chat {UNENDING} --reward_funcs my_rewards.brevity"
    )
    assert failures(result, script) == [], result.stdout.str()[-4000:]
    notes = " ".join(report["targets"]["notes"])
    assert "ends within max_completion_length=16: the policy samples as a model at its random start does" in notes


@pytest.mark.parametrize("script", ["grpo.py", "rloo.py"])
def test_trl_online_rl_script_masking_every_cut_completion_fails_targets(saved: pytest.Pytester, script: str) -> None:
    result, _ = run_trl(
        saved,
        script,
        f"--model_name_or_path model --dataset_name chat {UNENDING} "
        "--reward_funcs my_rewards.brevity --mask_truncated_completions true",
    )
    assert failures(result, script) == ["targets[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        [
            "*targets[[]cpu[]] failed: none of the 16 sampled completions ends within "
            "max_completion_length=16, and mask_truncated_completions=True drops every cut*"
        ]
    )


def test_think_format_reward_on_plain_text_prompts_fails_collate_with_the_format(saved: pytest.Pytester) -> None:
    """TRL's think_format_reward reads chat completions: given plain-text prompts it raises inside training."""
    result, _ = run_trl(
        saved,
        "grpo.py",
        f"--model_name_or_path model --dataset_name plain {GENERATION} --reward_funcs think_format_reward",
    )
    assert failures(result, "grpo.py") == ["collate[cpu]"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(
        [
            "*collate[[]cpu[]] failed: the reward function `think_format_reward` reads each completion as a list of chat "
            "messages*but the dataset's prompts are plain text, so completions are strings*",
            "*fix: give the dataset conversational prompts*",
        ]
    )


def test_trl_kto_script_passes(saved: pytest.Pytester) -> None:
    result, _ = run_trl(
        saved, "kto.py", "--model_name_or_path model --dataset_name kto --per_device_train_batch_size 4"
    )
    assert failures(result, "kto.py") == [], result.stdout.str()[-4000:]
    passed = {item for item, outcome in outcomes(result, "kto.py").items() if outcome == "PASSED"}
    assert {"forward[cpu]", "backward[cpu]", "step[cpu]", "overfit[cpu]", "save[cpu]"} <= passed


def test_the_scripts_are_run_unmodified(saved: pytest.Pytester) -> None:
    before = {name: (SCRIPTS / name).read_bytes() for name in ("grpo.py", "rloo.py", "kto.py")}
    run_trl(
        saved,
        "grpo.py",
        f"--model_name_or_path model --dataset_name chat {GENERATION} --reward_funcs my_rewards.brevity",
    )
    assert {name: (SCRIPTS / name).read_bytes() for name in before} == before
    assert shlex.split(GENERATION)[1] == "4"

"""`--trainer-command`: the command the user already runs, pasted as it is, gives the items a --trainer-module script
gives, with the same results; a launcher in front is read, not run; a console script that starts its training as a new
process (as axolotl and ms-swift do) is followed into it. The frameworks' own CLIs are held to it by
conftest_examples/frameworks/check.py, in their own environments."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

#: A script that takes its learning rate from the command line, as most do.
TRAIN = """
    import argparse
    import tiny
    from transformers import Trainer, TrainingArguments

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--lr", type=float, default=5e-4)
        options = parser.parse_args()
        tok = tiny.tokenizer()
        args = TrainingArguments(output_dir="out", learning_rate=options.lr, per_device_train_batch_size=8,
                                 report_to="none")
        trainer = Trainer(model=tiny.classifier(), args=args, processing_class=tok,
                          train_dataset=tiny.tokenized(tiny.text_dataset(), tok))
        trainer.train()

    if __name__ == "__main__":
        main()
"""
STAGES = "--trainer-stages=load,forward,step"


@pytest.fixture
def repo(project: pytest.Pytester) -> pytest.Pytester:
    """A repository with `train.py`, the same training as a package module (`trainpkg.train`, which imports its
    package's own module relatively) and an installed console script whose subcommands start it the ways the
    frameworks' CLIs do."""
    project.path.joinpath("train.py").write_text(textwrap.dedent(TRAIN))
    package = project.path / "trainpkg"
    package.mkdir()
    package.joinpath("__init__.py").write_text("")
    package.joinpath("defaults.py").write_text("LR = 5e-4\n")
    package.joinpath("train.py").write_text(
        textwrap.dedent(TRAIN)
        .replace("default=5e-4", "default=LR")
        .replace("import tiny", "import tiny\nfrom .defaults import LR")
    )
    package.joinpath("cli.py").write_text(
        textwrap.dedent(
            """
            import os, subprocess, sys

            def main():
                command, rest = sys.argv[1], sys.argv[2:]
                if command == "train":  # in this process, as LLaMA-Factory's CLI does on one device
                    from trainpkg import train
                    sys.argv = [sys.argv[0], *rest]
                    train.main()
                elif command == "launch":  # replaces itself with a launcher, as axolotl's CLI does
                    os.execvpe("accelerate", ["accelerate", "launch", "-m", "trainpkg.train", *rest], os.environ)
                elif command == "forward":  # passes what it does not know to its launcher, as axolotl's CLI does
                    os.execvpe("accelerate", ["accelerate", "launch", *rest, "-m", "trainpkg.train"], os.environ)
                elif command == "spawn":  # runs the training file as a new process, as ms-swift's CLI does
                    file = os.path.join(os.path.dirname(__file__), "train.py")
                    version = subprocess.run([sys.executable, "--version"], capture_output=True, check=True)
                    assert version.stdout.startswith(b"Python")  # a captured call is not a training: it runs
                    result = subprocess.run([sys.executable, "-m", "trainpkg.train", *rest])
                    sys.exit(result.returncode)
                else:
                    sys.exit(f"unknown command {command}")
            """
        )
    )
    # What pip writes for a console script: a dist-info folder beside the package, on the path.
    info = project.path / "trainpkg-0.1.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: trainpkg\nVersion: 0.1\n")
    info.joinpath("entry_points.txt").write_text("[console_scripts]\ntrainpkg-cli = trainpkg.cli:main\n")
    project.syspathinsert()
    return project


def items(project: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[tuple[str, str], dict[str, Any]]]:
    """Run pytest on the CPU, and each item of the JSON report by (script, item)."""
    result = project.runpytest("--trainer-devices=cpu", "--trainer-report=report.json", *args)
    report = json.loads((project.path / "report.json").read_text())
    found = {(item["script"], f"{item['stage']}[{item['device']}]"): item for item in report["items"]}
    return result, found


def verdicts(found: dict[tuple[str, str], dict[str, Any]], script: str) -> dict[str, tuple[str, str]]:
    return {name: (item["outcome"], item["diagnosis"]) for (of, name), item in found.items() if of == script}


@pytest.mark.parametrize(
    "command",
    [
        "python train.py --lr 0",
        "python -m trainpkg.train --lr 0",
        "trainpkg-cli train --lr 0",
        "trainpkg-cli launch --lr 0",
        "trainpkg-cli spawn --lr 0",
        "accelerate launch --num_processes 2 train.py --lr 0",
        "torchrun --nproc_per_node 2 train.py --lr 0",
        "python -m torch.distributed.run --nproc-per-node=2 -m trainpkg.train --lr 0",
    ],
)
def test_a_command_gives_the_items_and_results_of_its_script(repo: pytest.Pytester, command: str) -> None:
    result, found = items(
        repo, f"--trainer-command={command}", "--trainer-module=train.py", "--trainer-args=--lr 0", STAGES
    )
    assert verdicts(found, command) == verdicts(found, "train.py")
    assert verdicts(found, command)["step[cpu]"][0] == "failed"
    assert "the learning rate is 0" in verdicts(found, command)["step[cpu]"][1]
    result.stdout.fnmatch_lines([f"*step[[]cpu[]] of `{command}`*", "step[[]cpu[]] failed: the learning rate is 0*"])


def test_a_correct_command_passes(repo: pytest.Pytester) -> None:
    result, found = items(repo, "--trainer-command=trainpkg-cli launch", STAGES)
    assert {item["outcome"] for item in found.values()} == {"passed"}
    result.stdout.fnmatch_lines(
        ["*in this process: `accelerate launch -m trainpkg.train`, which the command starts as a new process*"]
    )
    assert result.ret == 0


def test_a_launchers_process_count_is_said_with_the_option_that_tests_it(repo: pytest.Pytester) -> None:
    result, _ = items(
        repo, "--trainer-command=torchrun --nproc_per_node 4 --nnodes 2 train.py", "--trainer-stages=load"
    )
    result.stdout.fnmatch_lines(
        [
            "launcher: torchrun asks for 8 processes (--nproc_per_node 4 --nnodes 2); the items run in one, and "
            "--trainer-processes=8 trains it in 8 on this machine (DDP on gloo)"
        ]
    )


@pytest.mark.parametrize(
    ("launcher", "said"),
    [
        # accelerate's --num_processes counts every machine's processes together
        ("accelerate launch --num_processes 16 --num_machines 2", "accelerate launch asks for 16 processes"),
        # an elastic range: as many nodes as join
        ("torchrun --nproc_per_node 8 --nnodes 1:4", "torchrun asks for a process per GPU"),
    ],
)
def test_the_process_count_is_the_launchers_own(repo: pytest.Pytester, launcher: str, said: str) -> None:
    result, _ = items(repo, f"--trainer-command={launcher} train.py", "--trainer-stages=load")
    result.stdout.fnmatch_lines([f"launcher: {said} *"])


def test_a_launchers_mixed_precision_is_the_scripts(repo: pytest.Pytester) -> None:
    result, found = items(
        repo, "--trainer-command=accelerate launch --mixed_precision fp16 train.py", "--trainer-stages=load,precision"
    )
    result.stdout.fnmatch_lines(
        ["precision: the script asks for mixed_precision=fp16 (its launcher's); this machine has no GPU*"]
    )
    precision = found[("accelerate launch --mixed_precision fp16 train.py", "precision[cpu]")]
    assert precision["outcome"] == "passed", precision
    assert any("fp16" in note for note in precision["notes"]), precision["notes"]
    plain, _ = items(repo, "--trainer-command=accelerate launch train.py", "--trainer-stages=load")
    assert "precision:" not in plain.stdout.str()


def test_an_accelerate_config_file_is_read_as_the_launcher_reads_it(repo: pytest.Pytester) -> None:
    repo.path.joinpath("multi.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 4\nnum_machines: 1\n"
        "mixed_precision: bf16\nmachine_rank: 0\n"
    )
    result, _ = items(
        repo, "--trainer-command=accelerate launch --config_file multi.yaml train.py", "--trainer-stages=load"
    )
    result.stdout.fnmatch_lines(
        [
            "*mixed_precision=bf16 (its launcher's)*",
            "launcher: accelerate launch asks for 4 processes (num_processes in multi.yaml 4)*",
            "not exercised: accelerate launch sets up FSDP, which needs several processes on GPUs",
        ]
    )


def test_commands_come_from_the_ini_file_one_per_line_and_are_chosen_by_k(repo: pytest.Pytester) -> None:
    repo.makeini(
        """
        [pytest]
        trainer_command =
            python train.py --lr 1e-3
            python -m trainpkg.train
        """
    )
    result, found = items(repo, "-k", "trainpkg and forward", STAGES)
    assert {script for script, _ in found} == {"python -m trainpkg.train"}
    assert {name for _, name in found} == {"forward[cpu]"}
    result.assert_outcomes(passed=1, deselected=5)


def test_the_marker_takes_a_command(repo: pytest.Pytester) -> None:
    repo.makepyfile(
        test_pipeline="""
        import pytest

        @pytest.mark.trainer_pipeline(command="trainpkg-cli spawn --lr 0", stages="load,step", devices="cpu")
        def test_steps(trainer_stage):
            trainer_stage.run()
        """
    )
    result = repo.runpytest("test_pipeline.py", "-v")
    result.stdout.fnmatch_lines(["*test_steps?load-cpu? PASSED*", "*test_steps?step-cpu? FAILED*"])
    result.stdout.fnmatch_lines(["*the learning rate is 0*"])


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("nowhere-cli train cfg.yml", "nowhere-cli is not a console script installed in this Python environment"),
        ("python -c 'import train'", "put that code in a file and give `python FILE`"),
        ("torchrun --nproc_per_node 2", "torchrun refuses these arguments: the following arguments are required"),
        (
            "accelerate launch --num_processes two train.py",
            "accelerate launch refuses these arguments: argument --num_processes*: invalid int value: 'two'",
        ),
        ("python nowhere.py", "runs nowhere.py, which is not a file under"),
    ],
)
def test_a_command_that_cannot_be_read_is_a_usage_error(repo: pytest.Pytester, command: str, said: str) -> None:
    result = repo.runpytest(f"--trainer-command={command}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--trainer-command on the command line: *{said}*"])


def test_arguments_the_command_rejects_fail_load_naming_the_command(repo: pytest.Pytester) -> None:
    result, found = items(repo, "--trainer-command=python -m trainpkg.train --lr", "--trainer-stages=load")
    load = found[("python -m trainpkg.train --lr", "load[cpu]")]
    assert load["outcome"] == "failed"
    assert "argument --lr: expected one argument" in load["diagnosis"]
    assert "change them in `python -m trainpkg.train --lr`" in load["fix"]
    result.stdout.fnmatch_lines(["*`python -m trainpkg.train --lr`: the script exited*"])


def test_a_launcher_refusing_what_the_command_passes_on_fails_load_with_its_reason(repo: pytest.Pytester) -> None:
    _, found = items(repo, "--trainer-command=trainpkg-cli forward --lr=0", "--trainer-stages=load")
    load = found[("trainpkg-cli forward --lr=0", "load[cpu]")]
    assert load["diagnosis"] == (
        "the command starts `accelerate launch --lr=0 -m trainpkg.train`, and accelerate launch refuses these "
        "arguments: unrecognized arguments: --lr=0"
    )
    assert load["fix"].startswith("change what `trainpkg-cli forward --lr=0` passes on to accelerate launch")


#: A script that takes every training argument from the command line, as transformers' examples do.
HF_ARGS = """
    import tiny
    from transformers import HfArgumentParser, Trainer, TrainingArguments

    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    tok = tiny.tokenizer()
    trainer = Trainer(model=tiny.classifier(), args=args, processing_class=tok,
                      train_dataset=tiny.tokenized(tiny.text_dataset(), tok))
    trainer.train()
"""
#: ZeRO-3 with offload, its batch left to the arguments and its precision the arguments' (bf16, which this machine
#: turns off in the arguments: the config is held to the script's own).
ZERO_3 = {
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
    "bf16": {"enabled": True},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": 64,  # 8 processes (the launcher's) x 8 rows (the arguments' default) x 1 step
}


def test_a_deepspeed_config_runs_without_deepspeed_and_says_what_is_not_exercised(repo: pytest.Pytester) -> None:
    repo.path.joinpath("hf_args.py").write_text(textwrap.dedent(HF_ARGS))
    repo.path.joinpath("configs").mkdir()
    repo.path.joinpath("configs", "zero3.json").write_text(json.dumps(ZERO_3))
    command = (
        "deepspeed --num_gpus 8 hf_args.py --output_dir out --report_to none --bf16 true --deepspeed configs/zero3.json"
    )
    result, found = items(repo, f"--trainer-command={command}", STAGES)
    assert {item["outcome"] for item in found.values()} == {"passed"}, verdicts(found, command)
    result.stdout.fnmatch_lines(
        [
            "not exercised: the script asks for DeepSpeed (configs/zero3.json: ZeRO stage 3, parameters and optimizer "
            "states offloaded to the CPU); * so the Trainer takes its steps without it, with its own optimizer*"
        ]
    )
    missing = command.replace("configs/zero3.json", "zero3.json")
    _, found = items(repo, f"--trainer-command={missing}", "--trainer-stages=load")
    load = found[(missing, "load[cpu]")]
    assert load["outcome"] == "failed"
    assert load["diagnosis"].startswith(
        "the DeepSpeed config zero3.json that TrainingArguments(deepspeed=...) names is not found from the working "
        f"directory {repo.path}"
    ), load["diagnosis"]
    assert load["fix"].startswith("give the config's path from the directory the script is launched in")


def test_a_deepspeed_config_at_odds_with_the_arguments_fails_load_and_the_other_items_run(
    repo: pytest.Pytester,
) -> None:
    repo.path.joinpath("hf_args.py").write_text(textwrap.dedent(HF_ARGS))
    repo.path.joinpath("zero3.json").write_text(json.dumps({**ZERO_3, "gradient_accumulation_steps": 4}))
    command = "deepspeed hf_args.py --output_dir out --report_to none --bf16 true --deepspeed zero3.json"
    _, found = items(repo, f"--trainer-command={command}", STAGES)
    assert verdicts(found, command) == {
        "load[cpu]": (
            "failed",
            "the DeepSpeed config zero3.json sets 1 value the TrainingArguments set otherwise "
            "(gradient_accumulation_steps=4 in the config, gradient_accumulation_steps=1 in the arguments): on the GPU "
            'machine trainer.train() stops with "Please correct the following DeepSpeed config values that mismatch '
            'TrainingArguments values"',
        ),
        "forward[cpu]": ("passed", ""),
        "step[cpu]": ("passed", ""),
    }
    fixed = command.replace("--report_to none", "--report_to none --gradient_accumulation_steps 4")
    _, found = items(repo, f"--trainer-command={fixed}", STAGES)
    assert {item["outcome"] for item in found.values()} == {"passed"}, verdicts(found, fixed)
    # train_batch_size (64) counts the launcher's processes: 2 x 8 rows x 4 steps holds, 4 x 8 x 4 does not.
    two = fixed.replace("deepspeed hf_args.py", "deepspeed --num_gpus 2 hf_args.py")
    _, found = items(repo, f"--trainer-command={two}", STAGES)
    assert {item["outcome"] for item in found.values()} == {"passed"}, verdicts(found, two)
    four = fixed.replace("deepspeed hf_args.py", "deepspeed --num_gpus 4 hf_args.py")
    _, found = items(repo, f"--trainer-command={four}", "--trainer-stages=load")
    assert "train_batch_size=64 in the config, 4 processes x" in verdicts(found, four)["load[cpu]"][1], found
    # Arguments built again before the Trainer (dataclasses.replace): only those it trains with are held to the config.
    rebuilt = HF_ARGS.replace(
        "(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()",
        "import dataclasses\n    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()\n"
        "    args = dataclasses.replace(args, gradient_accumulation_steps=4)",
    )
    repo.path.joinpath("rebuilt.py").write_text(textwrap.dedent(rebuilt))
    again = command.replace("hf_args.py", "rebuilt.py")
    _, found = items(repo, f"--trainer-command={again}", STAGES)
    assert {item["outcome"] for item in found.values()} == {"passed"}, verdicts(found, again)


def test_a_command_leaves_the_process_and_the_repository_as_it_found_them(repo: pytest.Pytester) -> None:
    before = sorted(str(path.relative_to(repo.path)) for path in repo.path.rglob("*") if "__pycache__" not in str(path))
    result, _ = items(
        repo, "--trainer-command=A_VARIABLE=1 trainpkg-cli launch", "--trainer-stages=load", "-p", "no:cacheprovider"
    )
    assert result.ret == 0
    import os

    assert "A_VARIABLE" not in os.environ
    after = sorted(
        str(path.relative_to(repo.path))
        for path in Path(repo.path).rglob("*")
        if "__pycache__" not in str(path) and path.name != "report.json"
    )
    assert after == before


@pytest.mark.slow
def test_the_distributed_items_run_the_commands_script_in_several_processes(repo: pytest.Pytester) -> None:
    command = "torchrun --nproc_per_node 2 -m trainpkg.train --lr 1e-3"
    result = repo.runpytest(
        f"--trainer-command={command}",
        "--trainer-devices=cpu",
        "--trainer-processes=2",
        "--trainer-stages=distributed",
        "--trainer-report=report.json",
    )
    report = json.loads((repo.path / "report.json").read_text())
    distributed = next(item for item in report["items"] if item["stage"] == "distributed")
    assert distributed["outcome"] == "passed", result.stdout.str()
    assert "engine: 2 processes under torch.distributed.run, DDP on gloo, 3 steps" in distributed["notes"]
    result.stdout.fnmatch_lines(
        [
            "launcher: torchrun asks for 2 processes (--nproc_per_node 2); the items run in one, and the distributed "
            "items train it in 2"
        ]
    )

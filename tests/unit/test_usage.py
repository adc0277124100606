"""A newcomer's slips (`usage`): a training script given as a test file, a misspelt option, a -k that deselects every
pipeline item; each answered with the command that does what was meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_trainer import usage

FLAGS = ["--trainer-module", "--trainer-stages", "--trainer-devices", "--trainer-sample"]


@pytest.mark.parametrize(
    ("source", "script"),
    [
        ("trainer = Trainer(model=model, args=args)\ntrainer.train()\n", True),
        ("trainer = SFTTrainer(model, train_dataset=data)\nif __name__ == '__main__':\n    trainer.train()\n", True),
        ("trainer = Trainer(model=model)\n\ndef test_forward():\n    trainer.train()\n", False),
        ("class TestPipeline:\n    def check(self):\n        Trainer(model).train()\n", False),
        ("model.train()\n", False),  # no Trainer built
        ("from transformers import Trainer\n", False),
    ],
    ids=["script", "guarded-sft", "test-function", "test-class", "no-trainer", "import-only"],
)
def test_a_training_script_is_told_from_a_test_module(tmp_path: Path, source: str, script: bool) -> None:
    path = tmp_path / "train.py"
    path.write_text(source)
    assert usage.training_script(path) is script


def test_a_script_given_as_a_test_file_gets_the_command_that_tests_it() -> None:
    assert usage.script_given("src/train.py") == (
        "src/train.py is a training script, not a test file: pytest would import it and run its training. To test its "
        "pipeline: pytest --trainer-module=src/train.py"
    )


def test_a_misspelt_option_gets_the_nearest_one() -> None:
    assert usage.misspelt(["-q", "--trainer-modul=train.py"], FLAGS) == (
        "--trainer-modul is no option of pytest-trainer; did you mean --trainer-module? --trainer-module=train.py"
    )
    assert usage.misspelt(["--trainer-stage", "forward"], FLAGS) == (
        "--trainer-stage is no option of pytest-trainer; did you mean --trainer-stages? --trainer-stages"
    )
    assert usage.misspelt(["--trainer-xyz=1"], FLAGS).startswith(  # type: ignore[union-attr]
        "--trainer-xyz is no option of pytest-trainer; its options are --trainer-module, --trainer-stages, "
    )
    assert usage.misspelt(["--trainer_devices=cpu"], FLAGS) == (
        "--trainer_devices is no option of pytest-trainer; did you mean --trainer-devices? --trainer-devices=cpu"
    )
    assert usage.misspelt(["--trainer-module=train.py", "-k", "forward", "--tb=short"], FLAGS) is None


def test_a_keyword_that_deselects_every_item_gets_the_stage_it_meant() -> None:
    names = ["load[cpu]", "forward[cpu]", "backward[cpu]"]
    stages = ["load", "forward", "backward"]
    assert usage.deselected("fowrard and not cuda", names, stages) == (
        "pytest-trainer: -k 'fowrard and not cuda' deselected every pipeline item: they are named by stage and "
        "device, load[cpu], forward[cpu], backward[cpu]; did you mean -k 'forward and not cuda'?"
    )
    assert usage.deselected("gpu", names, stages).endswith("load[cpu], forward[cpu], backward[cpu]")

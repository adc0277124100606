"""Every old spelling of the renames table (`pytest_trainer.renames`) explained from the error Python raises for it.

Pinned: a keyword a class no longer takes raises `TypeError: X.__init__() got an unexpected keyword argument 'old'`,
and an import of a name a module dropped `ImportError: cannot import name 'old' from 'module'`; for each row of each
table, `explanations.script_rows` turns that message into the change (the class that no longer takes it, the release,
the new spelling) and a fix that names the new spelling, from the table the row is in (DPOConfig and GRPOConfig each
tell their own `max_prompt_length`); a keyword no table holds keeps its own message. That the
installed libraries do reject each old spelling, and that scripts passing one fail `load` with these words, is in
tests/e2e/test_renames.py.
"""

from __future__ import annotations

import pytest

from pytest_trainer import renames
from pytest_trainer.explanations import script_rows
from pytest_trainer.explanations.registry import Explained


def unexpected(where: str, old: str) -> TypeError:
    return TypeError(f"{where}.__init__() got an unexpected keyword argument '{old}'")


def explained(error: BaseException) -> Explained:
    found = script_rows.explain(error)
    assert isinstance(found, Explained), f"no row explains {error}"
    return found


def fix_names_the_new_spelling(change: renames.Change, fix: str) -> bool:
    """The fix writes the new spelling (a renamed keyword), or says what to do instead (a removed one)."""
    return (change.new.split(",")[0].split()[0] in fix) if change.renamed else (change.new in fix)


@pytest.mark.parametrize("change", renames.ARGUMENTS.values(), ids=lambda change: change.old)
@pytest.mark.parametrize("where", ["TrainingArguments", "Seq2SeqTrainingArguments", "SFTConfig"])
def test_a_training_argument_renamed_names_the_release_and_the_new_spelling(where: str, change: renames.Change) -> None:
    found = explained(unexpected(where, change.old))
    assert found.cause.startswith(change.told(where))
    assert "the script was written for an older release" in found.cause
    assert found.fix == change.fix(f"{where}(...)")
    assert fix_names_the_new_spelling(change, found.fix)


@pytest.mark.parametrize(
    ("config", "change"),
    [(config, change) for config, table in renames.CONFIG_FIELDS.items() for change in table.values()],
    ids=lambda value: value if isinstance(value, str) else value.old,
)
def test_a_trl_config_field_renamed_is_told_from_its_own_config_s_table(config: str, change: renames.Change) -> None:
    found = explained(unexpected(config, change.old))
    assert found.cause.startswith(change.told(config))
    assert fix_names_the_new_spelling(change, found.fix)


@pytest.mark.parametrize(
    ("trainer", "change"),
    [
        (trainer, change)
        for key, table in renames.TRAINER_ARGUMENTS.items()
        for trainer in (["Trainer", "SFTTrainer", "DPOTrainer"] if key == "*" else [key])
        for change in table.values()
    ],
    ids=lambda value: value if isinstance(value, str) else value.old,
)
def test_a_trainer_argument_renamed_names_the_new_one(trainer: str, change: renames.Change) -> None:
    found = explained(unexpected(trainer, change.old))
    assert found.cause.startswith(change.told(trainer))
    assert found.fix == change.fix(f"{trainer}(...)")


@pytest.mark.parametrize(
    ("trainer", "config", "setting"),
    [(trainer, config, setting) for trainer, (config, moved) in renames.MOVED_TO_CONFIG.items() for setting in moved],
)
def test_a_trainer_setting_moved_into_its_config_names_the_config(trainer: str, config: str, setting: str) -> None:
    found = explained(unexpected(trainer, setting))
    assert found.cause.startswith(f"{trainer} takes no {setting!r} since TRL 0.13: the trainer's settings moved into")
    assert found.fix == f"set it in the config: args = {config}(..., {setting}=...), and pass {trainer}(..., args=args)"


@pytest.mark.parametrize("change", renames.LOADING.values(), ids=lambda change: change.old)
@pytest.mark.parametrize("model", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_a_loading_keyword_passed_on_to_the_model_names_from_pretrained(model: str, change: renames.Change) -> None:
    found = explained(unexpected(model, change.old))
    assert found.cause.startswith(f"from_pretrained passed {change.old!r} on to {model}, which does not take it: ")
    assert change.told("from_pretrained") in found.cause
    assert found.fix == change.fix("from_pretrained(...)")


@pytest.mark.parametrize("change", renames.IMPORTS.values(), ids=lambda change: change.old)
def test_an_import_a_library_dropped_names_what_to_use_instead(change: renames.Change) -> None:
    module = "trl" if change.release.startswith("TRL") else "transformers"
    found = explained(ImportError(f"cannot import name '{change.old}' from '{module}'"))
    assert found.cause.startswith(f"{module} has no {change.old!r} since {change.release} (this machine has {module}")
    assert change.new in found.fix


@pytest.mark.parametrize(
    "error",
    [
        unexpected("TrainingArguments", "learning_rte"),  # a typo: no rename
        unexpected("SFTTrainer", "learning_rate"),  # a setting the trainer never took, and no config holds
        unexpected("LlamaForCausalLM", "evaluation_strategy"),  # an argument of the arguments, not of loading
        ImportError("cannot import name 'Trainer' from 'trl'"),  # a name the table does not hold
        ValueError("TrainingArguments.__init__() got an unexpected keyword argument 'no_cuda'"),  # not a TypeError
    ],
    ids=str,
)
def test_an_error_no_row_of_the_table_holds_keeps_its_own_message(error: BaseException) -> None:
    assert script_rows.explain(error) is None

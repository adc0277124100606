"""What transformers 5 and TRL 1.x renamed or removed, explained where a script still passes the old spelling.

The table (pytest_trainer/renames.py) is held against the installed libraries: each old spelling fails on the release
installed here where the table says it does, and each new spelling exists. Each family of the explanation table then
has a script that fails at `load` with the change, the release and the new spelling.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
import transformers
from packaging.version import Version
from pipeline_runs import failures, write
from task_scripts import LM

from pytest_trainer import renames

TRANSFORMERS_5 = Version(transformers.__version__).major >= 5
needs_5 = pytest.mark.skipif(not TRANSFORMERS_5, reason="transformers 4.x still takes it")


def fails_here(change: renames.Change) -> bool:
    """Whether the installed libraries reject the old spelling, by the release the table names."""
    return TRANSFORMERS_5 or not change.release.startswith("transformers 5")


def fields(cls: type) -> set[str]:
    return {field.name for field in dataclasses.fields(cls)}


@pytest.mark.parametrize("change", renames.ARGUMENTS.values(), ids=lambda change: change.old)
def test_training_arguments_fields_of_the_table_are_gone_and_their_new_spelling_is_there(
    change: renames.Change,
) -> None:
    if not fails_here(change):
        pytest.skip(f"{change.release} removed it: {transformers.__version__} takes it")
    assert change.old not in fields(transformers.TrainingArguments)
    if change.renamed:
        assert change.new.split("=")[0].split(",")[0].split()[0] in fields(transformers.TrainingArguments)


@pytest.mark.parametrize(
    ("config", "change"),
    [(config, change) for config, table in renames.CONFIG_FIELDS.items() for change in table.values()],
    ids=lambda value: value if isinstance(value, str) else value.old,
)
def test_trl_config_fields_of_the_table_are_gone(config: str, change: renames.Change) -> None:
    cls = getattr(importlib.import_module("trl"), config)
    assert change.old not in fields(cls)
    spelling = change.new.split("=")[0].split(",")[0].split()[0]
    if change.renamed and spelling.isidentifier():
        assert spelling in fields(cls), spelling


@pytest.mark.parametrize(
    ("trainer", "config", "setting"),
    [
        (trainer, config, setting)
        for trainer, (config, settings) in renames.MOVED_TO_CONFIG.items()
        for setting in settings
    ],
)
def test_trl_trainer_settings_of_the_table_moved_out_of_the_trainer(trainer: str, config: str, setting: str) -> None:
    trl = importlib.import_module("trl")
    assert setting not in inspect.signature(getattr(trl, trainer).__init__).parameters


@pytest.mark.parametrize("change", renames.IMPORTS.values(), ids=lambda change: change.old)
def test_imports_of_the_table_fail(change: renames.Change) -> None:
    if not fails_here(change):
        pytest.skip(f"{change.release} removed it: {transformers.__version__} has it")
    module = "trl" if change.release.startswith("TRL") else "transformers"
    with pytest.raises(ImportError):
        exec(f"from {module} import {change.old}", {})  # the import statement a script writes


SCRIPT = """
    import tiny
    from transformers import Trainer, TrainingArguments

    tok = tiny.tokenizer()
    data = tiny.tokenized(tiny.text_dataset(), tok)
    args = TrainingArguments(output_dir="out", report_to="none"{arguments})
    trainer = Trainer(model=tiny.classifier(), args=args, train_dataset=data, {trainer})
    trainer.train()
"""

SFT = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    data = Dataset.from_dict({{"text": tiny.sentences(16)}})
    args = SFTConfig(output_dir="out", use_cpu=True, bf16=False, report_to=[]{arguments})
    trainer = SFTTrainer(model=lm.model(), args=args, train_dataset=data, {trainer})
    trainer.train()
"""

LOADED = """
    import lm
    from transformers import AutoModelForCausalLM

    lm.model().save_pretrained("base")
    model = AutoModelForCausalLM.from_pretrained("base", {keyword})
"""

GRPO_WITH_TRAINING_ARGUMENTS = """
    import lm
    import tiny
    from datasets import Dataset
    from transformers import TrainingArguments
    from trl import GRPOTrainer

    data = Dataset.from_dict({"prompt": tiny.sentences(16)})
    args = TrainingArguments(output_dir="out", use_cpu=True, per_device_train_batch_size=8, report_to=[])
    trainer = GRPOTrainer(model=lm.model(), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=data, processing_class=lm.tokenizer())
"""

#: One script per family of the explanation table, each failing on every release supported here; the first line of
#: the load failure; the fix.
FAMILIES = {
    "evaluation_strategy.py": (
        SCRIPT.format(arguments=', evaluation_strategy="epoch"', trainer="processing_class=tok"),
        "TrainingArguments takes no 'evaluation_strategy' since transformers 4.46: it was renamed eval_strategy; "
        "this machine has transformers *, and the script was written for an older release",
        "in TrainingArguments(...), write eval_strategy=... where the script writes evaluation_strategy=...",
    ),
    "max_seq_length.py": (
        SFT.format(arguments=", max_seq_length=32", trainer="processing_class=lm.tokenizer()"),
        "SFTConfig takes no 'max_seq_length' since TRL 0.20: it was renamed max_length; this machine has trl *",
        "in SFTConfig(...), write max_length=... where the script writes max_seq_length=...",
    ),
    "sft_tokenizer.py": (
        SFT.format(arguments="", trainer="tokenizer=lm.tokenizer()"),
        "SFTTrainer takes no 'tokenizer' since transformers 5.0 (TRL's trainers: TRL 0.16): it was renamed "
        "processing_class*",
        "in SFTTrainer(...), write processing_class=... where the script writes tokenizer=...",
    ),
    "dataset_text_field.py": (
        SFT.format(arguments="", trainer='processing_class=lm.tokenizer(), dataset_text_field="text"'),
        "SFTTrainer takes no 'dataset_text_field' since TRL 0.13: the trainer's settings moved into its SFTConfig*",
        "set it in the config: args = SFTConfig(..., dataset_text_field=...), and pass SFTTrainer(..., args=args)",
    ),
    "completion_collator.py": (
        "from trl import DataCollatorForCompletionOnlyLM\n",
        "trl has no 'DataCollatorForCompletionOnlyLM' since TRL 0.20 (this machine has trl *)",
        "SFTTrainer trains on the completion only by itself: split each text at its response template into 'prompt' "
        "and 'completion' columns (SFTConfig(completion_only_loss=True), the default), or train on 'messages' with "
        "SFTConfig(assistant_only_loss=True)",
    ),
    "grpo_training_arguments.py": (
        GRPO_WITH_TRAINING_ARGUMENTS,
        "GRPOTrainer was given a TrainingArguments, which has no '*': each TRL trainer reads its own config's "
        "settings, and GRPOTrainer takes a GRPOConfig",
        "args = GRPOConfig(output_dir=..., ...) with the same settings (it is a TrainingArguments too), and pass "
        "GRPOTrainer(..., args=args)",
    ),
}

#: The same families where only transformers 5 raises.
FAMILIES_5 = {
    "no_cuda.py": (
        SCRIPT.format(arguments=", no_cuda=True", trainer="processing_class=tok"),
        "TrainingArguments takes no 'no_cuda' since transformers 5.0: it was renamed use_cpu*",
        "in TrainingArguments(...), write use_cpu=... where the script writes no_cuda=...",
    ),
    "warmup_ratio.py": (
        SCRIPT.format(arguments=", warmup_ratio=0.1", trainer="processing_class=tok"),
        "TrainingArguments takes no 'warmup_ratio' since transformers 5: it was renamed warmup_steps, which takes "
        "the same ratio (a value below 1 is a share of the steps)*",
        "in TrainingArguments(...), write warmup_steps=... where the script writes warmup_ratio=...",
    ),
    "trainer_tokenizer.py": (
        SCRIPT.format(arguments="", trainer="tokenizer=tok"),
        "Trainer takes no 'tokenizer' since transformers 5.0*: it was renamed processing_class*",
        "in Trainer(...), write processing_class=... where the script writes tokenizer=...",
    ),
    "load_in_4bit.py": (
        LOADED.format(keyword="load_in_4bit=True"),
        "from_pretrained passed 'load_in_4bit' on to LlamaForCausalLM, which does not take it: from_pretrained takes "
        "no 'load_in_4bit' since transformers 5.0: it was renamed quantization_config=BitsAndBytesConfig("
        "load_in_4bit=True)*",
        "in from_pretrained(...), write quantization_config=BitsAndBytesConfig(load_in_4bit=True) where the script "
        "writes load_in_4bit=...",
    ),
}


def check_families(project: pytest.Pytester, scripts: dict[str, tuple[str, str, str]]) -> None:
    project.makepyfile(lm=LM)
    for name, (source, _, _) in scripts.items():
        write(project, name, source)
    result = project.runpytest(
        *(f"--trainer-module={name}" for name in scripts), "--trainer-devices=cpu", "--trainer-stages=dataset", "-v"
    )
    output = result.stdout.str()
    for name, (_, cause, fix) in scripts.items():
        assert failures(result, name) == ["load[cpu]"], (name, output[-6000:])
        result.stdout.fnmatch_lines([f"load[[]cpu[]] failed: {name}: {cause}", f"  fix: {fix}"])


def test_each_family_of_renames_is_explained(project: pytest.Pytester) -> None:
    check_families(project, FAMILIES)


@needs_5
def test_renames_of_transformers_5_are_explained(project: pytest.Pytester) -> None:
    check_families(project, FAMILIES_5)


def test_a_current_spelling_is_no_rename(project: pytest.Pytester) -> None:
    """The same scripts with today's spelling build their Trainer."""
    project.makepyfile(lm=LM)
    warmup = ", warmup_steps=0.1" if TRANSFORMERS_5 else ", warmup_ratio=0.1"  # 4.x: a ratio has its own name
    write(
        project,
        "current.py",
        SCRIPT.format(arguments=f', eval_strategy="no", use_cpu=True{warmup}', trainer="processing_class=tok"),
    )
    write(
        project,
        "sft.py",
        SFT.format(arguments=', max_length=32, dataset_text_field="text"', trainer="processing_class=lm.tokenizer()"),
    )
    result = project.runpytest(
        "--trainer-module=current.py",
        "--trainer-module=sft.py",
        "--trainer-devices=cpu",
        "--trainer-stages=dataset",
        "-v",
    )
    assert failures(result, "current.py") == failures(result, "sft.py") == [], result.stdout.str()[-4000:]

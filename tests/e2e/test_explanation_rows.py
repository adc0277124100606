"""The table of known errors (`pytest_trainer.explanations`), fed the real errors the real libraries raise.

Pinned: each SCRIPT row turns the error transformers, TRL or PEFT raises while a script builds its Trainer into a
cause that names the script's own settings and a fix that the library then accepts; an error no row knows keeps its
own message (None). The table as data (every row documented, its pattern matching the message it shows) is in
tests/unit/test_explanations.py.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import trl
from datasets import Dataset, IterableDataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorForLanguageModeling,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

from pytest_trainer.explanations import script_rows
from pytest_trainer.explanations.registry import Explained


def raised(build: Any) -> BaseException:
    """The error `build()` raises."""
    with pytest.raises(Exception) as error:
        build()
    return error.value


def explained(build: Any) -> Explained:
    found = script_rows.explain(raised(build))
    assert found is not None, "no row explains the error"
    return found


def suggested(name: str, fix: str) -> str:
    """The value a fix suggests for a setting: `name=value` in its text."""
    found = re.search(rf"\b{name}=('?)([\w.]+)\1", fix)
    assert found is not None, f"the fix suggests no {name}: {fix}"
    return found.group(2)


def llama() -> LlamaForCausalLM:
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=30,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=32,
        )
    )


def tokenizer(mask: bool = False) -> PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[MASK]": 2, "</s>": 3, "a": 4, "b": 5}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    special = {"pad_token": "[PAD]", "unk_token": "[UNK]", "eos_token": "</s>"}
    return PreTrainedTokenizerFast(tokenizer_object=core, **special, **({"mask_token": "[MASK]"} if mask else {}))


# ---- TrainingArguments ----------------------------------------------------------------------------------------


def test_best_model_with_other_save_and_eval_strategies_names_both_and_the_fix(tmp_path: Path) -> None:
    settings: dict[str, Any] = dict(
        output_dir=str(tmp_path), load_best_model_at_end=True, eval_strategy="steps", eval_steps=4, report_to="none"
    )
    found = explained(lambda: TrainingArguments(**settings, save_strategy="epoch"))
    assert "'steps'" in found.cause and "'epoch'" in found.cause
    assert "save_strategy" in found.fix
    TrainingArguments(**settings, save_strategy=suggested("save_strategy", found.fix), save_steps=4)  # accepted


def test_best_model_with_evaluation_by_epoch_and_saving_by_steps(tmp_path: Path) -> None:
    settings: dict[str, Any] = dict(
        output_dir=str(tmp_path), load_best_model_at_end=True, eval_strategy="epoch", report_to="none"
    )
    found = explained(lambda: TrainingArguments(**settings, save_strategy="steps"))
    assert "'epoch'" in found.cause and "'steps'" in found.cause
    TrainingArguments(**settings, save_strategy=suggested("save_strategy", found.fix))


def test_best_model_with_save_steps_not_a_multiple_of_eval_steps(tmp_path: Path) -> None:
    settings: dict[str, Any] = dict(
        output_dir=str(tmp_path),
        load_best_model_at_end=True,
        eval_strategy="steps",
        save_strategy="steps",
        report_to="none",
    )
    found = explained(lambda: TrainingArguments(**settings, eval_steps=3, save_steps=5))
    assert re.search(r"\b5\b", found.cause) and re.search(r"\b3\b", found.cause)
    save_steps = int(suggested("save_steps", found.fix))
    TrainingArguments(**settings, eval_steps=3, save_steps=save_steps)
    TrainingArguments(**settings, eval_steps=int(suggested("eval_steps", found.fix)), save_steps=5)


def test_error_no_row_knows_keeps_its_own_message(tmp_path: Path) -> None:
    error = raised(lambda: TrainingArguments(output_dir=str(tmp_path), lr_scheduler_type="no such schedule"))
    assert script_rows.explain(error) is None


def test_rows_that_read_any_message_explain_only_errors_of_their_library() -> None:
    assert script_rows.explain(KeyError("chosen")) is None  # raised by no TRL trainer
    assert script_rows.explain(ValueError("")) is None


# ---- Trainer, collators, PEFT, TRL ----------------------------------------------------------------------------


def test_stream_without_max_steps_is_explained_and_max_steps_fixes_it(tmp_path: Path) -> None:
    def rows() -> Any:
        yield {"input_ids": [1, 2, 3], "label": 0}

    stream = IterableDataset.from_generator(rows)
    model = BertForSequenceClassification(
        BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    )

    def build(**more: Any) -> Trainer:
        return Trainer(
            model=model,
            args=TrainingArguments(output_dir=str(tmp_path), report_to="none", **more),
            train_dataset=stream,
        )

    found = explained(build)
    assert "max_steps" in found.fix
    build(max_steps=1)


def test_a_tokenizer_without_a_chat_template_under_trl_is_explained(tmp_path: Path) -> None:
    tok = tokenizer()
    tok.chat_template = None
    data = Dataset.from_dict(
        {"messages": [[{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c"}]]}
    )
    args = trl.SFTConfig(output_dir=str(tmp_path), bf16=False, report_to=[])
    found = explained(lambda: trl.SFTTrainer(llama(), args=args, train_dataset=data, processing_class=tok))
    assert found.cause == (
        "SFTTrainer renders conversations with the tokenizer's chat template, and the tokenizer has none (a base "
        "model's tokenizer comes without one)"
    )
    assert "trl.clone_chat_template(model, tokenizer, <an instruct checkpoint>)" in found.fix


def test_padding_with_a_tokenizer_without_a_pad_token_names_its_special_tokens_and_one_to_pad_with() -> None:
    tok = tokenizer()
    tok.pad_token = None
    found = explained(lambda: tok(["a b", "a"], padding="max_length", max_length=4))
    assert found.cause == (
        "the script pads with a tokenizer that has no pad token (a causal LM's tokenizer comes without one); its "
        "special tokens are eos_token '</s>', unk_token '[UNK]'"
    )
    assert found.fix.startswith(
        "give it a pad token before the line above, one that is not its end of sequence: tokenizer.pad_token = '[UNK]'"
    )
    tok.pad_token = "[UNK]"
    tok(["a b", "a"], padding="max_length", max_length=4)


def test_audio_at_another_sampling_rate_names_both_rates_and_the_resampling() -> None:
    import numpy as np
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor()
    found = explained(lambda: extractor(np.zeros(8000), sampling_rate=8000))
    assert found.cause.startswith(
        "the audio is sampled at 8000 Hz, and the feature extractor reads audio sampled at 16000 Hz"
    )
    assert "cast_column('audio', datasets.Audio(sampling_rate=16000))" in found.fix
    extractor(np.zeros(16000), sampling_rate=16000)


@pytest.mark.parametrize("batched", [True, False], ids=["batch", "row"])
def test_a_column_the_dataset_does_not_have_names_its_columns_and_the_nearest(batched: bool) -> None:
    data = Dataset.from_dict({"sentence1": ["a b"], "label": [0]})
    found = explained(lambda: data.map(lambda rows: {"n": len(rows["sentence"])}, batched=batched))
    assert found.cause == "the dataset has no column 'sentence': its columns are 'sentence1', 'label'"
    assert found.fix == (
        "read one of its columns ('sentence1' is the nearest name) at the script's line above, or rename the column "
        "where the data is made: dataset = dataset.rename_column('sentence1', 'sentence')"
    )
    assert script_rows.explain(raised(lambda: {"a": 1}["sentence"])) is None  # a dict's KeyError, not a dataset's


def test_masked_lm_collator_without_a_mask_token_is_explained_and_mlm_false_fixes_it() -> None:
    found = explained(lambda: DataCollatorForLanguageModeling(tokenizer(mask=False)))
    assert "mask token" in found.cause
    assert "mlm=False" in found.fix
    DataCollatorForLanguageModeling(tokenizer(mask=False), mlm=False)


def test_lora_targets_missing_from_the_model_name_the_model_s_linear_modules() -> None:
    import peft

    model = llama()
    found = explained(lambda: peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["query", "value"])))
    listed = found.cause.split("its linear modules are ", 1)[1].split(", ")
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    assert {"q_proj", "v_proj"} <= set(listed) <= names
    assert "target_modules" in found.fix


def test_policy_given_as_its_own_reference_is_explained(tmp_path: Path) -> None:
    model = llama()
    pairs = Dataset.from_dict({"prompt": ["a"], "chosen": [" a"], "rejected": [" b"]})
    found = explained(
        lambda: trl.DPOTrainer(
            model=model,
            ref_model=model,
            args=trl.DPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False),
            train_dataset=pairs,
            processing_class=tokenizer(),
        )
    )
    assert "ref_model" in found.cause
    assert "copy.deepcopy(model)" in found.fix


def test_reference_model_from_a_config_built_policy_is_explained(tmp_path: Path) -> None:
    pairs = Dataset.from_dict({"prompt": ["a"], "chosen": [" a"], "rejected": [" b"]})
    found = explained(
        lambda: trl.DPOTrainer(
            model=llama(),
            args=trl.DPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False),
            train_dataset=pairs,
            processing_class=tokenizer(),
        )
    )
    assert "reference model" in found.cause
    assert "ref_model=" in found.fix


def test_trl_dataset_in_another_format_names_its_columns_and_the_trainer_s_format(tmp_path: Path) -> None:
    pairs = Dataset.from_dict({"question": ["a"], "good": [" a"], "bad": [" b"]})
    model = llama()
    found = explained(
        lambda: trl.DPOTrainer(
            model=model,
            ref_model=copy.deepcopy(model),
            train_dataset=pairs,
            processing_class=tokenizer(),
            args=trl.DPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False),
        )
    )
    assert all(column in found.cause for column in ("'question'", "'good'", "'bad'"))
    assert "DPOTrainer" in found.cause and "'chosen'" in found.cause


def grpo(tmp_path: Path, **settings: Any) -> trl.GRPOConfig:
    return trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, **settings)


def test_grpo_generations_that_do_not_divide_the_batch_name_both_numbers(tmp_path: Path) -> None:
    found = explained(lambda: grpo(tmp_path, per_device_train_batch_size=6, num_generations=8))
    assert "num_generations=8" in found.cause
    assert re.search(r"\b6 completions\b", found.cause)


def test_grpo_fix_batch_size_and_divisors_are_accepted(tmp_path: Path) -> None:
    found = explained(lambda: grpo(tmp_path, per_device_train_batch_size=6, num_generations=8))
    grpo(
        tmp_path,
        per_device_train_batch_size=int(suggested("per_device_train_batch_size", found.fix)),
        num_generations=8,
    )
    divisors = re.search(r"divisor of \d+ \(([\d, ]+)\)", found.fix)
    assert divisors is not None
    for generations in divisors.group(1).split(", "):
        grpo(tmp_path, per_device_train_batch_size=6, num_generations=int(generations))


def test_grpo_fix_generation_batch_size_is_accepted(tmp_path: Path) -> None:
    found = explained(lambda: grpo(tmp_path, per_device_train_batch_size=6, num_generations=8))
    grpo(
        tmp_path,
        per_device_train_batch_size=6,
        num_generations=8,
        generation_batch_size=int(suggested("generation_batch_size", found.fix)),
    )


# ---- TRL ----------------------------------------------------------------------------------------------------------


def test_an_assistant_only_loss_on_a_template_trl_cannot_mark_names_the_markers(tmp_path: Path) -> None:
    turn = "{{ m['role'] + ': ' }}"
    plain = "{% for m in messages %}" + turn + "{{ m['content'] + ' </s> ' }}{% endfor %}"
    marked = (
        "{% for m in messages %}" + turn + "{% if m['role'] == 'assistant' %}{% generation %}"
        "{{ m['content'] + ' </s> ' }}{% endgeneration %}{% else %}{{ m['content'] + ' </s> ' }}{% endif %}"
        "{% endfor %}"
    )
    rows = [[{"role": "user", "content": "a b"}, {"role": "assistant", "content": "b a"}]] * 4
    args = trl.SFTConfig(
        output_dir=str(tmp_path), assistant_only_loss=True, bf16=False, max_length=16, report_to="none"
    )
    tok = tokenizer()

    def build(template: str) -> Any:
        tok.chat_template = template
        return trl.SFTTrainer(
            llama(), args=args, train_dataset=Dataset.from_dict({"messages": rows}), processing_class=tok
        )

    found = explained(lambda: build(plain))
    assert found.cause.startswith("assistant_only_loss=True needs a chat template that marks the assistant's turns")
    assert "{% generation %}" in found.fix
    build(marked)  # the fix: the assistant's content wrapped in the marks, which TRL accepts

"""What a model is trained to do (`tasks.detect`) and how a trainer feeds it (`families.family_of`), on tiny real models.

Pinned: each kind of transformers model gets the Task the checks rely on (what a label is, the width of its head,
its token-sequence input, whether a choices axis sits in the batch, which keys run along the decoder); the class a
fix names rebuilds the model with another num_labels; a model of your own is unknown, with reasons; wrappers (PEFT,
torch.compile) keep the base model's task; each trainer class, and a user's subclass of it, gets its family, and only
preference trainers build their own batches.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
import trl
from transformers import (
    BartConfig,
    BartForSequenceClassification,
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    T5Config,
    T5ForConditionalGeneration,
    Trainer,
    ViTConfig,
    ViTForImageClassification,
    Wav2Vec2Config,
    Wav2Vec2ForSequenceClassification,
)

from pytest_trainer import diagnosis, families, model_facts, tasks
from pytest_trainer.tasks import Task


def bert(**overrides: Any) -> BertConfig:
    settings: dict[str, Any] = dict(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    return BertConfig(**{**settings, **overrides})


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


def gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(vocab_size=30, n_embd=16, n_layer=1, n_head=2, n_positions=32))


def t5() -> T5ForConditionalGeneration:
    return T5ForConditionalGeneration(T5Config(vocab_size=30, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2))


def vit(num_labels: int = 3) -> ViTForImageClassification:
    return ViTForImageClassification(
        ViTConfig(
            image_size=8,
            patch_size=4,
            num_channels=3,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            num_labels=num_labels,
        )
    )


def wav2vec2(num_labels: int = 3) -> Wav2Vec2ForSequenceClassification:
    return Wav2Vec2ForSequenceClassification(
        Wav2Vec2Config(
            vocab_size=30,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            conv_dim=(8, 8),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=4,
            num_conv_pos_embedding_groups=2,
            classifier_proj_size=8,
            num_labels=num_labels,
        )
    )


class OwnModel(torch.nn.Module):
    """A model of the user's own, not a transformers model."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"logits": self.layer(features)}


def rebuilt_with(task: Task, model: torch.nn.Module, num_labels: int, folder: Path) -> Any:
    """Follow a fix that names `task.auto_class`: load the saved model through it with another num_labels."""
    model.save_pretrained(folder)
    return getattr(transformers, task.auto_class).from_pretrained(
        folder, num_labels=num_labels, ignore_mismatched_sizes=True
    )


# ---- classification heads -------------------------------------------------------------------------------------


def test_text_classifier_has_class_labels_as_wide_as_its_head() -> None:
    task = tasks.detect(BertForSequenceClassification(bert(num_labels=3)))
    assert task.labels == tasks.CLASS
    assert task.classes == 3
    assert task.sequence == "input_ids"
    assert task.auto_class == "AutoModelForSequenceClassification"
    assert task.not_classes() is None
    assert task.no_sequence() is None


@pytest.mark.parametrize(
    "config", [bert(num_labels=1), bert(num_labels=3, problem_type="regression")], ids=["one-label", "problem-type"]
)
def test_regression_head_has_float_labels_and_no_classes(config: BertConfig) -> None:
    task = tasks.detect(BertForSequenceClassification(config))
    assert task.labels == tasks.FLOAT
    assert task.classes is None
    assert task.not_classes() is None  # a number per row is a value the property stages can vary


def test_multi_label_head_has_multi_hot_labels_and_no_single_label_width() -> None:
    task = tasks.detect(BertForSequenceClassification(bert(num_labels=4, problem_type="multi_label_classification")))
    assert task.labels == tasks.MULTI_HOT
    assert task.classes is None


def test_token_classifier_labels_each_token_and_pads_them_with_its_collator() -> None:
    task = tasks.detect(BertForTokenClassification(bert(num_labels=5)))
    assert task.labels == tasks.TOKEN_CLASS
    assert task.classes == 5
    assert task.auto_class == "AutoModelForTokenClassification"
    assert task.label_collator.startswith("DataCollatorForTokenClassification")
    assert task.along_sequence("labels")


def test_image_classifier_names_its_own_class_and_has_no_token_sequence() -> None:
    model = vit(num_labels=3)
    task = tasks.detect(model)
    assert task.labels == tasks.CLASS
    assert task.classes == 3
    assert task.auto_class == type(model).__name__
    assert task.sequence is None
    assert task.token_columns == ()
    assert task.no_sequence()
    assert task.conventional


@pytest.mark.parametrize(
    "build",
    [
        lambda: BertForSequenceClassification(bert(num_labels=3)),
        lambda: BertForTokenClassification(bert(num_labels=3)),
        lambda: vit(3),
    ],
    ids=["text", "token", "image"],
)
def test_class_a_fix_names_rebuilds_the_model_with_another_width(build: Any, tmp_path: Path) -> None:
    model = build()
    rebuilt = rebuilt_with(tasks.detect(model), model, 7, tmp_path)
    assert type(rebuilt) is type(model)
    assert rebuilt.config.num_labels == 7


def test_class_a_fix_names_rebuilds_an_audio_classifier(tmp_path: Path) -> None:
    model = wav2vec2(3)
    task = tasks.detect(model)
    assert task.labels == tasks.CLASS and task.classes == 3
    rebuilt = rebuilt_with(task, model, 7, tmp_path)
    assert type(rebuilt) is type(model)


def test_encoder_decoder_classifier_has_class_labels() -> None:
    model = BartForSequenceClassification(
        BartConfig(
            vocab_size=30,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_position_embeddings=32,
            num_labels=3,
        )
    )
    task = tasks.detect(model)
    assert task.labels == tasks.CLASS
    assert task.classes == 3


# ---- language models, seq2seq, choices, spans ----------------------------------------------------------------


@pytest.mark.parametrize("build", [llama, gpt2], ids=["llama", "gpt2"])
def test_causal_lm_labels_are_token_ids_the_model_shifts(build: Any) -> None:
    task = tasks.detect(build())
    assert task.labels == tasks.TOKEN_IDS
    assert task.shifts_labels
    assert task.sequence == "input_ids"
    assert task.classes is None
    assert task.not_classes()


def test_masked_lm_labels_are_token_ids_in_place() -> None:
    task = tasks.detect(BertForMaskedLM(bert()))
    assert task.labels == tasks.TOKEN_IDS
    assert not task.shifts_labels
    assert task.not_classes()


def test_seq2seq_labels_are_decoder_targets_that_do_not_run_along_the_encoder_tokens() -> None:
    task = tasks.detect(t5())
    assert task.labels == tasks.DECODER_TARGETS
    assert task.sequence == "input_ids"
    for key in ("labels", "decoder_input_ids", "decoder_attention_mask"):
        assert not task.along_sequence(key), key
    assert task.along_sequence("input_ids")
    assert task.along_sequence("attention_mask")
    assert task.not_classes()


def test_multiple_choice_has_a_choices_axis_and_choice_labels() -> None:
    task = tasks.detect(BertForMultipleChoice(bert()))
    assert task.labels == tasks.CHOICE
    assert task.nested
    assert task.not_classes() is None


def test_question_answering_labels_are_positions_the_forward_takes() -> None:
    model = BertForQuestionAnswering(bert())
    task = tasks.detect(model)
    assert task.labels == tasks.POSITIONS
    assert task.positions
    assert set(task.positions) <= model_facts.forward_parameters(model)
    assert task.not_classes()


# ---- models of your own and wrapped models --------------------------------------------------------------------


def test_model_of_your_own_is_unknown_with_reasons() -> None:
    task = tasks.detect(OwnModel())
    assert not task.conventional
    assert task.labels == tasks.UNKNOWN
    assert task.sequence is None
    assert "OwnModel" in task.name
    assert task.not_classes()
    assert task.no_sequence()
    assert task.no_sequence() != tasks.detect(vit()).no_sequence()  # says why for a model of your own


def test_peft_wrapped_model_has_its_base_model_s_task() -> None:
    import peft

    base = llama()
    expected = tasks.detect(base)
    wrapped = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert tasks.detect(wrapped) == expected


def test_peft_wrapped_classifier_keeps_its_head_width() -> None:
    import peft

    base = BertForSequenceClassification(bert(num_labels=4))
    wrapped = peft.get_peft_model(base, peft.LoraConfig(task_type="SEQ_CLS", r=2, target_modules=["query", "value"]))
    task = tasks.detect(wrapped)
    assert task.labels == tasks.CLASS
    assert task.classes == 4


def test_compiled_model_has_its_base_model_s_task() -> None:
    model = BertForTokenClassification(bert(num_labels=3))
    assert tasks.detect(torch.compile(model)) == tasks.detect(model)


# ---- trainer families -----------------------------------------------------------------------------------------


class MyDPOTrainer(trl.DPOTrainer):
    """A user's subclass of a preference trainer."""


class MyTrainer(Trainer):
    """A user's subclass of the plain Trainer."""


def bare(cls: type) -> Any:
    """A trainer object of `cls` without running its __init__ (families read only its class)."""
    return object.__new__(cls)


@pytest.mark.parametrize(
    ("cls", "family"),
    [
        (Trainer, families.Family),
        (MyTrainer, families.Family),
        (Seq2SeqTrainer, families.Seq2Seq),
        (trl.SFTTrainer, families.SFT),
        (trl.DPOTrainer, families.Preference),
        (trl.RewardTrainer, families.Preference),
        (MyDPOTrainer, families.Preference),
        (trl.GRPOTrainer, families.Online),
    ],
    ids=lambda value: value.__name__,
)
def test_family_of_a_trainer_is_read_from_its_class_hierarchy(cls: type, family: type) -> None:
    assert type(families.family_of(bare(cls))) is family


def test_preference_family_says_preference_pairs_over_the_trl_token_columns() -> None:
    task = families.family_of(bare(trl.DPOTrainer)).task(llama())
    assert task.labels == tasks.PREFERENCE
    assert "input_ids" in task.token_columns
    assert {"chosen_input_ids", "rejected_input_ids"} <= set(task.token_columns)
    assert task.not_classes()


def test_non_preference_families_take_the_model_s_own_task() -> None:
    model = llama()
    for cls in (Trainer, Seq2SeqTrainer, trl.SFTTrainer):
        assert families.family_of(bare(cls)).task(model) == tasks.detect(model), cls.__name__


def test_only_trainers_that_make_batches_of_their_own_say_they_build_them() -> None:
    assert families.Preference.builds_own_batches
    assert families.Online.builds_own_batches
    for family in (families.Family, families.Seq2Seq, families.SFT):
        assert family.builds_own_batches is None, family.__name__


def test_seq2seq_family_passes_the_generation_settings_only_with_predict_with_generate(tmp_path: Path) -> None:
    trainer = bare(Seq2SeqTrainer)
    trainer.args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        predict_with_generate=True,
        generation_max_length=7,
        generation_num_beams=2,
        report_to="none",
    )
    assert families.family_of(trainer).prediction_settings(trainer) == {"max_length": 7, "num_beams": 2}
    trainer.args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), generation_max_length=7, report_to="none")
    assert families.family_of(trainer).prediction_settings(trainer) == {}


def test_preference_family_reports_the_last_logged_log_probabilities() -> None:
    trainer = bare(trl.DPOTrainer)
    trainer._metrics = {
        "train": {"logps/chosen": [-3.0, -1.5], "logps/rejected": [-2.5], "rewards/margins": [0.25], "loss": [0.7]}
    }
    figures, notes = families.family_of(trainer).after_forward(trainer)
    assert figures == {"logps_chosen": -1.5, "logps_rejected": -2.5, "rewards_margins": 0.25}
    assert len(notes) == 1 and "-1.5" in notes[0] and "-2.5" in notes[0]


def test_preference_family_fails_a_batch_with_non_finite_log_probabilities() -> None:
    trainer = bare(trl.DPOTrainer)
    trainer._metrics = {"train": {"logps/chosen": [math.nan], "logps/rejected": [-2.0]}}
    with pytest.raises(diagnosis.PipelineFailure, match="non-finite"):
        families.family_of(trainer).after_forward(trainer)


def test_online_family_has_no_label_column_and_says_why() -> None:
    task = families.family_of(bare(trl.GRPOTrainer)).task(llama())
    assert task.labels == tasks.REWARD
    assert task.not_classes()
    assert "input_ids" in task.token_columns

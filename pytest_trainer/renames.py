"""The arguments and imports that transformers 5 and TRL 1.x renamed or removed, which older scripts still pass.

Each was read from the libraries' own deprecation messages, migration notes and code, and raised here by building the
object with the old spelling (transformers 5.24, TRL 1.16). A script that passes one fails while it builds its Trainer
with a bare `TypeError: X.__init__() got an unexpected keyword argument 'old'` or an ImportError:
`explanations.script_rows` turns it into the change, the release that made it and the new spelling.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True)
class Change:
    """One old spelling: what replaced it (a new name, or what to do instead) and the release that made it fail."""

    old: str
    #: The new spelling as the user writes it, or what to do where nothing replaces it.
    new: str
    #: The release from which the old spelling fails ("transformers 5.0", "TRL 0.20").
    release: str
    #: Whether a new name replaces it (else it is gone, and `new` says what to do instead).
    renamed: bool = True

    def told(self, where: str) -> str:
        """The change in the user's terms: "TrainingArguments takes no 'no_cuda' since transformers 5.0: ..."."""
        what = f"it was renamed {self.new}" if self.renamed else f"it was removed ({self.new})"
        return f"{where} takes no {self.old!r} since {self.release}: {what}"

    def fix(self, call: str) -> str:
        """What to write in `call` ("TrainingArguments(...)") instead of the old spelling."""
        if not self.renamed:
            return f"drop {self.old}= from {call}: {self.new}"
        spelling = self.new if "=" in self.new else f"{self.new.split(',')[0].split()[0]}=..."
        return f"in {call}, write {spelling} where the script writes {self.old}=..."


def _table(*changes: Change) -> dict[str, Change]:
    return {change.old: change for change in changes}


T5 = "transformers 5.0"

#: Fields of TrainingArguments, and so of every TRL config and Seq2SeqTrainingArguments.
ARGUMENTS = _table(
    Change("evaluation_strategy", "eval_strategy", "transformers 4.46"),
    Change("no_cuda", "use_cpu", T5),
    Change(
        "warmup_ratio",
        "warmup_steps, which takes the same ratio (a value below 1 is a share of the steps)",
        "transformers 5",
    ),
    Change("logging_dir", "set the TENSORBOARD_LOGGING_DIR environment variable instead", "transformers 5", False),
    Change(
        "overwrite_output_dir", "the Trainer never read it: drop it (resume_from_checkpoint resumes a run)", T5, False
    ),
    Change("push_to_hub_token", "hub_token", T5),
    Change("push_to_hub_model_id", "hub_model_id", T5),
    Change("push_to_hub_organization", "hub_model_id='organization/name'", T5),
    Change("per_gpu_train_batch_size", "per_device_train_batch_size", T5),
    Change("per_gpu_eval_batch_size", "per_device_eval_batch_size", T5),
    Change("fp16_backend", "mixed precision is torch's own: drop it and keep fp16=True or bf16=True", T5, False),
    Change(
        "half_precision_backend", "mixed precision is torch's own: drop it and keep fp16=True or bf16=True", T5, False
    ),
    Change("fp16_opt_level", "apex's opt levels are gone: drop it and keep fp16=True", T5, False),
    Change("use_mps_device", "Apple's MPS device is picked by itself: drop it", T5, False),
    Change("tpu_num_cores", "set the TPU_NUM_CORES environment variable instead", T5, False),
    Change("use_legacy_prediction_loop", "only the current evaluation loop is left: drop it", T5, False),
    Change("include_inputs_for_metrics", "include_for_metrics=['inputs']", T5),
    Change("include_tokens_per_second", "include_num_input_tokens_seen=True", T5),
    Change("jit_mode_eval", "drop it, or compile the model with torch_compile=True", T5, False),
    Change("fsdp_min_num_params", "fsdp_config={'min_num_params': ...}", T5),
    Change("fsdp_transformer_layer_cls_to_wrap", "fsdp_config={'transformer_layer_cls_to_wrap': [...]}", T5),
    Change("torchdynamo", "torch_compile_backend", T5),
    Change("adafactor", "optim='adafactor'", T5),
    Change("save_safetensors", "checkpoints are always safetensors: drop it", T5, False),
    Change("group_by_length", "train_sampling_strategy='group_by_length'", "transformers 5"),
)

#: Fields of one TRL config, by the config's class.
CONFIG_FIELDS = {
    "SFTConfig": _table(
        Change("max_seq_length", "max_length", "TRL 0.20"),
        Change("dataset_batch_size", "packing=True packs the rows itself: drop it", "TRL 0.18", False),
        Change("num_of_sequences", "packing=True packs the rows itself: drop it", "TRL 0.18", False),
        Change("chars_per_token", "packing=True packs the rows itself: drop it", "TRL 0.18", False),
        Change("use_liger", "use_liger_kernel", "TRL 0.18"),
    ),
    "DPOConfig": _table(
        Change(
            "max_prompt_length",
            "truncate or filter long prompts in the dataset; max_length caps the whole row",
            "TRL 0.29",
            False,
        ),
        Change("max_completion_length", "max_length", "TRL 0.29"),
        Change("max_target_length", "max_length", "TRL 0.29"),
        Change("rpo_alpha", "loss_type=['sigmoid', 'sft'] with loss_weights=[1.0, rpo_alpha]", "TRL 0.29"),
        Change("use_liger_loss", "use_liger_kernel", "TRL 0.28"),
    ),
    "GRPOConfig": _table(
        Change("max_prompt_length", "truncate or filter long prompts in the dataset", "TRL 0.28", False),
        Change("use_liger_loss", "use_liger_kernel", "TRL 0.28"),
        Change("wandb_log_unique_prompts", "log_unique_prompts", "TRL 0.27"),
        Change("vllm_guided_decoding_regex", "vllm_structured_outputs_regex", "TRL 0.28"),
    ),
    "RLOOConfig": _table(
        Change("rloo_k", "num_generations", "TRL 0.25"),
        Change("kl_coef", "beta", "TRL 0.25"),
        Change("cliprange", "epsilon", "TRL 0.25"),
    ),
}

#: Arguments a trainer no longer takes, by the trainer's class ("*": every trainer).
TRAINER_ARGUMENTS = {
    "*": _table(Change("tokenizer", "processing_class", "transformers 5.0 (TRL's trainers: TRL 0.16)")),
    "GRPOTrainer": _table(Change("reward_function", "reward_funcs", "every TRL release (the name was never this)")),
}

#: Settings a TRL trainer once took, that its config now holds: by the trainer's class, the config's class.
MOVED_TO_CONFIG = {
    "SFTTrainer": (
        "SFTConfig",
        (
            "max_seq_length",
            "dataset_text_field",
            "packing",
            "dataset_num_proc",
            "dataset_kwargs",
            "neftune_noise_alpha",
            "dataset_batch_size",
            "num_of_sequences",
            "chars_per_token",
            "infinite",
            "model_init_kwargs",
            "eval_packing",
        ),
    ),
    "DPOTrainer": (
        "DPOConfig",
        (
            "beta",
            "loss_type",
            "label_smoothing",
            "max_length",
            "max_prompt_length",
            "max_target_length",
            "truncation_mode",
            "generate_during_eval",
            "precompute_ref_log_probs",
            "model_init_kwargs",
            "ref_model_init_kwargs",
        ),
    ),
}

#: Keywords `from_pretrained` passes on to the model's constructor, which no longer takes them.
LOADING = _table(
    Change("load_in_4bit", "quantization_config=BitsAndBytesConfig(load_in_4bit=True)", T5),
    Change("load_in_8bit", "quantization_config=BitsAndBytesConfig(load_in_8bit=True)", T5),
    Change("use_auth_token", "token", T5),
    Change("resume_download", "downloads always resume: drop it", T5, False),
    Change("use_flash_attention_2", "attn_implementation='flash_attention_2'", "transformers 4.57"),
)

#: Names that can no longer be imported, with what to use instead.
IMPORTS = _table(
    Change(
        "DataCollatorForCompletionOnlyLM",
        "SFTTrainer trains on the completion only by itself: split each text "
        "at its response template into 'prompt' and 'completion' columns (SFTConfig(completion_only_loss=True), "
        "the default), or train on 'messages' with SFTConfig(assistant_only_loss=True)",
        "TRL 0.20",
        False,
    ),
    Change("PPOTrainer", "GRPOTrainer or RLOOTrainer, which need no value model", "TRL 0.29", False),
    Change("PPOConfig", "GRPOConfig or RLOOConfig", "TRL 0.29", False),
    Change(
        "AutoModelForCausalLMWithValueHead", "GRPOTrainer or RLOOTrainer, which need no value head", "TRL 0.29", False
    ),
    Change("ORPOTrainer", "from trl.experimental.orpo import ORPOTrainer", "TRL 0.29"),
    Change("ORPOConfig", "from trl.experimental.orpo import ORPOConfig", "TRL 0.29"),
    Change("CPOTrainer", "from trl.experimental.cpo import CPOTrainer", "TRL 0.29"),
    Change("CPOConfig", "from trl.experimental.cpo import CPOConfig", "TRL 0.29"),
    Change("OnlineDPOTrainer", "from trl.experimental.online_dpo import OnlineDPOTrainer", "TRL 0.29"),
    Change("GKDTrainer", "from trl.experimental.gkd import GKDTrainer", "TRL 0.29"),
    Change("setup_chat_format", "clone_chat_template", "TRL 0.26"),
    Change("AdamW", "torch.optim.AdamW", "transformers 4.50", False),
    Change("AutoModelWithLMHead", "AutoModelForCausalLM, AutoModelForMaskedLM or AutoModelForSeq2SeqLM", T5),
    Change("TextDataset", "a datasets.Dataset tokenized with dataset.map(tokenizer)", T5, False),
    Change("LineByLineTextDataset", "a datasets.Dataset tokenized with dataset.map(tokenizer)", T5, False),
    Change("EvaluationStrategy", "IntervalStrategy", T5),
)


def library_release(library: str) -> str:
    """The installed release of `library` ("transformers 5.24.0"), or its name alone where it cannot be read."""
    try:
        return f"{library} {metadata.version(library)}"
    except metadata.PackageNotFoundError:
        return library

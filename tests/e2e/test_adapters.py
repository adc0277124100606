"""PEFT (LoRA) and TRL fine-tuning bugs: each correct form passes, each broken form fails at its stage, named.

Every broken form below was first run as `python train.py` (no plugin) with peft 0.21, trl 1.16, transformers 5.23
and torch 2.13 on the CPU, to measure whether and how it harms training; the numbers are in each section's comment.
"""

from __future__ import annotations

import json

import peft  # noqa: F401
import pytest
import transformers
import trl  # noqa: F401
from peft import LoraConfig, get_peft_model  # noqa: F401
from pipeline_runs import failures, outcomes, run_script, write
from task_scripts import LM
from transformers import LlamaForCausalLM, ViTForImageClassification  # noqa: F401
from trl import DPOTrainer, SFTTrainer  # noqa: F401

# The libraries above are imported here, before pytester's in-process runs, for the reason conftest gives.

#: The stages up to the optimizer step: what a fine-tuning bug of this file must pass or fail within.
UP_TO_STEP = ("dataset", "collate", "forward", "backward", "step")
UP_TO_STEP_OPTION = "--trainer-stages=" + ",".join(UP_TO_STEP)


@pytest.fixture
def lm_project(project: pytest.Pytester) -> pytest.Pytester:
    project.makepyfile(lm=LM)
    return project


def passed_up_to_step(result: pytest.RunResult) -> None:
    assert failures(result) == [], result.stdout.str()[-6000:]
    assert outcomes(result) == {f"{stage}[cpu]": "PASSED" for stage in UP_TO_STEP}, result.stdout.str()[-6000:]


def only_failure(result: pytest.RunResult, stage: str) -> None:
    """`stage` FAILED and every other item of the run was blocked by it (or passed, before it)."""
    statuses = outcomes(result)
    assert failures(result) == [f"{stage}[cpu]"], result.stdout.str()[-6000:]
    if stage == "load":
        assert set(statuses.values()) == {"SKIPPED"}, statuses  # no Trainer: nothing to test
        return
    order = list(UP_TO_STEP)
    for item in order[: order.index(stage)]:
        assert statuses.get(f"{item}[cpu]") == "PASSED", statuses


#: transformers 4.x turns gradient checkpointing on without hooking the inputs, and defaults to use_reentrant=True.
TRANSFORMERS_4 = int(transformers.__version__.split(".")[0]) < 5

# ---------------------------------------------------------------------------------------------------------------
# The LoRA causal-LM script every section edits: the tiny Llama of lm.py, LoRA on q_proj and v_proj.

LORA_LM = """
    import lm
    import tiny
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = lm.tokenizer()
    texts = tiny.sentences(32, seed=7)
    {tokens}
    data = Dataset.from_dict({{"text": texts}}).map(lambda batch: tok(batch["text"]), batched=True,
                                                   remove_columns=["text"])
    model = lm.model()
    {resize}
    model = get_peft_model(model, LoraConfig(r=4, target_modules={targets}, task_type="CAUSAL_LM"{lora}))
    {after}
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3, report_to="none"{args})
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
"""


def lora_lm(
    tokens: str = "",
    resize: str = "",
    targets: str = '["q_proj", "v_proj"]',
    lora: str = "",
    after: str = "",
    args: str = "",
) -> str:
    return LORA_LM.format(tokens=tokens, resize=resize, targets=targets, lora=lora, after=after, args=args)


def test_lora_causal_lm_passes(lm_project: pytest.Pytester) -> None:
    # The reference: no false alarm on a plain LoRA pipeline (frozen base, frozen embedding, LoRA on q and v).
    write(lm_project, "train.py", lora_lm())
    result = run_script(lm_project, "--trainer-stages=dataset,collate,forward,backward,step,overfit,eval")
    assert failures(result) == [], result.stdout.str()[-6000:]
    assert set(outcomes(result).values()) == {"PASSED"}, outcomes(result)


# ---------------------------------------------------------------------------------------------------------------
# 1. Gradient checkpointing with frozen inputs.
#
# Measured (2 steps, lr 1e-2): the tiny Llama + LoRA with gradient_checkpointing=True and use_reentrant=True and no
# enable_input_require_grads() trains normally: lora_B moves by 0.015 (= the two Adam steps), grad_norm 0.063, 0.101.
# Trainer.train() calls model.activation_checkpointing_enable(), which in transformers 5.23 calls
# enable_input_require_grads() itself for every model whose main input is input_ids (and defaults use_reentrant to
# False when gradient_checkpointing_kwargs is unset). So with a text model the bug is no longer reachable: the plugin
# must not fail it. It is still reachable where the main input is not input_ids: a ViT (pixel_values) with LoRA on
# q_proj/v_proj and modules_to_save=["classifier"], use_reentrant=True: every lora_A/lora_B moves by exactly 0.0 while
# the logged grad_norm (1.84, 0.75, from the classifier) looks healthy. Without a trainable classifier, train() raises
# "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn". With
# enable_input_require_grads() or use_reentrant=False, lora_B moves by 0.015.

GC_REENTRANT = ', gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True}'
GC_NON_REENTRANT = ', gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}'


@pytest.mark.parametrize(
    ("after", "args"),
    [
        ("", GC_REENTRANT),
        ("model.enable_input_require_grads()", GC_REENTRANT),
        ("", GC_NON_REENTRANT),
        ("", ", gradient_checkpointing=True"),
    ],
    ids=["reentrant-text-model", "reentrant-with-input-grads", "non-reentrant", "default-kwargs"],
)
def test_lora_with_gradient_checkpointing_on_a_text_model_passes(
    lm_project: pytest.Pytester, after: str, args: str
) -> None:
    # transformers 5 hooks the input embedding itself for input_ids models, so all four train (measured above).
    # transformers 4.57 does not, and defaults to use_reentrant=True: there train() itself stops on the unhooked
    # forms with "element 0 of tensors does not require grad" (measured), which backward must name.
    write(lm_project, "train.py", lora_lm(after=after, args=args))
    result = run_script(lm_project, UP_TO_STEP_OPTION)
    if TRANSFORMERS_4 and not after and "False" not in args:
        only_failure(result, "backward")
        result.stdout.re_match_lines([r"backward\[cpu\] failed: .*under gradient checkpointing.*"])
    else:
        passed_up_to_step(result)


VIT_LORA = """
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification

    generator = torch.Generator().manual_seed(0)
    data = Dataset.from_dict({{"pixel_values": torch.randn(24, 3, 32, 32, generator=generator).tolist(),
                               "labels": [i % 3 for i in range(24)]}})
    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=32, num_labels=3)
    model = ViTForImageClassification(config)
    # transformers 5 names ViT's projections q_proj and v_proj, transformers 4 query and value.
    targets = ["q_proj", "v_proj"] if any(name.endswith("q_proj") for name, _ in model.named_modules()) \
        else ["query", "value"]
    model = get_peft_model(model, LoraConfig(r=4, target_modules=targets{saved}))
    {after}
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3, report_to="none",
                             gradient_checkpointing=True, gradient_checkpointing_kwargs={{"use_reentrant": {reentrant}}})
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
"""

SAVED_HEAD = ', modules_to_save=["classifier"]'


@pytest.mark.parametrize(
    ("after", "reentrant"),
    [
        ("model.enable_input_require_grads()", "True"),
        ("", "False"),
    ],
    ids=["enable-input-require-grads", "non-reentrant"],
)
def test_lora_vision_model_with_gradient_checkpointing_done_right_passes(
    project: pytest.Pytester, after: str, reentrant: str
) -> None:
    write(project, "train.py", VIT_LORA.format(saved=SAVED_HEAD, after=after, reentrant=reentrant))
    passed_up_to_step(run_script(project, UP_TO_STEP_OPTION))


@pytest.mark.parametrize("saved", [SAVED_HEAD, ""], ids=["head-trains", "only-lora"])
def test_lora_vision_model_with_reentrant_checkpointing_and_frozen_inputs_fails_backward(
    project: pytest.Pytester, saved: str
) -> None:
    # head-trains: the LoRA weights get no gradient while the classifier's does (grad_norm 1.84: the loss hides it);
    # only-lora: the loss has no grad_fn at all. Both are the checkpoint's frozen inputs, and must be named so.
    write(project, "train.py", VIT_LORA.format(saved=saved, after="", reentrant="True"))
    result = run_script(project, UP_TO_STEP_OPTION)
    only_failure(result, "backward")
    result.stdout.re_match_lines([r"backward\[cpu\] failed: .*trainable parameters get no gradient.*"])
    result.stdout.re_match_lines([r"(?i).*gradient checkpointing.*"])
    result.stdout.re_match_lines(
        [
            r".*fix: .*(enable_input_require_grads\(\).*use_reentrant.{0,4}False|"
            r"use_reentrant.{0,4}False.*enable_input_require_grads\(\)).*"
        ]
    )


# ---------------------------------------------------------------------------------------------------------------
# 2. Tokens added to the tokenizer while the embedding and lm_head stay frozen under LoRA.
#
# Measured (4 steps, lr 1e-2, "<tool>" and "</tool>" in every row): the new tokens' embedding rows and lm_head rows
# move by exactly 0.0, with add_tokens and with add_special_tokens alike; nothing warns, the loss falls as usual
# (3.271, 3.263, 3.249, 3.271). With LoraConfig(trainable_token_indices=...) the new embedding rows move by 0.024;
# with modules_to_save=["embed_tokens", "lm_head"] the embedding rows by 0.024 and the lm_head rows by 0.025.
# peft 0.21 accepts trainable_token_indices as a list (the input embedding) or as a dict per module
# ({"embed_tokens": ids, "lm_head": ids}).

ADD_TOKENS = (
    'added = tok.add_tokens(["<tool>", "</tool>"])\n    texts = [f"{text} <tool> red </tool>" for text in texts]'
)
ADD_SPECIAL = (
    'added = tok.add_special_tokens({"additional_special_tokens": ["<tool>", "</tool>"]})\n'
    '    texts = [f"{text} <tool> red </tool>" for text in texts]'
)
#: A pretrained checkpoint on this machine (the model of lm.py saved and loaded back), then its embedding resized.
RESIZE = (
    'model.save_pretrained("base")\n    model = type(model).from_pretrained("base")\n'
    '    model.resize_token_embeddings(len(tok))\n    new_ids = tok.convert_tokens_to_ids(["<tool>", "</tool>"])'
)


@pytest.mark.parametrize("tokens", [ADD_TOKENS, ADD_SPECIAL], ids=["add_tokens", "add_special_tokens"])
def test_added_tokens_with_a_frozen_embedding_fail_backward(lm_project: pytest.Pytester, tokens: str) -> None:
    write(lm_project, "train.py", lora_lm(tokens=tokens, resize=RESIZE))
    result = run_script(lm_project, UP_TO_STEP_OPTION)
    only_failure(result, "backward")
    result.stdout.re_match_lines([r"backward\[cpu\] failed: .*tokens added to the tokenizer.*"])
    assert "embedding rows cannot change" in result.stdout.str()
    result.stdout.re_match_lines(
        [r".*fix: .*(modules_to_save=\[.embed_tokens., .lm_head.\]|trainable_token_indices).*"]
    )


@pytest.mark.parametrize(
    "lora",
    [
        ", trainable_token_indices=new_ids",
        ', trainable_token_indices={"embed_tokens": new_ids, "lm_head": new_ids}',
        ', modules_to_save=["embed_tokens", "lm_head"]',
    ],
    ids=["trainable-token-indices", "trainable-token-indices-per-module", "modules-to-save"],
)
def test_added_tokens_made_trainable_pass(lm_project: pytest.Pytester, lora: str) -> None:
    write(lm_project, "train.py", lora_lm(tokens=ADD_TOKENS, resize=RESIZE, lora=lora))
    passed_up_to_step(run_script(lm_project, UP_TO_STEP_OPTION))


def test_added_tokens_with_full_fine_tuning_pass(lm_project: pytest.Pytester) -> None:
    # No LoRA: the whole embedding trains, the new rows with it. Not this bug.
    script = "\n".join(
        line for line in lora_lm(tokens=ADD_TOKENS, resize=RESIZE).splitlines() if "get_peft_model(model" not in line
    )
    write(lm_project, "train.py", script)
    passed_up_to_step(run_script(lm_project, UP_TO_STEP_OPTION))


# ---------------------------------------------------------------------------------------------------------------
# 3. LoRA target_modules copied from another architecture: GPT-2's c_attn on a Llama.
#
# Measured: get_peft_model raises peft.utils.error.NoMatchingPeftModuleError: "Target modules {'c_attn'} not found in
# the base model. Please check the target modules and try again." (it names what is missing, not what exists).

LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.mark.parametrize("targets", ['["c_attn"]', '["c_attn", "c_proj"]'], ids=["c_attn", "c_attn-c_proj"])
def test_lora_targets_of_another_architecture_fail_load(lm_project: pytest.Pytester, targets: str) -> None:
    write(lm_project, "train.py", lora_lm(targets=targets))
    result = run_script(lm_project, UP_TO_STEP_OPTION)
    only_failure(result, "load")
    output = result.stdout.str()
    result.stdout.re_match_lines([r"(?i)load\[cpu\] failed: .*LoRA.{0,2} target modules .*not found.*"])
    assert "c_attn" in output
    assert all(name in output for name in LLAMA_LINEARS), output[-4000:]
    assert "NoMatchingPeftModuleError" in output  # the library's own error stays below the diagnosis


def test_lora_all_linear_passes(lm_project: pytest.Pytester) -> None:
    write(lm_project, "train.py", lora_lm(targets='"all-linear"'))
    passed_up_to_step(run_script(lm_project, UP_TO_STEP_OPTION))


# ---------------------------------------------------------------------------------------------------------------
# 4. TRL datasets in the wrong format.
#
# Measured, both raised inside the trainer's __init__ while it prepares the dataset (a datasets.map):
#   DPOTrainer with "question", "answer_good", "answer_bad": KeyError: 'chosen' (trl/data_utils.py, extract_prompt)
#   SFTTrainer with only "sentence": KeyError: 'text' (trl/trainer/sft_trainer.py, tokenize_fn)

DPO = """
    import copy

    import lm
    import tiny
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    prompts = tiny.sentences(24, seed=3, shortest=2, longest=6)
    data = Dataset.from_dict({{"{prompt}": prompts,
                              "{chosen}": [" " + " ".join(p.split()[::-1]) for p in prompts],
                              "{rejected}": [" " + " ".join(sorted(p.split())) for p in prompts]}})
    model = lm.model()
    args = DPOConfig(output_dir="out", {precision}per_device_train_batch_size=4, max_length=32, report_to=[])
    trainer = DPOTrainer(model, ref_model=copy.deepcopy(model), args=args, train_dataset=data,
                         processing_class=lm.tokenizer())
    trainer.train()
"""

SFT = """
    import lm
    import tiny
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    texts = tiny.sentences(32, seed=4)
    data = Dataset.from_dict({columns})
    args = SFTConfig(output_dir="out", {precision}max_length=32, per_device_train_batch_size=4, report_to=[])
    trainer = SFTTrainer(lm.model(), args=args, train_dataset=data, processing_class=lm.tokenizer())
    trainer.train()
"""

NO_BF16 = "bf16=False, "
SFT_TEXT = '{"text": texts}'
SFT_PROMPT_COMPLETION = '{"prompt": [t.split()[0] for t in texts], "completion": [" " + t for t in texts]}'


def dpo(prompt: str = "prompt", chosen: str = "chosen", rejected: str = "rejected", precision: str = NO_BF16) -> str:
    return DPO.format(prompt=prompt, chosen=chosen, rejected=rejected, precision=precision)


def test_dpo_in_the_wrong_columns_fails_load(lm_project: pytest.Pytester) -> None:
    write(lm_project, "train.py", dpo("question", "answer_good", "answer_bad"))
    result = run_script(lm_project, UP_TO_STEP_OPTION)
    only_failure(result, "load")
    result.stdout.re_match_lines([r"load\[cpu\] failed.*"])
    output = result.stdout.str()
    # The columns found and the columns DPOTrainer expects, not only KeyError: 'chosen'.
    assert all(column in output for column in ("question", "answer_good", "answer_bad")), output[-4000:]
    result.stdout.re_match_lines([r".*prompt.*chosen.*rejected.*"])


def test_sft_without_a_known_format_fails_load(lm_project: pytest.Pytester) -> None:
    write(lm_project, "train.py", SFT.format(columns='{"sentence": texts}', precision=NO_BF16))
    result = run_script(lm_project, UP_TO_STEP_OPTION)
    only_failure(result, "load")
    output = result.stdout.str()
    assert "sentence" in output
    assert all(column in output for column in ("text", "messages", "prompt", "completion")), output[-4000:]


@pytest.mark.parametrize("columns", [SFT_TEXT, SFT_PROMPT_COMPLETION], ids=["text", "prompt-completion"])
def test_sft_in_a_known_format_passes(lm_project: pytest.Pytester, columns: str) -> None:
    write(lm_project, "train.py", SFT.format(columns=columns, precision=NO_BF16))
    passed_up_to_step(run_script(lm_project, UP_TO_STEP_OPTION))


# ---------------------------------------------------------------------------------------------------------------
# 5. A streaming dataset (datasets.IterableDataset) without max_steps.
#
# Measured: Trainer.__init__ raises (transformers/trainer.py, _validate_args) ValueError: "The train_dataset does not
# implement __len__, so the number of training steps cannot be inferred; max_steps has to be specified. The total
# number of steps must be known in advance to bound the training loop and to configure the learning rate
# scheduler." With max_steps=3 it trains 3 steps.

STREAMING = """
    import lm
    import tiny
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tok = lm.tokenizer()
    data = (Dataset.from_dict({{"text": tiny.sentences(32, seed=8)}})
            .map(lambda batch: tok(batch["text"]), batched=True, remove_columns=["text"])
            .to_iterable_dataset())
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3, report_to="none"{steps})
    trainer = Trainer(model=lm.model(), args=args, train_dataset=data, processing_class=tok,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.train()
"""


def test_streaming_dataset_without_max_steps_fails_naming_max_steps(lm_project: pytest.Pytester) -> None:
    write(lm_project, "train.py", STREAMING.format(steps=""))
    result = run_script(lm_project, UP_TO_STEP_OPTION)
    only_failure(result, "load")
    result.stdout.re_match_lines([r"load\[cpu\] failed.*"])
    result.stdout.re_match_lines([r".*fix: .*max_steps.*"])


def test_streaming_dataset_with_max_steps_passes(lm_project: pytest.Pytester) -> None:
    write(lm_project, "train.py", STREAMING.format(steps=", max_steps=20"))
    passed_up_to_step(run_script(lm_project, UP_TO_STEP_OPTION))


# ---------------------------------------------------------------------------------------------------------------
# 6. TRL recipes with their default bf16=True, on a machine without a GPU.
#
# Measured: SFTConfig(output_dir="out", ...) and DPOConfig(...) without bf16=False raise at construction
# (transformers/training_args.py, _validate_args, through trl's base_config __post_init__) ValueError: "Your setup
# doesn't support bf16/gpu. You need to assign use_cpu if you want to train the model on CPU." TRL 1.16's configs
# also default to activation_checkpointing=True (kwargs None, so use_reentrant=False).


@pytest.mark.parametrize("recipe", ["sft", "dpo"])
def test_trl_recipe_with_default_bf16_loads_on_cpu(lm_project: pytest.Pytester, recipe: str) -> None:
    script = SFT.format(columns=SFT_TEXT, precision="") if recipe == "sft" else dpo(precision="")
    write(lm_project, "train.py", script)
    result = run_script(lm_project, UP_TO_STEP_OPTION, "--trainer-report=report.json")
    passed_up_to_step(result)
    notes = [
        note for item in json.loads((lm_project.path / "report.json").read_text())["items"] for note in item["notes"]
    ]
    assert any("bf16" in note and "fp32" in note for note in notes), notes
    result.stdout.fnmatch_lines(
        ["precision: the script asks for bf16=True; this machine has no GPU, so the items run in fp32*"]
    )


# ---------------------------------------------------------------------------------------------------------------
# 7. A trainable parameter outside the loss's graph under PEFT: modules_to_save on a head the loss never uses.
#
# Measured with a model of one's own (an encoder under LoRA, a head, an auxiliary head the loss leaves out):
# one process trains without a word (grad_norm 0.26, 0.45, 0.63; the aux head's copy just never moves). Under DDP with
# find_unused_parameters=False (what ddp_find_unused_parameters=False gives) the second iteration raises
# RuntimeError: "Expected to have finished reduction in the prior iteration before starting a new one. This error
# indicates that your module has parameters that were not used in producing loss. ... Parameter indices which did not
# receive grad for rank 0: 4 5". peft matches modules_to_save by name suffix, so modules_to_save=["head"] wraps
# (and trains) "aux_head" too: the same failure from a list that does not name it.

TWO_HEADS = """
    import tiny
    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments


    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.EmbeddingBag(len(tiny.VOCAB), 16, mode="mean")
            self.encoder = torch.nn.Linear(16, 16)
            self.{head} = torch.nn.Linear(16, 3)
            self.aux_head = torch.nn.Linear(16, 1)

        def forward(self, tokens, labels=None):
            logits = self.{head}(torch.relu(self.encoder(self.embed(tokens))))
            loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
            return {{"loss": loss, "logits": logits}}


    tok = tiny.tokenizer()
    texts = tiny.sentences(48, seed=5, shortest=4, longest=4)
    data = Dataset.from_dict({{"tokens": tok(texts)["input_ids"], "labels": [len(t) % 3 for t in texts]}})
    model = get_peft_model(TwoHeads(), LoraConfig(r=4, target_modules=["encoder"], modules_to_save={saved}))
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3, report_to="none",
                             remove_unused_columns=False, ddp_find_unused_parameters=False)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
"""


@pytest.mark.parametrize(
    ("head", "saved"),
    [
        ("classifier", '["classifier", "aux_head"]'),
        ("head", '["head"]'),  # the suffix "head" matches aux_head too
    ],
    ids=["named", "suffix-match"],
)
def test_modules_to_save_outside_the_loss_fails_backward_naming_ddp(
    project: pytest.Pytester, head: str, saved: str
) -> None:
    write(project, "train.py", TWO_HEADS.format(head=head, saved=saved))
    result = run_script(project, UP_TO_STEP_OPTION)
    only_failure(result, "backward")
    result.stdout.re_match_lines([r"backward\[cpu\] failed: .*no gradient.*aux_head.*"])
    output = result.stdout.str()
    assert "ddp_find_unused_parameters" in output
    assert "Expected to have finished reduction" in output


def test_modules_to_save_inside_the_loss_passes(project: pytest.Pytester) -> None:
    write(project, "train.py", TWO_HEADS.format(head="classifier", saved='["classifier"]'))
    passed_up_to_step(run_script(project, UP_TO_STEP_OPTION))


def test_dpo_without_a_reference_model_explains_why_none_could_be_built(lm_project: pytest.Pytester) -> None:
    # A policy built from a config has no checkpoint: DPOTrainer cannot load a reference model from it.
    script = dpo("prompt", "chosen", "rejected")
    assert "ref_model=copy.deepcopy(model), " in script
    write(lm_project, "train.py", script.replace("ref_model=copy.deepcopy(model), ", ""))
    result = run_script(lm_project, UP_TO_STEP_OPTION)
    only_failure(result, "load")
    result.stdout.fnmatch_lines(
        [
            "load[[]cpu[]] failed: train.py: the trainer could not build its reference model: with no ref_model "
            "given, it loads one from the policy model's checkpoint (''), which a model built from a config does not have*",
            "*fix: pass ref_model=*or train with a peft_config*",
        ]
    )


def test_backward_names_what_trains_under_lora(lm_project: pytest.Pytester) -> None:
    write(
        lm_project,
        "train.py",
        lora_lm(
            tokens=ADD_TOKENS, resize=RESIZE, lora=', modules_to_save=["lm_head"], trainable_token_indices=new_ids'
        ),
    )
    result = run_script(lm_project, "--trainer-stages=backward", "--trainer-report=report.json")
    assert outcomes(result) == {"backward[cpu]": "PASSED"}
    notes = next(
        item["notes"]
        for item in json.loads((lm_project.path / "report.json").read_text())["items"]
        if item["stage"] == "backward"
    )
    assert (
        "trainable: LoRA adapters on q_proj, v_proj; modules_to_save lm_head; trainable token rows (1 tensors)" in notes
    ), notes


def test_an_added_pad_token_used_only_as_padding_needs_no_trainable_row(lm_project: pytest.Pytester) -> None:
    # "<pad>" is new and its row frozen under LoRA, but it only ever stands where attention_mask is 0.
    tokens = 'tok.add_special_tokens({"pad_token": "<pad>"})'
    write(lm_project, "train.py", lora_lm(tokens=tokens, resize="model.resize_token_embeddings(len(tok))"))
    passed_up_to_step(run_script(lm_project, UP_TO_STEP_OPTION))


def test_tokens_of_a_model_built_from_a_config_are_not_taken_for_added_ones(lm_project: pytest.Pytester) -> None:
    # Built from a config after the tokens were added: nothing tells them from the model's own; no false alarm.
    script = lora_lm(tokens=ADD_TOKENS).replace(
        "    model = lm.model()\n", "    model = lm.model(vocab_size=len(tok))\n"
    )
    assert "lm.model(vocab_size=len(tok))" in script
    write(lm_project, "train.py", script)
    passed_up_to_step(run_script(lm_project, UP_TO_STEP_OPTION))

"""Real checkpoints tested without their weights: the twin (`pytest_trainer.twin`).

The checkpoints are the public config and tokenizer files of Qwen2.5 7B Instruct and Llama 3.1 8B Instruct
(tests/fixtures/checkpoints), in the Hugging Face cache (resolved by hub id, offline) or in a folder, with no weight
file. The scripts are written as their users write them: QLoRA SFT with TRL and PEFT, a plain Trainer on chat data.
"""

from __future__ import annotations

import importlib
import json
import shutil

import peft  # noqa: F401
import pytest
import transformers  # noqa: F401
import trl  # noqa: F401
from checkpoints import FIXTURES, cache, folder
from pipeline_runs import failures, outcomes, write
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer  # noqa: F401

# The libraries above, and the trainers the scripts import, are imported here, before pytester's in-process runs, for
# the reason conftest gives.

QWEN = "Qwen--Qwen2.5-7B-Instruct"
LLAMA = "meta-llama--Llama-3.1-8B-Instruct"

QLORA_SFT = """
    import torch
    from datasets import Dataset
    from peft import LoraConfig, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    from trl import SFTConfig, SFTTrainer

    MODEL = "Qwen/Qwen2.5-7B-Instruct"
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(
        MODEL,
        quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True,
        ),
        device_map="auto",
        dtype=torch.bfloat16,
        attn_implementation="flash_attention_2",
    )
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    questions = ["what is the capital of france ?", "how are you today ?", "translate to french : good morning .",
                 "summarize the text below in a short sentence .", "what is the quick brown fox ?"]
    answers = ["paris is .", "i am fine , thank you .", "good morning .", "the fox jumps .", "a quick fox ."]
    rows = [[{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            for q, a in zip(questions * 8, answers * 8)]
    args = SFTConfig(output_dir="qlora", per_device_train_batch_size=4, gradient_accumulation_steps=4,
                     learning_rate=2e-4, gradient_checkpointing=True, max_length=512, report_to="none")
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"messages": rows}),
                         processing_class=tokenizer, peft_config=lora)
    trainer.train()
"""

#: Target modules of another architecture (Falcon's), absent from Qwen2's.
FOREIGN_TARGETS = (
    'target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]',
    'target_modules=["query_key_value", "dense"]',
)

#: A plain Trainer on chat rows rendered by the checkpoint's template, with transformers' language-model collator,
#: which sets the labels of every pad id to -100: with pad = eos, the end of each turn is never trained.
CHAT_LM = """
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer
    from transformers import TrainingArguments

    MODEL = "{model}"
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    tokenizer.pad_token = "<|finetune_right_pad_id|>"
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype="auto")
    turns = [("what is the capital of france ?", "paris is ."), ("how are you today ?", "i am fine , thank you ."),
             ("translate to french : good morning .", "good morning ."), ("what is the quick brown fox ?", "a fox .")]
    texts = [tokenizer.apply_chat_template([{{"role": "user", "content": q}}, {{"role": "assistant", "content": a}}],
                                           tokenize=False) for q, a in turns * 8]
    data = Dataset.from_dict({{"text": texts}}).map(
        lambda row: tokenizer(row["text"], add_special_tokens=False), remove_columns=["text"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to=[])
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.train()
"""
PAD_IS_EOS = ('tokenizer.pad_token = "<|finetune_right_pad_id|>"', "tokenizer.pad_token = tokenizer.eos_token")


@pytest.fixture
def hub(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A Hugging Face cache holding the checkpoints' config and tokenizer files only, read offline."""
    from huggingface_hub import constants

    home = pytester.path / "hf-home"
    for name in (QWEN, LLAMA):
        cache(home, name)
    # Read by huggingface_hub when it is imported, which this process did already: its constants follow.
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_module = importlib.import_module("transformers.utils.hub")  # transformers 4 keeps copies of its own
    for name, value in (("TRANSFORMERS_CACHE", str(home / "hub")), ("_is_offline_mode", True)):
        if hasattr(hub_module, name):
            monkeypatch.setattr(hub_module, name, value)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    report = pytester.path / "report.json"
    return pytester.runpytest(
        "--trainer-module=train.py", "--trainer-devices=cpu", "-v", f"--trainer-report={report}", *args
    )


def report(pytester: pytest.Pytester) -> list[dict]:
    return json.loads((pytester.path / "report.json").read_text())["items"]


def test_a_qlora_sft_of_a_7b_checkpoint_by_hub_id_passes_on_its_twin(hub: pytest.Pytester) -> None:
    write(hub, "train.py", QLORA_SFT)
    result = run(hub, "--trainer-gpu-memory=24")
    assert failures(result) == []
    ran = outcomes(result)
    for stage in ("dataset", "collate", "targets", "forward", "backward", "step", "overfit", "save", "memory"):
        assert ran[f"{stage}[cpu]"] == "PASSED", stage
    result.stdout.fnmatch_lines(
        [
            "model: a twin of Qwen/Qwen2.5-7B-Instruct (Qwen2ForCausalLM, 7.62B parameters, 28 layers x 3584) with "
            "2 layers x 64*A twin because its weights are not on this machine*",
            "not exercised: attn_implementation='flash_attention_2' needs a GPU and flash-attn*",
        ]
    )
    items = report(hub)
    assert all(any(note.startswith("model: a twin of Qwen") for note in item["notes"]) for item in items)
    memory = next(item for item in items if item["stage"] == "memory")
    assert any("Qwen/Qwen2.5-7B-Instruct's full size" in note for note in memory["notes"])
    # 4-bit weights of 7.6B parameters, the embeddings and head in fp32 (PEFT's k-bit preparation), LoRA's AdamW state
    assert 6 < memory["figures"]["train_step_gib"] < 12
    assert 0.1 < memory["figures"]["optimizer_state_gib"] < 0.4  # bf16 adapters (TRL, 4-bit) or fp32


def test_the_forecast_of_the_checkpoint_fails_a_gpu_too_small_for_it(hub: pytest.Pytester) -> None:
    write(hub, "train.py", QLORA_SFT)
    result = run(hub, "--trainer-stages=memory", "--trainer-gpu-memory=4")
    assert failures(result) == ["memory[cpu]"]
    result.stdout.fnmatch_lines(["*one training step needs about * GiB at Qwen/Qwen2.5-7B-Instruct's full size*"])


def test_what_needs_the_trained_weights_is_said_not_checked(hub: pytest.Pytester) -> None:
    write(hub, "train.py", QLORA_SFT.replace('report_to="none"', 'report_to="none", bf16=False, fp16=True'))
    result = run(hub, "--trainer-stages=precision")
    assert failures(result) == []
    result.stdout.fnmatch_lines(["not checked: whether the checkpoint's trained activations overflow fp16*"])


def test_lora_targets_absent_from_the_checkpoints_architecture_fail_load(hub: pytest.Pytester) -> None:
    write(hub, "train.py", QLORA_SFT.replace(*FOREIGN_TARGETS))
    result = run(hub)
    assert failures(result) == ["load[cpu]"]
    result.stdout.fnmatch_lines(["*LoRA's target modules were not found in the model*"])


def test_a_chat_lm_with_its_own_pad_token_passes_targets(hub: pytest.Pytester) -> None:
    write(hub, "train.py", CHAT_LM.format(model="meta-llama/Llama-3.1-8B-Instruct"))
    result = run(hub, "--trainer-stages=dataset,collate,targets")
    assert failures(result) == []
    assert outcomes(result)["targets[cpu]"] == "PASSED"


def test_pad_equal_to_eos_fails_targets_on_the_twin_as_on_a_small_model(hub: pytest.Pytester) -> None:
    write(hub, "train.py", CHAT_LM.format(model="meta-llama/Llama-3.1-8B-Instruct").replace(*PAD_IS_EOS))
    result = run(hub, "--trainer-stages=dataset,collate,targets")
    assert failures(result) == ["targets[cpu]"]
    result.stdout.fnmatch_lines(["*end-of-sequence*never learns to stop*"])


def test_a_checkpoint_folder_without_weights_gets_a_twin(pytester: pytest.Pytester) -> None:
    model = folder(pytester.path / "models", LLAMA)
    write(pytester, "train.py", CHAT_LM.format(model=model))
    result = run(pytester, "--trainer-stages=forward")
    assert failures(result) == []
    result.stdout.fnmatch_lines([f"model: a twin of {model} (LlamaForCausalLM, 8.03B parameters*"])


def test_real_asks_for_the_weights_and_says_they_are_missing(pytester: pytest.Pytester) -> None:
    model = folder(pytester.path / "models", LLAMA)
    write(pytester, "train.py", CHAT_LM.format(model=model))
    result = run(pytester, "--trainer-stages=forward", "--trainer-model=real")
    assert failures(result) == ["load[cpu]"]
    assert "model: a twin" not in result.stdout.str()


SMALL = """
    import tiny
    from pathlib import Path
    from datasets import Dataset
    from transformers import BertForSequenceClassification, Trainer, TrainingArguments

    saved = Path("small-bert")
    if not saved.exists():
        BertForSequenceClassification(tiny.config(num_labels=3)).save_pretrained(saved)
    tok = tiny.tokenizer()
    model = BertForSequenceClassification.from_pretrained(saved)
    data = tiny.tokenized(tiny.text_dataset(48, classes=3), tok)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to=[])
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
"""


def test_a_small_checkpoint_with_its_weights_is_the_real_one(project: pytest.Pytester) -> None:
    write(project, "train.py", SMALL)
    result = run(project, "--trainer-stages=forward")
    assert failures(result) == []
    assert "model: a twin" not in result.stdout.str()


def test_twin_asks_for_a_twin_of_any_checkpoint(project: pytest.Pytester) -> None:
    write(project, "train.py", SMALL)
    result = run(project, "--trainer-stages=forward", "--trainer-model=twin")
    assert failures(result) == []
    result.stdout.fnmatch_lines(["model: a twin of small-bert (BertForSequenceClassification*--trainer-model=twin*"])


FROM_CONFIG = """
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling
    from transformers import Trainer, TrainingArguments

    MODEL = "Qwen/Qwen2.5-7B-Instruct"
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(MODEL))  # pretraining from scratch
    data = Dataset.from_dict({"text": ["the quick brown fox jumps over the lazy dog ."] * 16}).map(
        lambda row: tokenizer(row["text"]), remove_columns=["text"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to=[])
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    trainer.train()
"""


def test_a_7b_model_built_from_its_config_is_a_twin_on_a_cpu(hub: pytest.Pytester) -> None:
    write(hub, "train.py", FROM_CONFIG)
    result = run(hub, "--trainer-stages=forward")
    assert failures(result) == []
    result.stdout.fnmatch_lines(["model: a twin of *7.62B parameters*and this machine has no GPU*"])


def test_the_model_option_takes_one_of_its_choices(pytester: pytest.Pytester) -> None:
    write(pytester, "train.py", "")
    result = pytester.runpytest("--trainer-module=train.py", "--trainer-model=tiny")
    result.stderr.fnmatch_lines(
        ["*--trainer-model on the command line: unknown 'tiny'; choose one of auto, twin, real*"]
    )


#: A model of the script's own whose layers need a width the twin does not give: the twin cannot be built.
OWN_ARCHITECTURE = """
    from pathlib import Path
    import torch
    from datasets import Dataset
    from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments


    class WideConfig(PretrainedConfig):
        model_type = "wide"

        def __init__(self, hidden_size=256, **kwargs):
            self.hidden_size = hidden_size
            super().__init__(**kwargs)


    class WideModel(PreTrainedModel):
        config_class = WideConfig

        def __init__(self, config):
            super().__init__(config)
            if config.hidden_size < 128:
                raise ValueError(f"hidden_size {config.hidden_size} is below the 128 the blocks need")
            self.layer = torch.nn.Linear(config.hidden_size, 2)
            self.post_init()

        def forward(self, x, labels=None):
            logits = self.layer(x)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


    Path("wide").mkdir(exist_ok=True)
    WideConfig().save_pretrained("wide")  # its config only, as a checkpoint whose weights are elsewhere
    model = WideModel.from_pretrained("wide")
    data = Dataset.from_dict({"x": [[0.0] * 256] * 8, "labels": [0, 1] * 4})
    trainer = Trainer(model=model, args=TrainingArguments(output_dir="out", report_to=[]), train_dataset=data)
    trainer.train()
"""


def test_a_twin_that_cannot_be_built_says_it_is_the_plugins_limit(pytester: pytest.Pytester) -> None:
    write(pytester, "train.py", OWN_ARCHITECTURE)
    result = run(pytester, "--trainer-stages=forward")
    assert failures(result) == ["load[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "*pytest-trainer could not build a twin of wide (WideModel)*ValueError: hidden_size 64 is below*",
            "*fix: this is a limit of the twin, not a fault of the script: run with --trainer-model=real*",
        ]
    )


def test_a_marker_asks_for_the_twin_of_its_script(project: pytest.Pytester) -> None:
    write(project, "train.py", SMALL)
    project.makepyfile(
        test_pipeline="""
        import pytest


        @pytest.mark.trainer_pipeline(module="train.py", stages=["forward"], devices=["cpu"], model="twin")
        def test_forward_on_the_twin(trainer_stage):
            trainer_stage.run()
            assert any(note.startswith("model: a twin of small-bert") for note in trainer_stage.pipeline.notes)
            assert trainer_stage.pipeline.model.config.num_hidden_layers == 1  # never more than the checkpoint's
        """
    )
    result = project.runpytest("test_pipeline.py", "-v")
    result.assert_outcomes(passed=1)


def test_a_marker_model_that_is_no_choice_fails_the_test(project: pytest.Pytester) -> None:
    write(project, "train.py", SMALL)
    project.makepyfile(
        test_pipeline="""
        import pytest


        @pytest.mark.trainer_pipeline(module="train.py", stages=["forward"], devices=["cpu"], model="small")
        def test_forward(trainer_stage):
            trainer_stage.run()
        """
    )
    result = project.runpytest("test_pipeline.py")
    result.stdout.fnmatch_lines(["*the trainer_pipeline marker's model='small' is none of auto, twin, real*"])


def test_a_7b_model_class_built_from_its_config_is_a_twin_on_a_cpu(hub: pytest.Pytester) -> None:
    write(
        hub,
        "train.py",
        FROM_CONFIG.replace(
            "model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(MODEL))",
            "from transformers import Qwen2ForCausalLM\n    model = Qwen2ForCausalLM(AutoConfig.from_pretrained(MODEL))",
        ),
    )
    result = run(hub, "--trainer-stages=forward,step")
    assert failures(result) == []
    result.stdout.fnmatch_lines(["model: a twin of Qwen/Qwen2.5-7B-Instruct (Qwen2ForCausalLM, 7.62B parameters*"])


def test_a_twin_built_from_a_config_is_said_once(hub: pytest.Pytester) -> None:
    write(hub, "train.py", FROM_CONFIG)
    result = run(hub, "--trainer-stages=forward", "--trainer-model=twin")
    assert failures(result) == []
    said = [line for line in result.outlines if line.startswith("model: a twin of")]
    assert len(said) == 1 and "7.62B parameters, 28 layers x 3584" in said[0], said


#: LoRA DPO of Llama 3.1 8B Instruct by hub id: the policy is the twin with an adapter, the reference the twin without.
LORA_DPO = """
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    MODEL = "meta-llama/Llama-3.1-8B-Instruct"
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    tokenizer.pad_token = "<|finetune_right_pad_id|>"
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype="auto")
    prompts = ["what is the capital of france ?", "how are you today ?", "translate to french : good morning ."]
    rows = {
        "prompt": [[{"role": "user", "content": p}] for p in prompts * 8],
        "chosen": [[{"role": "assistant", "content": "paris is ."}]] * 24,
        "rejected": [[{"role": "assistant", "content": "the lazy dog ."}]] * 24,
    }
    args = DPOConfig(output_dir="dpo", per_device_train_batch_size=4, learning_rate=5e-6, max_length=128,
                     report_to="none")
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_dict(rows), processing_class=tokenizer,
                         peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    trainer.train()
"""


def test_a_lora_dpo_of_an_8b_checkpoint_passes_on_its_twin(hub: pytest.Pytester) -> None:
    write(hub, "train.py", LORA_DPO)
    result = run(hub, "--trainer-stages=targets,forward,backward,step,overfit,save")
    assert failures(result) == []
    for stage in ("targets", "forward", "backward", "step", "overfit", "save"):
        assert outcomes(result)[f"{stage}[cpu]"] == "PASSED", stage
    overfit = next(item for item in report(hub) if item["stage"] == "overfit")  # learned at 10x the rate, said so
    assert any("a twin's random weights learn slowly at a fine-tuning rate" in note for note in overfit["notes"])
    result.stdout.fnmatch_lines(["model: a twin of meta-llama/Llama-3.1-8B-Instruct (LlamaForCausalLM, 8.03B*"])


#: GRPO of Qwen2.5 7B with a reward model given by hub id, which TRL loads itself as a sequence classifier.
GRPO_REWARD_MODEL = """
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    MODEL = "Qwen/Qwen2.5-7B-Instruct"
    prompts = ["what is the capital of france ?", "how are you today ?", "translate to french : good morning ."]
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts * 4]})
    args = GRPOConfig(output_dir="grpo", per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                      learning_rate=1e-6, report_to="none")
    trainer = GRPOTrainer(model=MODEL, reward_funcs=MODEL, args=args, train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(MODEL, padding_side="left"))
    trainer.train()
"""


def test_grpo_with_a_policy_and_a_reward_model_by_hub_id_runs_on_their_twins(hub: pytest.Pytester) -> None:
    write(hub, "train.py", GRPO_REWARD_MODEL)
    result = run(hub, "--trainer-stages=forward,backward,step")
    assert failures(result) == []
    for stage in ("forward", "backward", "step"):
        assert outcomes(result)[f"{stage}[cpu]"] == "PASSED", stage
    result.stdout.fnmatch_lines(
        [
            "model: a twin of Qwen/Qwen2.5-7B-Instruct (Qwen2ForCausalLM, 7.62B*",
            "model: a twin of Qwen/Qwen2.5-7B-Instruct (Qwen2ForSequenceClassification, 7.0?B*",
        ],
        consecutive=False,
    )


#: A full fine-tune of an encoder of BERT-large's sizes, from a folder holding its config and tokenizer only.
ENCODER = """
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

    tokenizer = AutoTokenizer.from_pretrained("tiny-tokenizer")
    model = AutoModelForSequenceClassification.from_pretrained("bert-large", num_labels=2)
    texts = ["the quick brown fox jumps", "what is the capital of france", "good morning", "how are you today"]
    data = Dataset.from_dict({"text": texts * 8, "label": [0, 1, 0, 1] * 8}).map(
        lambda row: tokenizer(row["text"], truncation=True), remove_columns=["text"])
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=2e-5, report_to=[])
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
"""


def test_a_full_fine_tune_of_a_large_encoder_passes_on_its_twin(project: pytest.Pytester) -> None:
    (project.path / "bert-large").mkdir()
    shutil.copy(FIXTURES / "google-bert--bert-large-uncased" / "config.json", project.path / "bert-large")
    project.makepyfile(make_tokenizer="import tiny\ntiny.tokenizer().save_pretrained('tiny-tokenizer')\n")
    project.runpython(project.path / "make_tokenizer.py")
    write(project, "train.py", ENCODER)
    result = run(project)
    assert failures(result) == []
    for stage in ("forward", "backward", "step", "overfit", "save", "labels"):
        assert outcomes(result)[f"{stage}[cpu]"] == "PASSED", stage
    result.stdout.fnmatch_lines(["model: a twin of bert-large (BertForSequenceClassification, 335M parameters*"])

"""QLoRA where the weights are at hand: bitsandbytes' 4-bit layers run on the CPU (0.46 and later), and the pipeline
passes as it trains when run directly. The checkpoint is a small Qwen2 saved with its weights, on the tokenizer and
chat template of Qwen2.5 (tests/fixtures/checkpoints)."""

from __future__ import annotations

from pathlib import Path

import bitsandbytes  # noqa: F401
import peft
import pytest
import torch
import transformers
import trl  # noqa: F401
from checkpoints import folder
from pipeline_runs import failures, outcomes, write
from trl import SFTConfig, SFTTrainer  # noqa: F401

from pytest_trainer import model_facts
from pytest_trainer.stages import padding

# The libraries above, and the trainers the scripts import, are imported here, before pytester's in-process runs, for
# the reason conftest gives.

QWEN = "Qwen--Qwen2.5-7B-Instruct"

QLORA_SFT = """
    import torch
    from datasets import Dataset
    from peft import LoraConfig, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    from trl import SFTConfig, SFTTrainer

    MODEL = "small-qwen"
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(
        MODEL,
        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                               bnb_4bit_compute_dtype=torch.bfloat16),
        dtype=torch.bfloat16,
    )
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    questions = ["what is the capital of france ?", "how are you today ?", "translate to french : good morning ."]
    answers = ["paris is .", "i am fine , thank you .", "good morning ."]
    rows = [[{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            for q, a in zip(questions * 8, answers * 8)]
    args = SFTConfig(output_dir="qlora", per_device_train_batch_size=4, learning_rate=2e-4, gradient_checkpointing=True,
                     max_length=128, report_to="none")
    lora = LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM", target_modules=["q_proj", "v_proj"])
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"messages": rows}),
                         processing_class=tokenizer, peft_config=lora)
    trainer.train()
"""

#: A trainer that saves its adapter with settings other than those it trains with.
SAVED_OTHERWISE = (
    "    trainer = SFTTrainer(",
    """    class Saving(SFTTrainer):
        def _save(self, output_dir=None, state_dict=None):
            self.model.peft_config["default"].lora_alpha = 64
            try:
                super()._save(output_dir, state_dict)
            finally:
                self.model.peft_config["default"].lora_alpha = 16


    trainer = Saving(""",
)


@pytest.fixture
def small_qwen(pytester: pytest.Pytester) -> pytest.Pytester:
    """A Qwen2 of two narrow layers saved with its weights (bf16), beside Qwen2.5's tokenizer and chat template."""
    files = folder(pytester.path / "files", QWEN)
    config = transformers.AutoConfig.from_pretrained(files)
    config.update(
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "layer_types": config.layer_types[:2] if getattr(config, "layer_types", None) else None,
        }
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    saved = pytester.path / "small-qwen"
    model.save_pretrained(saved)
    for file in Path(files).iterdir():
        if file.name != "config.json":
            (saved / file.name).write_bytes(file.read_bytes())
    return pytester


def test_a_qlora_sft_with_its_weights_passes_every_stage(small_qwen: pytest.Pytester) -> None:
    write(small_qwen, "train.py", QLORA_SFT)
    result = small_qwen.runpytest("--trainer-module=train.py", "--trainer-devices=cpu", "-v")
    assert failures(result) == []
    ran = outcomes(result)
    for stage in ("forward", "backward", "step", "overfit", "save", "padding", "lengths"):
        assert ran[f"{stage}[cpu]"] == "PASSED", stage
    assert "model: a twin" not in result.stdout.str()  # its weights are here, and it is small: the real model


def test_an_adapter_saved_with_other_settings_fails_save(small_qwen: pytest.Pytester) -> None:
    write(small_qwen, "train.py", QLORA_SFT.replace(*SAVED_OTHERWISE))
    result = small_qwen.runpytest("--trainer-module=train.py", "--trainer-devices=cpu", "-v", "--trainer-stages=save")
    assert failures(result) == ["save[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "*the adapter's settings saved in the checkpoint are not those it was trained with "
            "(lora_alpha 16 trained, 64 saved)*"
        ]
    )


def test_a_qlora_model_is_compared_at_the_precision_it_multiplies_in(small_qwen: pytest.Pytester) -> None:
    """k-bit preparation makes every floating weight float32, while the 4-bit layers multiply in bf16: outputs of two
    sequence lengths differ by bf16's rounding, which is no padding fault."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        small_qwen.path / "small-qwen",
        quantization_config=transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16),
        dtype=torch.bfloat16,
    )
    model = peft.prepare_model_for_kbit_training(model)
    assert {parameter.dtype for parameter in model.parameters() if parameter.is_floating_point()} == {torch.float32}
    tolerance = model_facts.output_tolerance(model, padding.TOLERANCE)
    assert tolerance == model_facts.ROUNDING_STEPS * torch.finfo(torch.bfloat16).eps


def test_an_8bit_model_is_compared_at_fp16s_precision(small_qwen: pytest.Pytester) -> None:
    """bitsandbytes' 8-bit layers cast their inputs to fp16 whatever the weights around them hold."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        small_qwen.path / "small-qwen", quantization_config=transformers.BitsAndBytesConfig(load_in_8bit=True)
    )
    model = peft.prepare_model_for_kbit_training(model)
    assert torch.bfloat16 not in {parameter.dtype for parameter in model.parameters()}
    tolerance = model_facts.output_tolerance(model, padding.TOLERANCE)
    assert tolerance == model_facts.ROUNDING_STEPS * torch.finfo(torch.float16).eps


def test_float8_weights_are_storage_not_the_precision_compared_at() -> None:
    """A float8 checkpoint's layers compute in 16 bits: its weights' 1-byte rounding is not the tolerance (which at
    8 steps of float8's would let every padding fault pass)."""
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4)).to(torch.bfloat16)
    model[1].weight = torch.nn.Parameter(model[1].weight.to(torch.float8_e4m3fn), requires_grad=False)
    tolerance = model_facts.output_tolerance(model, padding.TOLERANCE)
    assert tolerance == model_facts.ROUNDING_STEPS * torch.finfo(torch.bfloat16).eps
    assert model_facts.output_tolerance(torch.nn.Linear(4, 4), padding.TOLERANCE) == padding.TOLERANCE

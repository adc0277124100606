"""The twins built: every kind of checkpoint's narrowed config makes a model that trains, and what a machine without
a GPU cannot run is replaced and said (`twin.loading.runnable_here`). The narrowing itself is unit-tested in
tests/unit/test_twin_shrink.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from pytest_trainer.twin import checkpoint, loading, shrink

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"

#: Configs of the sizes of real checkpoints that are not kept as files: transformers' own classes with the sizes
#: their model cards give (Mistral 7B, Qwen1.5-MoE-A2.7B, BERT-large, Whisper large-v3).
BUILT = {
    "mistral-7b": lambda: transformers.MistralConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        sliding_window=4096,
    ),
    "qwen-moe": lambda: transformers.Qwen2MoeConfig(
        hidden_size=2048,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        num_experts=60,
        num_experts_per_tok=4,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632,
        vocab_size=151936,
    ),
    "bert-large": lambda: transformers.BertConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    ),
    "whisper-large": lambda: transformers.WhisperConfig(
        d_model=1280,
        encoder_layers=32,
        decoder_layers=32,
        encoder_attention_heads=20,
        decoder_attention_heads=20,
        encoder_ffn_dim=5120,
        decoder_ffn_dim=5120,
        num_mel_bins=128,
        vocab_size=51866,
    ),
}


def narrowed(config: Any) -> Any:
    return type(config).from_dict(shrink.narrow(config.to_dict()))


def parameters(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


@pytest.mark.parametrize("name", ["Qwen--Qwen2.5-7B-Instruct", "meta-llama--Llama-3.1-8B-Instruct"])
def test_the_twin_of_a_real_causal_lm_trains(name: str) -> None:
    config = transformers.AutoConfig.from_pretrained(FIXTURES / name)
    model = transformers.AutoModelForCausalLM.from_config(narrowed(config))
    assert parameters(model) < 25_000_000
    assert model.get_input_embeddings().num_embeddings == config.vocab_size
    assert any(module.endswith("self_attn.q_proj") for module, _ in model.named_modules())  # LoRA's usual targets
    ids = torch.tensor([[config.bos_token_id, 9906, 1917]])
    model(input_ids=ids, labels=ids).loss.backward()
    assert 7.5e9 < checkpoint.parameters(type(model), config) < 8.1e9  # counted on the meta device


def test_the_twin_of_a_vision_language_model_keeps_sliding_and_full_attention() -> None:
    config = transformers.AutoConfig.from_pretrained(FIXTURES / "google--gemma-3-4b-it")
    twin = narrowed(config)
    assert sorted(set(twin.get_text_config().layer_types)) == ["full_attention", "sliding_attention"]
    model = transformers.AutoModelForImageTextToText.from_config(twin)
    assert parameters(model) < 60_000_000


@pytest.mark.parametrize("name", sorted(BUILT))
def test_every_kind_of_model_gets_a_twin_that_trains(name: str) -> None:
    config = BUILT[name]()
    twin = narrowed(config)
    if name == "whisper-large":
        model = transformers.WhisperForConditionalGeneration(twin)
        features = torch.randn(1, config.num_mel_bins, 2 * config.max_source_positions)
        loss = model(input_features=features, labels=torch.tensor([[1, 2, 3]])).loss
    elif name == "bert-large":
        model = transformers.BertForSequenceClassification(twin)
        loss = model(input_ids=torch.tensor([[101, 2000, 102]]), labels=torch.tensor([1])).loss
    else:
        model = transformers.AutoModelForCausalLM.from_config(twin)
        loss = model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss
    assert parameters(model) < 25_000_000
    loss.backward()


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU replaces")
def test_a_gpu_device_map_and_flash_attention_are_replaced_and_said() -> None:
    kwargs, replaced = loading.runnable_here(
        {"device_map": {"": 0}, "attn_implementation": "flash_attention_2", "dtype": torch.bfloat16}
    )
    assert kwargs == {"attn_implementation": "sdpa", "dtype": torch.bfloat16}
    assert any("flash_attention_2" in line for line in replaced)
    assert any("device_map" in line for line in replaced)


def test_a_cpu_device_map_is_kept() -> None:
    kwargs, replaced = loading.runnable_here({"device_map": "cpu", "attn_implementation": "sdpa"})
    assert kwargs == {"device_map": "cpu", "attn_implementation": "sdpa"} and replaced == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU replaces")
def test_a_quantization_this_machine_cannot_run_is_dropped_and_said() -> None:
    config = transformers.GPTQConfig(bits=4)
    kwargs, replaced = loading.runnable_here({"quantization_config": config, "device_map": "auto"})
    assert kwargs == {"device_map": "auto"}
    assert replaced and replaced[0].startswith("gptq quantization needs a GPU: the twin loads unquantized")


def test_bitsandbytes_runs_on_a_cpu_from_0_46() -> None:
    assert loading.bitsandbytes_lacks(None, gpu=False) == "bitsandbytes, which is not installed"
    assert loading.bitsandbytes_lacks(None, gpu=True) == "bitsandbytes, which is not installed"
    assert loading.bitsandbytes_lacks("0.45.5", gpu=False) == "a GPU (bitsandbytes 0.45.5 runs on a CPU from 0.46)"
    assert loading.bitsandbytes_lacks("0.45.5", gpu=True) is None
    assert loading.bitsandbytes_lacks("0.50.2", gpu=False) is None
    config = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    assert loading._bits({"quantization_config": config}) == (4, torch.bfloat16)


def test_the_bits_asked_are_read_from_every_form() -> None:
    assert loading._bits({"load_in_8bit": True})[0] == 8
    assert loading._bits({"quantization_config": {"load_in_4bit": True, "quant_method": "bitsandbytes"}})[0] == 4
    assert loading._bits({"quantization_config": {"quant_method": "gptq", "bits": 4}})[0] == 0
    assert loading._bits({}) == (0, None)


def test_a_hub_id_is_looked_up_in_the_cache_only(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--model"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama"}))
    found = checkpoint.locate("org/model", cache_dir=tmp_path)
    assert found is not None and not found.weights
    (snapshot / "model.safetensors").write_bytes(b"")
    assert checkpoint.locate("org/model", cache_dir=tmp_path).weights  # type: ignore[union-attr]

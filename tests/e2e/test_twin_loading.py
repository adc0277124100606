"""The twins built: every kind of checkpoint's narrowed config makes a model that trains, and what a machine without
a GPU cannot run is replaced and said (`twin.loading.runnable_here`). The narrowing itself is unit-tested in
tests/unit/test_twin_shrink.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import checkpoints
import pytest
import torch
import transformers

from pytest_trainer.twin import checkpoint, loading, shrink

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"


def narrowed(config: Any) -> Any:
    return type(config).from_dict(shrink.narrow(config.to_dict()))


def parameters(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("Qwen--Qwen2.5-7B-Instruct", (7.5, 7.7)),
        ("meta-llama--Llama-3.1-8B-Instruct", (7.9, 8.1)),
        ("mistralai--Mistral-7B-Instruct-v0.3", (7.2, 7.3)),
        ("Qwen--Qwen3-30B-A3B", (30.4, 30.6)),  # a mixture of 128 experts, 8 a token
    ],
)
def test_the_twin_of_a_real_causal_lm_trains(name: str, billions: tuple[float, float]) -> None:
    config = transformers.AutoConfig.from_pretrained(FIXTURES / name)
    model = transformers.AutoModelForCausalLM.from_config(narrowed(config))
    assert parameters(model) < 25_000_000
    assert model.get_input_embeddings().num_embeddings == config.vocab_size
    assert any(module.endswith("self_attn.q_proj") for module, _ in model.named_modules())  # LoRA's usual targets
    ids = torch.tensor([[config.bos_token_id, 9906, 1917]])
    model(input_ids=ids, labels=ids).loss.backward()
    low, high = billions
    assert low * 1e9 < checkpoint.parameters(type(model), config) < high * 1e9  # counted on the meta device


def test_the_twin_of_a_mixture_of_experts_keeps_its_routing() -> None:
    config = transformers.AutoConfig.from_pretrained(FIXTURES / "Qwen--Qwen3-30B-A3B")
    twin = narrowed(config)
    assert twin.num_experts_per_tok <= twin.num_experts < config.num_experts
    assert twin.num_key_value_heads < twin.num_attention_heads  # grouped as the checkpoint's 4 of 32
    model = transformers.AutoModelForCausalLM.from_config(twin)
    assert any("mlp.experts" in module for module, _ in model.named_modules())


@pytest.mark.parametrize("name", ["google--gemma-3-4b-it", "Qwen--Qwen2-VL-2B"])
def test_the_twin_of_a_vision_language_model_trains(name: str) -> None:
    config = transformers.AutoConfig.from_pretrained(FIXTURES / name)
    twin = narrowed(config)
    if name.startswith("google"):  # Gemma 3 mixes sliding and full attention layers
        assert sorted(set(twin.get_text_config().layer_types)) == ["full_attention", "sliding_attention"]
    model = transformers.AutoModelForImageTextToText.from_config(twin)
    assert parameters(model) < 60_000_000
    assert model.get_input_embeddings().num_embeddings == config.get_text_config().vocab_size


def test_the_twin_of_whisper_large_v3_trains_on_its_128_mel_bins() -> None:
    config = transformers.AutoConfig.from_pretrained(FIXTURES / "openai--whisper-large-v3")
    twin = narrowed(config)
    assert (twin.num_mel_bins, twin.vocab_size) == (128, 51866)
    model = transformers.WhisperForConditionalGeneration(twin)
    assert parameters(model) < 25_000_000
    features = torch.randn(1, config.num_mel_bins, 2 * config.max_source_positions)
    model(input_features=features, labels=torch.tensor([[50258, 50259, 50360]])).loss.backward()
    assert 1.5e9 < checkpoint.parameters(transformers.WhisperForConditionalGeneration, config) < 1.6e9


def test_the_twin_of_bert_large_trains() -> None:
    config = transformers.BertConfig.from_pretrained(FIXTURES / "google-bert--bert-large-uncased")
    assert 3.3e8 < checkpoint.parameters(transformers.BertForSequenceClassification, config) < 3.4e8
    model = transformers.BertForSequenceClassification(narrowed(config))
    assert parameters(model) < 25_000_000
    model(input_ids=torch.tensor([[101, 2000, 102]]), labels=torch.tensor([1])).loss.backward()


def test_the_twin_keeps_the_checkpoints_generation_config(tmp_path: Path) -> None:
    """Whisper's generate reads its languages and tasks from the checkpoint's generation config, which the model's
    config does not hold: the twin built from the config alone lacked them, and a script's evaluation with
    predict_with_generate failed ("'GenerationConfig' object has no attribute 'lang_to_id'")."""
    hub_id = checkpoints.cache(tmp_path / "hf", "openai--whisper-large-v3")
    twins = loading.Twins("twin", tmp_path / "twins")
    with twins.installed():
        model = transformers.WhisperForConditionalGeneration.from_pretrained(
            hub_id, cache_dir=tmp_path / "hf" / "hub", dtype=torch.float32
        )
    assert parameters(model) < 25_000_000
    assert model.generation_config.lang_to_id["<|fr|>"] == 50265
    assert model.generation_config.task_to_id == {"transcribe": 50360, "translate": 50359}
    features = torch.randn(1, 128, 3000)
    model.generate(input_features=features, language="fr", task="transcribe", max_new_tokens=2)


def test_the_cpu_items_twin_gives_its_own_reason(tmp_path: Path) -> None:
    """On a machine with a GPU, `auto` builds a model of 1B parameters at full size for the cuda items and runs the
    script once more for the cpu items, in `CPU_ITEMS` mode: their twin says so, not that an option asked for one."""
    config = transformers.AutoConfig.from_pretrained(FIXTURES / "Qwen--Qwen2.5-7B-Instruct")
    twins = loading.Twins(loading.CPU_ITEMS, tmp_path)
    with twins.installed():
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert parameters(model) < 25_000_000
    (twin,) = twins.made
    assert "A twin because the script trains a model of 1B parameters or more, which the cpu items" in twin.line()
    assert "7.62B parameters" in twin.line()


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


@pytest.mark.parametrize(
    "name", sorted(path.name for path in FIXTURES.iterdir() if (path / "tokenizer_config.json").is_file())
)
def test_each_fixtures_tokenizer_survives_saving_as_the_save_stage_saves_it(name: str, tmp_path: Path) -> None:
    # Mistral's and Gemma's own tokens start at id 0: the small tokenizer's trained tokens take the ids they leave free.
    if name.startswith("mistralai") and transformers.__version__.startswith("4."):
        pytest.skip("transformers 4 builds Mistral's tokenizer from its sentencepiece model, which the fixture lacks")
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoints.folder(tmp_path, name))
    tokenizer.save_pretrained(tmp_path / "saved")
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
    text = "what is the capital of france ? paris ."
    assert again(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert len(set(tokenizer.get_vocab().values())) == len(tokenizer.get_vocab()), "two tokens share an id"

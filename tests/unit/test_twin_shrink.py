"""A checkpoint's config narrowed to its twin (`twin.shrink`) and sized (`twin.checkpoint.estimate`): pure logic on the
public configs of real checkpoints (tests/fixtures/checkpoints) and on small built configs. The twins built from them,
and what a machine without a GPU replaces, are tested in tests/e2e/test_twin_loading.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_trainer.twin import checkpoint, shrink

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name / "config.json").read_text())


def test_a_causal_lm_keeps_what_the_pipeline_reads_and_loses_its_size() -> None:
    config = fixture("Qwen--Qwen2.5-7B-Instruct")
    twin = shrink.narrow(config)
    assert (twin["num_hidden_layers"], twin["hidden_size"], twin["num_attention_heads"]) == (2, 64, 4)
    assert twin["num_key_value_heads"] == 2  # grouped, as the checkpoint's 4 of 28
    assert twin["intermediate_size"] == shrink.FEED_FORWARD
    for kept in (
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
        "rope_theta",
        "max_position_embeddings",
        "tie_word_embeddings",
        "torch_dtype",
        "architectures",
        "model_type",
        "sliding_window",
    ):
        assert twin[kept] == config[kept], kept
    assert config["num_hidden_layers"] == 28  # the checkpoint's own config is left as it is


def test_llama_three_keeps_its_rope_scaling_and_its_ends_of_turn() -> None:
    config = fixture("meta-llama--Llama-3.1-8B-Instruct")
    twin = shrink.narrow(config)
    assert twin["rope_scaling"] == config["rope_scaling"]
    assert twin["eos_token_id"] == config["eos_token_id"]
    assert twin["num_key_value_heads"] == 2


def test_every_level_of_a_vision_language_model_is_narrowed() -> None:
    config = fixture("google--gemma-3-4b-it")
    twin = shrink.narrow(config)
    assert twin["text_config"]["hidden_size"] == twin["vision_config"]["hidden_size"] == shrink.WIDTH
    assert twin["vision_config"]["num_hidden_layers"] == shrink.LAYERS
    assert twin["vision_config"]["image_size"] == config["vision_config"]["image_size"]
    assert twin["mm_tokens_per_image"] == config["mm_tokens_per_image"]


def test_one_layer_of_every_kind_is_kept() -> None:
    kinds = ["sliding_attention"] * 5 + ["full_attention"]
    twin = shrink.narrow({"hidden_size": 2560, "num_hidden_layers": 12, "layer_types": kinds * 2})
    assert twin["layer_types"] == ["sliding_attention", "full_attention"]
    assert twin["num_hidden_layers"] == 2
    three = shrink.narrow({"hidden_size": 64, "num_hidden_layers": 6, "layer_types": ["a", "b", "b", "c", "a", "a"]})
    assert three["layer_types"] == ["a", "b", "c"] and three["num_hidden_layers"] == 3


def test_dense_and_expert_layers_are_both_kept() -> None:
    twin = shrink.narrow(
        {
            "hidden_size": 2048,
            "num_hidden_layers": 24,
            "mlp_only_layers": [0, 1, 2],
            "num_experts": 60,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 1408,
        }
    )
    assert twin["num_hidden_layers"] == 2 and twin["mlp_only_layers"] == [0]
    assert (twin["num_experts"], twin["num_experts_per_tok"]) == (shrink.EXPERTS, shrink.EXPERTS_PER_TOKEN)
    assert twin["moe_intermediate_size"] == shrink.EXPERT_FEED_FORWARD
    deepseek = shrink.narrow({"hidden_size": 7168, "num_hidden_layers": 61, "first_k_dense_replace": 3})
    assert deepseek["first_k_dense_replace"] == 1


def test_key_value_heads_keep_their_relation_to_the_query_heads() -> None:
    for kv, expected in ((32, shrink.HEADS), (8, shrink.HEADS // 2), (1, 1)):
        twin = shrink.narrow({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": kv})
        assert twin["num_key_value_heads"] == expected


def test_an_encoder_decoder_narrows_both_stacks() -> None:
    twin = shrink.narrow(
        {
            "d_model": 1280,
            "encoder_layers": 32,
            "decoder_layers": 32,
            "encoder_attention_heads": 20,
            "decoder_attention_heads": 20,
            "encoder_ffn_dim": 5120,
            "num_mel_bins": 128,
        }
    )
    assert (twin["encoder_layers"], twin["decoder_layers"], twin["d_model"]) == (2, 2, shrink.WIDTH)
    assert twin["num_mel_bins"] == 128


def test_a_checkpoint_smaller_than_the_twin_keeps_its_sizes() -> None:
    small = {
        "hidden_size": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
    }
    assert shrink.narrow(small) == small


def test_multimodal_rope_sections_fit_the_narrow_head() -> None:
    twin = shrink.narrow(
        {
            "hidden_size": 3584,
            "num_attention_heads": 28,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        }
    )
    assert twin["rope_scaling"]["mrope_section"] == [2, 3, 3]
    assert sum(twin["rope_scaling"]["mrope_section"]) == shrink.HEAD_DIM // 2


def test_a_checkpoint_stored_quantized_becomes_plain_weights() -> None:
    twin = shrink.narrow({"hidden_size": 4096, "quantization_config": {"quant_method": "gptq", "bits": 4}})
    assert "quantization_config" not in twin


def test_the_shape_is_said_in_layers_and_width() -> None:
    config = fixture("Qwen--Qwen2.5-7B-Instruct")
    assert shrink.shape(config) == "28 layers x 3584"
    assert shrink.shape(shrink.narrow(config)) == f"2 layers x {shrink.WIDTH}"
    assert (
        shrink.shape({"num_hidden_layers": 24, "hidden_size": 2048, "num_experts": 60})
        == "24 layers x 2048, 60 experts"
    )


def test_the_estimate_tells_a_large_model_from_a_small_one() -> None:
    assert checkpoint.estimate(fixture("Qwen--Qwen2.5-7B-Instruct")) > checkpoint.CPU_LIMIT
    assert checkpoint.estimate(fixture("meta-llama--Llama-3.1-8B-Instruct")) > checkpoint.CPU_LIMIT
    assert checkpoint.estimate({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1000}) < 10**6
    assert checkpoint.count(7_615_616_512) == "7.62B" and checkpoint.count(19_500_000) == "19.5M"


def test_a_folder_without_weights_is_found_without_them(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    found = checkpoint.locate(str(tmp_path))
    assert found is not None and not found.weights
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert checkpoint.locate(tmp_path).weights  # type: ignore[union-attr]
    assert checkpoint.locate("./missing/folder") is None

"""A checkpoint's config narrowed to a twin: the same architecture with few layers and a narrow width.

Pure logic on the config as a dict (`PretrainedConfig.to_dict()`), nested configs included (a vision tower, a text
model, an encoder and a decoder). What the data pipeline and the script read is kept as the checkpoint has it: the
vocabulary size, special token ids, position limits, rope settings, tied embeddings, image and audio geometry, the
model type and architecture names (so the module names LoRA targets exist). What makes the model large is cut:
layers (keeping one of every kind the config mixes: sliding and full attention, dense and expert layers), widths,
heads (key-value heads kept in the same relation to the query heads: all, one, or a group) and experts.
"""

from __future__ import annotations

import copy
from typing import Any

#: The twin's sizes.
WIDTH = 64
HEADS = 4
HEAD_DIM = WIDTH // HEADS
FEED_FORWARD = 128
EXPERT_FEED_FORWARD = 32
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
#: Layers kept at least (more where the config mixes more kinds of layer).
LAYERS = 2

_WIDTH_KEYS = (
    "hidden_size",
    "d_model",
    "n_embd",
    "embed_dim",
    "embedding_size",
    "out_hidden_size",
    "word_embed_proj_dim",
)
_HEAD_KEYS = (
    "num_attention_heads",
    "n_head",
    "n_heads",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "num_heads",
)
_KV_KEYS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
_HEAD_DIM_KEYS = ("head_dim", "d_kv", "v_head_dim", "kv_channels")
_FEED_FORWARD_KEYS = (
    "intermediate_size",
    "ffn_dim",
    "n_inner",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "d_ff",
    "ffn_hidden_size",
)
_EXPERT_FEED_FORWARD_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk")
#: Layer counts, each with the keys that may hold its per-layer lists (`layer_types`).
_LAYER_KEYS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "encoder_layers",
    "decoder_layers",
    "num_decoder_layers",
    "depth",
)
#: Low-rank widths of multi-head latent attention.
_RANK_KEYS = ("q_lora_rank", "kv_lora_rank")
_ROPE_HEAD_KEYS = ("qk_rope_head_dim", "qk_nope_head_dim")

#: The sizes every level of the twin takes, by the keys that hold them.
_FIXED = (
    (_WIDTH_KEYS, WIDTH),
    (_HEAD_KEYS, HEADS),
    (_HEAD_DIM_KEYS, HEAD_DIM),
    (_ROPE_HEAD_KEYS, HEAD_DIM // 2),
    (_RANK_KEYS, WIDTH // 2),
    (_FEED_FORWARD_KEYS, FEED_FORWARD),
    (_EXPERT_FEED_FORWARD_KEYS, EXPERT_FEED_FORWARD),
)


def narrow(config: dict[str, Any]) -> dict[str, Any]:
    """The twin's config: a copy of `config` with every level narrowed."""
    narrowed = copy.deepcopy(config)
    _narrow_level(narrowed)
    narrowed.pop("quantization_config", None)  # a checkpoint stored quantized: the twin holds plain weights
    return narrowed


def _narrow_level(level: dict[str, Any]) -> None:
    for value in level.values():  # nested configs first: a vision tower, a text model, an encoder
        if isinstance(value, dict) and ("model_type" in value or any(key in value for key in _WIDTH_KEYS)):
            _narrow_level(value)
    _narrow_layers(level)
    heads = next((level[key] for key in _HEAD_KEYS if _is_count(level.get(key))), None)
    for keys, size in _FIXED:  # never wider than the checkpoint: a small one stays as it is
        for key in keys:
            if _is_count(level.get(key)):
                level[key] = min(level[key], size)
    narrow_heads = min(heads, HEADS) if heads else HEADS
    for key in _KV_KEYS:
        value = level.get(key)
        if isinstance(value, int) and _is_count(value):  # the same relation to the query heads: all, one, or a group
            level[key] = (
                value if value <= 1 else narrow_heads if heads is None or value >= heads else max(1, narrow_heads // 2)
            )
    experts = None
    for key in _EXPERT_KEYS:
        if _is_count(level.get(key)) and level[key] > 1:
            level[key] = experts = min(level[key], EXPERTS)
    for key in _TOP_K_KEYS:
        if _is_count(level.get(key)):
            level[key] = min(level[key], EXPERTS_PER_TOKEN, experts or EXPERTS_PER_TOKEN)
    for key in ("n_group", "topk_group"):  # expert groups of DeepSeek's router
        if _is_count(level.get(key)):
            level[key] = 1
    for key in ("rope_scaling", "rope_parameters"):
        rope = level.get(key)
        if isinstance(rope, dict) and isinstance(rope.get("mrope_section"), list):
            rope["mrope_section"] = _sections(rope["mrope_section"], HEAD_DIM // 2)


def _narrow_layers(level: dict[str, Any]) -> None:
    """Cut each layer count of this level, keeping one layer of every kind its per-layer lists name."""
    for key in _LAYER_KEYS:
        count = level.get(key)
        if not isinstance(count, int) or not _is_count(count) or count <= LAYERS:
            continue
        per_layer = {
            name: value
            for name, value in level.items()
            if isinstance(value, list) and len(value) == count and name != "mrope_section"
        }
        kept = _kept_layers(count, per_layer, level)
        level[key] = len(kept)
        for name, value in per_layer.items():
            level[name] = [value[index] for index in kept]
        for name in ("mlp_only_layers", "fullatt_block_indexes"):  # layer indices, not per-layer values
            indices = level.get(name)
            if isinstance(indices, list) and indices and all(_is_count(index) or index == 0 for index in indices):
                level[name] = [kept.index(index) for index in indices if index in kept] or (
                    [len(kept) - 1] if name == "fullatt_block_indexes" else []
                )
        if _is_count(level.get("first_k_dense_replace")):  # dense layers first, then experts: one of each
            level["first_k_dense_replace"] = 1


def _kept_layers(count: int, per_layer: dict[str, list[Any]], level: dict[str, Any]) -> list[int]:
    """The first layer of every kind (by the per-layer lists and the layer indices that mark a kind), then the
    next ones up to LAYERS."""
    marked = [
        set(indices)
        for name in ("mlp_only_layers", "fullatt_block_indexes")
        if isinstance(indices := level.get(name), list)
    ]
    kinds: dict[Any, int] = {}
    for index in range(count):
        kind = (
            tuple(repr(values[index]) for values in per_layer.values()),
            tuple(index in indices for indices in marked),
        )
        kinds.setdefault(kind, index)
    kept = sorted(kinds.values())
    index = 0
    while len(kept) < min(LAYERS, count):
        if index not in kept:
            kept.append(index)
        index += 1
    return sorted(kept)


def _sections(sections: list[int], total: int) -> list[int]:
    """Multimodal rope sections scaled to a head of `total` rotary pairs, in the same proportions, none empty."""
    whole = sum(sections) or 1
    scaled = [max(1, round(value * total / whole)) for value in sections]
    scaled[-1] += total - sum(scaled)
    return scaled


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def shape(config: dict[str, Any]) -> str:
    """Layers x width of a config, in words: `28 layers x 3584`, with its experts where it has them."""
    layers = next((config[key] for key in _LAYER_KEYS if _is_count(config.get(key))), None)
    width = next((config[key] for key in _WIDTH_KEYS if _is_count(config.get(key))), None)
    if layers is None or width is None:
        text = next((value for value in config.values() if isinstance(value, dict) and "model_type" in value), None)
        return shape(text) if text is not None else "its own shape"
    experts = next((config[key] for key in _EXPERT_KEYS if _is_count(config.get(key)) and config[key] > 1), None)
    return f"{layers} layers x {width}" + (f", {experts} experts" if experts else "")

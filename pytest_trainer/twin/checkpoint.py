"""Where a checkpoint's files are, whether its weights are at hand, and how large its model is: read from its config.

A checkpoint is a folder or a hub id resolved in the Hugging Face cache. Nothing here reads a weight file or
downloads one; the size is counted on the meta device (shapes, no storage).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The files that hold a checkpoint's weights, in the layouts transformers saves.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: Parameters from which a model is not built at full size on a machine without a GPU.
CPU_LIMIT = 1_000_000_000


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint as the script names it."""

    name: str
    #: Whether its weight files are on this machine (a folder, or the Hugging Face cache).
    weights: bool


def locate(name: Any, subfolder: str = "", revision: str | None = None, cache_dir: Any = None) -> Checkpoint | None:
    """The checkpoint `name` names (a folder or a hub id), or None where it is neither readable nor a hub id."""
    if not isinstance(name, (str, os.PathLike)):
        return None
    folder = Path(name) / subfolder if subfolder else Path(name)
    if folder.is_dir():
        return Checkpoint(str(name), any((folder / file).is_file() for file in WEIGHT_FILES))
    text = str(name)
    if text.count("/") > 1 or text.startswith((".", "/", "~")):
        return None  # a path that does not exist: from_pretrained says so in its own words
    from huggingface_hub import try_to_load_from_cache

    prefix = f"{subfolder}/" if subfolder else ""
    try:
        cached = [
            try_to_load_from_cache(text, prefix + file, cache_dir=cache_dir, revision=revision) for file in WEIGHT_FILES
        ]
    except Exception:  # not a valid hub id: from_pretrained says so in its own words
        return None
    return Checkpoint(text, any(isinstance(path, str) for path in cached))


def estimate(config: dict[str, Any]) -> int:
    """A quick upper-bound-ish count of parameters from the widths of a config: enough to tell a small model from a
    large one without building anything (the count that is reported comes from `parameters`)."""
    from pytest_trainer.twin import shrink

    total = 0
    levels = [config, *(value for value in config.values() if isinstance(value, dict))]
    for level in levels:
        width = next((level[key] for key in shrink._WIDTH_KEYS if shrink._is_count(level.get(key))), 0)
        layers = sum(level[key] for key in shrink._LAYER_KEYS[:4] if shrink._is_count(level.get(key)))
        layers += sum(level[key] for key in ("encoder_layers", "decoder_layers") if shrink._is_count(level.get(key)))
        feed = next((level[key] for key in shrink._FEED_FORWARD_KEYS if shrink._is_count(level.get(key))), 4 * width)
        experts = next((level[key] for key in shrink._EXPERT_KEYS if shrink._is_count(level.get(key))), 1)
        expert_feed = next(
            (level[key] for key in shrink._EXPERT_FEED_FORWARD_KEYS if shrink._is_count(level.get(key))), feed
        )
        vocab = int(level["vocab_size"]) if shrink._is_count(level.get("vocab_size")) else 0
        total += layers * (4 * width * width + 3 * width * max(feed, experts * expert_feed)) + 2 * vocab * width
    return total


def parameters(model_class: Any, config: Any) -> int:
    """Parameters of `model_class` built from `config`, counted on the meta device (nothing allocated)."""
    import torch

    with torch.device("meta"):
        model = model_class._from_config(config)
    return sum(parameter.numel() for parameter in model.parameters())


def count(parameters: int) -> str:
    """`7.62B`, `355M`, `19.9M` parameters."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if parameters >= size:
            return f"{parameters / size:.3g}{unit}"
    return str(parameters)

"""What can learn once training starts: gradient checkpointing as the Trainer turns it on, and added tokens.

Two things decide it that a dry look at the model misses. `Trainer.train()` turns on gradient
checkpointing only when training starts; with re-entrant checkpoints whose inputs do not require
grad, the adapters inside them never get a gradient. And tokens added to the tokenizer get fresh
embedding rows that stay untrained when the embedding is frozen (LoRA), unless
`trainable_token_indices` or `modules_to_save` cover them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def enable_checkpointing(trainer: Any, model: Any) -> str | None:
    """Turn on gradient checkpointing as `Trainer.train()` would; describe it, or None when the script has none."""
    from pytest_trainer.diagnosis import pipeline_part

    args = trainer.args
    part = pipeline_part("gradient checkpointing, as Trainer.train() turns it on")
    if getattr(args, "activation_checkpointing", None):  # transformers 5
        options = dict(getattr(args, "activation_checkpointing_kwargs", None) or {})
        every, offload = options.pop("every_n_layers", 1), options.pop("offload", False)
        enable = getattr(model, "activation_checkpointing_enable", None)
        with part:
            if callable(enable):
                enable(activation_checkpointing_kwargs=options or None, every_n_layers=every, offload=offload)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options or None)
    elif getattr(args, "gradient_checkpointing", False):  # transformers 4
        options = dict(getattr(args, "gradient_checkpointing_kwargs", None) or {})
        with part:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options or None)
    else:
        return None
    reentrant = options.get("use_reentrant")
    return f"gradient checkpointing (use_reentrant={reentrant})" if reentrant is not None else "gradient checkpointing"


def quantized_for_training(model: Any) -> None:
    """Keep 4-bit weights in the layout training reads while the stages evaluate on the CPU.

    bitsandbytes (0.48 and later) repacks a 4-bit layer's weight for its CPU inference kernel on the first forward in
    eval mode without gradients, and keeps it so: a later training forward fails in place on that layout, and
    PEFT's load_adapter reads it as the training layout. A run of the script trains first and never evaluates on the
    CPU; the stages evaluate in between. So the repacking is turned off (it is a speed-up of inference only), and a
    weight the script's own evaluation repacked is put back.
    """
    for module in model.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False
        weight = getattr(module, "weight", None)
        state: Any = getattr(weight, "quant_state", None)
        if weight is None or not getattr(state, "packing_format_for_cpu", False):
            continue
        try:
            from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse
        except ImportError:
            return
        weight.data, weight.quant_state = _convert_weight_packed_for_cpu_inverse(weight.data, state)


def new_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Ids of tokens added to the tokenizer beyond the vocabulary of the checkpoint the model was loaded from.

    Without that checkpoint on this machine (a model built from a config, say) nothing tells a token added
    for fine-tuning from one the model was built with: none is named.
    """
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    known = _pretrained_vocabulary(model)
    if known is None:
        return []
    return sorted(index for index in decoder if index >= known)


def frozen_rows(model: Any, ids: list[int]) -> bool:
    """Whether no trainable parameter reaches the input embeddings of `ids` (their rows cannot change)."""
    import torch

    embeddings = model.get_input_embeddings()
    weight = next((parameter for parameter in embeddings.parameters()), None)
    device = weight.device if weight is not None else "cpu"
    with torch.enable_grad():
        # .forward, not the module: a hook such as enable_input_require_grads() would mark any output trainable.
        rows = embeddings.forward(torch.tensor([ids], device=device))
    return not rows.requires_grad


def _pretrained_vocabulary(model: Any) -> int | None:
    """The vocabulary size of the checkpoint the model was loaded from, when its config is on this machine."""
    from transformers import AutoConfig

    from pytest_trainer.model_facts import base_model

    source = getattr(getattr(base_model(model), "config", None), "_name_or_path", "")
    if not source:
        return None
    try:
        return int(AutoConfig.from_pretrained(source, local_files_only=True).vocab_size)
    except Exception:  # not on this machine, or no vocabulary: fall back to the tokenizer's own
        return None


#: PEFT's task_type for each kind of label whose head PEFT then trains and saves (its modules_to_save).
PEFT_TASK_TYPES = {
    "class": "SEQ_CLS",
    "float": "SEQ_CLS",
    "multi-hot": "SEQ_CLS",
    "token class": "TOKEN_CLS",
    "positions": "QUESTION_ANS",
}
#: Module names PEFT wraps itself under those task types (peft's PeftModelForSequenceClassification and kin).
PEFT_HEADS = {"SEQ_CLS": ("classifier", "score"), "TOKEN_CLS": ("classifier", "score"), "QUESTION_ANS": ("qa_outputs",)}
#: Infixes PEFT puts into a wrapped module's parameter names; the checkpoint names the module without them.
_PEFT_INFIXES = (".base_layer", ".original_module")


def frozen_new_heads(model: Any) -> tuple[list[str], str] | None:
    """Heads of the model (modules beside its backbone) that are newly initialised and entirely frozen.

    Newly initialised: the model was built from a config, or none of the head's weights is in the checkpoint it
    was loaded from (read from the checkpoint's file names on this machine; a checkpoint not found here tells
    nothing, and nothing is named). Returns (head names, why they are new) or None. A language model's output
    layer is the pretrained embedding's twin, not a new head.
    """
    from pytest_trainer.model_facts import base_model

    base = base_model(model)
    backbone = getattr(base, str(getattr(base, "base_model_prefix", "") or "-"), None)
    config = getattr(base, "config", None)
    if backbone is None or config is None or not hasattr(base, "named_children"):
        return None
    output = _output_embeddings(base)
    heads = [
        (name, child)
        for name, child in base.named_children()
        if child is not backbone
        and list(child.parameters())
        and not (output is not None and any(module is output for module in child.modules()))
    ]
    frozen = [(name, child) for name, child in heads if not any(p.requires_grad for p in child.parameters())]
    if not frozen:
        return None
    source = str(getattr(config, "_name_or_path", "") or "")
    if not source:
        return [name for name, _ in frozen], "the model was built from a config, so its weights are random"
    keys = checkpoint_keys(source)
    if keys is None:
        return None
    new = [
        name
        for name, child in frozen
        if not any(_in_checkpoint(f"{name}.{inner}", keys) for inner, _ in child.named_parameters())
    ]
    return (new, f"its weights are not in the checkpoint {source!r}") if new else None


def _output_embeddings(model: Any) -> Any:
    get = getattr(model, "get_output_embeddings", None)
    try:
        return get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        return None


def _in_checkpoint(name: str, keys: set[str]) -> bool:
    for infix in _PEFT_INFIXES:
        name = name.replace(infix, "")
    return name in keys or any(key.endswith("." + name) for key in keys)


def checkpoint_keys(source: str) -> set[str] | None:
    """The tensor names of the checkpoint at `source` (a folder or a Hub id in the local cache), or None."""
    for name in ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json"):
        path = Path(source) / name if Path(source).is_dir() else _cached(source, name)
        if path is None or not path.is_file():
            continue
        try:
            if name.endswith(".json"):
                return set(json.loads(path.read_text())["weight_map"])
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as opened:
                return set(opened.keys())
        except Exception:  # an unreadable checkpoint tells nothing
            return None
    return None


def _cached(source: str, name: str) -> Any:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(source, name)
    except Exception:  # not a Hub id
        return None
    return Path(found) if isinstance(found, str) else None


def frozen_head_fix(model: Any, heads: list[str], labels: str) -> str:
    """How to let new heads train: PEFT's task_type where it covers them and is not set yet, else modules_to_save."""
    configs = getattr(model, "peft_config", None)
    saved = "modules_to_save=[" + ", ".join(f'"{name}"' for name in heads) + "]"
    if not isinstance(configs, dict) or not configs:
        return f"unfreeze {' and '.join(heads)} before training, e.g. model.{heads[0]}.requires_grad_(True)"
    config = next(iter(configs.values()))
    task_type = PEFT_TASK_TYPES.get(labels)
    given = str(getattr(getattr(config, "task_type", None), "value", getattr(config, "task_type", None)) or "")
    kind = type(config).__name__
    if task_type and given != task_type and all(name in PEFT_HEADS[task_type] for name in heads):
        return f'{kind}(..., task_type="{task_type}"), which trains and saves the head, or {kind}(..., {saved})'
    return f"{kind}(..., {saved}), so that PEFT trains and saves a copy of it"

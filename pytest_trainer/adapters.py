"""What can learn once training starts: gradient checkpointing as the Trainer turns it on, and added tokens.

Two things decide it that a dry look at the model misses. `Trainer.train()` turns on gradient
checkpointing only when training starts; with re-entrant checkpoints whose inputs do not require
grad, the adapters inside them never get a gradient. And tokens added to the tokenizer get fresh
embedding rows that stay untrained when the embedding is frozen (LoRA), unless
`trainable_token_indices` or `modules_to_save` cover them.
"""

from __future__ import annotations

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

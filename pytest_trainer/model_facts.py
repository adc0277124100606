"""What the model can accept: vocabulary rows, position limit, its inputs, and its collator's kind.

Read from the model itself (its config, its embeddings, its forward signature), so the checks
speak of the model the script actually built.
"""

from __future__ import annotations

import inspect
from typing import Any


def base_model(model: Any) -> Any:
    """The model under its wrappers (PEFT, torch.compile, DistributedDataParallel), whose class tells the task."""
    for _ in range(4):
        get_base = getattr(model, "get_base_model", None)
        inner = get_base() if callable(get_base) else getattr(model, "_orig_mod", None)
        if inner is None and type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
            inner = model.module
        if inner is None or inner is model:
            return model
        model = inner
    return model


def built_from_config(model: Any) -> str | None:
    """The config class a model trained from scratch was built from, or None for a pretrained one (`from_pretrained`
    records where its weights came from; a model built from a config has no such path) or a model without config."""
    config = getattr(base_model(model), "config", None)
    path = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
    if config is None or path:
        return None
    return type(config).__name__


def usual_learning_rates(model: Any) -> str:
    """The learning rates people use for this model, in words: fine-tuning a pretrained model takes far lower
    ones than training one from scratch."""
    if built_from_config(model) is None:
        return "fine-tuning a pretrained model usually takes 1e-5 to 5e-5 (1e-4 to 2e-4 for LoRA adapters)"
    return "a model trained from scratch (built from its config) usually takes 1e-4 to 1e-3, with warmup"


def vocabulary_rows(model: Any) -> int | None:
    """Rows of the input embedding: every token id must be below this (None for models without one)."""
    get_embeddings = getattr(model, "get_input_embeddings", None)
    try:
        embeddings = get_embeddings() if callable(get_embeddings) else None
    except (NotImplementedError, AttributeError):  # audio and vision models have no token embedding
        return None
    return getattr(embeddings, "num_embeddings", None)


def position_limit(model: Any) -> int | None:
    """Longest sequence a model with learned absolute positions can take, else None (no hard limit). A position table
    with a padding index (RoBERTa, XLM-R) starts its positions after it."""
    import torch

    config = getattr(base_model(model), "config", None)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not isinstance(limit, int):
        return None
    tables = [
        module
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Embedding)
        and module.num_embeddings in (limit, limit + 2)
        and ("position" in name or name.endswith("wpe"))
    ]
    if not tables:
        return None
    # RoBERTa's family counts positions from its padding index + 1 (a table of 514 takes 512 tokens).
    offset = tables[0].padding_idx
    return limit - offset - 1 if offset is not None and tables[0].num_embeddings == limit else limit


def main_input(model: Any) -> str:
    return getattr(base_model(model), "main_input_name", "input_ids")


def forward_parameters(model: Any) -> set[str]:
    return set(inspect.signature(base_model(model).forward).parameters)


#: What a tokenizer returns: a forward that names one of them names its inputs.
TOKENIZER_INPUTS = (
    "input_ids",
    "attention_mask",
    "token_type_ids",
    "inputs_embeds",
    "pixel_values",
    "input_features",
    "input_values",
)


def unnamed_inputs(model: Any) -> list[str] | None:
    """The forward's parameters as written (`**inputs` included) where it takes its inputs as keywords it does not
    name, so that the Trainer's remove_unused_columns keeps no input column; None where it names them."""
    try:
        parameters = list(inspect.signature(base_model(model).forward).parameters.values())
    except (TypeError, ValueError):
        return None
    if not any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters) or any(
        parameter.name in TOKENIZER_INPUTS for parameter in parameters
    ):
        return None
    marks: dict[Any, str] = {inspect.Parameter.VAR_KEYWORD: "**", inspect.Parameter.VAR_POSITIONAL: "*"}
    return [marks.get(parameter.kind, "") + parameter.name for parameter in parameters]


def batches_given_features(collator: Any) -> bool:
    """A collator of transformers itself, which batches (and pads) the features it is given and builds no input."""
    return type(collator).__module__.startswith("transformers.") or getattr(collator, "__module__", "").startswith(
        "transformers."
    )


def pads(collator: Any) -> bool:
    """A collator of transformers that pads through a tokenizer, which fails on text."""
    from transformers import DefaultDataCollator

    return type(collator).__module__.startswith("transformers.") and not isinstance(collator, DefaultDataCollator)


def logits_of(outputs: Any) -> Any:
    """The logits of a model's outputs: its `logits`, or of a tuple (loss, logits, ...) the tensor after the loss."""
    import torch

    if isinstance(outputs, dict):
        logits = outputs.get("logits")
    elif isinstance(outputs, (tuple, list)):
        tensors = [value for value in outputs if torch.is_tensor(value)]
        logits = tensors[1] if len(tensors) > 1 and tensors[0].dim() == 0 else (tensors[0] if tensors else None)
    else:
        logits = None
    return logits if torch.is_tensor(logits) else None


#: In weights of lower precision than float32, outputs may differ by this many of their rounding steps (bf16 rounds to
#: 2**-8 of a value, fp16 to 2**-11) between two computations of the same thing (two sequence lengths, say).
ROUNDING_STEPS = 8
#: bitsandbytes' 8-bit layers, which cast their inputs to fp16 and multiply in int8 with fp16 outliers.
EIGHT_BIT_LAYERS = ("Linear8bitLt",)


def output_tolerance(model: Any, float32: float) -> float:
    """The relative difference allowed between two computations of the same outputs of `model`: `float32` where it
    computes in float32 throughout, a few rounding steps of the coarsest precision it computes in otherwise.

    That is its weights' coarsest floating dtype of 16 bits or more (float8 weights are storage: their layers compute
    in 16 bits), or the dtype its quantized layers compute in: bitsandbytes' 4-bit layers hold `compute_dtype`, and its
    8-bit layers multiply in fp16. A QLoRA model whose k-bit preparation made every floating weight float32 still
    multiplies in the bf16 its quantization config names."""
    import torch

    dtypes = {parameter.dtype for parameter in model.parameters() if parameter.is_floating_point()}
    for module in model.modules():
        computes = getattr(module, "compute_dtype", None)
        if isinstance(computes, torch.dtype) and computes.is_floating_point:
            dtypes.add(computes)
        elif type(module).__name__ in EIGHT_BIT_LAYERS:
            dtypes.add(torch.float16)
    coarsest = max((torch.finfo(dtype).eps for dtype in dtypes if dtype.itemsize >= 2), default=0.0)
    return max(float32, ROUNDING_STEPS * coarsest)

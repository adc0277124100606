"""Errors a script raises while it builds its Trainer, explained in the terms of fine-tuning libraries.

`loading` asks `explain` for a cause and a fix before it falls back to "the script raised ...": the
libraries' own messages say what failed, not what to write instead.
"""

from __future__ import annotations

import types
from typing import Any


def explain(error: BaseException) -> tuple[str, str] | None:
    """(cause, fix) for an error of PEFT, TRL or the Trainer met while building it, else None."""
    message = str(error)
    if type(error).__name__ == "NoMatchingPeftModuleError" or (
        "Target modules" in message and "not found in the base model" in message
    ):
        return _lora_targets(error, message)
    reference = _local_of_type(error, "ref_model_path", lambda value: isinstance(value, str))
    if reference is not None and isinstance(error, (OSError, ValueError)):
        which = "a model built from a config does not have" if not reference else "cannot be loaded here"
        return (
            "the trainer could not build its reference model: with no ref_model given, it loads one from the "
            f"policy model's checkpoint ({reference!r}), which {which} "
            f"({type(error).__name__}: {message.splitlines()[0] if message else ''})",
            "pass ref_model= (a copy of the model, copy.deepcopy(model), or a checkpoint on this machine), or train "
            "with a peft_config: the model without its adapter is then the reference",
        )
    if isinstance(error, KeyError) and _raised_in(error, "/trl/"):
        return _trl_format(error)
    if "max_steps" in message and ("__len__" in message or "does not have a length" in message):
        return (
            "the training dataset is a stream (an IterableDataset, or streaming=True) and TrainingArguments has no "
            "max_steps: the Trainer cannot tell how long an epoch is",
            "set max_steps in TrainingArguments (the number of optimizer steps to train for)",
        )
    return None


def _lora_targets(error: BaseException, message: str) -> tuple[str, str]:
    model = _local(error, "model")
    names = linear_module_names(model) if model is not None else []
    family = getattr(getattr(model, "config", None), "model_type", None)
    usual = _usual_targets(family)
    found = f"; its linear modules are {', '.join(names)}" if names else ""
    return (
        f"LoRA's target modules were not found in the model ({message.splitlines()[0]}){found}",
        "name modules of this model in LoraConfig(target_modules=...)"
        + (f", e.g. {usual} for {family} models" if usual else "")
        + ", or target_modules='all-linear'",
    )


#: The dataset formats each TRL trainer takes, as its documentation names them.
TRL_FORMATS = {
    "SFTTrainer": "'text', or 'messages' (conversational), or 'prompt' and 'completion'",
    "DPOTrainer": "'prompt', 'chosen' and 'rejected' (or 'chosen' and 'rejected' with the prompt in them)",
    "RewardTrainer": "'chosen' and 'rejected' (optionally with 'prompt')",
    "KTOTrainer": "'prompt', 'completion' and 'label'",
    "ORPOTrainer": "'prompt', 'chosen' and 'rejected'",
    "CPOTrainer": "'prompt', 'chosen' and 'rejected'",
}


def _trl_format(error: KeyError) -> tuple[str, str] | None:
    trainer = _local_of_type(error, "self", lambda value: type(value).__name__ in TRL_FORMATS)
    if trainer is None:
        return None
    name = type(trainer).__name__
    row = _local_of_type(error, "example", lambda value: hasattr(value, "keys")) or _local_of_type(
        error, "batch", lambda value: hasattr(value, "keys"))
    columns = ", ".join(repr(key) for key in list(row.keys())) if row is not None else "unknown"
    return (
        f"{name} found no column {error.args[0]!r} in the dataset: its columns are {columns}, "
        f"and {name} takes {TRL_FORMATS[name]}",
        "rename the columns (dataset.rename_column(old, new)) or map the rows into one of those formats",
    )


def _raised_in(error: BaseException, part: str) -> bool:
    """Whether the error passed through code whose file path holds `part`."""
    trace = error.__traceback__
    while trace is not None:
        if part in trace.tb_frame.f_code.co_filename.replace("\\", "/"):
            return True
        trace = trace.tb_next
    return False


def _local_of_type(error: BaseException, name: str, accept: Any) -> Any:
    """The outermost frame's local `name` that `accept` takes, along the error's traceback."""
    trace: types.TracebackType | None = error.__traceback__
    while trace is not None:
        value = trace.tb_frame.f_locals.get(name)
        if value is not None and accept(value):
            return value
        trace = trace.tb_next
    return None


def linear_module_names(model: Any) -> list[str]:
    """The distinct last names of a model's linear layers (GPT-2's Conv1D included): what LoRA can target."""
    import torch

    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if name and (isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D")
    }
    return sorted(names)


def _usual_targets(family: str | None) -> list[str] | None:
    try:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as usual
    except ImportError:
        return None
    found = usual.get(family) if family else None
    return list(found) if found else None


def _local(error: BaseException, name: str) -> Any:
    """The innermost frame's local `name` that is a torch module, where the error was raised."""
    import torch

    found = None
    trace: types.TracebackType | None = error.__traceback__
    while trace is not None:
        value = trace.tb_frame.f_locals.get(name)
        if isinstance(value, torch.nn.Module):
            found = value
        trace = trace.tb_next
    return found

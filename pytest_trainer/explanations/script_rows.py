"""The errors a script raises while it builds its Trainer, explained in the terms of fine-tuning libraries.

The script runner asks `explain` for a cause and a fix before it falls back to the library's own message: those
messages say what failed, not what to write instead. A row reads the error's traceback (the trainer, the config, the
model in its frames' locals) and imports nothing of the pipeline, so running a script needs only this half.
"""

from __future__ import annotations

import difflib
import itertools
import linecache
import math
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_trainer import frames
from pytest_trainer.explanations.registry import SCRIPT, Explained, first, row


def explain(error: BaseException) -> Explained | None:
    """The cause and fix of an error raised while the script builds its Trainer, else None."""
    found: Explained | None = first(SCRIPT, error)
    return found


@row(
    SCRIPT,
    "LoRA target modules not in the model",
    "ValueError: Target modules {'q_proj', 'v_proj'} not found in the base model.",
    r"",
    "load",
)
def _lora_targets(match: re.Match[str], error: BaseException) -> Explained | None:
    message = str(error)
    if type(error).__name__ != "NoMatchingPeftModuleError" and not re.search(
        r"Target modules .* not found in the base model", message
    ):
        return None
    model = _local_of_type(error, "model", _is_module, innermost=True)
    names = linear_module_names(model) if model is not None else []
    family = getattr(getattr(model, "config", None), "model_type", None)
    usual = _usual_targets(family)
    found = f"; its linear modules are {', '.join(names)}" if names else ""
    return Explained(
        f"LoRA's target modules were not found in the model ({message.splitlines()[0]}){found}",
        "name modules of this model in LoraConfig(target_modules=...)"
        + (f", e.g. {usual} for {family} models" if usual else "")
        + ", or target_modules='all-linear'",
    )


@row(
    SCRIPT,
    "a reference model loaded from a checkpoint that is not there",
    "OSError: ... is not a local folder and is not a valid model identifier (TRL loading ref_model_path)",
    r"",
    "load",
)
def _reference_checkpoint(match: re.Match[str], error: BaseException) -> Explained | None:
    reference = _local_of_type(error, "ref_model_path", lambda value: isinstance(value, str))
    if reference is None or not isinstance(error, (OSError, ValueError)):
        return None
    message = str(error)
    which = "a model built from a config does not have" if not reference else "cannot be loaded here"
    return Explained(
        "the trainer could not build its reference model: with no ref_model given, it loads one from the "
        f"policy model's checkpoint ({reference!r}), which {which} "
        f"({type(error).__name__}: {message.splitlines()[0] if message else ''})",
        "pass ref_model= (a copy of the model, copy.deepcopy(model), or a checkpoint on this machine), or train "
        "with a peft_config: the model without its adapter is then the reference",
    )


@row(
    SCRIPT,
    "an online RL reference model loaded by the name of a model built from a config",
    "OSError: Repo id must use alphanumeric chars '-', '_' or '.' ...: '' (RLOO, or GRPO, with beta > 0)",
    r"",
    "load",
)
def _online_reference(match: re.Match[str], error: BaseException) -> Explained | None:
    args = _local_of_type(error, "args", lambda value: hasattr(value, "beta") and hasattr(value, "num_generations"))
    model_id = _local_of_type(error, "model_id", lambda value: isinstance(value, str), innermost=True)
    policy = _local_of_type(error, "model", _is_module)  # loaded already: the load that failed is the reference's
    beta = getattr(args, "beta", 0)
    if model_id is None or policy is None or not beta or not isinstance(error, (OSError, ValueError)):
        return None
    which = "a model built from a config does not have" if not model_id else "cannot be loaded here"
    message = str(error)
    return Explained(
        f"with beta={beta:g}, the trainer builds a reference model for its KL term by loading the policy model's "
        f"checkpoint by name ({model_id!r}), which {which} ({type(error).__name__}: "
        f"{message.splitlines()[0] if message else ''})",
        "set beta=0.0 in the config (no KL term, no reference model), or build the model with from_pretrained "
        "from a checkpoint on this machine (save_pretrained it first)",
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


@row(
    SCRIPT,
    "a TRL dataset in another format",
    "KeyError: 'chosen' / KeyError: 'text' (inside the TRL trainer)",
    r"",
    "load",
)
def _trl_format(match: re.Match[str], error: BaseException) -> Explained | None:
    if not isinstance(error, KeyError) or not _raised_in(error, "/trl/"):
        return None
    trainer = _local_of_type(error, "self", lambda value: type(value).__name__ in TRL_FORMATS)
    if trainer is None:
        return None
    name = type(trainer).__name__
    row = _local_of_type(error, "example", lambda value: hasattr(value, "keys")) or _local_of_type(
        error, "batch", lambda value: hasattr(value, "keys")
    )
    columns = ", ".join(repr(key) for key in list(row.keys())) if row is not None else "unknown"
    return Explained(
        f"{name} found no column {error.args[0]!r} in the dataset: its columns are {columns}, "
        f"and {name} takes {TRL_FORMATS[name]}",
        "rename the columns (dataset.rename_column(old, new)) or map the rows into one of those formats",
    )


@row(
    SCRIPT,
    "a stream without max_steps",
    "ValueError: The train_dataset does not implement __len__, max_steps has to be specified.",
    r"max_steps.*(__len__|does not have a length)|(__len__|does not have a length).*max_steps",
    "load",
)
def _stream_without_max_steps(match: re.Match[str], error: BaseException) -> Explained:
    return Explained(
        "the training dataset is a stream (an IterableDataset, or streaming=True) and TrainingArguments has no "
        "max_steps: the Trainer cannot tell how long an epoch is",
        "set max_steps in TrainingArguments (the number of optimizer steps to train for)",
    )


@row(
    SCRIPT,
    "the policy given as its own reference (TRL)",
    "ValueError: `model` and `ref_model` cannot be the same object.",
    r"`?model`? and `?ref_model`? cannot be the same object",
    "load",
)
def _same_reference(match: re.Match[str], error: BaseException) -> Explained:
    return Explained(
        "the same model object is passed as the policy and as ref_model: the reference must stay frozen while the "
        "policy trains, so it has to be another object",
        "pass ref_model=copy.deepcopy(model), or leave ref_model out (the trainer then loads a frozen copy from the "
        "model's checkpoint), or train with a peft_config (the model without its adapter is the reference)",
    )


@row(
    SCRIPT,
    "GRPO generations per prompt that do not divide the batch",
    "ValueError: generation_batch_size (6) must be divisible by num_generations (8).",
    r"(generation_batch_size|global train batch size)[^0-9]*\(?(?:\d+ x )?(\d+)\)?.*divisible by (?:the number of "
    r"generations per prompt|num_generations) \((\d+)\)",
    "load",
)
def _grpo_groups(match: re.Match[str], error: BaseException) -> Explained:
    batch, generations = int(match.group(2)), int(match.group(3))
    divisors = [str(number) for number in range(2, batch + 1) if batch % number == 0]
    multiple = generations * max(1, -(-batch // generations))
    whole = math.lcm(generations, batch)  # generation_batch_size holds whole groups and whole training batches
    return Explained(
        f"GRPO samples num_generations={generations} completions of each prompt and scores them as a group, so a "
        f"generation batch must hold whole groups, but it holds {batch} completions "
        "(per_device_train_batch_size x gradient_accumulation_steps x processes, or generation_batch_size)",
        f"make the generation batch a multiple of {generations} (e.g. per_device_train_batch_size={multiple} or "
        f"generation_batch_size={whole})"
        + (f", or set num_generations to a divisor of {batch} ({', '.join(divisors)})" if divisors else ""),
    )


@row(
    SCRIPT,
    "masked-LM collator with a tokenizer without a mask token",
    "ValueError: This tokenizer does not have a mask token which is necessary for masked language modeling.",
    r"does not have a mask token which is necessary for masked language modeling",
    "load",
)
def _mlm_without_mask(match: re.Match[str], error: BaseException) -> Explained:
    return Explained(
        "DataCollatorForLanguageModeling masks tokens by default (mlm=True, for BERT-style models), and this "
        "tokenizer has no mask token: it is a causal LM's tokenizer",
        "for a causal LM pass DataCollatorForLanguageModeling(tokenizer, mlm=False), which makes labels from "
        "input_ids; for masked LM use a tokenizer with a mask token",
    )


@row(
    SCRIPT,
    "load_best_model_at_end with save and eval at different times",
    "ValueError: --load_best_model_at_end requires the save and eval strategy to match",
    r"(?s)load_best_model_at_end requires the save and eval strategy to match.*Evaluation strategy: "
    r"(?:\w+\.)?(\w+).*Save strategy: (?:\w+\.)?(\w+)",
    "load",
)
def _best_model_strategies(match: re.Match[str], error: BaseException) -> Explained:
    evaluate, save = match.group(1).lower(), match.group(2).lower()
    return Explained(
        f"load_best_model_at_end keeps the checkpoint of the best evaluation, but the script evaluates by {evaluate!r}"
        f" and saves by {save!r}, so the best evaluation may have no checkpoint",
        f"save when you evaluate: save_strategy={evaluate!r} (with save_steps equal to eval_steps for 'steps'), or "
        "drop load_best_model_at_end",
    )


@row(
    SCRIPT,
    "load_best_model_at_end with save steps not a multiple of eval steps",
    "ValueError: --load_best_model_at_end requires the saving steps to be a round multiple of the evaluation steps",
    r"load_best_model_at_end requires the sav\w* steps to be a round multiple of the evaluation steps, but found "
    r"(\d+), which is not a round multiple of (\d+)",
    "load",
)
def _best_model_steps(match: re.Match[str], error: BaseException) -> Explained:
    save, evaluate = int(match.group(1)), int(match.group(2))
    nearest = max(evaluate, round(save / evaluate) * evaluate)
    return Explained(
        f"load_best_model_at_end keeps the checkpoint of the best evaluation, but checkpoints every {save} steps "
        f"miss most evaluations every {evaluate} steps",
        f"make save_steps a multiple of eval_steps: save_steps={nearest} (or eval_steps={save}), or drop "
        "load_best_model_at_end",
    )


_UNEXPECTED = r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'"


def _arguments_class(name: str) -> bool:
    return name.endswith(("Arguments", "Config"))


@row(
    SCRIPT,
    "an argument transformers 5 or TRL 1.x renamed or removed (TrainingArguments and the TRL configs)",
    "TypeError: TrainingArguments.__init__() got an unexpected keyword argument 'evaluation_strategy'",
    _UNEXPECTED,
    "load",
)
def _renamed_argument(match: re.Match[str], error: BaseException) -> Explained | None:
    from pytest_trainer import renames

    where, old = match.group(1), match.group(2)
    if not isinstance(error, TypeError) or not _arguments_class(where):
        return None
    change = renames.CONFIG_FIELDS.get(where, {}).get(old) or renames.ARGUMENTS.get(old)
    if change is None:
        return None
    library = "trl" if change.release.startswith("TRL") else "transformers"
    return Explained(
        f"{change.told(where)}; this machine has {renames.library_release(library)}, and the script was written for "
        "an older release",
        change.fix(f"{where}(...)"),
    )


@row(
    SCRIPT,
    "a trainer argument renamed, or moved into the TRL config",
    "TypeError: Trainer.__init__() got an unexpected keyword argument 'tokenizer'",
    _UNEXPECTED,
    "load",
)
def _renamed_trainer_argument(match: re.Match[str], error: BaseException) -> Explained | None:
    from pytest_trainer import renames

    where, old = match.group(1), match.group(2)
    if not isinstance(error, TypeError) or not where.endswith("Trainer"):
        return None
    change = renames.TRAINER_ARGUMENTS.get(where, {}).get(old) or renames.TRAINER_ARGUMENTS["*"].get(old)
    if change is not None:
        return Explained(
            f"{change.told(where)} (this machine has {renames.library_release('transformers')}, "
            f"{renames.library_release('trl')})",
            change.fix(f"{where}(...)"),
        )
    config, moved = renames.MOVED_TO_CONFIG.get(where, ("", ()))
    if old not in moved:
        return None
    return Explained(
        f"{where} takes no {old!r} since TRL 0.13: the trainer's settings moved into its {config} (this machine has "
        f"{renames.library_release('trl')})",
        f"set it in the config: args = {config}(..., {old}=...), and pass {where}(..., args=args)",
    )


@row(
    SCRIPT,
    "a from_pretrained keyword transformers 5 removed",
    "TypeError: LlamaForCausalLM.__init__() got an unexpected keyword argument 'load_in_4bit'",
    _UNEXPECTED,
    "load",
)
def _renamed_loading_keyword(match: re.Match[str], error: BaseException) -> Explained | None:
    from pytest_trainer import renames

    where, old = match.group(1), match.group(2)
    change = renames.LOADING.get(old)
    if not isinstance(error, TypeError) or change is None or _arguments_class(where) or where.endswith("Trainer"):
        return None
    return Explained(
        f"from_pretrained passed {old!r} on to {where}, which does not take it: "
        f"{change.told('from_pretrained')} (this machine has {renames.library_release('transformers')})",
        change.fix("from_pretrained(...)"),
    )


@row(
    SCRIPT,
    "a name transformers 5 or TRL 1.x no longer exports",
    "ImportError: cannot import name 'DataCollatorForCompletionOnlyLM' from 'trl'",
    r"cannot import name '(\w+)' from '([\w.]+)'",
    "load",
)
def _removed_import(match: re.Match[str], error: BaseException) -> Explained | None:
    from pytest_trainer import renames

    name, module = match.group(1), match.group(2)
    change = renames.IMPORTS.get(name)
    if change is None or not isinstance(error, ImportError):
        return None
    library = module.split(".")[0]
    return Explained(
        f"{module} has no {name!r} since {change.release} (this machine has {renames.library_release(library)})",
        change.new if change.new.startswith("from ") or not change.renamed else f"import {change.new} instead",
    )


@row(
    SCRIPT,
    "a TRL trainer given plain TrainingArguments",
    "AttributeError: 'TrainingArguments' object has no attribute 'model_init_kwargs'",
    r"'(TrainingArguments|\w+Config)' object has no attribute '(\w+)'",
    "load",
)
def _trl_arguments(match: re.Match[str], error: BaseException) -> Explained | None:
    given = match.group(1)
    trainer = _local_of_type(error, "self", lambda value: type(value).__name__.endswith("Trainer"))
    if trainer is None or not _raised_in(error, "/trl/"):
        return None
    name = type(trainer).__name__
    wanted = name.replace("Trainer", "Config")
    if given == wanted:
        return None
    return Explained(
        f"{name} was given a {given}, which has no {match.group(2)!r}: each TRL trainer reads its own config's "
        f"settings, and {name} takes a {wanted}",
        f"args = {wanted}(output_dir=..., ...) with the same settings (it is a TrainingArguments too), and pass "
        f"{name}(..., args=args)",
    )


@row(
    SCRIPT,
    "a tokenizer without a chat template",
    "ValueError: Cannot use chat template functions because tokenizer.chat_template is not set and no template "
    "argument was passed!",
    r"chat_template is not set",
    "load",
)
def _no_chat_template(match: re.Match[str], error: BaseException) -> Explained:
    trainer = _local_of_type(error, "self", lambda value: type(value).__name__.endswith("Trainer"))
    who = type(trainer).__name__ if trainer is not None else "the script"
    tokenizer = _local_of_type(error, "processing_class", lambda value: hasattr(value, "chat_template"))
    name = getattr(tokenizer, "name_or_path", "")
    return Explained(
        f"{who} renders conversations with the tokenizer's chat template, and the tokenizer"
        f"{f' of {name}' if name else ''} has none (a base model's tokenizer comes without one)",
        "use the tokenizer of the instruct model of that family (AutoTokenizer.from_pretrained(<its -Instruct "
        "checkpoint>)), or copy its template and special tokens: model, tokenizer, _ = "
        "trl.clone_chat_template(model, tokenizer, <an instruct checkpoint>); tokenizer.chat_template = '...' sets "
        "one by hand",
    )


@row(
    SCRIPT,
    "a tokenizer without a pad token, asked to pad",
    "ValueError: Asking to pad but the tokenizer does not have a padding token. Please select a token to use as "
    "`pad_token` ...",
    r"Asking to pad but the tokenizer does not have a padding token",
    "load",
)
def _no_pad_token(match: re.Match[str], error: BaseException) -> Explained:
    tokenizer = _local_of_type(error, "self", lambda value: hasattr(value, "special_tokens_map"), innermost=True)
    special = dict(getattr(tokenizer, "special_tokens_map", None) or {})
    listed = ", ".join(f"{name} {value!r}" for name, value in special.items() if isinstance(value, str))
    extra = [token for token in special.get("additional_special_tokens") or [] if "pad" in str(token).lower()]
    spare = next(iter(extra), None) or special.get("unk_token")
    own = (
        f"tokenizer.pad_token = {spare!r}"
        if spare
        else "tokenizer.add_special_tokens({'pad_token': '<pad>'}), then model.resize_token_embeddings(len(tokenizer))"
    )
    return Explained(
        "the script pads with a tokenizer that has no pad token (a causal LM's tokenizer comes without one)"
        + (f"; its special tokens are {listed}" if listed else ""),
        f"give it a pad token before the line above, one that is not its end of sequence: {own} (with pad = eos, a "
        "language-model collator masks every end of sequence out of the labels, and the model never learns to stop)",
    )


#: What a feature extractor says of audio at another rate than its own: its rate, then the audio's.
SAMPLING_RATE = (
    r"was trained using a sampling rate of (\d+)\. Please make sure that the provided `?\w+`? input was sampled "
    r"with \d+ and not (\d+)"
)


@row(
    SCRIPT,
    "audio at another sampling rate than the feature extractor's",
    "ValueError: The model corresponding to this feature extractor: WhisperFeatureExtractor was trained using a "
    "sampling rate of 16000. Please make sure that the provided `raw_speech` input was sampled with 16000 and not "
    "8000.",
    SAMPLING_RATE,
    "load",
)
def _sampling_rate(match: re.Match[str], error: BaseException) -> Explained:
    return sampling_rate(match)


def sampling_rate(match: re.Match[str]) -> Explained:
    """Audio at another rate than the feature extractor's, from the rates its message gives."""
    wanted, given = match.group(1), match.group(2)
    return Explained(
        f"the audio is sampled at {given} Hz, and the feature extractor reads audio sampled at {wanted} Hz: at "
        "another rate, every sound it hears is stretched or squeezed",
        f"resample the audio column before the line above: dataset = dataset.cast_column('audio', "
        f"datasets.Audio(sampling_rate={wanted})), then pass sampling_rate={wanted} to the feature extractor",
    )


@row(
    SCRIPT,
    "a column the dataset does not have",
    "KeyError: 'sentence' (the script's map or row reading a column of a datasets.Dataset)",
    r"",
    "load",
)
def _missing_column(match: re.Match[str], error: BaseException) -> Explained | None:
    key = error.args[0] if isinstance(error, KeyError) and error.args else None
    if not isinstance(key, str) or _raised_in(error, "/trl/") or not _raised_in(error, "/datasets/"):
        return None
    columns = _columns(error)
    if not columns or key in columns:
        return None
    near = difflib.get_close_matches(key, columns, n=1, cutoff=0.5)
    read = f"read one of its columns ({near[0]!r} is the nearest name)" if near else "read one of its columns"
    return Explained(
        f"the dataset has no column {key!r}: its columns are {', '.join(map(repr, columns))}",
        f"{read} at the script's line above, or rename the column where the data is made: "
        f"dataset = dataset.rename_column({(near or columns)[0]!r}, {key!r})",
    )


def _columns(error: BaseException) -> list[str] | None:
    """The columns of the innermost datasets' Dataset, batch or row along the error's traceback."""
    found = None
    trace: types.TracebackType | None = error.__traceback__
    while trace is not None:
        for value in trace.tb_frame.f_locals.values():
            if not type(value).__module__.startswith("datasets."):
                continue
            try:
                names = getattr(value, "column_names", None)
                if names is None and type(value).__name__ in ("LazyBatch", "LazyRow"):
                    names = list(value.keys())
            except Exception:  # an object of datasets that cannot say its columns: not this one
                continue
            if isinstance(names, list) and all(isinstance(name, str) for name in names):
                found = names
        trace = trace.tb_next
    return found


# ---- devices: a tensor on another device than the batch, CUDA asked for on a machine without it --------------------

#: What torch says where one operation meets tensors on two devices: CUDA's words, then another device's (meta's).
DEVICES_MET = (
    r"Expected all tensors to be on the same device|is not on the expected device"
    r"|indices should be either on cpu or on the same device"
)
#: What torch says where the script asks for CUDA, or pinned memory, on a machine without a GPU.
NO_CUDA = (
    r"Torch not compiled with CUDA enabled|Found no NVIDIA driver|No CUDA GPUs are available|Cannot access accelerator"
)


def placement(error: BaseException) -> Explained | None:
    """The tensor of the user's code on another device than what it meets, its line and the line that made it."""
    import torch

    message = str(error)
    found = re.search(
        r"other tensors on ([\w:]+)|on the expected device ([\w:]+)|same device as the indexed tensor \(([\w:]+)\)",
        message,
    )
    frame = _users_frame(error)
    if found is None or frame is None:
        return None
    try:
        expected = torch.device(next(group for group in found.groups() if group))
    except (RuntimeError, ValueError):  # a device torch does not know by that name here
        return None
    off, reference = _off_device(frame.f_locals, expected)
    if not off:
        return None
    name, device = off[0]
    where = f"{_file_name(frame)}:{frame.f_lineno}"
    made = _made_at(frame.f_code.co_filename, name.removeprefix("self."))
    return Explained(
        f"{name} is on {device}, and what it meets at {where} is on {expected}: a tensor made on one device (or with "
        "none, which is the CPU) where the model and the batch are on another"
        + (f"; {name} is made at {made}" if made else ""),
        f"put it where it is used on the device of what it meets: {name}.to({reference or 'model'}.device); a tensor "
        "every step needs is better a buffer of the model (model.register_buffer(...)), which the Trainer moves "
        "with the model",
    )


def cuda_asked(error: BaseException) -> Explained | None:
    """The user's line that asks for CUDA (or pinned memory) on a machine without a GPU."""
    frame = _users_frame(error)
    if frame is None:
        return None
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    pinned = "accelerator" in str(error)
    return Explained(
        f"the script's {'pinned memory needs' if pinned else 'code puts a tensor or the model on'} a GPU at "
        f"{_file_name(frame)}:{frame.f_lineno} (`{text}`), and this machine has none",
        "leave the devices to the Trainer, which moves the model and each batch: drop "
        + ("the .pin_memory() (dataloader_pin_memory=True pins where a GPU is)" if pinned else "the .cuda() or "
           "device='cuda'")
        + ", or take the device from what the tensor meets (tensor.to(logits.device), model.device)",
    )  # fmt: skip


@row(SCRIPT, "CUDA asked for on a machine without a GPU", "AssertionError: Torch not compiled with CUDA enabled",
     NO_CUDA, "load")  # fmt: skip
def _cuda_asked(match: re.Match[str], error: BaseException) -> Explained | None:
    return cuda_asked(error)


def _users_frame(error: BaseException) -> types.FrameType | None:
    """The innermost frame of the user's own code along the error's traceback."""
    found = None
    trace: types.TracebackType | None = error.__traceback__
    while trace is not None:
        if frames.is_users(trace.tb_frame.f_code.co_filename):
            found = trace.tb_frame
        trace = trace.tb_next
    return found


def _file_name(frame: types.FrameType) -> str:
    return Path(frame.f_code.co_filename).name


def _off_device(local: dict[str, Any], expected: Any) -> tuple[list[tuple[str, str]], str | None]:
    """The tensors (and modules) among a frame's locals and its `self`'s attributes on another device than
    `expected`, by name, and the name of one local tensor on `expected` (what they meet)."""
    import torch

    def device_of(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.device
        if isinstance(value, torch.nn.Module):
            held = next(itertools.chain(value.parameters(), value.buffers()), None)
            return held.device if held is not None else None
        return None

    named = [(name, value) for name, value in local.items() if name != "self"]
    owner = local.get("self")
    if owner is not None and hasattr(owner, "__dict__"):  # a Trainer's, or a model's tensor not made a buffer
        named += [(f"self.{name}", value) for name, value in vars(owner).items() if name != "model"]
    off = [(name, str(device)) for name, value in named if (device := device_of(value)) not in (None, expected)]
    met = [name for name, value in named if isinstance(value, torch.Tensor) and value.device == expected]
    return off, next((name for name in met if "logits" in name), next(iter(met), None))


def _made_at(path: str, name: str) -> str | None:
    """Where the script's file assigns `name` first: `file:line` and the line."""
    assigned = re.compile(rf"^\s*(self\.)?{re.escape(name)}\s*=[^=]")
    for number, line in enumerate(linecache.getlines(path), start=1):
        if assigned.search(line):
            return f"{Path(path).name}:{number} (`{line.strip()}`)"
    return None


# ---- what the script rows read from the traceback ---------------------------------------------------------------


def _is_module(value: Any) -> bool:
    import torch

    return isinstance(value, torch.nn.Module)


def _raised_in(error: BaseException, part: str) -> bool:
    """Whether the error passed through code whose file path holds `part`."""
    trace = error.__traceback__
    while trace is not None:
        if part in trace.tb_frame.f_code.co_filename.replace("\\", "/"):
            return True
        trace = trace.tb_next
    return False


def _local_of_type(error: BaseException, name: str, accept: Callable[[Any], bool], innermost: bool = False) -> Any:
    """A frame's local `name` that `accept` takes along the error's traceback: the outermost, or the innermost."""
    found = None
    trace: types.TracebackType | None = error.__traceback__
    while trace is not None:
        value = trace.tb_frame.f_locals.get(name)
        if value is not None and accept(value):
            if not innermost:
                return value
            found = value
        trace = trace.tb_next
    return found


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


@row(
    SCRIPT,
    "an assistant-only loss on a chat template TRL cannot mark",
    "ValueError: The chat template is not training-compatible (missing prefix-preservation or `{% generation %}` "
    "markers) and patching is not supported for this template.",
    r"chat template is not training-compatible",
    "load",
)
def _template_not_markable(match: re.Match[str], error: BaseException) -> Explained | None:
    if not _raised_in(error, "/trl/"):
        return None
    return Explained(
        "assistant_only_loss=True needs a chat template that marks the assistant's turns with {% generation %} ... "
        "{% endgeneration %}; this tokenizer's template has no such marks, and TRL adds them only to the templates "
        "on its list, word for word (trl.chat_template_utils: some Qwen, Llama 3, Phi-3 and other checkpoints' own)",
        "wrap the assistant's content in {% generation %} ... {% endgeneration %} in the template (or use a "
        "template on TRL's list unedited); or give prompt-completion data (prompt and completion columns), whose "
        "loss is on the completion alone (completion_only_loss, TRL's default there)",
    )

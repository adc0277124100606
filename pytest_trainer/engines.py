"""Engines a script's training arguments ask for that this machine cannot run, turned off before the arguments are
checked, with the line that says what is then not exercised.

- vLLM, which an online RL trainer samples its completions with (`use_vllm=True`): without it, or without a GPU, the
  trainer samples with the model's own `generate`.
- DeepSpeed (`deepspeed=` a config file, a dict or its base64 text): transformers refuses the arguments where DeepSpeed
  is not installed, and DeepSpeed trains on GPUs. Without it the Trainer takes the same steps with its own optimizer
  and DDP. A working config leaves the batch, the precision and the optimizer's settings to the arguments (`"auto"`)
  or repeats them, so the items check what DeepSpeed would be given; a config that sets them otherwise stops
  `trainer.train()` on the GPU machine, which the load item reports (`check_deepspeed_matches`).
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_trainer import diagnosis
from pytest_trainer.catalogue import SETTINGS, checks

#: The DeepSpeed config's keys that transformers fills from TrainingArguments where they say "auto" and otherwise
#: holds to them (`HfTrainerDeepSpeedConfig.trainer_config_process`): the argument and its value (fp16 and bf16 count
#: their _full_eval twins, as transformers does). `train_batch_size` counts the processes of the real run: it is held
#: to them where the script's launcher says how many (`check_deepspeed_matches`).
MATCHED: tuple[tuple[str, str, Any], ...] = (
    ("train_micro_batch_size_per_gpu", "per_device_train_batch_size", lambda args: args.per_device_train_batch_size),
    ("gradient_accumulation_steps", "gradient_accumulation_steps", lambda args: args.gradient_accumulation_steps),
    ("gradient_clipping", "max_grad_norm", lambda args: args.max_grad_norm),
    ("optimizer.params.lr", "learning_rate", lambda args: args.learning_rate),
    ("optimizer.params.betas", "[adam_beta1, adam_beta2]", lambda args: [args.adam_beta1, args.adam_beta2]),
    ("optimizer.params.eps", "adam_epsilon", lambda args: args.adam_epsilon),
    ("optimizer.params.weight_decay", "weight_decay", lambda args: args.weight_decay),
    ("scheduler.params.warmup_max_lr", "learning_rate", lambda args: args.learning_rate),
    ("fp16.enabled", "fp16", lambda args: bool(args.fp16 or args.fp16_full_eval)),
    ("bf16.enabled", "bf16", lambda args: bool(args.bf16 or args.bf16_full_eval)),
)


#: How a DeepSpeed config given other than as a file is named.
GIVEN = ("a dict", "JSON text", "base64 text")


class EngineError(Exception):
    """What the script asks of an engine cannot be read: the script's fault, said as such."""

    def __init__(self, cause: str, fix: str) -> None:
        self.cause, self.fix = cause, fix
        super().__init__(cause)


@dataclass(frozen=True)
class DeepSpeed:
    """The DeepSpeed config a script's arguments ask for, as its run would take it."""

    config: dict[str, Any]
    #: The ZeRO stage (0: nothing sharded).
    stage: int
    #: The mixed precision it trains in, in which DeepSpeed steps float32 master weights (`master_weights`), or None.
    master_weights: str | None


@dataclass
class Engines:
    """What the engines one TrainingArguments asks for come to on this machine."""

    #: One line for each engine turned off, saying what is then not exercised.
    unexercised: list[str] = field(default_factory=list)
    #: What an engine's config gets wrong that stops the real run, for the load item.
    findings: list[diagnosis.Finding] = field(default_factory=list)
    #: The DeepSpeed config the arguments ask for, run here or not (None: they ask for none).
    deepspeed: DeepSpeed | None = None


def for_this_machine(args: Any, processes: int | None = None) -> Engines:
    """Turn off, in `args` (the script's arguments, before transformers checks them), the engines this machine cannot
    run; say what is then not exercised, and what their configs get wrong (`processes`: how many the script's
    launcher starts, where it says)."""
    found = Engines()
    vllm = _vllm(args)
    if vllm:
        found.unexercised.append(vllm)
    asked = getattr(args, "deepspeed", None)
    if asked:
        config, name = read_config(asked)
        found.deepspeed = DeepSpeed(config, zero_stage(config), master_weights(config, args))
        mismatched = check_deepspeed_matches(config, name, args, processes)
        if mismatched is not None:
            found.findings.append(mismatched)
        line = _deepspeed(args, config, name)
        if line:
            found.unexercised.append(line)
    return found


def _missing(package: str, name: str) -> str | None:
    """Why `package` cannot run here (not installed, or no GPU), or None where it can."""
    import torch

    if importlib.util.find_spec(package) is None:
        return f"{name} is not installed"
    if not torch.cuda.is_available():
        return "this machine has no GPU"
    return None


def _vllm(args: Any) -> str | None:
    if not getattr(args, "use_vllm", False):
        return None
    missing = _missing("vllm", "vLLM")
    if missing is None:
        return None
    args.use_vllm = False
    return (
        f"the script asks for use_vllm=True; {missing}, so completions are sampled with the model's own "
        "generate (the script's generation settings) and vLLM itself is not exercised"
    )


def _deepspeed(args: Any, config: dict[str, Any], name: str) -> str | None:
    missing = _missing("deepspeed", "DeepSpeed")
    if missing is None:
        return None
    args.deepspeed = None
    return (
        f"the script asks for DeepSpeed ({name}{describe(config)}); {missing}, so the Trainer takes its steps without "
        "it, with its own optimizer: DeepSpeed's engine, ZeRO's sharding and offload and its checkpoints are not "
        "exercised"
    )


def read_config(asked: Any) -> tuple[dict[str, Any], str]:
    """A DeepSpeed config as TrainingArguments takes it (a dict, a JSON file, its JSON text or base64 text of it) and
    how the script gave it (the file's path, else one of GIVEN); an EngineError where it is none of these, as
    transformers would refuse it on the GPU machine."""
    if isinstance(asked, dict):
        return asked, "a dict"
    text = str(asked)
    try:
        is_file = Path(text).is_file()
    except OSError:  # base64 text longer than a file name may be
        is_file = False
    if is_file:
        try:
            found = json.loads(Path(text).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise EngineError(
                f"the DeepSpeed config {text} that TrainingArguments(deepspeed=...) names is not valid JSON: {error}",
                f"fix the JSON of {text}",
            ) from error
        if not isinstance(found, dict):
            raise EngineError(
                f"the DeepSpeed config {text} that TrainingArguments(deepspeed=...) names holds a JSON "
                f"{type(found).__name__}, not an object of settings",
                f'write {text} as one JSON object: {{"zero_optimization": {{"stage": 2}}, ...}}',
            )
        return found, text
    for decoded, how in ((text, "JSON text"), (_base64(text), "base64 text")):
        try:
            found = json.loads(decoded) if decoded else None
        except json.JSONDecodeError:
            found = None
        if isinstance(found, dict):
            return found, how
    raise EngineError(
        f"the DeepSpeed config {text} that TrainingArguments(deepspeed=...) names is not found from the working "
        f"directory {os.getcwd()}: on the GPU machine transformers stops there",
        "give the config's path from the directory the script is launched in (or an absolute path), or a dict",
    )


def _base64(text: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(text).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def _config_named(name: str) -> str:
    """`the DeepSpeed config ds.json`, `the DeepSpeed config (a dict)`."""
    return f"the DeepSpeed config ({name})" if name in GIVEN else f"the DeepSpeed config {name}"


def describe(config: dict[str, Any]) -> str:
    """`: ZeRO stage 3, parameters and optimizer states offloaded to the CPU`, or nothing where the config says none."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict):
        return ""
    parts = [f"ZeRO stage {zero['stage']}"] if "stage" in zero else []
    offloaded = [
        (what, str(setting.get("device")))
        for key, what in (("offload_param", "parameters"), ("offload_optimizer", "optimizer states"))
        if isinstance(setting := zero.get(key), dict) and setting.get("device") not in (None, "none")
    ]
    for device in dict.fromkeys(device for _, device in offloaded):
        things = " and ".join(what for what, to in offloaded if to == device)
        parts.append(f"{things} offloaded to {device if device == 'nvme' else 'the ' + device.upper()}")
    return f": {', '.join(parts)}" if parts else ""


@checks("load", reads=SETTINGS)
def check_deepspeed_matches(
    config: dict[str, Any], name: str, args: Any, processes: int | None = None
) -> diagnosis.Finding | None:
    """The DeepSpeed config's batch, clipping, optimizer and precision settings are "auto" or the arguments' own (the
    whole batch, `train_batch_size`, where the launcher says how many processes share it)."""
    differ = []
    matched = list(MATCHED)
    if processes:
        matched.append(
            (
                "train_batch_size",
                f"{processes} processes x per_device_train_batch_size x gradient_accumulation_steps",
                lambda args: processes * args.per_device_train_batch_size * args.gradient_accumulation_steps,
            )
        )
    for key, argument, value_of in matched:
        *parents, leaf = key.split(".")
        node: Any = config
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        given = node.get(leaf) if isinstance(node, dict) else None
        if given is None or given == "auto":
            continue
        if key in ("train_micro_batch_size_per_gpu", "train_batch_size") and getattr(
            args, "auto_find_batch_size", False
        ):
            continue  # transformers does not hold it to the arguments then
        try:
            wanted = value_of(args)
        except AttributeError:  # arguments of another shape: transformers would say so itself
            continue
        if given != wanted:
            differ.append(f"{key}={given!r} in the config, {argument}={wanted!r} in the arguments")
    if not differ:
        return None
    keys = ", ".join(dict.fromkeys(line.split("=")[0] for line in differ))
    return diagnosis.Finding(
        f"{_config_named(name)} sets {len(differ)} value{'s' if len(differ) > 1 else ''} the TrainingArguments "
        f'set otherwise ({"; ".join(differ)}): on the GPU machine trainer.train() stops with "Please correct the '
        'following DeepSpeed config values that mismatch TrainingArguments values"',
        f'set {keys} to "auto" in {name if name not in GIVEN else "the config"}, so that DeepSpeed takes the '
        "arguments' values, or give both the same value",
    )


def zero_stage(config: dict[str, Any]) -> int:
    """The ZeRO stage a DeepSpeed config asks for (DeepSpeed's default, 0, where it names none or none it reads)."""
    zero = config.get("zero_optimization")
    try:
        return int(zero.get("stage", 0)) if isinstance(zero, dict) else 0
    except (TypeError, ValueError):
        return 0


def master_weights(config: dict[str, Any], args: Any) -> str | None:
    """The mixed precision a DeepSpeed config trains in ("bf16", "fp16"), in which DeepSpeed steps float32 master
    copies of the weights, or None, from the script's own arguments: enabled in the config; "auto", which transformers
    fills from the arguments' flag (`bf16`, or `bf16_full_eval`); or left out, which accelerate fills from the mixed
    precision of the arguments or of the launcher (ACCELERATE_MIXED_PRECISION)."""
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").lower()
    for name in ("bf16", "fp16"):
        flagged = bool(getattr(args, name, False) or getattr(args, f"{name}_full_eval", False))
        section = config.get(name)
        enabled = section.get("enabled") if isinstance(section, dict) else None
        if enabled is True or (enabled == "auto" and flagged) or (section is None and (flagged or launched == name)):
            return name
    return None

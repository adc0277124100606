"""A DeepSpeed config as TrainingArguments takes it, read without DeepSpeed, and what it asks for in a line."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_trainer.engines import (
    EngineError,
    check_deepspeed_matches,
    describe,
    master_weights,
    read_config,
    zero_stage,
)

#: DeepSpeed's ZeRO-3 example with both offloads, as transformers' docs give it (trimmed).
ZERO_3 = {
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
    },
    "bf16": {"enabled": "auto"},
    "train_micro_batch_size_per_gpu": "auto",
}


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (ZERO_3, ": ZeRO stage 3, parameters and optimizer states offloaded to the CPU"),
        ({"zero_optimization": {"stage": 2}}, ": ZeRO stage 2"),
        (
            {
                "zero_optimization": {
                    "stage": 3,
                    "offload_param": {"device": "nvme"},
                    "offload_optimizer": {"device": "cpu"},
                }
            },
            ": ZeRO stage 3, parameters offloaded to nvme, optimizer states offloaded to the CPU",
        ),
        ({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "none"}}}, ": ZeRO stage 1"),
        ({"fp16": {"enabled": "auto"}}, ""),
    ],
)
def test_a_config_is_described_by_its_zero_stage_and_offload(config: dict, said: str) -> None:
    assert describe(config) == said


def test_a_config_is_read_from_a_file_a_dict_or_base64_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("ds.json").write_text(json.dumps(ZERO_3))
    assert read_config("ds.json") == (ZERO_3, "ds.json")
    assert read_config(ZERO_3) == (ZERO_3, "a dict")
    assert read_config(json.dumps(ZERO_3)) == (ZERO_3, "JSON text")
    text = base64.urlsafe_b64encode(json.dumps(ZERO_3).encode()).decode()
    assert read_config(text) == (ZERO_3, "base64 text")


def test_a_config_not_found_or_not_json_is_the_scripts_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EngineError) as missing:
        read_config("configs/ds_z3.json")
    assert missing.value.cause == (
        "the DeepSpeed config configs/ds_z3.json that TrainingArguments(deepspeed=...) names is not found from the "
        f"working directory {tmp_path}: on the GPU machine transformers stops there"
    )
    Path("broken.json").write_text('{"zero_optimization": {"stage": 3,}}')
    with pytest.raises(EngineError) as broken:
        read_config("broken.json")
    assert broken.value.cause.startswith(
        "the DeepSpeed config broken.json that TrainingArguments(deepspeed=...) names is not valid JSON: "
    )
    assert broken.value.fix == "fix the JSON of broken.json"
    Path("list.json").write_text("[1, 2]")
    with pytest.raises(EngineError) as listed:
        read_config("list.json")
    assert listed.value.cause == (
        "the DeepSpeed config list.json that TrainingArguments(deepspeed=...) names holds a JSON list, not an object "
        "of settings"
    )


def arguments(**changed: object) -> SimpleNamespace:
    """TrainingArguments' defaults for what the DeepSpeed config is held to, with `changed`."""
    defaults = {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "max_grad_norm": 1.0,
        "learning_rate": 5e-5,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "weight_decay": 0.0,
        "fp16": False,
        "fp16_full_eval": False,
        "bf16": False,
        "bf16_full_eval": False,
        "auto_find_batch_size": False,
    }
    return SimpleNamespace(**{**defaults, **changed})


def test_a_config_that_leaves_the_settings_to_the_arguments_or_repeats_them_passes() -> None:
    assert check_deepspeed_matches(ZERO_3, "ds.json", arguments(bf16=True)) is None
    repeated = {
        **ZERO_3,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 8,
        "gradient_clipping": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    }
    same = arguments(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=8,
        bf16=True,
        learning_rate=2e-5,
        adam_beta2=0.95,
        weight_decay=0.1,
    )
    assert check_deepspeed_matches(repeated, "ds.json", same) is None
    # transformers does not hold the micro-batch to the arguments where it searches for a batch size
    searched = arguments(per_device_train_batch_size=64, auto_find_batch_size=True)
    assert check_deepspeed_matches({"train_micro_batch_size_per_gpu": 16}, "ds.json", searched) is None


def test_a_config_that_sets_them_otherwise_is_found_naming_each_value_and_the_fix() -> None:
    config = {**ZERO_3, "gradient_accumulation_steps": 4, "bf16": {"enabled": True}, "fp16": {"enabled": "auto"}}
    found = check_deepspeed_matches(config, "configs/ds_z3.json", arguments())
    assert found is not None
    assert found.cause == (
        "the DeepSpeed config configs/ds_z3.json sets 2 values the TrainingArguments set otherwise "
        "(gradient_accumulation_steps=4 in the config, gradient_accumulation_steps=1 in the arguments; "
        "bf16.enabled=True in the config, bf16=False in the arguments): on the GPU machine trainer.train() stops with "
        '"Please correct the following DeepSpeed config values that mismatch TrainingArguments values"'
    )
    assert found.fix.startswith('set gradient_accumulation_steps, bf16.enabled to "auto" in configs/ds_z3.json')
    assert not found.blocks, "the Trainer is built: the other items run"
    given = check_deepspeed_matches({"gradient_clipping": 0.5}, "a dict", arguments())
    assert given is not None and given.cause.startswith("the DeepSpeed config (a dict) sets 1 value ")
    assert given.fix.startswith('set gradient_clipping to "auto" in the config, ')


@pytest.mark.parametrize(
    ("config", "flags", "launched", "precision"),
    [
        ({"bf16": {"enabled": "auto"}}, {"bf16": True}, "no", "bf16"),
        ({"bf16": {"enabled": "auto"}}, {"bf16_full_eval": True}, "no", "bf16"),
        ({"bf16": {"enabled": "auto"}}, {}, "no", None),
        # "auto" follows the arguments' flag alone: a launcher's bf16 leaves DeepSpeed in fp32 (transformers' fill)
        ({"bf16": {"enabled": "auto"}}, {}, "bf16", None),
        ({"bf16": {"enabled": True}}, {}, "no", "bf16"),
        ({"fp16": {"enabled": "auto", "loss_scale": 0}}, {"fp16": True}, "no", "fp16"),
        # left out: accelerate fills it from the mixed precision of the arguments or of the launcher
        ({"zero_optimization": {"stage": 3}}, {"bf16": True}, "no", "bf16"),
        ({"zero_optimization": {"stage": 3}}, {}, "bf16", "bf16"),
        ({"zero_optimization": {"stage": 3}}, {}, "no", None),
        ({"bf16": {"enabled": False}}, {"bf16": True}, "no", None),
    ],
)
def test_deepspeed_steps_master_weights_in_the_mixed_precision_it_trains_in(
    config: dict, flags: dict, launched: str, precision: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launched)
    args = arguments(**flags)
    assert master_weights(config, args) == precision


def test_the_zero_stage_is_read_as_deepspeed_reads_it() -> None:
    assert [zero_stage(config) for config in (ZERO_3, {"zero_optimization": {"stage": "2"}}, {}, {"fp16": {}})] == [
        3,
        2,
        0,
        0,
    ]


def test_the_whole_batch_is_held_to_the_processes_only_where_the_launcher_says_how_many() -> None:
    config = {**ZERO_3, "train_batch_size": 32}
    assert check_deepspeed_matches(config, "ds.json", arguments()) is None  # how many processes share it: unknown
    assert check_deepspeed_matches(config, "ds.json", arguments(), processes=4) is None  # 4 x 8 x 1
    found = check_deepspeed_matches(config, "ds.json", arguments(gradient_accumulation_steps=2), processes=4)
    assert found is not None
    assert (
        "train_batch_size=32 in the config, 4 processes x per_device_train_batch_size x gradient_accumulation_steps"
        "=64 in the arguments" in found.cause
    ), found.cause

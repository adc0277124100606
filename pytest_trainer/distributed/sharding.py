"""FSDP's part that a CPU can exercise: the model's state dict through `fully_shard`, a sharded save and a full reload.

accelerate sets FSDP up for GPU-like devices only: on a CPU the Trainer trains with DDP whatever the script asks.
What breaks most in FSDP runs is the state dict (names with wrapper prefixes, tied weights, a full state dict that
differs from the model's): `torch.distributed.fsdp.fully_shard` runs on gloo, so each rank shards a copy of the
model by the layer classes the script names, saves it with torch.distributed.checkpoint, and loads it back whole.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any


def layers_to_wrap(config: dict[str, Any], model: Any) -> list[str]:
    """The layer classes FSDP wraps one by one: the fsdp_config's `transformer_layer_cls_to_wrap`, else the model's
    `_no_split_modules` (what accelerate falls back to)."""
    named = config.get("transformer_layer_cls_to_wrap") or config.get("fsdp_transformer_layer_cls_to_wrap")
    if isinstance(named, str):
        named = [part.strip() for part in named.split(",") if part.strip()]
    if named:
        return list(named)
    inner = getattr(model, "get_base_model", lambda: model)()
    return list(getattr(inner, "_no_split_modules", None) or [])


def classes_in(model: Any) -> set[str]:
    return {type(module).__name__ for module in model.modules()}


def round_trip(model: Any, layers: list[str], folder: Path) -> dict[str, Any]:
    """Shard a copy of `model` (every module of a class in `layers`, then the whole), save it sharded, load it whole
    into a plain copy; what differs from the model's own state dict."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    expected = {name: value.detach().clone() for name, value in model.state_dict().items()}
    sharded = copy.deepcopy(model)
    units = [module for module in sharded.modules() if type(module).__name__ in layers]
    for module in units:  # fully_shard renames each class (FSDPLlamaDecoderLayer): counted before
        fully_shard(module)
    fully_shard(sharded)
    dcp.save(get_model_state_dict(sharded), checkpoint_id=str(folder))
    dist.barrier()
    reloaded = copy.deepcopy(model)
    target = reloaded.state_dict()
    dcp.load(target, checkpoint_id=str(folder))
    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full: dict[str, Any] = get_model_state_dict(sharded, options=whole)
    found: dict[str, Any] = {"layers": layers, "sharded_units": len(units)}
    found["reload_differs"] = sorted(
        name
        for name, value in expected.items()
        if name not in target or not torch.equal(target[name].cpu(), value.cpu())
    )
    if dist.get_rank() == 0:
        found["full_missing"] = sorted(set(expected) - set(full))
        found["full_extra"] = sorted(set(full) - set(expected))
        found["full_differs"] = sorted(
            name
            for name, value in full.items()
            if name in expected and not torch.equal(value.cpu(), expected[name].cpu())
        )
    return found

"""`backward`: the loss reaches every trainable parameter with a finite gradient."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pytest_trainer import accumulation, adapters, diagnosis, model_facts, schema
from pytest_trainer.catalogue import RUN, checks
from pytest_trainer.losses import detached_loss
from pytest_trainer.stages.base import Stage, StageResult
from pytest_trainer.training import non_finite

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline

#: How many parameter names a message lists before it says "and N more".
SHOWN = 5


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    model = pipeline.model_on(device)
    batch = pipeline.batches.first_on(device)
    trainable = [(name, parameter) for name, parameter in model.named_parameters() if parameter.requires_grad]
    if not trainable:
        raise diagnosis.PipelineFailure(
            "the model has no trainable parameter: every parameter has requires_grad=False, so nothing can learn",
            "unfreeze what should train, e.g. model.requires_grad_(True), or only the head's parameters",
        )
    run = pipeline.fixed_batch_run(device, within=0)  # the gradients the step stage then steps with
    value = run.gradients()
    if not run.attached and pipeline.checkpointing:
        raise _checkpointed_inputs(pipeline, len(trainable), len(trainable))
    if not run.attached:
        raise detached_loss()
    gradients = {name: parameter.grad.detach() for name, parameter in trainable if parameter.grad is not None}
    missing = [name for name, _ in trainable if name not in gradients]
    if missing and pipeline.checkpointing and _inside_checkpoints(missing):
        raise _checkpointed_inputs(pipeline, len(missing), len(trainable), missing)
    broken = non_finite(gradients.items())
    if broken:
        raise diagnosis.PipelineFailure(
            f"non-finite gradients (NaN or inf) in {len(broken)} parameters: {_names(broken)}",
            "look for NaN or infinite inputs or labels, a loss that divides by zero, or fp16 overflow "
            "(use bf16 or a loss scaler)",
        )
    # A model's own parameter on a side branch the loss does not use (LLaVA's vision tower computes a pooled output
    # it never reads) does not train, which DistributedDataParallel accepts where it looks for unused parameters, as
    # the Trainer sets it up by default. Adapters are what the script trains, and a loss that does not reach the
    # input embeddings is cut through the model (a .detach() or no_grad in the forward): those are defects.
    notes = []
    spare = [name for name in missing if not _adapter(name)]
    if spare and _ddp_finds_unused(pipeline) and not set(spare) & _embedding_names(model):
        missing = [name for name in missing if name not in spare]
        notes.append(
            f"{len(spare)} trainable parameters get no gradient from the loss, so they do not train: "
            f"{_names(spare)} (DistributedDataParallel skips them: find_unused_parameters is on)"
        )
    # What follows leaves one process training: findings, which block no later stage and are reported together.
    findings = [
        found
        for found in (
            _unused(missing, len(trainable)),
            check_added_tokens(pipeline, model, batch),
            check_new_heads(pipeline, model),
            check_accumulation(pipeline, model, device),
        )
        if found is not None
    ]
    if findings:
        raise diagnosis.combined(findings)
    notes.insert(0, f"trainable: {trainable_parts([name for name, _ in trainable])}")
    norm = float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in gradients.values()])))
    return StageResult(
        "backward",
        device,
        batch=batch,
        loss=value,
        gradients=gradients,
        measured=schema.Backward(norm, sum(parameter.numel() for _, parameter in trainable)),
        notes=notes,
    )


def _adapter(name: str) -> bool:
    """A parameter PEFT adds for training: LoRA weights, a module saved whole, trainable token rows."""
    return "lora_" in name or ".modules_to_save." in name or "trainable_tokens" in name


def _embedding_names(model: Any) -> set[str]:
    """The names of the input embeddings' parameters (none for a model without get_input_embeddings)."""
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return set()
    if embeddings is None:
        return set()
    owned = {id(parameter) for parameter in embeddings.parameters()}
    return {name for name, parameter in model.named_parameters() if id(parameter) in owned}


def _ddp_finds_unused(pipeline: Pipeline) -> bool:
    """Whether the Trainer's DistributedDataParallel looks for unused parameters (as the Trainer decides it)."""
    from transformers import PreTrainedModel

    asked = getattr(pipeline.trainer.args, "ddp_find_unused_parameters", None)
    if asked is not None:
        return bool(asked)
    if isinstance(pipeline.trainer.model, PreTrainedModel):
        return not pipeline.checkpointing
    return True


def _names(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def trainable_parts(names: list[str]) -> str:
    """What trains, in PEFT's terms where it applies: adapters, saved modules, token rows, other parameters."""
    adapters_in = sorted({match.group(1) for name in names if (match := re.search(r"([^.]+)\.lora_", name))})
    saved = sorted(
        {name.split(".modules_to_save")[0].rsplit(".", 1)[-1] for name in names if ".modules_to_save." in name}
    )
    tokens = [name for name in names if "trainable_tokens" in name]
    other = [
        name
        for name in names
        if "lora_" not in name and ".modules_to_save." not in name and "trainable_tokens" not in name
    ]
    parts = [f"LoRA adapters on {', '.join(adapters_in)}"] if adapters_in else []
    parts += [f"modules_to_save {', '.join(saved)}"] if saved else []
    parts += [f"trainable token rows ({len(tokens)} tensors)"] if tokens else []
    parts += [f"{len(other)} other parameter tensors"] if other else []
    return "; ".join(parts) or "nothing"


def _inside_checkpoints(names: list[str]) -> bool:
    """Adapter or layer weights, the parameters gradient checkpointing wraps (not a head outside the layers)."""
    return any("lora_" in name or ".layers." in name or ".layer." in name or ".h." in name for name in names)


def _checkpointed_inputs(
    pipeline: Pipeline, count: int, total: int, names: list[str] | None = None
) -> diagnosis.PipelineFailure:
    shown = f": {_names(names)}" if names else " (the loss has no grad_fn)"
    return diagnosis.PipelineFailure(
        f"{count} of {total} trainable parameters get no gradient from the loss{shown}: under "
        f"{pipeline.checkpointing}, as Trainer.train() turns it on, the checkpointed layers' inputs do not "
        "require grad, so nothing inside them (the adapters) is trained",
        "call model.enable_input_require_grads() before building the Trainer, or pass "
        "gradient_checkpointing_kwargs={'use_reentrant': False}",
    )


@checks("backward", reads=RUN)
def check_added_tokens(pipeline: Pipeline, model: Any, batch: dict[str, Any]) -> diagnosis.Finding | None:
    """Tokens added to the tokenizer and used in the data need embedding rows that can learn."""
    import torch

    tokenizer = getattr(pipeline.trainer, "processing_class", None)
    ids = batch.get(pipeline.task.sequence or "")
    if tokenizer is None or not torch.is_tensor(ids):
        return None
    added = adapters.new_token_ids(model, tokenizer)
    mask = batch.get("attention_mask")
    real = ids[mask.bool()] if torch.is_tensor(mask) and mask.shape == ids.shape else ids  # padding need not learn
    used = sorted(set(added) & {int(token) for token in real.unique().tolist()}) if added else []
    if not used or not adapters.frozen_rows(model, used):
        return None
    tokens = ", ".join(repr(tokenizer.convert_ids_to_tokens(index)) for index in used[:SHOWN])
    return diagnosis.Finding(
        f"tokens added to the tokenizer ({tokens}, ids {used[:SHOWN]}) are in the batch, but their embedding rows "
        "cannot change: the input embedding is frozen (LoRA trains adapters only), so the model never learns "
        "what they mean",
        f"let them train: LoraConfig(..., trainable_token_indices={used}) or "
        'LoraConfig(..., modules_to_save=["embed_tokens", "lm_head"]) (the module names of your model)',
    )


def _unused(missing: list[str], total: int) -> diagnosis.Finding | None:
    if not missing:
        return None
    return diagnosis.Finding(
        f"{len(missing)} of {total} trainable parameters get no gradient from the loss: {_names(missing)}",
        "if they should not train, freeze them (requires_grad=False); otherwise look for .detach(), "
        "torch.no_grad() or a branch of forward() that leaves them out of the loss. If they must stay unused, "
        "set ddp_find_unused_parameters=True: on several GPUs, DistributedDataParallel otherwise stops at the "
        'second step with "Expected to have finished reduction in the prior iteration"',
    )


@checks("backward", reads=RUN)
def check_new_heads(pipeline: Pipeline, model: Any) -> diagnosis.Finding | None:
    """A newly initialised head (a classifier the checkpoint did not have) that stays frozen keeps random weights."""
    found = adapters.frozen_new_heads(model)
    if found is None:
        return None
    heads, why = found
    count = sum(
        parameter.numel()
        for name, module in model_facts.base_model(model).named_children()
        if name in heads
        for parameter in module.parameters()
    )
    lora = " (PEFT trains its adapters only)" if getattr(model, "peft_config", None) else ""
    return diagnosis.Finding(
        f"the head {', '.join(heads)} ({count} parameters) is newly initialised ({why}) but frozen{lora}: it keeps "
        "its random weights, and the model can only learn to feed a random projection",
        adapters.frozen_head_fix(model, heads, pipeline.task.labels),
    )


@checks("backward", reads=RUN)
def check_accumulation(pipeline: Pipeline, model: Any, device: str) -> diagnosis.Finding | None:
    """Gradient accumulation must not change the loss or gradients of the same samples."""
    trainer = pipeline.trainer
    if int(getattr(trainer.args, "gradient_accumulation_steps", 1) or 1) <= 1 or pipeline.family.unsplittable:
        return None
    batch = pipeline.batches.first_on(device)
    rows = accumulation.rows_of(batch)
    if rows is not None and rows < 2 and len(pipeline.training) > 1:  # one row a batch: collate a few together
        count = min(len(pipeline.training), int(trainer.args.gradient_accumulation_steps))
        batch = pipeline.batches.collate([dict(sample) for sample in pipeline.batches.rows(list(range(count)))], device)
    found = accumulation.compare(trainer, model, batch)
    return accumulation.finding(trainer, model, found) if found is not None else None


STAGE = Stage("backward", rank=50, run=run, needs=("forward",))

"""Packed rows as the model attends to them: each document by itself, as inference will see it.

A packing collator puts several documents in one row and restarts `position_ids` at each; the model must keep each
document's attention within it, or it trains on contexts (the end of another conversation) it will never be given.
transformers separates the documents from `position_ids` only when no attention_mask is passed (flash attention
reads the boundaries it is given); an attention mask of ones over the row lets every token see the documents before
it. The check compares what the model computes for one packed document with the same document alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis, model_facts
from pytest_trainer.catalogue import BATCH, checks

if TYPE_CHECKING:
    import torch

#: Largest difference allowed between a packed document's logits and its own alone, relative to the largest logit
#: (at least 1), in float32: the same computation at two lengths differs far less, leaked attention far more.
TOLERANCE = 1e-4
#: Batch keys the check passes to the model (the others are labels, masks of the loss, or unknown to it: skipped).
INPUTS = ("input_ids", "attention_mask", "position_ids")
#: Keys that mark which tokens are trained, which the model does not take.
LOSS_KEYS = ("labels", "completion_mask", "assistant_masks")
#: Batch keys of the documents' boundaries a packing collator passes to flash attention.
BOUNDARY_KEYS = (
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "max_length_q",
    "max_length_k",
    "seq_lengths",
    "cu_seqlens",
    "seq_idx",
)


@checks("forward", reads=BATCH)
def check_documents_apart(model: torch.nn.Module, batch: dict[str, Any], checkpointing: bool) -> str | None:
    """Raise a finding where a packed document's logits differ from the same document alone; return a note (or None
    where the batch packs nothing this check can read). The forward builds a cache as training's does: none under
    activation checkpointing (`checkpointing`), else as the model's config says."""
    import torch

    ids, positions = batch.get("input_ids"), batch.get("position_ids")
    if not torch.is_tensor(ids) or not torch.is_tensor(positions) or ids.dim() != 2 or positions.shape != ids.shape:
        return None
    if set(batch) - {*INPUTS, *LOSS_KEYS, *BOUNDARY_KEYS}:
        return None  # other inputs (images, token types) this check does not know how to cut
    starts = [int(start) for start in torch.nonzero(positions[0] == 0).flatten()]
    ends = [*starts[1:], ids.shape[1]]
    documents = [(start, end) for start, end in zip(starts, ends, strict=True) if end - start > 1]
    if len(documents) < 2 or documents[1][0] == 0:
        return None
    start, end = documents[1]
    given: dict[str, Any] = {key: value[:1] for key, value in batch.items() if key in INPUTS and torch.is_tensor(value)}
    if ids.shape[0] == 1:  # the boundaries describe the whole (one-row) batch
        given.update({key: value for key, value in batch.items() if key in BOUNDARY_KEYS})
    alone: dict[str, Any] = {"input_ids": ids[:1, start:end], "position_ids": positions[:1, start:end]}
    if "attention_mask" in given:
        alone["attention_mask"] = torch.ones_like(alone["input_ids"])
    cache = _cache_in_training(model, checkpointing)
    if cache is not None:
        given["use_cache"] = alone["use_cache"] = cache
    measured = _gap(model, given, alone, start, end)
    if measured is None:
        return None
    gap, scale = measured
    note = (
        f"packed documents kept apart: document 2 of the first packed row (tokens {start} to {end}) gets the "
        f"same logits alone (largest difference {gap:.3g})"
    )
    if gap <= model_facts.output_tolerance(model, TOLERANCE) * scale:
        return note
    mask = batch.get("attention_mask")
    cached = (
        "attention_mask" not in given and cache is True and _apart_without_cache(model, given, alone, start, end, scale)
    )
    if cached:
        why = (
            "the model builds a generation cache in training (config.use_cache=True), and transformers separates "
            "packed documents by their position_ids only without one"
        )
        fix = (
            "train without the cache: TrainingArguments(use_cache=False) under transformers 5 (its Trainer copies "
            "that setting into model.config.use_cache), model.config.use_cache = False under transformers 4; or "
            "give flash attention the documents' boundaries (cu_seq_lens)"
        )
    elif torch.is_tensor(mask) and bool((mask[0, :end] == 1).all()):
        why = (
            "the batch's attention_mask is ones over the whole packed row, so each token attends to the documents "
            "before it (transformers separates documents by their position_ids only when no attention_mask is "
            "given)"
        )
        fix = (
            "leave attention_mask out of packed batches and pass position_ids (as TRL's padding_free collator and "
            "DataCollatorWithFlattening do), or give flash attention the documents' boundaries (cu_seq_lens)"
        )
    else:
        implementation = getattr(getattr(model, "config", None), "_attn_implementation", None) or "its attention"
        why = f"the model's attention ({implementation}) does not keep to the documents' boundaries"
        fix = (
            "use an attention implementation that reads the packed boundaries (flash_attention_2 with position_ids, "
            "or sdpa with no attention_mask), or turn packing off"
        )
    raise diagnosis.Finding(
        f"packed documents attend to each other: document 2 of the first packed row (tokens {start} to {end}) gets "
        f"logits that differ by {gap:.3g} from the same document alone, because {why}; the model is trained on "
        "contexts inference never gives it",
        fix,
    )


def _cache_in_training(model: torch.nn.Module, checkpointing: bool) -> bool | None:
    """Whether the model's forward builds a cache in training (None: its forward takes no use_cache)."""
    try:
        taken = model_facts.forward_parameters(model)
    except (TypeError, ValueError):  # a forward whose signature cannot be read
        return None
    if "use_cache" not in taken:
        return None
    return bool(getattr(getattr(model, "config", None), "use_cache", False)) and not checkpointing


def _apart_without_cache(
    model: torch.nn.Module, given: dict[str, Any], alone: dict[str, Any], start: int, end: int, scale: float
) -> bool:
    """Whether the packed document gets its own logits once the model builds no cache (use_cache=False)."""
    measured = _gap(model, {**given, "use_cache": False}, {**alone, "use_cache": False}, start, end)
    return measured is not None and measured[0] <= model_facts.output_tolerance(model, TOLERANCE) * scale


def _gap(
    model: torch.nn.Module, given: dict[str, Any], alone: dict[str, Any], start: int, end: int
) -> tuple[float, float] | None:
    """(largest difference between the logits of tokens `start` to `end` of the packed row `given` and those of the
    same document `alone`, the scale it is judged against: the largest logit, at least 1), in eval mode and without
    gradients, the model's mode put back; None where the model returns no logits per token."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), diagnosis.pipeline_part("the model's forward on a packed row"):
            packed_logits = model_facts.logits_of(model(**given))
            alone_logits = model_facts.logits_of(model(**alone))
    finally:
        model.train(was_training)
    if packed_logits is None or alone_logits is None or packed_logits.dim() != 3:
        return None
    gap = float((packed_logits[:1, start:end].float() - alone_logits.float()).abs().max())
    return gap, max(1.0, float(alone_logits.float().abs().max()))


@checks("forward", reads=BATCH)
def check_unmarked_documents(
    model: torch.nn.Module, samples: list[dict[str, Any]], batch: dict[str, Any], conversations: bool
) -> str | None:
    """Samples a collator packs into one sequence with no boundary at all (position_ids that do not restart): the
    second attends to the first. A finding where the samples are conversations (separate examples, each asked
    alone at inference); a note for plain texts, which pretraining-style packing streams on purpose."""
    import torch

    ids = batch.get("input_ids")
    if len(samples) != 2 or not torch.is_tensor(ids) or ids.dim() != 2 or ids.shape[0] != 1:
        return None
    if set(batch) - {*INPUTS, *LOSS_KEYS}:
        return None
    positions = batch.get("position_ids")
    if torch.is_tensor(positions) and bool((positions[0, 1:] == 0).any()):
        return None  # restarting positions: check_documents_apart reads them
    first, second = (sample.get("input_ids") for sample in samples)
    if first is None or second is None:
        return None
    first, second = torch.as_tensor(first).reshape(-1), torch.as_tensor(second).reshape(-1)
    start, end = first.numel(), first.numel() + second.numel()
    if end > ids.shape[1] or not torch.equal(ids[0, :start], first) or not torch.equal(ids[0, start:end], second):
        return None  # the collator changed the samples: their boundaries cannot be told
    given = {key: value[:1, :end] for key, value in batch.items() if key in INPUTS and torch.is_tensor(value)}
    alone = {"input_ids": ids[:1, start:end]}
    if "attention_mask" in given:
        alone["attention_mask"] = torch.ones_like(alone["input_ids"])
    measured = _gap(model, given, alone, start, end)
    if measured is None:
        return None
    gap, scale = measured
    if gap <= model_facts.output_tolerance(model, TOLERANCE) * scale:
        return None
    line = (
        f"the collator packs samples into one sequence with no boundary between them (position_ids do not "
        f"restart): the second of two packed samples (tokens {start} to {end}) gets logits that differ by "
        f"{gap:.3g} from the same sample alone, because it attends to the one before it"
    )
    if not conversations:
        return line
    raise diagnosis.Finding(
        f"{line}; these samples are separate conversations, each asked alone at inference, so the model is trained "
        "on contexts inference never gives it",
        "give each packed sample position_ids that restart at 0 and leave attention_mask out (transformers' "
        "DataCollatorWithFlattening does; TRL's packing=True too), so each conversation attends only to itself; or "
        "pad the samples instead of packing them",
    )

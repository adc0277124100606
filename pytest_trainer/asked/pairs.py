"""Preference pairs as the trainer scores them: the chosen and the rejected answer after its truncation.

A pair whose chosen and rejected tokens are the same once truncated (`max_length` cut both before they differ) has
no preference left: its loss is log 2 whatever the model does, and it teaches nothing. The pairs are read from the
batches the trainer's own collator makes: TRL's stacked rows (every chosen row, then every rejected row, with a
`completion_mask`), or chosen and rejected keys side by side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_trainer import diagnosis
from pytest_trainer.catalogue import BATCH, checks
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    import numpy as np

#: Pairs with nothing left to prefer are a finding from this share of the sampled pairs on (a few identical pairs in
#: the data are a note).
SHARE = 0.25
#: Batch keys of chosen and rejected sequences side by side, with their masks, across TRL's versions.
SIDE_BY_SIDE = (
    (
        "chosen_input_ids",
        "rejected_input_ids",
        "chosen_attention_mask",
        "rejected_attention_mask",
        "chosen_labels",
        "rejected_labels",
    ),
    ("input_ids_chosen", "input_ids_rejected", "attention_mask_chosen", "attention_mask_rejected", "", ""),
)


def answers(batch: Mapping[str, np.ndarray], count: int) -> list[tuple[list[int], list[int]]]:
    """(chosen tokens, rejected tokens) of each pair of a batch made of `count` samples, as scored: the answer's tokens
    where the batch marks them (completion_mask, labels), else the whole sequence."""
    for chosen_key, rejected_key, chosen_mask, rejected_mask, chosen_labels, rejected_labels in SIDE_BY_SIDE:
        if chosen_key in batch and rejected_key in batch:
            chosen = _kept(batch[chosen_key], batch.get(chosen_labels), batch.get(chosen_mask))
            rejected = _kept(batch[rejected_key], batch.get(rejected_labels), batch.get(rejected_mask))
            return list(zip(chosen, rejected, strict=False))
    ids = batch.get("input_ids")
    if ids is None or ids.ndim != 2 or ids.shape[0] != 2 * count:
        return []
    marks = batch.get("completion_mask")
    rows = _kept(ids, batch.get("labels"), marks if marks is not None else batch.get("attention_mask"))
    return list(zip(rows[:count], rows[count:], strict=True))


@checks("targets", reads=BATCH)
def check_pairs_differ(
    found: Sequence[tuple[list[int], list[int], Mapping[str, Any]]], max_length: int | None, text: Any, notes: list[str]
) -> None:
    """Pairs that are the same once truncated: a note with their number, a finding where they are many."""
    same = [(chosen, sample) for chosen, rejected, sample in found if chosen == rejected]
    if not found:
        return
    notes.append(f"{len(found) - len(same)} of {len(found)} sampled preference pairs differ once truncated")
    if not same:
        return
    parted = [part for _, sample in same if (part := _parting(sample)) is not None]
    by_truncation = max_length is not None and parted and all(part >= max_length for part in parted)
    line = f"{len(same)} of {len(found)} sampled preference pairs have the same chosen and rejected tokens"
    if by_truncation:
        line += (
            f" once cut at max_length={max_length}: they first differ at token {min(parted)} to {max(parted)} "
            "of the stored pair"
        )
    else:
        line += " as stored"
    if len(same) < SHARE * len(found):
        notes.append(line)
        return
    fix = (
        f"raise max_length to at least {max(parted) + 1}, or shorten the prompts (the common start of both "
        "answers is kept, their difference cut)"
        if by_truncation
        else "drop the pairs whose chosen and rejected answers are the same (or rebuild them): they carry no preference"
    )
    raise diagnosis.Finding(
        f"{line}: such a pair's loss is log 2 whatever the model does, so it teaches nothing",
        fix,
        [f"chosen and rejected as scored: {text(same[0][0])!r}"],
    )


def _kept(ids: np.ndarray, labels: np.ndarray | None, mask: np.ndarray | None) -> list[list[int]]:
    """Each row's scored tokens: those with a label (labels), else those the mask marks, else all of them."""
    if labels is not None and labels.shape == ids.shape:
        keep = labels != IGNORE_INDEX
    elif mask is not None and mask.shape == ids.shape:
        keep = mask.astype(bool)
    else:
        return [row.tolist() for row in ids]
    return [row[kept].tolist() for row, kept in zip(ids, keep, strict=True)]


def _parting(sample: Mapping[str, Any]) -> int | None:
    """Where a stored pair's chosen and rejected sequences first differ (counting the prompt), or None."""
    chosen = _ids(sample, ("chosen_ids", "chosen_input_ids", "input_ids_chosen"))
    rejected = _ids(sample, ("rejected_ids", "rejected_input_ids", "input_ids_rejected"))
    if chosen is None or rejected is None or chosen == rejected:
        return None
    common = next(
        (index for index, (a, b) in enumerate(zip(chosen, rejected, strict=False)) if a != b),
        min(len(chosen), len(rejected)),
    )
    prompt = _ids(sample, ("prompt_ids", "prompt_input_ids")) or []
    return len(prompt) + common


def _ids(sample: Mapping[str, Any], names: tuple[str, ...]) -> list[int] | None:
    value = next((sample[name] for name in names if name in sample and sample[name] is not None), None)
    if value is None:
        return None
    listed = value.tolist() if hasattr(value, "tolist") else list(value)
    return [int(token) for token in listed]

"""The rows of the batch the model is fed, with the tokens it is trained on, as plain data the reports draw. The
other pictures (the overfitting loss curve, the memory forecast by part, the rewards per group of completions) are
drawn by their stages as the same kind of data; `report.html` renders them all.

Pictures are JSON values (lists, dicts, strings, numbers), so that they travel from pytest-xdist workers and into
any report. They are kept small: a few rows of the first batch, cut at `TOKENS` tokens each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_trainer.schema import RowPicture
from pytest_trainer.tasks import IGNORE_INDEX

if TYPE_CHECKING:
    from pytest_trainer.asked.view import Asked
    from pytest_trainer.pipeline import Pipeline

#: Rows of the first batch shown, and tokens shown of each.
ROWS = 4
TOKENS = 160


def batch_rows(pipeline: Pipeline, batch: dict[str, Any], rows: int = ROWS) -> list[RowPicture]:
    """The first rows of a collated batch as the model is fed them: each row's tokens (padding left out), which of
    them are trained (a label other than -100 at the token's position), and the row's target when it is not one
    per token (a class, a score, a decoded target sequence)."""
    import torch

    tokenizer = _tokenizer(pipeline)
    ids = batch.get("input_ids")
    if tokenizer is None or not torch.is_tensor(ids) or ids.dim() != 2:
        return []
    mask = batch.get("attention_mask")
    labels = batch.get("labels")
    shown = []
    for index in range(min(rows, ids.shape[0])):
        row = ids[index]
        keep = mask[index].bool() if torch.is_tensor(mask) and mask.shape == ids.shape else torch.ones_like(row).bool()
        tokens = [_shown(tokenizer, token) for token in tokenizer.convert_ids_to_tokens(row[keep].tolist()[:TOKENS])]
        picture: RowPicture = {"tokens": tokens}
        if torch.is_tensor(labels) and labels.shape == ids.shape:
            picture["trained"] = [bool(value) for value in (labels[index][keep] != IGNORE_INDEX).tolist()[:TOKENS]]
        elif torch.is_tensor(labels) and labels.dim() >= 1 and labels.shape[0] == ids.shape[0]:
            picture["target"] = _target(pipeline, tokenizer, labels[index])
        if len(row[keep]) > TOKENS:
            picture["cut"] = int(len(row[keep]) - TOKENS)
        shown.append(picture)
    return shown


def trained_and_asked(asked: Asked, rows: int = 2) -> list[RowPicture]:
    """The first sampled rows of stored conversations as trained (the trained tokens marked), each beside the prompt
    inference gives the model for the same conversation (`asked`: its tokens)."""
    tokenizer = asked.tokenizer
    if not callable(getattr(tokenizer, "convert_ids_to_tokens", None)):
        return []
    shown: list[RowPicture] = []
    for row in asked.rows:
        prompt = asked.prompt_for(row)
        if prompt is None:
            continue
        ids = [int(token) for token in row.ids[:TOKENS]]
        picture: RowPicture = {
            "tokens": [_shown(tokenizer, token) for token in tokenizer.convert_ids_to_tokens(ids)],
            "trained": [bool(value) for value in row.trained[:TOKENS].tolist()],
            "asked": [_shown(tokenizer, token) for token in tokenizer.convert_ids_to_tokens(prompt[:TOKENS])],
        }
        if len(row) > TOKENS:
            picture["cut"] = len(row) - TOKENS
        shown.append(picture)
        if len(shown) == rows:
            break
    return shown


def _target(pipeline: Pipeline, tokenizer: Any, label: Any) -> str:
    """A row's label in words: the class name, the score, or the decoded target sequence."""
    if label.dim() == 0:
        value = label.item()
        names = getattr(getattr(pipeline.model, "config", None), "id2label", None) or {}
        name = names.get(int(value)) if isinstance(value, int) or float(value).is_integer() else None
        return f"{value:g} ({name})" if name and not str(name).startswith("LABEL_") else f"{value:g}"
    if label.dtype.is_floating_point:
        return "[" + ", ".join(f"{value:g}" for value in label.tolist()[:16]) + "]"
    ids = [value for value in label.tolist() if value >= 0]
    return str(tokenizer.decode(ids[:TOKENS]))


def _shown(tokenizer: Any, token: Any) -> str:
    """A token as text (a byte-level BPE's "\u0120cow" as " cow"), or as the tokenizer names it."""
    try:
        return str(tokenizer.convert_tokens_to_string([token]))
    except Exception:  # a tokenizer that cannot: its own name of the token is still readable
        return str(token)


def _tokenizer(pipeline: Pipeline) -> Any:
    processing = getattr(pipeline.trainer, "processing_class", None)
    tokenizer = getattr(processing, "tokenizer", processing)  # a processor holds its tokenizer
    return tokenizer if callable(getattr(tokenizer, "convert_ids_to_tokens", None)) else None

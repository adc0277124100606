"""sentence-transformers: what each of its losses takes, read against the columns the trainer feeds it.

`SentenceTransformerTrainer`, `CrossEncoderTrainer` and `SparseEncoderTrainer` keep every column of a split: the
collator takes the label column (`label`, `labels`, `score` or `scores`, the first found) and treats every other column,
in order, as a text the model encodes. Each loss expects a number of text columns and a kind of label, as its
documentation's "Inputs" table says; nothing in the library checks the dataset against it before training, so a
dataset of the wrong shape trains on the wrong pairs or on labels the loss cannot reach. Losses that score every row
against the others of its batch (in-batch negatives) learn contradictions where a batch holds the same text twice,
which the NO_DUPLICATES batch sampler exists to prevent.

A split here is a `fed_data.FedSplit`: the split as the trainer feeds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_trainer import diagnosis, tables
from pytest_trainer.catalogue import BATCH, SPLIT, checks

if TYPE_CHECKING:
    import pyarrow as pa
    from transformers import Trainer

#: The columns the library's collators read as the label, the first one found.
LABEL_COLUMNS = ("label", "labels", "score", "scores")
#: Losses that take the other rows of a batch as negatives (the sentence-transformers documentation's list).
IN_BATCH_NEGATIVES = (
    "MultipleNegativesRankingLoss",
    "CachedMultipleNegativesRankingLoss",
    "MultipleNegativesSymmetricRankingLoss",
    "CachedMultipleNegativesSymmetricRankingLoss",
    "MegaBatchMarginLoss",
    "GISTEmbedLoss",
    "CachedGISTEmbedLoss",
    "SparseMultipleNegativesRankingLoss",
)
#: A batch whose rows share a text with another row of it, in at least this share of the epoch's rows, is a failure
#: under an in-batch-negatives loss; fewer are a note.
DUPLICATE_SHARE = 0.1
#: Splits up to this many rows have their epoch's batches read for shared texts.
SAMPLED_ROWS = 100_000


@dataclass(frozen=True)
class Expects:
    """What a loss takes: text columns (at least, and at most where it is exact) and a label of some kind."""

    texts: int
    exact: bool = False
    #: "none", "score" (a float), "binary" (0 or 1), "class" (an id below the classes), "probability" (0 to 1),
    #: "similarity" (a cosine: -1 to 1).
    label: str = "none"
    #: Where the label's range comes from, for the fix.
    why: str = ""


#: What each loss takes, by class name (sentence-transformers' documentation of each loss).
LOSSES: dict[str, Expects] = {
    **{name: Expects(2) for name in IN_BATCH_NEGATIVES},
    "TripletLoss": Expects(3, exact=True),
    "CoSENTLoss": Expects(2, exact=True, label="score"),
    "AnglELoss": Expects(2, exact=True, label="score"),
    "CosineSimilarityLoss": Expects(
        2, exact=True, label="similarity", why="it regresses the cosine similarity of the two embeddings onto the label"
    ),
    "ContrastiveLoss": Expects(2, exact=True, label="binary", why="1 marks a similar pair, 0 a dissimilar one"),
    "OnlineContrastiveLoss": Expects(2, exact=True, label="binary", why="1 marks a similar pair, 0 a dissimilar one"),
    "SoftmaxLoss": Expects(2, exact=True, label="class", why="its classifier has num_labels outputs"),
    "BinaryCrossEntropyLoss": Expects(
        2, exact=True, label="probability", why="binary cross-entropy takes targets between 0 and 1"
    ),
    "CrossEntropyLoss": Expects(2, exact=True, label="class", why="the cross-encoder has num_labels outputs"),
}


def loss_of(trainer: Any) -> Any:
    """The loss module the trainer trains with, through wrappers (Matryoshka, AdaptiveLayer, Splade) to the one that
    decides the columns; None for several losses by dataset."""
    loss = getattr(trainer, "loss", None)
    if isinstance(loss, dict):
        return None
    for _ in range(4):
        inner = next((getattr(loss, name) for name in ("loss", "base_loss") if hasattr(loss, name)), None)
        if inner is None or not hasattr(inner, "forward"):
            break
        loss = inner
    return loss


def columns(table: pa.Table) -> tuple[list[str], str | None]:
    """The text columns of a split as the collator reads them (in order) and its label column."""
    label = next((name for name in LABEL_COLUMNS if name in table.column_names), None)
    skipped = {label, "dataset_name"}
    return [name for name in table.column_names if name not in skipped], label


@checks("dataset", "eval", reads=SPLIT)
def check_split(trainer: Trainer, split: Any) -> None:
    """The split's columns and labels are what the loss takes."""
    loss = loss_of(trainer)
    expects = LOSSES.get(type(loss).__name__)
    if expects is None:
        return
    table = split.table
    texts, label = columns(table)
    name = type(loss).__name__
    count = f"{len(texts)} text column{'s' if len(texts) != 1 else ''} ({', '.join(texts) or 'none'})"
    if len(texts) < expects.texts or (expects.exact and len(texts) != expects.texts):
        wanted = f"{'exactly' if expects.exact else 'at least'} {expects.texts}"
        # Too few columns crash the loss; more than it reads train on the wrong pairs while training runs.
        kind = diagnosis.PipelineFailure if len(texts) < expects.texts else diagnosis.Finding
        raise kind(
            f"{name} takes {wanted} text columns, but the {split.description} dataset feeds {count}: every column but "
            f"the label ({', '.join(LABEL_COLUMNS)}) is encoded as a text, in order",
            f"give the dataset {wanted} text columns in the order {name} reads them (dataset.select_columns([...])), "
            "or choose the loss that fits the data",
        )
    if expects.label == "none":
        return
    if label is None:
        raise diagnosis.PipelineFailure(
            f"{name} takes a label for each row, but the {split.description} dataset has no label column "
            f"({', '.join(LABEL_COLUMNS)}): it feeds {count}",
            "name the column of the targets 'label' (dataset.rename_column(...)), or choose a loss without labels "
            "(MultipleNegativesRankingLoss for pairs)",
        )
    _check_label_range(split, loss, expects, label)


def _check_label_range(split: Any, loss: Any, expects: Expects, label: str) -> None:
    whole, dataset_row = split.column(label)
    kind = whole.schema.field(label).type
    if tables.depth(kind) != 0 or not tables.is_numeric(kind) or not whole.num_rows:
        return  # list labels (listwise losses, teacher embeddings) are the loss's own
    values, table_row = tables.flatten(whole, label)
    name = type(loss).__name__
    low, high = _allowed(loss, expects)
    if expects.label == "binary":
        bad = np.flatnonzero(~np.isin(values, (0, 1)))
    else:
        bad = np.flatnonzero((values < low) | (values > high))
    if not bad.size:
        return
    first = int(bad[0])
    shown = f"{values.min():g} to {values.max():g}"
    wanted = "0 or 1" if expects.label == "binary" else f"{low:g} to {high:g}"
    raise diagnosis.Finding(
        f"{name} takes labels from {wanted} ({expects.why}), but the {split.description} dataset's {label!r} runs "
        f"from {shown} ({bad.size} rows outside; the first is row {dataset_row(table_row(first))}, "
        f"{label!r} {values[first]:g})",
        _range_fix(expects, label, float(values.min()), float(values.max()), high),
    )


def _allowed(loss: Any, expects: Expects) -> tuple[float, float]:
    if expects.label == "class":
        classes = getattr(loss, "num_labels", None) or getattr(getattr(loss, "model", None), "num_labels", None)
        return 0, (int(classes) - 1 if isinstance(classes, int) else np.inf)
    return {"probability": (0.0, 1.0), "similarity": (-1.0, 1.0)}.get(expects.label, (-np.inf, np.inf))


def _range_fix(expects: Expects, label: str, low: float, high: float, top: float) -> str:
    if expects.label in ("probability", "similarity"):
        return (
            f"scale {label!r} into range: dataset.map(lambda row: {{{label!r}: (row[{label!r}] - {low:g}) / "
            f"{high - low:g}}}) maps {low:g}..{high:g} onto 0..1"
        )
    if expects.label == "class":
        return f"build the loss with num_labels={int(high) + 1} (it has {int(top) + 1}), or remap the class ids"
    return f"make {label!r} 1 for similar pairs and 0 for the others"


@checks("dataset", reads=SPLIT)
def check_duplicates(trainer: Trainer, split: Any) -> tuple[str | None, diagnosis.Finding | None]:
    """Under an in-batch-negatives loss, the rows of the epoch's batches that share a text with another row of their
    batch: a note, or a finding where they are many. The batches are the trainer's own batch sampler's."""
    import pyarrow as pa

    loss = loss_of(trainer)
    if type(loss).__name__ not in IN_BATCH_NEGATIVES:
        return None, None
    sampler = getattr(trainer.get_train_dataloader(), "batch_sampler", None)
    dataset = split.dataset
    if sampler is None or not hasattr(dataset, "data") or len(dataset) > SAMPLED_ROWS:
        return None, None
    texts, _ = columns(split.table)
    stored = tables.stored_rows(dataset, None, texts)
    if any(not tables.is_text(stored.schema.field(name).type) for name in texts):
        return None, None
    codes = pa.chunked_array([chunk for name in texts for chunk in stored.column(name).chunks]).dictionary_encode()
    ids = np.concatenate([chunk.indices.to_numpy(zero_copy_only=False) for chunk in codes.chunks])
    ids = ids.reshape(len(texts), len(dataset)).T
    rows = touched = 0
    for batch in sampler:
        found = ids[np.asarray(list(batch), dtype=np.int64)]
        values, counts = np.unique(found, return_counts=True)
        shared = values[counts > 1]
        rows += len(found)
        touched += int(np.isin(found, shared).any(axis=1).sum()) if shared.size else 0
    if not touched:
        return None, None
    name = type(loss).__name__
    said = (
        f"{touched} of {rows} training rows share a text with another row of their batch ({name} takes each "
        "other row of a batch as a negative)"
    )
    if touched / max(rows, 1) < DUPLICATE_SHARE:
        return said, None
    return said, diagnosis.Finding(
        f"{said}: the loss is asked to push apart a text from itself, so these rows train on contradictory targets",
        "batch with batch_sampler=BatchSamplers.NO_DUPLICATES in the training arguments (from sentence_transformers."
        "training_args import BatchSamplers), which never puts one text twice in a batch",
    )


def truncated(trainer: Trainer, split: Any) -> str | None:
    """How many texts of the sampled rows the model's max_seq_length cuts, per column (a note)."""
    model = trainer.model
    limit = getattr(model, "max_seq_length", None)
    tokenizer = getattr(model, "tokenizer", None)
    if not isinstance(limit, int) or not callable(tokenizer):
        return None
    texts, _ = columns(split.table)
    cut = []
    for name in texts:
        values = split.table.column(name).to_pylist()[:1000]
        if not values or not all(isinstance(value, str) for value in values):
            continue
        lengths = [len(ids) for ids in tokenizer(values, add_special_tokens=True)["input_ids"]]
        over = sum(length > limit for length in lengths)
        if over:
            cut.append(f"{name} {over} of {len(values)} (longest {max(lengths)} tokens)")
    return f"texts longer than max_seq_length={limit}, cut when encoded: {'; '.join(cut)}" if cut else None


#: Largest change of a text's embedding (or score) padded beside a longer text, relative to its largest value (at
#: least 1): float32 noise between batch shapes is far below it, pooling over padding far above it.
PADDED_TOLERANCE = 1e-4
#: The shortest texts of the split, each encoded alone and beside its longest.
PADDED_TEXTS = 4


@checks("padding", reads=BATCH)
def check_padded(trainer: Trainer, split: Any) -> str:
    """A text's embedding (a bi-encoder's) or score (a cross-encoder's) is the same alone and in a batch beside a
    longer text, as the model encodes it at inference; a note of what was compared, or a failure naming the text."""
    import torch

    model = trainer.model
    texts, _ = columns(split.table)
    rows = [row for row in split.table.select(texts).to_pylist() if all(isinstance(row[name], str) for name in texts)]
    if not rows:
        return "no rows of texts to encode"
    pairs = len(texts) >= 2 and hasattr(model, "predict") and not hasattr(model, "encode")
    items = [(row[texts[0]], row[texts[1]]) for row in rows] if pairs else [row[name] for row in rows for name in texts]
    by_length = sorted(set(items), key=lambda item: len(" ".join(item) if pairs else item))
    longest = by_length[-1]
    worst = (0.0, by_length[0])
    with torch.no_grad():
        for item in by_length[:PADDED_TEXTS]:
            if item == longest:
                continue
            with diagnosis.pipeline_part(f"{type(model).__name__}.{'predict' if pairs else 'encode'}"):
                alone = _encoded(model, [item], pairs)[0]
                beside = _encoded(model, [item, longest], pairs)[0]
            gap = float((alone - beside).abs().max()) / max(1.0, float(alone.abs().max()))
            worst = max(worst, (gap, item), key=lambda found: found[0])
    gap, item = worst
    what = "score" if pairs else "embedding"
    if gap <= PADDED_TOLERANCE:
        compared = min(PADDED_TEXTS, len(by_length) - 1)
        return f"{compared} short texts: the same {what} alone and padded beside the longest"
    left = getattr(getattr(model, "tokenizer", None), "padding_side", "right") == "left"
    raise diagnosis.Finding(
        f"the {what} of {item!r} changes by {gap:.3g} (relative) when it is encoded beside a longer text and so "
        f"padded: the model reads the padding, so a text's {what} depends on the batch it is in"
        + (" (its tokenizer pads on the left, which shifts the positions of every padded text)" if left else ""),
        "pad on the right: model.tokenizer.padding_side = 'right'"
        if left
        else "pool over the real tokens only, with features['attention_mask'] (as sentence-transformers' Pooling "
        "module does), in every module after the transformer",
    )


def _encoded(model: Any, items: list[Any], pairs: bool) -> Any:
    import torch

    if pairs:
        return (
            torch.as_tensor(model.predict(items, batch_size=len(items), convert_to_tensor=True))
            .float()
            .reshape(len(items), -1)
        )
    return model.encode(items, batch_size=len(items), convert_to_tensor=True).float()

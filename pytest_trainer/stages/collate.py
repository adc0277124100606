"""`collate`: the Trainer's own train dataloader turns samples into a batch the model can take (images normalized as
the Trainer's image processor normalizes them: `pixels`; audio at the sampling rate its feature extractor reads,
padding masked where the model needs it: `audio`)."""

from __future__ import annotations

import sys
import sysconfig
from typing import TYPE_CHECKING

from pytest_trainer import diagnosis, model_facts, tasks
from pytest_trainer.catalogue import BATCH, checks
from pytest_trainer.stages.base import Stage, StageResult

if TYPE_CHECKING:
    import numpy as np

    from pytest_trainer.pipeline import Pipeline


def run(pipeline: Pipeline, device: str) -> StageResult:
    import torch

    from pytest_trainer import audio, fed_checks, pixels

    batch = pipeline.batches.first()
    loose = {key: type(value).__name__ for key, value in batch.items() if not torch.is_tensor(value)}
    # A value that is no tensor is only wrong where the model names it as an input (it computes on it);
    # other values (a packing length, say) go to **kwargs or to a compute_loss of your own: forward judges them.
    named = model_facts.forward_parameters(pipeline.model) if pipeline.task.conventional else set()
    wrong = {key: kind for key, kind in loose.items() if key in named and isinstance(batch[key], (list, str))}
    if wrong:
        listed = ", ".join(f"{key!r} ({kind})" for key, kind in wrong.items())
        raise diagnosis.PipelineFailure(
            f"the collator's batch holds values that are not tensors: {listed}; the model cannot take them",
            "make the data collator return tensors (return_tensors='pt'), or drop those columns from the dataset",
        )
    from pytest_trainer import vision_text

    vision_text.check_images_kept(pipeline, batch)
    fed_checks.check_batch_tokens(pipeline, batch)
    on_device = pipeline.batches.first_on(device)
    main = batch.get(pipeline.task.sequence or "")
    sizes = [
        len(value)
        for value in ([main] if torch.is_tensor(main) else batch.values())
        if torch.is_tensor(value) and value.dim() > 0
    ]
    result = StageResult("collate", device, batch=on_device, figures={"batch_size": float(max(sizes, default=0))})
    from pytest_trainer.report import pictures

    try:  # a picture for the reports: a tokenizer that cannot show its tokens fails nothing
        result.pictures["rows"] = pictures.batch_rows(pipeline, batch)
    except Exception as error:
        result.notes.append(
            f"the rows of the batch are not drawn: the tokenizer could not show them ({type(error).__name__}: {error})"
        )
    if loose:
        result.notes.append(f"values passed on as they are (not tensors): {', '.join(sorted(loose))}")
    diagnosis.findings_last(
        [
            lambda: check_target_padding(pipeline, batch),
            lambda: _start_token(pipeline, batch),
            lambda: _masked_targets(pipeline, batch),
            lambda: pixels.check_normalized(pipeline, batch, "training"),
            lambda: audio.check_sampling_rate(pipeline, result.notes),
            lambda: audio.check_attention_mask(pipeline),
        ]
    )
    return result


@checks("collate", reads=BATCH)
def check_target_padding(pipeline: Pipeline, batch: dict) -> None:
    """Seq2seq targets the collator pads with the pad id instead of -100."""
    from pytest_trainer.task_checks import pad_in_targets, padded_targets, target_ends

    labels = batch.get("labels")
    if pipeline.task.labels != tasks.DECODER_TARGETS or labels is None or not hasattr(labels, "numpy"):
        return
    values = labels.cpu().numpy()
    shared, pad = target_ends(pipeline)
    found = padded_targets(values, pad, shared)  # rows kept: a pad run does not go on from one row to the next
    if found is not None:
        index, count = found
        row = index // values.shape[-1] if values.ndim > 1 else index
        where = f"row {row} of the first batch the collator made"
        raise pad_in_targets(int(values.reshape(-1)[index]), count, where, _own_collator(pipeline))


def _own_collator(pipeline: Pipeline) -> str | None:
    """The name of the script's own collator (a function or a class defined outside the installed packages), or None
    for a library's (or one that cannot be named: a lambda, a partial)."""
    collator = pipeline.trainer.data_collator
    owner = collator if hasattr(collator, "__qualname__") else type(collator)
    name = str(getattr(owner, "__qualname__", "")).split(".<locals>.")[-1]
    module = sys.modules.get(str(getattr(owner, "__module__", "")))
    source = str(getattr(module, "__file__", "") or "")
    installed = {sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib")}
    if not source or not name or name.startswith("<") or any(source.startswith(path) for path in installed):
        return None
    return name


@checks("collate", reads=BATCH)
def check_start_token(labels: np.ndarray, start: int, model: str, token: str) -> None:
    """Seq2seq labels that all begin with the decoder start token, which the model prepends itself.

    An encoder-decoder shifts the labels right behind its `decoder_start_token_id` (`start`, shown as `token`) to make
    the decoder's inputs. A tokenizer that starts every target with that token (Whisper's `<|startoftranscript|>`)
    leaves it twice in the inputs, and as the first token to predict: the model learns to write it again after itself.
    """
    import numpy as np

    if labels.ndim != 2:
        return
    supervised = labels != tasks.IGNORE_INDEX
    rows = supervised.any(axis=1)
    if int(rows.sum()) < 2:
        return
    firsts = labels[np.arange(labels.shape[0]), supervised.argmax(axis=1)][rows]
    if not bool((firsts == start).all()):
        return
    raise diagnosis.Finding(
        f"every label row of the first batch ({int(rows.sum())} rows) begins with {token}, the decoder start token "
        f"that {model} puts before the labels itself when it shifts them right: the decoder is fed it twice and learns "
        "to write it first, so generation repeats it",
        "drop it from the labels, in the collator: if (labels[:, 0] == model.config.decoder_start_token_id).all(): "
        "labels = labels[:, 1:] (or tokenize the targets without it)",
    )


def _start_token(pipeline: Pipeline, batch: dict) -> None:
    """`check_start_token` on the batch's labels, where the model is an encoder-decoder trained on seq2seq targets."""
    import torch

    labels = batch.get("labels")
    start = decoder_start(pipeline.model)
    if pipeline.task.labels != tasks.DECODER_TARGETS or start is None or not torch.is_tensor(labels):
        return
    given = getattr(pipeline.trainer, "processing_class", None)
    tokenizer = getattr(given, "tokenizer", None) or given
    try:
        shown = f"{tokenizer.convert_ids_to_tokens(start)!r} (id {start})"  # type: ignore[union-attr]
    except Exception:
        shown = f"id {start}"
    model = type(model_facts.base_model(pipeline.model)).__name__
    check_start_token(labels.detach().cpu().numpy(), start, model, shown)


def decoder_start(model: object) -> int | None:
    """The token an encoder-decoder puts before its labels: its config's decoder_start_token_id, or its generation
    config's; None for a model that does not shift labels."""
    config = getattr(model, "config", None)
    if not getattr(config, "is_encoder_decoder", False):
        return None
    for source in (config, getattr(model, "generation_config", None)):
        found = getattr(source, "decoder_start_token_id", None)
        if isinstance(found, int):
            return found
    return None


@checks("collate", reads=BATCH)
def check_masked_targets(
    labels: np.ndarray, ids: np.ndarray, mask: np.ndarray | None, model: str, collator: str | None
) -> diagnosis.Finding | None:
    """A masked language model whose labels are its inputs learns to copy the token it sees, not to predict hidden ones.

    With masking, the supervised positions are a sample (mlm_probability) of the tokens, most of them replaced by the
    mask token in the inputs; with none (mlm=False, or a labels column copied from input_ids) every real token is
    supervised with itself as the target. `collator` names a collator that was told not to mask (mlm=False), else
    None.
    """
    import numpy as np

    if labels.shape != ids.shape:
        return None
    supervised = labels != tasks.IGNORE_INDEX
    real = mask.astype(bool) if mask is not None and mask.shape == ids.shape else np.ones_like(supervised)
    count, tokens = int(supervised.sum()), int(real.sum())
    # Masking supervises a sample of the tokens and changes most of them; copying supervises them all, unchanged.
    if count < 2 or count * 2 < tokens or not bool((labels[supervised] == ids[supervised]).all()):
        return None
    made = f"{collator}(mlm=False) copies input_ids into labels" if collator else "the labels are a copy of input_ids"
    return diagnosis.Finding(
        f"a masked language model ({model}) is trained on unmasked labels: {made}, so in the first batch all {count} "
        "supervised tokens are the input tokens themselves and none is masked; the model learns to copy what it sees "
        "(the loss falls fast), not to predict hidden tokens",
        ("mask the inputs: " if collator else "drop the labels column and mask the inputs: ")
        + "data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=True) (mlm_probability=0.15 by default), "
        "which replaces a sample of the tokens by the mask token and supervises only those",
    )


def _masked_targets(pipeline: Pipeline, batch: dict) -> None:
    """`check_masked_targets` on the batch, where the model is a masked language model."""
    import torch

    task = pipeline.task
    labels, ids, mask = (batch.get(key) for key in ("labels", task.sequence or "", "attention_mask"))
    if task.labels != tasks.TOKEN_IDS or task.shifts_labels or not torch.is_tensor(labels) or not torch.is_tensor(ids):
        return
    collator = pipeline.trainer.data_collator
    found = check_masked_targets(
        labels.detach().cpu().numpy(),
        ids.detach().cpu().numpy(),
        mask.detach().cpu().numpy() if torch.is_tensor(mask) else None,
        type(model_facts.base_model(pipeline.model)).__name__,
        type(collator).__name__ if getattr(collator, "mlm", True) is False else None,
    )
    if found is not None:
        raise found


STAGE = Stage("collate", rank=20, run=run, needs=("dataset",))

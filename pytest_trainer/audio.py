"""The audio a speech model is fed, against its feature extractor: at the sampling rate the extractor reads, and, for a
model whose feature encoder normalizes over the whole clip, with the attention mask that keeps padding out.

The sampling rate is read back, not trusted: where a training row still holds its audio as stored (a `datasets.Audio`
column, a {"array", "sampling_rate"} value, or an array beside a `sampling_rate` column) at another rate than the
extractor's, the features the Trainer's own collator makes of that row are compared with the extractor's features of
the stored samples taken as they are, and of the samples resampled to the extractor's rate. Features that follow the
samples as they are, and not the resampled ones, were computed without resampling: the model hears every clip faster
or slower, and higher or lower, than at inference. Where the script turned its audio into features with map() and
dropped the audio, the dataset it mapped, still in scope where it called train() and of as many rows, is read in its
place: its row i is the split's row i where the features follow it, and nothing is said where they do not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_trainer import diagnosis, model_facts
from pytest_trainer.catalogue import BATCH, checks

if TYPE_CHECKING:
    from pytest_trainer.pipeline import Pipeline

#: Inputs a speech model reads: a waveform (Wav2Vec2, HuBERT, WavLM) or a spectrogram (Whisper, Speech2Text).
AUDIO_INPUTS = ("input_values", "input_features")
#: Training rows whose fed features are read back against their stored audio.
ROWS = 3
#: Correlation at which the fed features are the extractor's features of the given samples.
SAME = 0.98
#: How much better the samples as they are must match than the resampled ones: a clip too smooth to tell apart
#: at two rates (a slow ramp, silence) tells nothing.
CLEARER = 0.1
#: Relative difference of two sampling rates that counts as another rate.
OTHER_RATE = 0.02
#: The fewest time steps (samples, or spectrogram frames) compared.
SHORTEST = 16
#: Datasets in the script's scope tried as the one its features were made from.
SOURCES = 8


def extractor_of(pipeline: Pipeline) -> Any:
    """The feature extractor that turns the script's audio into the model's inputs: the Trainer's processing class
    (or its feature_extractor), or the collator's processor; None where there is none."""
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor

    trainer = pipeline.trainer
    found: list[Any] = []
    for owner in (getattr(trainer, "processing_class", None), getattr(trainer, "data_collator", None)):
        for name in ("", "feature_extractor", "processor", "processor.feature_extractor"):
            value = owner
            for part in filter(None, name.split(".")):
                value = getattr(value, part, None)
            found.append(value)
    return next(
        (value for value in found if isinstance(value, SequenceFeatureExtractor) and _rate(value) is not None), None
    )


def _rate(extractor: Any) -> int | None:
    rate = getattr(extractor, "sampling_rate", None)
    return int(rate) if isinstance(rate, (int, float)) and rate > 0 else None


def raw_audio(row: Mapping[str, Any]) -> tuple[str, np.ndarray, int] | None:
    """(column, samples, sampling rate) of the audio a row holds as stored: a value with "array" and "sampling_rate"
    (a decoded `datasets.Audio`), or one array of numbers beside a `sampling_rate` column; None where it holds none."""
    for name, value in row.items():
        if isinstance(value, Mapping) and "array" in value and isinstance(value.get("sampling_rate"), (int, float)):
            samples = _samples(value["array"])
            if samples is not None:
                return name, samples, int(value["sampling_rate"])
    rate = row.get("sampling_rate")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        arrays = [(name, _samples(value)) for name, value in row.items() if name != "sampling_rate"]
        found = [(name, samples) for name, samples in arrays if samples is not None]
        if len(found) == 1:
            return found[0][0], found[0][1], int(rate)
    return None


def _samples(value: Any) -> np.ndarray | None:
    """A mono waveform of at least SHORTEST samples, or None."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        return None
    try:
        samples = np.asarray(value.cpu() if hasattr(value, "cpu") else value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if samples.ndim != 1 or samples.size < SHORTEST or not np.isfinite(samples).all():
        return None
    return samples


def resampled(samples: np.ndarray, rate: int, wanted: int) -> np.ndarray:
    """`samples` taken at `rate`, read at `wanted` by linear interpolation: close enough to tell the two apart."""
    count = max(1, round(samples.size * wanted / rate))
    return np.interp(np.arange(count) * rate / wanted, np.arange(samples.size), samples)


def correlation(fed: np.ndarray, reference: np.ndarray) -> float | None:
    """How closely `fed` follows `reference` (time on the last axis), over the time steps both hold: the Pearson
    correlation of the values, which normalizing either leaves unchanged; None where too short to tell."""
    steps = min(fed.shape[-1], reference.shape[-1])
    if fed.shape[:-1] != reference.shape[:-1] or steps < SHORTEST:
        return None
    first, second = fed[..., :steps].reshape(-1), reference[..., :steps].reshape(-1)
    if first.std() == 0 or second.std() == 0:
        return None
    return float(np.corrcoef(first, second)[0, 1])


def fed_as_is(fed: np.ndarray, as_is: np.ndarray, in_rate: np.ndarray) -> bool:
    """Whether features `fed` are those of the samples as they are (`as_is`), clearly rather than those of the samples
    resampled to the extractor's rate (`in_rate`)."""
    plain, right = correlation(fed, as_is), correlation(fed, in_rate)
    return plain is not None and plain >= SAME and (right is None or plain - right >= CLEARER)


def _features(extractor: Any, samples: np.ndarray, name: str) -> np.ndarray | None:
    rate = _rate(extractor)
    try:
        made = extractor(samples.astype(np.float32), sampling_rate=rate, return_tensors="np")
    except Exception:  # an extractor that wants other arguments: nothing is compared
        return None
    value = made.get(name) if hasattr(made, "get") else None
    return None if value is None else np.asarray(value, dtype=np.float64)[0]


def _stored(pipeline: Pipeline, position: int) -> dict[str, Any] | None:
    """Training row `position` as stored, audio decoded, before any transform or column removal."""
    import datasets

    from pytest_trainer import tables

    split = pipeline.training
    given = split.given
    if not isinstance(given, datasets.Dataset):
        return None
    row = tables.stored_rows(given, [split.row(position)]).to_pylist()[0]
    encoded = {name: given.features[name] for name in row if isinstance(given.features.get(name), datasets.Audio)}
    if encoded:
        try:  # a column the Trainer may never decode (a transform reads another): no failure of the pipeline
            row.update(datasets.Features(encoded).decode_example({name: row[name] for name in encoded}))
        except Exception:
            return None
    return row


def _audio_row(pipeline: Pipeline, position: int, sample: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Training row `position` with its audio as stored, and the dataset it was read from: the sample itself (a
    collator that makes the features), the split as stored (a transform that makes them), or a dataset of as many rows
    that the script still held when it called train() (the one its map() made the features from)."""
    if raw_audio(sample) is not None:
        return sample, pipeline.training.given
    split = pipeline.training
    stored = _stored(pipeline, position) or {}
    if raw_audio(stored) is not None:
        return stored, split.given
    count = len(split.given) if hasattr(split.given, "__len__") else -1
    for source in pipeline.sources[:SOURCES]:
        if source is split.given or len(source) != count:
            continue
        try:  # a dataset the plugin only looks into: what it cannot read is no failure of the pipeline
            row = dict(source[split.row(position)])
        except Exception:
            continue
        if raw_audio(row) is not None:
            return row, source
    return {}, None


def _is_audio_column(dataset: Any, column: str) -> bool:
    import datasets

    features = getattr(dataset, "features", None)
    return isinstance(features, datasets.Features) and isinstance(features.get(column), datasets.Audio)


@checks("collate", reads=BATCH)
def check_sampling_rate(pipeline: Pipeline, notes: list[str] | None = None) -> None:
    """The collator's features of rows stored at another rate than the extractor's are made of resampled audio; where
    no row's audio can be read as stored, `notes` gets a line saying so."""
    extractor = extractor_of(pipeline)
    name = getattr(model_facts.base_model(pipeline.model), "main_input_name", None)
    if extractor is None or name not in AUDIO_INPUTS:
        return
    wanted = _rate(extractor)
    assert wanted is not None
    split = pipeline.training
    count = len(split)
    heard: list[tuple[int, str, int]] = []
    compared = 0
    decoded = False  # an Audio column, which decodes at the rate it is cast to
    for position in sorted({int(index) for index in np.linspace(0, count - 1, min(ROWS, count))} if count else []):
        sample = split.samples([position])[0]
        row, source = _audio_row(pipeline, position, sample)
        found = raw_audio(row)
        if found is None:
            continue
        column, samples, rate = found
        compared += 1
        if abs(rate - wanted) <= OTHER_RATE * wanted:
            continue
        fed: Any = pipeline.batches.collate([dict(sample)], "cpu").get(name)
        as_is = _features(extractor, samples, name)
        in_rate = _features(extractor, resampled(samples, rate, wanted), name)
        if not hasattr(fed, "detach") or as_is is None or in_rate is None:
            continue
        if fed_as_is(fed.detach().float().cpu().numpy()[0].astype(np.float64), as_is, in_rate):
            heard.append((split.row(position), column, rate))
            decoded = _is_audio_column(source, column)
    if not compared and notes is not None:
        notes.append(
            f"not checked: the audio's sampling rate against the {wanted} Hz {type(extractor).__name__} reads: no "
            "training row holds its audio with the rate it was recorded at (a datasets.Audio column, values of "
            '{"array", "sampling_rate"}, or a sampling_rate column beside the arrays), nor does a dataset the '
            "script's map() made them from row for row (one that cut or joined clips)"
        )
    if not heard:
        return
    rows = ", ".join(str(row) for row, _, _ in heard)
    column, rate = heard[0][1], heard[0][2]
    if decoded:
        resample = (
            f"dataset = dataset.cast_column({column!r}, datasets.Audio(sampling_rate={wanted})) decodes it at that "
            f"rate; then pass sampling_rate={column}['sampling_rate'] to the extractor, which refuses a rate it does "
            "not read"
        )
    else:
        resample = (
            f"resample each array, librosa.resample(array, orig_sr={rate}, target_sr={wanted}) (or "
            f"scipy.signal.resample_poly), before it is given to the extractor with sampling_rate={wanted}"
        )
    speed = "faster and higher" if rate < wanted else "slower and lower"
    raise diagnosis.Finding(
        f"the audio is fed at the wrong sampling rate: training rows {rows} hold {column!r} sampled at {rate} Hz, and "
        f"the {name} the collator makes of them are the feature extractor's features of those samples as they are, "
        f"read as {wanted} Hz audio (the rate {type(extractor).__name__} reads): the model hears every clip "
        f"{max(rate, wanted) / min(rate, wanted):.3g}x {speed} than it sounds, and than at inference",
        f"resample the audio to {wanted} Hz before the feature extractor: {resample}",
    )


@checks("collate", reads=BATCH)
def check_attention_mask(pipeline: Pipeline) -> None:
    """A Wav2Vec2-style model whose feature encoder normalizes each layer (feat_extract_norm="layer") is fed padded
    waveforms without an attention mask: it reads the padding as audio."""
    model = model_facts.base_model(pipeline.model)
    config = getattr(model, "config", None)
    if getattr(config, "feat_extract_norm", None) != "layer" or getattr(model, "main_input_name", "") != "input_values":
        return
    batches = pipeline.batches
    for samples, batch, _ in batches.spread(2 * max(1, int(pipeline.trainer.args.train_batch_size))):
        if "attention_mask" in batch or len(samples) < 2:
            continue
        lengths = []
        for sample in samples:
            alone: Any = batches.collate([dict(sample)], "cpu").get("input_values")
            if not hasattr(alone, "shape"):
                return
            lengths.append(int(alone.shape[-1]))
        if len(set(lengths)) < 2:
            continue
        raise diagnosis.Finding(
            f"the waveforms are padded without an attention mask: a batch of the training split holds clips of "
            f"{min(lengths)} to {max(lengths)} samples, padded to one length, and no attention_mask; "
            f"{type(model).__name__} has feat_extract_norm='layer' (as wav2vec2-large-lv60 and XLS-R), whose "
            "checkpoints read padding as audio unless masked, so each clip's outputs depend on the clips it is "
            "batched with, and differ from inference on the clip alone",
            "have the feature extractor return the mask, so that its pad() passes it to the model: "
            "Wav2Vec2FeatureExtractor(..., return_attention_mask=True), as such a checkpoint's "
            "preprocessor_config.json says",
        )

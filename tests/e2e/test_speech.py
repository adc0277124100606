"""Speech pipelines against their feature extractor (`collate`): audio stored at another sampling rate than the
extractor reads and fed without resampling, and padded waveforms without the attention mask a layer-norm Wav2Vec2
needs. Each with its correct twin."""

from __future__ import annotations

import json

import pytest
from pipeline_runs import failures, run_script, write

STAGES = "--trainer-stages=dataset,collate,forward"

# Wav2Vec2 audio classification whose audio stays in the dataset, as {"array", "sampling_rate"} values, and is turned
# into input_values by a transform each time a row is read (set_transform, as in the audio classification guide).
WAVEFORMS = """
    import numpy as np
    from datasets import Dataset
    from scipy.signal import resample_poly
    from transformers import (DataCollatorWithPadding, Trainer, TrainingArguments, Wav2Vec2Config,
                              Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification)

    RATE = {rate}
    rng = np.random.default_rng(0)
    clips, labels = [], []
    for i in range(24):
        length = int(rng.integers(RATE // 20, RATE // 10))
        t = np.arange(length) / RATE
        wave = np.sin(2 * np.pi * 300 * (i % 3 + 1) * t) + 0.3 * rng.standard_normal(length)
        clips.append({{"array": wave.astype(np.float32).tolist(), "sampling_rate": RATE}})
        labels.append(i % 3)
    data = Dataset.from_dict({{"audio": clips, "label": labels}})

    extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True,
                                         return_attention_mask=True)

    def prepare(batch):
        arrays = [{array} for audio in batch["audio"]]
        features = extractor(arrays, sampling_rate=16000)
        features["labels"] = batch["label"]
        return features

    data.set_transform(prepare)
    config = Wav2Vec2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                            conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_feat_extract_layers=2,
                            feat_extract_norm="layer", num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                            classifier_proj_size=16, mask_time_prob=0.0, num_labels=3)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, report_to="none",
                             remove_unused_columns=False)
    trainer = Trainer(model=Wav2Vec2ForSequenceClassification(config), args=args, train_dataset=data,
                      processing_class=extractor, data_collator=DataCollatorWithPadding(extractor))
    trainer.train()
"""
AS_STORED = 'audio["array"]'
RESAMPLED = 'resample_poly(np.asarray(audio["array"]), 16000 // audio["sampling_rate"], 1)'


def test_waveforms_stored_at_8_khz_and_fed_as_16_khz_fail_collate(project: pytest.Pytester) -> None:
    write(project, "train.py", WAVEFORMS.format(rate=8000, array=AS_STORED))
    result = run_script(project, STAGES)
    assert failures(result) == ["collate[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "collate[[]cpu[]] failed: the audio is fed at the wrong sampling rate: training rows 0, 11, 23 hold "
            "'audio' sampled at 8000 Hz*read as 16000 Hz audio (the rate Wav2Vec2FeatureExtractor reads): the model "
            "hears every clip 2x faster and higher*",
            "*fix: resample the audio to 16000 Hz before the feature extractor: resample each array, "
            "librosa.resample(array, orig_sr=8000, target_sr=16000)*sampling_rate=16000",
        ]
    )


@pytest.mark.parametrize(
    ("rate", "array"), [(8000, RESAMPLED), (16000, AS_STORED)], ids=["resampled-to-16-khz", "stored-at-16-khz"]
)
def test_waveforms_at_the_extractors_rate_pass(project: pytest.Pytester, rate: int, array: str) -> None:
    write(project, "train.py", WAVEFORMS.format(rate=rate, array=array))
    assert failures(run_script(project, STAGES)) == []


# Whisper audio classification on log-mel spectrograms, made once by map(), its rate in a column of its own: the audio
# kept beside them (the Trainer drops it), or dropped by the map and the name rebound, as the Whisper blog post does.
SPECTROGRAMS = """
    import numpy as np
    from datasets import Dataset
    from scipy.signal import resample_poly
    from transformers import (Trainer, TrainingArguments, WhisperConfig, WhisperFeatureExtractor,
                              WhisperForAudioClassification)

    RATE = 8000
    rng = np.random.default_rng(0)
    waves = [np.sin(np.arange(int(rng.integers(4000, 8000))) * rng.uniform(0.05, 0.4)).astype(np.float32)
             + 0.1 * rng.standard_normal(1).astype(np.float32) for _ in range(16)]
    data = Dataset.from_dict({{"speech": waves, "sampling_rate": [RATE] * 16, "label": [i % 2 for i in range(16)]}})
    extractor = WhisperFeatureExtractor(feature_size=16, chunk_length=1)  # 1 s of audio: 100 frames of 16 bins

    def prepare(row):
        speech = {speech}
        return {{"input_features": extractor(speech, sampling_rate=16000).input_features[0]}}

    data = data.map(prepare{drop})
    config = WhisperConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=16,
                           max_source_positions=50, max_target_positions=16, num_labels=2)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
    trainer = Trainer(model=WhisperForAudioClassification(config), args=args, train_dataset=data,
                      processing_class=extractor)
    trainer.train()
"""


DROP = ', remove_columns=["speech", "sampling_rate"]'


@pytest.mark.parametrize("drop", ["", DROP], ids=["audio-kept", "audio-dropped-by-map"])
def test_spectrograms_of_8_khz_audio_read_as_16_khz_fail_collate(project: pytest.Pytester, drop: str) -> None:
    write(project, "train.py", SPECTROGRAMS.format(speech='row["speech"]', drop=drop))
    result = run_script(project, STAGES)
    assert failures(result) == ["collate[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "collate[[]cpu[]] failed: the audio is fed at the wrong sampling rate: training rows 0, 7, 15 hold "
            "'speech' sampled at 8000 Hz, and the input_features the collator makes of them*",
        ]
    )


@pytest.mark.parametrize("drop", ["", DROP], ids=["audio-kept", "audio-dropped-by-map"])
def test_spectrograms_of_resampled_audio_pass(project: pytest.Pytester, drop: str) -> None:
    write(project, "train.py", SPECTROGRAMS.format(speech='resample_poly(np.asarray(row["speech"]), 2, 1)', drop=drop))
    assert failures(run_script(project, STAGES)) == []


def test_audio_cut_into_chunks_by_map_is_said_unchecked(project: pytest.Pytester) -> None:
    """A map() that cuts each clip in two leaves no dataset of as many rows to read the audio in: said, not hidden."""
    chunks = """
    def halves(batch):
        made = {"input_features": [], "label": []}
        for speech, label in zip(batch["speech"], batch["label"]):
            for half in (speech[: len(speech) // 2], speech[len(speech) // 2 :]):
                made["input_features"].append(extractor(half, sampling_rate=16000).input_features[0])
                made["label"].append(label)
        return made

    data = data.map(halves, batched=True, remove_columns=data.column_names)"""
    source = SPECTROGRAMS.format(speech='row["speech"]', drop="").replace("    data = data.map(prepare)", chunks)
    write(project, "train.py", source)
    result = run_script(project, STAGES, "--trainer-report=report.json")
    assert failures(result) == []
    items = json.loads((project.path / "report.json").read_text())["items"]
    collate = next(item for item in items if item["stage"] == "collate")
    assert any(
        note.startswith("not checked: the audio's sampling rate against the 16000 Hz WhisperFeatureExtractor reads")
        for note in collate["notes"]
    )


# Waveforms padded by the extractor's pad(), with or without the attention mask, for both feature encoder norms.
PADDED = """
    import numpy as np
    from datasets import Dataset
    from transformers import (DataCollatorWithPadding, Trainer, TrainingArguments, Wav2Vec2Config,
                              Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification)

    rng = np.random.default_rng(0)
    waves = [rng.standard_normal(int(rng.integers(800, 1601))).astype(np.float32) for _ in range(16)]
    raw = Dataset.from_dict({{"audio": waves, "label": [i % 2 for i in range(16)]}})
    extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True,
                                         return_attention_mask={mask})
    data = raw.map(lambda batch: extractor(batch["audio"], sampling_rate=16000), batched=True, remove_columns=["audio"])
    config = Wav2Vec2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                            conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_feat_extract_layers=2,
                            feat_extract_norm="{norm}", num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                            classifier_proj_size=16, mask_time_prob=0.0, num_labels=2)
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, report_to="none")
    trainer = Trainer(model=Wav2Vec2ForSequenceClassification(config), args=args, train_dataset=data,
                      processing_class=extractor, data_collator=DataCollatorWithPadding(extractor))
    trainer.train()
"""


def test_a_layer_norm_wav2vec2_fed_padding_without_a_mask_fails_collate(project: pytest.Pytester) -> None:
    write(project, "train.py", PADDED.format(mask=False, norm="layer"))
    result = run_script(project, STAGES)
    assert failures(result) == ["collate[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "collate[[]cpu[]] failed: the waveforms are padded without an attention mask: a batch of the training "
            "split holds clips of * to * samples*Wav2Vec2ForSequenceClassification has feat_extract_norm='layer'*",
            "*fix: have the feature extractor return the mask*return_attention_mask=True*",
        ]
    )


@pytest.mark.parametrize(
    ("mask", "norm"), [(True, "layer"), (False, "group")], ids=["layer-norm-with-mask", "group-norm-as-wav2vec2-base"]
)
def test_padding_as_the_checkpoint_expects_passes(project: pytest.Pytester, mask: bool, norm: str) -> None:
    write(project, "train.py", PADDED.format(mask=mask, norm=norm))
    assert failures(run_script(project, STAGES)) == []


# ---- a model in half precision, fed the float32 features of its extractor ------------------------------------------


def _in_half(dtype: str, flag: str) -> str:
    """The stored-at-16-kHz script with its model cast to `dtype` and `flag` (bf16=True, fp16=True) in its arguments:
    Wav2Vec2's first convolution takes the extractor's float32 input_values as they come."""
    source = WAVEFORMS.format(rate=16000, array=AS_STORED)
    source = source.replace("import numpy as np", "import numpy as np\n    import torch")
    source = source.replace(
        "model=Wav2Vec2ForSequenceClassification(config)",
        f"model=Wav2Vec2ForSequenceClassification(config).to(torch.{dtype})",
    )
    return source.replace("remove_unused_columns=False", f"remove_unused_columns=False, {flag}")


def test_bf16_weights_left_to_bf16_autocast_are_not_checked(project: pytest.Pytester) -> None:
    """In training, bf16=True's autocast casts the features at the convolution; the items run the model without it:
    not a failure of the script, and not checked."""
    write(project, "train.py", _in_half("bfloat16", "bf16=True"))
    result = run_script(project, STAGES, "-rs")
    assert failures(result) == []
    result.stdout.fnmatch_lines(
        [
            "*not checked: the model's weights are bfloat16 and its forward leaves the cast of its float32 inputs "
            "(input_values) to the autocast that bf16=True turns on inside trainer.train()*"
        ]
    )


def test_bf16_weights_without_mixed_precision_fail_forward(project: pytest.Pytester) -> None:
    write(project, "train.py", _in_half("bfloat16", "bf16=False"))
    result = run_script(project, STAGES)
    assert failures(result) == ["forward[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "forward[[]cpu[]] failed: the model's weights are bfloat16 (* tensors, e.g. *) but its float32 inputs "
            "(input_values) are not, and no mixed precision casts them (neither bf16=True nor fp16=True)*",
            "*fix: load the model in float32 (dtype=torch.float32;*and train with bf16=True*",
        ]
    )


def test_fp16_weights_under_fp16_fail_forward_naming_the_gradient_scaler(project: pytest.Pytester) -> None:
    """On a GPU the forward runs under fp16 autocast, and the first step stops at the gradient scaler: the CPU's
    fp32 forward fails first, with that cause rather than the convolution's dtype error."""
    write(project, "train.py", _in_half("float16", "fp16=True"))
    result = run_script(project, STAGES)
    assert failures(result) == ["forward[cpu]"]
    result.stdout.fnmatch_lines(
        [
            "forward[[]cpu[]] failed: * trainable weights are fp16 under fp16=True mixed precision (e.g. *): the "
            'gradient scaler refuses fp16 gradients on a GPU ("Attempting to unscale FP16 gradients")*',
            "*fix: keep trainable weights in fp32*dtype=torch.float32 (transformers 5 loads a checkpoint in the dtype*",
        ]
    )


def test_fp32_weights_under_bf16_pass(project: pytest.Pytester) -> None:
    write(project, "train.py", _in_half("float32", "bf16=True"))
    assert failures(run_script(project, STAGES)) == []

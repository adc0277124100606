"""Audio read back against its feature extractor's sampling rate (`audio`), on waveforms built here: where a row holds
its audio, and whether features follow the samples as they are or resampled. The features here are the waveforms
themselves, as a Wav2Vec2 extractor's are up to their normalization, which the comparison ignores."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_trainer.audio import correlation, fed_as_is, raw_audio, resampled


def clip(rate: int, seconds: float = 0.5, seed: int = 0) -> np.ndarray:
    """Speech-like audio at `rate`: a 200 Hz tone swelling 3 times a second, a 1.2 kHz partial, a little noise."""
    t = np.arange(int(rate * seconds)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.size)
    return np.sin(2 * np.pi * 200 * t) * np.sin(2 * np.pi * 3 * t) + 0.3 * np.sin(2 * np.pi * 1200 * t) + 0.05 * noise


def normalized(values: np.ndarray) -> np.ndarray:
    return (values - values.mean()) / values.std()


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_samples_fed_as_they_are_at_another_rate_are_told(rate: int) -> None:
    samples = clip(rate)
    fed = normalized(samples)  # the extractor given the samples as they are, said to be 16 kHz
    assert fed_as_is(fed, samples, resampled(samples, rate, 16000))


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_samples_resampled_before_the_extractor_are_not(rate: int) -> None:
    samples = clip(rate)
    # Resampled otherwise than the check resamples (the exact tone, as a resampler of quality gives it).
    fed = normalized(clip(16000))
    assert not fed_as_is(fed, samples, resampled(samples, rate, 16000))


def test_a_clip_too_smooth_to_tell_two_rates_apart_tells_nothing() -> None:
    samples = np.linspace(0, 1, 4000)  # a ramp reads the same at any rate
    assert not fed_as_is(normalized(samples), samples, resampled(samples, 8000, 16000))


def test_correlation_compares_the_time_steps_both_hold_and_no_fewer_than_the_shortest() -> None:
    samples = clip(16000)
    assert correlation(np.concatenate([samples, np.zeros(500)]), samples) == pytest.approx(1.0)
    assert correlation(samples[:8], samples[:8]) is None
    assert correlation(np.zeros(100), samples) is None
    assert correlation(np.ones((2, 100)), np.ones((3, 100))) is None


def test_resampling_keeps_the_duration() -> None:
    assert resampled(clip(8000, 1.0), 8000, 16000).size == 16000
    assert resampled(clip(44100, 1.0), 44100, 16000).size == 16000


def test_audio_is_found_as_a_decoded_audio_value_or_an_array_beside_its_rate() -> None:
    samples = clip(8000).tolist()
    found = raw_audio({"audio": {"array": samples, "sampling_rate": 8000, "path": None}, "label": 1})
    assert found is not None and found[0] == "audio" and found[2] == 8000 and found[1].size == len(samples)
    found = raw_audio({"speech": samples, "sampling_rate": 8000, "label": 1})
    assert found is not None and found[0] == "speech" and found[2] == 8000


@pytest.mark.parametrize(
    "row",
    [
        {"input_values": clip(16000).tolist(), "label": 1},  # features only: the audio was dropped
        {"audio": {"path": "a.wav", "bytes": None}},  # not decoded
        {"speech": clip(8000).tolist(), "noise": clip(8000).tolist(), "sampling_rate": 8000},  # which one?
        {"audio": {"array": [0.1, 0.2], "sampling_rate": 8000}},  # too short to compare
        {"text": "hello", "sampling_rate": 8000},
    ],
    ids=["features-only", "undecoded", "two-arrays", "too-short", "text"],
)
def test_rows_without_one_readable_waveform_hold_no_audio(row: dict) -> None:
    assert raw_audio(row) is None

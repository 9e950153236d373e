"""Synthetic cuts in corpus order: one speaker's cuts after another's, each speaker's speech
rate its own (what shards written in corpus order hold, for the batching benchmark)."""

import numpy as np
import pytest

from asr.data.synthetic_cuts import synthetic_cuts


def _rates(cuts) -> np.ndarray:
    return np.array([c.custom["num_tokens"] / c.duration for c in cuts])


def test_speakers_run_one_after_another_with_rates_of_their_own():
    plain = synthetic_cuts(2000, seed=4)
    ordered = synthetic_cuts(2000, seed=4, speakers=20)
    assert [c.duration for c in ordered] == [c.duration for c in plain]  # the same lengths
    runs = _rates(ordered).reshape(20, 100)  # speaker k: cuts 100k .. 100k + 99
    within = np.median(runs.std(axis=1))
    across = np.median(_rates(plain).reshape(20, 100).std(axis=1))
    assert within < 0.6 * across  # a speaker's cuts share a rate; random order mixes them
    assert runs.mean(axis=1).std() > 2 * (within / np.sqrt(100))  # and speakers differ


def test_a_bad_speaker_count_is_refused():
    with pytest.raises(ValueError, match="speakers must be >= 1, got 0"):
        synthetic_cuts(10, speakers=0)

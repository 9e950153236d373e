from pathlib import Path

import numpy as np
import pytest
import torch

from asr.data.corpus import load_cuts
from asr.data.features import (
    FeatureConfig,
    compute_features,
    precompute_features,
    single_threaded,
    to_mono,
)

DEV = "dev-clean"


def _tone(seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(16_000 * seconds)) / 16_000
    rng = np.random.default_rng(0)
    return (0.5 * np.sin(2 * np.pi * 440 * t) + 0.01 * rng.standard_normal(t.size)).astype(
        np.float32
    )


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="data.features.source .* got 'disk'"):
        FeatureConfig(source="disk")
    with pytest.raises(ValueError, match="data.features.normalize .* got 'global'"):
        FeatureConfig(normalize="global")


def test_per_utterance_normalization() -> None:
    config = FeatureConfig(num_mel_bins=40)
    feats = compute_features(_tone(), config, config.extractor())
    assert feats.shape == (100, 40) and feats.dtype == np.float32  # 10 ms frames
    np.testing.assert_allclose(feats.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(feats.std(axis=0), 1, atol=1e-2)


def test_no_normalization_is_the_raw_log_mel() -> None:
    config = FeatureConfig(num_mel_bins=40, normalize="none")
    raw = config.extractor().extract(_tone(), 16_000)
    np.testing.assert_array_equal(compute_features(_tone(), config, config.extractor()), raw)


def test_single_threaded_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    with single_threaded():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_precompute_stores_features_once(tiny_corpus, tmp_path: Path) -> None:
    out = tmp_path / "dev-feats.jsonl.gz"
    assert precompute_features(tiny_corpus.cuts(DEV), out) == out
    cuts = list(load_cuts(out))
    assert [c.id for c in cuts] == [c.id for c in load_cuts(tiny_corpus.cuts(DEV))]
    assert all(c.has_features and c.num_features == 80 for c in cuts)
    assert cuts[0].load_features().shape == (cuts[0].num_frames, 80)
    assert (tmp_path / "dev-feats_feats.lca").is_file()
    before = out.stat().st_mtime_ns
    precompute_features(tiny_corpus.cuts(DEV), out)  # exists: nothing recomputed
    assert out.stat().st_mtime_ns == before


def test_precompute_into_a_new_directory(tiny_corpus, tmp_path: Path) -> None:
    out = tmp_path / "new" / "dir" / "dev-feats.jsonl.gz"
    assert precompute_features(tiny_corpus.cuts(DEV), out) == out
    assert out.is_file()


def test_to_mono_averages_channels_and_keeps_mono() -> None:
    stereo = np.stack([np.ones(5), np.zeros(5)]).astype(np.float64)
    assert np.array_equal(to_mono(stereo), np.full(5, 0.5, np.float32))
    assert to_mono(stereo).dtype == np.float32
    mono = np.arange(4, dtype=np.float32)
    assert np.array_equal(to_mono(mono), mono) and np.array_equal(to_mono(mono[None]), mono)
    with pytest.raises(ValueError, match=r"\(channels, samples\)"):
        to_mono(np.zeros((1, 2, 3)))

from pathlib import Path

import numpy as np
import pytest
import torch

from asr.data.corpus import load_cuts
from asr.data.features import (
    FRONTENDS,
    FeatureConfig,
    OnlineFeatures,
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
    with pytest.raises(ValueError, match="data.features.source='disk' is unknown"):
        FeatureConfig(source="disk")
    with pytest.raises(ValueError, match="data.features.normalize='global' is unknown"):
        FeatureConfig(normalize="global")
    with pytest.raises(ValueError, match=r"data.features.frontend='nemo' is unknown.*librosa"):
        FeatureConfig(frontend="nemo")


@pytest.mark.parametrize("frontend", ["kaldi", "librosa", "librosa_povey"])
def test_online_features_in_pieces_are_the_whole_recordings(frontend: str) -> None:
    """Frames computed as the samples arrive, in pieces of any size, equal the frames of
    the whole recording; frames already used can be freed."""
    audio = _tone()
    config = FeatureConfig(frontend=frontend)
    whole = OnlineFeatures(config)
    whole.accept(audio)
    whole.finish()
    expected = whole.frames(0, whole.ready)
    pieces = OnlineFeatures(config)
    got, start = [], 0
    for size in (1, 159, 0, 400, 1603, 7, 20000):
        pieces.accept(audio[start : start + size])
        start += size
        got.append(pieces.frames(len(np.concatenate(got)) if got else 0, pieces.ready))
        pieces.discard_before(pieces.ready)
    pieces.accept(audio[start:])
    pieces.finish()
    done = sum(len(g) for g in got)
    got.append(pieces.frames(done, pieces.ready))
    np.testing.assert_array_equal(np.concatenate(got), expected)
    with pytest.raises(Exception, match="already removed"):
        pieces.frames(0, 1)


def test_the_kaldi_front_end_streams_as_lhotse_computes_it() -> None:
    audio = _tone()
    online = OnlineFeatures(FeatureConfig())
    online.accept(audio)
    online.finish()
    lhotse = FeatureConfig().extractor().extract(audio, 16000)
    assert online.frames(0, online.ready).shape == lhotse.shape
    np.testing.assert_allclose(online.frames(0, online.ready), lhotse, atol=1e-3)


def precompute_features_of(cuts, output: Path, frontend: str) -> Path:
    source = output.with_name("source.jsonl.gz")
    cuts.to_file(source)
    return precompute_features(source, output, FeatureConfig(frontend=frontend))


def test_the_front_ends_differ_and_store_with_lhotse(tiny_corpus, tmp_path: Path) -> None:
    audio = _tone()
    extractors = {f: FeatureConfig(frontend=f).extractor() for f in FRONTENDS}
    assert extractors["librosa"].name == "asr-librosa-fbank"
    assert extractors["librosa_povey"].name == "asr-librosa-povey-fbank"
    feats = {f: e.extract(audio[None], 16000) for f, e in extractors.items()}  # (1, N): lhotse's
    assert {f.shape for f in feats.values()} == {feats["kaldi"].shape}
    for a, b in (("kaldi", "librosa"), ("librosa", "librosa_povey")):
        assert np.abs(feats[a] - feats[b]).mean() > 0.1, (a, b)
    cuts = load_cuts(tiny_corpus.cuts(DEV)).subset(first=2)
    stored = precompute_features_of(cuts, tmp_path / "povey.jsonl.gz", "librosa_povey")
    for cut in load_cuts(stored):
        assert cut.features.type == "asr-librosa-povey-fbank"
        np.testing.assert_allclose(
            cut.load_features(),
            extractors["librosa_povey"].extract(cut.load_audio()[0], 16000),
            atol=0.05,  # lilcom's compression
        )


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

"""Global feature statistics (`asr-feature-stats`): the mean and deviation of every bin over
a manifest's features, written as JSON, read back with errors naming the file, and copied
into a model's encoder by asr-train."""

from pathlib import Path

import numpy as np
import pytest
import torch

from asr.data.corpus import load_cuts
from asr.data.feature_stats import compute_feature_stats, main, read_feature_stats
from asr.data.features import FeatureConfig

DEV = "dev-clean"


def test_the_statistics_are_those_of_every_frame(tiny_corpus, tmp_path: Path) -> None:
    config = FeatureConfig(frontend="librosa")
    stats = compute_feature_stats([tiny_corpus.cuts(DEV)], config, progress=False)
    extractor = config.extractor()
    frames = np.concatenate(
        [extractor.extract(c.load_audio()[0], 16000) for c in load_cuts(tiny_corpus.cuts(DEV))]
    )
    assert stats.frames == len(frames) and stats.frontend == "librosa"
    np.testing.assert_allclose(stats.mean, frames.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(stats.std, frames.std(0), rtol=1e-3, atol=1e-3)
    path = stats.write(tmp_path / "stats.json")
    mean, std = read_feature_stats(path, 80)
    assert torch.allclose(mean, torch.tensor(stats.mean, dtype=torch.float32), atol=1e-5)
    assert torch.allclose(std, torch.tensor(stats.std, dtype=torch.float32), atol=1e-5)


def test_the_command_writes_them_and_bad_files_are_named(tiny_corpus, tmp_path: Path, capsys):
    out = tmp_path / "stats.json"
    main(["--cuts", str(tiny_corpus.cuts(DEV)), "--source", "on_the_fly", "--output", str(out)])
    assert f"wrote {out}" in capsys.readouterr().out
    assert read_feature_stats(out, 80)[0].shape == (80,)
    with pytest.raises(ValueError, match=f"{out} holds statistics of 80 bins, the model reads 40"):
        read_feature_stats(out, 40)
    with pytest.raises(
        FileNotFoundError, match="feature statistics not found: .*asr-feature-stats"
    ):
        read_feature_stats(tmp_path / "missing.json", 80)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=f"{broken} is not a feature statistics file"):
        read_feature_stats(broken, 80)

"""AdaScale's gain from 2 real processes over gloo: 1 without gradient noise, the number
of ranks for pure noise, and the formula's value in between."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr.config_keys import ConfigError
from asr.training.distributed.savers.adascale import AdaScaleConfig


@pytest.mark.slow  # real processes over gloo
def test_gain_is_one_without_noise_and_the_rank_count_for_pure_noise(
    run_ranks, tmp_path: Path
) -> None:
    same = run_ranks(tmp_path, "adascale-same", steps=3)
    noise = run_ranks(tmp_path, "adascale-noise", steps=3)
    for rank in range(2):
        assert same[rank]["gains"] == pytest.approx([1.0] * 3, abs=1e-9)
        assert all(g > 1.9 for g in noise[rank]["gains"]), noise[rank]["gains"]
    assert same[0]["gains"] == same[1]["gains"] and noise[0]["gains"] == noise[1]["gains"]


@pytest.mark.slow  # real processes over gloo
def test_gain_between_follows_the_noise_to_signal_ratio(run_ranks, tmp_path: Path) -> None:
    # mean and noise of equal squared norm: (s2 + m2) / (s2 / 2 + m2) = 2 / 1.5
    mixed = run_ranks(tmp_path, "adascale-mixed", steps=4)
    assert all(abs(g - 4 / 3) < 0.1 for g in mixed[0]["gains"]), mixed[0]["gains"]


def test_smoothing_is_checked() -> None:
    with pytest.raises(ConfigError, match="smoothing must be in"):
        AdaScaleConfig(smoothing=1.0)

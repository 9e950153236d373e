"""AdaScale's gain from 2 real processes over gloo: 1 without gradient noise, the number
of ranks for pure noise, and the formula's value in between."""

from __future__ import annotations

from pathlib import Path

import pytest

from asr.config_keys import ConfigError
from asr.training.distributed.communication.adascale import (
    AdaScaleConfig,
    AdaScaleState,
    adascale_hook,
)

SIZES = [700, 300, 1500]  # a DDP bucket each


def adascale_gains(rank: int, world: int, out_dir: Path, steps: int, gradients: str) -> dict:
    """Scenario (run on every rank by `run_ranks`): AdaScale's gain per step when the ranks'
    gradients are `same` (a shared mean: no noise), `noise` (independent zero-mean: pure
    noise) or `mixed` (the shared mean plus independent noise of the same squared norm)."""
    from exchange import Vectors, exchanged, rank_gradients
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(Vectors([(n,) for n in SIZES]), bucket_cap_mb=0.005)
    adascale = AdaScaleState(AdaScaleConfig(smoothing=0.0))
    model.register_comm_hook(adascale, adascale_hook)
    gains = []
    for step in range(steps):
        mean = rank_gradients([(n,) for n in SIZES], step, seed=0)
        noise = rank_gradients([(n,) for n in SIZES], step, seed=1 + rank)
        coefficients = {
            "same": mean,
            "noise": noise,
            "mixed": [m + z for m, z in zip(mean, noise, strict=True)],
        }[gradients]
        exchanged(model, coefficients)
        gains.append(adascale.finish_step())
    return {"gains": gains}


@pytest.mark.slow  # real processes over gloo
def test_gain_is_one_without_noise_and_the_rank_count_for_pure_noise(
    run_ranks, tmp_path: Path
) -> None:
    same = run_ranks(tmp_path, adascale_gains, steps=3, gradients="same")
    noise = run_ranks(tmp_path, adascale_gains, steps=3, gradients="noise")
    for rank in range(2):
        assert same[rank]["gains"] == pytest.approx([1.0] * 3, abs=1e-9)
        assert all(g > 1.9 for g in noise[rank]["gains"]), noise[rank]["gains"]
    assert same[0]["gains"] == same[1]["gains"] and noise[0]["gains"] == noise[1]["gains"]


@pytest.mark.slow  # real processes over gloo
def test_gain_between_follows_the_noise_to_signal_ratio(run_ranks, tmp_path: Path) -> None:
    # mean and noise of equal squared norm: (s2 + m2) / (s2 / 2 + m2) = 2 / 1.5
    mixed = run_ranks(tmp_path, adascale_gains, steps=4, gradients="mixed")
    assert all(abs(g - 4 / 3) < 0.1 for g in mixed[0]["gains"]), mixed[0]["gains"]


def test_smoothing_is_checked() -> None:
    with pytest.raises(ConfigError, match="smoothing must be in"):
        AdaScaleConfig(smoothing=1.0)

"""Log-mel filterbank features: settings, extraction, normalization, and storage.

Features are computed on the fly from audio by default. `precompute_features` stores them
once with lhotse (lilcom-compressed), which saves the extraction on every epoch when the
CPU is the bottleneck: `asr-compute-features --cuts IN --output OUT`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from lhotse import Fbank, FbankConfig, LilcomChunkyWriter

from asr.cli import command
from asr.frames import SAMPLE_RATE


@dataclass(frozen=True)
class FeatureConfig:
    """Log-mel filterbank settings (keys of the `data.features` config).

    - `num_mel_bins`: filterbank bins per frame.
    - `source`: `on_the_fly` (from audio) or `precomputed` (stored lhotse features where a
      cut has them, `asr.data.features.precompute_features`; from audio otherwise).
    - `dither`: Kaldi-style dither added to the samples (0: none).
    - `normalize`: `per_utterance` (mean and variance of each utterance) or `none`.
    """

    num_mel_bins: int = 80
    source: str = "on_the_fly"
    dither: float = 0.0
    normalize: str = "per_utterance"

    def __post_init__(self) -> None:
        if self.source not in ("on_the_fly", "precomputed"):
            raise ValueError(
                f"data.features.source must be 'on_the_fly' or 'precomputed', got {self.source!r}"
            )
        if self.normalize not in ("per_utterance", "none"):
            raise ValueError(
                f"data.features.normalize must be 'per_utterance' or 'none', got {self.normalize!r}"
            )

    def extractor(self) -> Fbank:
        return Fbank(FbankConfig(num_mel_bins=self.num_mel_bins, dither=self.dither))


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run torch on one thread inside the block: filterbank extraction is many small ops,
    which intra-op threads only slow down (by far, on a machine with few cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_sample_rate(cut_id: str, sampling_rate: int) -> None:
    """Raise when a cut's audio is not at `SAMPLE_RATE`: the rate of a whole corpus, so a
    set-up error to fix once, not bad data to skip."""
    if sampling_rate != SAMPLE_RATE:
        raise ValueError(
            f"cut {cut_id} is {sampling_rate} Hz audio but features are computed at "
            f"{SAMPLE_RATE} Hz: resample the corpus (lhotse: cuts.resample({SAMPLE_RATE}))"
        )


def to_mono(audio: np.ndarray) -> np.ndarray:
    """(N,) or (channels, N) samples -> (N,) float32, channels averaged: the one rule for
    multi-channel audio in training, decoding and transcription."""
    audio = np.asarray(audio)
    if audio.ndim == 2:
        audio = audio.mean(axis=0)
    elif audio.ndim != 1:
        raise ValueError(f"audio must be (samples,) or (channels, samples), got {audio.shape}")
    return audio.astype(np.float32, copy=False)


def compute_features(audio: np.ndarray, config: FeatureConfig, extractor: Fbank) -> np.ndarray:
    """(T, F) log-mel of 16 kHz mono `audio`, normalized as `config` says."""
    with single_threaded():
        feats = extractor.extract(audio, SAMPLE_RATE)
    return normalize_features(feats, config.normalize)


def normalize_features(feats: np.ndarray, mode: str) -> np.ndarray:
    if mode == "per_utterance":
        feats = (feats - feats.mean(axis=0)) / (feats.std(axis=0) + 1e-5)
    return feats.astype(np.float32, copy=False)


def precompute_features(
    cuts_path: str | Path,
    output_path: str | Path,
    config: FeatureConfig = FeatureConfig(),
    num_jobs: int = 1,
) -> Path:
    """Compute and store fbank for every cut of `cuts_path`; write the cuts, now carrying
    their features, to `output_path` (a .jsonl.gz manifest; storage goes beside it)."""
    from asr.data.corpus import load_cuts

    output_path = Path(output_path)
    if output_path.is_file():
        return output_path
    output_path.parent.mkdir(parents=True, exist_ok=True)
    storage = output_path.parent / output_path.name.replace(".jsonl.gz", "_feats")
    cuts = load_cuts(cuts_path).to_eager()
    with single_threaded():
        with_feats = cuts.compute_and_store_features(
            extractor=config.extractor(),
            storage_path=storage,
            num_jobs=num_jobs,
            storage_type=LilcomChunkyWriter,
        )
    tmp = output_path.with_name(output_path.name + ".tmp.jsonl.gz")
    with_feats.to_file(tmp)
    tmp.replace(output_path)
    return output_path


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Precompute log-mel features for a manifest.")
    parser.add_argument("--cuts", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True, help="cuts manifest with features")
    parser.add_argument("--num-mel-bins", type=int, default=80)
    parser.add_argument("--num-jobs", type=int, default=1, help="one is usually enough")
    args = parser.parse_args(argv)
    config = FeatureConfig(num_mel_bins=args.num_mel_bins, source="precomputed")
    print(f"wrote {precompute_features(args.cuts, args.output, config, args.num_jobs)}")


if __name__ == "__main__":
    main()

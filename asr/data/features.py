"""Log-mel filterbank features: settings, extraction, normalization, and storage.

Features are computed on the fly from audio by default. `precompute_features` stores them
once with lhotse (lilcom-compressed), which saves the extraction on every epoch when the
CPU is the bottleneck: `asr-compute-features --cuts IN --output OUT`.

Three front ends, each what sherpa-onnx computes for one kind of exported model, so a
deployed model hears what it was trained on: `kaldi` (lhotse's Kaldi-compatible fbank; its
icefall transducers), `librosa` (kaldi-native-fbank with a librosa mel bank, a Hann window,
0-8 kHz: NeMo's own, and its online NeMo recognizer's, which decodes streaming exports)
and `librosa_povey` (the same mel bank with a Povey window and a 7.6 kHz upper edge: its
offline NeMo recognizer's).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import kaldi_native_fbank as knf
import numpy as np
import torch
from lhotse import Fbank, FbankConfig, LilcomChunkyWriter
from lhotse.features.base import FeatureExtractor, register_extractor

from asr.cli import command
from asr.config_keys import check_choice
from asr.frames import FRAME_SHIFT_SECONDS, SAMPLE_RATE
from asr.normalization import per_utterance

FRONTENDS = ("kaldi", "librosa", "librosa_povey")
NORMALIZATIONS = ("per_utterance", "none")


@dataclass(frozen=True)
class FeatureConfig:
    """Log-mel filterbank settings (keys of the `data.features` config).

    - `num_mel_bins`: filterbank bins per frame.
    - `source`: `on_the_fly` (from audio) or `precomputed` (stored lhotse features where a
      cut has them, `asr.data.features.precompute_features`; from audio otherwise).
    - `dither`: Kaldi-style dither added to the samples (0: none; `kaldi` front end).
    - `normalize`: `per_utterance` (mean and variance of each utterance) or `none` (raw, or
      normalized inside the model with `model.encoder.feature_stats`).
    - `frontend`: `kaldi` (lhotse's Kaldi-compatible fbank, which sherpa-onnx computes for
      icefall's contract), `librosa` (kaldi-native-fbank's librosa mel bank, Hann window, no
      DC removal, 0-8000 Hz: sherpa-onnx's online NeMo recognizer, for streaming exports)
      or `librosa_povey` (the same with a Povey window and 0-7600 Hz: its offline NeMo
      recognizer, for an LSTM predictor's export).
    """

    num_mel_bins: int = 80
    source: str = "on_the_fly"
    dither: float = 0.0
    normalize: str = "per_utterance"
    frontend: str = "kaldi"

    def __post_init__(self) -> None:
        check_choice("data.features.source", self.source, ("on_the_fly", "precomputed"))
        check_choice("data.features.normalize", self.normalize, NORMALIZATIONS)
        check_choice("data.features.frontend", self.frontend, FRONTENDS)

    def extractor(self) -> FeatureExtractor:
        """The lhotse feature extractor of this front end."""
        if self.frontend == "librosa":
            return LibrosaFbank(LibrosaFbankConfig(num_mel_bins=self.num_mel_bins))
        if self.frontend == "librosa_povey":
            return LibrosaPoveyFbank(LibrosaFbankConfig(num_mel_bins=self.num_mel_bins))
        return Fbank(FbankConfig(num_mel_bins=self.num_mel_bins, dither=self.dither))


def online_fbank_options(config: FeatureConfig) -> knf.FbankOptions:
    """kaldi-native-fbank's settings for `config`'s front end (samples in [-1, 1], no
    dither). `librosa`: what sherpa-onnx's online NeMo recognizer computes, `librosa_povey`
    its offline one (PostInit of `online-/offline-recognizer-transducer-nemo-impl.h`).
    `kaldi`: lhotse's `Fbank` settings (within 1.3e-4 of lhotse's output on the demo's
    audio)."""
    options = knf.FbankOptions()
    options.frame_opts.samp_freq = SAMPLE_RATE
    options.frame_opts.dither = 0.0
    options.frame_opts.snip_edges = False
    options.mel_opts.num_bins = config.num_mel_bins
    if config.frontend == "kaldi":
        options.mel_opts.low_freq = 20.0
        options.mel_opts.high_freq = -400.0
        return options
    options.frame_opts.remove_dc_offset = False
    options.mel_opts.low_freq = 0.0
    options.mel_opts.is_librosa = True
    if config.frontend == "librosa":
        options.frame_opts.window_type = "hann"
        options.mel_opts.high_freq = SAMPLE_RATE / 2
    else:  # librosa_povey: the Povey window and 7.6 kHz sherpa-onnx's offline path keeps
        options.mel_opts.high_freq = -400.0
    return options


@dataclass
class LibrosaFbankConfig:
    num_mel_bins: int = 80


@register_extractor
class LibrosaFbank(FeatureExtractor):
    """The `librosa` front end as a lhotse feature extractor (so lhotse can store it)."""

    name = "asr-librosa-fbank"
    frontend = "librosa"
    config_type = LibrosaFbankConfig

    @property
    def frame_shift(self) -> float:
        return FRAME_SHIFT_SECONDS

    def feature_dim(self, sampling_rate: int) -> int:
        return self.config.num_mel_bins

    def extract(self, samples: np.ndarray | torch.Tensor, sampling_rate: int) -> np.ndarray:
        """(T, F) log-mel of mono samples, (N,) or (1, N)."""
        config = FeatureConfig(self.config.num_mel_bins, frontend=self.frontend)
        fbank = OnlineFeatures(config)
        fbank.accept(np.asarray(samples, dtype=np.float32).reshape(-1), sampling_rate)
        fbank.finish()
        return fbank.frames(0, fbank.ready)


@register_extractor
class LibrosaPoveyFbank(LibrosaFbank):
    """The `librosa_povey` front end as a lhotse feature extractor."""

    name = "asr-librosa-povey-fbank"
    frontend = "librosa_povey"


class OnlineFeatures:
    """Features of audio that arrives in pieces (kaldi-native-fbank, `online_fbank_options`):
    frames become ready as their 25 ms of samples arrive, the same frames as over the whole
    recording. Not normalized."""

    def __init__(self, config: FeatureConfig = FeatureConfig()) -> None:
        self._fbank = knf.OnlineFbank(online_fbank_options(config))
        self.num_mel_bins = config.num_mel_bins
        self._first = 0  # frames before it are freed

    def accept(self, samples: np.ndarray, sampling_rate: int = SAMPLE_RATE) -> None:
        if sampling_rate != SAMPLE_RATE:
            raise ValueError(f"audio must be {SAMPLE_RATE} Hz, got {sampling_rate} Hz")
        if len(samples):
            self._fbank.accept_waveform(SAMPLE_RATE, np.asarray(samples, dtype=np.float32))

    def finish(self) -> None:
        """No more audio: the last frames (padded as Kaldi pads) become ready."""
        self._fbank.input_finished()

    @property
    def ready(self) -> int:
        return self._fbank.num_frames_ready

    def discard_before(self, index: int) -> None:
        """Free the frames before `index`, so a long stream's memory stays flat."""
        if index > self._first:
            self._fbank.pop(index - self._first)
            self._first = index

    def frames(self, start: int, stop: int) -> np.ndarray:
        """(stop - start, F) float32 frames, ready and not discarded."""
        if stop <= start:
            return np.zeros((0, self.num_mel_bins), dtype=np.float32)
        return np.stack([self._fbank.get_frame(i) for i in range(start, stop)])


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
    """(T, F) features as `data.features.normalize` says: `per_utterance`
    (`asr.normalization.per_utterance`, which an ONNX export's graph applies too) or
    `none`; float32."""
    feats = feats.astype(np.float32, copy=False)
    if mode == "per_utterance":
        feats = per_utterance(torch.from_numpy(feats)).numpy()
    return feats


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
    parser.add_argument("--frontend", choices=FRONTENDS, default="kaldi", help="see FeatureConfig")
    parser.add_argument("--num-jobs", type=int, default=1, help="one is usually enough")
    args = parser.parse_args(argv)
    config = FeatureConfig(
        num_mel_bins=args.num_mel_bins, source="precomputed", frontend=args.frontend
    )
    print(f"wrote {precompute_features(args.cuts, args.output, config, args.num_jobs)}")


if __name__ == "__main__":
    main()

"""Recognizer: audio -> text, with a model loaded from a bundle or checkpoint(s).

Needs neither Hydra nor Lightning: `asr.load_model(path)` returns a `Recognizer`
(`asr-transcribe BUNDLE a.flac b.wav` on the command line).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from lhotse import Recording

from asr.data.features import FeatureConfig, compute_features, to_mono
from asr.data.tokenizer import Tokenizer
from asr.decoding.search import SearchOptions, decode, decode_nbest, default_options
from asr.errors import first_line
from asr.frames import SAMPLE_RATE
from asr.inference.bundle import load_bundle
from asr.models.build import Model

AudioInput = str | Path | np.ndarray


def read_audio(path: str | Path) -> np.ndarray:
    """Mono float32 samples at 16 kHz of any file lhotse reads (resampled, channels averaged)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"audio file not found: {path}")
    try:
        recording = Recording.from_file(path)
        if recording.sampling_rate != SAMPLE_RATE:
            recording = recording.resample(SAMPLE_RATE)
        audio = recording.load_audio()
    except Exception as err:
        raise ValueError(f"cannot read audio {path}: {_audio_error(err)}") from err
    return to_mono(audio)


def _audio_error(err: BaseException) -> str:
    """The reason an audio file could not be read, short: lhotse lists every backend it
    tried on one line; libsndfile's (the first) is the one that matters for FLAC/WAV."""
    text = str(err)
    found = re.search(r"LibsndfileError'>: (.*)", text)  # one line of lhotse's list
    return found.group(1).strip() if found else first_line(err)


class Recognizer:
    """A model with its tokenizer and feature settings, ready to transcribe. `options`:
    the search (default: greedy; `AedSearchOptions(beam_size=4)` for attention decoders)."""

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        features: FeatureConfig,
        device: str | torch.device = "cpu",
        options: SearchOptions | None = None,
    ) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.features = FeatureConfig(
            **{**features.__dict__, "source": "on_the_fly", "dither": 0.0}
        )
        self.device = torch.device(device)
        self.options = options or default_options(model)
        self._extractor = self.features.extractor()

    def features_of(self, audio: np.ndarray) -> torch.Tensor:
        """(T, F) features of 16 kHz samples, (N,) or (channels, N), as the model expects."""
        return torch.from_numpy(compute_features(to_mono(audio), self.features, self._extractor))

    def _encode(self, feats: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lens = torch.tensor([f.shape[0] for f in feats], device=self.device)
        padded = torch.nn.utils.rnn.pad_sequence(list(feats), batch_first=True).to(self.device)
        return self.model.encode(padded, lens)

    @torch.inference_mode()
    def transcribe_features(self, feats: Sequence[torch.Tensor]) -> list[str]:
        """Texts of per-utterance (T, F) feature matrices, decoded as one batch."""
        ids = decode(self.model, *self._encode(feats), self.options)
        return [self.tokenizer.decode(i) for i in ids]

    @torch.inference_mode()
    def nbest_features(
        self, feats: Sequence[torch.Tensor], nbest: int
    ) -> list[list[tuple[str, float]]]:
        """Per utterance its `nbest` best (text, score), best first (a beam search at least
        `nbest` wide)."""
        hyps = decode_nbest(self.model, *self._encode(feats), self.options, nbest)
        return [[(self.tokenizer.decode(ids), score) for ids, score in h] for h in hyps]

    def transcribe(
        self, audio: AudioInput | Sequence[AudioInput], batch_size: int = 16
    ) -> list[str]:
        """Texts of audio files or 16 kHz mono float arrays (one text per input)."""
        if isinstance(audio, str | Path | np.ndarray):
            audio = [audio]
        texts: list[str] = []
        for start in range(0, len(audio), batch_size):
            chunk = audio[start : start + batch_size]
            samples = [
                read_audio(a) if isinstance(a, str | Path) else np.asarray(a, np.float32)
                for a in chunk
            ]
            feats = [self.features_of(s) for s in samples]
            texts.extend(self.transcribe_features(feats))
        return texts


def load_recognizer(
    path: str | Path | list[Path],
    device: str | torch.device = "cpu",
    beam_size: int = 1,
    max_symbols_per_frame: int | None = None,
) -> Recognizer:
    """A `Recognizer` from a bundle (`asr-export`), a training checkpoint, or a list of
    checkpoints (their averaged weights, as `asr-export` would make them); `beam_size`
    above 1 decodes with beam search; `max_symbols_per_frame` (transducers) caps the
    tokens per encoder frame (None: the search's default)."""
    model, tokenizer, features = load_bundle(path)
    options = default_options(model, beam_size, max_symbols_per_frame)
    return Recognizer(model, tokenizer, FeatureConfig(**features), device, options)

"""Recognizer: audio -> text, with a model loaded from a bundle or checkpoint(s).

Needs neither Hydra nor Lightning: `asr.load_model(path)` returns a `Recognizer`
(`asr-transcribe BUNDLE a.flac b.wav` on the command line). Recordings of any length
(`asr.inference.longform`) and word timestamps (`asr.inference.timestamps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from asr.data.features import FeatureConfig, compute_features, normalize_features, to_mono
from asr.data.tokenizer import Tokenizer
from asr.decoding.search import (
    NO_TOKEN_TIMES,
    SearchOptions,
    decode,
    decode_nbest,
    decode_timed,
    default_options,
    has_token_times,
)
from asr.frames import FRAMES_PER_SECOND
from asr.inference.audio import AudioInput, AudioSource, open_audio, read_audio
from asr.inference.bundle import load_bundle
from asr.inference.longform import WindowConfig, feature_stats, transcribe_windows
from asr.inference.pauses import shorten_pauses
from asr.inference.timestamps import Transcript, Word, words_from_tokens, words_of_text
from asr.models.build import Model

__all__ = ["AudioInput", "Recognizer", "load_recognizer", "read_audio"]

Windows = list[list[Word]]  # per window its words
MIN_SAMPLES = 400  # one 25 ms feature frame: shorter audio is transcribed as nothing


class Recognizer:
    """A model with its tokenizer and feature settings, ready to transcribe. `options`:
    the search (default: greedy; `AedSearchOptions(beam_size=4)` for attention decoders);
    `windows`: how recordings longer than one window are cut (`WindowConfig`)."""

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        features: FeatureConfig,
        device: str | torch.device = "cpu",
        options: SearchOptions | None = None,
        windows: WindowConfig | None = None,
    ) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.features = FeatureConfig(
            **{**features.__dict__, "source": "on_the_fly", "dither": 0.0}
        )
        self.device = torch.device(device)
        self.options = options or default_options(model)
        self.windows = windows or WindowConfig()
        self._extractor = self.features.extractor()

    def features_of(self, audio: np.ndarray) -> torch.Tensor:
        """(T, F) features of 16 kHz samples, (N,) or (channels, N), as the model expects."""
        return torch.from_numpy(compute_features(to_mono(audio), self.features, self._extractor))

    def _audio_features(
        self, samples: np.ndarray, stats: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[torch.Tensor, np.ndarray]:
        """Features of audio to transcribe with its long pauses shortened
        (`self.windows.max_pause`, `asr.inference.pauses`), and the index of each frame in
        the audio; normalized with `stats` (mean, std per bin) if given, else as the model
        expects."""
        raw, index = shorten_pauses(self._raw_features(to_mono(samples)), self.windows.max_pause)
        if stats is not None:
            mean, std = stats
            return torch.from_numpy(((raw - mean) / (std + 1e-5)).astype(np.float32)), index
        return torch.from_numpy(normalize_features(raw, self.features.normalize)), index

    def _raw_features(self, samples: np.ndarray) -> np.ndarray:
        return compute_features(
            samples,
            FeatureConfig(**{**self.features.__dict__, "normalize": "none"}),
            self._extractor,
        )

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

    @torch.inference_mode()
    def transcripts_of_features(
        self,
        feats: Sequence[torch.Tensor],
        offsets: Sequence[float] | None = None,
        frame_maps: Sequence[np.ndarray] | None = None,
    ) -> list[Transcript]:
        """Per utterance its text and words with their times where the model gives token
        times (words without times otherwise). Times are in seconds from the utterance's
        offset in `offsets`; `frame_maps` give each feature frame's index in the audio
        where frames were left out (`_audio_features`)."""
        offsets = offsets or [0.0] * len(feats)
        encoded = self._encode(feats)
        if not has_token_times(self.model):
            texts = [self.tokenizer.decode(i) for i in decode(self.model, *encoded, self.options)]
            return [Transcript(text, words_of_text(text)) for text in texts]
        seconds = self.model.frame_seconds
        factor = round(seconds * FRAMES_PER_SECOND)  # feature frames per encoder frame
        hyps = decode_timed(self.model, *encoded, self.options)
        transcripts = []
        for n, (hyp, offset) in enumerate(zip(hyps, offsets, strict=True)):
            frames = np.asarray(hyp.frames, dtype=np.int64) * factor
            if frame_maps is not None:
                frames = frame_maps[n][np.minimum(frames, len(frame_maps[n]) - 1)]
            starts = offset + frames / FRAMES_PER_SECOND
            pieces = [self.tokenizer.id_to_piece(i) for i in hyp.tokens]
            words = words_from_tokens(pieces, starts.tolist(), seconds)
            transcripts.append(Transcript(self.tokenizer.decode(hyp.tokens), words))
        return transcripts

    def _transcribe_samples(
        self,
        samples: Sequence[np.ndarray],
        offsets: Sequence[float],
        stats: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[Transcript]:
        """`transcripts_of_features` of audio; audio too short for one feature frame is
        transcribed as nothing."""
        results = [Transcript("", []) for _ in samples]
        kept = [i for i, s in enumerate(samples) if len(s) >= MIN_SAMPLES]
        if kept:
            feats, maps = zip(*(self._audio_features(samples[i], stats) for i in kept), strict=True)
            done = self.transcripts_of_features(feats, [offsets[i] for i in kept], maps)
            for i, transcript in zip(kept, done, strict=True):
                results[i] = transcript
        return results

    def transcribe_long(self, source: AudioSource) -> Transcript:
        """A recording of any length, in overlapping windows (`self.windows`)."""
        stats = None
        if self.windows.normalize == "recording":
            if self.features.normalize == "none":
                raise ValueError(
                    "normalize='recording' needs a model whose features are normalized "
                    "outside it: an ONNX encoder normalizes each window itself"
                )
            stats = feature_stats(
                source, lambda s: shorten_pauses(self._raw_features(s), self.windows.max_pause)[0]
            )

        def decode_batch(
            samples: Sequence[np.ndarray], starts: Sequence[float]
        ) -> list[list[Word]]:
            return [t.words for t in self._transcribe_samples(samples, starts, stats)]

        words = transcribe_windows(source, self.windows, decode_batch, has_token_times(self.model))
        return Transcript.of_words(words)

    def transcribe(
        self,
        audio: AudioInput | Sequence[AudioInput],
        batch_size: int = 16,
        timestamps: bool = False,
    ) -> list[str] | list[Transcript]:
        """Texts of audio files or 16 kHz mono float arrays (one per input), of any length:
        a recording longer than `self.windows.window` seconds is decoded in overlapping
        windows, read from its file a window at a time. With `timestamps`, a `Transcript`
        per input: its text and words, each with its start and end in seconds."""
        if timestamps and not has_token_times(self.model):
            raise ValueError(NO_TOKEN_TIMES)
        if isinstance(audio, str | Path | np.ndarray):
            audio = [audio]
        results: list[Transcript] = [Transcript("", [])] * len(audio)
        pending: list[tuple[int, np.ndarray]] = []  # short inputs, decoded in batches

        def flush() -> None:
            done = self._transcribe_samples([s for _, s in pending], [0.0] * len(pending))
            for (i, _), transcript in zip(pending, done, strict=True):
                results[i] = transcript
            pending.clear()

        for i, item in enumerate(audio):
            source = open_audio(item)
            if source.duration > self.windows.window:
                results[i] = self.transcribe_long(source)
                continue
            pending.append((i, source.read()))
            if len(pending) == batch_size:
                flush()
        flush()
        return results if timestamps else [t.text for t in results]


def load_recognizer(
    path: str | Path | list[Path],
    device: str | torch.device = "cpu",
    beam_size: int = 1,
    max_symbols_per_frame: int | None = None,
    windows: WindowConfig | None = None,
) -> Recognizer:
    """A `Recognizer` from a bundle (`asr-export`), a training checkpoint, or a list of
    checkpoints (their averaged weights, as `asr-export` would make them); `beam_size`
    above 1 decodes with beam search; `max_symbols_per_frame` (transducers) caps the
    tokens per encoder frame (None: the search's default); `windows`: how long
    recordings are cut (`WindowConfig`)."""
    model, tokenizer, features = load_bundle(path)
    options = default_options(model, beam_size, max_symbols_per_frame)
    return Recognizer(model, tokenizer, FeatureConfig(**features), device, options, windows)

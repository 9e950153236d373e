"""Recognizer: audio -> text, with a model loaded from a bundle or checkpoint(s).

Needs neither Hydra nor Lightning: `asr.load_model(path)` returns a `Recognizer`
(`asr-transcribe BUNDLE a.flac b.wav` on the command line). Recordings of any length
(`asr.inference.longform`), word timestamps and confidences (`asr.inference.timestamps`),
phrases to boost (`biasing=`, `asr.decoding.biasing`) and a language model to fuse (`lm=`,
`asr.decoding.fusion`: an `LmFusion`, or an ARPA file read once and kept on the
recognizer's device, `asr.inference.language_model`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from asr.data.features import FeatureConfig, compute_features, to_mono
from asr.data.tokenizer import Tokenizer
from asr.decoding.biasing import DEFAULT_BIASING_SCORE, BiasingGraph, BiasingPhrase
from asr.decoding.fusion import LmFusion
from asr.decoding.search import (
    NO_TOKEN_TIMES,
    SearchOptions,
    decode,
    decode_nbest,
    decode_timed,
    default_options,
    has_token_times,
)
from asr.frames import FRAMES_PER_SECOND, SAMPLE_RATE
from asr.inference.audio import AudioInput, read_audio
from asr.inference.bundle import load_bundle
from asr.inference.language_model import (
    DEFAULT_LM_WEIGHT,
    DEFAULT_LODR_WEIGHT,
    FusionCache,
    LanguageModel,
)
from asr.inference.longform import (
    WindowConfig,
    batches_of,
    pieces_of,
    release_freed_memory,
    stitch_recordings,
)
from asr.inference.segments import Segment
from asr.inference.streaming import ended_as_a_stream
from asr.inference.timestamps import Transcript, Word, transcript_of_hypothesis, words_of_text
from asr.models.build import Model
from asr.models.conformer import Chunking

__all__ = [
    "DEFAULT_LM_WEIGHT",
    "DEFAULT_LODR_WEIGHT",
    "AudioInput",
    "Biasing",
    "LanguageModel",
    "Recognizer",
    "load_recognizer",
    "read_audio",
]

# Phrases to boost: a built graph, or phrases ("TEXT", "TEXT :SCORE", (text, score)).
Biasing = BiasingGraph | Sequence[str | tuple[str, float] | BiasingPhrase] | None

MIN_SAMPLES = 400  # one 25 ms feature frame: shorter audio is transcribed as nothing


class Recognizer:
    """A model with its tokenizer and feature settings, ready to transcribe. `options`:
    the search (default: greedy; `AedSearchOptions(beam_size=4)` for attention decoders);
    `windows`: how recordings are cut at pauses and in windows (`WindowConfig`);
    `chunking`: a streaming model's chunk and left context, through whose masks whole
    utterances are encoded as a stream would encode them (None: full context)."""

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        features: FeatureConfig,
        device: str | torch.device = "cpu",
        options: SearchOptions | None = None,
        windows: WindowConfig | None = None,
        chunking: Chunking | None = None,
        language_models: FusionCache | None = None,
    ) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.features = FeatureConfig(
            **{**features.__dict__, "source": "on_the_fly", "dither": 0.0}
        )
        self.device = torch.device(device)
        self.options = options or default_options(model)
        self.windows = windows or WindowConfig()
        self.chunking = chunking
        self._extractor = self.features.extractor()
        self.language_models = language_models or FusionCache(tokenizer, self.device)

    def with_chunking(self, chunking: Chunking | None) -> Recognizer:
        """The same model and search, encoding through `chunking`'s masks."""
        return Recognizer(
            self.model,
            self.tokenizer,
            self.features,
            self.device,
            self.options,
            self.windows,
            chunking,
            self.language_models,
        )

    def features_of(self, audio: np.ndarray) -> torch.Tensor:
        """(T, F) features of 16 kHz samples, (N,) or (channels, N), as the model expects;
        with a `chunking`, the frames a stream of them encodes (`Stream.finish`: the audio
        ends in silence up to the end of its last chunk), so that decoding gives what
        streaming gives."""
        audio = to_mono(audio)
        if self.chunking is None or self.chunking.is_full or not len(audio):
            return torch.from_numpy(compute_features(audio, self.features, self._extractor))
        padded, frames = ended_as_a_stream(audio, self.model, self.chunking)
        feats = compute_features(padded, self.features, self._extractor)
        return torch.from_numpy(feats[:frames])

    def biasing_graph(
        self, biasing: Biasing, score: float = DEFAULT_BIASING_SCORE
    ) -> BiasingGraph | None:
        """`biasing` as a graph over this model's tokens (phrases without their own score
        earn `score` per token); None stays None."""
        if biasing is None or isinstance(biasing, BiasingGraph):
            return biasing
        if isinstance(biasing, str | Path):
            raise TypeError(
                "biasing is a list of phrases (asr.decoding.biasing.read_biasing_phrases "
                f"reads a file), not {biasing!r}"
            )
        return BiasingGraph.from_phrases(biasing, self.tokenizer, score)

    def language_model(
        self,
        lm: LanguageModel,
        lm_weight: float | None = None,
        lodr: str | Path | None = None,
        lodr_weight: float | None = None,
    ) -> LmFusion | None:
        """The fusion to search with: None for None, an `LmFusion` as it is, an LM file
        (ARPA over this model's pieces, `asr-train-lm`, or its cached tensor form) with
        `lm_weight` (None: `DEFAULT_LM_WEIGHT`) minus the LODR LM `lodr` with `lodr_weight`
        (None: `DEFAULT_LODR_WEIGHT`), read once and kept on this recognizer's device."""
        return self.language_models.get(lm, lm_weight, lodr, lodr_weight)

    def _encode(self, feats: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lens = torch.tensor([f.shape[0] for f in feats], device=self.device)
        padded = torch.nn.utils.rnn.pad_sequence(list(feats), batch_first=True).to(self.device)
        return self.model.encode(padded, lens, self.chunking)

    @torch.inference_mode()
    def transcribe_features(
        self,
        feats: Sequence[torch.Tensor],
        biasing: BiasingGraph | None = None,
        lm: LmFusion | None = None,
    ) -> list[str]:
        """Texts of per-utterance (T, F) feature matrices, decoded as one batch
        (`biasing`: phrases to boost, `biasing_graph`; `lm`: an LM to fuse,
        `language_model`)."""
        ids = decode(self.model, *self._encode(feats), self.options, biasing, lm)
        return [self.tokenizer.decode(i) for i in ids]

    @torch.inference_mode()
    def nbest_features(
        self,
        feats: Sequence[torch.Tensor],
        nbest: int,
        biasing: BiasingGraph | None = None,
        lm: LmFusion | None = None,
    ) -> list[list[tuple[str, float]]]:
        """Per utterance its `nbest` best (text, score), best first (a beam search at least
        `nbest` wide)."""
        encoded = self._encode(feats)
        hyps = decode_nbest(self.model, *encoded, self.options, nbest, biasing, lm)
        return [[(self.tokenizer.decode(ids), score) for ids, score in h] for h in hyps]

    @torch.inference_mode()
    def transcripts_of_features(
        self,
        feats: Sequence[torch.Tensor],
        offsets: Sequence[float] | None = None,
        ends: Sequence[float] | None = None,
        biasing: BiasingGraph | None = None,
        lm: LmFusion | None = None,
    ) -> list[Transcript]:
        """Per utterance its text and words, with their times in seconds from its offset
        in `offsets` and their confidences where the model gives token times (without
        either otherwise); no word ends after its audio's end in `ends` (default: its last
        feature frame's)."""
        offsets = offsets or [0.0] * len(feats)
        if ends is None:
            ends = [o + f.shape[0] / FRAMES_PER_SECOND for o, f in zip(offsets, feats, strict=True)]
        encoded = self._encode(feats)
        if not has_token_times(self.model):
            ids = decode(self.model, *encoded, self.options, biasing, lm)
            texts = [self.tokenizer.decode(i) for i in ids]
            return [Transcript(text, words_of_text(text)) for text in texts]
        seconds = self.model.frame_seconds
        hyps = decode_timed(self.model, *encoded, self.options, biasing, lm)
        return [
            transcript_of_hypothesis(hyp, self.tokenizer, seconds, offset, end)
            for hyp, offset, end in zip(hyps, offsets, ends, strict=True)
        ]

    def words_of_samples(
        self,
        samples: Sequence[np.ndarray],
        offsets: Sequence[float],
        biasing: BiasingGraph | None = None,
        lm: LmFusion | None = None,
    ) -> list[list[Word]]:
        """The words of each piece of audio (times from its offset); audio too short for
        one feature frame has none."""
        results: list[list[Word]] = [[] for _ in samples]
        kept = [i for i, s in enumerate(samples) if len(s) >= MIN_SAMPLES]
        if kept:
            feats = [self.features_of(samples[i]) for i in kept]
            starts = [offsets[i] for i in kept]
            ends = [offsets[i] + len(samples[i]) / SAMPLE_RATE for i in kept]
            done = self.transcripts_of_features(feats, starts, ends, biasing, lm)
            for i, transcript in zip(kept, done, strict=True):
                results[i] = transcript.words
        return results

    def transcribe(
        self,
        audio: AudioInput | Sequence[AudioInput],
        batch_size: int = 16,
        timestamps: bool = False,
        biasing: Biasing = None,
        biasing_score: float = DEFAULT_BIASING_SCORE,
        lm: LanguageModel = None,
        lm_weight: float | None = None,
        lodr: str | Path | None = None,
        lodr_weight: float | None = None,
    ) -> list[str] | list[Transcript]:
        """Texts of audio files or 16 kHz mono float arrays (one per input), of any length.

        Each recording is cut at its long pauses, and its long stretches of speech into
        overlapping windows (`self.windows`, `asr.inference.longform`); the pieces of all
        the inputs are decoded in batches of at most `batch_size` pieces and
        `self.windows.batch_seconds` of audio, and a long file is read a piece at a time.
        With `timestamps`, a `Transcript` per input: its text and its words, each with its
        start and end in seconds and its confidence. `biasing`: phrases to boost (a list
        of "TEXT", "TEXT :SCORE" or (text, score), or a `BiasingGraph`), each earning
        `biasing_score` per token unless it has its own (docs/decoding.md). `lm`: a
        language model to fuse, an `LmFusion` or an LM file (ARPA over the model's pieces,
        `asr-train-lm`) with `lm_weight` (default `DEFAULT_LM_WEIGHT`) and optionally a
        LODR LM `lodr` with `lodr_weight` (default `DEFAULT_LODR_WEIGHT`); a file is read
        once and kept for the next calls (`language_model`). Phrases and LM scores add."""
        timed = has_token_times(self.model)
        if timestamps and not timed:
            raise ValueError(NO_TOKEN_TIMES)
        graph = self.biasing_graph(biasing, biasing_score)
        fusion = self.language_model(lm, lm_weight, lodr, lodr_weight)
        if isinstance(audio, str | Path | np.ndarray):
            audio = [audio]
        pieces = pieces_of(audio, self.windows)
        decoded: list[tuple[int, Segment, list[Word]]] = []  # no samples: they go with the batch
        for batch in batches_of(pieces, self.windows.batch_seconds, batch_size):
            words = self.words_of_samples(
                [p.samples for p in batch], [p.segment.start for p in batch], graph, fusion
            )
            decoded += [(p.recording, p.segment, w) for p, w in zip(batch, words, strict=True)]
            release_freed_memory()
        words = stitch_recordings(decoded, len(audio), timed)
        results = [Transcript.of_words(w) for w in words]
        return results if timestamps else [t.text for t in results]


def load_recognizer(
    path: str | Path | list[Path],
    device: str | torch.device = "cpu",
    beam_size: int = 1,
    max_symbols_per_frame: int | None = None,
    windows: WindowConfig | None = None,
    ema: bool = False,
) -> Recognizer:
    """A `Recognizer` from a bundle (`asr-export`), a training checkpoint, or a list of
    checkpoints (their averaged weights, as `asr-export` would make them); `beam_size`
    above 1 decodes with beam search; `max_symbols_per_frame` (transducers) caps the
    tokens per encoder frame (None: the search's default); `windows`: how long
    recordings are cut (`WindowConfig`); `ema`: a checkpoint's EMA weights."""
    model, tokenizer, features = load_bundle(path, ema)
    options = default_options(model, beam_size, max_symbols_per_frame)
    return Recognizer(model, tokenizer, FeatureConfig(**features), device, options, windows)

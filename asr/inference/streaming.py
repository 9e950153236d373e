"""Streaming recognition: audio pieces of any size in, a partial transcript after each.

A `StreamingRecognizer` holds a streaming transducer (``model.encoder.streaming``) at one
trained chunk size and left context, and one search (`asr.decoding.search`). Each `Stream`
holds one live recording: its feature frontend (frames become ready as samples arrive) and
its `StreamDecoding`, the model side's explicit state: the encoder's caches
(`StreamingState`: per-layer left-context attention inputs and convolution state) and the
search's progress (the predictor's state, the tokens so far). The recognizer's
``step(decodings, chunks)`` is a pure function of those states, as the encoder's
``step(x, state, chunking)`` is: it encodes the chunks of all the streams in one batch
(streams that started at different times included) and advances their searches, the
streams with the same biasing phrases in one search step (`advance_each`). ``decode``
takes each ready stream's next chunk, steps, and hands each stream its new state. A
finished stream's last, shorter chunk is encoded as it is. Memory stays flat: the
frontend frees encoded frames and the caches have a fixed size. Token frames, and so word
times, count from the stream's start.

Each stream may have its own phrases to boost (`create_stream(biasing=...)`,
`asr.decoding.biasing`); equal lists share one graph (`SharedBiasingGraphs`), and with it
one search step and one set of tables. A stream may fuse a language model
(`create_stream(lm=...)`, `asr.decoding.fusion`): its search starts with it, and so does
each restart after an endpoint; an LM file is read once per recognizer
(`asr.inference.language_model`), and the streams fused with the same one share a search
step too.

    recognizer = asr.load_model("exp/demo_streaming/model.bundle.pt", streaming=True, chunk_ms=320)
    stream = recognizer.create_stream()
    for piece in pieces:                   # e.g. 0.1 s of 16 kHz float samples each
        stream.accept_waveform(piece)
        recognizer.decode([stream])
        print(stream.text)                 # the partial transcript
    stream.finish()
    recognizer.decode([stream])
    print(stream.text)                     # the final one
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from asr.data.features import FeatureConfig, OnlineFeatures, to_mono
from asr.data.tokenizer import Tokenizer
from asr.decoding.biasing import (
    DEFAULT_BIASING_SCORE,
    BiasingGraph,
    BiasingPhrase,
    SharedBiasingGraphs,
)
from asr.decoding.fusion import LmFusion
from asr.decoding.hypotheses import TimedTokens
from asr.decoding.search import (
    Progress,
    TransducerSearch,
    advance_each,
    default_options,
    transducer_search,
)
from asr.frames import FRAME_SHIFT_SECONDS, FRAMES_PER_SECOND, SAMPLE_RATE, feature_frames
from asr.inference.audio import AudioInput, open_audio
from asr.inference.bundle import load_bundle
from asr.inference.language_model import FusionCache, LanguageModel
from asr.inference.timestamps import Transcript, transcript_of_hypothesis
from asr.models.conformer import FULL_CONTEXT_MODEL, Chunking, StreamingState
from asr.models.transducer import Transducer

__all__ = ["Stream", "StreamDecoding", "StreamingRecognizer", "load_streaming_recognizer"]

Phrases = Sequence[str | tuple[str, float] | BiasingPhrase]


@dataclass(frozen=True)
class StreamDecoding:
    """A stream's model-side state between chunks: the encoder's caches, the search's
    progress (`search`: with a token-and-duration transducer, also how far past the
    chunk's end each hypothesis's last duration jumped, `HypothesisState.skip`, where the
    next chunk resumes it), the encoder frames decoded since the stream's start
    (`frames`) and the frame at which the search started (`search_start`: 0, or the frame
    of the last endpoint)."""

    encoder: StreamingState
    search: Progress
    frames: int = 0
    search_start: int = 0


class Stream:
    """One live recording: ``accept_waveform`` pieces of 16 kHz mono float samples, then
    ``finish``; ``text`` and ``transcript()`` hold what has been decoded so far.
    `biasing`: its phrases to boost (None: none); `lm`: the language model its search
    fuses (None: none). Made by
    `StreamingRecognizer.create_stream`, which passes what the stream needs: its feature
    settings, its chunk in feature frames (`span`), the rule that ends it, its first
    `StreamDecoding`, the search that reads its progress and the tokenizer."""

    def __init__(
        self,
        features: FeatureConfig,
        span: int,
        ending: Callable[[int], tuple[int, int]],
        decoding: StreamDecoding,
        search: TransducerSearch,
        tokenizer: Tokenizer,
        frame_seconds: float,
        biasing: BiasingGraph | None = None,
        lm: LmFusion | None = None,
    ) -> None:
        self.features = OnlineFeatures(features)
        self.span = span
        self._ending = ending
        self._decoding = decoding
        self._search = search
        self.tokenizer = tokenizer
        self.frame_seconds = frame_seconds
        self.biasing = biasing
        self.lm = lm
        self.samples = 0  # accepted so far
        self.encoded = 0  # feature frames encoded
        self.finished = False
        self.end = 0  # once finished: the feature frames to encode

    def accept_waveform(self, samples: np.ndarray, sampling_rate: int = SAMPLE_RATE) -> None:
        """Append audio (any length, empty included); 16 kHz mono (or channels x samples)."""
        if self.finished:
            raise ValueError("the stream has finished: create a new one for more audio")
        samples = to_mono(np.asarray(samples, dtype=np.float32))
        self.features.accept(samples, sampling_rate)
        self.samples += len(samples)

    def finish(self) -> None:
        """No more audio: the stream is closed with a chunk of silence (the recognizer's
        `tail_seconds`), and the next ``decode`` encodes what is left up to the end of the
        chunk that holds the last frame of audio. sherpa-onnx's online recognizer decodes
        whole windows only; its client sends the same silence after the audio, then calls
        `input_finished()`: both then decode the same chunks and give the same last words
        (docs/streaming.md, "End of stream")."""
        if self.finished:
            return
        tail, self.end = self._ending(self.samples)
        self.features.accept(np.zeros(tail, dtype=np.float32))
        self.features.finish()
        self.finished = True

    @property
    def done(self) -> bool:
        """Finished and every chunk encoded: the transcript is final."""
        return self.finished and self.encoded >= self.end

    @property
    def chunk_ready(self) -> bool:
        """Whether a chunk waits to be encoded (by the next ``decode``)."""
        ready = min(self.features.ready, self.end) if self.finished else self.features.ready
        return ready - self.encoded >= self.span

    def take_chunk(self) -> np.ndarray | None:
        """The next chunk's feature frames (the stream moves past them), or None if none is
        ready (or left)."""
        if not self.chunk_ready:
            return None
        frames = self.features.frames(self.encoded, self.encoded + self.span)
        self.encoded += self.span
        self.features.discard_before(self.encoded)
        return frames

    @property
    def decoding(self) -> StreamDecoding:
        """The model side's state after the chunks decoded so far."""
        return self._decoding

    def advance_to(self, decoding: StreamDecoding) -> None:
        """Take the state a step gave (`StreamingRecognizer.step`)."""
        self._decoding = decoding

    @property
    def frames_decoded(self) -> int:
        """Encoder frames decoded since the stream's start."""
        return self._decoding.frames

    def best(self) -> TimedTokens:
        """The tokens of the best hypothesis so far, the frame of each (encoder frames
        since the stream's start) and its confidence."""
        return self._search.best(self._decoding.search)[0]

    @property
    def tokens(self) -> list[int]:
        return self.best().tokens

    @property
    def text(self) -> str:
        return self.tokenizer.decode(self.tokens)

    def transcript(self) -> Transcript:
        """The text so far and its words, with times in seconds from the stream's start
        and confidences."""
        end = self.samples / SAMPLE_RATE
        return transcript_of_hypothesis(self.best(), self.tokenizer, self.frame_seconds, 0.0, end)


class StreamingRecognizer:
    """A streaming transducer at one trained chunk size and left context (`chunking`, in
    encoder frames; None: the largest trained), decoding many streams at once with one
    search: beam search for `beam_size` above 1, else greedy; `max_symbols_per_frame` caps
    the tokens per encoder frame (None: 3; sherpa-onnx's online greedy search takes 10).
    `autocast`: a dtype to run the model in (bfloat16 on GPUs)."""

    def __init__(
        self,
        model: Transducer,
        tokenizer: Tokenizer,
        features: FeatureConfig,
        chunking: Chunking | None = None,
        beam_size: int = 1,
        device: str | torch.device = "cpu",
        autocast: torch.dtype | None = None,
        max_symbols_per_frame: int | None = None,
    ) -> None:
        if not isinstance(model, Transducer):
            raise ValueError(
                f"streaming needs a transducer; this model is a {type(model).__name__}"
            )
        chunking = chunking or largest_chunking(model)
        model.encoder.check_streamable(chunking)
        if features.normalize != "none":
            raise ValueError(
                f"this model normalizes features {features.normalize.replace('_', ' ')}, "
                "which a stream cannot compute; stream a model with model.encoder.feature_stats"
            )
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.features = features
        self.chunking = chunking
        self.device = torch.device(device)
        self.span = chunking.chunk * model.encoder.subsampling_factor  # feature frames
        self.tail_seconds = tail_padding_seconds(model, chunking)
        options = default_options(model, beam_size, max_symbols_per_frame)
        self.search = transducer_search(options, self.device)
        self.biasing_graphs = SharedBiasingGraphs(tokenizer)
        self.language_models = FusionCache(tokenizer, self.device)  # (LM files read once)
        self._autocast = autocast

    @property
    def chunk_seconds(self) -> float:
        """Audio per chunk: the algorithmic latency (the encoder has no look-ahead)."""
        return self.span / FRAMES_PER_SECOND

    def language_model(
        self,
        lm: LanguageModel,
        lm_weight: float | None = None,
        lodr: str | Path | None = None,
        lodr_weight: float | None = None,
    ) -> LmFusion | None:
        """The fusion a stream searches with (`Recognizer.language_model`): None, an
        `LmFusion` as it is, or an LM file with its weights and LODR LM, read once and kept
        on this recognizer's device; the same file and weights give the same object."""
        return self.language_models.get(lm, lm_weight, lodr, lodr_weight)

    def create_stream(
        self,
        biasing: BiasingGraph | Phrases | None = None,
        biasing_score: float = DEFAULT_BIASING_SCORE,
        lm: LanguageModel = None,
        lm_weight: float | None = None,
        lodr: str | Path | None = None,
        lodr_weight: float | None = None,
    ) -> Stream:
        """A new stream; `biasing`: its phrases to boost (a `BiasingGraph`, or phrases
        "TEXT", "TEXT :SCORE" or (text, score), each earning `biasing_score` per token
        unless it has its own; equal lists share one graph); `lm`: a language model to
        fuse, an `LmFusion` or an LM file with `lm_weight`, `lodr` and `lodr_weight`
        (`language_model`). Streams with the same graph and LM share search steps."""
        if biasing is not None and not isinstance(biasing, BiasingGraph):
            biasing = self.biasing_graphs.get(biasing, biasing_score)
        fusion = self.language_model(lm, lm_weight, lodr, lodr_weight)
        encoder = self.model.encoder.initial_state(1, self.chunking, self.device)
        search = self.search.start(self.model, 1, self.device, biasing, lm=fusion)
        return Stream(
            self.features,
            self.span,
            lambda samples: end_of_stream(samples, self.model, self.chunking),
            StreamDecoding(encoder, search),
            self.search,
            self.tokenizer,
            self.model.frame_seconds,
            biasing,
            fusion,
        )

    def restart_search(self, stream: Stream) -> None:
        """Start `stream`'s search again from the frames it has decoded (an endpoint: the
        encoder keeps its left context, the next segment's words are not held back by the
        last's); its phrases and language model stay."""
        frames = stream.frames_decoded
        search = self.search.start(self.model, 1, self.device, stream.biasing, frames, lm=stream.lm)
        decoding = dataclasses.replace(stream.decoding, search=search, search_start=frames)
        stream.advance_to(decoding)

    @torch.inference_mode()
    def step(
        self, decodings: Sequence[StreamDecoding], chunks: Sequence[np.ndarray]
    ) -> list[StreamDecoding]:
        """Each stream's state after one chunk of feature frames (at most `span` each; a
        finished stream's last one may be shorter): the chunks encoded in one batch, the
        searches advanced in as few search steps as they can share."""
        features = torch.zeros(len(chunks), self.span, self.features.num_mel_bins)
        for i, chunk in enumerate(chunks):
            features[i, : len(chunk)] = torch.from_numpy(chunk)
        lens = torch.tensor([len(c) for c in chunks], device=self.device)
        state = StreamingState.cat([d.encoder for d in decodings])
        autocast = (
            torch.autocast(self.device.type, dtype=self._autocast)
            if self._autocast
            else nullcontext()
        )
        with autocast:
            out, out_lens, state = self.model.encoder.step(
                features.to(self.device), lens, state, self.chunking
            )
            searches = advance_each(
                self.search, self.model, [d.search for d in decodings], out, out_lens
            )
        return [
            StreamDecoding(
                state.select(torch.tensor([i], device=self.device)),
                search,
                decoding.frames + n,
                decoding.search_start,
            )
            for i, (decoding, search, n) in enumerate(
                zip(decodings, searches, out_lens.tolist(), strict=True)
            )
        ]

    def decode(self, streams: Sequence[Stream]) -> None:
        """Encode every ready chunk of `streams` (one batch per round of chunks) and
        continue their searches."""
        while self.decode_round(streams):
            pass

    def decode_round(self, streams: Sequence[Stream]) -> list[Stream]:
        """Encode the next ready chunk of each of `streams`, all in one batch, and continue
        their searches -> the streams that had one (a server looks at each stream's
        result after every chunk: asr-serve's endpoints)."""
        batch = [(s, c) for s in streams if (c := s.take_chunk()) is not None]
        if batch:
            decoded = self.step([s.decoding for s, _ in batch], [c for _, c in batch])
            for (stream, _), decoding in zip(batch, decoded, strict=True):
                stream.advance_to(decoding)
        return [s for s, _ in batch]

    def feed(
        self, audio: Sequence[np.ndarray], piece: int = 1600, lm: LmFusion | None = None
    ) -> list[Stream]:
        """Each recording (16 kHz samples) as a concurrent stream fed `piece` samples at a
        time, all decoded after each round, each finished at its end -> the streams, done;
        `lm`: the language model they fuse."""
        streams = [self.create_stream(lm=lm) for _ in audio]
        for start in range(0, max((len(a) for a in audio), default=0), piece):
            for stream, samples in zip(streams, audio, strict=True):
                if start < len(samples):
                    stream.accept_waveform(samples[start : start + piece])
                else:
                    stream.finish()
            self.decode(streams)
        for stream in streams:
            stream.finish()
        self.decode(streams)
        return streams

    def transcribe(
        self,
        audio: AudioInput | Sequence[AudioInput],
        piece_seconds: float = 0.1,
        lm: LanguageModel = None,
        lm_weight: float | None = None,
        lodr: str | Path | None = None,
        lodr_weight: float | None = None,
    ) -> list[Transcript]:
        """Stream each recording (file path or 16 kHz samples) in pieces of
        `piece_seconds`, all at once as concurrent streams -> final transcripts; `lm`,
        `lm_weight`, `lodr`, `lodr_weight`: a language model to fuse (`create_stream`)."""
        fusion = self.language_model(lm, lm_weight, lodr, lodr_weight)
        if isinstance(audio, str | Path | np.ndarray):
            audio = [audio]
        samples = [open_audio(a).read() for a in audio]
        streams = self.feed(samples, max(1, int(piece_seconds * SAMPLE_RATE)), fusion)
        return [s.transcript() for s in streams]


def largest_chunking(model: Transducer) -> Chunking:
    """The largest chunk size and left context `model` was trained with."""
    streaming = getattr(model.encoder, "streaming", None)
    if streaming is None or not streaming.streaming_chunk_sizes:
        raise ValueError(FULL_CONTEXT_MODEL)
    return Chunking(max(streaming.streaming_chunk_sizes), max(streaming.left_contexts))


def chunking_of_ms(
    model: Transducer, chunk_ms: float | None, left_context_ms: float | None
) -> Chunking:
    """`model`'s chunking of a `chunk_ms` chunk and `left_context_ms` of left context
    (None: the largest trained), or a one-line error listing the trained ones in ms."""
    largest = largest_chunking(model)
    streaming = model.encoder.streaming
    frame_ms = model.frame_seconds * 1000
    chunk = _frames_of_ms(
        chunk_ms, largest.chunk, streaming.streaming_chunk_sizes, frame_ms, "--chunk-ms", "chunks"
    )
    left = _frames_of_ms(
        left_context_ms,
        largest.left,
        streaming.left_contexts,
        frame_ms,
        "--left-context-ms",
        "left contexts",
    )
    return Chunking(chunk, left)


def _frames_of_ms(
    ms: float | None,
    default: int,
    trained: tuple[int, ...],
    frame_ms: float,
    option: str,
    what: str,
) -> int:
    """`ms` in encoder frames (None: `default`), one of the `trained` ones, or a one-line
    error naming `option` and the trained `what` in milliseconds."""
    if ms is None:
        return default
    frames = round(ms / frame_ms)
    if abs(frames * frame_ms - ms) > 1e-6 or frames not in trained:
        raise ValueError(
            f"{option} {ms:g} was not trained; trained {what}: "
            f"{', '.join(f'{c * frame_ms:g}' for c in trained)} ms"
        )
    return frames


def tail_padding_seconds(model: Transducer, chunking: Chunking) -> float:
    """The silence that ends a stream (`Stream.finish`), which a client of sherpa-onnx's
    online recognizer sends after the audio (then `input_finished()`) so that its last
    words are decoded: one chunk. sherpa-onnx encodes a window (the subsampling's history
    and a chunk) only once a frame after it is ready, and never a partial one, so the
    chunk that holds the last frame of audio waits for up to a chunk of frames more; with
    exactly a chunk, no chunk of silence alone follows it (docs/streaming.md, "End of
    stream")."""
    return round(chunking.chunk * model.encoder.subsampling_factor * FRAME_SHIFT_SECONDS, 3)


def end_of_stream(num_samples: int, model: Transducer, chunking: Chunking) -> tuple[int, int]:
    """How a stream of `num_samples` samples of audio ends (`Stream.finish`, and
    `Recognizer` decoding as streaming does): the samples of silence appended after it
    (`tail_padding_seconds`; none after no audio) and the feature frames encoded, up to
    the end of the chunk that holds its last frame of audio (the silence completes it)."""
    if not num_samples:
        return 0, 0
    span = chunking.chunk * model.encoder.subsampling_factor
    tail = int(tail_padding_seconds(model, chunking) * SAMPLE_RATE)
    return tail, -(-feature_frames(num_samples) // span) * span


def ended_as_a_stream(
    samples: np.ndarray, model: Transducer, chunking: Chunking
) -> tuple[np.ndarray, int]:
    """`samples` followed by the silence that ends a stream, and the feature frames a
    stream of them encodes (`end_of_stream`): what decoding the whole recording through
    the chunked masks takes to give what streaming it gives."""
    tail, frames = end_of_stream(len(samples), model, chunking)
    return np.concatenate([samples, np.zeros(tail, dtype=np.float32)]), frames


def load_streaming_recognizer(
    path: str | Path | list[Path],
    chunk_ms: float | None = None,
    left_context_ms: float | None = None,
    beam_size: int = 1,
    device: str | torch.device = "cpu",
    ema: bool = False,
    max_symbols_per_frame: int | None = None,
) -> StreamingRecognizer:
    """A `StreamingRecognizer` from a bundle or checkpoint(s); `chunk_ms` and
    `left_context_ms`: its chunk and left context in milliseconds, ones the model was
    trained with (None: its largest)."""
    model, tokenizer, features = load_bundle(path, ema)
    if not isinstance(model, Transducer):
        raise ValueError(f"streaming needs a transducer; this model is a {type(model).__name__}")
    return StreamingRecognizer(
        model,
        tokenizer,
        FeatureConfig(**features),
        chunking_of_ms(model, chunk_ms, left_context_ms),
        beam_size,
        device,
        max_symbols_per_frame=max_symbols_per_frame,
    )

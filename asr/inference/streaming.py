"""Streaming recognition: audio pieces of any size in, a partial transcript after each.

A `StreamingRecognizer` holds a streaming transducer (``model.encoder.streaming``) at one
trained chunk size and left context; each `Stream` holds one live recording's state:
its feature frontend (frames become ready as samples arrive), the encoder's caches
(`StreamingState`: per-layer left-context attention inputs and convolution state), and
the search (the predictor's state and the tokens so far). ``decode(streams)`` encodes
every chunk that is ready, of all the streams in one batch (streams that started at
different times included), and continues each one's search; a finished stream's last,
shorter chunk is encoded as it is. Memory stays flat: the frontend frees encoded frames
and the caches have a fixed size. Each stream may have its own phrases to boost
(`create_stream(context=...)`, `asr.decoding.biasing`): the chunks of all streams share
one encoder step, and the streams with the same phrases one search step.

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

from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from asr.data.features import FeatureConfig, OnlineFeatures, to_mono
from asr.data.tokenizer import Tokenizer
from asr.decoding.biasing import DEFAULT_CONTEXT_SCORE, ContextGraph, ContextPhrase
from asr.decoding.transducer import (
    BeamOptions,
    BeamProgress,
    GreedyOptions,
    GreedyProgress,
    TimedTokens,
    beam_continue,
    beam_start,
    greedy_continue,
    greedy_start,
)
from asr.frames import FRAME_SHIFT_SECONDS, FRAMES_PER_SECOND, SAMPLE_RATE, feature_frames
from asr.inference.audio import AudioInput, open_audio
from asr.inference.bundle import load_bundle
from asr.inference.timestamps import Transcript, words_from_tokens
from asr.models.conformer import FULL_CONTEXT_MODEL, Chunking, StreamingState
from asr.models.transducer import Transducer

__all__ = ["Stream", "StreamingRecognizer", "load_streaming_recognizer"]

Search = GreedyProgress | BeamProgress


class Stream:
    """One live recording: ``accept_waveform`` pieces of 16 kHz mono float samples, then
    ``finish``; ``text`` and ``transcript()`` hold what has been decoded so far.
    `context`: its phrases to boost (None: none)."""

    def __init__(
        self, recognizer: StreamingRecognizer, context: ContextGraph | None = None
    ) -> None:
        self._recognizer = recognizer
        self.context = context
        self.features = OnlineFeatures(recognizer.features)
        self.state = recognizer.model.encoder.initial_state(
            1, recognizer.chunking, recognizer.device
        )
        self.search: Search = recognizer.start_search()
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
        recognizer = self._recognizer
        tail, self.end = end_of_stream(self.samples, recognizer.model, recognizer.chunking)
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
        return ready - self.encoded >= self._recognizer.span

    def _next_chunk(self) -> np.ndarray | None:
        """The next chunk's frames, or None if none is ready (or left)."""
        if self.chunk_ready:
            span = self._recognizer.span
            frames = self.features.frames(self.encoded, self.encoded + span)
            self.encoded += span
            self.features.discard_before(self.encoded)
            return frames
        return None

    def best(self) -> TimedTokens:
        """The tokens of the best hypothesis so far, the frame of each (encoder frames
        since the search started) and its confidence."""
        if isinstance(self.search, GreedyProgress):
            return self.search.results()[0]
        best = self.search.hypotheses(1)[0]
        if not best:
            return TimedTokens([], [], [])
        return TimedTokens(list(best[0].tokens), list(best[0].frames), list(best[0].confidences))

    @property
    def tokens(self) -> list[int]:
        return self.best().tokens

    @property
    def text(self) -> str:
        return self._recognizer.tokenizer.decode(self.tokens)

    def transcript(self) -> Transcript:
        """The text so far and its words, with times in seconds from the stream's start
        and confidences."""
        recognizer = self._recognizer
        best = self.best()
        seconds = recognizer.model.frame_seconds
        pieces = [recognizer.tokenizer.id_to_piece(i) for i in best.tokens]
        starts = [f * seconds for f in best.frames]
        end = self.samples / SAMPLE_RATE
        words = words_from_tokens(pieces, starts, seconds, end, best.confidences)
        return Transcript(recognizer.tokenizer.decode(best.tokens), words)


class StreamingRecognizer:
    """A streaming transducer at one trained chunk size and left context (`chunking`, in
    encoder frames; None: the largest trained), decoding many streams at once; `beam_size` above 1
    decodes with beam search, `max_symbols_per_frame` caps the tokens per encoder frame
    (None: 3; sherpa-onnx's online greedy search takes 10). `autocast`: a dtype to run the
    model in (bfloat16 on GPUs)."""

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
        symbols = (
            {}
            if max_symbols_per_frame is None
            else {"max_symbols_per_frame": max_symbols_per_frame}
        )
        self.beam = BeamOptions(beam_size, **symbols) if beam_size > 1 else None
        self.greedy = GreedyOptions(**symbols)
        self._autocast = autocast

    @property
    def chunk_seconds(self) -> float:
        """Audio per chunk: the algorithmic latency (the encoder has no look-ahead)."""
        return self.span / FRAMES_PER_SECOND

    def create_stream(
        self,
        context: ContextGraph | Sequence[str | tuple[str, float] | ContextPhrase] | None = None,
        context_score: float = DEFAULT_CONTEXT_SCORE,
    ) -> Stream:
        """A new stream; `context`: its phrases to boost (a `ContextGraph`, or phrases
        "TEXT", "TEXT :SCORE" or (text, score), each earning `context_score` per token
        unless it has its own)."""
        if context is not None and not isinstance(context, ContextGraph):
            context = ContextGraph.from_phrases(context, self.tokenizer, context_score)
        return Stream(self, context)

    def start_search(self) -> Search:
        if self.beam is None:
            return greedy_start(self.model, 1, self.device)
        return beam_start(self.model, 1, self.beam.beam_size, self.device)

    @torch.inference_mode()
    def decode(self, streams: Sequence[Stream]) -> None:
        """Encode every ready chunk of `streams` (one batch per round of chunks) and
        continue their searches."""
        while self.decode_round(streams):
            pass

    @torch.inference_mode()
    def decode_round(self, streams: Sequence[Stream]) -> list[Stream]:
        """Encode the next ready chunk of each of `streams`, all in one batch, and continue
        their searches -> the streams that had one (a server looks at each stream's
        result after every chunk: asr-serve's endpoints)."""
        batch = [(s, c) for s in streams if (c := s._next_chunk()) is not None]
        if batch:
            self._decode_chunks([s for s, _ in batch], [c for _, c in batch])
        return [s for s, _ in batch]

    def _decode_chunks(self, streams: list[Stream], chunks: list[np.ndarray]) -> None:
        features = torch.zeros(len(chunks), self.span, self.features.num_mel_bins)
        for i, chunk in enumerate(chunks):
            features[i, : len(chunk)] = torch.from_numpy(chunk)
        lens = torch.tensor([len(c) for c in chunks], device=self.device)
        state = StreamingState.cat([s.state for s in streams])
        autocast = (
            torch.autocast(self.device.type, dtype=self._autocast)
            if self._autocast
            else nullcontext()
        )
        with autocast:
            out, out_lens, state = self.model.encoder.step(
                features.to(self.device), lens, state, self.chunking
            )
            # One search step for the streams of each phrase list (usually all: none).
            groups: dict[int, list[int]] = {}
            for i, stream in enumerate(streams):
                groups.setdefault(id(stream.context), []).append(i)
            for rows in groups.values():
                context = streams[rows[0]].context
                search = type(streams[rows[0]].search).cat([streams[i].search for i in rows])
                at = torch.tensor(rows, device=self.device)
                enc, enc_lens = out.index_select(0, at), out_lens.index_select(0, at)
                if isinstance(search, GreedyProgress):
                    greedy_continue(self.model, search, enc, enc_lens, self.greedy, context)
                else:
                    beam_continue(self.model, search, enc, enc_lens, self.beam, context)
                for j, i in enumerate(rows):
                    streams[i].search = search.select([j])
        for i, stream in enumerate(streams):
            stream.state = state.select(torch.tensor([i], device=self.device))

    def feed(self, audio: Sequence[np.ndarray], piece: int = 1600) -> list[Stream]:
        """Each recording (16 kHz samples) as a concurrent stream fed `piece` samples at a
        time, all decoded after each round, each finished at its end -> the streams, done."""
        streams = [self.create_stream() for _ in audio]
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
        self, audio: AudioInput | Sequence[AudioInput], piece_seconds: float = 0.1
    ) -> list[Transcript]:
        """Stream each recording (file path or 16 kHz samples) in pieces of
        `piece_seconds`, all at once as concurrent streams -> final transcripts."""
        if isinstance(audio, str | Path | np.ndarray):
            audio = [audio]
        samples = [open_audio(a).read() for a in audio]
        streams = self.feed(samples, max(1, int(piece_seconds * SAMPLE_RATE)))
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

"""Recordings of any length, as a pipeline that runs one way: audio -> segments
(`pieces_of`, cut by `asr.inference.segments`) -> batches (`batches_of`) -> the
recognizer decodes each batch to words -> the words of each recording merged
(`stitch_recordings`). `asr.inference.recognizer.Recognizer.transcribe` drives it; nothing
here calls back into the recognizer.

Segments of different stretches of speech are separated by pauses, so their words are
simply put one after the other. The overlapping windows of one long stretch are merged
in their overlap:

- with word times (transducers), the words both windows heard in the overlap are matched
  (same word, starts within `MATCH_SECONDS`) and the text switches from the earlier window
  to the later at the matched word nearest the middle of the overlap, the point farthest
  from both windows' edges; with no such word, at the middle of the overlap;
- without times (attention decoders), the end of the earlier window's words and the start
  of the later's are aligned, and the switch is at the middle of their longest common run.

Memory holds one batch of segments (`batch_seconds` of audio) and the words: it does not
grow with the recording's length (`release_freed_memory` after each batch keeps the heap
from creeping).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import difflib
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from asr.inference.audio import AudioInput, AudioSource, open_audio
from asr.inference.segments import Segment, plan_segments, recording_energies, speech_stretches
from asr.inference.timestamps import Word

# Measured on the demo model: recipes/demo/RESULTS.md, "Long recordings"
# (scripts/benchmark_longform.py).
DEFAULT_WINDOW, DEFAULT_OVERLAP = 20.0, 4.0
DEFAULT_MAX_PAUSE, DEFAULT_PAUSE_PAD = 0.25, 0.15
MATCH_SECONDS = 0.3  # the same word heard by two windows starts within this much


@dataclass(frozen=True)
class WindowConfig:
    """How recordings are cut: at pauses longer than `max_pause` seconds (0: never),
    keeping `pause_pad` seconds of each on either side of the speech, and a stretch of
    speech longer than `window` seconds into windows every `window - overlap` seconds;
    segments are decoded in batches of up to `batch_seconds` of audio."""

    window: float = DEFAULT_WINDOW
    overlap: float = DEFAULT_OVERLAP
    max_pause: float = DEFAULT_MAX_PAUSE
    pause_pad: float = DEFAULT_PAUSE_PAD
    batch_seconds: float = 4 * DEFAULT_WINDOW

    def __post_init__(self) -> None:
        if not self.window > 0:
            raise ValueError(f"window must be positive, got {self.window} s")
        if not 0 <= self.overlap <= self.window / 2:
            raise ValueError(
                f"overlap must be between 0 and half the window ({self.window / 2} s), "
                f"got {self.overlap} s"
            )
        if self.max_pause < 0:
            raise ValueError(f"max_pause must be >= 0 seconds, got {self.max_pause}")
        if self.pause_pad < 0:
            raise ValueError(f"pause_pad must be >= 0 seconds, got {self.pause_pad}")
        if not self.batch_seconds > 0:
            raise ValueError(f"batch_seconds must be positive, got {self.batch_seconds}")


def segments_of(source: AudioSource, config: WindowConfig) -> list[Segment]:
    """The segments to decode of a recording (its energies read a block at a time)."""
    energies = recording_energies(source) if config.max_pause > 0 else np.zeros(0)
    stretches = speech_stretches(energies, source.duration, config.max_pause, config.pause_pad)
    return list(plan_segments(stretches, config.window, config.overlap))


def _match_timed(
    earlier: list[Word], later: list[Word], low: float, high: float
) -> tuple[int, int] | None:
    """(i, j): earlier[i] and later[j] are the same word nearest the middle of the overlap
    [low, high], or None."""
    middle = (low + high) / 2
    tail = [i for i, w in enumerate(earlier) if w.start >= low - MATCH_SECONDS]
    head = [j for j, w in enumerate(later) if w.start <= high + MATCH_SECONDS]
    matcher = difflib.SequenceMatcher(
        None, [earlier[i].word for i in tail], [later[j].word for j in head], autojunk=False
    )
    pairs = [
        (tail[a + k], head[b + k])
        for a, b, size in matcher.get_matching_blocks()
        for k in range(size)
    ]
    pairs = [
        (i, j)
        for i, j in pairs
        if abs(earlier[i].start - later[j].start) <= MATCH_SECONDS
        and low <= later[j].start <= high
        and (i == 0 or earlier[i - 1].start <= later[j].start)  # the words stay in order
    ]
    return min(pairs, key=lambda p: abs(later[p[1]].start - middle), default=None)


def merge_timed(earlier: list[Word], later: list[Word], low: float, high: float) -> list[Word]:
    """The words of two consecutive windows that overlap on [low, high] seconds, each word
    once (see the module's docstring)."""
    pair = _match_timed(earlier, later, low, high)
    if pair is not None:
        return earlier[: pair[0]] + later[pair[1] :]
    middle = (low + high) / 2
    return [w for w in earlier if w.start < middle] + [w for w in later if w.start >= middle]


def merge_untimed(earlier: list[Word], later: list[Word], overlap_fraction: float) -> list[Word]:
    """The same without times: the longest common run of the end of `earlier` and the
    start of `later` (each about `overlap_fraction` of the later window's words, doubled)."""
    span = max(4, math.ceil(2 * overlap_fraction * len(later)))
    tail, head = earlier[-span:], later[:span]
    matcher = difflib.SequenceMatcher(
        None, [w.word for w in tail], [w.word for w in head], autojunk=False
    )
    a, b, size = matcher.find_longest_match(0, len(tail), 0, len(head))
    if size == 0:
        return earlier + later
    cut = size // 2
    return earlier[: len(earlier) - len(tail) + a + cut] + later[b + cut :]


def stitch(decoded: Sequence[tuple[Segment, list[Word]]], timed: bool) -> list[Word]:
    """One recording's words from its segments' (in order): stretches one after the
    other, the windows of a stretch merged."""
    words: list[Word] = []
    previous: Segment | None = None
    for segment, segment_words in decoded:
        if previous is None or previous.stretch != segment.stretch:
            words += segment_words
        elif timed:
            words = merge_timed(words, segment_words, segment.start, previous.end)
        else:
            fraction = (previous.end - segment.start) / (segment.end - segment.start)
            words = merge_untimed(words, segment_words, fraction)
        previous = segment
    return words


@dataclass(frozen=True)
class Piece:
    """One segment of recording number `recording`, with its samples."""

    recording: int
    segment: Segment
    samples: np.ndarray


def pieces_of(audio: Sequence[AudioInput], config: WindowConfig) -> Iterator[Piece]:
    """Every recording's segments with their samples, in order; a long file is read a
    segment at a time (a short one once)."""
    for index, item in enumerate(audio):
        source = open_audio(item)
        if source.duration <= config.window:
            source = source.in_memory()
        for segment in segments_of(source, config):
            yield Piece(index, segment, source.read(segment.start, segment.end))


def batches_of(
    pieces: Iterable[Piece], batch_seconds: float, max_count: int
) -> Iterator[list[Piece]]:
    """The pieces in batches of up to `batch_seconds` of audio and `max_count` pieces, each
    sorted by length (similar lengths pad least)."""
    batch: list[Piece] = []
    seconds = 0.0
    for piece in pieces:
        batch.append(piece)
        seconds += piece.segment.end - piece.segment.start
        if seconds >= batch_seconds or len(batch) >= max_count:
            yield sorted(batch, key=lambda p: len(p.samples))
            batch, seconds = [], 0.0
    if batch:
        yield sorted(batch, key=lambda p: len(p.samples))


def stitch_recordings(
    decoded: Iterable[tuple[int, Segment, list[Word]]], count: int, timed: bool
) -> list[list[Word]]:
    """The words of each of `count` recordings from its segments' (recording number,
    segment, words), in any order. The samples are not kept: memory holds the words."""
    per_recording: list[list[tuple[Segment, list[Word]]]] = [[] for _ in range(count)]
    for recording, segment, words in decoded:
        per_recording[recording].append((segment, words))
    return [stitch(sorted(d, key=lambda d: d[0].start), timed) for d in per_recording]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, looked up once (`find_library` runs a subprocess), or None."""
    name = ctypes.util.find_library("c")
    return None if name is None else getattr(ctypes.CDLL(name), "malloc_trim", None)


def release_freed_memory() -> None:
    """Give the memory freed by a batch back to the system (glibc's `malloc_trim`):
    without it the peak RSS of a 30-minute recording crept up by about 150 MB over its
    first minutes, as the heap kept the varying sizes of each batch's tensors."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)

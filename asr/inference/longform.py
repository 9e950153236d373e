"""Long recordings: overlapping windows, decoded in small batches and merged.

A recording longer than one window is cut into windows of `window` seconds that start
every `window - overlap` seconds. Each window is read from the file on its own, turned
into features (normalized per window, as training normalizes per utterance; or with the
whole recording's statistics, `normalize="recording"`, from a first pass), encoded and
decoded; the words of consecutive windows are merged in their overlap:

- with word times (transducers), the words both windows heard in the overlap are matched
  (same word, starts within `MATCH_SECONDS`) and the recording switches from the earlier
  window to the later at the matched word nearest the middle of the overlap, the point
  farthest from both windows' edges; with no such word, at the middle of the overlap;
- without times (attention decoders), the end of the earlier window's text and the start
  of the later's are aligned, and the switch is at the middle of their longest common run.

Memory holds `batch` windows of audio and features, and the words: it does not grow
with the recording's length.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from asr.inference.audio import AudioSource
from asr.inference.timestamps import Word

# Measured on the demo model: recipes/demo/RESULTS.md, "Long recordings"
# (scripts/benchmark_longform.py).
DEFAULT_WINDOW, DEFAULT_OVERLAP = 20.0, 4.0
DEFAULT_MAX_PAUSE = 0.3
MATCH_SECONDS = 0.3  # the same word heard by two windows starts within this much
STATS_PIECE_SECONDS = 60.0  # the first pass of normalize="recording" reads this much at once


@dataclass(frozen=True)
class WindowConfig:
    """How recordings are prepared and cut: `window` seconds every `window - overlap`
    seconds, `batch` windows encoded together; `normalize` the features per `window` or
    with the whole `recording`'s mean and variance; pauses longer than `max_pause` seconds
    shortened to it, in recordings of any length (`asr.inference.pauses`; 0: never)."""

    window: float = DEFAULT_WINDOW
    overlap: float = DEFAULT_OVERLAP
    batch: int = 4
    normalize: str = "window"
    max_pause: float = DEFAULT_MAX_PAUSE

    def __post_init__(self) -> None:
        if not self.window > 0:
            raise ValueError(f"window must be positive, got {self.window} s")
        if not 0 <= self.overlap <= self.window / 2:
            raise ValueError(
                f"overlap must be between 0 and half the window ({self.window / 2} s), "
                f"got {self.overlap} s"
            )
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.max_pause < 0:
            raise ValueError(f"max_pause must be >= 0 seconds, got {self.max_pause}")
        if self.normalize not in ("window", "recording"):
            raise ValueError(f"normalize must be 'window' or 'recording', got {self.normalize!r}")


def plan_windows(duration: float, window: float, overlap: float) -> list[tuple[float, float]]:
    """(start, end) seconds of the windows that cover `duration` seconds."""
    if duration <= window:
        return [(0.0, duration)]
    step = window - overlap
    count = math.ceil((duration - overlap) / step)
    return [(i * step, min(i * step + window, duration)) for i in range(count)]


def _match_timed(earlier: list[Word], later: list[Word], low: float, high: float):
    """(i, j): earlier[i] and later[j] are the same word nearest the middle of the overlap
    [low, high], or None."""
    middle = (low + high) / 2
    tail = [i for i, w in enumerate(earlier) if w.start >= low - MATCH_SECONDS]
    head = [j for j, w in enumerate(later) if w.start <= high + MATCH_SECONDS]
    if not tail or not head:
        return None
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
        if abs(earlier[i].start - later[j].start) <= MATCH_SECONDS and low <= later[j].start <= high
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


def feature_stats(
    source: AudioSource, extract: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation per feature bin of the whole recording, read a piece
    at a time (`extract`: samples -> unnormalized (T, F) features)."""
    total = squares = None
    count = 0
    start = 0.0
    while start < source.duration:
        feats = extract(source.read(start, start + STATS_PIECE_SECONDS)).astype(np.float64)
        start += STATS_PIECE_SECONDS
        if feats.shape[0] == 0:
            continue
        total = feats.sum(0) if total is None else total + feats.sum(0)
        squares = (feats**2).sum(0) if squares is None else squares + (feats**2).sum(0)
        count += feats.shape[0]
    if total is None or squares is None:
        raise ValueError(f"{source.name}: no audio to normalize")
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return mean.astype(np.float32), std.astype(np.float32)


def windows(source: AudioSource, config: WindowConfig) -> Iterator[list[tuple[float, np.ndarray]]]:
    """Batches of (start seconds, samples) of the windows of `source`."""
    plan = plan_windows(source.duration, config.window, config.overlap)
    for first in range(0, len(plan), config.batch):
        yield [
            (start, source.read(start, end)) for start, end in plan[first : first + config.batch]
        ]


def transcribe_windows(
    source: AudioSource,
    config: WindowConfig,
    decode_batch: Callable[[Sequence[np.ndarray], Sequence[float]], list[list[Word]]],
    timed: bool,
) -> list[Word]:
    """The words of a long recording: `decode_batch(samples, start seconds)` gives each
    window's words (with times offset by its start when `timed`), merged window by window."""
    plan = plan_windows(source.duration, config.window, config.overlap)
    merged: list[Word] = []
    index = 0
    for batch in windows(source, config):
        starts = [start for start, _ in batch]
        for words in decode_batch([samples for _, samples in batch], starts):
            if index == 0:
                merged = words
            elif timed:
                low, high = plan[index][0], plan[index - 1][1]
                merged = merge_timed(merged, words, low, high)
            else:
                merged = merge_untimed(merged, words, config.overlap / config.window)
            index += 1
    return merged

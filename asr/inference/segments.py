"""Where to cut a recording: at its long pauses, and in overlapping windows where it has
none.

Models are trained on utterances with short silences at their edges. Decoding a long
recording in fixed windows hands them several sentences and the seconds of silence
between them at once, which they never saw: on the demo model, fixed windows over test
utterances joined with pauses, and a second of silence either side of an utterance, each
made the WER several times that of decoding the utterances one by one (recipes/demo/
RESULTS.md, "Why the recording is cut at its pauses"). So a recording is first
cut at every pause longer than `max_pause` seconds, keeping `pause_pad` seconds of it on
each side of the speech (the demo corpus's utterances have 0.15 s); a stretch of speech
longer than the window is cut into overlapping windows, merged afterwards
(`asr.inference.longform`).

A frame (25 ms every 10 ms) is quiet when its energy is more than `QUIET_MARGIN_DB` below
the recording's loud frames (the 95th percentile of its frame energies), or below
`SILENCE_DBFS` whatever the level: a recording of silence has no speech to decode.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from asr.frames import FRAMES_PER_SECOND, SAMPLE_RATE
from asr.inference.audio import AudioSource

QUIET_MARGIN_DB = 30.0
SILENCE_DBFS = -60.0  # a frame this quiet (RMS re full scale) is silence at any level
LOUD_PERCENTILE = 95.0
FRAME_LENGTH, FRAME_SHIFT = 400, 160  # samples: 25 ms every 10 ms
BLOCK_SECONDS = 60.0  # the energy pass reads this much at once


def frame_energies(samples: np.ndarray) -> np.ndarray:
    """Log power (natural log) of each 25 ms frame, every 10 ms, of 16 kHz samples."""
    count = 1 + (len(samples) - FRAME_LENGTH) // FRAME_SHIFT if len(samples) >= FRAME_LENGTH else 0
    if count == 0:
        return np.zeros(0)
    sums = np.concatenate([[0.0], np.cumsum(samples.astype(np.float64) ** 2)])
    starts = np.arange(count) * FRAME_SHIFT
    power = (sums[starts + FRAME_LENGTH] - sums[starts]) / FRAME_LENGTH
    return np.log(power + 1e-20)


def recording_energies(source: AudioSource) -> np.ndarray:
    """`frame_energies` of a whole recording, read a block at a time (frame i starts at
    i / 100 seconds)."""
    blocks = []
    start = 0.0
    while start < source.duration:
        # each block reaches one frame into the next, so no frame is lost at its end
        end = start + BLOCK_SECONDS + (FRAME_LENGTH - FRAME_SHIFT) / SAMPLE_RATE
        energies = frame_energies(source.read(start, end))
        blocks.append(energies[: round(BLOCK_SECONDS * FRAMES_PER_SECOND)])
        start += BLOCK_SECONDS
    return np.concatenate(blocks) if blocks else np.zeros(0)


def quiet_frames(energies: np.ndarray) -> np.ndarray:
    """(T,) bool: the frames more than QUIET_MARGIN_DB below the loud ones, or below
    SILENCE_DBFS."""
    silent = energies < SILENCE_DBFS / 10 * math.log(10)  # dB -> natural log of power
    if energies.size == 0:
        return silent
    margin = QUIET_MARGIN_DB / 10 * math.log(10)
    loud = np.percentile(energies, LOUD_PERCENTILE)
    return silent | (energies < loud - margin)


def speech_stretches(
    energies: np.ndarray, duration: float, max_pause: float, keep: float | None = None
) -> list[tuple[float, float]]:
    """(start, end) seconds of the stretches between pauses longer than `max_pause`
    seconds (0: one stretch, the whole), each with `keep` seconds of the pause on either
    side (default `max_pause / 2`; at most half the pause)."""
    if max_pause <= 0:
        return [(0.0, duration)] if duration > 0 else []
    quiet = quiet_frames(energies)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]])))
    keep = max_pause / 2 if keep is None else keep
    stretches, start = [], 0.0
    for first, stop in zip(edges[::2], edges[1::2], strict=True):  # quiet frames [first, stop)
        begin = first / FRAMES_PER_SECOND
        end = duration if stop == len(quiet) else stop / FRAMES_PER_SECOND
        if end - begin <= max_pause:
            continue
        kept = min(keep, (end - begin) / 2)
        if begin > start:
            stretches.append((start, min(begin + kept, duration)))
        start = duration if stop == len(quiet) else end - kept  # ends in a pause: done
    if start < duration:
        stretches.append((start, duration))
    return [(round(float(a), 3), round(float(b), 3)) for a, b in stretches if b > a]


@dataclass(frozen=True)
class Segment:
    """A piece of a recording to decode: `start` to `end` seconds; `stretch` numbers the
    stretch of speech it belongs to (the windows of one stretch overlap)."""

    start: float
    end: float
    stretch: int


def plan_segments(
    stretches: list[tuple[float, float]], window: float, overlap: float
) -> Iterator[Segment]:
    """The stretches, each cut into overlapping windows when longer than `window`."""
    for number, (start, end) in enumerate(stretches):
        for a, b in plan_windows(end - start, window, overlap):
            yield Segment(round(start + a, 3), round(start + b, 3), number)


def plan_windows(duration: float, window: float, overlap: float) -> list[tuple[float, float]]:
    """(start, end) seconds of the windows that cover `duration` seconds."""
    if duration <= window:
        return [(0.0, duration)]
    step = window - overlap
    count = math.ceil((duration - overlap) / step)
    return [(i * step, min(i * step + window, duration)) for i in range(count)]

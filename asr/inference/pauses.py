"""Shorten long pauses before encoding, keeping the map back to the audio's frames.

Models are trained on utterances with short silences at their edges; a recording that
holds seconds of silence between sentences gives them inputs they never saw, and with
per-utterance (or per-window) normalization the silence also shifts the statistics every
frame is normalized with. On the demo model, one second of noise floor either side of each
test utterance raised its WER from 7.9 % to 36 %, and 9.5 % with the unpadded utterance's
statistics (recipes/demo/RESULTS.md, "Long recordings"). So a run of quiet frames longer
than `max_pause` seconds keeps only `max_pause / 2` seconds at each end; the frame map
gives each kept frame's place in the audio, so timestamps stay true.

A frame is quiet when its mean log-mel energy is more than `QUIET_MARGIN` (30 dB) below
the loud frames of the same stretch of audio (their 95th percentile); audio with no frame
that much louder than its quietest is left alone.
"""

from __future__ import annotations

import math

import numpy as np

from asr.frames import FRAMES_PER_SECOND

QUIET_MARGIN = 3 * math.log(10)  # 30 dB in natural-log power, as log-mel features are
LOUD_PERCENTILE = 95.0


def quiet_frames(features: np.ndarray) -> np.ndarray:
    """(T,) bool: the quiet frames of unnormalized log-mel `features` (T, F)."""
    if features.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    energy = features.mean(axis=1)
    loud = np.percentile(energy, LOUD_PERCENTILE)
    if loud - energy.min() < QUIET_MARGIN:
        return np.zeros(len(energy), dtype=bool)
    return energy < loud - QUIET_MARGIN


def shorten_pauses(features: np.ndarray, max_pause: float) -> tuple[np.ndarray, np.ndarray]:
    """(kept features, the original index of each kept frame): every run of quiet frames
    longer than `max_pause` seconds keeps `max_pause / 2` seconds at each end (0: keep
    everything)."""
    index = np.arange(features.shape[0])
    if max_pause <= 0:
        return features, index
    keep_each_side = round(max_pause * FRAMES_PER_SECOND / 2)
    quiet = quiet_frames(features)
    keep = np.ones(len(quiet), dtype=bool)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]])))
    for start, stop in zip(edges[::2], edges[1::2], strict=True):  # quiet runs [start, stop)
        if stop - start > 2 * keep_each_side:
            keep[start + keep_each_side : stop - keep_each_side] = False
    return features[keep], index[keep]

"""Streams decoded together, as live audio reaches a server: every stream fed `PIECE`
samples at a time and all of them decoded after each piece. What the check's and the
bench's `streaming` sections time."""

from __future__ import annotations

import time

import numpy as np

from asr.gpu_check.timing import clock
from asr.inference.streaming import StreamingRecognizer

PIECE = 1600  # samples: 0.1 s


def decode_streams(
    recognizer: StreamingRecognizer, audio: list[np.ndarray]
) -> tuple[list[list[int]], float]:
    """All of `audio` as concurrent streams fed `PIECE` samples at a time -> each stream's
    tokens, and the seconds it took."""
    began = time.perf_counter()
    streams = recognizer.feed(audio, PIECE)
    return [s.tokens for s in streams], clock(recognizer.device.type) - began

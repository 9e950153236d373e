"""When a live segment ends: sherpa-onnx's endpoint rules, as a pure function of times.

A stream is cut into segments at its pauses, each ending with a final result. The rules
read only what the search has decoded: the seconds of the segment, the seconds since its
last token (the encoder frames that emitted nothing: the model's own blanks), whether it
has words, and whether the stream has ended. `detect_endpoint` is tested by value
(tests/inference/test_endpoint.py); `asr-serve` calls it after every chunk.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class EndpointRules:
    """When a segment ends, in seconds of the stream (sherpa-onnx's defaults):

    - `silence_after_speech_s`: encoder frames without a token after the segment's last
      word;
    - `silence_s`: frames without a token in a segment with no word yet (it restarts,
      no final is sent);
    - `max_segment_s`: the longest segment, words or not."""

    silence_after_speech_s: float = 1.2
    silence_s: float = 2.4
    max_segment_s: float = 20.0

    def __post_init__(self) -> None:
        for name in ("silence_after_speech_s", "silence_s", "max_segment_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"endpoint rule {name} must be > 0, got {getattr(self, name)}")


class Endpoint(enum.Enum):
    """What a segment does after a chunk: goes on (`NONE`), ends with a final result of its
    words (`FINAL`), or starts again without one, having no words (`RESTART`)."""

    NONE = "none"
    FINAL = "final"
    RESTART = "restart"


def detect_endpoint(
    rules: EndpointRules,
    decoded_s: float,
    trailing_silence_s: float,
    has_words: bool,
    ended: bool,
) -> Endpoint:
    """The endpoint of a segment that has `decoded_s` seconds, the last
    `trailing_silence_s` of them without a token (all of them when it has none), words or
    not (`has_words`), in a stream that has `ended` (every chunk decoded): a segment with
    words ends at the end of the stream, after `silence_after_speech_s` of silence, or at
    `max_segment_s`; one without restarts after `silence_s` or at `max_segment_s`."""
    if has_words:
        if (
            ended
            or trailing_silence_s >= rules.silence_after_speech_s
            or decoded_s >= rules.max_segment_s
        ):
            return Endpoint.FINAL
        return Endpoint.NONE
    if trailing_silence_s >= rules.silence_s or decoded_s >= rules.max_segment_s:
        return Endpoint.RESTART
    return Endpoint.NONE

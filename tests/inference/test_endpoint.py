"""The endpoint rules by value (sherpa-onnx's rules: a segment with words ends after a
pause, at the end of the stream or at the longest segment; one without words restarts)."""

import pytest

from asr.inference.endpoint import Endpoint, EndpointRules, detect_endpoint

RULES = EndpointRules(silence_after_speech_s=1.2, silence_s=2.4, max_segment_s=20.0)


@pytest.mark.parametrize(
    ("decoded_s", "silence_s", "has_words", "ended", "expected"),
    [
        # words, then a pause: a final once the pause reaches 1.2 s, not before
        (5.0, 1.19, True, False, Endpoint.NONE),
        (5.0, 1.2, True, False, Endpoint.FINAL),
        (5.0, 3.0, True, False, Endpoint.FINAL),
        # no words: the segment restarts after 2.4 s of nothing (1.2 s is not enough)
        (2.0, 2.0, False, False, Endpoint.NONE),
        (2.4, 2.4, False, False, Endpoint.RESTART),
        (1.5, 1.5, False, False, Endpoint.NONE),
        # the longest segment ends either way
        (19.9, 0.0, True, False, Endpoint.NONE),
        (20.0, 0.0, True, False, Endpoint.FINAL),
        (20.0, 0.3, False, False, Endpoint.RESTART),
        # the end of the stream: a final when there are words, nothing otherwise
        (3.0, 0.0, True, True, Endpoint.FINAL),
        (3.0, 0.5, False, True, Endpoint.NONE),
        (3.0, 2.5, False, True, Endpoint.RESTART),
    ],
)
def test_detect_endpoint_by_value(decoded_s, silence_s, has_words, ended, expected):
    assert detect_endpoint(RULES, decoded_s, silence_s, has_words, ended) is expected


def test_other_rules_move_the_thresholds():
    rules = EndpointRules(silence_after_speech_s=0.5, silence_s=1.0, max_segment_s=4.0)
    assert detect_endpoint(rules, 2.0, 0.5, True, False) is Endpoint.FINAL
    assert detect_endpoint(rules, 2.0, 0.49, True, False) is Endpoint.NONE
    assert detect_endpoint(rules, 1.0, 1.0, False, False) is Endpoint.RESTART
    assert detect_endpoint(rules, 4.0, 0.0, True, False) is Endpoint.FINAL


@pytest.mark.parametrize("name", ["silence_after_speech_s", "silence_s", "max_segment_s"])
def test_rules_must_be_positive(name):
    with pytest.raises(ValueError, match=f"endpoint rule {name} must be > 0"):
        EndpointRules(**{name: 0.0})

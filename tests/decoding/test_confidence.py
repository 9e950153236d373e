"""Confidence by specification: 1 - H(p) / log V on known distributions, a word's the
least of its tokens', and the beam's merge keeping the more probable alignment's."""

import dataclasses
import math

import pytest
import torch

from asr.decoding.confidence import token_confidence, word_confidence
from asr.decoding.transducer_beam import _add, _Candidate


def test_one_hot_is_certain_and_uniform_is_not():
    one_hot = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]).log()
    assert token_confidence(one_hot).tolist() == [1.0, 1.0]
    uniform = torch.full((3, 7), 1 / 7).log()
    assert token_confidence(uniform) == pytest.approx([0.0] * 3, abs=1e-6)


def test_a_hand_computed_distribution():
    # p = (1/2, 1/4, 1/4): H = 1/2 ln 2 + 2 x 1/4 ln 4 = 3/2 ln 2
    probs = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    expected = 1 - 1.5 * math.log(2) / math.log(3)
    assert float(token_confidence(probs.log())) == pytest.approx(expected, rel=1e-6)
    # it reads log-probabilities of any leading shape, in any float type
    batch = torch.stack([probs, probs.flip(0)]).log().to(torch.bfloat16)[None]
    assert token_confidence(batch).shape == (1, 2)
    assert token_confidence(batch)[0, 1].item() == pytest.approx(expected, abs=1e-2)


def test_a_word_is_as_sure_as_its_least_sure_token():
    assert word_confidence([0.9, 0.4, 0.8]) == 0.4
    with pytest.raises(ValueError, match="at least one token"):
        word_confidence([])


def _candidate(score: float, frames: tuple, sure: tuple, row: int, token: int) -> _Candidate:
    return _Candidate((5, 6), score, row, token, frames, sure, held=0.0, ended=True)


def test_the_beam_merge_keeps_the_more_probable_alignment_s_frames_and_confidences():
    likely = _candidate(math.log(0.3), (2, 4), (0.9, 0.8), row=1, token=6)
    unlikely = _candidate(math.log(0.1), (1, 4), (0.2, 0.3), row=0, token=-1)
    for order in ((likely, unlikely), (unlikely, likely)):
        candidates: dict = {}
        for c in order:
            _add(candidates, dataclasses.replace(c))
        (merged,) = candidates.values()
        assert merged.score == pytest.approx(math.log(0.4))  # the alignments' sum
        assert (merged.frames, merged.confidences) == ((2, 4), (0.9, 0.8))
        # the row that needs no predictor step (token -1) is the one that goes on
        assert (merged.row, merged.token) == (0, -1)

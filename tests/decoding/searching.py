"""Whole-utterance decoding through the search contract, for the tests: `start`, one
`advance` (or one per chunk), then the hypotheses."""

from __future__ import annotations

from torch import Tensor

from asr.decoding.biasing import BiasingGraph
from asr.decoding.fusion import LmFusion
from asr.decoding.hypotheses import Hypothesis, TimedTokens
from asr.decoding.label_looping import LabelLoopingGreedy
from asr.decoding.search import decode_with, search_whole
from asr.decoding.transducer import FrameLoopingGreedy, GreedyOptions
from asr.decoding.transducer_beam import BeamOptions, BeamSearch
from asr.models.transducer import Transducer


def greedy_timed(
    model: Transducer,
    enc: Tensor,
    lens: Tensor,
    options: GreedyOptions = GreedyOptions(),
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
) -> list[TimedTokens]:
    """Frame-looping greedy search of whole utterances."""
    return decode_with(FrameLoopingGreedy(options), model, enc, lens, biasing, lm)


def greedy_tokens(
    model: Transducer,
    enc: Tensor,
    lens: Tensor,
    options: GreedyOptions = GreedyOptions(),
    biasing: BiasingGraph | None = None,
) -> list[list[int]]:
    return [h.tokens for h in greedy_timed(model, enc, lens, options, biasing)]


def label_looping(
    model: Transducer,
    enc: Tensor,
    lens: Tensor,
    options: GreedyOptions = GreedyOptions(),
    fused: bool = False,
    biasing: BiasingGraph | None = None,
) -> list[TimedTokens]:
    """Label-looping greedy search on a CPU: its eager loops, or the CUDA graph's fused
    body run eagerly."""
    search = LabelLoopingGreedy(options, loops="fused" if fused else "eager")
    return decode_with(search, model, enc, lens, biasing)


def beam_nbest(
    model: Transducer,
    enc: Tensor,
    lens: Tensor,
    options: BeamOptions = BeamOptions(),
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
) -> list[list[Hypothesis]]:
    """Beam search of whole utterances: per utterance its `options.nbest` best."""
    if enc.size(0) == 0:
        return []
    search = BeamSearch(options)
    return search.nbest(search_whole(search, model, enc, lens, biasing, lm))

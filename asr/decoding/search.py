"""One decoding entry point for every model kind."""

from __future__ import annotations

import dataclasses
import functools
import logging

from torch import Tensor

from asr.decoding import aed, label_looping, transducer
from asr.decoding.biasing import ContextGraph
from asr.models.aed import EncoderDecoder
from asr.models.build import Model
from asr.models.transducer import Transducer

log = logging.getLogger(__name__)

SearchOptions = transducer.GreedyOptions | transducer.BeamOptions | aed.AedSearchOptions


def is_attention_decoder(model: Model) -> bool:
    """An `EncoderDecoder`, or an object with its decoding interface that says it is one
    (`is_attention_decoder`: the ONNX models of `asr.inference.onnx_runtime`)."""
    return isinstance(model, EncoderDecoder) or getattr(model, "is_attention_decoder", False)


def default_options(
    model: Model, beam_size: int = 1, max_symbols_per_frame: int | None = None
) -> SearchOptions:
    """Greedy search for `beam_size` 1, else beam search of `beam_size`, with default
    limits (`transducer.BeamOptions`, `aed.AedSearchOptions`); `max_symbols_per_frame`
    (transducers; None: the default, 3) caps the tokens emitted per encoder frame."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if is_attention_decoder(model):
        if max_symbols_per_frame is not None:
            raise ValueError(
                "max_symbols_per_frame is a transducer's limit: an attention decoder has none"
            )
        return aed.AedSearchOptions(beam_size=beam_size)
    symbols = {}
    if max_symbols_per_frame is not None:
        symbols["max_symbols_per_frame"] = max_symbols_per_frame
    if beam_size > 1:
        return transducer.BeamOptions(beam_size=beam_size, **symbols)
    return transducer.GreedyOptions(**symbols)


def decode(
    model: Model,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: SearchOptions | None = None,
    context: ContextGraph | None = None,
) -> list[list[int]]:
    """encoder_out (B, T, D), encoder_lens (B,) -> B token-id lists (the best hypothesis),
    with the search of the model's kind (greedy by default); `context`: phrases to boost
    (`asr.decoding.biasing`)."""
    options = options or default_options(model)
    if is_attention_decoder(model):
        if not isinstance(options, aed.AedSearchOptions):
            raise TypeError(f"an EncoderDecoder decodes with AedSearchOptions, got {options!r}")
        return aed.decode(model, encoder_out, encoder_lens, options, context)
    hyps = decode_timed(model, encoder_out, encoder_lens, options, context)
    return [hyp.tokens for hyp in hyps]


NO_TOKEN_TIMES = (
    "an attention decoder gives no token times (its cross-attention is not a reliable "
    "alignment in this package): word timestamps need a transducer"
)


def has_token_times(model: Model) -> bool:
    """Whether the model's searches give each token's frame (transducers do)."""
    return not is_attention_decoder(model)


def decode_timed(
    model: Model,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: SearchOptions | None = None,
    context: ContextGraph | None = None,
) -> list[transducer.TimedTokens]:
    """`decode`'s best hypotheses with the encoder frame and the confidence of each token
    (transducers; an attention decoder raises ValueError)."""
    options = options or default_options(model)
    if not has_token_times(model):
        raise ValueError(NO_TOKEN_TIMES)
    if isinstance(options, transducer.BeamOptions):
        hyps = transducer.beam_search(model, encoder_out, encoder_lens, options, context)
        return [
            transducer.TimedTokens(
                list(best[0].tokens), list(best[0].frames), list(best[0].confidences)
            )
            if best
            else transducer.TimedTokens([], [], [])
            for best in hyps
        ]
    if not isinstance(options, transducer.GreedyOptions):
        raise TypeError(f"a Transducer decodes with GreedyOptions or BeamOptions, got {options!r}")
    if context is not None and context.num_phrases:
        _greedy_biasing_warning()
    if encoder_out.is_cuda and isinstance(model, Transducer):
        # The same tokens and frames; on a GPU without a round trip per frame (CUDA graphs).
        search = label_looping.cached_search(model, options, biased=context is not None)
        return search(encoder_out, encoder_lens, context)
    return transducer.greedy_search_timed(model, encoder_out, encoder_lens, options, context)


@functools.cache
def _greedy_biasing_warning() -> None:
    log.warning(
        "context phrases with greedy search: it can only add a bonus as tokens come, never "
        "take one back, and gains little (recipes/demo/RESULTS.md, 'Context biasing'); a "
        "beam search (--beam-size 8) compares hypotheses and gives back what a failed match "
        "earned"
    )


def decode_nbest(
    model: Model,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: SearchOptions,
    nbest: int,
    context: ContextGraph | None = None,
) -> list[list[tuple[list[int], float]]]:
    """Per utterance its `nbest` best hypotheses as (token ids, score), best first, from the
    beam search of `options` (a beam at least `nbest` wide). Scores are log-probabilities
    (attention decoders: divided by the length penalty), plus the context bonus of the
    phrases they completed where `context` is given."""
    beam = getattr(options, "beam_size", 1)
    if not 1 <= nbest <= beam:
        raise ValueError(
            f"an n-best list of {nbest} needs a beam search at least as wide, not {beam}"
        )
    if is_attention_decoder(model):
        if not isinstance(options, aed.AedSearchOptions):
            raise TypeError(f"an EncoderDecoder decodes with AedSearchOptions, got {options!r}")
        hyps = aed.beam_search_nbest(
            model, encoder_out, encoder_lens, beam, options.length_penalty, options.max_tps, context
        )
        return [h[:nbest] for h in hyps]
    if not isinstance(options, transducer.BeamOptions):
        raise TypeError(f"a Transducer's n-best list comes from BeamOptions, got {options!r}")
    wide = dataclasses.replace(options, nbest=nbest)
    return [
        [(list(h.tokens), h.score) for h in hyps]
        for hyps in transducer.beam_search(model, encoder_out, encoder_lens, wide, context)
    ]

"""One decoding entry point for every model kind."""

from __future__ import annotations

from torch import Tensor

from asr.decoding import aed, transducer
from asr.models.aed import EncoderDecoder
from asr.models.build import Model

SearchOptions = transducer.GreedyOptions | aed.AedSearchOptions


def default_options(model: Model, beam_size: int = 1) -> SearchOptions:
    """Greedy (or, for attention decoders, beam search of `beam_size`) with default limits."""
    if isinstance(model, EncoderDecoder):
        return aed.AedSearchOptions(beam_size=beam_size)
    if beam_size != 1:
        raise ValueError(
            f"beam_size={beam_size}: transducer models decode with greedy search only (beam_size=1)"
        )
    return transducer.GreedyOptions()


def decode(
    model: Model, encoder_out: Tensor, encoder_lens: Tensor, options: SearchOptions | None = None
) -> list[list[int]]:
    """encoder_out (B, T, D), encoder_lens (B,) -> B token-id lists, with the search of the
    model's kind (greedy by default)."""
    options = options or default_options(model)
    if isinstance(model, EncoderDecoder):
        if not isinstance(options, aed.AedSearchOptions):
            raise TypeError(f"an EncoderDecoder decodes with AedSearchOptions, got {options!r}")
        return aed.decode(model, encoder_out, encoder_lens, options)
    if not isinstance(options, transducer.GreedyOptions):
        raise TypeError(f"a Transducer decodes with GreedyOptions, got {options!r}")
    return transducer.greedy_search(model, encoder_out, encoder_lens, options)

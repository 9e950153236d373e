"""The search contract, and one decoding entry point for every model kind.

A transducer search is a small strategy object (its options) with an explicit progress, as
the encoder has `step(x, state, chunking) -> (y, state)`:

    search = transducer_search(options, device)           # from its options
    progress = search.start(model, batch_size, device, biasing=None, first_frame=0, lm=None)
    progress = search.advance(model, progress, encoder_out, encoder_lens)   # per chunk
    hypotheses = search.best(progress)                     # list[TimedTokens]

Whole-utterance decoding is `start` + one `advance` (`decode_with`); streaming is one
`advance` per chunk. A progress holds everything the search keeps between chunks (each
row's `HypothesisState`, tokens, frames, confidences, and the biasing graph and the
language model (`asr.decoding.fusion.LmFusion`) its rows are scored with), and is stacked
(`type(progress).cat(parts)`) and taken apart (`progress.select(rows)`) so that streams
with different histories share one step (`advance_each`). Frames count from the start of
the audio: `first_frame` starts a search later in a stream (after an endpoint). The
searches: greedy (`FrameLoopingGreedy` on CPU, `LabelLoopingGreedy` on CUDA: the same
decisions) and `BeamSearch`. Each serves a token-and-duration transducer too
(`asr.decoding.durations`): it skips the frames the predicted durations jump over, and its
progress counts the frames it visited (`visited`).

Attention decoders are label-synchronous and have no progress over encoder chunks: their
greedy and beam searches (`asr.decoding.aed`) take their options the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from asr.decoding import aed
from asr.decoding.biasing import BiasingGraph
from asr.decoding.fusion import LmFusion
from asr.decoding.hypotheses import TimedTokens
from asr.decoding.label_looping import LabelLoopingGreedy
from asr.decoding.transducer import FrameLoopingGreedy, GreedyOptions, GreedyProgress
from asr.decoding.transducer_beam import BeamOptions, BeamProgress, BeamSearch
from asr.models.aed import EncoderDecoder
from asr.models.build import Model
from asr.models.transducer import Transducer

SearchOptions = GreedyOptions | BeamOptions | aed.AedSearchOptions
Progress = GreedyProgress | BeamProgress
P = TypeVar("P", GreedyProgress, BeamProgress)


class TransducerSearch(Protocol[P]):
    """What every transducer search does (see the module's docstring)."""

    def start(
        self,
        model: Transducer,
        batch_size: int,
        device: torch.device | str,
        biasing: BiasingGraph | None = None,
        first_frame: int = 0,
        lm: LmFusion | None = None,
    ) -> P:
        """`batch_size` utterances before their first frame (frame `first_frame` of the
        audio), each scored with `biasing` (None: no phrases) and `lm` (None: no language
        model)."""
        ...

    def advance(
        self, model: Transducer, progress: P, encoder_out: Tensor, encoder_lens: Tensor
    ) -> P:
        """The search after the next frames: encoder_out (B, T, D_enc), encoder_lens (B,)
        valid. `progress` itself is left as it was."""
        ...

    def best(self, progress: P) -> list[TimedTokens]:
        """Each utterance's best hypothesis so far."""
        ...


def transducer_search(
    options: GreedyOptions | BeamOptions, device: torch.device | str = "cpu"
) -> TransducerSearch:
    """The search of `options` on `device`: beam search for `BeamOptions`; greedy search
    for `GreedyOptions`, label-looping with CUDA graphs on CUDA (no round trip per frame),
    frame-looping elsewhere (the same tokens, frames and confidences)."""
    make = _SEARCHES.get(type(options))
    if make is None:
        raise TypeError(f"a Transducer decodes with GreedyOptions or BeamOptions, got {options!r}")
    return make(options, torch.device(device))


def _greedy(options: GreedyOptions, device: torch.device) -> TransducerSearch:
    return LabelLoopingGreedy(options) if device.type == "cuda" else FrameLoopingGreedy(options)


_SEARCHES = {GreedyOptions: _greedy, BeamOptions: lambda options, _: BeamSearch(options)}


def search_whole(
    search: TransducerSearch[P],
    model: Transducer,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
) -> P:
    """The progress after whole utterances (a batch of at least one): `start`, then one
    `advance`."""
    progress = search.start(model, encoder_out.size(0), encoder_out.device, biasing, lm=lm)
    return search.advance(model, progress, encoder_out, encoder_lens)


def decode_with(
    search: TransducerSearch,
    model: Transducer,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
) -> list[TimedTokens]:
    """Whole utterances' best hypotheses (`search_whole`, then `best`)."""
    if encoder_out.size(0) == 0:
        return []
    return search.best(search_whole(search, model, encoder_out, encoder_lens, biasing, lm))


def advance_each(
    search: TransducerSearch,
    model: Transducer,
    progresses: Sequence[P],
    encoder_out: Tensor,
    encoder_lens: Tensor,
) -> list[P]:
    """Advance each of `progresses` (one per row of encoder_out (N, T, D_enc), N = their
    rows) in as few search steps as can be shared: those scored with the same biasing
    graph and language model (or none) are stacked into one."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, progress in enumerate(progresses):
        groups.setdefault((id(progress.biasing), id(progress.lm)), []).append(i)
    advanced: list[P | None] = [None] * len(progresses)
    for rows in groups.values():
        stacked = type(progresses[rows[0]]).cat([progresses[i] for i in rows])
        at = torch.tensor(rows, device=encoder_out.device)
        stacked = search.advance(
            model, stacked, encoder_out.index_select(0, at), encoder_lens.index_select(0, at)
        )
        for j, i in enumerate(rows):
            advanced[i] = stacked.select([j])
    return advanced


def is_attention_decoder(model: Model) -> bool:
    """An `EncoderDecoder`, or an object with its decoding interface that says it is one
    (`is_attention_decoder`: the ONNX models of `asr.inference.onnx_runtime`)."""
    return isinstance(model, EncoderDecoder) or getattr(model, "is_attention_decoder", False)


def default_options(
    model: Model, beam_size: int = 1, max_symbols_per_frame: int | None = None
) -> SearchOptions:
    """Greedy search for `beam_size` 1, else beam search of `beam_size`, with default
    limits (`BeamOptions`, `aed.AedSearchOptions`); `max_symbols_per_frame` (transducers;
    None: the default, 3) caps the tokens emitted per encoder frame."""
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
        return BeamOptions(beam_size=beam_size, **symbols)
    return GreedyOptions(**symbols)


NO_TOKEN_TIMES = (
    "an attention decoder gives no token times (its cross-attention is not a reliable "
    "alignment in this package): word timestamps need a transducer"
)


def has_token_times(model: Model) -> bool:
    """Whether the model's searches give each token's frame (transducers do)."""
    return not is_attention_decoder(model)


def _aed_options(options: SearchOptions) -> aed.AedSearchOptions:
    if not isinstance(options, aed.AedSearchOptions):
        raise TypeError(f"an EncoderDecoder decodes with AedSearchOptions, got {options!r}")
    return options


def decode(
    model: Model,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: SearchOptions | None = None,
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
) -> list[list[int]]:
    """encoder_out (B, T, D), encoder_lens (B,) -> B token-id lists (the best hypothesis),
    with the search of the model's kind (greedy by default); `biasing`: phrases to boost
    (`asr.decoding.biasing`); `lm`: a language model to fuse (`asr.decoding.fusion`)."""
    options = options or default_options(model)
    if is_attention_decoder(model):
        return aed.decode(model, encoder_out, encoder_lens, _aed_options(options), biasing, lm)
    hyps = decode_timed(model, encoder_out, encoder_lens, options, biasing, lm)
    return [hyp.tokens for hyp in hyps]


def decode_timed(
    model: Model,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: SearchOptions | None = None,
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
) -> list[TimedTokens]:
    """`decode`'s best hypotheses with the encoder frame and the confidence of each token
    (transducers; an attention decoder raises ValueError)."""
    options = options or default_options(model)
    if not has_token_times(model):
        raise ValueError(NO_TOKEN_TIMES)
    search = transducer_search(options, encoder_out.device)
    return decode_with(search, model, encoder_out, encoder_lens, biasing, lm)


def decode_nbest(
    model: Model,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: SearchOptions,
    nbest: int,
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
) -> list[list[tuple[list[int], float]]]:
    """Per utterance its `nbest` best hypotheses as (token ids, score), best first, from the
    beam search of `options` (a beam at least `nbest` wide). Scores are log-probabilities
    (attention decoders: divided by the length penalty), plus the biasing bonus of the
    phrases they completed where `biasing` is given, plus the fused LM scores (the end of
    the sentence included) where `lm` is given."""
    beam = getattr(options, "beam_size", 1)
    if not 1 <= nbest <= beam:
        raise ValueError(
            f"an n-best list of {nbest} needs a beam search at least as wide, not {beam}"
        )
    if is_attention_decoder(model):
        wide = dataclasses.replace(_aed_options(options), nbest=nbest)
        return aed.beam_search_nbest(model, encoder_out, encoder_lens, wide, biasing, lm)
    if not isinstance(options, BeamOptions):
        raise TypeError(f"a Transducer's n-best list comes from BeamOptions, got {options!r}")
    search = BeamSearch(dataclasses.replace(options, nbest=nbest))
    if encoder_out.size(0) == 0:
        return []
    progress = search_whole(search, model, encoder_out, encoder_lens, biasing, lm)
    return [[(list(h.tokens), h.score) for h in hyps] for hyps in search.nbest(progress)]

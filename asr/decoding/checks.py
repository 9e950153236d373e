"""Input checks shared by the decoding modules."""

from __future__ import annotations

from torch import Tensor


def check_encoder_output(encoder_out: Tensor, encoder_lens: Tensor) -> None:
    """Raise ValueError unless encoder_out is (B, T, D) and encoder_lens is (B,)."""
    if encoder_out.dim() != 3 or encoder_lens.shape != encoder_out.shape[:1]:
        raise ValueError(
            f"expected encoder_out (B, T, D) and encoder_lens (B,), got "
            f"{tuple(encoder_out.shape)} and {tuple(encoder_lens.shape)}"
        )


def check_beam(beam_size: int, nbest: int) -> None:
    """Raise ValueError unless a beam of `beam_size` >= 1 can give an n-best list of
    `nbest` (1 to beam_size)."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be in [1, beam_size={beam_size}], got {nbest}")


def check_same_biasing(graphs: list) -> object:
    """The one biasing graph (or None) of progresses stacked into one search step: rows
    scored with different graphs cannot share a step (`asr.decoding.search.advance_each`
    groups them)."""
    first = graphs[0]
    if any(g is not first for g in graphs):
        raise ValueError("progresses with different biasing graphs cannot be stacked")
    return first


def check_same_lm(fusions: list) -> object:
    """The one language-model fusion (or None) of progresses stacked into one search step,
    as `check_same_biasing`."""
    first = fusions[0]
    if any(f is not first for f in fusions):
        raise ValueError("progresses fused with different language models cannot be stacked")
    return first

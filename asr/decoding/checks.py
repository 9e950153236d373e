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

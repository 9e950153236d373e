"""Input checks and the reduction that every loss of `asr.losses` shares."""

from __future__ import annotations

import torch
from torch import Tensor

REDUCTIONS = ("mean", "sum", "none")


def validate_inputs(
    encoder_out: Tensor,
    predictor_out: Tensor,
    targets: Tensor,
    encoder_lens: Tensor,
    target_lens: Tensor,
    reduction: str,
) -> tuple[int, int]:
    """Check shapes and lengths; return (max encoder length, max target length)."""
    check_reduction(reduction)
    if encoder_out.dim() != 3 or predictor_out.dim() != 3 or targets.dim() != 2:
        raise ValueError(
            "expected encoder_out (B, T, D_enc), predictor_out (B, U+1, D_pred), targets (B, U);"
            f" got {tuple(encoder_out.shape)}, {tuple(predictor_out.shape)}, "
            f"{tuple(targets.shape)}"
        )
    if encoder_lens.dim() != 1 or target_lens.dim() != 1:
        raise ValueError(
            f"encoder_lens and target_lens must be (B,), got {tuple(encoder_lens.shape)} "
            f"and {tuple(target_lens.shape)}"
        )
    sizes = {
        "encoder_out": encoder_out.size(0),
        "predictor_out": predictor_out.size(0),
        "targets": targets.size(0),
        "encoder_lens": encoder_lens.size(0),
        "target_lens": target_lens.size(0),
    }
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch sizes differ: {sizes}")
    extremes = [encoder_lens.max(), encoder_lens.min(), target_lens.max(), target_lens.min()]
    max_t, min_t, max_u, min_u = torch.stack(extremes).tolist()  # one device sync
    if max_t > encoder_out.size(1) or min_t < 1:
        raise ValueError(
            f"encoder_lens must lie in [1, T={encoder_out.size(1)}], got [{min_t}, {max_t}]"
        )
    if max_u > targets.size(1) or min_u < 0:
        raise ValueError(
            f"target_lens must lie in [0, U={targets.size(1)}], got [{min_u}, {max_u}]"
        )
    if predictor_out.size(1) < max_u + 1:
        raise ValueError(
            f"predictor_out has {predictor_out.size(1)} positions but max(target_lens)+1 = "
            f"{max_u + 1} are needed (blank/start first, then one per token)"
        )
    return max_t, max_u


def check_reduction(reduction: str) -> None:
    """Raise unless `reduction` is "mean", "sum" or "none"."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def reduce_nll(nll: Tensor, reduction: str) -> Tensor:
    """Per-utterance losses (B,) -> "mean" over the batch, "sum" or "none" (as is)."""
    if reduction == "mean":
        return nll.mean()
    return nll.sum() if reduction == "sum" else nll

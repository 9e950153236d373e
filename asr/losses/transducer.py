"""Transducer (RNN-T) losses: pure functions of the joiner and the tensors it combines.

Legend: B batch, T frames, U tokens, V vocabulary, D width. Every loss here shares one
signature: ``(joiner, encoder_out (B, T, D_enc), predictor_out (B, U+1, D_pred),
targets (B, U), encoder_lens (B,), target_lens (B,), *, blank=0, reduction="mean")``.
``joiner(enc (..., T, 1, D_enc), pred (..., 1, U+1, D_pred))`` gives logits
(..., T, U+1, V). "mean" averages the per-utterance negative log-likelihoods over the
batch, "sum" adds them, "none" returns them, shape (B,).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torchaudio.functional as AF
from torch import Tensor

from asr.losses.samplewise import reduce_nll, samplewise_loss

Joiner = Callable[[Tensor, Tensor], Tensor]
_REDUCTIONS = ("mean", "sum", "none")


def _validate(
    encoder_out: Tensor,
    predictor_out: Tensor,
    targets: Tensor,
    encoder_lens: Tensor,
    target_lens: Tensor,
    reduction: str,
) -> tuple[int, int]:
    """Check shapes and lengths; return (max encoder length, max target length)."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
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


def batched_transducer_loss(
    joiner: Joiner,
    encoder_out: Tensor,
    predictor_out: Tensor,
    targets: Tensor,
    encoder_lens: Tensor,
    target_lens: Tensor,
    *,
    blank: int = 0,
    reduction: str = "mean",
) -> Tensor:
    """The whole padded batch at once: logits (B, T, U+1, V) then torchaudio's RNN-T loss.

    Inputs padded beyond the lengths are trimmed to max(encoder_lens) frames and
    max(target_lens) tokens first. Memory grows with B x T x U x V: fast, but hungry.
    """
    max_t, max_u = _validate(
        encoder_out, predictor_out, targets, encoder_lens, target_lens, reduction
    )
    encoder_out, predictor_out = encoder_out[:, :max_t], predictor_out[:, : max_u + 1]
    logits = joiner(encoder_out.unsqueeze(2), predictor_out.unsqueeze(1))  # (B, T, U+1, V)
    vocab = logits.size(-1)
    if not 0 <= blank < vocab:
        raise ValueError(f"blank={blank} is outside the joiner's vocabulary [0, {vocab})")
    with warnings.catch_warnings(), torch.autocast(logits.device.type, enabled=False):
        # torchaudio deprecates its RNN-T loss (it still works); it wants fp32 (or fp16).
        warnings.filterwarnings("ignore", message=".*rnnt_loss.*deprecated", category=UserWarning)
        nll = AF.rnnt_loss(
            logits.float(),
            targets[:, :max_u].to(torch.int32),
            encoder_lens.to(torch.int32),
            target_lens.to(torch.int32),
            blank=blank,
            reduction="none",
        )
    return reduce_nll(nll, reduction)


def samplewise_transducer_loss(
    joiner: Joiner,
    encoder_out: Tensor,
    predictor_out: Tensor,
    targets: Tensor,
    encoder_lens: Tensor,
    target_lens: Tensor,
    *,
    blank: int = 0,
    reduction: str = "mean",
    group_size: int = 1,
    max_group_nodes: int | None = None,
    logits_dtype: torch.dtype | None = None,
    grad_clamp: float | None = None,
) -> Tensor:
    """One sample (or group) at a time: never more than one group's T x (U+1) x V logits.

    Same result as `batched_transducer_loss`. Options: up to `group_size` samples of
    similar size share one joiner call (padding only up to the group's longest), capped
    at `max_group_nodes` padded lattice nodes per group when given; `logits_dtype`
    (float16/bfloat16) for the joiner's matmuls with the lattice and gradients in float32,
    `grad_clamp` bounds each logit's gradient. See `asr.losses.samplewise`.
    """
    max_t, max_u = _validate(
        encoder_out, predictor_out, targets, encoder_lens, target_lens, reduction
    )
    return samplewise_loss(
        joiner,
        encoder_out,
        predictor_out,
        targets,
        encoder_lens,
        target_lens,
        max_t=max_t,
        max_u=max_u,
        blank=blank,
        reduction=reduction,
        group_size=group_size,
        max_group_nodes=max_group_nodes,
        logits_dtype=logits_dtype,
        grad_clamp=grad_clamp,
    )

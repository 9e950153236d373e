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

from asr.losses.checks import reduce_nll, validate_inputs
from asr.losses.samplewise import joiner_precision, samplewise_transducer_loss

__all__ = ["batched_transducer_loss", "samplewise_transducer_loss"]

Joiner = Callable[[Tensor, Tensor], Tensor]


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
    logits_dtype: torch.dtype | None = None,
) -> Tensor:
    """The whole padded batch at once: logits (B, T, U+1, V) then torchaudio's RNN-T loss.

    Inputs padded beyond the lengths are trimmed to max(encoder_lens) frames and
    max(target_lens) tokens first. Memory grows with B x T x U x V: fast, but hungry.
    ``logits_dtype`` runs the joiner under autocast in float16/bfloat16, or without
    autocast in float32; None leaves it to the surrounding autocast. The loss itself is
    computed in float32.
    """
    max_t, max_u = validate_inputs(
        encoder_out, predictor_out, targets, encoder_lens, target_lens, reduction
    )
    encoder_out, predictor_out = encoder_out[:, :max_t], predictor_out[:, : max_u + 1]
    with joiner_precision(logits_dtype, encoder_out, predictor_out) as (enc, pred):
        logits = joiner(enc.unsqueeze(2), pred.unsqueeze(1))  # (B, T, U+1, V)
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

"""CTC loss with the same conventions as the transducer losses.

Legend: B batch, T frames, U tokens, V vocabulary. "mean" averages the per-utterance
negative log-likelihoods over the batch (not divided by target length, unlike
``F.ctc_loss``'s own "mean"), "sum" adds them, "none" returns them, shape (B,).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from asr.losses.checks import check_reduction, reduce_nll


def _at_least_fp32(x: Tensor) -> Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def ctc_loss(
    log_probs: Tensor,
    log_prob_lens: Tensor,
    targets: Tensor,
    target_lens: Tensor,
    *,
    blank: int = 0,
    reduction: str = "mean",
) -> Tensor:
    """log_probs (B, T, V), log_prob_lens (B,), targets (B, U), target_lens (B,) -> loss.

    Impossible alignments (more tokens than frames allow) count as zero loss
    (``zero_infinity``), so one bad utterance cannot poison a batch.
    """
    check_reduction(reduction)
    if log_probs.dim() != 3 or targets.dim() != 2:
        raise ValueError(
            f"expected log_probs (B, T, V) and targets (B, U), got {tuple(log_probs.shape)} "
            f"and {tuple(targets.shape)}"
        )
    b, t, v = log_probs.shape
    if not (targets.size(0) == log_prob_lens.size(0) == target_lens.size(0) == b):
        raise ValueError(
            f"batch sizes differ: log_probs {b}, log_prob_lens {log_prob_lens.size(0)}, "
            f"targets {targets.size(0)}, target_lens {target_lens.size(0)}"
        )
    if not 0 <= blank < v:
        raise ValueError(f"blank={blank} is outside the vocabulary [0, {v})")
    if int(log_prob_lens.max()) > t:
        raise ValueError(f"log_prob_lens exceed T={t}: max {int(log_prob_lens.max())}")
    if int(target_lens.max()) > targets.size(1):
        raise ValueError(f"target_lens exceed U={targets.size(1)}: max {int(target_lens.max())}")
    with torch.autocast(log_probs.device.type, enabled=False):
        nll = F.ctc_loss(
            _at_least_fp32(log_probs).transpose(0, 1),  # (T, B, V)
            targets.long(),
            log_prob_lens.long(),
            target_lens.long(),
            blank=blank,
            reduction="none",
            zero_infinity=True,
        )
    return reduce_nll(nll, reduction)

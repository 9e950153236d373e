"""Label-smoothed cross-entropy for attention decoders, with the transducer losses'
conventions: "mean" averages per-utterance sums over the batch (not per token)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from asr.losses.checks import check_reduction, reduce_nll
from asr.tokens import IGNORE_INDEX


def label_smoothed_cross_entropy(
    logits: Tensor, targets: Tensor, *, label_smoothing: float = 0.0, reduction: str = "mean"
) -> Tensor:
    """logits (B, U, V), targets (B, U) with `IGNORE_INDEX` on padding -> loss.

    With smoothing e, the target distribution puts 1 - e on the target and e / V on every
    token (`F.cross_entropy`'s definition). "none" returns per-utterance sums (B,).
    """
    check_reduction(reduction)
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits (B, U, V) and targets (B, U), got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    per_token = F.cross_entropy(
        (logits if logits.dtype == torch.float64 else logits.float()).transpose(1, 2),  # (B, V, U)
        targets,
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
        reduction="none",
    )  # (B, U), zero where ignored
    return reduce_nll(per_token.sum(dim=1), reduction)

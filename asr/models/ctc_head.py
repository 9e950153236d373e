"""The optional CTC head both model kinds put on the encoder output."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def ctc_log_probs(ctc_head: nn.Module | None, encoder_out: Tensor, model_name: str) -> Tensor:
    """encoder_out (B, T, D_enc) -> CTC log-probabilities (B, T, V); an error without a head."""
    if ctc_head is None:
        raise RuntimeError(
            f"this {model_name} has no CTC head: build it with ctc_head=True "
            "(config key model.ctc_head) to use a CTC loss"
        )
    return F.log_softmax(ctc_head(encoder_out), dim=-1)

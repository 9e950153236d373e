"""CTC greedy decoding: best path, repeats merged, blanks dropped."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.inference_mode()
def ctc_greedy_search(log_probs: Tensor, lens: Tensor, blank: int = 0) -> list[list[int]]:
    """log_probs (B, T, V), lens (B,) -> B token-id lists (best path, collapsed)."""
    if log_probs.dim() != 3 or lens.shape != log_probs.shape[:1]:
        raise ValueError(
            f"expected log_probs (B, T, V) and lens (B,), got {tuple(log_probs.shape)} "
            f"and {tuple(lens.shape)}"
        )
    best = log_probs.argmax(dim=-1)  # (B, T)
    new = torch.ones_like(best, dtype=torch.bool)
    new[:, 1:] = best[:, 1:] != best[:, :-1]
    keep = new & (best != blank)
    keep &= torch.arange(best.size(1), device=best.device) < lens[:, None].to(best.device)
    best, keep = best.cpu(), keep.cpu()
    return [row[mask].tolist() for row, mask in zip(best, keep, strict=True)]

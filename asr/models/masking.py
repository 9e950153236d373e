"""Span masking for self-supervised pre-training (wav2vec 2.0, w2v-BERT, BEST-RQ).

Each utterance gets `floor(mask_prob * length + u)` span starts (u uniform in [0, 1): the
expected count is exactly `mask_prob * length`), at least `min_spans`, drawn without
replacement among the frames where a whole span fits; each span masks `span_length`
frames. Spans may overlap, so the masked fraction is about `1 - (1 - mask_prob) **
span_length` (0.49 for wav2vec 2.0's 0.065 and 10), and every masked run is at least one
span long. Padding (frames at or beyond an utterance's length) is never masked; an
utterance shorter than a span gets one span of its whole length only if `min_spans` asks.
"""

from __future__ import annotations

import torch
from torch import Tensor


def span_mask(
    lengths: Tensor,
    max_len: int,
    *,
    mask_prob: float,
    span_length: int,
    min_spans: int = 1,
    generator: torch.Generator | None = None,
) -> Tensor:
    """lengths (B,) -> mask (B, max_len), True where a frame is masked."""
    if not 0.0 <= mask_prob <= 1.0:
        raise ValueError(f"mask_prob must be in [0, 1], got {mask_prob}")
    if span_length < 1 or min_spans < 0:
        raise ValueError(
            f"span_length must be >= 1 and min_spans >= 0, got {span_length}, {min_spans}"
        )
    if lengths.numel() and int(lengths.max()) > max_len:
        raise ValueError(f"lengths exceed max_len={max_len}: max {int(lengths.max())}")
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool)
    offsets = torch.arange(span_length)
    for row, length in enumerate(lengths.tolist()):
        if length == 0:
            continue
        span = min(span_length, length)
        positions = length - span + 1  # where a whole span fits
        draw = torch.rand((), generator=generator).item()
        count = int(mask_prob * length + draw)
        count = min(max(count, min_spans), positions)
        starts = torch.randperm(positions, generator=generator)[:count]
        covered = (starts[:, None] + offsets[None, :span]).flatten()
        mask[row, covered] = True
    return mask.to(lengths.device)


def mask_statistics(mask: Tensor, lengths: Tensor) -> dict[str, float]:
    """The masked fraction of the valid frames and the mean length of the masked runs."""
    masked = int(mask.sum())
    starts = mask.clone()
    starts[:, 1:] &= ~mask[:, :-1]  # a run starts where the frame before is not masked
    runs = int(starts.sum())
    total = int(lengths.sum())
    return {
        "masked_fraction": masked / total if total else 0.0,
        "mean_run_length": masked / runs if runs else 0.0,
    }

"""Feature normalization, each kind written once, in torch.

- `per_utterance`: each utterance's mean and standard deviation. The data pipeline applies
  it to a full-context model's features (`data.features.normalize: per_utterance`), and an
  ONNX export of such a model carries it in its graph.
- `with_global_stats`: the training set's mean and standard deviation, held inside a
  streaming encoder (`model.encoder.feature_stats`): what a stream can compute.
- `causal_running_mean`: then minus each utterance's mean of the frames up to each one
  (`model.encoder.running_mean_frames`); a stream carries the running sum and count.

Legend: B batch, T frames, F filterbank bins. A top-level module, as `asr.frames`, so that
the data pipeline, the models and the exports share it without importing each other.
"""

from __future__ import annotations

import torch
from torch import Tensor

STD_EPSILON = 1e-5  # per utterance: (x - mean) / (std + STD_EPSILON)


def per_utterance(x: Tensor, x_lens: Tensor | None = None) -> Tensor:
    """x (B, T, F) or (T, F) -> each utterance's valid frames (the first `x_lens`, all
    without lengths) minus their mean, over their standard deviation plus `STD_EPSILON`."""
    if x.dim() == 2:
        return per_utterance(x[None], x_lens)[0]
    if x_lens is None:
        x_lens = torch.full((x.size(0),), x.size(1), device=x.device)
    valid = _valid(x_lens, x.size(1))[:, :, None].to(x.dtype)  # (B, T, 1)
    count = x_lens.to(x.dtype).clamp(min=1)[:, None, None]
    mean = (x * valid).sum(dim=1, keepdim=True) / count
    var = ((x - mean).square() * valid).sum(dim=1, keepdim=True) / count
    return (x - mean) / (var.sqrt() + STD_EPSILON)


def with_global_stats(x: Tensor, mean: Tensor, scale: Tensor) -> Tensor:
    """x (..., F) -> (x - mean) * scale, with the training set's mean and 1 / std (F,)."""
    return (x - mean) * scale


def causal_running_mean(
    x: Tensor,
    prior_frames: int,
    x_lens: Tensor | None = None,
    running_sum: Tensor | None = None,
    running_count: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """x (B, T, F) -> each frame minus the mean of its utterance's frames up to it, as if
    `prior_frames` zero frames (the global mean, after `with_global_stats`) came first;
    `running_sum` (B, F) and `running_count` (B,) are what earlier chunks of the
    utterances held (None: the start). Returns the normalized x and the sum and count
    after the valid frames (the first `x_lens`; all without lengths)."""
    b, t, f = x.shape
    if running_sum is None:
        running_sum = x.new_zeros(b, f)
    if running_count is None:
        running_count = torch.zeros(b, dtype=torch.long, device=x.device)
    sums = running_sum[:, None].to(x.dtype) + x.cumsum(dim=1)
    counts = running_count[:, None] + torch.arange(1, t + 1, device=x.device) + prior_frames
    normalized = x - sums / counts[:, :, None].to(x.dtype)
    lens = running_count.new_full((b,), t) if x_lens is None else x_lens
    valid = _valid(lens, t)[:, :, None]
    return normalized, running_sum + x.masked_fill(~valid, 0.0).sum(dim=1), running_count + lens


def _valid(lens: Tensor, length: int) -> Tensor:
    """(B, length) True on each row's first `lens` frames."""
    return torch.arange(length, device=lens.device) < lens[:, None]

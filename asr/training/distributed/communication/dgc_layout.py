"""Where each parameter lies in a DDP gradient bucket's flat buffer, and which entries the
DGC hook sends whole or by top-k (`BucketLayout`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class BucketLayout:
    """Where a bucket's parameters lie in its flat buffer: `params` (their storage
    addresses, in buffer order) at `offsets`; `dense` the entries sent whole every step
    (1-D parameters with `dense_vectors`), `segments` the (offset, size) of each tensor
    whose top-k is sent."""

    params: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    dense: Tensor
    segments: tuple[tuple[int, int], ...]


def bucket_layout(params: list[Tensor], dense_vectors: bool, device: torch.device) -> BucketLayout:
    """The layout of a bucket holding `params` in buffer order."""
    dense, segments, offsets, offset = [], [], [], 0
    for param in params:
        size = param.numel()
        offsets.append(offset)
        if dense_vectors and param.dim() <= 1:
            dense.append(torch.arange(offset, offset + size, device=device))
        else:
            segments.append((offset, size))
        offset += size
    indices = torch.cat(dense) if dense else torch.zeros(0, dtype=torch.long, device=device)
    return BucketLayout(
        params=tuple(param.data_ptr() for param in params),
        offsets=tuple(offsets),
        sizes=tuple(param.numel() for param in params),
        dense=indices,
        segments=tuple(segments),
    )

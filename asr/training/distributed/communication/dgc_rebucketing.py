"""The DGC hook's state moved between DDP buckets: when DDP rebuilds its buckets (after the
first step, in gradient-ready order) or a checkpoint restores it, the state waits per
parameter (the stash) for the bucket that will hold it; nothing waiting in a residual is
lost."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from asr.training.distributed.communication.dgc_layout import BucketLayout, bucket_layout
from asr.training.distributed.communication.dgc_state import (
    STATE_KINDS,
    DGCState,
    working_precision,
)


def per_parameter(state: DGCState) -> tuple[dict[int, dict[str, Tensor]], dict[int, int]]:
    """This rank's state per parameter (keyed by storage address): each bucket's tensors cut
    at its parameters' offsets (views), with what still waits in the stash; and Adam's step
    count per parameter."""
    tensors = {ptr: dict(kinds) for ptr, kinds in state.stash.items()}
    steps = dict(state.stash_steps)
    for index, layout in state.layouts.items():
        places = list(zip(layout.params, layout.offsets, layout.sizes, strict=True))
        for kind in STATE_KINDS:
            flat = getattr(state, kind).get(index)
            if flat is None or flat.numel() != sum(layout.sizes):
                continue
            for ptr, offset, size in places:
                tensors.setdefault(ptr, {})[kind] = flat[offset : offset + size]
        if index in state.bucket_steps:
            steps.update(dict.fromkeys(layout.params, state.bucket_steps[index]))
    return tensors, steps


def clear_buckets(state: DGCState) -> None:
    """Forget every bucket's layout and state (what is to be kept is in the stash)."""
    for kind in STATE_KINDS:
        getattr(state, kind).clear()
    state.bucket_steps.clear()
    state.layouts.clear()


def stash_all(state: DGCState) -> None:
    """Move every bucket's state to the per-parameter stash (DDP rebuilt its buckets)."""
    state.stash, state.stash_steps = per_parameter(state)
    clear_buckets(state)


def unstash(state: DGCState, index: int, layout: BucketLayout, like: Tensor) -> None:
    """Give bucket `index` (laid out as `layout`) the stashed state of its parameters;
    zeros where a parameter has none."""
    dtype = working_precision(like[:0]).dtype
    for kind in STATE_KINDS:
        places = [
            (ptr, offset, size)
            for ptr, offset, size in zip(layout.params, layout.offsets, layout.sizes, strict=True)
            if kind in state.stash.get(ptr, {})
        ]
        if not places:
            continue
        flat = torch.zeros(sum(layout.sizes), dtype=dtype, device=like.device)
        for ptr, offset, size in places:
            flat[offset : offset + size] = state.stash[ptr].pop(kind).reshape(-1).to(flat)
        getattr(state, kind)[index] = flat
    steps = [state.stash_steps.pop(ptr) for ptr in layout.params if ptr in state.stash_steps]
    if steps:
        state.bucket_steps[index] = max(steps)
    for ptr in layout.params:
        if not state.stash.get(ptr, True):
            del state.stash[ptr]


def current_layout(state: DGCState, bucket: dist.GradBucket) -> BucketLayout:
    """The layout of `bucket`, cached. When DDP rebuilt its buckets (after the first step,
    in gradient-ready order), every bucket's state moves to the buckets that now hold its
    parameters, through the stash: nothing waiting in a residual is lost."""
    index, params = bucket.index(), bucket.parameters()
    known = state.layouts.get(index)
    if known is not None and known.params == tuple(p.data_ptr() for p in params):
        return known
    if known is not None:
        stash_all(state)
    layout = bucket_layout(params, state.config.dense_vectors, bucket.buffer().device)
    state.layouts[index] = layout
    unstash(state, index, layout, bucket.buffer())
    return layout

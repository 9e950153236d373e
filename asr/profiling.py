"""Counting the ops that launch work (`torch.profiler`): benchmarks and tests of how many
kernel launches a computation costs on a GPU, measured on any device."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

# aten ops that only make views or read metadata: they launch no kernel on a GPU.
VIEW_OPS = frozenset(
    {
        "aten::view",
        "aten::_unsafe_view",
        "aten::as_strided",
        "aten::select",
        "aten::slice",
        "aten::narrow",
        "aten::expand",
        "aten::expand_as",
        "aten::permute",
        "aten::transpose",
        "aten::t",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::reshape",
        "aten::flatten",
        "aten::unflatten",
        "aten::alias",
        "aten::detach",
        "aten::detach_",
        "aten::lift_fresh",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::split",
        "aten::split_with_sizes",
        "aten::chunk",
        "aten::unbind",
        "aten::result_type",
        "aten::size",
        "aten::stride",
        "aten::is_nonzero",
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::to",
        "aten::_to_copy",
        "aten::movedim",
        "aten::unfold",
    }
)


def launching_ops(events: Iterable) -> int:
    """Calls of aten ops that do work, from `profiler.key_averages()`. Nested calls count
    too (an op built of others launches each of them on a GPU); `aten::to`/`_to_copy`
    are not counted themselves, the `copy_` they make is."""
    return sum(e.count for e in events if e.key.startswith("aten::") and e.key not in VIEW_OPS)


def count_launching_ops(fn: Callable[[], object]) -> int:
    """Launching aten ops of one call of `fn`, on the CPU profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return launching_ops(prof.key_averages())

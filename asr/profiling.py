"""What a computation costs besides its time, for benchmarks and tests: the ops that
launch work (`torch.profiler`: how many kernel launches it costs on a GPU, measured on any
device) and its peak memory above a baseline (`PeakMemory`)."""

from __future__ import annotations

import os
import threading
import time
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


class PeakMemory:
    """Peak memory above a baseline while the block runs: on CUDA the allocator's peak
    (`torch.cuda.max_memory_allocated`, reset on entry; the device synchronized at both
    ends) above what was allocated on entry; on CPU the resident set size polled every
    millisecond from /proc/self/statm (what the allocator keeps counts; pages it reuses do
    not: a rough figure). `extra_bytes` after the block."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device).type
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.base = self.peak = 0
        self._stop = threading.Event()

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def __enter__(self) -> PeakMemory:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        self.base = self.peak = self.rss()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
            return
        self._stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.rss())

    @property
    def extra_bytes(self) -> int:
        return self.peak - self.base

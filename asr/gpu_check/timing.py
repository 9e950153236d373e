"""Wall-clock timing of work on a device: CUDA runs asynchronously, so a clock read must
first wait for what was queued."""

from __future__ import annotations

import time

import torch


def synchronize(device: str) -> None:
    """Wait for the work queued on `device` (a no-op on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def clock(device: str) -> float:
    """`time.perf_counter()` once the work queued on `device` has finished."""
    synchronize(device)
    return time.perf_counter()

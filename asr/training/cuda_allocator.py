"""The CUDA caching allocator's settings for training and batch-size probing.

PyTorch's default allocator keeps fixed-size segments: a long run whose batches change
shape leaves them fragmented, and memory that is reserved but free in pieces too small
for the next tensor raises out-of-memory below the budget the batch sizes were found
for (the GPU check saw 0.8 GB of such gaps at a 20 GiB cap on an H200). Expandable
segments grow one mapping instead and leave almost no gaps. The setting is read when
CUDA's allocator starts, so it is made before anything touches CUDA, and never over a
`PYTORCH_CUDA_ALLOC_CONF` or `PYTORCH_ALLOC_CONF` the user set.
"""

from __future__ import annotations

import os

ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
EXPANDABLE = "expandable_segments:True"


def use_expandable_segments(environ: dict[str, str] | None = None) -> str:
    """Ask for expandable segments unless an allocator setting is already given; returns
    the setting in force. Call it before the first CUDA allocation (child processes
    inherit it)."""
    env = os.environ if environ is None else environ
    for name in ALLOC_CONF_VARS:
        if env.get(name):
            return env[name]
    env["PYTORCH_ALLOC_CONF"] = EXPANDABLE  # torch >= 2.9 deprecates the CUDA_ name
    return EXPANDABLE


def expandable_segments_active() -> bool | None:
    """Whether the CUDA allocator's segments are expandable (None without CUDA or when
    this torch cannot say): one small allocation, then its segment's flag."""
    import torch

    if not torch.cuda.is_available():
        return None
    probe = torch.empty(1, device="cuda")
    try:
        segments = torch.cuda.memory._snapshot()["segments"]  # private: no public query
    except (AttributeError, KeyError, RuntimeError):
        return None
    finally:
        del probe
    flags = [s["is_expandable"] for s in segments if "is_expandable" in s]
    return any(flags) if flags else None

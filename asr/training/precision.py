"""`trainer.precision: auto`: bf16 autocast where the device computes bf16 natively.

bf16 mixed precision runs matrix products and convolutions in bfloat16 and keeps the
weights, optimizer state and losses in float32. It pays only where the hardware has bf16
arithmetic: recent GPUs, and CPUs with AVX512-BF16 or AMX; elsewhere bf16 is emulated
and slower than float32, so "auto" falls back to "32-true".
"""

from __future__ import annotations

import os

import torch

# oneDNN, which runs PyTorch's bf16 matrix products and all convolutions on CPUs, compiles a
# kernel for every new tensor shape and keeps the last 1,024 in a cache. Variable-length
# batches need several thousand (a few dozen ops x the batch shapes of an epoch): with the
# default, kernels are compiled again at almost every step. 4,096 entries hold an epoch's
# shapes, for some memory per cached kernel.
ONEDNN_CACHE_ENTRIES = 4096

AUTO = "auto"
BF16_MIXED = "bf16-mixed"
FP32 = "32-true"


def native_bf16(device_type: str) -> bool:
    """Whether `device_type` ("cpu" or "cuda") has bf16 arithmetic in hardware."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return False


def device_type(accelerator: str) -> str:
    """The torch device type a Lightning `trainer.accelerator` value trains on."""
    if accelerator in ("gpu", "cuda"):
        return "cuda"
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return accelerator


def resolve_precision(precision: str | int, accelerator: str) -> str:
    """`precision` as Lightning takes it: "auto" becomes "bf16-mixed" on a device with
    native bf16 and "32-true" elsewhere; any other value is returned as it is."""
    if precision != AUTO:
        return str(precision)
    return BF16_MIXED if native_bf16(device_type(accelerator)) else FP32


def enlarge_onednn_cache(entries: int = ONEDNN_CACHE_ENTRIES) -> None:
    """Let oneDNN keep `entries` compiled CPU kernels unless ONEDNN_PRIMITIVE_CACHE_CAPACITY
    is set. oneDNN reads it when it first creates a kernel: call this before any compute."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(entries))

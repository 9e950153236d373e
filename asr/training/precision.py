"""`trainer.precision: auto`: bf16 autocast on GPUs that compute bf16, float32 on CPUs.

bf16 mixed precision runs matrix products and convolutions in bfloat16 and keeps the
weights, optimizer state and losses in float32. It pays only where the hardware has bf16
arithmetic: recent GPUs, and CPUs with AVX512-BF16 or AMX (elsewhere it is emulated, slower
than float32, and oneDNN's LSTM refuses it). On CPUs "auto" is "32-true" even where bf16 is
native: a CPU run's precision, and with it its result, would otherwise depend on which CPU
it ran on; ask for "bf16-mixed" to trade that for speed (the figures: recipes/demo/RESULTS.md,
"`make demo` on every machine").
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


# oneDNN's instruction sets below AVX512_CORE_BF16 (`ONEDNN_MAX_CPU_ISA`) and ATen's without
# AVX-512 (`ATEN_CPU_CAPABILITY`): held to them, a CPU computes bf16 as one without it does.
ONEDNN_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE"}
ONEDNN_WITHOUT_BF16 |= {"AVX512_CORE_VNNI"}
ATEN_WITHOUT_AVX512 = {"default", "avx2"}


def native_bf16(device_type: str) -> bool:
    """Whether `device_type` ("cpu" or "cuda") has bf16 arithmetic in hardware (on a CPU:
    and PyTorch is not held below it by `ONEDNN_MAX_CPU_ISA` or `ATEN_CPU_CAPABILITY`)."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
        aten = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
        if onednn in ONEDNN_WITHOUT_BF16 or aten in ATEN_WITHOUT_AVX512:
            return False
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
    """`precision` as Lightning takes it: "auto" becomes "bf16-mixed" on a GPU with native
    bf16 and "32-true" elsewhere, CPUs included (see the module's docstring); any other
    value is returned as it is."""
    if precision != AUTO:
        return str(precision)
    device = device_type(accelerator)
    return BF16_MIXED if device == "cuda" and native_bf16(device) else FP32


def emulated_bf16(precision: str, accelerator: str) -> bool:
    """Whether `precision` (resolved) asks for bf16 on a CPU that only emulates it."""
    device = device_type(accelerator)
    return precision.startswith("bf16") and device == "cpu" and not native_bf16(device)


def enlarge_onednn_cache(entries: int = ONEDNN_CACHE_ENTRIES) -> None:
    """Let oneDNN keep `entries` compiled CPU kernels unless ONEDNN_PRIMITIVE_CACHE_CAPACITY
    is set. oneDNN reads it when it first creates a kernel: call this before any compute."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(entries))

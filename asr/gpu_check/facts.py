"""Facts about the stack and the device a run measured on: package versions, the
checkout's commit, the GPU (or the CPU in a rehearsal). The `env` section reports them;
the bench's records carry them."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from asr.training.cuda_allocator import ALLOC_CONF_VARS, expandable_segments_active

PACKAGES = ("torch", "torchaudio", "triton", "lightning", "lhotse", "hydra-core", "numpy")


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages the check depends on (None: not installed)."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def project_commit() -> str | None:
    """The checkout's commit (with `+dirty` for local changes), None outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def device_facts(device: str) -> dict[str, object]:
    """Name, memory, compute capability, bf16, driver and NCCL of the CUDA device; the
    CPU's name and core count in a rehearsal."""
    if device != "cuda":
        return {"device": platform.processor() or platform.machine(), "cpu_cores": _cores()}
    props = torch.cuda.get_device_properties(0)
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    return {
        "device": props.name,
        "device_count": torch.cuda.device_count(),
        "memory_bytes": props.total_memory,
        "compute_capability": f"{props.major}.{props.minor}",
        "bf16": torch.cuda.is_bf16_supported(),
        "cuda_driver": _driver_version(),
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "allocator_settings": {name: os.environ.get(name) for name in ALLOC_CONF_VARS},
        "expandable_segments": expandable_segments_active(),
    }


def _cores() -> int | None:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True, timeout=20,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None

"""What every data-parallel run needs, decided once at start-up (`setup_distributed` calls
these): how many processes a node runs, one torch thread per process on CPU (where N
processes on N cores only contend), `find_unused_parameters` only when the objective leaves
some model parts without a gradient in some steps (CTC-only warm-up, an unweighted CTC head:
DDP then walks the autograd graph every step; otherwise it would stop at step 2 waiting for
gradients that never come), a timeout so that a collective waiting on a process which died
or hung fails instead of hanging the job forever, and recognising that failure.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch

from asr.training.distributed.config import DistributedConfig

log = logging.getLogger(__name__)

# What gloo's errors say when a peer process is gone (its socket closed) or stuck (the
# collective's timeout expired); NCCL raises torch.distributed.DistError subclasses.
PEER_FAILURE_SIGNS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "timed out",
    "pair closure",  # gloo: "Application timeout caused pair closure" (a hung peer)
    "/gloo/",
)


def processes_per_node(accelerator: str, devices: Any) -> int:
    """How many processes Lightning starts on each node for `accelerator` and `devices`
    (`auto`/-1: every GPU, or one CPU process)."""
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return len(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    if devices in ("auto", -1, "-1"):
        use_gpu = accelerator in ("gpu", "cuda") or (
            accelerator == "auto" and torch.cuda.is_available()
        )
        return torch.cuda.device_count() if use_gpu else 1
    return int(devices)


def uses_cpu(accelerator: str) -> bool:
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def find_unused_parameters(
    config: DistributedConfig, parts_without_gradient: Sequence[str]
) -> bool:
    """`distributed.find_unused_parameters` resolved: under `auto`, whether the objective
    leaves some parts without a gradient in some steps; `false` while it does is an error."""
    find_unused = config.find_unused_parameters
    if find_unused == "auto":
        find_unused = bool(parts_without_gradient)
    elif not find_unused and parts_without_gradient:
        raise ValueError(
            f"distributed.find_unused_parameters=false, but the loss leaves "
            f"{', '.join(parts_without_gradient)} without a gradient in some steps (CTC-only "
            "warm-up: model.loss.transducer_start_step; an unweighted CTC head: "
            "model.loss.ctc_weight=0): DDP would stop at the second step. Use auto or true."
        )
    return bool(find_unused)


def set_cpu_threads(config: DistributedConfig, world_size: int) -> int | None:
    """Set torch's intra-op threads for a multi-process CPU run (before Lightning starts the
    other processes, which inherit `OMP_NUM_THREADS`). Returns the number set, or None
    (a single-process run with no `cpu_threads` keeps torch's default)."""
    if world_size <= 1 and config.cpu_threads is None:
        return None
    threads = config.cpu_threads or int(os.environ.get("OMP_NUM_THREADS", 1))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return threads


def is_peer_failure(err: BaseException) -> bool:
    """Whether `err` looks like a collective that lost another process (died or hung)."""
    if isinstance(err, torch.distributed.DistError):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(sign in text for sign in PEER_FAILURE_SIGNS)

"""Data-parallel training through Lightning's `DDPStrategy` (NCCL on GPUs, gloo on CPUs).

What this module adds to Lightning's defaults, each decided once at start-up:

- `find_unused_parameters` only when the objective leaves some model parts without a
  gradient in some steps (CTC-only warm-up, an unweighted CTC head): DDP then walks the
  autograd graph every step to find them; otherwise it would stop at step 2 waiting for
  gradients that never come. Turning it off while it is needed is an error at start-up.
- a timeout: a collective that waits on a process which died or hung fails after
  `timeout` seconds instead of hanging the job forever.
- one torch thread per process on CPU, where N processes on N cores only contend.
- a communication hook (`distributed.compression`: Deep Gradient Compression, see
  `asr.training.distributed.dgc`) registered on every device: Lightning's `DDPStrategy`
  registers hooks only on CUDA, so `HookedDDPStrategy` does it for CPU/gloo too; with
  DGC every rank also writes its hook state beside `last.ckpt` and a resumed run reads it
  back (`asr.training.distributed.dgc_resume`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, Strategy

from asr.config_keys import dataclass_from_keys
from asr.training.distributed.adascale import AdaScaleConfig, AdaScaleState, adascale_hook
from asr.training.distributed.adpsgd import DecentralizedConfig, DecentralizedStrategy
from asr.training.distributed.dgc import dgc_hook
from asr.training.distributed.dgc_resume import (
    carries_rank_state,
    load_rank_state,
    rank_state_path,
    save_rank_state,
)
from asr.training.distributed.dgc_state import AdamMoments, DGCConfig, DGCState

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


@dataclass(frozen=True)
class DistributedConfig:
    """Keys of the `distributed` config.

    - `timeout`: seconds a collective waits for the other processes before the run stops
      with an error (a process died or hung). Also bounds the start-up rendezvous.
    - `find_unused_parameters`: `auto` (only when the objective needs it), `true`, `false`.
    - `cpu_threads`: torch threads per process in multi-process CPU runs; null: the
      `OMP_NUM_THREADS` environment variable if set, else 1.
    - `compression`: null (dense all-reduce) or a gradient compression (`kind: dgc`,
      `DGCConfig`).
    - `adascale`: null, or AdaScale's learning-rate gain for momentum SGD
      (`AdaScaleConfig`).
    - `gossip`: the decentralized averaging of `trainer.strategy=adpsgd`
      (`DecentralizedConfig`).
    """

    timeout: float = 600.0
    find_unused_parameters: bool | str = "auto"
    cpu_threads: int | None = None
    compression: DGCConfig | None = None
    adascale: AdaScaleConfig | None = None
    gossip: DecentralizedConfig = DecentralizedConfig()

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | None) -> DistributedConfig:
        out = dataclass_from_keys(cls, cfg, "distributed")
        if out.find_unused_parameters not in ("auto", True, False):
            raise ValueError(
                "distributed.find_unused_parameters must be auto, true or false, got "
                f"{out.find_unused_parameters!r}"
            )
        if out.timeout <= 0:
            raise ValueError(f"distributed.timeout must be positive seconds, got {out.timeout}")
        if out.cpu_threads is not None and out.cpu_threads < 1:
            raise ValueError(f"distributed.cpu_threads must be >= 1 or null, got {out.cpu_threads}")
        return out


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


class HookedDDPStrategy(DDPStrategy):
    """`DDPStrategy` that registers its communication hook on any device (Lightning's
    registers it only on CUDA, so a CPU/gloo run would silently train dense)."""

    @property
    def compression(self) -> DGCState | None:
        """The DGC hook's state, when the gradients are compressed."""
        state = self._ddp_comm_state
        return state if isinstance(state, DGCState) else None

    @property
    def adascale(self) -> AdaScaleState | None:
        """AdaScale's state, when the learning rate follows its gain."""
        state = self._ddp_comm_state
        return state if isinstance(state, AdaScaleState) else None

    def _register_ddp_hooks(self) -> None:
        if self._ddp_comm_hook is None:
            return
        if self.compression is not None:
            self.compression.total_entries = sum(
                p.numel() for p in self.model.parameters() if p.requires_grad
            )
        self.model.register_comm_hook(self._ddp_comm_state, self._ddp_comm_hook)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any = None
    ) -> None:
        """Rank 0 writes the checkpoint; with DGC, beside the resume checkpoint every rank
        also writes its hook state (called on every rank)."""
        super().save_checkpoint(checkpoint, filepath, storage_options)
        state = self.compression
        if state is not None and carries_rank_state(filepath):
            assert self.lightning_module is not None
            names = {p.data_ptr(): n for n, p in self.lightning_module.named_parameters()}
            step = int(checkpoint.get("global_step", 0))
            save_rank_state(state, names, filepath, step, self.global_rank, self.world_size)

    def remove_checkpoint(self, filepath: str | Path) -> None:
        super().remove_checkpoint(filepath)
        rank_state_path(filepath, self.global_rank).unlink(missing_ok=True)

    def on_train_start(self) -> None:
        """With DGC, a resumed run reads this rank's hook state back (without it, AdamW's
        dense steps begin again from here)."""
        super().on_train_start()
        state = self.compression
        module = self.lightning_module
        if state is None or module is None or not module.trainer.ckpt_path:
            return
        addresses = {n: p.data_ptr() for n, p in module.named_parameters()}
        trainer = module.trainer
        restored = load_rank_state(
            state,
            addresses,
            trainer.ckpt_path,
            trainer.global_step,
            self.global_rank,
            self.world_size,
        )
        if not restored:
            state.dense_from = trainer.global_step


def build_strategy(
    strategy: str | Strategy,
    *,
    world_size: int,
    config: DistributedConfig,
    parts_without_gradient: Sequence[str],
    loss_kind: str | None = None,
    optimizer_momentum: float = 0.0,
    adam_moments: AdamMoments | None = None,
) -> str | Strategy:
    """The `strategy` argument for `lightning.Trainer`.

    `adpsgd` becomes the decentralized `DecentralizedStrategy` (AD-PSGD, H-ADPSGD).
    `ddp`, and `auto` with more than one process, become a configured `DDPStrategy`;
    `parts_without_gradient` (from the objective) decides `find_unused_parameters`
    under `auto`. With `config.compression` the DGC hook is registered; it takes over
    the optimizer's moments (`optimizer_momentum`, SGD's, or `adam_moments`, AdamW's,
    whose second moment it freezes after dense steps), and the optimizer then runs as
    plain SGD. Anything else goes to Lightning as given, except FSDP with the sample-wise
    transducer loss, which cannot work (see the README).
    """
    if not isinstance(strategy, str):
        return strategy
    if strategy.startswith("fsdp") and loss_kind == "samplewise":
        raise ValueError(
            f"trainer.strategy={strategy} cannot train with model.loss.kind=samplewise: the "
            "sample-wise loss runs the joiner's weights outside its forward, where FSDP holds "
            "only a shard of them. Use trainer.strategy=ddp (the presets fit one GPU), or "
            "model.loss.kind=batched."
        )
    hooked = [k for k in ("compression", "adascale") if getattr(config, k) is not None]
    if len(hooked) == 2:
        raise ValueError("distributed.compression and distributed.adascale exclude each other")
    if strategy == "adpsgd":
        if hooked:
            raise ValueError(
                f"distributed.{hooked[0]} works on DDP's gradient all-reduce, which "
                "trainer.strategy=adpsgd does not run"
            )
        if world_size < 2:
            raise ValueError("trainer.strategy=adpsgd needs at least 2 processes (trainer.devices)")
        if optimizer_momentum > 0 and not config.gossip.synchronous:
            log.warning(
                "trainer.strategy=adpsgd with momentum SGD did not train on the demo: the "
                "asynchronous exchange's one step of staleness acts as added momentum "
                "(recipes/demo/RESULTS.md). Use optim=adamw_cosine with about sqrt(learners) "
                "times DDP's learning rate"
            )
        return DecentralizedStrategy(config.gossip, timeout=timedelta(seconds=config.timeout))
    if strategy != "ddp" and not (strategy == "auto" and world_size > 1):
        if hooked:
            raise ValueError(
                f"distributed.{hooked[0]} needs trainer.strategy=ddp, not {strategy!r}"
            )
        return strategy
    if config.adascale is not None and world_size < 2:
        raise ValueError("distributed.adascale needs at least 2 processes (trainer.devices)")
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
    if find_unused:
        log.info(
            "DDP looks for unused parameters every step (%s)", ", ".join(parts_without_gradient)
        )
    hook: dict[str, Any] = {}
    if config.compression is not None:
        state = DGCState(config.compression, momentum=optimizer_momentum, adam=adam_moments)
        hook = {"ddp_comm_state": state, "ddp_comm_hook": dgc_hook}
    elif config.adascale is not None:
        hook = {"ddp_comm_state": AdaScaleState(config.adascale), "ddp_comm_hook": adascale_hook}
    return HookedDDPStrategy(
        find_unused_parameters=bool(find_unused),
        timeout=timedelta(seconds=config.timeout),
        **hook,
    )


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

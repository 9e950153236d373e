"""The keys of the `distributed` config section (`DistributedConfig`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asr.config_keys import dataclass_from_keys
from asr.training.distributed.communication.adascale import AdaScaleConfig
from asr.training.distributed.communication.adpsgd import DecentralizedConfig
from asr.training.distributed.communication.dgc.state import DGCConfig


@dataclass(frozen=True)
class DistributedConfig:
    """Keys of the `distributed` config.

    - `timeout`: seconds a collective waits for the other processes before the run stops
      with an error (a process died or hung).
    - `startup_timeout`: seconds the processes wait for each other to start (the
      rendezvous); never less than `timeout`. A short `timeout` that notices a hang quickly
      must not stop a run whose processes start a few seconds apart.
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
    startup_timeout: float = 600.0
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
        if out.startup_timeout <= 0:
            raise ValueError(
                f"distributed.startup_timeout must be positive seconds, got {out.startup_timeout}"
            )
        if out.cpu_threads is not None and out.cpu_threads < 1:
            raise ValueError(f"distributed.cpu_threads must be >= 1 or null, got {out.cpu_threads}")
        return out

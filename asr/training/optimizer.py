"""The optimizer of every training run (`optim` config): AdamW with weight decay on
matrices only. Shared by the LightningModule and the batch-size probes, so a probe's
optimizer state is the one training will hold."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from asr.config_keys import dataclass_from_keys
from asr.training.schedules import SchedulerConfig


@dataclass(frozen=True)
class OptimConfig:
    """The keys of the Hydra group ``optim``: AdamW's peak `lr`, `betas`, `eps` and
    `weight_decay`, and the learning-rate `scheduler` (`SchedulerConfig`; null: constant)."""

    lr: float
    scheduler: SchedulerConfig | None = None
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    weight_decay: float = 0.0


def optim_config(cfg: Mapping[str, Any] | OptimConfig) -> OptimConfig:
    """The ``optim`` group read into `OptimConfig` (an unknown or missing key is named)."""
    return cfg if isinstance(cfg, OptimConfig) else dataclass_from_keys(OptimConfig, cfg, "optim")


def build_optimizer(
    model: torch.nn.Module, cfg: Mapping[str, Any] | OptimConfig, *, fused: bool = True
) -> torch.optim.AdamW:
    """AdamW over `model`'s trainable parameters from the `optim` keys. Weight decay
    applies to parameters with two or more dimensions; biases and norms are not decayed.
    `fused`: one kernel for all parameters instead of about ten ops per parameter; not
    under fp16 loss scaling, where Lightning must unscale the gradients before clipping."""
    config = optim_config(cfg)
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": float(config.weight_decay)},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=float(config.lr),
        betas=tuple(config.betas),
        eps=float(config.eps),
        fused=fused,
    )

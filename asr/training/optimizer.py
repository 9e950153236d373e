"""The optimizer of every training run (`optim` config): AdamW with weight decay on
matrices only. Shared by the LightningModule and the batch-size probes, so a probe's
optimizer state is the one training will hold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

OPTIM_KEYS = ("lr", "betas", "eps", "weight_decay", "scheduler")


def build_optimizer(
    model: torch.nn.Module, cfg: Mapping[str, Any], *, fused: bool = True
) -> torch.optim.AdamW:
    """AdamW over `model`'s trainable parameters from the `optim` keys (`scheduler` is
    read by `asr.training.schedules.build_scheduler`, not here). Weight decay applies to
    parameters with two or more dimensions; biases and norms are not decayed. `fused`: one
    kernel for all parameters instead of about ten ops per parameter; not under fp16 loss
    scaling, where Lightning must unscale the gradients before clipping."""
    unknown = sorted(set(cfg) - set(OPTIM_KEYS))
    if unknown:
        raise KeyError(f"unknown optim key(s) {unknown}; valid: {', '.join(OPTIM_KEYS)}")
    if "lr" not in cfg:
        raise KeyError("optim.lr is missing")
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": float(cfg.get("weight_decay", 0.0))},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=float(cfg["lr"]),
        betas=tuple(cfg.get("betas", (0.9, 0.98))),
        eps=float(cfg.get("eps", 1e-8)),
        fused=fused,
    )

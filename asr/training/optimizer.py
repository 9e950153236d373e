"""The optimizer of every training run (`optim` config): AdamW (the default) or momentum
SGD, with weight decay on matrices only. Shared by the LightningModule and the batch-size
probes, so a probe's optimizer state is the one training will hold."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from asr.config_keys import ConfigError, check_choice, dataclass_from_keys
from asr.training.schedules import SchedulerConfig

OPTIMIZERS = ("adamw", "sgd")
ADAMW_ONLY = ("betas", "eps")
SGD_ONLY = ("momentum", "nesterov")


@dataclass(frozen=True)
class OptimConfig:
    """The keys of the Hydra group ``optim``.

    - `lr`: the peak learning rate.
    - `kind`: `adamw` or `sgd` (momentum SGD; with DGC the hook applies the momentum).
    - `scheduler`: the learning-rate schedule (`SchedulerConfig`; null: constant).
    - `betas`: AdamW's moment decay rates.
    - `eps`: AdamW's epsilon.
    - `momentum`: SGD's (null: 0.9).
    - `nesterov`: SGD's Nesterov momentum (null: false).
    - `weight_decay`: decoupled weight decay of matrices (biases and norms are not decayed).
    """

    lr: float
    kind: str = "adamw"
    scheduler: SchedulerConfig | None = None
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    momentum: float | None = None
    nesterov: bool | None = None
    weight_decay: float = 1e-3

    def __post_init__(self) -> None:
        check_choice("optim.kind", self.kind, OPTIMIZERS)
        other = SGD_ONLY if self.kind == "adamw" else ADAMW_ONLY
        defaults = OptimConfig.__dataclass_fields__
        tuned = [key for key in other if getattr(self, key) != defaults[key].default]
        if tuned:
            raise ConfigError(f"optim {tuned} do not apply to optim.kind={self.kind}")
        if not 0.0 <= self.sgd_momentum < 1.0:
            raise ConfigError(f"optim.momentum must be in [0, 1), got {self.momentum}")

    @property
    def sgd_momentum(self) -> float:
        """SGD's momentum (0 for AdamW): what a communication hook may take over."""
        if self.kind != "sgd":
            return 0.0
        return 0.9 if self.momentum is None else float(self.momentum)


def optim_config(cfg: Mapping[str, Any] | OptimConfig) -> OptimConfig:
    """The ``optim`` group read into `OptimConfig` (an unknown or missing key is named)."""
    return cfg if isinstance(cfg, OptimConfig) else dataclass_from_keys(OptimConfig, cfg, "optim")


def build_optimizer(
    model: torch.nn.Module,
    cfg: Mapping[str, Any] | OptimConfig,
    *,
    fused: bool = True,
    moments_in_hook: bool = False,
    own_groups: torch.nn.Module | None = None,
    own_lr_scale: float = 1.0,
) -> torch.optim.Optimizer:
    """AdamW or SGD over `model`'s trainable parameters from the `optim` keys. Weight
    decay applies to parameters with two or more dimensions; biases and norms are not
    decayed. `fused`: one kernel for all parameters instead of about ten ops per
    parameter; not under fp16 loss scaling, where Lightning must unscale the gradients
    before clipping. `moments_in_hook`: plain SGD (no momentum) with the configured rate
    and weight decay, because a communication hook applies the optimizer's moments (DGC:
    SGD's momentum correction, or AdamW's directions); for AdamW that SGD's weight decay
    is AdamW's decoupled one, since the gradient it receives is already Adam's direction.
    `own_groups`: a part of `model` (the encoder, to hold it still or train it slower while
    fine-tuning) whose parameters get parameter groups of their own, before the others';
    `own_lr_scale` multiplies their learning rate (the schedule scales it as the others')."""
    config = optim_config(cfg)
    trained = [p for p in model.parameters() if p.requires_grad]
    held = {id(p) for p in own_groups.parameters()} if own_groups is not None else set()
    parts = [[p for p in trained if id(p) in held], [p for p in trained if id(p) not in held]]
    if own_lr_scale != 1.0 and own_groups is None:
        raise ValueError("own_lr_scale needs own_groups: the part whose learning rate it scales")
    if own_lr_scale < 0:
        raise ConfigError(f"encoder_lr_scale must be >= 0, got {own_lr_scale}")
    scaled = list(zip(parts, (own_lr_scale, 1.0), strict=True)) if held else [(parts[1], 1.0)]
    groups = []
    for params, scale in scaled:
        lr = float(config.lr) * scale
        groups += [
            {
                "params": [p for p in params if p.ndim >= 2],
                "weight_decay": float(config.weight_decay),
                "lr": lr,
            },
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0, "lr": lr},
        ]
    if config.kind == "sgd" or moments_in_hook:
        momentum = 0.0 if moments_in_hook else config.sgd_momentum
        # Not fused: torch's fused SGD fails on a momentum buffer of a parameter that had no
        # gradient in its first steps (the CTC-only warm-up); the foreach path handles it.
        return torch.optim.SGD(
            groups,
            lr=float(config.lr),
            momentum=momentum,
            nesterov=bool(config.nesterov) and momentum > 0,
        )
    return torch.optim.AdamW(
        groups,
        lr=float(config.lr),
        betas=tuple(config.betas),
        eps=float(config.eps),
        fused=fused,
    )

"""Learning-rate schedules as multipliers of the peak rate, one value per optimizer step."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from asr.config_keys import ConfigError, check_choice, dataclass_from_keys


def noam(step: float, *, warmup_steps: int) -> float:
    """Linear warm-up to 1 at `warmup_steps`, then decay as 1/sqrt(step) (Transformer/Noam)."""
    step = max(step, 1)
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def warmup_cosine(
    step: float,
    *,
    warmup_steps: int,
    total_steps: int,
    hold_steps: int = 0,
    min_ratio: float,
) -> float:
    """Linear warm-up to 1, hold at 1 for `hold_steps`, then cosine decay to `min_ratio`
    at `total_steps` (and `min_ratio` after)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_start = warmup_steps + hold_steps
    if step < decay_start:
        return 1.0
    span = max(total_steps - decay_start, 1)
    progress = min((step - decay_start) / span, 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


SCHEDULES = ("noam", "warmup_cosine")


@dataclass(frozen=True)
class SchedulerConfig:
    """The keys of ``optim.scheduler``.

    - `kind`: `noam` (linear warm-up, then 1/sqrt(step)) or `warmup_cosine` (linear
      warm-up, hold, cosine decay to `min_ratio` times the peak rate; needs the total
      number of steps, from `trainer.max_steps` or estimated from the data).
    - `warmup_steps`: optimizer steps of the linear warm-up to the peak rate.
    - `hold_fraction`: `warmup_cosine`: fraction of all steps held at the peak after the
      warm-up.
    - `min_ratio`: `warmup_cosine`: the final fraction of the peak rate.
    """

    kind: str
    warmup_steps: int
    hold_fraction: float = 0.0
    min_ratio: float = 0.02

    def __post_init__(self) -> None:
        check_choice("optim.scheduler.kind", self.kind, SCHEDULES)
        cosine_only = [
            key
            for key in ("hold_fraction", "min_ratio")
            if getattr(self, key) != SchedulerConfig.__dataclass_fields__[key].default
        ]
        if self.kind != "warmup_cosine" and cosine_only:
            raise ConfigError(
                f"optim.scheduler {cosine_only} apply only to kind=warmup_cosine, not {self.kind!r}"
            )


def schedule_function(
    cfg: Mapping[str, Any] | SchedulerConfig, total_steps: int | None
) -> Callable[[float], float]:
    """The multiplier of the peak rate at a (possibly fractional) step, from the
    `optim.scheduler` config (`SchedulerConfig`)."""
    if not isinstance(cfg, SchedulerConfig):
        cfg = dataclass_from_keys(SchedulerConfig, cfg, "optim.scheduler")
    warmup_steps = int(cfg.warmup_steps)
    if cfg.kind == "noam":
        return lambda step: noam(step, warmup_steps=warmup_steps)
    if not total_steps:
        raise ValueError("optim.scheduler.kind=warmup_cosine needs the total number of steps")
    hold = int(float(cfg.hold_fraction) * total_steps)
    min_ratio = float(cfg.min_ratio)
    return lambda step: warmup_cosine(
        step,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        hold_steps=hold,
        min_ratio=min_ratio,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    cfg: Mapping[str, Any] | SchedulerConfig,
    total_steps: int | None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step LambdaLR from the `optim.scheduler` config (`SchedulerConfig`)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_function(cfg, total_steps))

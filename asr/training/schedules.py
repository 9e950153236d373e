"""Learning-rate schedules as multipliers of the peak rate, one value per optimizer step."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch


def noam(step: int, *, warmup_steps: int) -> float:
    """Linear warm-up to 1 at `warmup_steps`, then decay as 1/sqrt(step) (Transformer/Noam)."""
    step = max(step, 1)
    return min(step / warmup_steps, math.sqrt(warmup_steps / step))


def warmup_cosine(
    step: int,
    *,
    warmup_steps: int,
    total_steps: int,
    hold_steps: int = 0,
    min_ratio: float = 0.01,
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


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: Mapping[str, Any], total_steps: int | None
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step LambdaLR from the `optim.scheduler` config.

    `kind: noam` takes `warmup_steps`; `kind: warmup_cosine` takes `warmup_steps`,
    `hold_fraction` (of the total, held at the peak) and `min_ratio`, and needs
    `total_steps` (from `trainer.max_steps` or estimated from the data).
    """
    cfg = dict(cfg)
    kind = cfg.pop("kind", None)
    fn: Callable[[int], float]
    if kind == "noam":
        _expect_keys(cfg, {"warmup_steps"}, kind)
        fn = lambda step: noam(step, warmup_steps=int(cfg["warmup_steps"]))  # noqa: E731
    elif kind == "warmup_cosine":
        _expect_keys(cfg, {"warmup_steps", "hold_fraction", "min_ratio"}, kind)
        if not total_steps:
            raise ValueError("optim.scheduler.kind=warmup_cosine needs the total number of steps")
        hold = int(float(cfg.get("hold_fraction", 0.0)) * total_steps)
        fn = lambda step: warmup_cosine(  # noqa: E731
            step,
            warmup_steps=int(cfg["warmup_steps"]),
            total_steps=total_steps,
            hold_steps=hold,
            min_ratio=float(cfg.get("min_ratio", 0.01)),
        )
    else:
        raise ValueError(
            f"unknown optim.scheduler.kind {kind!r}; valid kinds: 'noam', 'warmup_cosine'"
        )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


def _expect_keys(cfg: Mapping[str, Any], allowed: set[str], kind: str) -> None:
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise KeyError(
            f"unknown optim.scheduler key(s) {unknown} for kind={kind}; valid: {sorted(allowed)}"
        )
    if "warmup_steps" not in cfg:
        raise KeyError(f"optim.scheduler.warmup_steps is required for kind={kind}")

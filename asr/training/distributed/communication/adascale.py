"""AdaScale SGD (Johnson, Agrawal, Gu and Guestrin, ICML 2020, arXiv 2007.05105): the
learning rate follows how much a larger batch really helps.

With S data-parallel ranks, a step averages S gradients. If they agree (no gradient
noise) the step is worth one small step; if they are pure noise it is worth S. AdaScale
estimates the gain

    r_t = (sigma^2 + mu^2) / (sigma^2 / S + mu^2)     (between 1 and S)

from the ranks' own gradients g_i and their mean g: E[mean_i |g_i|^2] = mu^2 + sigma^2 and
E[|g|^2] = mu^2 + sigma^2 / S give unbiased estimates of sigma^2 (the variance of one
rank's gradient) and mu^2 (the squared norm of the true gradient), smoothed over steps.
Each step then uses r_t times the scheduled rate and advances the schedule by r_t steps
(`progress`), so a run with S ranks follows the one-rank schedule in fewer steps and stops
when the schedule is done (for schedules with an end). Meant for momentum SGD
(`optim.kind=sgd`), as in the paper.

The local squared norms are taken in a DDP communication hook (the only place a rank's
own gradient exists before the all-reduce), so the exchange stays one all-reduce per
bucket plus one scalar all-reduce per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from asr.config_keys import ConfigError
from asr.training.distributed.communication.hooks import comm_hook
from asr.training.schedules import SchedulerConfig, schedule_function


@dataclass(frozen=True)
class AdaScaleConfig:
    """Keys of `distributed.adascale`.

    - `smoothing`: the smoothing of the gradient moment estimates (an exponential average
      over about 1 / (1 - smoothing) steps).
    """

    smoothing: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 <= self.smoothing < 1.0:
            raise ConfigError(
                f"distributed.adascale.smoothing must be in [0, 1), got {self.smoothing}"
            )


@dataclass
class AdaScaleState:
    """The hook's per-step sums and the smoothed estimates."""

    config: AdaScaleConfig
    process_group: dist.ProcessGroup | None = None
    local_sq: Tensor | None = None  # this rank's |g_i|^2, summed over buckets
    mean_sq: Tensor | None = None  # |g|^2 of the averaged gradient
    sigma2: float | None = None
    mu2: float | None = None
    gain: float = 1.0
    progress: float = 0.0  # steps of the one-rank schedule done
    history: list[float] = field(default_factory=list)

    def world_size(self) -> int:
        return dist.get_world_size(self.process_group)

    def finish_step(self) -> float:
        """After backward: estimate this step's gain from the sums the hook collected
        (one scalar all-reduce), reset the sums, and return the gain."""
        if self.local_sq is None or self.mean_sq is None:
            raise RuntimeError("AdaScale: no gradient was exchanged this step")
        world = self.world_size()
        local = self.local_sq.double().clone()
        dist.all_reduce(local, group=self.process_group)
        mean_local, mean_sq = float(local) / world, float(self.mean_sq)
        self.local_sq = self.mean_sq = None
        sigma2 = max((mean_local - mean_sq) * world / (world - 1), 0.0)
        mu2 = max(mean_sq - sigma2 / world, 0.0)
        theta = self.config.smoothing if self.sigma2 is not None else 0.0
        self.sigma2 = theta * (self.sigma2 or 0.0) + (1 - theta) * sigma2
        self.mu2 = theta * (self.mu2 or 0.0) + (1 - theta) * mu2
        denominator = self.sigma2 / world + self.mu2
        gain = (self.sigma2 + self.mu2) / denominator if denominator > 0 else 1.0
        self.gain = min(max(gain, 1.0), float(world))
        self.history.append(self.gain)
        return self.gain


@comm_hook
def adascale_hook(state: AdaScaleState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """DDP's averaging all-reduce, recording |g_i|^2 before and |g|^2 after it."""
    buffer = bucket.buffer()
    local = buffer.detach().double().square().sum()
    state.local_sq = local if state.local_sq is None else state.local_sq + local
    work = dist.all_reduce(
        buffer.div_(state.world_size()), group=state.process_group, async_op=True
    )

    def done(fut: torch.futures.Future) -> Tensor:
        averaged = fut.value()[0]
        total = averaged.detach().double().square().sum()
        state.mean_sq = total if state.mean_sq is None else state.mean_sq + total
        return averaged

    return work.get_future().then(done)


@runtime_checkable
class KnowsRunLength(Protocol):
    """A module that knows its run's optimizer steps (AsrLitModule); None: unknown."""

    total_steps: int | None


class AdaScaleLearningRate(Callback):
    """Sets each step's learning rate to gain x peak x schedule(progress), advances the
    progress by the gain, logs both, and stops the run when the schedule is done. The
    schedule is the one-rank run's (`scheduler`, null: constant), in steps of one rank's
    batch: the module's `total_steps` x `world_size` of them."""

    def __init__(
        self, state: AdaScaleState, scheduler: SchedulerConfig | None, world_size: int
    ) -> None:
        self.state = state
        self.scheduler = scheduler
        self.world_size = world_size
        self.schedule: Callable[[float], float] = lambda _: 1.0
        self.total_steps: int | None = None  # of the one-rank schedule; None: no end
        self.peak: list[float] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.peak = [group.get("initial_lr", group["lr"]) for group in _groups(trainer)]
        run_steps = pl_module.total_steps if isinstance(pl_module, KnowsRunLength) else None
        self.total_steps = run_steps * self.world_size if run_steps else None
        if self.scheduler is not None:
            self.schedule = schedule_function(self.scheduler, self.total_steps)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        gain = self.state.finish_step()
        factor = gain * self.schedule(self.state.progress)
        for group, peak in zip(optimizer.param_groups, self.peak, strict=True):
            group["lr"] = peak * factor
        self.state.progress += gain
        pl_module.log("adascale/gain", gain, on_step=True, on_epoch=False)
        pl_module.log("adascale/progress", self.state.progress, on_step=True, on_epoch=False)
        if self.total_steps is not None and self.state.progress >= self.total_steps:
            trainer.should_stop = True

    def state_dict(self) -> dict[str, float | None]:
        s = self.state
        return {"progress": s.progress, "sigma2": s.sigma2, "mu2": s.mu2, "gain": s.gain}

    def load_state_dict(self, state_dict: dict[str, float | None]) -> None:
        self.state.progress = float(state_dict["progress"] or 0.0)
        self.state.sigma2, self.state.mu2 = state_dict["sigma2"], state_dict["mu2"]
        self.state.gain = float(state_dict["gain"] or 1.0)


def _groups(trainer: L.Trainer) -> list[dict]:
    return [group for optimizer in trainer.optimizers for group in optimizer.param_groups]

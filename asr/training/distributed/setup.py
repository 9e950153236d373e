"""The one door to multi-process training: `setup_distributed(config, facts)` builds the
Lightning strategy for `trainer.strategy`, the callbacks it needs, and says what the module
may ask of it and what the `distributed` keys left to `auto`/null resolved to. `train.py`
calls it once; nothing else builds strategies or imports the savers."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy, Strategy

from asr.training.distributed.communication.adascale import (
    AdaScaleLearningRate,
    AdaScaleState,
    adascale_hook,
)
from asr.training.distributed.communication.adpsgd import DecentralizedStrategy, GossipMonitor
from asr.training.distributed.communication.allreduce_wait import (
    AllReduceClock,
    timed_allreduce_hook,
)
from asr.training.distributed.communication.dgc.adam import check_variance_freeze
from asr.training.distributed.communication.dgc.hook import dgc_hook
from asr.training.distributed.communication.dgc.state import AdamMoments, DGCState
from asr.training.distributed.communication.dgc.traffic import CompressionMonitor
from asr.training.distributed.communication.hooked_ddp import HookedDDPStrategy
from asr.training.distributed.communication.straggler import Straggler
from asr.training.distributed.config import DistributedConfig
from asr.training.distributed.ddp import (
    find_unused_parameters,
    processes_per_node,
    set_cpu_threads,
    uses_cpu,
)
from asr.training.distributed.features import DENSE, StrategyFeatures
from asr.training.distributed.startup import StartupGraceDDPStrategy
from asr.training.optimizer import OptimConfig
from asr.training.run_config import DebugConfig, TrainerConfig
from asr.training.step_times import StepTimes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingFacts:
    """What the set-up needs from the rest of the run: the `trainer` keys (strategy,
    processes, clipping), the optimizer, the objective's (parts without a gradient in some
    steps, loss kind, first step of the full loss), and the `debug` keys (the straggler,
    the step times)."""

    trainer: TrainerConfig
    optim: OptimConfig
    parts_without_gradient: tuple[str, ...] = ()
    loss_kind: str | None = None
    first_full_loss_step: int = 0
    debug: DebugConfig = field(default_factory=DebugConfig)


@dataclass
class DistributedSetup:
    """The strategy for `lightning.Trainer`, the callbacks it needs, what the module may ask
    of it, and what was resolved (written to `resolved.yaml` by `asr-train`)."""

    strategy: str | Strategy
    strategy_features: StrategyFeatures = DENSE
    callbacks: list[Callback] = field(default_factory=list)
    resolved: dict[str, Any] = field(default_factory=dict)


def setup_distributed(config: DistributedConfig, facts: TrainingFacts) -> DistributedSetup:
    """Build everything multi-process training needs from the `distributed` keys."""
    trainer = facts.trainer
    world_size = processes_per_node(trainer.accelerator, trainer.devices) * int(trainer.num_nodes)
    resolved: dict[str, Any] = {"world_size": world_size}
    if uses_cpu(trainer.accelerator):
        resolved["cpu_threads"] = set_cpu_threads(config, world_size)
    if config.compression is not None and config.compression.clip_norm is None:
        clip = trainer.gradient_clip_val  # DGC clips each rank's gradient in the hook instead
        clip_norm = float(clip) if clip else None
        config = dataclasses.replace(
            config, compression=dataclasses.replace(config.compression, clip_norm=clip_norm)
        )
    if config.compression is not None:
        check_variance_freeze(config.compression, facts.first_full_loss_step)
        resolved["compression"] = {"clip_norm": config.compression.clip_norm}
        if trainer.gradient_clip_val:
            clip_norm = config.compression.clip_norm
            log.info("gradient clipping moves into the DGC hook: clip_norm=%s", clip_norm)
    if config.adascale is not None and facts.optim.kind != "sgd":
        raise ValueError("distributed.adascale is for momentum SGD: set optim=sgd_cosine")
    strategy = build_strategy(
        trainer.strategy,
        world_size=world_size,
        config=config,
        parts_without_gradient=facts.parts_without_gradient,
        loss_kind=facts.loss_kind,
        optimizer_momentum=facts.optim.sgd_momentum,
        adam_moments=AdamMoments(*facts.optim.betas, facts.optim.eps)
        if facts.optim.kind == "adamw"
        else None,
        time_allreduce=bool(facts.debug.step_times_dir),
    )
    if isinstance(strategy, DDPStrategy) and not isinstance(strategy, DecentralizedStrategy):
        parts = facts.parts_without_gradient
        resolved["find_unused_parameters"] = find_unused_parameters(config, parts)
    resolved["strategy"] = strategy if isinstance(strategy, str) else type(strategy).__name__
    features: StrategyFeatures = (
        strategy if isinstance(strategy, HookedDDPStrategy | DecentralizedStrategy) else DENSE
    )
    callbacks = [
        *saver_callbacks(strategy, facts, world_size),
        *debug_callbacks(strategy, facts.debug),
    ]
    return DistributedSetup(strategy, features, callbacks, resolved)


def saver_callbacks(strategy: str | Strategy, facts: TrainingFacts, world_size: int) -> list:
    """The callbacks of the savers `strategy` runs."""
    callbacks: list[Callback] = []
    if isinstance(strategy, HookedDDPStrategy) and strategy.compression is not None:
        callbacks.append(CompressionMonitor(strategy.compression))
    if isinstance(strategy, HookedDDPStrategy) and strategy.adascale is not None:
        scheduler = facts.optim.scheduler
        callbacks.append(AdaScaleLearningRate(strategy.adascale, scheduler, world_size))
    if isinstance(strategy, DecentralizedStrategy):
        callbacks.append(GossipMonitor(strategy))
    return callbacks


def debug_callbacks(strategy: str | Strategy, debug: DebugConfig) -> list[Callback]:
    """The `debug` keys' callbacks: the step times (with plain DDP's all-reduce wait when
    `strategy` times it), then the straggler."""
    callbacks: list[Callback] = []
    if debug.step_times_dir:
        clock = strategy.allreduce_clock if isinstance(strategy, HookedDDPStrategy) else None
        wait = None if clock is None else clock.take_wait
        callbacks.append(StepTimes(debug.step_times_dir, allreduce_wait=wait))
    if debug.straggler_rank is not None:
        callbacks.append(Straggler(int(debug.straggler_rank), float(debug.straggler_slowdown)))
    return callbacks


def build_strategy(
    strategy: str | Strategy,
    *,
    world_size: int,
    config: DistributedConfig,
    parts_without_gradient: Sequence[str],
    loss_kind: str | None = None,
    optimizer_momentum: float = 0.0,
    adam_moments: AdamMoments | None = None,
    time_allreduce: bool = False,
) -> str | Strategy:
    """The `strategy` argument for `lightning.Trainer`.

    `adpsgd` becomes the decentralized `DecentralizedStrategy` (AD-PSGD, H-ADPSGD).
    `ddp`, and `auto` with more than one process, become a configured `DDPStrategy`;
    `parts_without_gradient` (from the objective) decides `find_unused_parameters`
    under `auto`. With `config.compression` the DGC hook is registered; it takes over
    the optimizer's moments (`optimizer_momentum`, SGD's, or `adam_moments`, AdamW's,
    whose second moment it freezes after dense steps), and the optimizer then runs as
    plain SGD. With `time_allreduce` and no other hook, plain DDP's all-reduce is timed
    (`communication.allreduce_wait`, a debug measurement). Anything else goes to Lightning
    as given, except FSDP with the sample-wise transducer loss, which cannot work
    (docs/distributed.md#fsdp).
    """
    if not isinstance(strategy, str):
        return strategy
    if strategy.startswith("fsdp") and loss_kind == "samplewise":
        raise ValueError(
            f"trainer.strategy={strategy} cannot train with model.loss.kind=samplewise: the "
            "sample-wise loss runs the joiner's weights outside its forward, where FSDP holds "
            "only a shard of them. Use trainer.strategy=ddp (the presets fit one GPU), or "
            "model.loss.kind=batched (docs/distributed.md#fsdp)."
        )
    savers = {"compression": config.compression, "adascale": config.adascale}
    hooked = [name for name, saver in savers.items() if saver is not None]
    if len(hooked) == 2:
        raise ValueError("distributed.compression and distributed.adascale exclude each other")
    if strategy == "adpsgd":
        return decentralized_strategy(config, hooked, world_size, optimizer_momentum)
    if strategy != "ddp" and not (strategy == "auto" and world_size > 1):
        if hooked:
            raise ValueError(
                f"distributed.{hooked[0]} needs trainer.strategy=ddp, not {strategy!r}"
            )
        return strategy
    if config.adascale is not None and world_size < 2:
        raise ValueError("distributed.adascale needs at least 2 processes (trainer.devices)")
    find_unused = find_unused_parameters(config, parts_without_gradient)
    if find_unused:
        log.info(
            "DDP looks for unused parameters every step (%s)", ", ".join(parts_without_gradient)
        )
    ddp = {"find_unused_parameters": find_unused, **timeouts(config)}
    if config.compression is not None:
        state = DGCState(config.compression, momentum=optimizer_momentum, adam=adam_moments)
        return HookedDDPStrategy(ddp_comm_state=state, ddp_comm_hook=dgc_hook, **ddp)
    if config.adascale is not None:
        state = AdaScaleState(config.adascale)
        return HookedDDPStrategy(ddp_comm_state=state, ddp_comm_hook=adascale_hook, **ddp)
    if time_allreduce:
        clock = AllReduceClock()
        return HookedDDPStrategy(ddp_comm_state=clock, ddp_comm_hook=timed_allreduce_hook, **ddp)
    return StartupGraceDDPStrategy(**ddp)


def timeouts(config: DistributedConfig) -> dict[str, timedelta]:
    """A strategy's timeouts: each collective's, and the start-up rendezvous's."""
    return {
        "timeout": timedelta(seconds=config.timeout),
        "startup_timeout": timedelta(seconds=config.startup_timeout),
    }


def decentralized_strategy(
    config: DistributedConfig, hooked: list[str], world_size: int, optimizer_momentum: float
) -> DecentralizedStrategy:
    """`trainer.strategy=adpsgd`, after checking it can run as configured."""
    if hooked:
        raise ValueError(
            f"distributed.{hooked[0]} works on DDP's gradient all-reduce, which "
            "trainer.strategy=adpsgd does not run"
        )
    if world_size < 2:
        raise ValueError("trainer.strategy=adpsgd needs at least 2 processes (trainer.devices)")
    if optimizer_momentum > 0 and not config.gossip.synchronous:
        log.warning(
            "trainer.strategy=adpsgd with momentum SGD: the asynchronous exchange's one "
            "step of staleness acts as added momentum (recipes/demo/RESULTS.md, "
            "Decentralized training). Use optim=adamw_cosine with about sqrt(learners) "
            "times DDP's learning rate"
        )
    return DecentralizedStrategy(config.gossip, **timeouts(config))

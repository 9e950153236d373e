"""Decentralized training as a Lightning strategy (`trainer.strategy=adpsgd`): AD-PSGD and,
with `distributed.gossip.node_size` > 1, its hierarchical form H-ADPSGD (Zhang et al.,
arXiv 1907.05701).

Lightning's DDP process setup (one process per device, gloo or NCCL, the bucketing
sampler's split of the data) without DDP's gradient all-reduce: each process trains its own
replica, and after each optimizer step averages its weights with one peer
(`asr.training.distributed.communication.gossip`). With `node_size` = k > 1 every k
consecutive ranks are one "super-learner": they all-reduce their gradients after each
backward (a node-local group: NVLink or shared memory on a real node), the first of them
(the node's leader) gossips with the other leaders, then sends the result to its node, so
the replicas of a node are identical after every step.

What the rest of the training sees:
- the optimizer step's tallies (non-finite checks, skipped cuts) are summed over the
  replica's own ranks only (`step_group`): a global all-reduce per step would make every
  process wait for the slowest again;
- before each validation and at the end of training every rank's weights are averaged
  (the consensus, `average(write=True)`), so that validation, `best.ckpt`, `last.ckpt` at
  epoch ends and export hold one consensus model, and the replicas restart from it. A
  checkpoint written mid-epoch (`checkpoint.every_n_train_steps`) holds rank 0's replica;
  a resumed run starts every replica from the checkpoint's weights;
- `gossip/spread` logs the largest distance of a replica to the mean (before each
  consensus, and every `spread_every_n_steps` steps if set: a global barrier each time).
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from asr.config_keys import ConfigError
from asr.training.distributed.communication.gossip import (
    Gossip,
    GossipConfig,
    assign,
    average_replicas,
    flatten,
)
from asr.training.distributed.startup import StartupGraceDDPStrategy
from asr.training.step_guard import LOCAL

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecentralizedConfig(GossipConfig):
    """Keys of `distributed.gossip`: `GossipConfig`'s (the exchange: `ring`,
    `delay_by_one`, `seed`, `synchronous`, whose defaults live there) and two more.

    - `node_size`: processes per node that act as one learner (H-ADPSGD); 1: AD-PSGD.
    - `spread_every_n_steps`: also measure the replicas' spread every N steps (0: only
      before each validation).
    """

    node_size: int = 1
    spread_every_n_steps: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.node_size < 1:
            raise ConfigError(f"distributed.gossip.node_size must be >= 1, got {self.node_size}")
        if self.spread_every_n_steps < 0:
            raise ConfigError(
                "distributed.gossip.spread_every_n_steps must be >= 0, got "
                f"{self.spread_every_n_steps}"
            )


class DecentralizedStrategy(StartupGraceDDPStrategy):
    """AD-PSGD (`node_size` 1) or H-ADPSGD over Lightning's DDP process setup."""

    def __init__(self, config: DecentralizedConfig, timeout: timedelta, **kwargs: Any) -> None:
        super().__init__(timeout=timeout, **kwargs)  # `startup_timeout` among the kwargs
        self.config = config
        self.gossip: Gossip | None = None  # on the ranks that gossip (node leaders)
        self.exchange_group: dist.ProcessGroup | None = None  # gloo, every rank: exchanges
        self.average_group: dist.ProcessGroup | None = None  # gloo, every rank: consensus
        self.node_group: dist.ProcessGroup | None = None  # the node's ranks (H-ADPSGD)
        self.node_leader = 0
        self.last_spread: float | None = None

    # --- StrategyFeatures: what the module may ask ---
    def step_group(self) -> Any:
        """The ranks that share an optimizer step: the node's (H-ADPSGD), or this one."""
        return self.node_group if self.node_group is not None else LOCAL

    moments_in_hook = False  # each replica's own optimizer
    sets_learning_rate = False
    clips_in_hook = False

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # no DistributedDataParallel: no gradient all-reduce

    def _register_ddp_hooks(self) -> None:
        pass

    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            unlock_training_steps(trainer)
            self._start()

    def _params(self) -> list[torch.Tensor]:
        assert self.lightning_module is not None
        return list(self.lightning_module.parameters())

    def _start(self) -> None:
        world, rank, size = self.world_size, self.global_rank, self.config.node_size
        if world % size:
            raise ConfigError(
                f"distributed.gossip.node_size={size} does not divide the {world} processes"
            )
        # every rank creates every group, in the same order (torch.distributed requires it)
        self.exchange_group = dist.new_group(backend="gloo", timeout=self._timeout)
        self.average_group = dist.new_group(backend="gloo", timeout=self._timeout)
        if size > 1:
            for first in range(0, world, size):
                group = dist.new_group(list(range(first, first + size)), timeout=self._timeout)
                if first <= rank < first + size:
                    self.node_group, self.node_leader = group, first
        leaders = list(range(0, world, size))
        if rank in leaders:
            self.gossip = Gossip(
                self._params(),
                self.config,
                leaders,
                self.exchange_group,
                self.average_group,
            )
        log.info(
            "decentralized training: %d learner(s) of %d process(es), %s ring%s%s",
            len(leaders),
            size,
            self.config.ring,
            ", delay-by-one" if self.config.delay_by_one else "",
            ", synchronous" if self.config.synchronous else "",
        )

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        """H-ADPSGD: the node's ranks average their gradients (one learner)."""
        if self.node_group is None:
            return
        grads = [p.grad for p in self._params() if p.grad is not None]
        if not grads:
            return
        flat = flatten(grads, self.root_device)
        dist.all_reduce(flat, group=self.node_group)
        assign(grads, flat / self.config.node_size)

    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        gossip = self.gossip
        if gossip is None:
            out = super().optimizer_step(optimizer, closure, model, **kwargs)
        else:
            # the optimizer's update (after the closure's forward and backward) holds the
            # lock, so the passive's service thread never reads half-updated weights
            held = []

            def locked_closure() -> Any:
                result = closure()
                if not held:  # an optimizer may call its closure more than once
                    gossip.lock.acquire()
                    held.append(True)
                return result

            try:
                out = super().optimizer_step(optimizer, locked_closure, model, **kwargs)
            finally:
                if held:
                    gossip.lock.release()
            gossip.after_step()
        if self.node_group is not None:  # the leader's weights to its node
            params = self._params()
            lock = gossip.lock if gossip is not None else nullcontext()
            with lock:
                if gossip is not None:
                    gossip.fold()
                flat = flatten(params, self.root_device)
            dist.broadcast(flat, self.node_leader, group=self.node_group)
            if gossip is None:
                assign(params, flat)
        return out

    def average(self, write: bool) -> float:
        """The replicas' spread; with `write` (the consensus) every rank's weights are then
        set to their mean. Every rank calls this at the same point."""
        if self.average_group is None:
            return 0.0
        if self.gossip is not None:
            spread = self.gossip.average(write)
        else:
            dist.barrier(group=self.average_group)
            spread = average_replicas(self._params(), self.average_group, write=write)
        if write:
            self.last_spread = spread
        return spread

    def on_train_end(self) -> None:
        """Stop the exchanges and leave every replica at the consensus."""
        if self.gossip is not None:
            self.gossip.close()
        self.average(write=True)
        if self.gossip is not None:
            timings = ", ".join(f"{k} {v:.2f} s" for k, v in self.gossip.timings.items())
            log.info(
                "rank %d took part in %d weight averages (%s)",
                self.global_rank,
                self.gossip.exchanges,
                timings,
            )
        self.gossip = None
        super().on_train_end()


def unlock_training_steps(trainer: L.Trainer) -> None:
    """Drop the broadcast Lightning (2.6) runs before every training step on every rank to
    pass a SIGTERM from rank 0 to the others (`_TrainingEpochLoop._broadcast_sigterm_tensor`,
    Lightning PR 20825). A collective per step holds the replicas in lockstep, the fast
    rank at the slow rank's pace (recipes/demo/RESULTS.md, "Two processes, and what held
    the fast rank back"), which is what AD-PSGD exists to avoid. Each rank still stops on its own
    SIGTERM (Lightning checks the flag after every batch); a scheduler that preempts a job
    signals all of its processes."""
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None  # type: ignore[method-assign]


class GossipMonitor(Callback):
    """Averages the replicas before each validation and logs `gossip/spread` (also every
    `spread_every_n_steps` steps)."""

    def __init__(self, strategy: DecentralizedStrategy) -> None:
        self.strategy = strategy
        self._last_measured = -1  # the step of the last periodic measurement

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self.strategy.average(write=True)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        spread = self.strategy.last_spread
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if fitting and spread is not None:
            pl_module.log("gossip/spread", spread, rank_zero_only=True)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        every = self.strategy.config.spread_every_n_steps
        step = trainer.global_step
        if every and step % every == 0 and step != self._last_measured:
            self._last_measured = step
            spread = self.strategy.average(write=False)
            pl_module.log("gossip/spread", spread, rank_zero_only=True)

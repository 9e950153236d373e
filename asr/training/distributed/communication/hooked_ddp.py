"""`HookedDDPStrategy`: Lightning's `DDPStrategy` with a communication hook (DGC, AdaScale
or the debug timer of the all-reduce) registered on every device, DGC's per-rank state
carried through checkpoints, and the `StrategyFeatures` the module asks about."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asr.training.distributed.communication.adascale import AdaScaleState
from asr.training.distributed.communication.allreduce_wait import AllReduceClock
from asr.training.distributed.communication.dgc.state import (
    DGCState,
    carries_rank_state,
    load_rank_state,
    rank_state_path,
    save_rank_state,
)
from asr.training.distributed.startup import StartupGraceDDPStrategy


class HookedDDPStrategy(StartupGraceDDPStrategy):
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

    @property
    def allreduce_clock(self) -> AllReduceClock | None:
        """The timed all-reduce's clock, when plain DDP's wait is measured."""
        state = self._ddp_comm_state
        return state if isinstance(state, AllReduceClock) else None

    # --- StrategyFeatures: what the module may ask ---
    def step_group(self) -> Any:
        return None  # every rank

    @property
    def moments_in_hook(self) -> bool:
        return self.compression is not None and self.compression.moments_in_hook

    @property
    def sets_learning_rate(self) -> bool:
        return self.adascale is not None  # AdaScaleLearningRate sets it every step

    @property
    def clips_in_hook(self) -> bool:
        # DGC clips each rank's gradient before accumulation, not the exchanged sum (which
        # holds accumulated values, or already Adam's directions)
        return self.compression is not None

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

"""A debug option that makes one rank slower, to measure what a straggler costs.

Synchronous data-parallel training waits for its slowest process at every gradient
all-reduce; decentralized schemes (AD-PSGD) are meant to tolerate it. `Straggler` makes the
chosen rank `slowdown` times slower: at the end of each of its training steps it sleeps
(slowdown - 1) times as long as the step took (forward, backward, all-reduce and update; as
the slowest rank it hardly waits in the all-reduce, so that is its own work).
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L


class Straggler(L.Callback):
    """Slow rank `rank` down by `slowdown` (>= 1) in every training step."""

    def __init__(self, rank: int, slowdown: float) -> None:
        if slowdown < 1:
            raise ValueError(f"debug.straggler_slowdown must be >= 1, got {slowdown}")
        self.rank, self.slowdown = rank, slowdown
        self._start: float | None = None
        self.slept = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_rank == self.rank:
            self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_rank == self.rank and self._start is not None:
            pause = (self.slowdown - 1) * (time.perf_counter() - self._start)
            time.sleep(pause)
            self.slept += pause
            self._start = None

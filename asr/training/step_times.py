"""A debug option that records every rank's optimizer steps, to measure throughput when the
ranks do not move in lock-step (decentralized training, a straggler, unequal batches).

`StepTimes` appends one JSON line per optimizer step to `<directory>/rank<R>.jsonl`: the
step, the wall-clock time at its end, the seconds of audio it trained on (summed over the
ranks that share the step: every rank under DDP, the replica's own under AD-PSGD),
`step_s` (seconds since this rank's previous step ended; None for its first) and
`allreduce_wait_s` (the seconds this rank waited in plain DDP's gradient all-reduce,
`asr.training.distributed.communication.allreduce_wait`; None where it is not timed).
Lightning's loggers write from rank 0 only, so they cannot show the other ranks' pace.
`asr-train` adds it (`debug.step_times_dir`) through `asr.training.distributed.setup`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L


class StepTimes(L.Callback):
    """Record each optimizer step of this rank in `directory/rank{R}.jsonl`;
    `allreduce_wait` returns the step's all-reduce wait (None: not timed)."""

    def __init__(
        self, directory: str | Path, allreduce_wait: Callable[[], float | None] | None = None
    ) -> None:
        self.directory = Path(directory)
        self.allreduce_wait = allreduce_wait
        self._last_step = -1
        self._last_end: float | None = None  # perf_counter at the previous step's end

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        step = trainer.global_step
        if step == self._last_step:  # inside gradient accumulation
            return
        self._last_step = step
        end = time.perf_counter()
        record = {
            "step": step,
            "time": time.time(),
            "audio_seconds": float(getattr(pl_module, "last_step_audio_seconds", 0.0)),
            "step_s": None if self._last_end is None else end - self._last_end,
            "allreduce_wait_s": None if self.allreduce_wait is None else self.allreduce_wait(),
        }
        self._last_end = end
        with open(self.directory / f"rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

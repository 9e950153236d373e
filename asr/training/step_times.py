"""A debug option that records every rank's optimizer steps, to measure throughput when the
ranks do not move in lock-step (decentralized training, a straggler).

`StepTimes` appends one JSON line per optimizer step to `<directory>/rank<R>.jsonl`: the
step, the wall-clock time at its end and the seconds of audio it trained on (summed over the
ranks that share the step: every rank under DDP, the replica's own under AD-PSGD).
Lightning's loggers write from rank 0 only, so they cannot show the other ranks' pace.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L


class StepTimes(L.Callback):
    """Record each optimizer step of this rank in `directory/rank{R}.jsonl`."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._last_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        step = trainer.global_step
        if step == self._last_step:  # inside gradient accumulation
            return
        self._last_step = step
        record = {
            "step": step,
            "time": time.time(),
            "audio_seconds": float(getattr(pl_module, "last_step_audio_seconds", 0.0)),
        }
        with open(self.directory / f"rank{trainer.global_rank}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

"""Checkpoint writing: atomic files and the callbacks that decide when to write."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from asr.inference.bundle import (
    BEST_CHECKPOINT,
    CHECKPOINT_SUFFIX,
    EPOCH_CHECKPOINT,
    LAST_CHECKPOINT,
)

# The checkpoint a run resumes from (`resume=auto`); only it carries per-rank state.
RESUME_CHECKPOINT = LAST_CHECKPOINT


def save_atomically(obj: Any, path: str | Path) -> None:
    """`torch.save(obj)` to a temporary file beside `path`, fsync, then rename: a crash or a
    full disk mid-write leaves the previous file intact, never a truncated one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint to a temporary file beside its target, fsync it, then rename.

    A crash or a full disk mid-write leaves the previous checkpoint intact, never a
    truncated one (Lightning's default stages through a temporary file in /tmp and then
    copies, which is not atomic across file systems).
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        save_atomically(checkpoint, path)


def checkpoint_callbacks(
    dirpath: str | Path, every_n_train_steps: int | None = None, monitor: str = "val/wer"
) -> list[ModelCheckpoint]:
    """Callbacks writing `epoch=NN.ckpt` after every epoch (kept, for averaging),
    `best.ckpt` (lowest validation WER) and `last.ckpt` (for resuming).

    With `every_n_train_steps`, `last.ckpt` is written every that many steps (and only
    then), so a run stopped mid-epoch resumes mid-epoch. Without it, `last.ckpt` follows
    the epochs, and a run stopped mid-epoch (max_steps, max_time) resumes at the next epoch.
    """
    per_epoch = ModelCheckpoint(
        dirpath=dirpath,
        filename=_stem(EPOCH_CHECKPOINT),
        auto_insert_metric_name=False,
        save_top_k=-1,
        save_last=not every_n_train_steps,
        every_n_epochs=1,
        save_on_train_epoch_end=True,  # also in epochs without validation
        enable_version_counter=False,  # always overwrite last.ckpt / epoch=NN.ckpt
    )
    best = ModelCheckpoint(
        dirpath=dirpath,
        filename=_stem(BEST_CHECKPOINT),
        monitor=monitor,  # val/wer, or val/loss for pre-training
        mode="min",
        save_top_k=1,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )
    callbacks = [per_epoch, best]
    if every_n_train_steps:
        callbacks.append(
            ModelCheckpoint(
                dirpath=dirpath,
                filename="step",
                every_n_train_steps=every_n_train_steps,
                save_top_k=1,
                save_last=True,
                enable_version_counter=False,
            )
        )
    for callback in callbacks:  # asr.inference.bundle's names, not Lightning's defaults
        callback.CHECKPOINT_NAME_LAST = _stem(LAST_CHECKPOINT)
        callback.FILE_EXTENSION = CHECKPOINT_SUFFIX
    return callbacks


def _stem(name: str) -> str:
    """A checkpoint file name as Lightning's `filename` wants it: without the suffix."""
    return name.removesuffix(CHECKPOINT_SUFFIX)

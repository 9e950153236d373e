"""The callback that logs what the DGC hook exchanged each optimizer step and starts its
warm-up where a resumed run left it (`CompressionMonitor`)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback

from asr.training.distributed.communication.dgc_state import DGCState


class CompressionMonitor(Callback):
    """Logs each optimizer step's traffic (`StepTraffic`: `comm/bucket_bytes`,
    `comm/payload_bytes`,
    `comm/sent_bytes`, `comm/received_bytes`, `comm/dense_bytes`, `comm/compression` =
    dense / received, `comm/compression_sent` = dense / sent, `comm/sparsity`) and starts
    the warm-up where a resumed run left it."""

    def __init__(self, state: DGCState) -> None:
        self.state = state
        self._logged_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.state.step = trainer.global_step
        groups = trainer.optimizers[0].param_groups
        self.state.learning_rate = lambda: float(groups[0]["lr"])

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_) -> None:
        traffic = self.state.last_traffic
        if trainer.global_step == self._logged_step or traffic.entries == 0:
            return  # inside gradient accumulation, or before the first exchange
        self._logged_step = trainer.global_step
        values = {
            "comm/bucket_bytes": float(traffic.bucket_bytes),
            "comm/payload_bytes": float(traffic.payload_bytes),
            "comm/sent_bytes": float(traffic.sent_bytes),
            "comm/received_bytes": float(traffic.received_bytes),
            "comm/dense_bytes": float(traffic.dense_bytes),
            "comm/compression": traffic.compression,
            "comm/compression_sent": traffic.compression_sent,
            "comm/sparsity": 1.0 - traffic.sent_entries / max(traffic.entries, 1),
        }
        for name, value in values.items():
            pl_module.log(name, value, on_step=True, on_epoch=False, rank_zero_only=True)

"""What one rank of the DGC hook exchanged in one optimizer step, counted in bytes as ring
collectives move them (`StepTraffic`), and the callback that logs it each step
(`CompressionMonitor`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import lightning as L
from lightning.pytorch.callbacks import Callback
from torch import Tensor


@dataclass
class StepTraffic:
    """What one rank exchanged in one optimizer step, over all buckets, in bytes.

    - `bucket_bytes`: the gradient buckets' size; `payload_bytes`: this rank's own
      contribution (its index and value pairs; a dense step's whole buckets). Their ratio
      is the compression at any W, one rank included (where nothing crosses a wire).
    - `sent_bytes`, `received_bytes`: what this rank sends and receives over the wire when
      the collectives run as rings (gloo's and NCCL's way at these sizes): an all-gather of
      W payloads moves (W - 1) of them each way per rank, an all-reduce of B bytes
      2 (W - 1) / W x B each way.
    - `dense_bytes`: what DDP's dense ring all-reduce of the same buckets would move each
      way per rank, 2 (W - 1) / W x the buckets' bytes: the reference of `compression`.
      (At W = 2 all three of sent, payload and dense reduce to the old single counts.)
    """

    world: int = 1
    bucket_bytes: int = 0
    payload_bytes: int = 0
    sent_bytes: int = 0
    received_bytes: int = 0
    dense_bytes: int = 0
    sent_entries: int = 0
    entries: int = 0

    @property
    def compression(self) -> float:
        """Dense ring bytes / received bytes (1 for a dense step); with one rank, where
        nothing crosses a wire, bucket bytes / payload bytes."""
        if self.world == 1:
            return self.bucket_bytes / max(self.payload_bytes, 1)
        return self.dense_bytes / max(self.received_bytes, 1)

    @property
    def compression_sent(self) -> float:
        """Dense ring bytes / sent bytes (one rank: as `compression`)."""
        if self.world == 1:
            return self.compression
        return self.dense_bytes / max(self.sent_bytes, 1)

    def ring_share(self, nbytes: int) -> int:
        """Bytes each rank sends (and receives) in a ring all-reduce of `nbytes` bytes."""
        return round(2 * (self.world - 1) * nbytes / self.world)

    def count_bucket(self, buffer: Tensor) -> None:
        """Count a gradient bucket that a dense all-reduce would exchange."""
        self.bucket_bytes += buffer.numel() * buffer.element_size()
        self.dense_bytes += self.ring_share(buffer.numel() * buffer.element_size())
        self.entries += buffer.numel()

    def count_all_reduce(self, tensor: Tensor, entries: bool = True) -> None:
        """Count `tensor` all-reduced whole (`entries`: a gradient's, sent in full)."""
        nbytes = tensor.numel() * tensor.element_size()
        self.payload_bytes += nbytes
        self.sent_bytes += self.ring_share(nbytes)
        self.received_bytes += self.ring_share(nbytes)
        if entries:
            self.sent_entries += tensor.numel()

    def count_all_gather(self, payload: Tensor, entries: int) -> None:
        """Count this rank's `payload` gathered by all ranks (`entries` gradient entries)."""
        nbytes = self.count_payload(payload, entries)
        self.count_exchange(sent=(self.world - 1) * nbytes, received=(self.world - 1) * nbytes)

    def count_payload(self, payload: Tensor, entries: int) -> int:
        """Count this rank's own contribution, `payload` holding `entries` gradient
        entries; its bytes."""
        nbytes = payload.numel() * payload.element_size()
        self.payload_bytes += nbytes
        self.sent_entries += entries
        return nbytes

    def count_exchange(self, sent: int, received: int) -> None:
        """Count bytes this rank sent to and received from the others."""
        self.sent_bytes += sent
        self.received_bytes += received


class HookProgress(Protocol):
    """What the monitor reads and sets of the hook's state: a `dgc.state.DGCState`, which
    holds `StepTraffic`s (so this module does not import it: no import cycle)."""

    step: int
    learning_rate: Callable[[], float] | None
    last_traffic: StepTraffic


class CompressionMonitor(Callback):
    """Logs each optimizer step's traffic (`StepTraffic`: `comm/bucket_bytes`,
    `comm/payload_bytes`, `comm/sent_bytes`, `comm/received_bytes`, `comm/dense_bytes`,
    `comm/compression` = dense / received, `comm/compression_sent` = dense / sent,
    `comm/sparsity`) and starts the warm-up where a resumed run left it."""

    def __init__(self, state: HookProgress) -> None:
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

"""An exponential moving average (EMA) of the weights that follows the batch size.

An EMA with momentum rho per step averages over about 1 / (1 - rho) steps. When a step
trains on k times the data, the same averaging needs rho^k (Busbridge et al., 2023, "How
to Scale Your EMA", arXiv 2307.13813): one step of batch kB then moves the EMA as k steps
of batch B do, to first order in the learning rate. Dynamic bucketing changes the batch at
every step, so the momentum of each step is

    rho_t = rho_ref ^ (B_t / B_ref)

with B_t the seconds of audio of the step summed over ranks and accumulated micro-batches,
and `decay` (rho_ref) and `reference_batch_seconds` (B_ref) from the `ema` config.

Validation, the choice of `best.ckpt` and testing use the EMA weights when
`validate_with_ema` (they are swapped in for the evaluation and back before any
checkpoint is written, so a checkpoint's model weights are always the trained ones). The
EMA is saved in every checkpoint (callback state `EmaWeights`), resumed with it, and
`asr-export --ema` exports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from asr.config_keys import ConfigError
from asr.inference.bundle import EMA_STATE_KEY


@dataclass(frozen=True)
class EmaConfig:
    """Keys of `ema` (null: no EMA).

    - `decay`: rho_ref, the EMA momentum of a step of `reference_batch_seconds` of audio.
    - `reference_batch_seconds`: B_ref (seconds summed over ranks and accumulation).
    - `start_step`: before this optimizer step the EMA copies the weights.
    - `validate_with_ema`: validation, `best.ckpt` selection and testing use the EMA.
    """

    decay: float = 0.999
    reference_batch_seconds: float = 60.0
    start_step: int = 0
    validate_with_ema: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.decay < 1.0:
            raise ConfigError(f"ema.decay must be in (0, 1), got {self.decay}")
        if not self.reference_batch_seconds > 0:
            raise ConfigError(
                f"ema.reference_batch_seconds must be > 0, got {self.reference_batch_seconds}"
            )

    def momentum(self, batch_seconds: float) -> float:
        """rho_t for a step of `batch_seconds` of audio: decay ^ (B_t / B_ref)."""
        return self.decay ** (batch_seconds / self.reference_batch_seconds)


class EmaWeights(Callback):
    """Keeps the EMA of `pl_module.model`'s floating-point parameters (in float32) and
    swaps it in for evaluation; buffers (BatchNorm statistics) are the model's own."""

    def __init__(self, config: EmaConfig) -> None:
        self.config = config
        self.weights: dict[str, torch.Tensor] = {}
        self.updates = 0
        self._stashed: dict[str, torch.Tensor] | None = None
        self._last_step = -1

    @property
    def state_key(self) -> str:
        return EMA_STATE_KEY

    def _parameters(self, module: L.LightningModule) -> dict[str, nn.Parameter]:
        return {n: p for n, p in module.model.named_parameters() if p.is_floating_point()}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        params = self._parameters(pl_module)
        if self.weights.keys() != params.keys():  # fresh, or not restored from a checkpoint
            self.weights = {n: p.detach().float().clone() for n, p in params.items()}
        self.weights = {n: w.to(params[n].device) for n, w in self.weights.items()}

    @torch.no_grad()
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        step = trainer.global_step
        if step == self._last_step:  # inside gradient accumulation
            return
        self._last_step = step
        batch_seconds = float(getattr(pl_module, "last_step_audio_seconds", 0.0))
        rho = 0.0 if step <= self.config.start_step else self.config.momentum(batch_seconds)
        update(self.weights, self._parameters(pl_module), rho)
        self.updates += 1
        pl_module.log("ema/momentum", rho, on_step=True, on_epoch=False)

    def _swap_in(self, pl_module: L.LightningModule) -> None:
        if not self.config.validate_with_ema or not self.weights or self._stashed is not None:
            return
        params = self._parameters(pl_module)
        self._stashed = {n: p.detach().clone() for n, p in params.items()}
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(self.weights[name])

    def _swap_out(self, pl_module: L.LightningModule) -> None:
        if self._stashed is None:
            return
        with torch.no_grad():
            for name, param in self._parameters(pl_module).items():
                param.copy_(self._stashed[name])
        self._stashed = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._swap_in(pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._swap_out(pl_module)  # before ModelCheckpoint writes (it runs last)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._swap_in(pl_module)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._swap_out(pl_module)

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": {n: w.cpu() for n, w in self.weights.items()},
            "updates": self.updates,
            "config": vars(self.config),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.weights = dict(state_dict["weights"])
        self.updates = int(state_dict["updates"])


def update(ema: dict[str, torch.Tensor], params: dict[str, torch.Tensor], momentum: float) -> None:
    """ema <- momentum x ema + (1 - momentum) x params, entry by entry (in place)."""
    names = list(ema)
    ema_list = [ema[n] for n in names]
    param_list = [params[n].detach().to(ema[n].dtype) for n in names]
    torch._foreach_lerp_(ema_list, param_list, 1.0 - momentum)

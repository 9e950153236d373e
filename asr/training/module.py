"""AsrLitModule: the one LightningModule. It receives a built model, objective and
tokenizer; it owns the optimizer, the schedule, logging and validation WER."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch

from asr.data.batch import Batch
from asr.data.tokenizer import Tokenizer
from asr.decoding.ctc import ctc_greedy_search
from asr.decoding.search import decode
from asr.export import BUNDLE_KEY
from asr.metrics import ErrorCounts, corpus_errors
from asr.models.build import Model
from asr.training.objective import Objective
from asr.training.schedules import build_scheduler

log = logging.getLogger(__name__)


class AsrLitModule(L.LightningModule):
    """Train a `Transducer` or an `EncoderDecoder` with `objective`; validate and test by
    greedy-decoding WER (and the CTC head's, when there is one).

    Args:
        model: the network (a plain nn.Module).
        objective: maps (model, batch, step) to a dict of losses with key `loss`.
        tokenizer: turns hypotheses back into text for WER.
        optim: `lr`, `betas`, `eps`, `weight_decay` and `scheduler` (see `build_scheduler`).
        bundle_meta: what an export needs besides weights (model config, features); saved
            with the tokenizer in every checkpoint under `asr_bundle`.
        total_steps: optimizer steps of the whole run, for schedules that need it.
    """

    def __init__(
        self,
        model: Model,
        objective: Objective,
        tokenizer: Tokenizer,
        optim: Mapping[str, Any],
        bundle_meta: Mapping[str, Any],
        total_steps: int | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.objective = objective
        self.tokenizer = tokenizer
        self.optim_cfg = dict(optim)
        self.bundle_meta = dict(bundle_meta)
        self.total_steps = total_steps
        self.skipped: dict[str, set[str]] = {}  # reason -> ids of cuts dropped by the data
        self._errors: dict[str, ErrorCounts] = {}  # "val", "val_ctc", "test", ...

    def _count_skipped(self, batch: Batch, log_totals: bool) -> None:
        """Add the batch's skipped cuts to the running totals (logged while training)."""
        for reason, cut_ids in batch.skipped.items():
            self.skipped.setdefault(reason, set()).update(cut_ids)
        if log_totals:
            for reason, cut_ids in self.skipped.items():
                key = "data/skipped_" + reason.replace(" ", "_")
                self.log(key, float(len(cut_ids)), on_step=True, on_epoch=False)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor | None:
        self._count_skipped(batch, log_totals=True)
        if len(batch) == 0:
            return None  # every cut of this batch was unusable; Lightning skips the step
        losses = self.objective(self.model, batch, self.global_step)
        size = len(batch)
        for name, value in losses.items():
            self.log(f"train/{name}", value.detach(), prog_bar=name == "loss", batch_size=size)
        self.log("train/audio_seconds", batch.feature_lens.sum().float() / 100, batch_size=size)
        return losses["loss"]

    def _evaluate(self, batch: Batch, stage: str) -> None:
        self._count_skipped(batch, log_totals=False)
        if len(batch) == 0:
            return
        losses = self.objective(self.model, batch, self.global_step)
        self.log(f"{stage}/loss", losses["loss"], batch_size=len(batch), sync_dist=True)
        for name, hyps in self.transcribe_batch(batch).items():
            key = stage if name == "main" else f"{stage}_{name}"
            errors = self._errors.get(key, ErrorCounts())
            self._errors[key] = errors + corpus_errors(batch.texts, hyps)

    @torch.inference_mode()
    def transcribe_batch(self, batch: Batch) -> dict[str, list[str]]:
        """Greedy hypotheses of a batch: `main` (transducer or attention decoder), and `ctc`
        when the model has a CTC head."""
        enc, enc_lens = self.model.encode(batch.features, batch.feature_lens)
        text = self.tokenizer.decode
        hyps = {"main": [text(ids) for ids in decode(self.model, enc, enc_lens)]}
        if self.model.ctc_head is not None:
            best = ctc_greedy_search(self.model.ctc_log_probs(enc), enc_lens, self.model.blank_id)
            hyps["ctc"] = [text(ids) for ids in best]
        return hyps

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _log_wers(self, stage: str) -> None:
        """Log `<stage>/wer` (transducer) and `<stage>/ctc_wer` in percent, summed over ranks."""
        keys = {stage} | {k for k in self._errors if k.split("_")[0] == stage}
        for key in sorted(keys):
            errors = self._errors.pop(key, ErrorCounts())
            counts = torch.tensor(
                [errors.errors, errors.ref_words], dtype=torch.float64, device=self.device
            )
            counts = self.all_gather(counts).reshape(-1, 2).sum(0)
            # No reference word at all (every cut unusable): NaN, never a perfect 0 %.
            wer = float(counts[0] / counts[1]) if counts[1] > 0 else float("nan")
            name = "wer" if key == stage else f"{key.split('_', 1)[1]}_wer"
            self.log(f"{stage}/{name}", 100 * wer, prog_bar=name == "wer", rank_zero_only=True)

    def on_validation_epoch_end(self) -> None:
        self._log_wers("val")

    def on_test_epoch_end(self) -> None:
        self._log_wers("test")

    def on_train_epoch_end(self) -> None:
        loader = self.trainer.train_dataloader if self._trainer is not None else None
        for reason, count in getattr(loader, "dropped_counts", dict)().items():
            self.log(f"data/dropped_{reason.replace(' ', '_')}", float(count))
        if self.skipped:
            counts = {reason: len(ids) for reason, ids in self.skipped.items()}
            log.warning("distinct cuts skipped so far: %s", counts)

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = dict(self.optim_cfg)
        scheduler_cfg = cfg.pop("scheduler")
        decay, no_decay = [], []
        for param in self.model.parameters():
            if param.requires_grad:
                (decay if param.ndim >= 2 else no_decay).append(param)
        groups = [
            {"params": decay, "weight_decay": float(cfg.pop("weight_decay", 0.0))},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(
            groups,
            lr=float(cfg.pop("lr")),
            betas=tuple(cfg.pop("betas", (0.9, 0.98))),
            eps=float(cfg.pop("eps", 1e-8)),
        )
        if cfg:
            valid = "lr, betas, eps, weight_decay, scheduler"
            raise KeyError(f"unknown optim key(s) {sorted(cfg)}; valid: {valid}")
        scheduler = build_scheduler(optimizer, scheduler_cfg, self.total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[BUNDLE_KEY] = {**self.bundle_meta, "tokenizer": self.tokenizer.to_bytes()}
        checkpoint["skipped_cuts"] = {k: sorted(v) for k, v in self.skipped.items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.skipped = {k: set(v) for k, v in checkpoint.get("skipped_cuts", {}).items()}

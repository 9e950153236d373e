"""AsrLitModule: the one LightningModule. It receives a built model, objective and
tokenizer; it owns the optimizer, the schedule, logging and validation WER.

Multi-process training (DDP) needs every rank to make the same collective calls in the same
order. Hence: a rank whose batch lost every cut still runs a step (a zero loss touching
every parameter); whether the optimizer steps is decided on totals summed over ranks
(`asr.training.step_guard`); validation sums error counts over ranks in one all-reduce of
a fixed layout, whatever each rank saw.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities.enums import GradClipAlgorithmType

from asr.data.batch import Batch
from asr.data.tokenizer import Tokenizer
from asr.decoding.ctc import ctc_greedy_search
from asr.decoding.search import SearchOptions, decode
from asr.inference.bundle import BUNDLE_KEY
from asr.metrics import corpus_errors
from asr.models.build import Model, PretrainingModel
from asr.training.distributed.features import DENSE, StrategyFeatures
from asr.training.encoder_init import encoder_group_ids, hold_encoder
from asr.training.objective import Objective
from asr.training.optimizer import OptimConfig, build_optimizer, optim_config
from asr.training.schedules import build_scheduler
from asr.training.step_guard import (
    FaultConfig,
    NonFiniteGuard,
    SkipBudget,
    StepTally,
    StepTotals,
    gradient_norm,
    reduce_tally,
    sum_over_ranks,
)

log = logging.getLogger(__name__)

# Lightning suggests sync_dist for epoch-level metrics under DDP; ours are summed over ranks
# before they are logged (see _log_eval).
warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('(val|test)/")


def zero_loss(model: torch.nn.Module) -> torch.Tensor:
    """0 x the sum of every trainable parameter: a loss whose gradients are all zero, for a
    rank with no usable utterance, which must still take part in DDP's gradient all-reduce."""
    return sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0


class AsrLitModule(L.LightningModule):
    """Train a `Transducer` or an `EncoderDecoder` with `objective`; validate and test by
    greedy-decoding WER (and the CTC head's, when there is one). Pre-training models
    (`W2vBert`, `BestRq`) validate by their loss and accuracies alone, without a tokenizer.

    Args:
        model: the network (a plain nn.Module).
        objective: maps (model, batch, step) to a dict of losses with key `loss`.
        tokenizer: turns hypotheses back into text for WER (None: pre-training).
        optim: the `optim` keys (`asr.training.optimizer.OptimConfig`).
        bundle_meta: what an export needs besides weights (model config, features); saved
            with the tokenizer in every checkpoint under `asr_bundle`.
        total_steps: optimizer steps of the whole run, for schedules that need it.
        count_total_steps: counts them when fitting starts, where `total_steps` is None
            (a step count that the data-parallel ranks agree on needs their process group).
        faults: when a run stops for bad data or non-finite values (`FaultConfig`).
        search: the search of validation and test (None: greedy).
        strategy_features: what the run's distributed strategy does (`StrategyFeatures`: which
            ranks decide a step, whether the optimizer's moments, the learning rate or
            gradient clipping live elsewhere); from `setup_distributed`.
        freeze_encoder_steps: the encoder's learning rate is 0 for this many optimizer
            steps (fine-tuning; `asr.training.encoder_init`).
        encoder_lr_scale: the encoder's learning rate is the schedule's times this
            (fine-tuning a pre-trained encoder slower than the new head).
    """

    def __init__(
        self,
        model: Model | PretrainingModel,
        objective: Objective,
        tokenizer: Tokenizer | None,
        optim: Mapping[str, Any] | OptimConfig,
        bundle_meta: Mapping[str, Any],
        total_steps: int | None = None,
        count_total_steps: Callable[[], int] | None = None,
        faults: FaultConfig | None = None,
        search: SearchOptions | None = None,
        strategy_features: StrategyFeatures = DENSE,
        freeze_encoder_steps: int = 0,
        encoder_lr_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.freeze_encoder_steps = freeze_encoder_steps  # asr.training.encoder_init
        self.encoder_lr_scale = encoder_lr_scale
        self._encoder_groups: list[int] = []
        self.strategy_features = strategy_features
        self.model = model
        self.search = search  # of validation and test; None: greedy
        self.objective = objective
        self.tokenizer = tokenizer
        self.optim_cfg = optim_config(optim)
        self.bundle_meta = dict(bundle_meta)
        self.total_steps = total_steps
        self.count_total_steps = count_total_steps
        faults = faults or FaultConfig()
        self.skipped: dict[str, set[str]] = {}  # reason -> ids of cuts this rank dropped
        self.nonfinite = NonFiniteGuard(faults.max_consecutive_nonfinite)
        self.skip_budget = SkipBudget(faults.max_skipped_fraction)
        self._tally = StepTally()  # this rank's micro-batches since the last optimizer step
        self._eval_sums: dict[str, torch.Tensor] = {}  # stage -> see _eval_layout
        self._last_step_end: float | None = None
        self.last_step_audio_seconds = 0.0  # of the last optimizer step, over all ranks

    def _remember_skipped(self, batch: Batch) -> None:
        for reason, cut_ids in batch.skipped.items():
            self.skipped.setdefault(reason, set()).update(cut_ids)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        self._remember_skipped(batch)
        if len(batch) == 0:
            # Every cut of this batch was unusable. The step still runs (under DDP the other
            # ranks wait for this one's gradients); if no rank had data it is skipped.
            self._tally.add(batch, None)
            return zero_loss(self.model)
        losses = self.objective(self.model, batch, self.global_step)
        self._tally.add(batch, losses["loss"])
        size = len(batch)
        for name, value in losses.items():
            self.log(f"train/{name}", value.detach(), prog_bar=name == "loss", batch_size=size)
        return losses["loss"]

    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Any,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        """Step the optimizer unless the step's totals over all ranks say not to."""

        def closure() -> Any:
            loss = optimizer_closure()  # the last micro-batch's forward and backward
            self._guard_step(optimizer)
            if self.global_step < self.freeze_encoder_steps:
                hold_encoder(optimizer, self._encoder_groups)  # the schedule restores it
            return loss

        optimizer.step(closure=closure)

    def _guard_step(self, optimizer: Any) -> None:
        """After backward (DDP has all-reduced the gradients), before the update: sum the
        ranks' tallies, skip the update on every rank when a loss or the gradient is not
        finite anywhere or no rank had data, stop when the faults say so, log the step.
        (Decentralized training: over the ranks of the replica only, `step_group`.)"""
        tally, self._tally = self._tally, StepTally()
        # the ranks that share this step: all of them, except in decentralized training
        group = self.strategy_features.step_group()
        totals = reduce_tally(tally, self.device, group)
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        norm = gradient_norm(self.model.parameters())
        if scaler is not None:  # fp16: the scaler skips overflowing steps itself
            norm /= float(scaler.get_scale())
        nonfinite_grad = scaler is None and not math.isfinite(norm)
        nonfinite = bool(totals.nonfinite_ranks) or nonfinite_grad
        step = self.global_step
        if nonfinite:
            reason = (
                f"non-finite loss on {totals.nonfinite_ranks} rank(s)"
                if totals.nonfinite_ranks
                else f"non-finite gradient norm {norm}"
            )
            log.warning("step %d skipped (%s); this rank's cuts: %s", step, reason, tally.cut_ids)
        elif totals.utterances == 0:
            reason = "no rank had a usable utterance"
            log.warning("step %d skipped: %s", step, reason)
        else:
            reason = ""
        if reason:
            optimizer.zero_grad(set_to_none=True)  # optimizers leave grad-less weights alone
        self.nonfinite.record(nonfinite, step, reason)
        self.skip_budget.add(totals, tally.first_fault)
        self.skip_budget.check()
        self.last_step_audio_seconds = totals.audio_seconds  # read by the EMA callback
        self._log_step(totals, norm)

    def _log_step(self, totals: StepTotals, grad_norm: float) -> None:
        now = time.perf_counter()
        self.log("train/grad_norm", grad_norm, on_step=True, on_epoch=False)
        self.log("train/audio_seconds", totals.audio_seconds, on_step=True, on_epoch=False)
        if self._last_step_end is not None:
            speed = totals.audio_seconds / max(now - self._last_step_end, 1e-9)
            self.log("train/audio_seconds_per_second", speed, on_step=True, on_epoch=False)
        self._last_step_end = now
        self.log("train/skipped_nonfinite", float(self.nonfinite.total), on_step=True)
        for reason, count in self.skip_budget.skipped.items():
            self.log(f"data/skipped_{reason.replace(' ', '_')}", float(count), on_step=True)

    def on_train_epoch_start(self) -> None:
        self.skip_budget.start_epoch()
        self._last_step_end = None

    def _eval_layout(self) -> tuple[str, ...]:
        """The hypothesis kinds evaluated: `main`, and `ctc` with a CTC head (none for
        pre-training). The sums of a stage are [loss x utterances, utterances, then errors
        and words per kind, then each of `_eval_averages` x utterances]."""
        if self.tokenizer is None:
            return ()
        return ("main", "ctc") if self.model.ctc_head is not None else ("main",)

    def _eval_averages(self) -> tuple[str, ...]:
        """The objective's values averaged over the utterances besides the loss."""
        return self.objective.averaged_metrics(self.model)

    def _new_eval_sums(self) -> torch.Tensor:
        size = 2 + 2 * len(self._eval_layout()) + len(self._eval_averages())
        return torch.zeros(size, dtype=torch.float64)

    def _evaluate(self, batch: Batch, stage: str) -> None:
        self._remember_skipped(batch)
        kinds = self._eval_layout()
        sums = self._eval_sums.setdefault(stage, self._new_eval_sums())
        if len(batch) == 0:
            return
        losses = self.objective(self.model, batch, self.global_step)
        sums[0] += float(losses["loss"]) * len(batch)
        sums[1] += len(batch)
        first = 2 + 2 * len(kinds)
        for i, name in enumerate(self._eval_averages()):
            sums[first + i] += float(losses[name]) * len(batch)
        if not kinds:
            return
        hyps = self.transcribe_batch(batch)
        for i, kind in enumerate(kinds):
            errors = corpus_errors(batch.texts, hyps[kind])
            sums[2 + 2 * i] += errors.errors
            sums[3 + 2 * i] += errors.ref_words

    @torch.inference_mode()
    def transcribe_batch(self, batch: Batch) -> dict[str, list[str]]:
        """Hypotheses of a batch: `main` (transducer or attention decoder; greedy, or the
        module's `search`), and `ctc` (greedy) when the model has a CTC head."""
        enc, enc_lens = self.model.encode(batch.features, batch.feature_lens)
        text = self.tokenizer.decode
        hyps = {"main": [text(ids) for ids in decode(self.model, enc, enc_lens, self.search)]}
        if self.model.ctc_head is not None:
            best = ctc_greedy_search(self.model.ctc_log_probs(enc), enc_lens, self.model.blank_id)
            hyps["ctc"] = [text(ids) for ids in best]
        return hyps

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _log_eval(self, stage: str) -> None:
        """Log `<stage>/loss`, `<stage>/wer` (and `<stage>/ctc_wer`) in percent and
        `<stage>/words`, from sums over all ranks: one all-reduce of the same layout on every
        rank, even one that saw no usable batch. Logged on every rank (the values agree), so
        that `best.ckpt`'s monitor finds `val/wer` everywhere."""
        kinds = self._eval_layout()
        sums = self._eval_sums.pop(stage, None)
        sums = self._new_eval_sums() if sums is None else sums
        sums = sum_over_ranks(sums.to(self.device)).tolist()
        nan = float("nan")  # nothing recognized: never a perfect 0 % (best.ckpt minimizes it)
        self.log(f"{stage}/loss", sums[0] / sums[1] if sums[1] else nan, prog_bar=not kinds)
        for i, kind in enumerate(kinds):
            errors, words = sums[2 + 2 * i], sums[3 + 2 * i]
            name = "wer" if kind == "main" else f"{kind}_wer"
            self.log(
                f"{stage}/{name}", 100 * errors / words if words else nan, prog_bar=kind == "main"
            )
        if kinds:
            self.log(f"{stage}/words", sums[3])
        first = 2 + 2 * len(kinds)
        for i, name in enumerate(self._eval_averages()):
            self.log(f"{stage}/{name}", sums[first + i] / sums[1] if sums[1] else nan)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val")
        self._last_step_end = None  # the next step's speed should not include validation

    def on_test_epoch_end(self) -> None:
        self._log_eval("test")

    def on_train_epoch_end(self) -> None:
        loader = self.trainer.train_dataloader if self._trainer is not None else None
        for reason, count in getattr(loader, "dropped_counts", dict)().items():
            self.log(f"data/dropped_{reason.replace(' ', '_')}", float(count))
        if self.skipped:
            counts = {reason: len(ids) for reason, ids in self.skipped.items()}
            log.warning("distinct cuts skipped so far (this rank): %s", counts)
        self.skip_budget.end_epoch()

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.total_steps is None and self.count_total_steps is not None:
            self.total_steps = self.count_total_steps()
            log.info("the run's optimizer steps: %d", self.total_steps)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer(
            self.model,
            self.optim_cfg,
            fused=self._loss_scaler() is None,
            moments_in_hook=self.strategy_features.moments_in_hook,
            own_groups=self.model.encoder if self._encoder_apart() else None,
            own_lr_scale=self.encoder_lr_scale,
        )
        if self.freeze_encoder_steps:
            self._encoder_groups = encoder_group_ids(optimizer, self.model.encoder)
        if self.optim_cfg.scheduler is None or self.strategy_features.sets_learning_rate:
            return {"optimizer": optimizer}  # constant, or set by a callback every step
        scheduler = build_scheduler(optimizer, self.optim_cfg.scheduler, self.total_steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def _encoder_apart(self) -> bool:
        """Whether the encoder's parameters need optimizer groups of their own."""
        return bool(self.freeze_encoder_steps) or self.encoder_lr_scale != 1.0

    def _loss_scaler(self) -> Any:
        """fp16's gradient scaler when training under one, else None."""
        return getattr(self._trainer and self.trainer.precision_plugin, "scaler", None)

    def configure_gradient_clipping(
        self,
        optimizer: Any,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping; without a loss scaler (fp32, bf16) it runs directly:
        Lightning's mixed-precision plugin refuses to clip for an optimizer that unscales
        its own gradients (fused AdamW) even when nothing was scaled. Nothing when the
        strategy clips each rank's gradient in its communication hook (DGC)."""
        if self.strategy_features.clips_in_hook:
            return
        if not gradient_clip_val or self._loss_scaler() is not None:
            super().configure_gradient_clipping(
                optimizer, gradient_clip_val, gradient_clip_algorithm
            )
            return
        algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
        Precision.clip_gradients(
            self.trainer.precision_plugin, optimizer, gradient_clip_val, algorithm
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        tokenizer = self.tokenizer.to_bytes() if self.tokenizer is not None else None
        checkpoint[BUNDLE_KEY] = {**self.bundle_meta, "tokenizer": tokenizer}
        checkpoint["skipped_cuts"] = {k: sorted(v) for k, v in self.skipped.items()}
        checkpoint["nonfinite_steps"] = self.nonfinite.state_dict()
        checkpoint["skip_budget"] = self.skip_budget.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.skipped = {k: set(v) for k, v in checkpoint.get("skipped_cuts", {}).items()}
        self.nonfinite.load_state_dict(checkpoint.get("nonfinite_steps", {}))
        self.skip_budget.load_state_dict(checkpoint.get("skip_budget", {}))

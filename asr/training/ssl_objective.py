"""The pre-training objective: `model.kind: ssl` with `objective: w2v_bert | best_rq`.

w2v-BERT optimizes `contrastive + diversity_weight x diversity + mlm_weight x mlm`, end to
end; BEST-RQ optimizes the masked prediction loss alone. Besides the loss terms, each call
reports what tells a healthy pre-training from a collapsed one: the masked prediction
(and contrastive) accuracy, the quantizer's code perplexity (w2v-BERT) and the share of
the codebook used as targets in the batch (`code_use`).

Masks and distractors come from a generator seeded by the step and the batch's cut ids:
the same batch at the same step gets the same masks, on any rank and after a resume.
"""

from __future__ import annotations

import logging
import zlib
from collections import deque
from dataclasses import dataclass

import torch

from asr.config_keys import ConfigError
from asr.data.batch import Batch
from asr.losses.ssl import (
    code_perplexity,
    contrastive_loss,
    diversity_loss,
    masked_prediction_loss,
    sample_distractors,
)
from asr.models.ssl import BestRq, W2vBert

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SslLossConfig:
    """Keys of `model.loss` for `model.kind: ssl`.

    - `num_distractors`: w2v-BERT: distractors per masked frame, from the same utterance.
    - `contrastive_temperature`: w2v-BERT: divides the cosine similarities.
    - `diversity_weight`: w2v-BERT: weight of the codebook diversity loss.
    - `mlm_weight`: w2v-BERT: weight of the masked prediction loss (contrastive: 1).
    - `seed`: of the masks and distractors (with the step and the batch's cut ids).
    - `code_use_window`: training steps over which the codes used as targets are pooled.
    - `min_code_use`: warn when fewer than this share of a codebook's entries occurred as
      targets over the last `code_use_window` steps (a collapsing quantizer).
    """

    num_distractors: int = 100
    contrastive_temperature: float = 0.1
    diversity_weight: float = 0.1
    mlm_weight: float = 1.0
    seed: int = 0
    code_use_window: int = 100
    min_code_use: float = 0.1

    def __post_init__(self) -> None:
        if self.code_use_window < 1 or not 0.0 <= self.min_code_use <= 1.0:
            raise ConfigError(
                "model.loss.code_use_window must be >= 1 and min_code_use in [0, 1], got "
                f"{self.code_use_window} and {self.min_code_use}"
            )
        if self.num_distractors < 1 or self.contrastive_temperature <= 0:
            raise ConfigError(
                "model.loss.num_distractors must be >= 1 and contrastive_temperature > 0, got "
                f"{self.num_distractors} and {self.contrastive_temperature}"
            )


def batch_generator(seed: int, step: int, cut_ids: list[str]) -> torch.Generator:
    """A generator seeded by the seed, the step and the batch's cut ids."""
    key = f"{seed}:{step}:{','.join(cut_ids)}".encode()
    return torch.Generator().manual_seed(zlib.crc32(key))


def code_use(codes: torch.Tensor, num_codes: int) -> torch.Tensor:
    """codes (N, C) of the target frames -> the mean over the codebooks of the share of
    their entries that occur."""
    if codes.numel() == 0:
        return torch.zeros((), device=codes.device)
    used = [torch.unique(codes[:, c]).numel() for c in range(codes.size(1))]
    return torch.tensor(sum(used) / (len(used) * num_codes), device=codes.device)


class CodeUseWindow:
    """Which codes occurred as targets over the last `window` training steps; warns once a
    window when the share used falls below `min_share`."""

    def __init__(self, window: int, min_share: float) -> None:
        self.window, self.min_share = window, min_share
        self.steps: deque[torch.Tensor] = deque(maxlen=window)
        self.counts: torch.Tensor | None = None  # per code: steps of the window using it
        self.warned_at = -window

    def add(self, codes: torch.Tensor, num_codes: int, step: int) -> torch.Tensor:
        """Pool one step's target codes (N, C); returns the share used over the window."""
        used = torch.zeros(codes.size(1), num_codes, dtype=torch.bool)
        for c in range(codes.size(1)):
            used[c, codes[:, c].cpu()] = True
        if self.counts is None:
            self.counts = torch.zeros(used.shape, dtype=torch.int32)
        if len(self.steps) == self.window:  # the oldest step leaves the window
            self.counts -= self.steps[0].int()
        self.steps.append(used)
        self.counts += used.int()
        share = (self.counts > 0).float().mean(dim=1).min()
        full = len(self.steps) == self.window
        if full and share < self.min_share and step - self.warned_at >= self.window:
            self.warned_at = step
            log.warning(
                "code use collapsing: %.1f %% of the codebook occurred as targets over the last "
                "%d steps (model.loss.min_code_use=%s); a collapsing quantizer gives the encoder "
                "nothing to learn: check the learning rate, the diversity weight and the masking",
                100 * float(share), self.window, self.min_share,
            )  # fmt: skip
        return share


class SslObjective:
    """Compute the pre-training losses of a `W2vBert` or `BestRq` on a `Batch` (its
    transcripts, if any, are not used)."""

    def __init__(self, config: SslLossConfig) -> None:
        self.config = config
        self.code_window = CodeUseWindow(config.code_use_window, config.min_code_use)

    def uses_ctc(self, step: int) -> bool:
        return False

    def parts_without_gradient(self, model: W2vBert | BestRq) -> list[str]:
        return []

    def averaged_metrics(self, model: W2vBert | BestRq) -> tuple[str, ...]:
        """Values averaged over the utterances at validation besides the loss."""
        if isinstance(model, W2vBert):
            return ("contrastive", "mlm", "contrastive_accuracy", "mlm_accuracy", "code_use")
        return ("mlm_accuracy", "code_use")

    def __call__(self, model: W2vBert | BestRq, batch: Batch, step: int) -> dict[str, torch.Tensor]:
        generator = batch_generator(self.config.seed, step, list(batch.cut_ids))
        if isinstance(model, W2vBert):
            return self._w2v_bert(model, batch, step, generator)
        out = model(batch.features, batch.feature_lens, generator)
        mlm, accuracy = masked_prediction_loss(out.logits, out.codes, out.masked)
        losses = {"loss": mlm, "mlm": mlm, "mlm_accuracy": accuracy}
        return losses | self._code_use(model, out.codes[out.masked], step)

    def _code_use(self, model: W2vBert | BestRq, codes: torch.Tensor, step: int) -> dict:
        """The share of the codebook used in this batch and, in training, over the window."""
        num_codes = model.config.num_codes
        shares = {"code_use": code_use(codes, num_codes)}
        if model.training:
            shares["code_use_window"] = self.code_window.add(codes, num_codes, step)
        return shares

    def _w2v_bert(
        self, model: W2vBert, batch: Batch, step: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        c = self.config
        model.quantizer.temperature = model.config.temperature().at(step)
        out = model(batch.features, batch.feature_lens, generator)
        distractors, valid = sample_distractors(out.masked, c.num_distractors, generator)
        contrastive, contrastive_accuracy = contrastive_loss(
            out.context, out.targets, out.masked, distractors, valid, c.contrastive_temperature
        )
        diversity = diversity_loss(out.mean_probs)
        mlm, mlm_accuracy = masked_prediction_loss(out.logits, out.codes, out.masked)
        return {
            "loss": contrastive + c.diversity_weight * diversity + c.mlm_weight * mlm,
            "contrastive": contrastive,
            "diversity": diversity,
            "mlm": mlm,
            "contrastive_accuracy": contrastive_accuracy,
            "mlm_accuracy": mlm_accuracy,
            "perplexity": code_perplexity(out.mean_probs).detach(),
            "temperature": torch.tensor(model.quantizer.temperature),
        } | self._code_use(model, out.codes[out.masked], step)

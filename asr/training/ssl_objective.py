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

import zlib
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


@dataclass(frozen=True)
class SslLossConfig:
    """Keys of `model.loss` for `model.kind: ssl`.

    - `num_distractors`: w2v-BERT: distractors per masked frame, from the same utterance.
    - `contrastive_temperature`: w2v-BERT: divides the cosine similarities.
    - `diversity_weight`: w2v-BERT: weight of the codebook diversity loss.
    - `mlm_weight`: w2v-BERT: weight of the masked prediction loss (contrastive: 1).
    - `seed`: of the masks and distractors (with the step and the batch's cut ids).
    """

    num_distractors: int = 100
    contrastive_temperature: float = 0.1
    diversity_weight: float = 0.1
    mlm_weight: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
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


class SslObjective:
    """Compute the pre-training losses of a `W2vBert` or `BestRq` on a `Batch` (its
    transcripts, if any, are not used)."""

    def __init__(self, config: SslLossConfig) -> None:
        self.config = config

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
        return {
            "loss": mlm,
            "mlm": mlm,
            "mlm_accuracy": accuracy,
            "code_use": code_use(out.codes[out.masked], model.config.num_codes),
        }

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
            "code_use": code_use(out.codes[out.masked], model.config.num_codes),
            "temperature": torch.tensor(model.quantizer.temperature),
        }

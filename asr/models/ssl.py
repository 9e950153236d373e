"""Self-supervised pre-training of the Conformer encoder: w2v-BERT and BEST-RQ.

Both wrap the same `ConformerEncoder` the supervised models use, so a pre-trained encoder's
weights load into a transducer or an encoder-decoder unchanged (`encoder.*` keys).

- `W2vBert` (Chung et al. 2021): spans of the subsampled frames are replaced by a learned
  mask embedding; the lower layers (the contrastive module) produce context vectors that
  must pick the Gumbel quantizer's vector of the *unmasked* frame among distractors; the
  upper layers (the MLM module) predict the quantizer's code ids at the masked frames.
- `BestRq` (Chiu et al. 2022): spans of the input features are replaced by noise; a frozen
  random-projection quantizer turns the unmasked features into code ids, which the whole
  encoder predicts at the subsampled frames whose input frames were all masked.

The models return tensors; the losses (`asr.losses.ssl`) are the objective's business.
Masks are drawn from the `generator` given (CPU), so a step's masks can be reproduced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from asr.config_keys import ConfigError, check_choice
from asr.models.attention import lengths_to_mask
from asr.models.conformer import ConformerConfig, ConformerEncoder
from asr.models.masking import span_mask
from asr.models.quantizers import (
    GumbelQuantizer,
    RandomProjectionQuantizer,
    TemperatureSchedule,
    fully_masked,
)

OBJECTIVES = ("w2v_bert", "best_rq")


@dataclass(frozen=True)
class W2vBertConfig:
    """Keys of `model.w2v_bert`.

    - `contrastive_layers`: the lower encoder layers that form the contrastive module (null:
      half of them); the rest form the MLM module.
    - `mask_prob`: share of the subsampled frames that start a masked span.
    - `span_length`: subsampled frames per masked span.
    - `code_dim`: width of the quantized vectors and of the projected context.
    - `num_codes`: entries of each codebook group.
    - `groups`: codebook groups (the code id of each is predicted).
    - `gumbel_start`: the Gumbel-softmax temperature at step 0; it decays as
      `max(gumbel_start * gumbel_decay ** step, gumbel_end)`.
    - `gumbel_end`: the lowest temperature.
    - `gumbel_decay`: the temperature's factor per optimizer step.
    """

    contrastive_layers: int | None = None
    mask_prob: float = 0.065
    span_length: int = 10
    code_dim: int = 256
    num_codes: int = 1024
    groups: int = 1
    gumbel_start: float = 2.0
    gumbel_end: float = 0.5
    gumbel_decay: float = 0.999995

    def temperature(self) -> TemperatureSchedule:
        return TemperatureSchedule(self.gumbel_start, self.gumbel_end, self.gumbel_decay)


@dataclass(frozen=True)
class BestRqConfig:
    """Keys of `model.best_rq`.

    - `mask_prob`: share of the input frames that start a masked span.
    - `span_length`: input frames (10 ms each) per masked span.
    - `noise_std`: masked input frames are filled with N(0, noise_std^2) noise.
    - `code_dim`: width of the random projection.
    - `num_codes`: entries of each random codebook.
    - `num_codebooks`: codebooks (each with its own projection), each predicted.
    - `seed`: draws the projection and the codebooks.
    """

    mask_prob: float = 0.01
    span_length: int = 40
    noise_std: float = 0.1
    code_dim: int = 16
    num_codes: int = 8192
    num_codebooks: int = 1
    seed: int = 0


@dataclass(frozen=True)
class SslConfig:
    """`model` with `kind: ssl`: pre-training of the Conformer encoder.

    - `kind`: `ssl` (this), `transducer` or `aed`.
    - `objective`: `w2v_bert` or `best_rq`.
    - `encoder`: the Conformer encoder (`ConformerConfig`).
    - `w2v_bert`: the w2v-BERT objective's keys (`W2vBertConfig`).
    - `best_rq`: the BEST-RQ objective's keys (`BestRqConfig`).
    """

    kind: str = "ssl"
    objective: str = "best_rq"
    encoder: ConformerConfig = field(default_factory=ConformerConfig)
    w2v_bert: W2vBertConfig = field(default_factory=W2vBertConfig)
    best_rq: BestRqConfig = field(default_factory=BestRqConfig)

    def __post_init__(self) -> None:
        check_choice("model.objective", self.objective, OBJECTIVES)
        split = self.w2v_bert.contrastive_layers
        if split is not None and not 0 < split < self.encoder.num_layers:
            raise ConfigError(
                f"model.w2v_bert.contrastive_layers={split} must leave layers to both "
                f"modules: between 1 and {self.encoder.num_layers - 1}"
            )


@dataclass
class W2vBertOutput:
    """What w2v-BERT's losses need of one batch: the encoder output (B, T', D, as
    `ConformerEncoder` returns it) and its lengths (B,); then per subsampled frame
    (B, T'', ...), padded as the encoder pads inside: the projected context of the
    contrastive module, the quantized targets and their code ids, the MLM logits
    (B, T'', groups, num_codes), the masked frames, the valid frames; and the mean code
    distribution over the masked frames (groups, num_codes)."""

    encoder_out: Tensor
    encoder_lens: Tensor
    context: Tensor
    targets: Tensor
    codes: Tensor
    logits: Tensor
    masked: Tensor
    valid: Tensor
    mean_probs: Tensor


@dataclass
class BestRqOutput:
    """What BEST-RQ's loss needs of one batch: the encoder output (B, T', D) and its lengths
    (B,), logits (B, T', num_codebooks, num_codes), target code ids (B, T', num_codebooks),
    the target frames (all of their input frames masked) and the valid frames, (B, T')."""

    encoder_out: Tensor
    encoder_lens: Tensor
    logits: Tensor
    codes: Tensor
    masked: Tensor
    valid: Tensor


class W2vBert(nn.Module):
    """The encoder with w2v-BERT's mask embedding, quantizer, context projection and MLM
    head."""

    def __init__(self, encoder: ConformerEncoder, config: W2vBertConfig) -> None:
        super().__init__()
        d_model = encoder.output_dim
        self.encoder, self.config = encoder, config
        self.split = config.contrastive_layers or len(encoder.layers) // 2
        self.mask_embedding = nn.Parameter(torch.empty(d_model).uniform_())
        self.quantizer = GumbelQuantizer(d_model, config.code_dim, config.num_codes, config.groups)
        self.project_context = nn.Linear(d_model, config.code_dim)
        self.mlm_head = nn.Linear(d_model, config.groups * config.num_codes)

    def forward(
        self, features: Tensor, feature_lens: Tensor, generator: torch.Generator | None = None
    ) -> W2vBertOutput:
        """features (B, T, F), feature_lens (B,) -> what the losses need; `generator` draws
        the masks and the quantizer's Gumbel noise (the objective seeds it per batch)."""
        chunking = self.encoder.chunking_of(None)  # a streaming encoder's drawn in training
        frames = self.encoder.layer_inputs(features, feature_lens, chunking)
        c = self.config
        masked = span_mask(
            frames.lens.cpu(), frames.x.size(1), mask_prob=c.mask_prob, span_length=c.span_length,
            generator=generator,
        ).to(frames.x.device)  # fmt: skip
        quantized = self.quantizer(frames.x, masked, generator)
        x = torch.where(masked[..., None], self.mask_embedding.to(frames.x.dtype), frames.x)
        x = self.encoder.run_layers(self.encoder.dropout(x), frames, 0, self.split)
        context = self.project_context(x)
        x = self.encoder.run_layers(x, frames, self.split, len(self.encoder.layers))
        b, t, _ = x.shape
        logits = self.mlm_head(x).view(b, t, c.groups, c.num_codes)
        return W2vBertOutput(
            self.encoder.output(x, frames), frames.lens, context, quantized.vectors,
            quantized.codes, logits, masked, frames.valid, quantized.mean_probs,
        )  # fmt: skip


class BestRq(nn.Module):
    """The encoder with BEST-RQ's frozen quantizer and prediction head."""

    def __init__(self, encoder: ConformerEncoder, config: BestRqConfig) -> None:
        super().__init__()
        self.encoder, self.config = encoder, config
        encoder_config = encoder.config
        self.quantizer = RandomProjectionQuantizer(
            encoder_config.input_dim,
            encoder_config.subsampling_factor,
            code_dim=config.code_dim,
            num_codes=config.num_codes,
            num_codebooks=config.num_codebooks,
            seed=config.seed,
        )
        self.head = nn.Linear(encoder.output_dim, config.num_codebooks * config.num_codes)

    def forward(
        self, features: Tensor, feature_lens: Tensor, generator: torch.Generator | None = None
    ) -> BestRqOutput:
        """features (B, T, F), feature_lens (B,) -> what the loss needs; `generator` draws
        the masks and the noise put in their place (the objective seeds it per batch)."""
        c = self.config
        b, t, _ = features.shape
        input_mask = span_mask(
            feature_lens.cpu(), t, mask_prob=c.mask_prob, span_length=c.span_length,
            generator=generator,
        )  # fmt: skip
        noise = torch.randn(features.shape, generator=generator) * c.noise_std
        input_mask, noise = input_mask.to(features.device), noise.to(features)
        codes = self.quantizer(features)
        out, lens = self.encoder(torch.where(input_mask[..., None], noise, features), feature_lens)
        valid = lengths_to_mask(lens, out.size(1))
        masked = fully_masked(input_mask, self.encoder.subsampling_factor) & valid
        logits = self.head(out).view(b, out.size(1), c.num_codebooks, c.num_codes)
        return BestRqOutput(out, lens, logits, codes, masked, valid)


def build_ssl_model(config: SslConfig) -> W2vBert | BestRq:
    """The pre-training model of `config.objective` around a new encoder."""
    encoder = ConformerEncoder(config.encoder)
    if config.objective == "w2v_bert":
        return W2vBert(encoder, config.w2v_bert)
    return BestRq(encoder, config.best_rq)

"""Training objectives: transducer loss, or the attention decoder's label-smoothed
cross-entropy, each plus an optional auxiliary CTC term on the encoder.

The loss of every model kind is a weighted sum of its terms, each with its own weight, and
`model.loss.ctc_weight` is always the CTC term's weight in that sum, never taken away from
another term: transducer + ctc_weight x CTC; cross_entropy_weight x cross-entropy +
ctc_weight x CTC. So the same `ctc_weight` means the same thing for either `model.kind`.

Transducers trained from scratch often sit on a plateau where they emit only what the
predictor guesses, because the encoder has not yet learnt anything. An auxiliary CTC
loss on the encoder, and optionally a CTC-only phase at the start
(`transducer_start_step`), gives the encoder a direct signal and gets past it. Attention
decoders learn to align faster with the same auxiliary CTC loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from asr.config_keys import ConfigError, check_choice, dataclass_from_keys
from asr.data.batch import Batch
from asr.losses.cross_entropy import label_smoothed_cross_entropy
from asr.losses.ctc import ctc_loss
from asr.losses.lattice_choice import LATTICE_IMPLEMENTATIONS
from asr.losses.transducer import batched_transducer_loss, samplewise_transducer_loss
from asr.models.aed import AedOutput, EncoderDecoder
from asr.models.transducer import Transducer, TransducerOutput
from asr.training.ssl_objective import SslLossConfig, SslObjective

TRANSDUCER_LOSSES = {"samplewise": samplewise_transducer_loss, "batched": batched_transducer_loss}
SAMPLEWISE_OPTIONS = ("group_size", "max_group_nodes", "grad_clamp", "lattice")
LOGITS_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def check_ctc_weight(ctc_weight: float) -> None:
    """`model.loss.ctc_weight` of either model kind: the CTC term's weight, at least 0."""
    if not ctc_weight >= 0.0:
        raise ConfigError(f"model.loss.ctc_weight must be >= 0, got {ctc_weight}")


@dataclass(frozen=True)
class TransducerLossConfig:
    """Keys of `model.loss`.

    - `kind`: which transducer loss implementation: `samplewise` (one sample's logits at
      a time, the default) or `batched` (the whole B x T x U x V at once; the reference).
    - `ctc_weight`: weight of the auxiliary CTC loss on the encoder (needs
      `model.ctc_head: true`); the loss is transducer + ctc_weight x CTC.
    - `transducer_start_step`: optimizer steps of CTC-only training before the
      transducer loss is switched on (0: from the start).
    - `group_size`: `samplewise`: samples of similar size per joiner call (at most).
    - `max_group_nodes`: `samplewise`: ... and at most this many padded T x (U+1) nodes
      per call (null: no limit).
    - `logits_dtype`: the precision of the joiner's matmuls, `bfloat16`, `float16` or
      `float32` (null: as autocast), for either kind.
    - `grad_clamp`: `samplewise`: clamp each logit's gradient to [-c, c] (null: no clamp).
    - `lattice`: `samplewise`: `auto` (Triton kernels on CUDA, falling back to PyTorch ops
      with a warning if they fail; PyTorch ops elsewhere), `torch`, or `triton` (the
      kernels or an error). See `asr.losses.samplewise` and `asr.losses.lattice_choice`.
    - `sigma`: a token-and-duration transducer's (`model.joiner.durations` set) logit
      under-normalization: subtracted from every token log-probability of its lattice
      (NeMo's default, 0.05); unused without durations.
    - `omega`: a TDT's share of the plain transducer loss of its token logits, mixed in
      for stability: (1 - omega) x TDT + omega x transducer (NeMo's default, 0.1).
    """

    kind: str = "samplewise"
    ctc_weight: float = 0.3
    transducer_start_step: int = 0
    group_size: int = 1
    max_group_nodes: int | None = None
    logits_dtype: str | None = None
    grad_clamp: float | None = None
    lattice: str = "auto"
    sigma: float = 0.05
    omega: float = 0.1

    def __post_init__(self) -> None:
        check_ctc_weight(self.ctc_weight)
        if not self.sigma >= 0.0:
            raise ConfigError(f"model.loss.sigma must be >= 0, got {self.sigma}")
        if not 0.0 <= self.omega < 1.0:
            raise ConfigError(f"model.loss.omega must be in [0, 1), got {self.omega}")
        check_choice("model.loss.kind", self.kind, sorted(TRANSDUCER_LOSSES))
        check_choice("model.loss.logits_dtype", self.logits_dtype, [*LOGITS_DTYPES, None])
        check_choice("model.loss.lattice", self.lattice, LATTICE_IMPLEMENTATIONS)
        defaults = TransducerLossConfig.__dataclass_fields__
        tuned = [k for k in SAMPLEWISE_OPTIONS if getattr(self, k) != defaults[k].default]
        if self.kind != "samplewise" and tuned:
            raise ConfigError(
                f"model.loss {tuned} apply only to kind=samplewise, not {self.kind!r}"
            )

    def loss_options(self) -> dict[str, Any]:
        """Keyword options for the chosen loss function."""
        options = {"logits_dtype": LOGITS_DTYPES.get(self.logits_dtype)}
        if self.kind == "samplewise":
            options.update({k: getattr(self, k) for k in SAMPLEWISE_OPTIONS})
        return options


class TransducerObjective:
    """Compute the weighted losses of a `Transducer` on a `Batch`.

    Returns a dict with `loss` (what is optimized) and its parts `transducer`, `ctc`
    (each present only when computed), all means over the batch of per-utterance sums.
    """

    def __init__(self, config: TransducerLossConfig) -> None:
        self.config = config
        self._loss_fn = TRANSDUCER_LOSSES[config.kind]
        self._loss_options = config.loss_options()

    def averaged_metrics(self, model: torch.nn.Module) -> tuple[str, ...]:
        """Values averaged over the utterances at validation besides the loss: none
        (the WER is counted from hypotheses)."""
        return ()

    def uses_ctc(self, step: int) -> bool:
        return self.config.ctc_weight > 0 or step < self.config.transducer_start_step

    def parts_without_gradient(self, model: Transducer) -> list[str]:
        """The model parts that some steps leave without a gradient: the predictor and
        joiner during CTC-only warm-up, a CTC head that is never weighted. Data-parallel
        training must know (DDP waits for a gradient of every parameter otherwise)."""
        parts = []
        if self.config.transducer_start_step > 0:
            parts += ["predictor", "joiner"]
        if model.ctc_head is not None and self.config.ctc_weight == 0:
            parts.append("ctc_head")
        return parts

    def __call__(self, model: Transducer, batch: Batch, step: int) -> dict[str, torch.Tensor]:
        cfg = self.config
        out = model(
            batch.features,
            batch.feature_lens,
            batch.tokens,
            batch.token_lens,
            predict=step >= cfg.transducer_start_step,
            ctc=self.uses_ctc(step),
        )
        return self.losses(out, model.joiner, batch, model.blank_id)

    def losses(
        self, out: TransducerOutput, joiner: torch.nn.Module, batch: Batch, blank: int
    ) -> dict[str, torch.Tensor]:
        """The loss terms of a transducer's output on `batch` (`joiner`: the model's, which
        the loss applies a sample at a time)."""
        losses: dict[str, torch.Tensor] = {}
        if out.ctc_log_probs is not None:
            losses["ctc"] = ctc_loss(
                out.ctc_log_probs, out.encoder_lens, batch.tokens, batch.token_lens, blank=blank
            )
        if out.predictor_out is None:
            losses["loss"] = losses["ctc"]
            return losses
        durations = getattr(joiner, "durations", None)
        tdt = {}
        if durations is not None:
            tdt = {"durations": durations, "sigma": self.config.sigma, "omega": self.config.omega}
        losses["transducer"] = self._loss_fn(
            joiner,
            out.encoder_out,
            out.predictor_out,
            batch.tokens,
            out.encoder_lens,
            batch.token_lens,
            blank=blank,
            **self._loss_options,
            **tdt,
        )
        ctc_part = self.config.ctc_weight * losses["ctc"] if "ctc" in losses else 0.0
        losses["loss"] = losses["transducer"] + ctc_part
        return losses


@dataclass(frozen=True)
class AedLossConfig:
    """Keys of `model.loss` for `model.kind: aed`.

    - `label_smoothing`: weight e of the uniform distribution in the decoder's targets.
    - `cross_entropy_weight`: weight of the decoder's cross-entropy; the loss is
      cross_entropy_weight x cross-entropy + ctc_weight x CTC (an AED config of earlier
      versions with ctc_weight w: set this to 1 - w; the default is 1 - 0.3).
    - `ctc_weight`: weight of the auxiliary CTC loss on the encoder (needs
      `model.ctc_head: true`), as for a transducer.
    """

    label_smoothing: float = 0.1
    cross_entropy_weight: float = 0.7
    ctc_weight: float = 0.3

    def __post_init__(self) -> None:
        if not self.cross_entropy_weight > 0.0:
            raise ConfigError(
                f"model.loss.cross_entropy_weight must be > 0, got {self.cross_entropy_weight}"
            )
        check_ctc_weight(self.ctc_weight)
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(
                f"model.loss.label_smoothing must be in [0, 1), got {self.label_smoothing}"
            )


class AedObjective:
    """Compute the weighted losses of an `EncoderDecoder` on a `Batch`: `loss` and its
    parts `cross_entropy`, `ctc` (when weighted), means over the batch of per-utterance sums."""

    def __init__(self, config: AedLossConfig) -> None:
        self.config = config

    def averaged_metrics(self, model: torch.nn.Module) -> tuple[str, ...]:
        """Values averaged over the utterances at validation besides the loss: none
        (the WER is counted from hypotheses)."""
        return ()

    def uses_ctc(self, step: int) -> bool:
        return self.config.ctc_weight > 0

    def parts_without_gradient(self, model: EncoderDecoder) -> list[str]:
        """A CTC head that is never weighted gets no gradient (see the transducer's)."""
        return ["ctc_head"] if model.ctc_head is not None and self.config.ctc_weight == 0 else []

    def __call__(self, model: EncoderDecoder, batch: Batch, step: int) -> dict[str, torch.Tensor]:
        out = model(
            batch.features,
            batch.feature_lens,
            batch.tokens,
            batch.token_lens,
            ctc=self.uses_ctc(step),
        )
        return self.losses(out, batch, model.blank_id)

    def losses(self, out: AedOutput, batch: Batch, blank: int) -> dict[str, torch.Tensor]:
        """The loss terms of an encoder-decoder's output on `batch`."""
        cfg = self.config
        ce = label_smoothed_cross_entropy(
            out.logits, out.targets, label_smoothing=cfg.label_smoothing
        )
        losses = {"cross_entropy": ce, "loss": cfg.cross_entropy_weight * ce}
        if out.ctc_log_probs is not None:
            losses["ctc"] = ctc_loss(
                out.ctc_log_probs, out.encoder_lens, batch.tokens, batch.token_lens, blank=blank
            )
            losses["loss"] = cfg.cross_entropy_weight * ce + cfg.ctc_weight * losses["ctc"]
        return losses


Objective = TransducerObjective | AedObjective | SslObjective


def build_objective(kind: str, loss_cfg: Mapping[str, Any] | None) -> Objective:
    """The objective of a model kind ("transducer", "aed" or "ssl") from its `model.loss`
    keys."""
    if kind == "aed":
        return AedObjective(dataclass_from_keys(AedLossConfig, loss_cfg, "model.loss"))
    if kind == "ssl":
        return SslObjective(dataclass_from_keys(SslLossConfig, loss_cfg, "model.loss"))
    return TransducerObjective(dataclass_from_keys(TransducerLossConfig, loss_cfg, "model.loss"))


def first_full_loss_step(objective: Objective) -> int:
    """The first optimizer step at which every part of the loss runs."""
    if isinstance(objective, TransducerObjective):
        return objective.config.transducer_start_step
    return 0

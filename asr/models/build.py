"""Build a model from a plain config mapping (the Hydra group ``model``, already resolved).

The keys of each part are the fields of its config dataclass (`ConformerConfig`,
`PredictorConfig`, `JoinerConfig`, `DecoderConfig`); `model_config` reads the whole group
into `TransducerConfig` or `AedConfig`, naming any unknown key. Sizes that follow from
other parts (vocabulary size, encoder and predictor widths) are filled in here, so a
config never repeats them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from asr.config_keys import check_choice, dataclass_from_keys
from asr.models.aed import DecoderConfig, EncoderDecoder, TransformerDecoder
from asr.models.conformer import ConformerConfig, ConformerEncoder
from asr.models.ssl import BestRq, SslConfig, W2vBert, build_ssl_model
from asr.models.transducer import Joiner, JoinerConfig, Predictor, PredictorConfig, Transducer
from asr.tokens import BLANK_ID

Model = Transducer | EncoderDecoder
PretrainingModel = W2vBert | BestRq


@dataclass(frozen=True)
class TransducerConfig:
    """``model`` with ``kind: transducer``.

    - `kind`: `transducer` (this) or `aed` (`AedConfig`).
    - `encoder`: the Conformer encoder (`ConformerConfig`).
    - `predictor`: the label-side network (`PredictorConfig`).
    - `joiner`: combines encoder and predictor outputs into logits (`JoinerConfig`).
    - `ctc_head`: a linear CTC output layer on the encoder (for `model.loss.ctc_weight`).
    - `blank_id`: the transducer's blank token id.
    """

    kind: str = "transducer"
    encoder: ConformerConfig = field(default_factory=ConformerConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    joiner: JoinerConfig = field(default_factory=JoinerConfig)
    ctc_head: bool = True
    blank_id: int = BLANK_ID


@dataclass(frozen=True)
class AedConfig:
    """``model`` with ``kind: aed``.

    - `kind`: `aed` (this) or `transducer` (`TransducerConfig`).
    - `encoder`: the Conformer encoder (`ConformerConfig`).
    - `decoder`: the Transformer decoder with a KV cache (`DecoderConfig`).
    - `ctc_head`: a linear CTC output layer on the encoder (for `model.loss.ctc_weight`).
    """

    kind: str = "aed"
    encoder: ConformerConfig = field(default_factory=ConformerConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    ctc_head: bool = True


MODEL_CONFIGS = {"transducer": TransducerConfig, "aed": AedConfig, "ssl": SslConfig}


def model_kind(cfg: Mapping[str, Any]) -> str:
    """The ``model`` group's ``kind``; without one, `TransducerConfig`'s (``transducer``)."""
    return cfg.get("kind", TransducerConfig.kind)


def model_config(cfg: Mapping[str, Any]) -> TransducerConfig | AedConfig | SslConfig:
    """The ``model`` group read into its typed config; an unknown key or value is an error
    naming it and the valid ones. A ``loss`` key belongs to the objective and is ignored."""
    if not isinstance(cfg, Mapping):
        raise TypeError(f"config section model must be a mapping, got {cfg!r}")
    kind = model_kind(cfg)
    check_choice("model.kind", kind, MODEL_CONFIGS)
    parts = {key: value for key, value in cfg.items() if key != "loss"}
    return dataclass_from_keys(MODEL_CONFIGS[kind], parts, "model")


def build_model(
    cfg: Mapping[str, Any] | TransducerConfig | AedConfig | SslConfig, vocab_size: int | None
) -> Model | PretrainingModel:
    """cfg like ``{"kind": "transducer", "encoder": {...}, "predictor": {...},
    "joiner": {"joint_dim": 256}, "ctc_head": True}`` -> a Transducer over ``vocab_size``;
    ``{"kind": "aed", "encoder": {...}, "decoder": {...}, "ctc_head": True}`` -> an
    EncoderDecoder; ``{"kind": "ssl", "objective": "best_rq", ...}`` -> the pre-training
    model (no vocabulary)."""
    config = cfg if dataclasses.is_dataclass(cfg) else model_config(cfg)
    if isinstance(config, SslConfig):
        return build_ssl_model(config)
    if vocab_size is None:
        raise ValueError(f"model.kind={config.kind} needs a tokenizer's vocabulary size")
    # Parts are created in a fixed order: it decides which random numbers initialize which.
    encoder = ConformerEncoder(config.encoder)
    if isinstance(config, AedConfig):
        decoder = TransformerDecoder(
            config.decoder, vocab_size=vocab_size, encoder_dim=encoder.output_dim
        )
        return EncoderDecoder(encoder, decoder, ctc_head=_ctc_head(config, encoder, vocab_size))
    predictor = Predictor(config.predictor, vocab_size=vocab_size, blank_id=config.blank_id)
    joiner = Joiner(
        encoder_dim=encoder.output_dim,
        predictor_dim=predictor.output_dim,
        vocab_size=vocab_size,
        joint_dim=config.joiner.joint_dim,
        durations=config.joiner.durations,
    )
    ctc_head = _ctc_head(config, encoder, vocab_size)
    return Transducer(encoder, predictor, joiner, ctc_head=ctc_head, blank_id=config.blank_id)


def _ctc_head(
    config: TransducerConfig | AedConfig, encoder: ConformerEncoder, vocab_size: int
) -> nn.Linear | None:
    return nn.Linear(encoder.output_dim, vocab_size) if config.ctc_head else None


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (trainable or not; buffers excluded)."""
    return sum(p.numel() for p in model.parameters())

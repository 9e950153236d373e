"""Build a model from a plain config mapping (the Hydra group ``model``, already resolved).

Sizes that follow from other parts (vocabulary size, encoder and predictor widths, blank
id) are filled in here, so a config never repeats them. Unknown keys fail loudly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from asr.models.aed import EncoderDecoder, TransformerDecoder
from asr.models.conformer import ConformerEncoder
from asr.models.transducer import Joiner, Predictor, Transducer

Model = Transducer | EncoderDecoder

_TOP_KEYS = ("kind", "encoder", "predictor", "joiner", "ctc_head", "blank_id")
_AED_TOP_KEYS = ("kind", "encoder", "decoder", "ctc_head")
_ENCODER_KEYS = (
    "input_dim",
    "d_model",
    "num_layers",
    "num_heads",
    "ff_expansion",
    "conv_kernel_size",
    "subsampling_factor",
    "dropout",
    "conv_norm",
    "subsampling_channels",
    "pad_frames_to",
)
_PREDICTOR_KEYS = ("kind", "embed_dim", "hidden_dim", "num_layers", "context_size", "dropout")
_JOINER_KEYS = ("joint_dim",)
_DECODER_KEYS = (
    "d_model",
    "num_layers",
    "num_heads",
    "ff_expansion",
    "dropout",
    "positions",
    "max_positions",
    "tie_embeddings",
)
_MODEL_KINDS = ("transducer", "aed")


def _checked(section: str, cfg: Any, valid: Iterable[str]) -> dict[str, Any]:
    """``cfg`` as a dict after checking that every key is in ``valid``."""
    if not isinstance(cfg, Mapping):
        raise TypeError(f"config section {section!r} must be a mapping, got {type(cfg).__name__}")
    valid = tuple(valid)
    for key in cfg:
        if key not in valid:
            raise ValueError(
                f"unknown config key {section}.{key}; valid keys: {', '.join(valid)}"
                " (vocab_size, widths and blank_id are filled in by build_model)"
            )
    return dict(cfg)


def build_model(cfg: Mapping[str, Any], vocab_size: int) -> Model:
    """cfg like ``{"kind": "transducer", "encoder": {...}, "predictor": {...},
    "joiner": {"joint_dim": 256}, "ctc_head": True}`` -> a Transducer over ``vocab_size``;
    ``{"kind": "aed", "encoder": {...}, "decoder": {...}, "ctc_head": True}`` -> an
    EncoderDecoder."""
    kind = cfg.get("kind", "transducer") if isinstance(cfg, Mapping) else None
    if kind not in _MODEL_KINDS:
        raise ValueError(f"unknown model.kind {kind!r}; valid kinds: {', '.join(_MODEL_KINDS)}")
    if kind == "aed":
        return _build_aed(cfg, vocab_size)
    cfg = _checked("model", cfg, _TOP_KEYS)
    blank_id = int(cfg.get("blank_id", 0))
    encoder = ConformerEncoder(**_checked("model.encoder", cfg.get("encoder", {}), _ENCODER_KEYS))
    pred_cfg = _checked("model.predictor", cfg.get("predictor", {}), _PREDICTOR_KEYS)
    predictor = Predictor(vocab_size=vocab_size, blank_id=blank_id, **pred_cfg)
    joiner_cfg = _checked("model.joiner", cfg.get("joiner", {}), _JOINER_KEYS)
    joiner = Joiner(
        encoder_dim=encoder.output_dim,
        predictor_dim=predictor.output_dim,
        vocab_size=vocab_size,
        joint_dim=joiner_cfg.get("joint_dim", 256),
    )
    ctc_head = nn.Linear(encoder.output_dim, vocab_size) if cfg.get("ctc_head", False) else None
    return Transducer(encoder, predictor, joiner, ctc_head=ctc_head, blank_id=blank_id)


def _build_aed(cfg: Mapping[str, Any], vocab_size: int) -> EncoderDecoder:
    cfg = _checked("model", cfg, _AED_TOP_KEYS)
    encoder = ConformerEncoder(**_checked("model.encoder", cfg.get("encoder", {}), _ENCODER_KEYS))
    decoder = TransformerDecoder(
        vocab_size=vocab_size,
        encoder_dim=encoder.output_dim,
        **_checked("model.decoder", cfg.get("decoder", {}), _DECODER_KEYS),
    )
    ctc_head = nn.Linear(encoder.output_dim, vocab_size) if cfg.get("ctc_head", False) else None
    return EncoderDecoder(encoder, decoder, ctc_head=ctc_head)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (trainable or not; buffers excluded)."""
    return sum(p.numel() for p in model.parameters())

"""The pre-training models around the Conformer encoder: shapes, masks within lengths,
gradients to every trained parameter, and weights that load into a supervised encoder."""

from __future__ import annotations

import pytest
import torch

from asr.config_keys import ConfigError
from asr.losses.ssl import (
    contrastive_loss,
    diversity_loss,
    masked_prediction_loss,
    sample_distractors,
)
from asr.models.conformer import ConformerConfig, ConformerEncoder
from asr.models.ssl import BestRq, BestRqConfig, SslConfig, W2vBert, W2vBertConfig, build_ssl_model

ENCODER = ConformerConfig(
    input_dim=16, d_model=32, num_layers=4, num_heads=2, conv_kernel_size=5, dropout=0.0
)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    lens = torch.tensor([400, 250, 97])
    return torch.randn(3, 400, 16, generator=generator), lens


def test_w2v_bert_masks_within_lengths_and_trains_every_part() -> None:
    torch.manual_seed(0)
    config = W2vBertConfig(code_dim=24, num_codes=12, groups=2, mask_prob=0.1, span_length=4)
    model = W2vBert(ConformerEncoder(ENCODER), config)
    assert model.split == 2
    features, lens = _batch()
    out = model(features, lens, torch.Generator().manual_seed(1))
    t = out.context.size(1)  # 100 frames, padded to a multiple of 8: 104
    assert out.context.shape == (3, t, 24) and out.targets.shape == (3, t, 24)
    assert out.codes.shape == (3, t, 2) and out.logits.shape == (3, t, 2, 12)
    assert not (out.masked & ~out.valid).any() and out.masked.sum(dim=1).min() > 0
    assert out.valid.sum(dim=1).tolist() == [100, 63, 25]
    assert out.encoder_out.shape == (3, 100, ENCODER.d_model)  # as the encoder returns it
    assert out.encoder_lens.tolist() == [100, 63, 25]
    assert not out.encoder_out[2, 25:].any()  # zero beyond each length
    distractors, valid = sample_distractors(out.masked, 5, torch.Generator().manual_seed(2))
    contrastive, _ = contrastive_loss(out.context, out.targets, out.masked, distractors, valid)
    mlm, _ = masked_prediction_loss(out.logits, out.codes, out.masked)
    (contrastive + 0.1 * diversity_loss(out.mean_probs) + mlm).backward()
    missing = [
        n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0
    ]
    assert missing == []


def test_best_rq_targets_only_fully_masked_frames_and_has_no_trainable_quantizer() -> None:
    torch.manual_seed(0)
    config = BestRqConfig(mask_prob=0.05, span_length=8, num_codes=64, num_codebooks=2, code_dim=8)
    model = BestRq(ConformerEncoder(ENCODER), config)
    assert not any(name.startswith("quantizer") for name, _ in model.named_parameters())
    features, lens = _batch()
    out = model(features, lens, torch.Generator().manual_seed(1))
    assert out.logits.shape == (3, 100, 2, 64) and out.codes.shape == (3, 100, 2)
    assert not (out.masked & ~out.valid).any() and out.masked.any()
    assert out.encoder_out.shape == (3, 100, ENCODER.d_model)
    assert out.encoder_lens.tolist() == out.valid.sum(dim=1).tolist()
    # the same input gives the same targets, whatever the mask
    again = model(features, lens, torch.Generator().manual_seed(5))
    assert torch.equal(again.codes, out.codes) and not torch.equal(again.masked, out.masked)
    loss, accuracy = masked_prediction_loss(out.logits, out.codes, out.masked)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert 0.0 <= float(accuracy) <= 1.0


@pytest.mark.parametrize("objective", ["w2v_bert", "best_rq"])
def test_a_pre_trained_encoder_loads_into_a_supervised_one(objective: str) -> None:
    model = build_ssl_model(SslConfig(objective=objective, encoder=ENCODER))
    encoder = ConformerEncoder(ENCODER)
    prefix = "encoder."
    weights = {k[len(prefix) :]: v for k, v in model.state_dict().items() if k.startswith(prefix)}
    encoder.load_state_dict(weights)  # strict: every key of the encoder, nothing else
    for name, value in encoder.state_dict().items():
        assert torch.equal(value, weights[name])


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="model.objective"):
        SslConfig(objective="hubert")
    with pytest.raises(ConfigError, match="contrastive_layers=4"):
        SslConfig(encoder=ENCODER, w2v_bert=W2vBertConfig(contrastive_layers=4))

import pytest
import torch

from asr.models.build import build_model, count_parameters
from asr.models.transducer import Transducer

VOCAB = 32
ENCODER = dict(
    input_dim=40,
    d_model=24,
    num_layers=2,
    num_heads=4,
    ff_expansion=2,
    conv_kernel_size=5,
    subsampling_factor=8,
    dropout=0.0,
    conv_norm="batch_norm",
)


def _cfg(**overrides) -> dict:
    cfg = {
        "kind": "transducer",
        "encoder": dict(ENCODER),
        "predictor": {"kind": "lstm", "embed_dim": 10, "hidden_dim": 12, "num_layers": 1},
        "joiner": {"joint_dim": 14},
        "ctc_head": True,
    }
    return {**cfg, **overrides}


def _linear(i: int, o: int) -> int:
    return i * o + o


def _expected_encoder_params(d: int, layers: int, e: int, k: int, f: int, convs: int) -> int:
    c = d  # subsampling channels default to d_model
    for _ in range(convs):
        f = (f - 1) // 2 + 1
    subsampling = (9 * c + c) + (convs - 1) * (9 * c * c + c) + _linear(c * f, d)
    ffn = 2 * d + _linear(d, e * d) + _linear(e * d, d)
    attn = 2 * d + _linear(d, 3 * d) + d * d + _linear(d, d) + 2 * d  # norm, qkv, pos, out, u/v
    conv = 2 * d + _linear(d, 2 * d) + (d * k + d) + 2 * d + _linear(d, d)
    return subsampling + layers * (2 * ffn + attn + conv + 2 * d)


def test_parameter_count_of_small_config():
    model = build_model(_cfg(), VOCAB)
    assert isinstance(model, Transducer)
    encoder = _expected_encoder_params(24, 2, 2, 5, 40, 3)
    predictor = VOCAB * 10 + 4 * 12 * (10 + 12) + 2 * 4 * 12  # embedding + LSTM
    joiner = _linear(24, 14) + _linear(12, 14) + _linear(14, VOCAB)
    ctc = _linear(24, VOCAB)
    assert count_parameters(model.encoder) == encoder
    assert count_parameters(model) == encoder + predictor + joiner + ctc


def test_sizes_are_filled_in():
    model = build_model(_cfg(ctc_head=False, blank_id=3), VOCAB)
    assert model.ctc_head is None
    assert model.vocab_size == VOCAB and model.blank_id == model.predictor.blank_id == 3
    assert model.joiner.enc_proj.in_features == model.encoder.output_dim == 24
    assert model.joiner.pred_proj.in_features == model.predictor.output_dim == 12
    feats = torch.randn(2, 50, 40)
    enc, lens = model.encode(feats, torch.tensor([50, 20]))
    assert enc.shape == (2, 7, 24) and lens.tolist() == [7, 3]


def test_stateless_predictor_config():
    pred = {"kind": "stateless", "embed_dim": 10, "hidden_dim": 12, "context_size": 2}
    model = build_model(_cfg(predictor=pred), VOCAB)
    assert model.predictor.kind == "stateless" and model.predictor.context_size == 2


@pytest.mark.parametrize(
    ("cfg", "names"),
    [
        (_cfg(encoder={**ENCODER, "d_modle": 8}), ["model.encoder.d_modle", "d_model"]),
        (_cfg(joiner={"joint_dim": 8, "vocab_size": 9}), ["model.joiner.vocab_size", "joint_dim"]),
        (_cfg(decoder={}), ["model.decoder", "predictor"]),
        (_cfg(kind="rnn"), ["'rnn'", "transducer"]),
    ],
)
def test_unknown_key_or_kind_is_named(cfg, names):
    with pytest.raises(ValueError) as err:
        build_model(cfg, VOCAB)
    for name in names:
        assert name in str(err.value)


def test_unknown_predictor_kind_is_named():
    pred = {"kind": "gru", "embed_dim": 10, "hidden_dim": 12}
    with pytest.raises(
        ValueError, match=r"model.predictor.kind='gru' is unknown; valid: \['lstm', 'stateless'\]"
    ):
        build_model(_cfg(predictor=pred), VOCAB)


@pytest.mark.parametrize("kind", ["transducer", "aed"])
def test_ctc_log_probs_are_normalized_and_a_missing_head_is_named(kind):
    if kind == "aed":
        aed = {"kind": "aed", "encoder": dict(ENCODER)}
        aed["decoder"] = {"d_model": 24, "num_layers": 1, "num_heads": 4}
        cfgs = [{**aed, "ctc_head": True}, {**aed, "ctc_head": False}]
    else:
        cfgs = [_cfg(ctc_head=True), _cfg(ctc_head=False)]
    with_head, without = (build_model(c, VOCAB) for c in cfgs)
    encoder_out = torch.randn(2, 7, ENCODER["d_model"])
    log_probs = with_head.ctc_log_probs(encoder_out)
    assert log_probs.shape == (2, 7, VOCAB)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 7))
    name = type(without).__name__
    with pytest.raises(RuntimeError, match=f"this {name} has no CTC head.*model.ctc_head"):
        without.ctc_log_probs(encoder_out)

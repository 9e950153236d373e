import pytest
import torch

from asr.models.conformer import ConformerConfig, ConformerEncoder
from asr.models.transducer import Joiner, Predictor, PredictorConfig, Transducer

V = 11


def _predictor(kind: str, **kwargs) -> Predictor:
    torch.manual_seed(0)
    config = PredictorConfig(
        kind=kind, **{"embed_dim": 12, "hidden_dim": 16, "num_layers": 2, **kwargs}
    )
    return Predictor(config, vocab_size=V, blank_id=0).eval()


PREDICTORS = [("lstm", {}), ("stateless", {"context_size": 1}), ("stateless", {"context_size": 3})]


@pytest.mark.parametrize(("kind", "kwargs"), PREDICTORS)
def test_predictor_shape_and_start_symbol(kind, kwargs):
    pred = _predictor(kind, **kwargs)
    tokens = torch.randint(1, V, (3, 5))
    out = pred(tokens, torch.tensor([5, 3, 0]))
    assert out.shape == (3, 6, pred.output_dim) and pred.output_dim == 16
    # Position 0 sees only blank: the same for every sample, whatever the tokens.
    assert torch.allclose(out[0, 0], out[1, 0]) and torch.allclose(out[0, 0], out[2, 0])


@pytest.mark.parametrize(("kind", "kwargs"), PREDICTORS)
def test_predictor_is_causal(kind, kwargs):
    pred = _predictor(kind, **kwargs)
    tokens = torch.randint(1, V, (1, 7))
    lens = torch.tensor([7])
    out = pred(tokens, lens)
    for k in range(7):
        changed = tokens.clone()
        changed[0, k] = 1 + tokens[0, k] % (V - 1)  # a different non-blank id
        out2 = pred(changed, lens)
        # Position u sees tokens < u: positions 0..k are untouched, k+1 changes.
        assert torch.equal(out[:, : k + 1], out2[:, : k + 1]), k
        assert not torch.allclose(out[:, k + 1], out2[:, k + 1]), k


def test_stateless_predictor_context_is_limited():
    pred = _predictor("stateless", context_size=2)
    tokens = torch.randint(1, V, (1, 6))
    changed = tokens.clone()
    changed[0, 1] = 1 + tokens[0, 1] % (V - 1)
    out, out2 = pred(tokens, torch.tensor([6])), pred(changed, torch.tensor([6]))
    # Token 1 is seen by positions 2 and 3 only (context of 2 tokens).
    assert torch.equal(out[:, :2], out2[:, :2]) and torch.equal(out[:, 4:], out2[:, 4:])
    assert not torch.allclose(out[:, 2:4], out2[:, 2:4])


@pytest.mark.parametrize(("kind", "kwargs"), PREDICTORS)
def test_predictor_step_reproduces_forward(kind, kwargs):
    pred = _predictor(kind, **kwargs)
    tokens = torch.randint(1, V, (3, 6))
    full = pred(tokens, torch.tensor([6, 6, 6]))
    state = pred.init_state(3, "cpu")
    last = torch.zeros(3, dtype=torch.long)  # blank starts
    for u in range(7):
        out, state = pred.step(last, state)
        assert torch.allclose(out, full[:, u], atol=1e-6), u
        if u < 6:
            last = tokens[:, u]


def test_predictor_rejects_bad_options():
    with pytest.raises(ValueError, match="model.predictor.kind='gru' is unknown"):
        PredictorConfig(embed_dim=4, hidden_dim=4, kind="gru")
    with pytest.raises(ValueError, match="blank_id"):
        Predictor(PredictorConfig(embed_dim=4, hidden_dim=4), vocab_size=5, blank_id=5)


def test_joiner_broadcast_equals_explicit_loops():
    torch.manual_seed(0)
    joiner = Joiner(encoder_dim=6, predictor_dim=5, joint_dim=7, vocab_size=V)
    enc, pred = torch.randn(2, 4, 6), torch.randn(2, 3, 5)
    logits = joiner(enc.unsqueeze(2), pred.unsqueeze(1))
    assert logits.shape == (2, 4, 3, V)
    for b in range(2):
        for t in range(4):
            for u in range(3):
                hidden = torch.tanh(joiner.enc_proj(enc[b, t]) + joiner.pred_proj(pred[b, u]))
                assert torch.allclose(logits[b, t, u], joiner.output(hidden), atol=1e-6)
    e, p = joiner.project_encoder(enc[:, 1]), joiner.project_predictor(pred[:, 2])
    assert torch.allclose(joiner.joint(e, p), logits[:, 1, 2], atol=1e-6)


def _transducer(ctc: bool) -> Transducer:
    torch.manual_seed(0)
    encoder = ConformerEncoder(ConformerConfig(input_dim=20, d_model=16, num_layers=1, num_heads=2))
    predictor = _predictor("lstm")
    joiner = Joiner(encoder_dim=16, predictor_dim=16, joint_dim=8, vocab_size=V)
    head = torch.nn.Linear(16, V) if ctc else None
    return Transducer(encoder, predictor, joiner, ctc_head=head, blank_id=0).eval()


def test_transducer_composition():
    model = _transducer(ctc=True)
    assert model.vocab_size == V and model.blank_id == 0
    feats, lens = torch.randn(2, 30, 20), torch.tensor([30, 17])
    enc, enc_lens = model.encode(feats, lens)
    assert enc.shape == (2, 8, 16) and enc_lens.tolist() == [8, 5]
    log_probs = model.ctc_log_probs(enc)
    assert log_probs.shape == (2, 8, V)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(2, 8))
    tokens = torch.randint(1, V, (2, 4))
    out = model(feats, lens, tokens, torch.tensor([4, 2]), ctc=True)
    assert torch.equal(out.encoder_out, enc) and torch.equal(out.encoder_lens, enc_lens)
    assert out.predictor_out.shape == (2, 5, 16)
    assert torch.equal(out.ctc_log_probs, log_probs)
    warm_up = model(feats, lens, tokens, torch.tensor([4, 2]), predict=False)
    assert warm_up.predictor_out is None and warm_up.ctc_log_probs is None


def test_transducer_without_ctc_head_explains():
    model = _transducer(ctc=False)
    with pytest.raises(RuntimeError, match="ctc_head"):
        model.ctc_log_probs(torch.randn(1, 3, 16))


def test_transducer_checks_vocabulary_agreement():
    predictor = _predictor("lstm")
    joiner = Joiner(encoder_dim=4, predictor_dim=16, joint_dim=4, vocab_size=V + 1)
    with pytest.raises(ValueError, match="vocab_size"):
        Transducer(torch.nn.Identity(), predictor, joiner)
    joiner = Joiner(encoder_dim=4, predictor_dim=16, joint_dim=4, vocab_size=V)
    with pytest.raises(ValueError, match="blank_id"):
        Transducer(torch.nn.Identity(), predictor, joiner, blank_id=V)

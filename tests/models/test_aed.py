"""The attention encoder-decoder: decoder I/O, KV cache, padding, building from config."""

import pytest
import torch

from asr.losses.cross_entropy import label_smoothed_cross_entropy
from asr.models.aed import DecoderConfig, EncoderDecoder
from asr.models.build import build_model, count_parameters
from asr.tokens import BOS_ID, EOS_ID, IGNORE_INDEX

VOCAB = 40


def tiny_aed(positions: str = "sinusoidal", decoder_dim: int = 48, **decoder) -> EncoderDecoder:
    torch.manual_seed(0)
    cfg = {
        "kind": "aed",
        "encoder": {"input_dim": 20, "d_model": 32, "num_layers": 2, "num_heads": 2}
        | {"conv_kernel_size": 7, "dropout": 0.0},
        "decoder": {"d_model": decoder_dim, "num_layers": 2, "num_heads": 4, "dropout": 0.0}
        | {"positions": positions}
        | decoder,
        "ctc_head": True,
    }
    return build_model(cfg, VOCAB).double().eval()


def random_inputs(lens: list[int], u: int = 6) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    feats = torch.randn(len(lens), max(lens), 20, dtype=torch.double)
    feat_lens = torch.tensor(lens)
    feats = feats.masked_fill(torch.arange(max(lens))[None, :, None] >= feat_lens[:, None, None], 0)
    tokens = torch.randint(4, VOCAB, (len(lens), u))
    return feats, feat_lens, tokens


def test_decoder_reads_bos_plus_tokens_and_predicts_tokens_plus_eos() -> None:
    model = tiny_aed()
    tokens = torch.tensor([[5, 6, 7], [8, 9, 0]])
    inputs, targets = model.decoder_io(tokens, torch.tensor([3, 2]))
    assert inputs.tolist() == [[BOS_ID, 5, 6, 7], [BOS_ID, 8, 9, EOS_ID]]
    assert targets.tolist() == [[5, 6, 7, EOS_ID], [8, 9, EOS_ID, IGNORE_INDEX]]


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_incremental_steps_with_the_kv_cache_equal_the_full_forward(positions: str) -> None:
    model = tiny_aed(positions)
    feats, feat_lens, tokens = random_inputs([90, 60, 33])
    enc, enc_lens = model.encode(feats, feat_lens)
    inputs, _ = model.decoder_io(tokens, torch.tensor([6, 6, 6]))
    full = model.decoder(inputs, enc, enc_lens)  # (B, U+1, V)
    state = model.decoder.init_state(enc, enc_lens)
    for u in range(inputs.size(1)):
        logits, state = model.decoder.step(inputs[:, u], state)
        torch.testing.assert_close(logits, full[:, u], rtol=0, atol=1e-10)
    assert state.length == inputs.size(1)


def test_future_tokens_do_not_change_earlier_positions() -> None:
    model = tiny_aed()
    feats, feat_lens, tokens = random_inputs([50, 50])
    enc, enc_lens = model.encode(feats, feat_lens)
    changed = tokens.clone()
    changed[:, 3:] = torch.randint(4, VOCAB, changed[:, 3:].shape)
    a = model.decoder(tokens, enc, enc_lens)
    b = model.decoder(changed, enc, enc_lens)
    torch.testing.assert_close(a[:, :3], b[:, :3], rtol=0, atol=0)
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_the_decoder_never_attends_to_padded_encoder_frames() -> None:
    model = tiny_aed()
    feats, feat_lens, tokens = random_inputs([80, 41, 23])
    enc, enc_lens = model.encode(feats, feat_lens)
    garbage = enc.clone()
    pad = torch.arange(enc.size(1))[None, :] >= enc_lens[:, None]
    assert pad.any()
    garbage[pad] = 1e3 * torch.randn(int(pad.sum()), enc.size(2), dtype=enc.dtype)
    inputs, _ = model.decoder_io(tokens, torch.tensor([6, 4, 2]))
    torch.testing.assert_close(
        model.decoder(inputs, garbage, enc_lens),
        model.decoder(inputs, enc, enc_lens),
        rtol=0,
        atol=0,
    )
    # ... and through the whole model: padded feature frames change nothing either
    noisy = feats + 50 * (torch.arange(feats.size(1))[None, :, None] >= feat_lens[:, None, None])
    logits_a = model(feats, feat_lens, tokens, torch.tensor([6, 4, 2])).logits
    logits_b = model(noisy, feat_lens, tokens, torch.tensor([6, 4, 2])).logits
    torch.testing.assert_close(logits_a, logits_b, rtol=0, atol=1e-10)


def test_a_projection_maps_the_encoder_width_and_embeddings_are_tied() -> None:
    model = tiny_aed(decoder_dim=48)
    assert model.decoder.memory_proj is not None  # encoder 32 -> decoder 48
    assert model.decoder.output is None  # the output layer is the embedding matrix
    same = tiny_aed(decoder_dim=32, tie_embeddings=False)
    assert same.decoder.memory_proj is None and same.decoder.output is not None
    assert count_parameters(same) > count_parameters(tiny_aed(decoder_dim=32))


def test_learned_positions_refuse_to_run_past_their_table() -> None:
    model = tiny_aed("learned", max_positions=4)
    feats, feat_lens, tokens = random_inputs([40], u=6)
    enc, enc_lens = model.encode(feats, feat_lens)
    with pytest.raises(ValueError, match="max_positions=4"):
        model.decoder(tokens, enc, enc_lens)


def test_bad_decoder_configs_name_the_key() -> None:
    with pytest.raises(ValueError, match="model.decoder.width"):
        build_model({"kind": "aed", "decoder": {"width": 3}}, VOCAB)
    with pytest.raises(ValueError, match="model.predictor"):
        build_model({"kind": "aed", "predictor": {}}, VOCAB)
    with pytest.raises(ValueError, match="model.decoder.positions='rotary' is unknown"):
        DecoderConfig(positions="rotary")


def test_label_smoothed_cross_entropy_sums_per_utterance_and_skips_padding() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, dtype=torch.double)
    targets = torch.tensor([[1, 2, 3], [4, IGNORE_INDEX, IGNORE_INDEX]])
    log_probs = logits.log_softmax(-1)
    e = 0.1
    expected = []
    for b, n in ((0, 3), (1, 1)):
        nll = -log_probs[b, torch.arange(n), targets[b, :n]]
        uniform = -log_probs[b, :n].mean(-1)
        expected.append(((1 - e) * nll + e * uniform).sum())
    got = label_smoothed_cross_entropy(logits, targets, label_smoothing=e, reduction="none")
    torch.testing.assert_close(got, torch.stack(expected))
    mean = label_smoothed_cross_entropy(logits, targets, label_smoothing=e)
    torch.testing.assert_close(mean, torch.stack(expected).mean())
    with pytest.raises(ValueError, match="label_smoothing"):
        label_smoothed_cross_entropy(logits, targets, label_smoothing=1.0)

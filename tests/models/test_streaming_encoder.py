"""The streaming Conformer: no output frame depends on audio after its chunk (each part
alone and the whole encoder, fp32 and bf16 autocast, three chunk sizes), the check itself
catches a part made non-causal, and chunk-by-chunk `step` computes what the whole
utterance computes through the same masks."""

import dataclasses
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from asr.config_keys import ConfigError
from asr.models.attention import lengths_to_mask, relative_positions, sinusoids
from asr.models.conformer import (
    Chunking,
    ConformerConfig,
    ConformerEncoder,
    ConvModule,
    StreamingConfig,
    chunk_attention_mask,
)

FACTOR = 8
CHUNKS = (1, 2, 4)
STREAMING = StreamingConfig(chunk_sizes=(*CHUNKS, -1), left_contexts=(3, 8))
# The shipped choices that change what a chunk sees: each chunk subsampled alone, or with
# the previous chunk's last frames (the subsampling cache); a causal running mean.
VARIANTS = {
    "chunked subsampling": {},
    "subsampling cache": {"subsampling_cache": True},
    "running mean": {"running_mean_frames": 10},
}
Encode = Callable[[Tensor, Tensor], Tensor]  # features (B, T, F), lens -> (B, T', D)
# Rounding, not leaks: cutting the future changes tensor shapes, so kernels may sum in
# another order (measured: at most 7e-7 in fp32 and one bf16 step, 3.9e-3, at magnitude 1).
# Every non-causal variant below moves outputs by 4.6e-2 or more.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _encoder(
    conv_norm: str = "batch_norm",
    feature_stats: str | None = "stats",
    subsampling_cache: bool = False,
    running_mean_frames: int = 0,
) -> ConformerEncoder:
    torch.manual_seed(0)
    streaming = dataclasses.replace(STREAMING, subsampling_cache=subsampling_cache)
    config = ConformerConfig(
        input_dim=16,
        d_model=32,
        num_layers=2,
        num_heads=2,
        conv_kernel_size=5,
        subsampling_factor=FACTOR,
        subsampling_channels=8,
        conv_norm=conv_norm,
        dropout=0.0,
        feature_stats=feature_stats,
        running_mean_frames=running_mean_frames,
        streaming=streaming,
    )
    encoder = ConformerEncoder(config)
    if feature_stats is not None:
        encoder.set_feature_stats(torch.randn(16), torch.rand(16) + 0.5)
    # Give batch norm running statistics that are not the identity.
    for module in encoder.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
    return encoder.eval()


def _leaked(encode: Encode, chunk_frames: int, in_per_out: int, dtype: torch.dtype) -> float:
    """The largest change in output frames before a chunk edge when the input after it
    (in input frames: edge * in_per_out) is replaced by noise or cut off."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 14 * chunk_frames * in_per_out, 16, generator=g)
    lens = torch.tensor([x.size(1), x.size(1) - 5])
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16) if dtype == torch.bfloat16 else nullcontext()
    )
    worst = 0.0
    with torch.no_grad(), autocast:
        reference = encode(x, lens).float()
        for edge in (chunk_frames, 3 * chunk_frames, 7 * chunk_frames):
            cut = edge * in_per_out
            noisy = x.clone()
            noisy[:, cut:] = torch.randn(noisy[:, cut:].shape, generator=g) * 3
            shorter = x[:, :cut]
            for changed, changed_lens in ((noisy, lens), (shorter, lens.clamp(max=cut))):
                out = encode(changed, changed_lens).float()
                worst = max(worst, (out[:, :edge] - reference[:, :edge]).abs().max().item())
    return worst


def _parts(encoder: ConformerEncoder, chunk: int) -> dict[str, tuple[Encode, int]]:
    """Each part of the streaming encoder as features -> frames, with input frames per
    output frame (the subsampling factor, or 1 for parts after subsampling)."""
    layer = encoder.layers[0]
    chunking = Chunking(chunk, 3)

    def attention(x: Tensor, lens: Tensor) -> Tensor:
        pos_emb = relative_positions(x.size(1), x.size(2) * 2)
        h = x.repeat(1, 1, 2)  # 16 -> 32 features: the layer's width
        mask = lengths_to_mask(lens, x.size(1))
        return layer.attn(h, pos_emb, mask, chunk_attention_mask(x.size(1), chunking))

    def convolution(x: Tensor, lens: Tensor) -> Tensor:
        return layer.conv(x.repeat(1, 1, 2), lengths_to_mask(lens, x.size(1)))[0]

    def positions(x: Tensor, lens: Tensor) -> Tensor:
        return relative_positions(x.size(1), 32)[x.size(1) - 1 :][None].expand(x.size(0), -1, -1)

    def subsampling(x: Tensor, lens: Tensor) -> Tensor:
        return encoder.layer_inputs(x, lens, chunking).x

    def normalization(x: Tensor, lens: Tensor) -> Tensor:
        return encoder.normalize(x, lens)[0]

    def whole(x: Tensor, lens: Tensor) -> Tensor:
        return encoder(x, lens, chunking)[0]

    return {
        "subsampling": (subsampling, FACTOR),
        "normalization": (normalization, 1),
        "positional encoding": (positions, 1),
        "attention": (attention, 1),
        "convolution": (convolution, 1),
        "encoder": (whole, FACTOR),
    }


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("conv_norm", ["batch_norm", "layer_norm"])
def test_no_part_sees_the_future(chunk, dtype, conv_norm, variant):
    encoder = _encoder(conv_norm, **VARIANTS[variant])
    for name, (encode, in_per_out) in _parts(encoder, chunk).items():
        assert _leaked(encode, chunk, in_per_out, dtype) <= TOLERANCE[dtype], name


def _leaky_parts(encoder: ConformerEncoder, chunk: int) -> dict[str, tuple[Encode, int]]:
    """Each part made non-causal the way it could go wrong."""
    layer = encoder.layers[0]
    symmetric = ConvModule(32, 5, 0.0, "layer_norm", causal=False).eval()

    def attention_without_chunks(x: Tensor, lens: Tensor) -> Tensor:
        pos_emb = relative_positions(x.size(1), 32)
        return layer.attn(x.repeat(1, 1, 2), pos_emb, lengths_to_mask(lens, x.size(1)))

    def symmetric_convolution(x: Tensor, lens: Tensor) -> Tensor:
        return symmetric(x.repeat(1, 1, 2), lengths_to_mask(lens, x.size(1)))[0]

    def positions_from_the_end(x: Tensor, lens: Tensor) -> Tensor:
        pos = torch.arange(x.size(1), dtype=torch.float32) / lens.max()
        return sinusoids(pos, 32)[None].expand(x.size(0), -1, -1)

    def subsampling_one_frame_ahead(x: Tensor, lens: Tensor) -> Tensor:
        return encoder.layer_inputs(F.pad(x[:, 1:], (0, 0, 0, 1)), lens, Chunking(chunk, 3)).x

    def per_utterance_normalization(x: Tensor, lens: Tensor) -> Tensor:
        mask = lengths_to_mask(lens, x.size(1))[:, :, None]
        mean = (x * mask).sum(1, keepdim=True) / lens[:, None, None]
        return x - mean

    def full_context_encoder(x: Tensor, lens: Tensor) -> Tensor:
        return encoder(x, lens)[0]

    return {
        "subsampling": (subsampling_one_frame_ahead, FACTOR),
        "normalization": (per_utterance_normalization, 1),
        "positional encoding": (positions_from_the_end, 1),
        "attention": (attention_without_chunks, 1),
        "convolution": (symmetric_convolution, 1),
        "encoder": (full_context_encoder, FACTOR),
    }


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_check_catches_each_part_made_non_causal(dtype, variant):
    encoder = _encoder(**VARIANTS[variant])
    for name, (encode, in_per_out) in _leaky_parts(encoder, 2).items():
        assert _leaked(encode, 2, in_per_out, dtype) > 3 * TOLERANCE[dtype], name


def _stream(encoder: ConformerEncoder, x: Tensor, lens: Tensor, chunking: Chunking) -> Tensor:
    """Encode chunk by chunk through `step`; (B, T', D)."""
    state = encoder.initial_state(x.size(0), chunking)
    span = chunking.chunk * FACTOR
    outs = []
    for start in range(0, x.size(1), span):
        out, _, state = encoder.step(
            x[:, start : start + span], (lens - start).clamp(0, span), state, chunking
        )
        outs.append(out)
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("conv_norm", ["batch_norm", "layer_norm"])
@pytest.mark.parametrize("chunking", [Chunking(1, 3), Chunking(2, 8), Chunking(4, 3)])
def test_chunk_by_chunk_equals_the_whole_utterance(chunking, conv_norm, variant):
    encoder = _encoder(conv_norm, **VARIANTS[variant])
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 203, 16, generator=g)
    lens = torch.tensor([203, 150, 37])  # streams that end at different times
    with torch.no_grad():
        whole, whole_lens = encoder(x, lens, chunking)
        streamed = _stream(encoder, x, lens, chunking)[:, : whole.size(1)]
        alone = _stream(encoder, x[2:, :37], lens[2:], chunking)[:, : whole_lens[2]]
    valid = lengths_to_mask(whole_lens, whole.size(1))[:, :, None]
    torch.testing.assert_close(streamed * valid, whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone, whole[2:, : whole_lens[2]], atol=1e-5, rtol=1e-5)


def test_training_draws_every_configured_context():
    encoder = _encoder().train()
    torch.manual_seed(3)
    drawn = {encoder.chunking_of(None) for _ in range(200)}
    assert {c.chunk for c in drawn} == {*CHUNKS, -1}
    assert {c.left for c in drawn if not c.is_full} == {3, 8}
    assert all(c.left == -1 for c in drawn if c.is_full)
    assert encoder.eval().chunking_of(None) == Chunking()


def test_untrained_chunkings_and_full_context_models_are_refused():
    encoder = _encoder()
    x, lens = torch.randn(1, 64, 16), torch.tensor([64])
    with pytest.raises(ValueError, match=r"chunk size 3 frames was not trained.*\[1, 2, 4\]"):
        encoder(x, lens, Chunking(3, 8))
    with pytest.raises(ValueError, match=r"left context 5 frames .*\[3, 8\]"):
        encoder.initial_state(1, Chunking(2, 5))
    offline = ConformerEncoder(ConformerConfig(input_dim=16, d_model=32, num_layers=1, num_heads=2))
    with pytest.raises(ValueError, match="trained with full context"):
        offline(x, lens, Chunking(2, 8))
    offline(x, lens, Chunking())  # full context: any model
    with pytest.raises(ConfigError, match="chunk_sizes"):
        StreamingConfig(chunk_sizes=(0, 4))
    with pytest.raises(ConfigError, match="left_contexts"):
        StreamingConfig(left_contexts=(-1,))


def test_a_full_context_encoder_is_unchanged_by_the_streaming_keys():
    """No streaming and no feature statistics: the same parameters and buffers as
    before streaming existed, so older checkpoints load."""
    encoder = ConformerEncoder(ConformerConfig(input_dim=16, d_model=32, num_layers=1, num_heads=2))
    names = set(encoder.state_dict())
    assert not any("feature" in n for n in names)
    kernel = encoder.config.conv_kernel_size
    assert encoder.layers[0].conv.depthwise.padding == (kernel // 2,)  # symmetric


def test_chunk_weights_set_how_often_each_chunk_size_is_drawn():
    encoder = _encoder().train()
    encoder.streaming = dataclasses.replace(STREAMING, chunk_weights=(1, 0, 0, 3))
    torch.manual_seed(4)
    drawn = [encoder.chunking_of(None).chunk for _ in range(400)]
    assert set(drawn) == {1, -1}
    assert 0.68 < drawn.count(-1) / len(drawn) < 0.82  # 3 in 4
    with pytest.raises(ConfigError, match=r"chunk_weights must give one weight >= 0 per chunk"):
        StreamingConfig(chunk_sizes=(2, -1), chunk_weights=(1,))


def test_encode_takes_its_chunking_as_an_argument_whatever_a_recognizer_was_built_with():
    """No state is left on the encoder: encoding with one chunking after a recognizer was
    built with (and streamed at) another gives the first chunking's output."""
    from asr.data.features import FeatureConfig
    from asr.inference.streaming import StreamingRecognizer
    from asr.models.transducer import Joiner, Predictor, PredictorConfig, Transducer

    encoder = _encoder()
    predictor = Predictor(PredictorConfig(embed_dim=8, hidden_dim=8), vocab_size=10)
    joiner = Joiner(encoder_dim=32, predictor_dim=8, joint_dim=8, vocab_size=10)
    model = Transducer(encoder, predictor, joiner).eval()
    x, lens = torch.randn(2, 96, 16), torch.tensor([96, 70])
    with torch.no_grad():
        before = model.encode(x, lens, Chunking(1, 3))[0]
        full_before = model.encode(x, lens)[0]
        recognizer = StreamingRecognizer(
            model, None, FeatureConfig(num_mel_bins=16, normalize="none"), Chunking(4, 8)
        )
        recognizer.feed([np.zeros(8000, np.float32)])
        after = model.encode(x, lens, Chunking(1, 3))[0]
        full_after = model.encode(x, lens)[0]
    assert torch.equal(before, after)
    assert torch.equal(full_before, full_after)
    assert not torch.allclose(before, full_before)  # the chunking matters


def test_step_without_a_chunk_fails_in_one_line():
    encoder = _encoder()
    with pytest.raises(ValueError, match=r"a stream is encoded chunk by chunk: give a trained"):
        encoder.initial_state(1, Chunking())
    state = encoder.initial_state(1, Chunking(2, 3))
    with pytest.raises(ValueError, match=r"the state holds a left context of 3 frames.*asks for 8"):
        encoder.step(torch.randn(1, 16, 16), torch.tensor([16]), state, Chunking(2, 8))


def test_an_unlimited_left_context_sees_every_earlier_frame_and_its_own_chunk():
    """left = -1: each chunk sees itself up to its end and everything before, never a later
    chunk (the mask once hid each chunk's own first frame and all before it)."""
    mask = chunk_attention_mask(6, Chunking(2, -1))
    expected = torch.tensor(
        [[j < (i // 2 + 1) * 2 for j in range(6)] for i in range(6)], dtype=torch.bool
    )
    assert torch.equal(mask, expected)
    limited = chunk_attention_mask(6, Chunking(2, 1))
    assert limited[4].tolist() == [False, False, False, True, True, True]

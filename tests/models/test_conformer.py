import pytest
import torch
import torch.nn.functional as F

from asr.frames import subsampled_length, subsampled_lengths
from asr.models.attention import (
    RelPositionMultiHeadAttention,
    lengths_to_mask,
    rel_shift,
    relative_positions,
)
from asr.models.conformer import (
    ConformerConfig,
    ConformerEncoder,
    ConvSubsampling,
    masked_batch_norm,
)


def _padded_batch(lens: list[int], dim: int = 80, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random features with random garbage (not zeros) beyond each length."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lens), max(lens) + 5, dim, generator=g)
    return x, torch.tensor(lens)


@pytest.mark.parametrize("factor", [4, 8])
def test_subsampled_lengths_equal_actual_output_lengths(factor):
    sub = ConvSubsampling(input_dim=20, d_model=8, factor=factor, channels=4)
    for n in range(1, 70):
        y, y_lens = sub(torch.randn(1, n, 20), torch.tensor([n]))
        assert y.shape[1] == y_lens.item() == subsampled_lengths(n, factor), n
        assert subsampled_length(n, factor) == y.shape[1]
    lens = torch.arange(0, 200)
    expected = torch.tensor([-(-n // factor) for n in range(200)])  # ceil(n / factor)
    assert torch.equal(subsampled_lengths(lens, factor), expected)
    assert subsampled_lengths(0, factor) == 0


def test_subsampled_lengths_inside_padded_batch():
    sub = ConvSubsampling(input_dim=20, d_model=8, factor=8, channels=4)
    x, lens = _padded_batch([33, 17, 9, 1], dim=20)
    y, y_lens = sub(x, lens)
    assert torch.equal(y_lens, subsampled_lengths(lens, 8))
    assert y.shape[1] == subsampled_lengths(x.shape[1], 8)


def test_invalid_factor_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"\[4, 8\].*6"):
        ConvSubsampling(80, 16, factor=6)
    with pytest.raises(ValueError, match="factor"):
        subsampled_lengths(10, 2)


def test_invalid_conv_options():
    with pytest.raises(ValueError, match="odd"):
        ConformerConfig(d_model=16, num_heads=2, conv_kernel_size=4)
    with pytest.raises(ValueError, match="conv_norm"):
        ConformerConfig(d_model=16, num_heads=2, conv_norm="group_norm")
    with pytest.raises(ValueError, match="divisible"):
        ConformerConfig(d_model=18, num_heads=4)


def test_rel_shift_matches_explicit_indexing():
    t = 5
    scores = torch.randn(2, 3, t, 2 * t - 1)
    shifted = rel_shift(scores)
    for i in range(t):
        for j in range(t):
            assert torch.equal(shifted[..., i, j], scores[..., i, t - 1 - i + j])


def test_relative_positions_are_sinusoids_of_distance():
    pe = relative_positions(4, 6)
    assert pe.shape == (7, 6)
    # Row r encodes distance 3 - r; the centre row (distance 0) is sin 0 = 0, cos 0 = 1.
    assert torch.allclose(pe[3], torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]))
    freqs = torch.tensor([1.0, 10000 ** (-2 / 6), 10000 ** (-4 / 6)])
    for r, dist in enumerate(range(3, -4, -1)):
        assert torch.allclose(pe[r, 0::2], (dist * freqs).sin(), atol=1e-6)
        assert torch.allclose(pe[r, 1::2], (dist * freqs).cos(), atol=1e-6)


def test_attention_equals_naive_relative_attention():
    """Fused SDPA with a folded float mask == the textbook formula written out."""
    torch.manual_seed(0)
    b, t, d, h = 2, 6, 16, 4
    attn = RelPositionMultiHeadAttention(d, h).eval()
    torch.nn.init.normal_(attn.pos_bias_u)
    torch.nn.init.normal_(attn.pos_bias_v)
    x, lens = torch.randn(b, t, d), torch.tensor([6, 4])
    pos_emb = relative_positions(t, d)
    got = attn(x, pos_emb, lengths_to_mask(lens, t))

    q, k, v = attn.qkv(x).view(b, t, 3, h, d // h).unbind(2)
    p = attn.pos(pos_emb).view(2 * t - 1, h, d // h)
    dist = torch.arange(t)[:, None] - torch.arange(t)[None, :]  # i - j
    p_ij = p[t - 1 - dist]  # (T, T, H, Dh): encoding of distance i - j
    content = torch.einsum("bihd,bjhd->bhij", q + attn.pos_bias_u, k)
    position = torch.einsum("bihd,ijhd->bhij", q + attn.pos_bias_v, p_ij)
    scores = (content + position) / (d // h) ** 0.5
    scores = scores.masked_fill(~lengths_to_mask(lens, t)[:, None, None, :], float("-inf"))
    y = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v).reshape(b, t, d)
    assert torch.allclose(got, attn.out(y), atol=1e-5)


def _encoder(
    conv_norm: str = "layer_norm", factor: int = 4, dropout: float = 0.1
) -> ConformerEncoder:
    torch.manual_seed(0)
    enc = ConformerEncoder(
        ConformerConfig(
            input_dim=80,
            d_model=32,
            num_layers=2,
            num_heads=4,
            conv_kernel_size=7,
            subsampling_factor=factor,
            conv_norm=conv_norm,
            dropout=dropout,
        )
    )
    if conv_norm == "batch_norm":  # non-trivial running statistics
        for m in enc.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    return enc.eval()


@pytest.mark.parametrize("conv_norm", ["layer_norm", "batch_norm"])
@pytest.mark.parametrize("factor", [4, 8])
def test_padding_invariance(conv_norm, factor):
    enc = _encoder(conv_norm, factor)
    x, lens = _padded_batch([61, 40, 23, 9])
    with torch.no_grad():
        y, y_lens = enc(x, lens)
        assert y.shape == (4, subsampled_lengths(x.shape[1], factor), 32)
        assert enc.output_dim == 32
        for i, n in enumerate(lens.tolist()):
            alone, alone_lens = enc(x[i : i + 1, :n], lens[i : i + 1])
            assert alone_lens.item() == y_lens[i].item() == alone.shape[1]
            assert torch.allclose(y[i, : y_lens[i]], alone[0], atol=1e-5)
            assert torch.all(y[i, y_lens[i] :] == 0)


@pytest.mark.parametrize("factor", [4, 8])
def test_layers_see_frames_padded_to_a_multiple_and_outputs_do_not(factor):
    enc = _encoder("batch_norm", factor)
    x, lens = _padded_batch([61, 40, 23, 9])  # 66 frames
    seen = []
    enc.layers[0].register_forward_pre_hook(lambda _, args: seen.append(args[0].size(1)))
    with torch.no_grad():
        y, y_lens = enc(x, lens)
        enc.pad_frames_to = 1
        unpadded, _ = enc(x, lens)
    assert seen == [8 * -(-subsampled_lengths(66, factor) // 8), subsampled_lengths(66, factor)]
    assert y.shape == unpadded.shape == (4, subsampled_lengths(66, factor), 32)
    assert torch.allclose(y, unpadded, atol=1e-5)
    with pytest.raises(ValueError, match="pad_frames_to must be >= 1, got 0"):
        ConformerConfig(pad_frames_to=0)


def test_no_gradient_into_padded_frames():
    enc = _encoder()
    enc.train()  # dropout on: the masks must hold in training too
    x, lens = _padded_batch([50, 21, 12])
    x.requires_grad_(True)
    y, y_lens = enc(x, lens)
    valid = lengths_to_mask(y_lens, y.shape[1])
    (y * torch.randn_like(y) * valid[:, :, None]).sum().backward()
    in_valid = lengths_to_mask(lens, x.shape[1])
    assert torch.all(x.grad[~in_valid] == 0)
    assert torch.all(x.grad[in_valid].abs().sum(-1) > 0)


def test_changing_padding_changes_nothing_in_training_mode_with_layer_norm():
    enc = _encoder()
    enc.train()
    x, lens = _padded_batch([30, 14])
    x2 = x.clone()
    x2[1, 14:] = 1e3  # wild values in the padding
    torch.manual_seed(1)
    y, y_lens = enc(x, lens)
    torch.manual_seed(1)
    y2, _ = enc(x2, lens)
    assert torch.equal(y, y2)


def _batch_norm_pair(dim: int) -> tuple[torch.nn.BatchNorm1d, torch.nn.BatchNorm1d]:
    torch.manual_seed(0)
    a = torch.nn.BatchNorm1d(dim)
    with torch.no_grad():
        a.weight.uniform_(0.5, 2)
        a.bias.uniform_(-1, 1)
    b = torch.nn.BatchNorm1d(dim)
    b.load_state_dict(a.state_dict())
    return a, b


def test_masked_batch_norm_without_padding_is_batch_norm():
    a, b = _batch_norm_pair(6)
    x = (torch.randn(3, 6, 17) * 3 + 2).requires_grad_(True)
    full = torch.ones(3, 1, 17, dtype=torch.bool)
    for _ in range(2):  # running statistics after two updates
        ref, got = a(x), masked_batch_norm(x, full, b)
    assert torch.allclose(got, ref, atol=1e-5)
    g = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, [x, a.weight, a.bias], g)
    got_grads = torch.autograd.grad(got, [x, b.weight, b.bias], g)
    for r, q in zip(ref_grads, got_grads, strict=True):
        assert torch.allclose(q, r, atol=1e-4)
    assert torch.allclose(b.running_mean, a.running_mean, atol=1e-6)
    assert torch.allclose(b.running_var, a.running_var, atol=1e-5)
    assert b.num_batches_tracked.item() == 2
    a.eval(), b.eval()
    assert torch.allclose(masked_batch_norm(x, full, b), a(x), atol=1e-5)


def test_masked_batch_norm_statistics_come_from_valid_frames_only():
    a, b = _batch_norm_pair(4)
    lens = torch.tensor([9, 4, 6])
    x = torch.randn(3, 4, 9)
    mask = lengths_to_mask(lens, 9)
    x[~mask[:, None, :].expand_as(x)] = 1e4  # wild values in the padding
    y = masked_batch_norm(x, mask[:, None, :], b)
    valid = torch.cat([x[i, :, :n] for i, n in enumerate(lens.tolist())], dim=1)[None]
    ref = a(valid)[0]  # batch norm of the valid frames alone, (D, 19)
    got = torch.cat([y[i, :, :n] for i, n in enumerate(lens.tolist())], dim=1)
    assert torch.allclose(got, ref, atol=1e-5)
    assert torch.allclose(b.running_mean, a.running_mean, atol=1e-6)
    assert torch.allclose(b.running_var, a.running_var, atol=1e-5)


def test_batch_norm_encoder_in_training_ignores_how_the_batch_is_padded():
    """Training statistics over valid frames: padding to a multiple of 8, or garbage in the
    padding, changes neither the valid outputs nor the running statistics."""
    x, lens = _padded_batch([61, 40, 23, 9])
    outputs, stats = [], []
    for pad_frames_to, garbage in [(1, 0.0), (8, 0.0), (8, 1e3)]:
        enc = _encoder("batch_norm", dropout=0.0).train()
        enc.pad_frames_to = pad_frames_to
        x_run = x.clone()
        x_run[~lengths_to_mask(lens, x.size(1))] = garbage
        y, y_lens = enc(x_run, lens)
        outputs.append(y)
        stats.append(torch.cat([b for n, b in enc.named_buffers() if "running" in n]))
    for y, s in zip(outputs[1:], stats[1:], strict=True):
        assert torch.allclose(y, outputs[0], atol=1e-5)
        assert torch.allclose(s, stats[0], atol=1e-5)
    initial = torch.cat([b for n, b in _encoder("batch_norm").named_buffers() if "running" in n])
    assert not torch.allclose(stats[0], initial)  # training did update them


def test_encoder_runs_under_bfloat16_autocast():
    enc = _encoder()
    x, lens = _padded_batch([30, 14])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_lens = enc(x, lens)
    assert y.shape == (2, subsampled_lengths(x.shape[1], 4), 32)
    assert torch.isfinite(y.float()).all()
    ref, _ = enc(x, lens)
    assert F.cosine_similarity(y.float().flatten(), ref.flatten(), dim=0) > 0.99

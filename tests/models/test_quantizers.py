"""The Gumbel quantizer (trained, straight through) and BEST-RQ's random-projection
quantizer (frozen buffers, deterministic targets)."""

from __future__ import annotations

import pytest
import torch

from asr.models.quantizers import (
    GumbelQuantizer,
    RandomProjectionQuantizer,
    TemperatureSchedule,
    fully_masked,
    stack_frames,
)


def test_gumbel_quantizer_picks_one_code_per_group_and_the_gradient_flows_through() -> None:
    torch.manual_seed(0)
    quantizer = GumbelQuantizer(input_dim=12, code_dim=8, num_codes=5, groups=2)
    x = torch.randn(2, 7, 12, requires_grad=True)
    frames = torch.ones(2, 7, dtype=torch.bool)
    out = quantizer(x, frames)
    assert out.vectors.shape == (2, 7, 8) and out.codes.shape == (2, 7, 2)
    # the forward value is exactly the chosen entries' vectors, concatenated
    for g in range(2):
        chosen = quantizer.codebook[g][out.codes[..., g]]
        assert torch.equal(out.vectors[..., 4 * g : 4 * (g + 1)], chosen)
    assert torch.allclose(out.mean_probs.sum(dim=-1), torch.ones(2))
    # straight through: the one-hot choice has no gradient, the soft probabilities do
    weights = torch.randn(2, 7, 8)
    (out.vectors * weights).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert quantizer.logits.weight.grad.abs().sum() > 0
    assert quantizer.codebook.grad.abs().sum() > 0


def test_gumbel_quantizer_stays_fp32_under_autocast_and_is_deterministic_in_eval() -> None:
    torch.manual_seed(0)
    quantizer = GumbelQuantizer(input_dim=6, code_dim=4, num_codes=3, groups=1)
    x = torch.randn(1, 5, 6)
    frames = torch.ones(1, 5, dtype=torch.bool)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = quantizer(x.bfloat16(), frames)
    assert out.mean_probs.dtype == torch.float32
    quantizer.eval()
    assert torch.equal(quantizer(x, frames).codes, quantizer(x, frames).codes)
    logits = x @ quantizer.logits.weight.T + quantizer.logits.bias
    assert torch.equal(quantizer(x, frames).codes[..., 0], logits.argmax(dim=-1))


def test_mean_probs_count_only_the_selected_frames() -> None:
    torch.manual_seed(0)
    quantizer = GumbelQuantizer(input_dim=4, code_dim=2, num_codes=3, groups=1).eval()
    x = torch.randn(1, 4, 4)
    frames = torch.tensor([[True, False, False, True]])
    probs = (x @ quantizer.logits.weight.T + quantizer.logits.bias).softmax(dim=-1)
    expected = (probs[0, 0] + probs[0, 3]) / 2
    assert torch.allclose(quantizer(x, frames).mean_probs[0], expected, atol=1e-6)


def test_temperature_schedule() -> None:
    schedule = TemperatureSchedule(start=2.0, end=0.5, decay=0.9)
    assert schedule.at(0) == 2.0 and schedule.at(1) == pytest.approx(1.8)
    assert schedule.at(1000) == 0.5
    with pytest.raises(ValueError, match="temperature"):
        TemperatureSchedule(start=0.5, end=2.0)


def test_random_projection_quantizer_is_frozen_and_gives_the_same_targets() -> None:
    quantizer = RandomProjectionQuantizer(
        input_dim=10, factor=4, code_dim=8, num_codes=32, num_codebooks=2, seed=7
    )
    assert list(quantizer.parameters()) == []  # buffers only: nothing for an optimizer
    assert {name for name, _ in quantizer.named_buffers()} == {"projection", "codebook"}
    assert torch.allclose(quantizer.codebook.norm(dim=-1), torch.ones(2, 32))
    features = torch.randn(3, 22, 10)
    codes = quantizer(features)
    assert codes.shape == (3, 6, 2) and codes.dtype == torch.long  # ceil(22 / 4) frames
    again = RandomProjectionQuantizer(
        input_dim=10, factor=4, code_dim=8, num_codes=32, num_codebooks=2, seed=7
    )
    assert torch.equal(again(features), codes)  # same seed, same input: same targets
    other = RandomProjectionQuantizer(
        input_dim=10, factor=4, code_dim=8, num_codes=32, num_codebooks=2, seed=8
    )
    assert not torch.equal(other(features), codes)
    # an affine change of a stacked frame does not change its code (normalized first)
    assert torch.equal(quantizer(features * 3.0 + 1.0)[:, :5], codes[:, :5])
    # the state dict carries the buffers: a loaded quantizer gives the same targets
    other.load_state_dict(quantizer.state_dict())
    assert torch.equal(other(features), codes)
    # nearest codebook entry by hand, for one frame and codebook
    stacked = stack_frames(features, 4)[0, 1]
    normed = (stacked - stacked.mean()) / (stacked.var(unbiased=False) + 1e-5).sqrt()
    projected = torch.nn.functional.normalize(normed @ quantizer.projection[0], dim=-1)
    distances = (quantizer.codebook[0] - projected).norm(dim=-1)
    assert int(codes[0, 1, 0]) == int(distances.argmin())


def test_a_stack_is_a_target_only_where_all_its_input_frames_are_masked() -> None:
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0, 1, 1]], dtype=torch.bool)
    # stacks of 4: [1111] [1110] [11 + padding]
    assert fully_masked(mask, 4).tolist() == [[True, False, False]]
    features = torch.arange(10.0).reshape(1, 5, 2)
    assert stack_frames(features, 2).tolist() == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 0]]]


def test_the_gumbel_noise_follows_the_generator_given() -> None:
    quantizer = GumbelQuantizer(8, code_dim=4, num_codes=16, groups=2).train()
    x, frames = torch.randn(2, 30, 8), torch.ones(2, 30, dtype=torch.bool)

    def codes(seed: int) -> torch.Tensor:
        torch.manual_seed(1234 + seed)  # the global RNG differs every call
        return quantizer(x, frames, torch.Generator().manual_seed(seed)).codes

    assert torch.equal(codes(0), codes(0))
    assert not torch.equal(codes(0), codes(1))

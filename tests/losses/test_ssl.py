"""The pre-training losses: contrastive (a hand-computed case), diversity, masked
prediction, and the distractor sampler."""

from __future__ import annotations

import math

import pytest
import torch

from asr.losses.ssl import (
    code_perplexity,
    contrastive_loss,
    diversity_loss,
    masked_prediction_loss,
    sample_distractors,
)


def test_contrastive_loss_equals_a_hand_computed_value() -> None:
    # one utterance, 3 frames, frames 0 and 2 masked, one distractor each (the other one)
    context = torch.tensor([[[1.0, 0.0], [5.0, 5.0], [0.0, 2.0]]])
    targets = torch.tensor([[[1.0, 1.0], [9.0, 9.0], [0.0, 3.0]]])
    mask = torch.tensor([[True, False, True]])
    distractors = torch.tensor([[[2], [1], [0]]])
    valid = torch.tensor([[[True], [False], [True]]])
    loss, accuracy = contrastive_loss(context, targets, mask, distractors, valid, temperature=0.5)
    # frame 0: cos(c0, q0) = 1/sqrt2, cos(c0, q2) = 0
    # frame 2: cos(c2, q2) = 1, cos(c2, q0) = 1/sqrt2
    s = 1 / math.sqrt(2)
    frame0 = -math.log(math.exp(s / 0.5) / (math.exp(s / 0.5) + math.exp(0.0)))
    frame2 = -math.log(math.exp(1 / 0.5) / (math.exp(1 / 0.5) + math.exp(s / 0.5)))
    assert float(loss) == pytest.approx((frame0 + frame2) / 2, rel=1e-6)
    assert float(accuracy) == 1.0


def test_distractors_equal_to_the_target_or_invalid_are_left_out() -> None:
    context = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    targets = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])  # the same code at both frames
    mask = torch.tensor([[True, True]])
    distractors = torch.tensor([[[1], [0]]])
    valid = torch.ones(1, 2, 1, dtype=torch.bool)
    loss, _ = contrastive_loss(context, targets, mask, distractors, valid)
    assert float(loss) == 0.0  # only the positive is left: probability 1
    loss, _ = contrastive_loss(
        context, targets * torch.tensor([1.0, 2.0]), mask, distractors, ~valid
    )
    assert float(loss) == 0.0


def test_distractors_come_from_other_masked_frames_of_the_same_utterance() -> None:
    mask = torch.tensor([[True, False, True, True, False], [False, True, False, False, False]])
    generator = torch.Generator().manual_seed(0)
    indices, valid = sample_distractors(mask, 50, generator)
    assert indices.shape == (2, 5, 50)
    for frame in (0, 2, 3):
        chosen = set(indices[0, frame].tolist())
        assert chosen <= {0, 2, 3} - {frame} and len(chosen) == 2  # both others, in 50 draws
        assert valid[0, frame].all()
    assert not valid[1].any()  # a single masked frame has no distractor
    assert not valid[0, 1].any()


def test_diversity_loss_is_minimal_at_uniform_code_use() -> None:
    uniform = torch.full((2, 8), 1 / 8)
    assert float(diversity_loss(uniform)) == pytest.approx(0.0, abs=1e-6)
    assert float(code_perplexity(uniform)) == pytest.approx(16.0)
    collapsed = torch.zeros(2, 8)
    collapsed[:, 3] = 1.0
    assert float(diversity_loss(collapsed)) == pytest.approx(1 - 2 / 16)
    logits = torch.randn(2, 8, requires_grad=True)
    skewed = diversity_loss(logits.softmax(dim=-1))
    assert 0 < float(skewed.detach()) < 1 - 2 / 16
    skewed.backward()
    assert logits.grad.abs().sum() > 0


def test_masked_prediction_loss_counts_only_masked_frames() -> None:
    logits = torch.randn(2, 4, 3, 6)
    targets = torch.randint(0, 6, (2, 4, 3))
    mask = torch.tensor([[True, False, False, True], [False, False, True, False]])
    loss, accuracy = masked_prediction_loss(logits, targets, mask)
    picked = logits[mask].reshape(-1, 6)
    expected = torch.nn.functional.cross_entropy(picked, targets[mask].reshape(-1))
    assert torch.allclose(loss, expected)
    assert float(accuracy) == float((picked.argmax(-1) == targets[mask].reshape(-1)).float().mean())
    # changing an unmasked frame changes nothing
    logits[0, 1] += 100.0
    assert torch.allclose(masked_prediction_loss(logits, targets, mask)[0], expected)
    # one codebook: (B, T, V) and (B, T)
    single, _ = masked_prediction_loss(logits[:, :, 0], targets[:, :, 0], mask)
    assert torch.allclose(
        single, torch.nn.functional.cross_entropy(logits[:, :, 0][mask], targets[:, :, 0][mask])
    )
    with pytest.raises(ValueError, match="expected logits"):
        masked_prediction_loss(logits, targets[:, :2], mask)

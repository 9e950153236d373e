"""Span masking: never padding, each utterance's own length, the expected statistics."""

from __future__ import annotations

import pytest
import torch

from asr.models.masking import mask_statistics, span_mask


def test_padding_is_never_masked_and_each_length_is_respected() -> None:
    lengths = torch.tensor([200, 57, 3, 0, 120])
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        mask = span_mask(lengths, 200, mask_prob=0.2, span_length=10, generator=generator)
        frames = torch.arange(200)[None, :]
        assert not mask[frames >= lengths[:, None]].any()
        assert mask[0].any() and mask[1].any()  # at least one span each
    # shorter than a span: one span of its whole length (min_spans=1), or nothing
    short = span_mask(torch.tensor([3]), 5, mask_prob=0.0, span_length=10)
    assert short.tolist() == [[True, True, True, False, False]]
    none = span_mask(torch.tensor([3]), 5, mask_prob=0.0, span_length=10, min_spans=0)
    assert not none.any()


def test_masked_fraction_and_runs_follow_mask_prob_and_span_length() -> None:
    lengths = torch.full((64,), 1000)
    generator = torch.Generator().manual_seed(1)
    mask = span_mask(lengths, 1000, mask_prob=0.065, span_length=10, generator=generator)
    stats = mask_statistics(mask, lengths)
    # spans start at 6.5 % of the frames and overlap: about 1 - (1 - 0.065)^10 = 0.49
    assert stats["masked_fraction"] == pytest.approx(1 - (1 - 0.065) ** 10, abs=0.03)
    assert stats["mean_run_length"] >= 10  # merged spans are longer, never shorter
    starts = mask.clone()
    starts[:, 1:] &= ~mask[:, :-1]
    ends = mask.clone()
    ends[:, :-1] &= ~mask[:, 1:]
    run_lengths = ends.nonzero()[:, 1] - starts.nonzero()[:, 1] + 1
    assert int(run_lengths.min()) >= 10


def test_same_generator_same_mask_and_bad_values_are_named() -> None:
    lengths = torch.tensor([80, 40])
    masks = [
        span_mask(
            lengths, 80, mask_prob=0.1, span_length=5, generator=torch.Generator().manual_seed(3)
        )
        for _ in range(2)
    ]
    assert torch.equal(masks[0], masks[1])
    with pytest.raises(ValueError, match="mask_prob"):
        span_mask(lengths, 80, mask_prob=1.5, span_length=5)
    with pytest.raises(ValueError, match="span_length"):
        span_mask(lengths, 80, mask_prob=0.1, span_length=0)
    with pytest.raises(ValueError, match="max_len=40"):
        span_mask(lengths, 40, mask_prob=0.1, span_length=5)

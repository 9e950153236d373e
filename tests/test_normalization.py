"""Feature normalization: per utterance on a padded batch as on each utterance alone (the
ONNX graph's padded input against the data pipeline's), and a causal running mean that a
stream computes chunk by chunk exactly as over the whole utterance."""

from __future__ import annotations

import numpy as np
import torch

from asr.data.features import normalize_features
from asr.normalization import STD_EPSILON, causal_running_mean, per_utterance, with_global_stats


def test_per_utterance_ignores_padding_and_matches_the_formula() -> None:
    gen = np.random.default_rng(0)
    utterances = [gen.normal(3.0, 2.0, (n, 80)).astype(np.float32) for n in (57, 31, 1)]
    padded = torch.full((3, 57, 80), -23.03)  # sherpa-onnx's padding value
    for i, u in enumerate(utterances):
        padded[i, : len(u)] = torch.from_numpy(u)
    lens = torch.tensor([len(u) for u in utterances])
    out = per_utterance(padded, lens)
    for i, u in enumerate(utterances):
        alone = normalize_features(u, "per_utterance")  # what training reads
        formula = (u - u.mean(axis=0)) / (u.std(axis=0) + STD_EPSILON)
        np.testing.assert_allclose(out[i, : len(u)].numpy(), alone, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(alone, formula, rtol=1e-4, atol=1e-4)
    assert normalize_features(utterances[0], "none") is utterances[0]


def test_a_running_mean_in_chunks_equals_it_over_the_whole_utterance() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 50, 4, generator=g) + 5
    lens = torch.tensor([50, 33])
    whole, total, count = causal_running_mean(x, 10, lens)
    pieces, running_sum, running_count = [], None, None
    for start in range(0, 50, 8):
        piece_lens = (lens - start).clamp(0, 8)
        y, running_sum, running_count = causal_running_mean(
            x[:, start : start + 8], 10, piece_lens, running_sum, running_count
        )
        pieces.append(y)
    streamed = torch.cat(pieces, dim=1)
    torch.testing.assert_close(streamed[0], whole[0])
    torch.testing.assert_close(streamed[1, :33], whole[1, :33])
    torch.testing.assert_close(running_sum, total)
    assert running_count.tolist() == count.tolist() == [50, 33]
    # Frame t: minus the mean of frames 0..t with 10 zero frames before them.
    t = 6
    expected = x[0, t] - x[0, : t + 1].sum(0) / (t + 1 + 10)
    torch.testing.assert_close(whole[0, t], expected)


def test_global_statistics() -> None:
    x = torch.tensor([[1.0, 4.0], [3.0, 8.0]])
    out = with_global_stats(x, torch.tensor([2.0, 6.0]), torch.tensor([1.0, 0.5]))
    assert out.tolist() == [[-1.0, -1.0], [1.0, 1.0]]

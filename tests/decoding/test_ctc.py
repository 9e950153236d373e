import math

import pytest
import torch

from asr.decoding.ctc import ctc_greedy_search


def _one_hot_log_probs(paths: list[list[int]], vocab: int) -> torch.Tensor:
    T = max(len(p) for p in paths)
    out = torch.full((len(paths), T, vocab), -math.inf)
    for b, path in enumerate(paths):
        for t, k in enumerate(path):
            out[b, t, k] = 0.0
        for t in range(len(path), T):  # padding frames would emit token 5 if not masked
            out[b, t, 5] = 0.0
    return out


def test_collapses_repeats_drops_blanks_and_stops_at_length():
    paths = [[0, 3, 3, 0, 3, 4, 4, 0], [2, 2, 2]]
    log_probs = _one_hot_log_probs(paths, vocab=6)
    lens = torch.tensor([8, 3])
    assert ctc_greedy_search(log_probs, lens) == [[3, 3, 4], [2]]


def test_blank_as_last_index():
    log_probs = _one_hot_log_probs([[5, 1, 1, 5, 1]], vocab=6)
    assert ctc_greedy_search(log_probs, torch.tensor([5]), blank=5) == [[1, 1]]


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="log_probs"):
        ctc_greedy_search(torch.zeros(2, 3), torch.tensor([1, 2]))

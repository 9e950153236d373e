"""The closed-form lattice: diagonal layout, forward/backward variables, logit gradient."""

import torch

from asr.losses.lattice import (
    lattice,
    nll_and_logit_grad_,
    node_scores_,
    padded_labels,
    skewed_buffer,
    window,
)


def test_skewed_buffer_puts_each_antidiagonal_in_a_row():
    x = torch.arange(2 * 4 * 3, dtype=torch.float64).view(2, 4, 3)
    padded, diagonals = skewed_buffer(2, 4, 3, x)
    window(padded, 4).copy_(x.flip(-1))
    assert diagonals.shape == (2, 6, 3)
    for t in range(4):
        for u in range(3):
            assert diagonals[1, t + u, 2 - u] == x[1, t, u]
    assert torch.isinf(diagonals[0, 0, :2]).all()  # nodes with t < 0 do not exist
    assert torch.equal(window(padded, 4).flip(-1), x)


def _scores(logits: torch.Tensor, targets: torch.Tensor):
    g, t, u1, vocab = logits.shape
    labels = padded_labels(targets, u1, blank=0, vocab=vocab)
    lse, z_blank, z_label = logits.new_empty((3, g, t, u1)).unbind(0)
    node_scores_(logits.clone(), labels, blank=0, lse=lse, z_blank=z_blank, z_label=z_label)
    return lse, z_blank, z_label


def test_every_path_crosses_each_frame_and_each_diagonal_once():
    g = torch.Generator().manual_seed(0)
    frames, tokens = torch.tensor([7, 3, 5]), torch.tensor([4, 4, 0])
    logits = torch.randn(3, 7, 5, 6, generator=g, dtype=torch.float64)
    targets = torch.randint(1, 6, (3, 4), generator=g)
    lse, z_blank, z_label = _scores(logits, targets)
    _, terms = lattice(lse, z_blank, z_label, frames, tokens, gradient=True)
    node_occupancy = (terms.shift + lse_of(logits)).exp()
    for i, (f, k) in enumerate(zip(frames.tolist(), tokens.tolist(), strict=True)):
        # one blank move leaves each frame; one node of each diagonal t + u is visited
        assert torch.allclose(terms.blank_move[i, :f].sum(-1), torch.ones(f, dtype=torch.float64))
        for n in range(f + k):
            on_diagonal = sum(node_occupancy[i, t, n - t] for t in range(f) if 0 <= n - t <= k)
            assert torch.allclose(on_diagonal, torch.tensor(1.0, dtype=torch.float64))
        assert torch.all(node_occupancy[i, f:] == 0) and torch.all(
            node_occupancy[i, :, k + 1 :] == 0
        )
        assert torch.all(terms.blank_move[i, f:] == 0) and torch.all(
            terms.neg_label_move[i, :, k:] == 0
        )


def lse_of(logits: torch.Tensor) -> torch.Tensor:
    return logits.logsumexp(-1)


def textbook_nll(lp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log P by the O(T U) forward algorithm with autograd; lp (T, U+1, V), blank 0."""
    n_t, n_u = lp.shape[:2]
    alpha = {(0, 0): lp.new_zeros(())}
    for t in range(n_t):
        for u in range(n_u):
            arcs = [alpha[t - 1, u] + lp[t - 1, u, 0]] if t else []
            arcs += [alpha[t, u - 1] + lp[t, u - 1, targets[u - 1]]] if u else []
            if arcs:
                alpha[t, u] = torch.logsumexp(torch.stack(arcs), 0)
    return -(alpha[n_t - 1, n_u - 1] + lp[n_t - 1, n_u - 1, 0])


def test_logit_gradient_equals_autograd():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 6, 4, 7, generator=g, dtype=torch.float64)
    targets = torch.randint(1, 7, (2, 3), generator=g)
    frames, tokens = torch.tensor([6, 4]), torch.tensor([3, 1])
    weights = torch.tensor([0.5, -2.0], dtype=torch.float64)

    leaf = logits.clone().requires_grad_(True)
    nll = nll_and_logit_grad_(logits.clone(), targets, frames, tokens, blank=0)  # loss only
    lp = leaf.log_softmax(-1)
    expected = torch.stack(
        [textbook_nll(lp[b, : frames[b], : tokens[b] + 1], targets[b, : tokens[b]]) for b in (0, 1)]
    )
    assert torch.allclose(nll, expected.detach(), rtol=1e-12)
    (want,) = torch.autograd.grad((expected * weights).sum(), leaf)

    got = logits.clone()
    nll_and_logit_grad_(got, targets, frames, tokens, blank=0, weights=weights)
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-12)
    assert torch.all(got[1, 4:] == 0) and torch.all(got[1, :, 2:] == 0)  # padding: no gradient

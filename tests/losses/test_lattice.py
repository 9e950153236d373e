"""The closed-form lattice: diagonal layout, forward/backward variables, logit gradient."""

import torch

from asr.losses.lattice import (
    backward_variables,
    forward_variables,
    nll_and_logit_grad_,
    skew,
    unskew,
)


def test_skew_puts_each_antidiagonal_in_a_row():
    x = torch.arange(2 * 4 * 3, dtype=torch.float64).view(2, 4, 3)
    diagonals = skew(x)
    assert diagonals.shape == (2, 6, 3)
    for t in range(4):
        for u in range(3):
            assert diagonals[1, t + u, 2 - u] == x[1, t, u]
    assert torch.isinf(diagonals[0, 0, :2]).all()  # nodes with t < 0 do not exist
    assert torch.equal(unskew(diagonals, 4), x)


def _log_probs(seed: int, frames: int, tokens: int, vocab: int = 5):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(1, frames, tokens + 1, vocab, generator=g, dtype=torch.float64)
    lp = lp.log_softmax(-1)
    targets = torch.randint(1, vocab, (1, tokens), generator=g)
    blank_lp = lp[..., 0]
    label_lp = torch.full_like(blank_lp, float("-inf"))
    label_lp[..., :tokens] = (
        lp[..., :tokens, :]
        .gather(-1, targets[:, None, :, None].expand(1, frames, tokens, 1))
        .squeeze(-1)
    )
    return lp, targets, blank_lp, label_lp


def test_forward_and_backward_variables_agree_on_the_likelihood():
    _, _, blank_lp, label_lp = _log_probs(0, frames=7, tokens=4)
    alpha = forward_variables(blank_lp, label_lp)
    beta = backward_variables(blank_lp, label_lp, torch.tensor([7]), torch.tensor([4]))
    from_alpha = alpha[0, 6, 4] + blank_lp[0, 6, 4]
    assert torch.allclose(beta[0, 0, 0], from_alpha, rtol=1e-12)
    # Every frame is crossed by all paths: sum over u of alpha*beta*blank-move = P.
    for t in range(7):
        crossing = torch.logsumexp(alpha[0, t] + blank_lp[0, t] + beta[0, t + 1], 0)
        assert torch.allclose(crossing, from_alpha, rtol=1e-12)


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

"""The transducer lattice in closed form: loss and d(loss)/d(logits) without autograd.

Legend: G samples in a group, T frames, U1 = U + 1 predictor positions, V vocabulary.
Node (t, u) has emitted u tokens after t frames. From (t, u) the blank moves to (t+1, u)
and the label y[u] to (t, u+1); the last blank, from (T-1, U), ends the path.

The forward variables alpha and the backward variables beta are computed one
anti-diagonal (t + u = n) at a time, vectorized over the diagonal and the group: T + U
sequential steps, not T * U. Diagonals become rows of a "skewed" view: with u flipped to
v = U1 - 1 - u and T rows of padding above and below, node (t, u) sits at row n = t + u,
column v of a strided view, so each step reads row n - 1 (or n + 1) shifted by at most
one column.

Gradient (with logP = log-likelihood of the targets, occupancy exp(alpha + beta - logP)):

    dL/dz[t,u,k] = softmax(z[t,u])[k] * occupancy[t,u]
                   - exp(alpha[t,u] + logp[t,u,k] + beta_next - logP)  if k is blank or y[u]

with beta_next = beta[t+1, u] for the blank (0 past the last frame of the last node) and
beta[t, u+1] for the label. `nll_and_logit_grad_` overwrites the logits with it.
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")


def _skewed(padded: Tensor, frames: int) -> Tensor:
    """(G, frames + 2(U1-1), U1) contiguous -> view (G, frames + U1 - 1, U1) of diagonals."""
    g, rows, u1 = padded.shape
    assert padded.is_contiguous() and rows == frames + 2 * (u1 - 1)
    return padded.as_strided((g, frames + u1 - 1, u1), (rows * u1, u1, u1 + 1))


def skew(x: Tensor) -> Tensor:
    """(G, T, U1) -> (G, T + U1 - 1, U1): out[g, t + u, U1 - 1 - u] = x[g, t, u], -inf elsewhere."""
    g, t, u1 = x.shape
    padded = x.new_full((g, t + 2 * (u1 - 1), u1), NEG_INF)
    padded[:, u1 - 1 : u1 - 1 + t] = x.flip(-1)
    return _skewed(padded, t)


def unskew(diagonals: Tensor, frames: int) -> Tensor:
    """Inverse of `skew`: (G, frames + U1 - 1, U1) -> (G, frames, U1)."""
    g, _, u1 = diagonals.shape
    padded = diagonals.new_full((g, frames + 2 * (u1 - 1), u1), NEG_INF)
    _skewed(padded, frames).copy_(diagonals)
    return padded[:, u1 - 1 : u1 - 1 + frames].flip(-1)


def forward_variables(blank_lp: Tensor, label_lp: Tensor) -> Tensor:
    """alpha (G, T, U1): log-probability of reaching (t, u) from (0, 0).

    `blank_lp`/`label_lp` (G, T, U1) hold log p(blank | t, u) and log p(y[u] | t, u), -inf
    wherever the move does not exist (padding; the label at u = U). Values at padded nodes
    are meaningless but never flow into real ones.
    """
    g, t, u1 = blank_lp.shape
    blank_d, label_d = skew(blank_lp), skew(label_lp)
    alpha = blank_lp.new_full((g, t + u1 - 1, u1), NEG_INF)
    alpha[:, 0, u1 - 1] = 0.0
    for n in range(1, t + u1 - 1):
        prev = alpha[:, n - 1]
        via_blank = prev + blank_d[:, n - 1]
        via_label = prev[:, 1:] + label_d[:, n - 1, 1:]
        torch.logaddexp(via_blank[:, :-1], via_label, out=alpha[:, n, :-1])
        alpha[:, n, -1] = via_blank[:, -1]
    return unskew(alpha, t)


def backward_variables(
    blank_lp: Tensor, label_lp: Tensor, frames: Tensor, tokens: Tensor
) -> Tensor:
    """beta (G, T + 1, U1): log-probability of finishing from (t, u).

    Row T is virtual: beta[g, frames[g], tokens[g]] = 0 is the end of sample g's lattice
    (reached by the blank from (frames - 1, tokens)); every other virtual or padded node
    is -inf as long as `blank_lp`/`label_lp` are -inf at padded nodes.
    """
    g, t, u1 = blank_lp.shape
    pad_row = blank_lp.new_full((g, 1, u1), NEG_INF)
    blank_d = skew(torch.cat([blank_lp, pad_row], 1))
    label_d = skew(torch.cat([label_lp, pad_row], 1))
    beta = blank_lp.new_full((g, t + u1, u1), NEG_INF)
    ends: dict[int, list[int]] = {}
    for i, (f, k) in enumerate(zip(frames.tolist(), tokens.tolist(), strict=True)):
        ends.setdefault(f + k, []).append(i)
    end_v = (u1 - 1 - tokens).tolist()

    def start(n: int) -> None:
        for i in ends.get(n, ()):
            beta[i, n, end_v[i]] = 0.0

    last = t + u1 - 1
    start(last)
    for n in range(last - 1, -1, -1):
        nxt = beta[:, n + 1]
        via_blank = nxt + blank_d[:, n]
        via_label = nxt[:, :-1] + label_d[:, n, 1:]
        torch.logaddexp(via_blank[:, 1:], via_label, out=beta[:, n, 1:])
        beta[:, n, 0] = via_blank[:, 0]
        start(n)
    return unskew(beta, t + 1)


LOG_SOFTMAX_CHUNK = 1 << 20  # elements per temporary of `log_softmax_`


def log_softmax_(logits: Tensor) -> Tensor:
    """Log-softmax over the last dim in place, in chunks of frames so that logsumexp's
    full-size temporary stays small."""
    per_frame = max(1, logits[:, :1].numel())
    step = max(1, LOG_SOFTMAX_CHUNK // per_frame)
    for start in range(0, logits.size(1), step):
        part = logits[:, start : start + step]
        part.sub_(torch.logsumexp(part, -1, keepdim=True))
    return logits


def nll_and_logit_grad_(
    logits: Tensor,
    targets: Tensor,
    frames: Tensor,
    tokens: Tensor,
    *,
    blank: int,
    weights: Tensor | None = None,
    grad_clamp: float | None = None,
) -> Tensor:
    """Negative log-likelihoods (G,) of a group; with `weights`, the logits become gradients.

    `logits` (G, T, U1, V) float32/64, padded beyond each sample's `frames` and `tokens` + 1
    (values there are ignored); `targets` (G, >= U1 - 1) int64. Without `weights` the
    logits are left as log-softmax and only the loss is computed (alpha only). With
    `weights` (G,), `logits` is overwritten in place by d(sum_g weights[g] * nll[g])/dz,
    zero at padded nodes, optionally clamped to [-grad_clamp, grad_clamp].
    """
    g, t, u1, vocab = logits.shape
    device = logits.device
    log_softmax_(logits)
    time_ok = torch.arange(t, device=device)[None, :, None] < frames[:, None, None]
    u_range = torch.arange(u1, device=device)[None, None, :]
    node_ok = time_ok & (u_range <= tokens[:, None, None])
    label_ok = time_ok & (u_range < tokens[:, None, None])
    labels = targets[:, : u1 - 1]
    labels = torch.cat([labels, labels.new_full((g, 1), blank)], 1).clamp(0, vocab - 1)
    label_index = labels[:, None, :, None].expand(g, t, u1, 1)
    blank_lp = logits[..., blank].masked_fill(~node_ok, NEG_INF)
    label_lp = logits.gather(-1, label_index).squeeze(-1).masked_fill(~label_ok, NEG_INF)

    alpha = forward_variables(blank_lp, label_lp)
    rows = torch.arange(g, device=device)
    log_p = alpha[rows, frames - 1, tokens] + blank_lp[rows, frames - 1, tokens]
    if weights is None:
        return -log_p

    beta = backward_variables(blank_lp, label_lp, frames, tokens)
    top = (alpha - log_p[:, None, None]).masked_fill(~node_ok, NEG_INF)  # log occupancy ...
    blank_move = (top + blank_lp + beta[:, 1:]).exp()  # ... of each move, then of each node
    label_move = torch.zeros_like(blank_move)  # no label move from u = U1 - 1
    torch.exp(top[..., :-1] + label_lp[..., :-1] + beta[:, :-1, 1:], out=label_move[..., :-1])
    top.add_(beta[:, :-1])
    logits.add_(top[..., None]).exp_()  # softmax * occupancy
    logits[..., blank].sub_(blank_move)
    logits.scatter_add_(-1, label_index, label_move.neg().unsqueeze(-1))
    if grad_clamp is not None:
        logits.clamp_(-grad_clamp, grad_clamp)
    logits.mul_(weights.to(logits.dtype)[:, None, None, None])
    return -log_p

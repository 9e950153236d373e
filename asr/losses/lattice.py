"""The transducer lattice in closed form: loss and d(loss)/d(logits) without autograd.

Legend: G samples in a group, T frames, U1 = U + 1 predictor positions, V vocabulary.
Node (t, u) has emitted u tokens after t frames. From (t, u) the blank moves to (t+1, u)
and the label y[u] to (t, u+1); the last blank, from (T-1, U), ends the path.

The forward variables alpha and the backward variables beta are computed one
anti-diagonal (t + u = n) at a time, vectorized over the diagonal and over all samples of a
chunk at once: T + U sequential steps, not T * U, and not once per sample. Diagonals become
rows of a "skewed" view: with u flipped to v = U1 - 1 - u and U1 - 1 rows of padding above
and below, node (t, u) sits at row n = t + u, column v of a strided view, so each step
reads row n - 1 (or n + 1) shifted by at most one column.

Gradient (with logP = log-likelihood of the targets, occupancy exp(alpha + beta - logP)):

    dL/dz[t,u,k] = softmax(z[t,u])[k] * occupancy[t,u]
                   - exp(alpha[t,u] + logp[t,u,k] + beta_next - logP)  if k is blank or y[u]

with beta_next = beta[t+1, u] for the blank (0 past the last frame of the last node) and
beta[t, u+1] for the label. `nll_and_logit_grad_` overwrites the logits with it.

The token-and-duration transducer (TDT, Xu et al., 2023, arXiv 2304.06795; `tdt_lattice`):
from node (t, u) an emission also picks a duration l of `durations` (D of them). A blank
moves to (t + l, u) and needs l >= 1; the label y[u] moves to (t + l, u + 1), l = 0
included. A path ends with a blank that lands exactly on frame F (the sample's frames) at
u = K (its tokens): the end node (F, K). Arc weights are log p(token) - sigma + log
p(duration), with sigma NeMo's logit under-normalization.

Every arc moves from anti-diagonal n = t + u to a later one (a blank by l >= 1, a label by
l + 1 >= 1), so the forward and backward variables are still computed one diagonal at a
time, vectorized over the diagonal and the samples of a chunk: T + U steps, each reading
the D diagonals before (after) it, in the same skewed layout, with `reach` rows of padding
before and after the diagonals so that reading diagonal n - l - 1 (n + l + 1) never leaves
the buffer.

The end node sits on the virtual row t = F (the lattice has T + 1 rows), so alpha there is
the likelihood, and the backward recursion starts every sample from beta = 0 at its own
end node. Arcs are -inf unless they leave a real node (t < F, u <= K) and land on or
before the end: a blank lands on t + l <= F, a label on t + l < F with u < K.

Gradients (occupancy of an arc: exp(alpha + arc + beta(destination) - logP)):

    dL/dz[k]  = softmax(z)[k] * occupancy(node) - sum_l occupancy(blank, l) [k = blank]
                                                - sum_l occupancy(label, l) [k = y[u]]
    dL/de[l]  = softmax(e)[l] * occupancy(node) - occupancy(blank, l) - occupancy(label, l)

for the token logits z and the duration logits e of the node: the token part has the form
of `GradientTerms`, so `logit_grad_` of either implementation writes it; `duration_grad_`
writes the small duration part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from asr.tdt import check_durations

NEG_INF = float("-inf")


def skewed_buffer(groups: int, frames: int, u1: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """A -inf buffer for `frames` x `u1` nodes of `groups` lattices and its view by
    diagonals: `(padded, diagonals)` with diagonals (G, frames + U1 - 1, U1) and node
    (t, u) at diagonals[:, t + u, U1 - 1 - u]; `window(padded, frames)` is the same
    nodes as (G, frames, U1) with u flipped. Entries outside the nodes are padding."""
    rows = frames + 2 * (u1 - 1)
    padded = like.new_full((groups, rows, u1), NEG_INF)
    diagonals = padded.as_strided((groups, frames + u1 - 1, u1), (rows * u1, u1, u1 + 1))
    return padded, diagonals


def window(padded: Tensor, frames: int) -> Tensor:
    """The nodes of a `skewed_buffer`, (G, frames, U1), u flipped (flip(-1) to read them)."""
    u1 = padded.size(-1)
    return padded[:, u1 - 1 : u1 - 1 + frames]


def _forward_recursion(alpha: Tensor, blank_d: Tensor, label_d: Tensor) -> None:
    """alpha by diagonals (G, T + U1 - 1, U1) from (0, 0): log-probability of reaching
    each node. One step per diagonal, vectorized over the diagonal and the samples."""
    u1 = alpha.size(-1)
    alpha[:, 0, u1 - 1] = 0.0
    for n in range(1, alpha.size(1)):
        prev = alpha[:, n - 1]
        via_blank = prev + blank_d[:, n - 1]
        via_label = prev[:, 1:] + label_d[:, n - 1, 1:]
        torch.logaddexp(via_blank[:, :-1], via_label, out=alpha[:, n, :-1])
        alpha[:, n, -1] = via_blank[:, -1]


def _backward_recursion(beta: Tensor, blank_d: Tensor, label_d: Tensor) -> None:
    """beta by diagonals (G, T + U1, U1), rows T + 1 with the virtual row T: the
    log-probability of reaching the corner (T, U1 - 1) from each node."""
    beta[:, -1, 0] = 0.0
    for n in range(beta.size(1) - 2, -1, -1):
        nxt = beta[:, n + 1]
        via_blank = nxt + blank_d[:, n]
        via_label = nxt[:, :-1] + label_d[:, n, 1:]
        torch.logaddexp(via_blank[:, 1:], via_label, out=beta[:, n, 1:])
        beta[:, n, 0] = via_blank[:, 0]


def node_scores_(
    logits: Tensor, labels: Tensor, *, blank: int, lse: Tensor, z_blank: Tensor, z_label: Tensor
) -> None:
    """What the lattice needs of a group's logits (G, T, U1, V), which it overwrites (with
    exp(z - max z)): per node the log-normalizer `lse` = logsumexp_k z[k], `z_blank` =
    z[blank] and `z_label` = z[labels[u]], written into the given (G, T, U1) tensors (views
    of larger ones will do). `labels` (G, U1) holds valid token ids (any at u = U1 - 1).
    A fixed number of ops and no temporary as large as the logits."""
    g, t, u1, _ = logits.shape
    z_blank.copy_(logits[..., blank])
    index = labels[:, None, :, None].expand(g, t, u1, 1)
    z_label.unsqueeze(-1).copy_(logits.gather(-1, index))
    lse.copy_(logits.amax(-1))
    logits.sub_(lse[..., None]).exp_()
    lse.add_(logits.sum(-1).log_())


@dataclass
class GradientTerms:
    """Per node (C, T, U1) of a lattice, what turns logits z into d(nll)/dz:

    dL/dz[k] = exp(z[k] + shift) - blank_move [k = blank] + neg_label_move [k = y[u]]

    with shift = log(occupancy) - lse (so exp(z + shift) = softmax(z) * occupancy) and the
    occupancies of the blank and label moves; -inf and 0 at nodes outside a sample."""

    shift: Tensor
    blank_move: Tensor
    neg_label_move: Tensor

    def __getitem__(self, key: object) -> GradientTerms:
        return GradientTerms(self.shift[key], self.blank_move[key], self.neg_label_move[key])


def lattice(
    lse: Tensor,
    z_blank: Tensor,
    z_label: Tensor,
    frames: Tensor,
    tokens: Tensor,
    *,
    gradient: bool,
) -> tuple[Tensor, GradientTerms | None]:
    """Negative log-likelihoods (C,) of C samples from their node scores (C, T, U1) (see
    `node_scores_`; values outside each sample's `frames` x `tokens` + 1 are ignored) and,
    with `gradient`, the terms of the logit gradient, written over the three inputs.

    One recursion for all C samples: the number of ops grows with T + U, not with C. So
    that the backward variables start from one node for every sample, each sample's end
    (frames, tokens) is joined to the corner (T, U1 - 1) of the padded lattice by a path
    of probability 1 (blanks down column `tokens`, then labels along the virtual row T);
    beta at the end is then 0, as it must be, and nothing else changes at real nodes.
    """
    c, t, u1 = lse.shape
    device = lse.device
    rows = torch.arange(t + 1, device=device)[None, :, None]
    cols = torch.arange(u1, device=device)[None, None, :]
    f, k = frames[:, None, None], tokens[:, None, None]
    node_ok = (rows[:, :t] < f) & (cols <= k)
    label_ok = (rows[:, :t] < f) & (cols < k)
    blank_lp = z_blank.sub_(lse).masked_fill_(~node_ok, NEG_INF)
    label_lp = z_label.sub_(lse).masked_fill_(~label_ok, NEG_INF)
    v = u1 - 1 - cols  # the flipped column of u, as the windows hold them
    blank_pad, blank_d = skewed_buffer(c, t + 1, u1, lse)
    label_pad, label_d = skewed_buffer(c, t + 1, u1, lse)
    window(blank_pad, t + 1)[:, :t] = blank_lp.flip(-1)
    window(label_pad, t + 1)[:, :t] = label_lp.flip(-1)

    alpha_pad, alpha = skewed_buffer(c, t, u1, lse)
    _forward_recursion(alpha, blank_d, label_d)
    index = torch.arange(c, device=device)
    last = frames - 1 + tokens
    log_p = alpha[index, last, u1 - 1 - tokens] + blank_lp[index, frames - 1, tokens]
    if not gradient:
        return -log_p, None

    to_corner_blank = (rows >= f) & (rows < t) & (v == u1 - 1 - k)
    to_corner_label = (rows == t) & (v <= u1 - 1 - k) & (v > 0)
    window(blank_pad, t + 1).masked_fill_(to_corner_blank.flip(-1), 0.0)
    window(label_pad, t + 1).masked_fill_(to_corner_label.flip(-1), 0.0)
    beta_pad, beta = skewed_buffer(c, t + 1, u1, lse)
    _backward_recursion(beta, blank_d, label_d)

    n = alpha.size(1)
    top = alpha.sub_(log_p[:, None, None])  # log occupancy ...
    blank_d[:, :n].add_(top).add_(beta[:, 1:]).exp_()  # ... of each blank move
    label_d[:, :n, 1:].add_(top[:, :, 1:]).add_(beta[:, 1:, :-1])
    label_d[:, :n].exp_()  # ... of each label move (none from u = U1 - 1)
    top.add_(beta[:, :n])  # ... of each node
    del beta_pad, beta
    # Back to (C, T, U1), over the inputs: shift = log occupancy - lse.
    shift = torch.sub(window(alpha_pad, t).flip(-1), lse, out=lse).masked_fill_(~node_ok, NEG_INF)
    blank_move = z_blank.copy_(window(blank_pad, t).flip(-1)).masked_fill_(~node_ok, 0.0)
    neg_label_move = z_label.copy_(window(label_pad, t).flip(-1)).neg_()
    neg_label_move.masked_fill_(~label_ok, 0.0)
    return -log_p, GradientTerms(shift, blank_move, neg_label_move)


def _log_smallest_normal(dtype: torch.dtype) -> float:
    """log of the smallest positive normal number of `dtype`: exp() below it is subnormal."""
    return math.log(torch.finfo(dtype).tiny)


def logit_grad_(
    logits: Tensor,
    labels: Tensor,
    terms: GradientTerms,
    *,
    blank: int,
    weights: Tensor | None = None,
    grad_clamp: float | None = None,
) -> Tensor:
    """Overwrite a group's logits (G, T, U1, V) with d(sum_g weights[g] nll[g])/dz, given
    `terms` (G, T, U1) from `lattice` and `labels` (G, U1); zero outside each sample,
    optionally clamped to [-grad_clamp, grad_clamp]. A fixed number of ops."""
    g, t, u1, _ = logits.shape
    logits.add_(terms.shift[..., None])
    # exp() of these would be subnormal numbers, ~1e-38 and below: as good as 0 for a
    # gradient, but arithmetic on them is many times slower on CPUs (the backward's matmuls
    # took 2-5x longer with them). 0 instead, as flush-to-zero would give.
    logits.masked_fill_(logits < _log_smallest_normal(logits.dtype), NEG_INF).exp_()
    logits[..., blank].sub_(terms.blank_move)
    index = labels[:, None, :, None].expand(g, t, u1, 1)
    logits.scatter_add_(-1, index, terms.neg_label_move[..., None])
    if grad_clamp is not None:
        logits.clamp_(-grad_clamp, grad_clamp)
    if weights is not None:
        logits.mul_(weights.to(logits.dtype)[:, None, None, None])
    return logits


def padded_labels(targets: Tensor, u1: int, *, blank: int, vocab: int) -> Tensor:
    """(G, >= U1 - 1) targets -> (G, U1) valid ids: y[0..U1-2] then blank (no label move
    leaves u = U1 - 1), clamped into the vocabulary (padding may hold anything)."""
    labels = targets[:, : u1 - 1]
    return torch.cat([labels, labels.new_full((labels.size(0), 1), blank)], 1).clamp(0, vocab - 1)


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
    """Negative log-likelihoods (G,) of one group; with `weights`, the logits become gradients.

    The whole computation for one group's logits (G, T, U1, V) float32/64, padded beyond
    each sample's `frames` and `tokens` + 1; `targets` (G, >= U1 - 1) int64. Without
    `weights` only the loss is computed (alpha only) and the logits are overwritten. With
    `weights` (G,), `logits` is overwritten by d(sum_g weights[g] nll[g])/dz, zero at
    padded nodes, optionally clamped. The reference for the fused kernels.
    """
    g, t, u1, vocab = logits.shape
    labels = padded_labels(targets, u1, blank=blank, vocab=vocab)
    lse, z_blank, z_label = logits.new_empty((3, g, t, u1)).unbind(0)
    scratch = logits if weights is None else logits.clone()
    node_scores_(scratch, labels, blank=blank, lse=lse, z_blank=z_blank, z_label=z_label)
    nll, terms = lattice(lse, z_blank, z_label, frames, tokens, gradient=weights is not None)
    if terms is not None:
        logit_grad_(logits, labels, terms, blank=blank, weights=weights, grad_clamp=grad_clamp)
    return nll


@dataclass
class TdtGradientTerms:
    """Per node (C, T, U1) what turns the joiner's logits into d(nll)/d(logits): `tokens`
    for the token logits (as the plain transducer's), and for the duration logits
    `log_occupancy` (C, T, U1) with `duration_moves` (C, T, U1, D), the occupancy of the
    arcs of each duration (blank and label together). -inf and 0 outside a sample."""

    tokens: GradientTerms
    log_occupancy: Tensor
    duration_moves: Tensor

    def __getitem__(self, key: object) -> TdtGradientTerms:
        return TdtGradientTerms(self.tokens[key], self.log_occupancy[key], self.duration_moves[key])


def duration_log_probs_(duration_logits: Tensor, out: Tensor) -> Tensor:
    """log_softmax of the duration logits (..., D) into `out` (same shape, any layout)."""
    return out.copy_(torch.log_softmax(duration_logits.to(out.dtype), dim=-1))


def _diagonal_buffer(
    c: int, rows: int, u1: int, reach: int, like: Tensor, extra: tuple[int, ...] = ()
) -> tuple[Tensor, Tensor]:
    """A -inf buffer for `rows` x `u1` nodes of `c` lattices, and two views of it:
    (diagonals (C, reach + rows + U1 - 1 + reach, U1, *extra) with node (t, u) at
    [:, reach + t + u, U1 - 1 - u], nodes (C, rows, U1, *extra) with u flipped)."""
    total = 2 * reach + rows + 2 * (u1 - 1)
    inner = 1
    for size in extra:
        inner *= size
    buf = like.new_full((c, total, u1, *extra), NEG_INF)
    inner_strides = buf.stride()[3:]
    diagonals = buf.as_strided(
        (c, 2 * reach + rows + u1 - 1, u1, *extra),
        (total * u1 * inner, u1 * inner, (u1 + 1) * inner, *inner_strides),
    )
    nodes = buf[:, reach + u1 - 1 : reach + u1 - 1 + rows]
    return diagonals, nodes


def tdt_lattice(
    lse: Tensor,
    z_blank: Tensor,
    z_label: Tensor,
    duration_lp: Tensor,
    frames: Tensor,
    tokens: Tensor,
    *,
    durations: tuple[int, ...],
    sigma: float = 0.0,
    gradient: bool,
) -> tuple[Tensor, TdtGradientTerms | None]:
    """Negative log-likelihoods (C,) of C samples from their node scores: the token
    logits' `lse`, `z_blank`, `z_label` (C, T, U1; see `asr.losses.lattice.node_scores_`)
    and the durations' log-probabilities `duration_lp` (C, T, U1, D), values outside each
    sample's `frames` x `tokens` + 1 ignored. With `gradient`, also the terms of the
    logit gradient (the token terms written over `lse`, `z_blank`, `z_label`)."""
    durations = check_durations(durations)
    c, t, u1 = lse.shape
    d = len(durations)
    if duration_lp.shape != (c, t, u1, d):
        raise ValueError(f"duration_lp has shape {tuple(duration_lp.shape)}, not {(c, t, u1, d)}")
    device, dtype = lse.device, lse.dtype
    reach = max(durations) + 1
    rows = torch.arange(t, device=device)[None, :, None, None]
    cols = torch.arange(u1, device=device)[None, None, :, None]
    lengths = torch.tensor(durations, device=device)[None, None, None, :]
    f, k = frames[:, None, None, None], tokens[:, None, None, None]
    node_ok = (rows < f) & (cols <= k)
    blank_ok = node_ok & (lengths >= 1) & (rows + lengths <= f)
    label_ok = node_ok & (cols < k) & (rows + lengths < f)
    blank_lp = (z_blank - lse - sigma)[..., None]
    label_lp = (z_label - lse - sigma)[..., None]
    duration_lp = duration_lp.to(dtype)
    blank_arc = (blank_lp + duration_lp).masked_fill_(~blank_ok, NEG_INF)
    label_arc = (label_lp + duration_lp).masked_fill_(~label_ok, NEG_INF)

    blank_d, blank_nodes = _diagonal_buffer(c, t + 1, u1, reach, lse, (d,))
    label_d, label_nodes = _diagonal_buffer(c, t + 1, u1, reach, lse, (d,))
    blank_nodes[:, :t] = blank_arc.flip(2)
    label_nodes[:, :t] = label_arc.flip(2)
    del blank_arc, label_arc
    alpha_d, alpha_nodes = _diagonal_buffer(c, t + 1, u1, reach, lse)

    which = torch.arange(d, device=device)
    is_blank = torch.tensor([length >= 1 for length in durations], device=device)
    blank_which, blank_len = which[is_blank], torch.tensor(durations, device=device)[is_blank]
    label_len = torch.tensor(durations, device=device)
    diagonals = alpha_d.size(1)
    first, last = reach, diagonals - reach  # the real diagonals: [first, last)
    alpha_d[:, first, u1 - 1] = 0.0  # node (0, 0)
    label_pad = lse.new_full((d, c, 1), NEG_INF)
    for m in range(first + 1, last):
        via_blank = alpha_d[:, m - blank_len].transpose(0, 1)
        via_blank = via_blank + blank_d[:, m - blank_len, :, blank_which]
        via_label = alpha_d[:, m - label_len - 1, 1:].transpose(0, 1)
        via_label = via_label + label_d[:, m - label_len - 1, 1:, which]
        terms = torch.cat([via_blank, torch.cat([via_label, label_pad], 2)], 0)
        alpha_d[:, m] = torch.logsumexp(terms, 0)
    samples = torch.arange(c, device=device)
    log_p = alpha_nodes[samples, frames, u1 - 1 - tokens]
    if not gradient:
        return -log_p, None

    beta_d, beta_nodes = _diagonal_buffer(c, t + 1, u1, reach, lse)
    end_d, end_nodes = _diagonal_buffer(c, t + 1, u1, reach, lse)
    end_nodes[samples, frames, u1 - 1 - tokens] = 0.0
    end_pad = lse.new_full((1, c, 1), NEG_INF)
    for m in range(last - 1, first - 1, -1):
        via_blank = beta_d[:, m + blank_len].transpose(0, 1)
        via_blank = via_blank + blank_d[:, m, :, blank_which].permute(2, 0, 1)
        via_label = beta_d[:, m + label_len + 1, :-1].transpose(0, 1)
        via_label = via_label + label_d[:, m, 1:, :].permute(2, 0, 1)
        terms = torch.cat(
            [via_blank, torch.cat([end_pad.expand(d, c, 1), via_label], 2), end_d[None, :, m]], 0
        )
        beta_d[:, m] = torch.logsumexp(terms, 0)

    # A sample no path can explain (more tokens than frames without a zero duration) has
    # nll = inf and no gradient: its occupancies are exp(-inf) = 0, not NaN.
    log_p_or_inf = torch.where(log_p > NEG_INF, log_p, float("inf"))
    top = alpha_d[:, first:last] - log_p_or_inf[:, None, None]  # log occupancy of a node
    for i, length in enumerate(durations):  # arcs' occupancies, written over their weights
        blank_d[:, first:last, :, i] += top + beta_d[:, first + length : last + length]
        label_d[:, first:last, 1:, i] += top[:, :, 1:]
        label_d[:, first:last, 1:, i] += beta_d[:, first + length + 1 : last + length + 1, :-1]
        label_d[:, first:last, 0, i] = NEG_INF
    blank_moves = blank_nodes[:, :t].flip(2).exp_()  # (C, T, U1, D)
    label_moves = label_nodes[:, :t].flip(2).exp_()
    node = node_ok[..., 0]
    log_occupancy = (alpha_nodes[:, :t] + beta_nodes[:, :t]).flip(2)
    log_occupancy = log_occupancy.sub_(log_p_or_inf[:, None, None])
    log_occupancy = log_occupancy.masked_fill_(~node, NEG_INF)
    shift = torch.sub(log_occupancy, lse, out=lse).masked_fill_(~node, NEG_INF)
    blank_move = z_blank.copy_(blank_moves.sum(-1)).masked_fill_(~node, 0.0)
    neg_label_move = z_label.copy_(label_moves.sum(-1)).neg_().masked_fill_(~node, 0.0)
    duration_moves = blank_moves.add_(label_moves).masked_fill_(~node[..., None], 0.0)
    tokens_terms = GradientTerms(shift, blank_move, neg_label_move)
    return -log_p, TdtGradientTerms(tokens_terms, log_occupancy, duration_moves)


def duration_grad_(
    duration_logits: Tensor,
    terms: TdtGradientTerms,
    *,
    weights: Tensor | None = None,
    grad_clamp: float | None = None,
) -> Tensor:
    """Overwrite a group's duration logits (G, T, U1, D) with d(sum_g weights[g]
    nll[g])/de from `terms` (G, T, U1): softmax(e) * occupancy - the arcs' occupancies;
    zero outside each sample, optionally clamped."""
    lp = torch.log_softmax(duration_logits.to(terms.log_occupancy.dtype), dim=-1)
    lp.add_(terms.log_occupancy[..., None])
    lp.masked_fill_(lp < _log_smallest_normal(lp.dtype), NEG_INF)  # as in logit_grad_
    grad = lp.exp_().sub_(terms.duration_moves)
    if grad_clamp is not None:
        grad.clamp_(-grad_clamp, grad_clamp)
    if weights is not None:
        grad.mul_(weights.to(grad.dtype)[:, None, None, None])
    return duration_logits.copy_(grad)

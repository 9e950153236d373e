"""The transducer lattice of `asr.losses.lattice` as four Triton kernels, one launch each.

Same contracts as the PyTorch reference (`node_scores_`, `lattice`, `logit_grad_`,
`tdt_lattice`), but a fixed number of launches per chunk or group instead of a few ops per
anti-diagonal.

- `node_scores_`: one program per block of nodes, a streaming logsumexp over V in blocks
  (running max and rescaled sum), plus two gathers; the logits are only read.
- `lattice`: one program per sample, over that sample's own frames F and tokens K. Lane u
  of a block of BLOCK_U = next_power_of_2(U1) lanes holds node (n - u, u) of anti-diagonal
  n. The forward loop (n = 0 .. F+K-1) writes alpha to a (C, T, U1) scratch and reads
  diagonal n-1 back from it after a `tl.debug_barrier()` (a CTA-wide barrier on the GPU:
  the lanes u-1 and u are not the same thread, nor always the same warp). The backward
  loop keeps beta in a ring of 2 diagonals per sample and, once beta of a diagonal is
  known, writes the three gradient terms of its nodes over the inputs. Per step it first
  reads (inputs of diagonal n, beta of n+1), then stores beta of n into the other ring slot,
  then a barrier, then the terms. So one barrier per diagonal orders every write after the
  reads of the same memory by other threads: a node's inputs may be loaded by several
  threads (a block smaller than the CTA replicates lanes) but are overwritten by one, only
  after the barrier; a ring slot is rewritten a step after it was last read, past a barrier.
  Launched with num_stages=1 so that no software pipelining moves loads across a barrier.
  Memory per node: the three inputs (rewritten in place) and one alpha; per sample
  2 * BLOCK_U ring values.
- `logit_grad_`: one program per block of nodes, one pass over V writing the gradient.
- `tdt_lattice`: the token-and-duration lattice, one program per sample over its diagonals
  n = 0 .. F+K (the end node (F, K) on a virtual row t = F). Every arc moves to a later
  diagonal (a blank by l >= 1, a label by l + 1), so diagonal n reads the D diagonals before
  it (alpha) or after it (beta): both live in (C, T + 1, U1) scratch, not a ring, each value
  written once. Blocks are BLOCK_U lanes x BLOCK_D = next_power_of_2(D) durations, entry
  (u, i) the arcs of duration i into or out of node (n - u, u); a node's value is one
  logsumexp over its row. Forward step: read, store alpha of n, barrier. Backward step:
  read the inputs of diagonal n and beta after it, store beta of n, barrier, then write the
  token terms over the inputs of n, and `log_occupancy` and `duration_moves` (new tensors).
  After the forward pass a node's inputs are read only in its own step, so again one
  barrier per step orders every overwrite after the reads; num_stages=1. Memory per node:
  the three inputs (rewritten) and D duration log-probs (read), alpha and beta, and with
  the gradient 1 + D outputs. num_warps grows with the block (at most 8): registers.

Kernels run compiled on CUDA, or in Triton's interpreter on CPU tensors when there is no
GPU (or TRITON_INTERPRET=1): slow, but it makes the kernels testable anywhere.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton import knobs

from asr.losses.lattice import GradientTerms, TdtGradientTerms
from asr.tdt import check_durations

INTERPRET = knobs.runtime.interpret or not torch.cuda.is_available()
TILE = 4096  # elements of a (nodes x vocabulary) block in the per-node kernels
MAX_BLOCK_V = 1024


def _jit(fn: Callable[..., object]) -> triton.JITFunction:
    """`triton.jit` in the mode chosen at import: compiled with a GPU, interpreted without."""
    with knobs.runtime.scope():
        knobs.runtime.interpret = INTERPRET
        return triton.jit(fn)


def is_supported(device: torch.device) -> bool:
    """Whether the kernels can run on `device`: CUDA, or CPU in interpreter mode."""
    return device.type == "cuda" or (INTERPRET and device.type == "cpu")


def _check_device(tensor: Tensor) -> None:
    if not is_supported(tensor.device):
        raise RuntimeError(
            f"asr.losses.triton_lattice cannot run on {tensor.device}: Triton kernels need a "
            "CUDA device (or CPU tensors with TRITON_INTERPRET=1)"
        )


def _blocks(vocab: int, nodes: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_V) of the per-node kernels: V in blocks of at most MAX_BLOCK_V."""
    block_v = min(triton.next_power_of_2(vocab), MAX_BLOCK_V)
    return max(1, min(TILE // block_v, triton.next_power_of_2(nodes))), block_v


@_jit
def _logaddexp(a, b):
    """log(exp(a) + exp(b)); -inf, not NaN, when both are -inf. log1p(x) as
    log(w) - ((w - 1) - x) / w with w = 1 + x: corrects the rounding of w, as accurate as
    torch's log1p for small x (libdevice's log1p does not run in the interpreter)."""
    hi = tl.maximum(a, b)
    x = tl.exp(tl.minimum(a, b) - tl.where(hi == float("-inf"), 0.0, hi))  # no inf - inf
    w = 1.0 + x
    return hi + (tl.log(w) - ((w - 1.0) - x) / w)


@_jit
def _max(a, b):
    return tl.maximum(a, b)


@_jit
def _add(a, b):
    return a + b


@_jit
def _log_prob(z_u, lse_u, t, z_s1, lse_s1, mask):
    """z - lse at node (t, u) of each lane (pointers per lane), -inf where not `mask`."""
    z = tl.load(z_u + t * z_s1, mask=mask, other=0.0)
    lse = tl.load(lse_u + t * lse_s1, mask=mask, other=0.0)
    return tl.where(mask, z - lse, float("-inf"))


@_jit
def _node_scores_kernel(
    logits_ptr, labels_ptr, lse_ptr, zb_ptr, zl_ptr,
    nodes, t_max, u1, vocab, blank, z_s0, z_s1, z_s2, z_s3,
    lab_s0, lab_s1, lse_s0, lse_s1, lse_s2, zb_s0, zb_s1, zb_s2, zl_s0, zl_s1, zl_s2,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    node = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = node < nodes
    g, t, u = node // (t_max * u1), node // u1 % t_max, node % u1
    row = logits_ptr + g * z_s0 + t * z_s1 + u * z_s2
    top = tl.full([BLOCK_N], float("-inf"), logits_ptr.dtype.element_ty)  # running max
    total = tl.full([BLOCK_N], 0.0, logits_ptr.dtype.element_ty)  # sum of exp(z - top)
    for start in range(0, vocab, BLOCK_V):
        k = start + tl.arange(0, BLOCK_V)
        z = tl.load(row[:, None] + k[None, :] * z_s3, mask=ok[:, None] & (k < vocab)[None, :])
        z = tl.where((k < vocab)[None, :], z, float("-inf"))
        new_top = tl.maximum(top, tl.reduce(z, 1, _max))
        total = total * tl.exp(top - new_top) + tl.reduce(tl.exp(z - new_top[:, None]), 1, _add)
        top = new_top
    label = tl.load(labels_ptr + g * lab_s0 + u * lab_s1, mask=ok, other=0)
    z_blank = tl.load(row + blank * z_s3, mask=ok)
    z_label = tl.load(row + label * z_s3, mask=ok)
    tl.store(lse_ptr + g * lse_s0 + t * lse_s1 + u * lse_s2, top + tl.log(total), mask=ok)
    tl.store(zb_ptr + g * zb_s0 + t * zb_s1 + u * zb_s2, z_blank, mask=ok)
    tl.store(zl_ptr + g * zl_s0 + t * zl_s1 + u * zl_s2, z_label, mask=ok)


@_jit
def _lattice_kernel(
    lse_ptr, zb_ptr, zl_ptr, frames_ptr, tokens_ptr, nll_ptr, alpha_ptr, ring_ptr,
    t_max, u1, lse_s0, lse_s1, lse_s2, zb_s0, zb_s1, zb_s2, zl_s0, zl_s1, zl_s2,
    GRADIENT: tl.constexpr, BLOCK_U: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0).to(tl.int64)
    f = tl.load(frames_ptr + c).to(tl.int32)
    k = tl.load(tokens_ptr + c).to(tl.int32)
    u = tl.arange(0, BLOCK_U)
    # Per lane u, pointers to node (0, u); node (t, u) is `t` rows (stride s1) further.
    lse_u = lse_ptr + c * lse_s0 + u * lse_s2
    zb_u = zb_ptr + c * zb_s0 + u * zb_s2
    zl_u = zl_ptr + c * zl_s0 + u * zl_s2
    alpha_u = alpha_ptr + c * t_max * u1 + u
    ring_u = ring_ptr + c * 2 * BLOCK_U + u
    for n in range(0, f + k):  # alpha, diagonal n from diagonal n - 1
        t = n - u
        node = (t >= 0) & (t < f) & (u <= k)
        top, left = node & (t > 0), node & (u > 0)  # from (t - 1, u), from (t, u - 1)
        via_blank = tl.load(alpha_u + (t - 1) * u1, mask=top, other=float("-inf"))
        via_blank += _log_prob(zb_u, lse_u, t - 1, zb_s1, lse_s1, top)
        via_label = tl.load(alpha_u - 1 + t * u1, mask=left, other=float("-inf"))
        via_label += _log_prob(zl_u - zl_s2, lse_u - lse_s2, t, zl_s1, lse_s1, left)
        alpha = tl.where(n == 0, 0.0, _logaddexp(via_blank, via_label))
        tl.store(alpha_u + t * u1, alpha, mask=node)
        tl.debug_barrier()
    last = (f - 1) * u1 + k  # the final blank leaves node (F - 1, K)
    log_p = tl.load(alpha_ptr + c * t_max * u1 + last)
    log_p += tl.load(zb_ptr + c * zb_s0 + (f - 1) * zb_s1 + k * zb_s2)
    log_p -= tl.load(lse_ptr + c * lse_s0 + (f - 1) * lse_s1 + k * lse_s2)
    tl.store(nll_ptr + c, -log_p)
    if GRADIENT:
        dtype = lse_ptr.dtype.element_ty
        for row in range(0, t_max):  # nodes outside the sample, which the loop below skips
            pad = (u < u1) & ((row >= f) | (u > k))
            tl.store(lse_u + row * lse_s1, tl.full([BLOCK_U], float("-inf"), dtype), pad)
            tl.store(zb_u + row * zb_s1, tl.full([BLOCK_U], 0.0, dtype), pad)
            tl.store(zl_u + row * zl_s1, tl.full([BLOCK_U], 0.0, dtype), pad)
        for i in range(0, f + k):  # beta and the gradient terms, diagonal n from n + 1
            n = f + k - 1 - i
            t = n - u
            node = (t >= 0) & (t < f) & (u <= k)
            lse = tl.load(lse_u + t * lse_s1, mask=node, other=0.0)
            blank_lp = _log_prob(zb_u, lse_u, t, zb_s1, lse_s1, node)
            label_lp = _log_prob(zl_u, lse_u, t, zl_s1, lse_s1, node & (u < k))
            next_row = ring_u + (n + 1) % 2 * BLOCK_U
            below = tl.load(next_row, mask=node & (t + 1 < f), other=float("-inf"))
            below = tl.where((t == f - 1) & (u == k), 0.0, below)  # past the final blank
            right = tl.load(next_row + 1, mask=node & (u < k), other=float("-inf"))
            beta = _logaddexp(blank_lp + below, label_lp + right)
            occupancy = tl.load(alpha_u + t * u1, mask=node, other=float("-inf")) - log_p
            tl.store(ring_u + n % 2 * BLOCK_U, beta)
            tl.debug_barrier()  # all reads of this diagonal's inputs and of ring row n
            tl.store(lse_u + t * lse_s1, occupancy + beta - lse, mask=node)
            tl.store(zb_u + t * zb_s1, tl.exp(blank_lp + occupancy + below), mask=node)
            tl.store(zl_u + t * zl_s1, 0.0 - tl.exp(label_lp + occupancy + right), mask=node)


@_jit
def _row_max(x):
    """tl.max(x, 1) in both modes (Triton's own is not callable from an interpreted kernel);
    the interpreter reduces with numpy for Triton's standard combine functions."""
    return tl.reduce(x, 1, tl.standard._elementwise_max)


@_jit
def _row_sum(x):
    """tl.sum(x, 1) in both modes, as `_row_max`."""
    return tl.reduce(x, 1, tl.standard._sum_combine)


@_jit
def _logsumexp2(a, b, c):
    """Per lane, logsumexp of the rows of `a` and `b` (BLOCK_U x BLOCK_D) and of `c`
    (BLOCK_U); -inf, not NaN, where all are -inf."""
    top = tl.maximum(tl.maximum(_row_max(a), _row_max(b)), c)
    shift = tl.where(top == float("-inf"), 0.0, top)  # no inf - inf
    total = _row_sum(tl.exp(a - shift[:, None])) + _row_sum(tl.exp(b - shift[:, None]))
    total += tl.exp(c - shift)  # >= 1 (the top term's 1) unless all are -inf, then 0: no log(0)
    return top + tl.log(tl.maximum(total, 1.0))


@_jit
def _tdt_lattice_kernel(
    lse_ptr, zb_ptr, zl_ptr, dlp_ptr, durations_ptr, frames_ptr, tokens_ptr, sigma_ptr,
    nll_ptr, alpha_ptr, beta_ptr, occupancy_ptr, moves_ptr,
    t_max, u1, lse_s0, lse_s1, lse_s2, zb_s0, zb_s1, zb_s2, zl_s0, zl_s1, zl_s2,
    dlp_s0, dlp_s1, dlp_s2, dlp_s3,
    GRADIENT: tl.constexpr, D: tl.constexpr, BLOCK_U: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    c = tl.program_id(0).to(tl.int64)
    f = tl.load(frames_ptr + c).to(tl.int32)
    k = tl.load(tokens_ptr + c).to(tl.int32)
    sigma = tl.load(sigma_ptr)
    dtype = lse_ptr.dtype.element_ty
    neg_inf = tl.full([BLOCK_U], float("-inf"), dtype)
    u = tl.arange(0, BLOCK_U)
    i = tl.arange(0, BLOCK_D)  # durations on the second axis: [lane, duration] blocks
    is_duration = (i < D)[None, :]
    length = tl.load(durations_ptr + i, mask=i < D, other=0)[None, :]
    # Per lane u, pointers to node (0, u); node (t, u) is `t` rows (stride s1) further.
    lse_u = lse_ptr + c * lse_s0 + u * lse_s2
    zb_u = zb_ptr + c * zb_s0 + u * zb_s2
    zl_u = zl_ptr + c * zl_s0 + u * zl_s2
    dlp_u = (dlp_ptr + c * dlp_s0 + u * dlp_s2)[:, None] + i[None, :] * dlp_s3
    alpha_u = alpha_ptr + c * (t_max + 1) * u1 + u  # T + 1 rows: the end node's row F too
    for n in range(0, f + k + 1):  # alpha, diagonal n from the D diagonals before it
        t = n - u
        node = (t >= 0) & (t <= f) & (u <= k)
        src = t[:, None] - length  # the row that the arcs of each duration leave
        blank = (node[:, None] & is_duration) & (length >= 1) & (src >= 0)  # from (src, u)
        label = (node & (u > 0) & (t < f))[:, None] & is_duration & (src >= 0)  # (src, u - 1)
        arc = _log_prob(zb_u[:, None], lse_u[:, None], src, zb_s1, lse_s1, blank) - sigma
        arc += tl.load(dlp_u + src * dlp_s1, mask=blank, other=0.0)
        via_blank = tl.load(alpha_u[:, None] + src * u1, mask=blank, other=float("-inf")) + arc
        arc = _log_prob(zl_u[:, None] - zl_s2, lse_u[:, None] - lse_s2, src, zl_s1, lse_s1,
                        label) - sigma  # fmt: skip
        arc += tl.load(dlp_u - dlp_s2 + src * dlp_s1, mask=label, other=0.0)
        via_label = tl.load(alpha_u[:, None] - 1 + src * u1, mask=label, other=float("-inf")) + arc
        start = tl.where((t == 0) & (u == 0), 0.0, neg_inf)  # alpha = 0 at node (0, 0)
        alpha = _logsumexp2(via_blank, via_label, start)
        tl.store(alpha_u + t * u1, alpha, mask=node)
        tl.debug_barrier()
    log_p = tl.load(alpha_ptr + c * (t_max + 1) * u1 + f * u1 + k)  # at the end node (F, K)
    tl.store(nll_ptr + c, -log_p)
    if GRADIENT:
        # A sample that no path explains: nll = inf, and occupancies exp(-inf) = 0, not NaN.
        log_p = tl.where(log_p > float("-inf"), log_p, float("inf"))
        zero, no_moves = tl.full([BLOCK_U], 0.0, dtype), tl.full([BLOCK_U, BLOCK_D], 0.0, dtype)
        occupancy_u = occupancy_ptr + c * t_max * u1 + u
        moves_u = moves_ptr + (c * t_max * u1 + u)[:, None] * D + i[None, :]
        for row in range(0, t_max):  # nodes outside the sample, which the loop below skips
            pad = (u < u1) & ((row >= f) | (u > k))
            tl.store(lse_u + row * lse_s1, neg_inf, mask=pad)
            tl.store(zb_u + row * zb_s1, zero, mask=pad)
            tl.store(zl_u + row * zl_s1, zero, mask=pad)
            tl.store(occupancy_u + row * u1, neg_inf, mask=pad)
            tl.store(moves_u + row * u1 * D, no_moves, mask=pad[:, None] & is_duration)
        beta_u = beta_ptr + c * (t_max + 1) * u1 + u
        for j in range(0, f + k + 1):  # beta and the terms, diagonal n from the D after it
            n = f + k - j
            t = n - u
            node = (t >= 0) & (t <= f) & (u <= k)
            real = node & (t < f)  # not the virtual row F: no arc leaves it
            lse = tl.load(lse_u + t * lse_s1, mask=real, other=0.0)
            blank_lp = _log_prob(zb_u, lse_u, t, zb_s1, lse_s1, real) - sigma
            label_lp = _log_prob(zl_u, lse_u, t, zl_s1, lse_s1, real & (u < k)) - sigma
            alpha = tl.load(alpha_u + t * u1, mask=real, other=float("-inf"))
            top = (alpha - log_p)[:, None]  # log occupancy of reaching the node
            dest = t[:, None] + length  # the row that the arcs of each duration reach
            arcs = real[:, None] & is_duration
            blank = arcs & (length >= 1) & (dest <= f)  # to (dest, u)
            label = arcs & (u < k)[:, None] & (dest < f)  # to (dest, u + 1)
            lp = tl.load(dlp_u + t[:, None] * dlp_s1, mask=arcs, other=0.0)
            blank_arc = tl.where(blank, blank_lp[:, None] + lp, float("-inf"))
            label_arc = tl.where(label, label_lp[:, None] + lp, float("-inf"))
            blank_next = tl.load(beta_u[:, None] + dest * u1, mask=blank, other=float("-inf"))
            label_next = tl.load(beta_u[:, None] + 1 + dest * u1, mask=label, other=float("-inf"))
            end = tl.where((t == f) & (u == k), 0.0, neg_inf)  # beta = 0 at the end node
            beta = _logsumexp2(blank_next + blank_arc, label_next + label_arc, end)
            blank_arc = tl.exp(blank_arc + (top + blank_next))  # the arcs' occupancies
            label_arc = tl.exp((label_arc + top) + label_next)
            tl.store(beta_u + t * u1, beta, mask=node)
            tl.debug_barrier()  # all reads of this diagonal's inputs, beta of n for n - 1, ...
            tl.store(moves_u + t[:, None] * u1 * D, blank_arc + label_arc, mask=arcs)
            log_occupancy = (alpha + beta) - log_p
            tl.store(occupancy_u + t * u1, log_occupancy, mask=real)
            tl.store(lse_u + t * lse_s1, log_occupancy - lse, mask=real)
            tl.store(zb_u + t * zb_s1, _row_sum(blank_arc), mask=real)
            tl.store(zl_u + t * zl_s1, 0.0 - _row_sum(label_arc), mask=real)


@_jit
def _logit_grad_kernel(
    logits_ptr, labels_ptr, shift_ptr, bm_ptr, lm_ptr, weights_ptr, clamp_ptr,
    nodes, t_max, u1, vocab, blank, z_s0, z_s1, z_s2, z_s3,
    lab_s0, lab_s1, sh_s0, sh_s1, sh_s2, bm_s0, bm_s1, bm_s2, lm_s0, lm_s1, lm_s2,
    HAS_WEIGHTS: tl.constexpr, HAS_CLAMP: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    node = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = node < nodes
    g, t, u = node // (t_max * u1), node // u1 % t_max, node % u1
    shift = tl.load(shift_ptr + g * sh_s0 + t * sh_s1 + u * sh_s2, mask=ok, other=0.0)
    blank_move = tl.load(bm_ptr + g * bm_s0 + t * bm_s1 + u * bm_s2, mask=ok, other=0.0)
    label_move = tl.load(lm_ptr + g * lm_s0 + t * lm_s1 + u * lm_s2, mask=ok, other=0.0)
    label = tl.load(labels_ptr + g * lab_s0 + u * lab_s1, mask=ok, other=0)
    row = logits_ptr + g * z_s0 + t * z_s1 + u * z_s2
    if HAS_CLAMP:
        bound = tl.load(clamp_ptr)
    if HAS_WEIGHTS:
        weight = tl.load(weights_ptr + g, mask=ok, other=0.0)
    for start in range(0, vocab, BLOCK_V):
        k = start + tl.arange(0, BLOCK_V)
        z_k = row[:, None] + k[None, :] * z_s3
        mask = ok[:, None] & (k < vocab)[None, :]
        grad = tl.exp(tl.load(z_k, mask=mask, other=0.0) + shift[:, None])  # softmax * occupancy
        grad -= tl.where(k[None, :] == blank, blank_move[:, None], 0.0)
        grad += tl.where(k[None, :] == label[:, None], label_move[:, None], 0.0)
        if HAS_CLAMP:
            grad = tl.minimum(tl.maximum(grad, -bound), bound)
        if HAS_WEIGHTS:
            grad *= weight[:, None]
        tl.store(z_k, grad, mask=mask)


def node_scores_(
    logits: Tensor, labels: Tensor, *, blank: int, lse: Tensor, z_blank: Tensor, z_label: Tensor
) -> None:
    """`asr.losses.lattice.node_scores_` in one launch: per node of `logits` (G, T, U1, V)
    the logsumexp, z[blank] and z[labels[u]] into `lse`, `z_blank`, `z_label`
    (G, T, U1; strided views will do). Unlike the reference it leaves the logits as they are."""
    _check_device(logits)
    g, t, u1, vocab = logits.shape
    nodes = g * t * u1
    block_n, block_v = _blocks(vocab, nodes)
    _node_scores_kernel[(triton.cdiv(nodes, block_n),)](
        logits, labels, lse, z_blank, z_label, nodes, t, u1, vocab, blank, *logits.stride(),
        *labels.stride(), *lse.stride(), *z_blank.stride(), *z_label.stride(),
        BLOCK_N=block_n, BLOCK_V=block_v,
    )  # fmt: skip


def lattice(
    lse: Tensor,
    z_blank: Tensor,
    z_label: Tensor,
    frames: Tensor,
    tokens: Tensor,
    *,
    gradient: bool,
) -> tuple[Tensor, GradientTerms | None]:
    """`asr.losses.lattice.lattice` in one launch (one program per sample): nll (C,) from
    the node scores (C, T, U1) and, with `gradient`, the `GradientTerms` written over the
    three inputs (-inf, 0, 0 outside each sample). Without `gradient` the inputs are left
    as they are (the reference scratches them). float32 or float64."""
    _check_device(lse)
    c, t, u1 = lse.shape
    block_u = triton.next_power_of_2(u1)
    nll = lse.new_empty(c)
    alpha = lse.new_empty((c, t, u1))
    ring = lse.new_empty((c, 2, block_u) if gradient else (1,))
    _lattice_kernel[(c,)](
        lse, z_blank, z_label, frames, tokens, nll, alpha, ring, t, u1,
        *lse.stride(), *z_blank.stride(), *z_label.stride(),
        GRADIENT=gradient, BLOCK_U=block_u, num_warps=min(max(block_u // 32, 1), 4),
        num_stages=1,
    )  # fmt: skip
    return nll, GradientTerms(lse, z_blank, z_label) if gradient else None


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
    """`asr.losses.lattice.tdt_lattice` in one launch (one program per sample): nll (C,)
    from the token scores (C, T, U1) and the durations' log-probabilities `duration_lp`
    (C, T, U1, D) and, with `gradient`, the `TdtGradientTerms`: the token terms written
    over the three inputs, `log_occupancy` and `duration_moves` new tensors. Without
    `gradient` the inputs are left as they are. float32 or float64."""
    _check_device(lse)
    durations = check_durations(durations)
    c, t, u1 = lse.shape
    d = len(durations)
    if duration_lp.shape != (c, t, u1, d):
        raise ValueError(f"duration_lp has shape {tuple(duration_lp.shape)}, not {(c, t, u1, d)}")
    block_u, block_d = triton.next_power_of_2(u1), triton.next_power_of_2(d)
    nll = lse.new_empty(c)
    alpha = lse.new_empty((c, t + 1, u1))
    beta = lse.new_empty((c, t + 1, u1) if gradient else (1,))
    log_occupancy = lse.new_empty((c, t, u1) if gradient else (1,))
    duration_moves = lse.new_empty((c, t, u1, d) if gradient else (1,))
    duration_lp = duration_lp.to(lse.dtype)
    # sigma as a tensor: a float argument would reach the kernel as float32.
    _tdt_lattice_kernel[(c,)](
        lse, z_blank, z_label, duration_lp, _durations_on(durations, lse.device), frames, tokens,
        lse.new_full((1,), sigma), nll, alpha, beta, log_occupancy, duration_moves, t, u1,
        *lse.stride(), *z_blank.stride(), *z_label.stride(), *duration_lp.stride(),
        GRADIENT=gradient, D=d, BLOCK_U=block_u, BLOCK_D=block_d,
        num_warps=min(max(block_u * block_d // 128, 1), 8),
        num_stages=1,
    )  # fmt: skip
    if not gradient:
        return nll, None
    tokens_terms = GradientTerms(lse, z_blank, z_label)
    return nll, TdtGradientTerms(tokens_terms, log_occupancy, duration_moves)


_DURATIONS: dict[tuple[tuple[int, ...], torch.device], Tensor] = {}


def _durations_on(durations: tuple[int, ...], device: torch.device) -> Tensor:
    """`durations` as an int32 tensor on `device`, made once (no host copy per call)."""
    key = (durations, device)
    if key not in _DURATIONS:
        _DURATIONS[key] = torch.tensor(durations, dtype=torch.int32, device=device)
    return _DURATIONS[key]


def logit_grad_(
    logits: Tensor,
    labels: Tensor,
    terms: GradientTerms,
    *,
    blank: int,
    weights: Tensor | None = None,
    grad_clamp: float | None = None,
) -> Tensor:
    """`asr.losses.lattice.logit_grad_` in one launch: overwrite `logits` (G, T, U1, V)
    with d(sum_g weights[g] nll[g])/dz from `terms` (G, T, U1, views will do);
    zero outside each sample, optionally clamped to [-grad_clamp, grad_clamp]."""
    _check_device(logits)
    g, t, u1, vocab = logits.shape
    nodes = g * t * u1
    block_n, block_v = _blocks(vocab, nodes)
    if weights is not None:
        weights = weights.to(logits.dtype).contiguous()
    # The bound as a tensor: a float argument would reach the kernel as float32.
    bound = None if grad_clamp is None else logits.new_full((1,), grad_clamp)
    _logit_grad_kernel[(triton.cdiv(nodes, block_n),)](
        logits, labels, terms.shift, terms.blank_move, terms.neg_label_move,
        logits if weights is None else weights, logits if bound is None else bound,
        nodes, t, u1, vocab, blank, *logits.stride(), *labels.stride(),
        *terms.shift.stride(), *terms.blank_move.stride(), *terms.neg_label_move.stride(),
        HAS_WEIGHTS=weights is not None, HAS_CLAMP=bound is not None,
        BLOCK_N=block_n, BLOCK_V=block_v,
    )  # fmt: skip
    return logits

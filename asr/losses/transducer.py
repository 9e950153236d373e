"""Transducer (RNN-T) losses: pure functions of the joiner and the tensors it combines.

Legend: B batch, T frames, U tokens, V vocabulary, D width. Every loss here shares one
signature: ``(joiner, encoder_out (B, T, D_enc), predictor_out (B, U+1, D_pred),
targets (B, U), encoder_lens (B,), target_lens (B,), *, blank=0, reduction="mean")``.
``joiner(enc (..., T, 1, D_enc), pred (..., 1, U+1, D_pred))`` gives logits
(..., T, U+1, V). "mean" averages the per-utterance negative log-likelihoods over the
batch, "sum" adds them, "none" returns them, shape (B,).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
import torchaudio.functional as AF
from torch import Tensor

from asr.losses.checks import reduce_nll, validate_inputs
from asr.losses.lattice import NEG_INF, padded_labels
from asr.losses.samplewise import (
    TdtOptions,
    joiner_precision,
    samplewise_transducer_loss,
    tdt_options,
)

__all__ = ["batched_tdt_nll", "batched_transducer_loss", "samplewise_transducer_loss"]

Joiner = Callable[[Tensor, Tensor], Tensor]


def batched_transducer_loss(
    joiner: Joiner,
    encoder_out: Tensor,
    predictor_out: Tensor,
    targets: Tensor,
    encoder_lens: Tensor,
    target_lens: Tensor,
    *,
    blank: int = 0,
    reduction: str = "mean",
    logits_dtype: torch.dtype | None = None,
    durations: Sequence[int] | None = None,
    sigma: float = 0.0,
    omega: float = 0.0,
) -> Tensor:
    """The whole padded batch at once: logits (B, T, U+1, V) then torchaudio's RNN-T loss.

    Inputs padded beyond the lengths are trimmed to max(encoder_lens) frames and
    max(target_lens) tokens first. Memory grows with B x T x U x V: fast, but hungry.
    ``logits_dtype`` runs the joiner under autocast in float16/bfloat16, or without
    autocast in float32; None leaves it to the surrounding autocast. The loss itself is
    computed in float32.

    With `durations` (a token-and-duration transducer, logits (B, T, U+1, V + D)): the TDT
    loss by `batched_tdt_nll` under autograd, mixed with the plain loss by `omega`
    (`asr.losses.samplewise.TdtOptions`): the reference the sample-wise TDT loss is
    checked and measured against.
    """
    tdt = tdt_options(durations, sigma, omega)
    max_t, max_u = validate_inputs(
        encoder_out, predictor_out, targets, encoder_lens, target_lens, reduction
    )
    encoder_out, predictor_out = encoder_out[:, :max_t], predictor_out[:, : max_u + 1]
    with joiner_precision(logits_dtype, encoder_out, predictor_out) as (enc, pred):
        logits = joiner(enc.unsqueeze(2), pred.unsqueeze(1))  # (B, T, U+1, V)
    if tdt is not None:
        return reduce_nll(
            _tdt_and_plain(logits, targets[:, :max_u], encoder_lens, target_lens, tdt, blank),
            reduction,
        )
    vocab = logits.size(-1)
    if not 0 <= blank < vocab:
        raise ValueError(f"blank={blank} is outside the joiner's vocabulary [0, {vocab})")
    nll = _rnnt_nll(logits, targets[:, :max_u], encoder_lens, target_lens, blank)
    return reduce_nll(nll, reduction)


def _rnnt_nll(
    logits: Tensor, targets: Tensor, frames: Tensor, tokens: Tensor, blank: int
) -> Tensor:
    with warnings.catch_warnings(), torch.autocast(logits.device.type, enabled=False):
        # torchaudio deprecates its RNN-T loss (it still works); it wants fp32 (or fp16).
        warnings.filterwarnings("ignore", message=".*rnnt_loss.*deprecated", category=UserWarning)
        return AF.rnnt_loss(
            logits.float(),
            targets.to(torch.int32),
            frames.to(torch.int32),
            tokens.to(torch.int32),
            blank=blank,
            reduction="none",
        )


def _tdt_and_plain(
    logits: Tensor, targets: Tensor, frames: Tensor, tokens: Tensor, tdt: TdtOptions, blank: int
) -> Tensor:
    d = len(tdt.durations)
    token_logits, duration_logits = logits[..., :-d], logits[..., -d:]
    vocab = token_logits.size(-1)
    if not 0 <= blank < vocab:
        raise ValueError(f"blank={blank} is outside the joiner's vocabulary [0, {vocab})")
    with torch.autocast(logits.device.type, enabled=False):
        nll = batched_tdt_nll(
            token_logits.float() if logits.dtype != torch.float64 else token_logits,
            duration_logits.float() if logits.dtype != torch.float64 else duration_logits,
            targets,
            frames,
            tokens,
            durations=tdt.durations,
            sigma=tdt.sigma,
            blank=blank,
        )
    if tdt.omega == 0:
        return nll
    plain = _rnnt_nll(token_logits.contiguous(), targets, frames, tokens, blank).to(nll.dtype)
    return (1.0 - tdt.omega) * nll + tdt.omega * plain


def batched_tdt_nll(
    token_logits: Tensor,
    duration_logits: Tensor,
    targets: Tensor,
    frames: Tensor,
    tokens: Tensor,
    *,
    durations: Sequence[int],
    sigma: float = 0.0,
    blank: int = 0,
) -> Tensor:
    """The TDT negative log-likelihoods (B,) of whole logits under autograd: token logits
    (B, T, U+1, V), duration logits (B, T, U+1, D), targets (B, >= U). The lattice of
    `asr.losses.lattice.tdt_lattice`, written out of place one anti-diagonal at a time so
    that autograd differentiates it: simple, and as hungry as any full-tensor loss."""
    b, t, u1, vocab = token_logits.shape
    device = token_logits.device
    token_lp = torch.log_softmax(token_logits, -1) - sigma
    duration_lp = torch.log_softmax(duration_logits, -1)
    labels = padded_labels(targets, u1, blank=blank, vocab=vocab)
    blank_lp = token_lp[..., blank]
    label_lp = token_lp.gather(-1, labels[:, None, :, None].expand(b, t, u1, 1))[..., 0]
    rows = torch.arange(t, device=device)[None, :, None, None]
    cols = torch.arange(u1, device=device)[None, None, :, None]
    lengths = torch.tensor(list(durations), device=device)[None, None, None, :]
    f, k = frames[:, None, None, None], tokens[:, None, None, None]
    node_ok = (rows < f) & (cols <= k)
    blank_ok = node_ok & (lengths >= 1) & (rows + lengths <= f)
    label_ok = node_ok & (cols < k) & (rows + lengths < f)
    # A very negative number, not -inf: autograd through logsumexp of only -inf gives NaN.
    never = torch.finfo(token_lp.dtype).min / 1e4
    blank_arc = (blank_lp[..., None] + duration_lp).masked_fill(~blank_ok, never)
    label_arc = (label_lp[..., None] + duration_lp).masked_fill(~label_ok, never)
    diagonals = t + u1  # rows t = 0 .. T (the end row) and columns u = 0 .. U

    def by_diagonal(arc: Tensor) -> Tensor:  # (B, T, U1, D) -> (B, diagonals, U1, D)
        columns = [
            F.pad(arc[:, :, u], (0, 0, u, diagonals - t - u), value=never) for u in range(u1)
        ]
        return torch.stack(columns, 2)

    blank_d, label_d = by_diagonal(blank_arc), by_diagonal(label_arc)
    start = torch.full((b, u1), never, dtype=token_lp.dtype, device=device)
    alpha = [start.index_fill(1, torch.tensor([0], device=device), 0.0)]
    for n in range(1, diagonals):
        terms = []
        for i, length in enumerate(durations):
            if length >= 1 and n - length >= 0:
                terms.append(alpha[n - length] + blank_d[:, n - length, :, i])
            if n - length - 1 >= 0:
                moved = alpha[n - length - 1] + label_d[:, n - length - 1, :, i]
                terms.append(F.pad(moved[:, :-1], (1, 0), value=never))
        alpha.append(torch.logsumexp(torch.stack(terms), 0))
    ends = torch.stack(alpha, 1)  # (B, diagonals, U1)
    samples = torch.arange(b, device=device)
    log_p = ends[samples, frames + tokens, tokens]
    return -torch.where(log_p > never / 2, log_p, NEG_INF)  # no path: inf

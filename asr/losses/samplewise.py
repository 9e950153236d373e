"""Sample-wise transducer loss: the B x T x U x V logits never exist, one sample's do.

After Braun, McDermott and Hsiao, "Neural Transducer Training: Reduced Memory Consumption
with Sample-wise Computation" (arXiv 2211.16270). The forward pass of the autograd
Function walks the batch one sample (or one group of similar-sized samples) at a time,
twice, with one lattice recursion for all samples in between:

1. per group, the joiner on the group's true lengths, and of its logits only three numbers
   per node: the log-normalizer, the blank's logit and the next label's logit;
2. for the whole batch (in chunks of at most `lattice_chunk_nodes` nodes), the forward and
   backward variables from those numbers, one anti-diagonal at a time, and the occupancy
   terms of the gradient (`asr.losses.lattice.lattice`);
3. per group again, the joiner's logits, turned in place into their gradient in closed
   form, and backpropagated through the joiner.

The recursion's T + U steps run once per chunk, not once per sample, so each additional
sample adds a fixed number of ops whatever its length (on a GPU each op is a kernel
launch). The price is the joiner's forward run twice. Only the gradients for the joiner's
inputs and parameters are kept; groups reuse the same buffers. The per-node work (node
scores, recursion, logit gradient) has two implementations with one contract, chosen by
`lattice`: PyTorch ops (`asr.losses.lattice`, any device, the reference) and Triton
kernels (`asr.losses.triton_lattice`, the default on CUDA), where the whole recursion of a
chunk is one launch instead of a few ops per anti-diagonal. `asr.losses.lattice_choice`
picks one; on CUDA, "auto" falls back to the PyTorch ops if the kernels fail or disagree.

Two joiner paths:

- **fused**, for a joiner whose `tanh_joint_parts()` returns (project_encoder,
  project_predictor, output) with logits = output(tanh(project_encoder(enc) +
  project_predictor(pred))), as `asr.models.transducer.Joiner` does: the
  projections run once for the whole batch outside the Function (autograd handles them),
  and the Function does tanh, output layer and their backward by hand into preallocated
  buffers. Peak extra memory per group: logits + hidden activations, G x T x (U+1) x (V + J).
- **generic**, for any other `joiner(enc, pred)`: per group the joiner runs under
  autograd and `torch.autograd.grad` carries the closed-form logit gradient back into its
  inputs and parameters (a module's parameters; tensors a plain function closes over get
  no gradient).

Cost of the reductions: "mean" and "sum" do all the work in the forward pass and only
scale the stored input gradients in backward. "none" needs per-sample weights from the
incoming gradient, so its forward computes the losses only (pass 1 and alpha) and its
backward runs all three passes with the weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from asr.losses.checks import reduce_nll, validate_inputs
from asr.losses.lattice import (
    GradientTerms,
    TdtGradientTerms,
    duration_grad_,
    duration_log_probs_,
    padded_labels,
)
from asr.losses.lattice_choice import LatticeOps, lattice_ops
from asr.tdt import check_durations

# Backpropagating through the fused joiner multiplies the (G * T * U1, V) logit gradient by
# the output weight in at most BACKWARD_CHUNKS blocks of rows (at least BACKWARD_CHUNK_ROWS
# each): an extra buffer of a quarter of the hidden activations at most, and a number of
# ops per group that does not grow with T and U.
BACKWARD_CHUNK_ROWS = 4096
BACKWARD_CHUNKS = 4
LOW_PRECISION = (torch.float16, torch.bfloat16)
# Lattice nodes (samples x T x (U+1), padded) whose recursion runs at once: about 16 fp32
# values a node while it runs (256 MiB at this size), 3 a node kept for the gradients.
LATTICE_CHUNK_NODES = 1 << 22


def tanh_joint_parts(joiner: object) -> tuple[Callable, Callable, nn.Linear] | None:
    """The joiner's (project_encoder, project_predictor, output) when it offers them for
    the fused path (`tanh_joint_parts()`, an `nn.Linear` output layer), else None."""
    offer = getattr(joiner, "tanh_joint_parts", None)
    parts = offer() if callable(offer) else None
    if parts is None or type(parts[2]) is not nn.Linear:
        return None
    return parts


def plan_groups(
    frames: Sequence[int],
    tokens: Sequence[int],
    group_size: int,
    max_group_nodes: int | None = None,
) -> list[list[int]]:
    """Sample indices in groups, largest lattices first so that a group's samples have
    similar sizes and pad little. A group holds at most `group_size` samples and, when
    `max_group_nodes` is set, at most that many padded lattice nodes
    (samples x longest T x longest U+1) unless a single sample is larger."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if max_group_nodes is not None and max_group_nodes < 1:
        raise ValueError(f"max_group_nodes must be >= 1 or None, got {max_group_nodes}")
    order = sorted(range(len(frames)), key=lambda i: (-frames[i] * (tokens[i] + 1), i))
    groups: list[list[int]] = []
    longest = (0, 0)
    for i in order:
        grown = (max(longest[0], frames[i]), max(longest[1], tokens[i] + 1))
        nodes = (len(groups[-1]) + 1) * grown[0] * grown[1] if groups else 0
        full = not groups or len(groups[-1]) == group_size
        if full or (max_group_nodes is not None and nodes > max_group_nodes):
            groups.append([i])
            longest = (frames[i], tokens[i] + 1)
        else:
            groups[-1].append(i)
            longest = grown
    return groups


def plan_chunks(
    groups: list[list[int]], frames: Sequence[int], tokens: Sequence[int], max_nodes: int
) -> list[list[list[int]]]:
    """Consecutive groups in chunks that share one lattice recursion: at most `max_nodes`
    padded nodes (samples x longest T x longest U+1) per chunk unless one group is larger."""
    if max_nodes < 1:
        raise ValueError(f"lattice_chunk_nodes must be >= 1, got {max_nodes}")
    chunks: list[list[list[int]]] = []
    samples, longest = 0, (0, 0)
    for group in groups:
        sizes = (max(frames[i] for i in group), max(tokens[i] for i in group) + 1)
        grown = (max(longest[0], sizes[0]), max(longest[1], sizes[1]))
        if chunks and (samples + len(group)) * grown[0] * grown[1] <= max_nodes:
            chunks[-1].append(group)
            samples, longest = samples + len(group), grown
        else:
            chunks.append([group])
            samples, longest = len(group), sizes
    return chunks


@dataclass(frozen=True)
class TdtOptions:
    """A token-and-duration transducer's lattice: the joiner's last D logits are the
    durations' (`durations`, frames an emission skips); `sigma` is subtracted from every
    token log-probability (NeMo's logit under-normalization); the loss is (1 - `omega`)
    x the TDT loss + `omega` x the plain transducer loss of the token logits."""

    durations: tuple[int, ...]
    sigma: float = 0.0
    omega: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "durations", check_durations(self.durations))
        if not self.sigma >= 0.0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")
        if not 0.0 <= self.omega < 1.0:
            raise ValueError(f"omega must be in [0, 1), got {self.omega}")


def tdt_options(durations: Sequence[int] | None, sigma: float, omega: float) -> TdtOptions | None:
    """The TDT options of a loss call, or None for a plain transducer (then `sigma` and
    `omega` must be 0: they mean nothing without durations)."""
    if durations is None:
        if sigma or omega:
            raise ValueError(f"sigma={sigma} and omega={omega} need durations (a TDT joiner)")
        return None
    return TdtOptions(tuple(durations), sigma, omega)


def combine_with_transducer(
    tdt_nll: Tensor,
    tdt_terms: TdtGradientTerms | None,
    nll: Tensor,
    terms: GradientTerms | None,
    omega: float,
) -> tuple[Tensor, TdtGradientTerms | None]:
    """(1 - omega) x the TDT loss + omega x the plain transducer loss, and the same mix
    of their gradient terms (written over the TDT terms)."""
    mixed = tdt_nll.mul(1.0 - omega).add_(nll, alpha=omega)
    if tdt_terms is None or terms is None:
        return mixed, None
    tokens = tdt_terms.tokens
    keep, take = math.log1p(-omega), math.log(omega)
    torch.logaddexp(tokens.shift.add_(keep), terms.shift.add_(take), out=tokens.shift)
    tokens.blank_move.mul_(1.0 - omega).add_(terms.blank_move, alpha=omega)
    tokens.neg_label_move.mul_(1.0 - omega).add_(terms.neg_label_move, alpha=omega)
    tdt_terms.log_occupancy.add_(keep)
    tdt_terms.duration_moves.mul_(1.0 - omega)
    return mixed, tdt_terms


@dataclass
class _Plan:
    """Everything the Function needs besides its tensor inputs."""

    joiner: Callable[[Tensor, Tensor], Tensor]
    fused: bool
    targets: Tensor
    frames: Tensor
    tokens: Tensor
    groups: list[list[int]]
    chunks: list[list[list[int]]]
    blank: int
    reduction: str
    logits_dtype: torch.dtype | None
    grad_clamp: float | None
    ops: LatticeOps
    tdt: TdtOptions | None = None

    @property
    def num_durations(self) -> int:
        return 0 if self.tdt is None else len(self.tdt.durations)

    def lattice_dtype(self, like: Tensor) -> torch.dtype:
        return torch.float64 if like.dtype == torch.float64 else torch.float32

    def run(
        self, enc: Tensor, pred: Tensor, params: Sequence[Tensor], weights: Tensor | None
    ) -> tuple[Tensor, list[Tensor | None]]:
        """Losses (B,) and, when `weights` is given, the weighted gradients of the inputs."""
        runner = _FusedGroups if self.fused else _GenericGroups
        with torch.autocast(enc.device.type, enabled=False):
            return runner(self, enc, pred, params).run(weights)


class _Groups:
    """Shared loop: per chunk of groups, node scores (pass 1), one lattice for the chunk,
    then with gradients the logits again and their closed-form gradient (pass 2)."""

    def __init__(self, plan: _Plan, enc: Tensor, pred: Tensor, params: Sequence[Tensor]):
        self.plan, self.enc, self.pred, self.params = plan, enc, pred, list(params)
        self.frames_list = plan.frames.tolist()
        self.tokens_list = plan.tokens.tolist()
        self.dtype = plan.lattice_dtype(enc)

    def group_sizes(self, group: list[int]) -> tuple[int, int]:
        return max(self.frames_list[i] for i in group), max(self.tokens_list[i] for i in group) + 1

    def run(self, weights: Tensor | None) -> tuple[Tensor, list[Tensor | None]]:
        plan, batch = self.plan, self.enc.size(0)
        nll = torch.empty(batch, dtype=self.dtype, device=self.enc.device)
        want_grad = self.want_grad = weights is not None
        grads: list[Tensor | None] = []
        if want_grad:
            grads = [torch.zeros_like(self.enc), torch.zeros_like(self.pred)]
            grads += [torch.zeros_like(p) if p.requires_grad else None for p in self.params]
        for chunk in plan.chunks:
            self.run_chunk(chunk, nll, grads, weights)
        return nll, grads

    def run_chunk(
        self,
        chunk: list[list[int]],
        nll: Tensor,
        grads: list[Tensor | None],
        weights: Tensor | None,
    ) -> None:
        plan, device, ops = self.plan, self.enc.device, self.plan.ops
        samples = [i for group in chunk for i in group]
        index = torch.tensor(samples, device=device)
        frames, tokens = plan.frames[index], plan.tokens[index]
        sizes = [self.group_sizes(g) for g in chunk]
        t_max, u1_max = max(f for f, _ in sizes), max(u for _, u in sizes)
        labels: Tensor | None = None
        lse, z_blank, z_label = torch.zeros(
            (3, len(samples), t_max, u1_max), dtype=self.dtype, device=device
        ).unbind(0)
        durations = plan.num_durations
        duration_lp = torch.zeros(
            (len(samples), t_max, u1_max, durations), dtype=self.dtype, device=device
        )
        starts = [0]
        self.prepare(chunk, sizes)
        for group, (f, u1) in zip(chunk, sizes, strict=True):
            rows = slice(starts[-1], starts[-1] + len(group))
            logits = self.logits(index[rows], f, u1, for_grad=False)
            vocab = logits.size(-1) - durations
            if labels is None:
                labels = padded_labels(plan.targets[index], u1_max, blank=plan.blank, vocab=vocab)
            if durations:
                duration_log_probs_(logits[..., vocab:], out=duration_lp[rows, :f, :u1])
            ops.node_scores_(
                logits[..., :vocab],
                labels[rows, :u1],
                blank=plan.blank,
                lse=lse[rows, :f, :u1],
                z_blank=z_blank[rows, :f, :u1],
                z_label=z_label[rows, :f, :u1],
            )
            starts.append(rows.stop)
        del logits
        self.release()  # the recursion's temporaries take the group buffers' place
        chunk_nll, terms = self.lattice(lse, z_blank, z_label, duration_lp, frames, tokens)
        nll[index] = chunk_nll
        if terms is None:
            return
        del lse, z_blank, z_label, duration_lp
        assert labels is not None and weights is not None
        chunk_weights = weights[index]
        self.prepare(chunk, sizes)
        for group, (f, u1), start in zip(chunk, sizes, starts, strict=False):
            rows = slice(start, start + len(group))
            logits = self.logits(index[rows], f, u1, for_grad=True)
            vocab = logits.size(-1) - durations
            group_terms = terms[rows, :f, :u1]
            if isinstance(group_terms, TdtGradientTerms):
                duration_grad_(
                    logits[..., vocab:],
                    group_terms,
                    weights=chunk_weights[rows],
                    grad_clamp=plan.grad_clamp,
                )
                group_terms = group_terms.tokens
            ops.logit_grad_(
                logits[..., :vocab],
                labels[rows, :u1],
                group_terms,
                blank=plan.blank,
                weights=chunk_weights[rows],
                grad_clamp=plan.grad_clamp,
            )
            g_enc, g_pred, g_params = self.backward(index[rows], f, u1, logits)
            grads[0][index[rows], :f] = g_enc.to(grads[0].dtype)
            grads[1][index[rows], :u1] = g_pred.to(grads[1].dtype)
            for acc, g in zip(grads[2:], g_params, strict=True):
                if acc is not None and g is not None:
                    acc.add_(g.to(acc.dtype))
        self.release()

    def lattice(
        self,
        lse: Tensor,
        z_blank: Tensor,
        z_label: Tensor,
        duration_lp: Tensor,
        frames: Tensor,
        tokens: Tensor,
    ) -> tuple[Tensor, GradientTerms | TdtGradientTerms | None]:
        """The chunk's losses and gradient terms from its node scores: the plain lattice,
        or the TDT lattice (mixed with the plain one by `omega`)."""
        ops, tdt, gradient = self.plan.ops, self.plan.tdt, self.want_grad
        if tdt is None:
            return ops.lattice(lse, z_blank, z_label, frames, tokens, gradient=gradient)
        plain = None
        if tdt.omega > 0:  # the plain lattice overwrites its inputs: give it copies
            scores = (lse.clone(), z_blank.clone(), z_label.clone())
            plain = ops.lattice(*scores, frames, tokens, gradient=gradient)
        nll, terms = ops.tdt_lattice(
            lse,
            z_blank,
            z_label,
            duration_lp,
            frames,
            tokens,
            durations=tdt.durations,
            sigma=tdt.sigma,
            gradient=gradient,
        )
        if plain is None:
            return nll, terms
        return combine_with_transducer(nll, terms, *plain, tdt.omega)

    def prepare(self, groups: list[list[int]], sizes: list[tuple[int, int]]) -> None:
        """Allocate buffers for the largest of these groups (sizes: (frames, U1) each)."""

    def release(self) -> None:
        """Free what `prepare` allocated."""

    def logits(self, index: Tensor, frames: int, u1: int, *, for_grad: bool) -> Tensor:
        raise NotImplementedError

    def backward(
        self, index: Tensor, frames: int, u1: int, logit_grad: Tensor
    ) -> tuple[Tensor, Tensor, list[Tensor | None]]:
        raise NotImplementedError


class _FusedGroups(_Groups):
    """enc/pred are already projected (B, T, J), (B, U1, J); params = (weight, bias).

    tanh(a) = 2 s - 1 with s = sigmoid(2 a), so the Function keeps s instead of tanh(a) and
    folds the affine part into the output layer: logits = s (2W)^T + (b - W 1), d(logits)/dW
    = 2 dz^T s - (dz^T 1) 1^T, and d(tanh)/da = 4 s (1 - s). On CPUs PyTorch's sigmoid
    is much faster than its tanh; on every device it saves ops per group.
    """

    def prepare(self, groups: list[list[int]], sizes: list[tuple[int, int]]) -> None:
        weight = self.params[0]
        self.joint_dim, self.vocab = weight.size(1), weight.size(0)
        self.compute = self.plan.logits_dtype or self.dtype
        largest = max(len(g) * f * u for g, (f, u) in zip(groups, sizes, strict=True))
        device = self.enc.device
        self.hidden_buf = torch.empty(largest * self.joint_dim, dtype=self.compute, device=device)
        self.logit_buf = torch.empty(largest * self.vocab, dtype=self.compute, device=device)
        self.lattice_buf = self.logit_buf
        if self.compute != self.dtype:  # low-precision matmuls, fp32 lattice
            self.lattice_buf = torch.empty(largest * self.vocab, dtype=self.dtype, device=device)
        rows = min(max(BACKWARD_CHUNK_ROWS, -(-largest // BACKWARD_CHUNKS)), largest)
        self.chunk_buf = torch.empty(rows * self.joint_dim, dtype=self.compute, device=device)
        w = weight.detach()  # the folded output layer
        bias = self.params[1].detach() if len(self.params) > 1 else torch.zeros_like(w[:, 0])
        self.w2, self.w4 = (2 * w).to(self.compute), (4 * w).to(self.compute)
        self.b = (bias - w.sum(1)).to(self.compute)

    def release(self) -> None:
        self.hidden_buf = self.logit_buf = self.lattice_buf = self.chunk_buf = None
        self.hidden = None

    def logits(self, index: Tensor, frames: int, u1: int, *, for_grad: bool) -> Tensor:
        g, j, v = index.numel(), self.joint_dim, self.vocab
        n = g * frames * u1
        enc = self.enc[index, :frames].to(self.compute).mul_(2.0)  # a copy: indexed
        pred = self.pred[index, :u1].to(self.compute)
        self.hidden = self.hidden_buf[: n * j].view(g, frames, u1, j)  # s = sigmoid(2a)
        torch.add(enc[:, :, None], pred[:, None], alpha=2.0, out=self.hidden).sigmoid_()
        out = torch.addmm(
            self.b, self.hidden.view(n, j), self.w2.t(), out=self.logit_buf[: n * v].view(n, v)
        )
        if self.lattice_buf is self.logit_buf:
            return out.view(g, frames, u1, v)
        lattice = self.lattice_buf[: n * v].view(g, frames, u1, v)
        return lattice.copy_(out.view(g, frames, u1, v))

    def backward(
        self, index: Tensor, frames: int, u1: int, logit_grad: Tensor
    ) -> tuple[Tensor, Tensor, list[Tensor | None]]:
        g, j, v = index.numel(), self.joint_dim, self.vocab
        n = g * frames * u1
        dz = self.logit_buf[: n * v].view(n, v)
        if logit_grad.data_ptr() != dz.data_ptr():
            dz.copy_(logit_grad.view(n, v))
        s = self.hidden.view(n, j)
        grad_b = dz.sum(0)
        grad_w = None
        if self.params[0].requires_grad:  # dz^T (2 s - 1) = 2 dz^T s - grad_b 1^T
            grad_w = torch.mm(dz.t(), s).mul_(2.0).sub_(grad_b[:, None])
        has_bias = len(self.params) > 1 and self.params[1].requires_grad
        # d(pre-activation) = (dz @ 4W) * s (1 - s), written over s.
        s.addcmul_(s, s, value=-1.0)
        rows = self.chunk_buf.numel() // j
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            part = torch.mm(
                dz[start:stop], self.w4, out=self.chunk_buf[: (stop - start) * j].view(-1, j)
            )
            s[start:stop].mul_(part)
        grad_pre = self.hidden
        grads = [grad_w, grad_b if has_bias else None][: len(self.params)]
        return grad_pre.sum(2), grad_pre.sum(1), grads


class _GenericGroups(_Groups):
    """Any joiner callable; per-group autograd through it with the closed-form dL/dz."""

    def logits(self, index: Tensor, frames: int, u1: int, *, for_grad: bool) -> Tensor:
        self.enc_g = self.enc[index, :frames].detach().requires_grad_(for_grad)
        self.pred_g = self.pred[index, :u1].detach().requires_grad_(for_grad)
        low = self.plan.logits_dtype
        with (
            torch.set_grad_enabled(for_grad),
            torch.autocast(
                self.enc.device.type, dtype=low or torch.float32, enabled=low is not None
            ),
        ):
            self.out = self.plan.joiner(self.enc_g[:, :, None], self.pred_g[:, None])
        if low is not None:
            # Inside the caller's autocast region the weights cast without gradient here
            # would be reused by the next call, which needs them with their gradient.
            torch.clear_autocast_cache()
        logits = self.out.detach()
        if not 0 <= self.plan.blank < logits.size(-1):
            raise ValueError(
                f"blank={self.plan.blank} is outside the joiner's vocabulary [0, {logits.size(-1)})"
            )
        return logits if logits.dtype == self.dtype else logits.to(self.dtype)

    def backward(
        self, index: Tensor, frames: int, u1: int, logit_grad: Tensor
    ) -> tuple[Tensor, Tensor, list[Tensor | None]]:
        wanted = [self.enc_g, self.pred_g, *(p for p in self.params if p.requires_grad)]
        grads = torch.autograd.grad(
            self.out, wanted, logit_grad.to(self.out.dtype), allow_unused=True
        )
        self.out = None
        g_params = iter(grads[2:])
        per_param = [next(g_params) if p.requires_grad else None for p in self.params]
        return grads[0], grads[1], per_param


class _SamplewiseTransducer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan: _Plan, enc: Tensor, pred: Tensor, *params: Tensor) -> Tensor:  # noqa: ANN001
        batch = enc.size(0)
        needs_grad = any(ctx.needs_input_grad[1:])
        ctx.plan = plan
        if not needs_grad:
            nll, _ = plan.run(enc, pred, params, None)
            return reduce_nll(nll, plan.reduction)
        if plan.reduction == "none":
            nll, _ = plan.run(enc, pred, params, None)
            ctx.save_for_backward(enc, pred, *params)
            return nll
        scale = 1.0 / batch if plan.reduction == "mean" else 1.0
        weights = torch.full((batch,), scale, dtype=plan.lattice_dtype(enc), device=enc.device)
        nll, ctx.grads = plan.run(enc, pred, params, weights)
        return reduce_nll(nll, plan.reduction)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # noqa: ANN001
        if ctx.plan.reduction == "none":
            enc, pred, *params = ctx.saved_tensors
            _, grads = ctx.plan.run(enc, pred, params, grad_out.detach())
        else:
            grads = ctx.grads
            ctx.grads = None
            for g in grads:
                if g is not None:
                    g.mul_(grad_out.to(g.dtype))
        return (None, *grads)


def samplewise_transducer_loss(
    joiner: Callable[[Tensor, Tensor], Tensor],
    encoder_out: Tensor,
    predictor_out: Tensor,
    targets: Tensor,
    encoder_lens: Tensor,
    target_lens: Tensor,
    *,
    blank: int = 0,
    reduction: str = "mean",
    group_size: int = 1,
    max_group_nodes: int | None = None,
    logits_dtype: torch.dtype | None = None,
    grad_clamp: float | None = None,
    lattice_chunk_nodes: int = LATTICE_CHUNK_NODES,
    lattice: str | LatticeOps = "auto",
    durations: Sequence[int] | None = None,
    sigma: float = 0.0,
    omega: float = 0.0,
) -> Tensor:
    """One sample (or group) at a time: never more than one group's T x (U+1) x V logits.

    Same result as `batched_transducer_loss`. Options: up to `group_size` samples of
    similar size share one joiner call (padding only up to the group's longest), capped
    at `max_group_nodes` padded lattice nodes per group when given; `logits_dtype`
    (float16/bfloat16) for the joiner's matmuls with the lattice and gradients in float32
    (None: the autocast dtype inside an autocast region, else the inputs' precision),
    `grad_clamp` bounds each logit's gradient; `lattice` picks the implementation of the
    per-node work ("auto": Triton kernels on CUDA with a fallback to PyTorch ops if they
    fail, PyTorch ops elsewhere; "torch"; "triton"; or a `LatticeOps` object). See
    `asr.losses.samplewise` and `asr.losses.lattice_choice`.

    With `durations`, a token-and-duration transducer (TDT): the joiner's logits are the V
    token logits then one per duration, and the loss is the TDT lattice's, with `sigma`
    and `omega` as in `TdtOptions`; still no B x T x U x (V + D) tensor.
    """
    tdt = tdt_options(durations, sigma, omega)
    max_t, max_u = validate_inputs(
        encoder_out, predictor_out, targets, encoder_lens, target_lens, reduction
    )
    check_logits_dtype(logits_dtype)
    if grad_clamp is not None and not grad_clamp > 0:
        raise ValueError(f"grad_clamp must be > 0, got {grad_clamp}")
    device_type = encoder_out.device.type
    if logits_dtype is None and torch.is_autocast_enabled(device_type):
        logits_dtype = torch.get_autocast_dtype(device_type)  # as autocast would
    encoder_out, predictor_out = encoder_out[:, :max_t], predictor_out[:, : max_u + 1]
    parts = tanh_joint_parts(joiner)
    fused = parts is not None
    if parts is not None:
        project_encoder, project_predictor, output = parts
        with joiner_precision(logits_dtype, encoder_out, predictor_out) as (enc_in, pred_in):
            enc, pred = project_encoder(enc_in), project_predictor(pred_in)
        vocab = output.out_features - (0 if tdt is None else len(tdt.durations))
        params = [output.weight] + ([output.bias] if output.bias is not None else [])
    else:
        enc, pred, vocab = encoder_out, predictor_out, None
        params = list(joiner.parameters()) if isinstance(joiner, nn.Module) else []
    if vocab is not None and not 0 <= blank < vocab:
        raise ValueError(f"blank={blank} is outside the joiner's vocabulary [0, {vocab})")
    frames, tokens = encoder_lens.long(), target_lens.long()
    frames_list, tokens_list = frames.tolist(), tokens.tolist()
    groups = plan_groups(frames_list, tokens_list, group_size, max_group_nodes)
    if tdt is not None:  # its recursion keeps about 4 D + 12 values a node, not 16
        lattice_chunk_nodes = max(1, lattice_chunk_nodes * 16 // (4 * len(tdt.durations) + 12))
    plan = _Plan(
        joiner=joiner,
        fused=fused,
        targets=targets[:, :max_u].long(),
        frames=frames,
        tokens=tokens,
        groups=groups,
        chunks=plan_chunks(groups, frames_list, tokens_list, lattice_chunk_nodes),
        blank=blank,
        reduction=reduction,
        logits_dtype=logits_dtype,
        grad_clamp=grad_clamp,
        ops=lattice_ops(lattice, encoder_out.device),
        tdt=tdt,
    )
    return _SamplewiseTransducer.apply(plan, enc, pred, *params)


def check_logits_dtype(logits_dtype: torch.dtype | None) -> None:
    """Raise unless `logits_dtype` is None, float16, bfloat16 or float32."""
    if logits_dtype is not None and logits_dtype not in (*LOW_PRECISION, torch.float32):
        raise ValueError(f"logits_dtype must be float16, bfloat16 or float32, got {logits_dtype}")


@contextmanager
def joiner_precision(
    logits_dtype: torch.dtype | None, encoder_out: Tensor, predictor_out: Tensor
) -> Iterator[tuple[Tensor, Tensor]]:
    """Run a joiner's matmuls in ``logits_dtype``: the block sees the joiner's inputs to
    use. None: as they are, under the caller's autocast (if any); float32: autocast off and
    the inputs in float32; float16/bfloat16: autocast in that dtype."""
    check_logits_dtype(logits_dtype)
    device_type = encoder_out.device.type
    if logits_dtype is None:
        yield encoder_out, predictor_out
    elif logits_dtype == torch.float32:
        with torch.autocast(device_type, enabled=False):
            yield encoder_out.float(), predictor_out.float()
    else:
        with torch.autocast(device_type, dtype=logits_dtype):
            yield encoder_out, predictor_out


def predicted_peak_bytes(
    *,
    batch_size: int,
    max_frames: int,
    max_tokens: int,
    vocab_size: int,
    encoder_dim: int,
    predictor_dim: int,
    joint_dim: int,
    group_size: int = 1,
    max_group_nodes: int | None = None,
    dtype_bytes: int = 4,
    lattice_chunk_nodes: int = LATTICE_CHUNK_NODES,
    num_durations: int = 0,
) -> int:
    """Peak extra memory of forward + backward with the fused joiner, in bytes (fp32 lattice).

    The larger of two moments. In forward: the batch's projections and their gradient
    accumulators (B x (T + U1) x J, twice) plus either one group's workspace (logits
    G x T x U1 x V, hidden activations G x T x U1 x J, the backward block) with the three
    per-node terms of its chunk's lattice, or the chunk's recursion (about 11 fp32 values
    per node, the group buffers freed). In backward: the stored gradients plus the
    gradients of `encoder_out` and `predictor_out`. With `num_durations` (a TDT; V the
    token vocabulary), D more logits a node, 3 + D values kept and about 4 D + 12 while the
    recursion runs.
    """
    u1, f4 = max_tokens + 1, 4
    nodes = min(group_size, batch_size) * max_frames * u1
    if max_group_nodes is not None:
        nodes = min(nodes, max(max_group_nodes, max_frames * u1))
    kept, recursion = 3, 11  # fp32 values a node: kept through the groups; while it runs
    if num_durations:  # a TDT: the duration log-probabilities too, a longer recursion
        kept, recursion = 3 + num_durations, 4 * num_durations + 12
        lattice_chunk_nodes = max(1, lattice_chunk_nodes * 16 // recursion)
        vocab_size += num_durations
    chunk = min(batch_size * max_frames * u1, max(lattice_chunk_nodes, nodes))
    projections = batch_size * (max_frames + u1) * joint_dim * f4
    workspace = nodes * (vocab_size + joint_dim) * dtype_bytes
    if dtype_bytes != f4:
        workspace += nodes * vocab_size * f4
    block = min(max(BACKWARD_CHUNK_ROWS, -(-nodes // BACKWARD_CHUNKS)), nodes)
    workspace += block * joint_dim * dtype_bytes + kept * chunk * f4
    forward = 2 * projections + max(workspace, recursion * chunk * f4)
    backward = projections + batch_size * (max_frames * encoder_dim + u1 * predictor_dim) * f4
    return int(max(forward, backward))

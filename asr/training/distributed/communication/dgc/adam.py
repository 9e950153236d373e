"""AdamW under the DGC hook: a frozen second moment, each rank's bias-corrected direction,
its clamp and the second moment's refreshes (1-bit Adam's idea, Tang et al. 2021, arXiv
2102.02888).

Adam's moments cannot be corrected the way SGD's velocity is: Adam divides each coordinate
by the root of its second moment, so error feedback on the gradient with AdamW after the
exchange moves a coordinate that arrives once every ~1/(1 - sparsity) steps about as far
as one dense step (training slows by about that factor), and AdamW's moments of each
rank's own gradient kept in the hook see a batch N times smaller. Both were measured on
the demo and removed (recipes/demo/RESULTS.md, "Deep Gradient Compression"); what trained
best at every sparsity measured is this:

The first `variance_freeze_step` steps are dense AdamW (the averaged gradient all-reduced,
every rank keeping the same moments of it); then the second moment is frozen and each rank
keeps only its own first moment, sending the top-k of the accumulated
lr_t m / (sqrt(v_frozen) + eps). That update is linear in the gradient, so the ranks' mean
is exactly dense Adam with the frozen second moment (the paper's momentum correction with a
fixed per-coordinate scale), and no rank's batch noise enters the second moment. The
sparsity warm-up starts after the dense steps. Momentum masking clears the first moment
where an entry was sent.

Each rank's direction is clamped to the largest one Adam can take with its own moments
((1 - b1) / sqrt((1 - b2)(1 - b1^2 / b2)), 1.7 for the demo's betas): a coordinate whose
second moment was small when it froze would otherwise take an unbounded step when its
gradient grows (the demo diverged without it: recipes/demo/RESULTS.md, "A frozen second
moment"). Where the clamp acts the update is no longer linear; elsewhere it is.

A frozen second moment goes stale as the gradients change scale (that of some coordinates
grows or shrinks several-fold within a few epochs, and all of them shrink at the end of a
run: the same section), so every `variance_refresh_steps` sparse steps it is replaced by the ranks'
mean of a local estimate of the dense second moment, exchanged in bf16: each rank keeps unmasked
moments m_a, v_a of its own gradient, and since v_a - m_a^2 holds N times the noise of the
averaged gradient, m_a^2 + (v_a - m_a^2) / N estimates its second moment. Between refreshes
the update stays linear in the gradient.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from asr.config_keys import ConfigError
from asr.training.distributed.communication.dgc.state import (
    AdamMoments,
    DGCConfig,
    DGCState,
    bucket_buffer,
)


def check_variance_freeze(config: DGCConfig, first_full_loss_step: int) -> None:
    """AdamW's second moment must freeze after every part of the model has had gradients (the
    loss's CTC-only warm-up ends at `first_full_loss_step`): a part without a second moment
    would be divided by eps."""
    if config.variance_freeze_step <= first_full_loss_step:
        raise ConfigError(
            f"distributed.compression.variance_freeze_step={config.variance_freeze_step} "
            f"freezes AdamW's second moment before the transducer loss starts (step "
            f"{first_full_loss_step}, model.loss.transducer_start_step): the predictor and "
            "joiner would have none. Make it a few hundred steps larger."
        )


def update_moments(adam: AdamMoments, first: Tensor, second: Tensor | None, grad: Tensor) -> None:
    """Adam's moving averages of `grad` and of its square, in place (`second` None: frozen)."""
    first.mul_(adam.beta1).add_(grad, alpha=1 - adam.beta1)
    if second is not None:
        second.mul_(adam.beta2).addcmul_(grad, grad, value=1 - adam.beta2)


def adam_direction(state: DGCState, index: int, grad: Tensor, frozen: bool = False) -> Tensor:
    """Update this rank's Adam moments of bucket `index` with `grad` and return the
    bias-corrected direction m_hat / (sqrt(v_hat) + eps) (AdamW's step before the rate).
    `frozen`: the second moment stays as the dense steps left it."""
    adam = state.adam
    assert adam is not None
    known = state.second_moment.get(index)
    fresh = known is None or known.shape != grad.shape
    if fresh and frozen:
        raise RuntimeError(
            f"DGC bucket {index} has no second moment to freeze: its state was lost (a "
            "checkpoint resumed without the per-rank DGC state?)"
        )
    first = bucket_buffer(state.velocity, index, grad)
    second = bucket_buffer(state.second_moment, index, grad)
    step = state.bucket_steps[index] = 1 if fresh else state.bucket_steps.get(index, 0) + 1
    update_moments(adam, first, None if frozen else second, grad)
    step_of_second = frozen_second_moment_steps(state, step) if frozen else step
    denominator = (second / (1 - adam.beta2**step_of_second)).sqrt_().add_(adam.eps)
    direction = (first / (1 - adam.beta1**step)).div_(denominator)
    if frozen:  # a coordinate whose second moment was small when it froze: Adam's own bound
        bound = adam_step_bound(adam)
        direction.clamp_(-bound, bound)
    return direction


def frozen_second_moment_steps(state: DGCState, step: int) -> int:
    """How many gradients a frozen second moment averaged (its bias correction's count):
    it stopped moving at `variance_freeze_step`."""
    return min(step, state.config.variance_freeze_step)


def adam_step_bound(adam: AdamMoments) -> float:
    """The largest |m / sqrt(v)| Adam can take with its own moments (Cauchy-Schwarz over
    the two averages: (1 - b1) / sqrt((1 - b2) (1 - b1^2 / b2))); infinite if b1^2 >= b2."""
    ratio = adam.beta1**2 / adam.beta2
    if ratio >= 1:
        return math.inf
    return (1 - adam.beta1) / math.sqrt((1 - adam.beta2) * (1 - ratio))


def track_local_moments(state: DGCState, index: int, grad: Tensor) -> None:
    """Update this rank's unmasked moments of its own gradient (for the refreshes); they
    start from the shared moments the dense steps left."""
    adam = state.adam
    assert adam is not None
    first, second = state.local_first.get(index), state.local_second.get(index)
    if first is None or first.shape != grad.shape:
        first = state.local_first[index] = state.velocity[index].clone()
        second = state.local_second[index] = state.second_moment[index].clone()
    update_moments(adam, first, second, grad)


def refresh_second_moment(state: DGCState, index: int) -> None:
    """Replace bucket `index`'s frozen second moment by the ranks' mean of
    m_a^2 + (v_a - m_a^2) / N (this rank's local moments: an estimate of the averaged
    gradient's second moment), all-reduced in bf16; waits for the exchange."""
    world = state.world_size()
    first, second = state.local_first[index], state.local_second[index]
    mean_square = first * first
    estimate = mean_square.add_((second - mean_square).clamp_(min=0.0), alpha=1.0 / world)
    shared = estimate.to(torch.bfloat16)
    dist.all_reduce(shared, group=state.process_group)
    state.traffic.count_all_reduce(shared, entries=False)
    # kept unnormalized, as Adam keeps v: the frozen bias correction divides it back
    adam = state.adam
    assert adam is not None
    steps = frozen_second_moment_steps(state, state.bucket_steps.get(index, 0) + 1)
    state.second_moment[index].copy_(shared.float().div_(world)).mul_(1 - adam.beta2**steps)

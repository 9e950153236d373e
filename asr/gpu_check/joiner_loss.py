"""A transducer loss through a joiner with seeded weights, and its gradients: what the
check's `lattice` section and the bench's loss sections compute."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from asr.models.transducer import Joiner

Loss = Callable[..., Tensor]


def seeded_joiner(
    encoder_dim: int,
    predictor_dim: int,
    joint_dim: int,
    vocab: int,
    durations: tuple[int, ...] | None = None,
) -> Joiner:
    """A `Joiner` of these sizes (a TDT joiner with `durations`) with the weights torch's
    seed 0 gives (on the CPU)."""
    torch.manual_seed(0)
    return Joiner(
        encoder_dim=encoder_dim,
        predictor_dim=predictor_dim,
        joint_dim=joint_dim,
        vocab_size=vocab,
        durations=durations,
    )


def loss_and_grads(loss_fn: Loss, joiner: Joiner, inputs: list[Tensor]) -> list[Tensor]:
    """[loss, d/d encoder_out, d/d predictor_out, d/d joiner parameters...]."""
    enc, pred, *rest = inputs
    enc, pred = enc.detach().requires_grad_(True), pred.detach().requires_grad_(True)
    params = list(joiner.parameters())
    loss = loss_fn(joiner, enc, pred, *rest)
    grads = torch.autograd.grad(loss, [enc, pred, *params])
    return [loss.detach(), *grads]

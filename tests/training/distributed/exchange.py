"""What the communication hook scenarios (test_dgc.py, test_adascale.py) share: a model of
vector parameters whose gradient is a known random vector per rank and step
(`loss = sum(p * c)`), and a loop that records what DDP's exchange made of it. Imported
inside the scenarios, which run in rank_runner.py's processes."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Vectors(nn.Module):
    """Float64 parameters of the given shapes; `forward(c)` is `sum(p * c)`, so each
    parameter's gradient is its coefficient tensor."""

    def __init__(self, shapes: list[tuple[int, ...]]) -> None:
        super().__init__()
        self.parts = nn.ParameterList(
            nn.Parameter(torch.zeros(shape, dtype=torch.float64)) for shape in shapes
        )

    def forward(self, coefficients: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * c).sum() for p, c in zip(self.parts, coefficients, strict=True))


def rank_gradients(
    shapes: list[tuple[int, ...]], step: int, seed: int, scales: list[float] | None = None
) -> list[torch.Tensor]:
    """Standard normal coefficients of each shape (times its scale) from `1000 * step +
    seed`: the same on every rank for the same seed."""
    generator = torch.Generator().manual_seed(1000 * step + seed)
    scales = scales or [1.0] * len(shapes)
    return [
        scale * torch.randn(shape, dtype=torch.float64, generator=generator)
        for shape, scale in zip(shapes, scales, strict=True)
    ]


def exchanged(model: DistributedDataParallel, coefficients: list[torch.Tensor]) -> torch.Tensor:
    """One backward through DDP: the gradient its exchange left, flat in parameter order."""
    model.zero_grad(set_to_none=True)
    model(coefficients).backward()
    return torch.cat([p.grad.flatten() for p in model.module.parts])


def record_exchange(
    model: DistributedDataParallel,
    rank: int,
    steps: int,
    shapes: list[tuple[int, ...]],
    scales: list[float] | None = None,
    state=None,
) -> dict:
    """`steps` backwards with this rank's gradients; per step the local and exchanged
    gradients and, with a DGC `state`, the indices bucket 0 sent and the largest residual and
    velocity left at them; at the end the state's residuals, traffic, second moments and
    bucket 0's layout."""
    record: dict = {"local": [], "exchanged": [], "sent": [], "masked": []}
    for step in range(steps):
        coefficients = rank_gradients(shapes, step, rank, scales)
        record["exchanged"].append(exchanged(model, coefficients))
        record["local"].append(torch.cat([c.flatten() for c in coefficients]))
        if state is not None and state.last_sent:
            sent = state.last_sent[0]
            record["sent"].append(sent.clone())
            residual = state.residual[0]
            velocity = state.velocity.get(0, torch.zeros_like(residual))
            record["masked"].append(
                (residual[sent].abs().max().item(), velocity[sent].abs().max().item())
            )
    if state is not None:
        record["residual"] = {i: r.clone() for i, r in state.residual.items()}
        record["traffic"] = vars(state.last_traffic)
        record["second_moment"] = {i: v.clone() for i, v in state.second_moment.items()}
        if 0 in state.layouts:
            layout = state.layouts[0]
            record["layout"] = {"dense": layout.dense.clone(), "segments": layout.segments}
    return record

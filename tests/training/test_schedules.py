import math

import pytest
import torch

from asr.training.schedules import build_scheduler, noam, warmup_cosine


@pytest.mark.parametrize(
    ("step", "expected"),
    [(0, 0.25), (1, 0.25), (2, 0.5), (4, 1.0), (16, 0.5), (64, 0.25), (400, 0.1)],
)
def test_noam(step: int, expected: float) -> None:
    assert noam(step, warmup_steps=4) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 0.25),  # warm-up: (step + 1) / warmup_steps
        (2, 0.75),
        (3, 1.0),  # the last warm-up step reaches the peak
        (4, 1.0),  # hold for 2 steps
        (5, 1.0),
        (6, 1.0),  # decay starts: cosine from 1 ...
        (8, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))),
        (10, 0.55),  # ... half way ...
        (14, 0.1),  # ... to min_ratio at total_steps
        (1000, 0.1),
    ],
)
def test_warmup_cosine(step: int, expected: float) -> None:
    value = warmup_cosine(step, warmup_steps=4, total_steps=14, hold_steps=2, min_ratio=0.1)
    assert value == pytest.approx(expected)


def _learning_rates(cfg: dict, total_steps: int | None, steps: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = build_scheduler(optimizer, cfg, total_steps)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_noam_scheduler_per_step() -> None:
    rates = _learning_rates({"kind": "noam", "warmup_steps": 2}, None, 9)
    assert rates == pytest.approx(
        [1.0, 1.0, 2.0, 2 * math.sqrt(2 / 3), 2 * math.sqrt(0.5)]
        + [2 * math.sqrt(2 / s) for s in range(5, 9)]
    )


def test_warmup_cosine_scheduler_per_step() -> None:
    cfg = {"kind": "warmup_cosine", "warmup_steps": 2, "hold_fraction": 0.25, "min_ratio": 0.0}
    rates = _learning_rates(cfg, total_steps=8, steps=10)
    # warm-up 2 steps, hold 0.25 * 8 = 2 steps, cosine over the remaining 4, then the floor
    cosine = [1 + math.cos(math.pi * k / 4) for k in range(4)]
    assert rates == pytest.approx([1.0, 2.0, 2.0, 2.0, *cosine, 0.0, 0.0])


def test_scheduler_config_errors_name_the_key() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=r"optim.scheduler.kind='linear' is unknown; valid: \["):
        build_scheduler(optimizer, {"kind": "linear", "warmup_steps": 1}, 10)
    with pytest.raises(ValueError, match=r"unknown config key optim.scheduler.warmup; valid"):
        build_scheduler(optimizer, {"kind": "noam", "warmup": 10}, None)
    with pytest.raises(ValueError, match="optim.scheduler.warmup_steps is required"):
        build_scheduler(optimizer, {"kind": "noam"}, None)
    with pytest.raises(ValueError, match=r"\['min_ratio'\] apply only to kind=warmup_cosine"):
        build_scheduler(optimizer, {"kind": "noam", "warmup_steps": 1, "min_ratio": 0.1}, None)
    with pytest.raises(ValueError, match="warmup_cosine needs the total number of steps"):
        build_scheduler(optimizer, {"kind": "warmup_cosine", "warmup_steps": 2}, None)

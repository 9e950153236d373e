"""The pre-training objective's bookkeeping: code use over a window, and the warning when
the codes collapse."""

from __future__ import annotations

import logging

import pytest
import torch

from asr.config_keys import ConfigError
from asr.data.batch import Batch
from asr.models.conformer import ConformerConfig
from asr.models.ssl import SslConfig, build_ssl_model
from asr.training.ssl_objective import CodeUseWindow, SslLossConfig, SslObjective


def test_the_window_pools_codes_and_warns_once_a_window_when_they_collapse(caplog) -> None:
    window = CodeUseWindow(window=3, min_share=0.5)
    with caplog.at_level(logging.WARNING):
        shares = [float(window.add(torch.tensor([[1], [1]]), 8, step)) for step in range(7)]
    assert shares == [1 / 8] * 7
    warnings = [r for r in caplog.records if "code use collapsing" in r.getMessage()]
    assert len(warnings) == 2  # at step 2 (the first full window) and step 5
    healthy = CodeUseWindow(window=2, min_share=0.5)
    with caplog.at_level(logging.WARNING):
        caplog.clear()
        healthy.add(torch.tensor([[0], [1], [2]]), 8, 0)
        share = healthy.add(torch.tensor([[3], [4]]), 8, 1)
    assert float(share) == 5 / 8 and not caplog.records
    with pytest.raises(ConfigError, match="code_use_window"):
        SslLossConfig(code_use_window=0)


def test_training_steps_count_towards_the_window_and_validation_does_not() -> None:
    torch.manual_seed(0)
    encoder = ConformerConfig(
        input_dim=16, d_model=32, num_layers=2, num_heads=2, conv_kernel_size=5
    )
    config = SslConfig(objective="best_rq", encoder=encoder)
    model = build_ssl_model(config)
    objective = SslObjective(SslLossConfig(code_use_window=5))
    lens = torch.tensor([300, 200])
    batch = Batch(torch.randn(2, 300, 16), lens, torch.zeros(2, 0, dtype=torch.long),
                  torch.zeros(2, dtype=torch.long), ["a", "b"], ["", ""])  # fmt: skip
    trained = objective(model, batch, step=0)
    assert 0 < float(trained["code_use_window"]) <= 1 and len(objective.code_window.steps) == 1
    model.eval()
    evaluated = objective(model, batch, step=0)
    assert "code_use_window" not in evaluated and len(objective.code_window.steps) == 1
    assert torch.equal(evaluated["loss"], objective(model, batch, step=0)["loss"])  # same masks


@pytest.mark.parametrize("objective_name", ["best_rq", "w2v_bert"])
def test_a_step_under_bf16_autocast_is_finite_and_repeats_from_its_generator(
    objective_name: str,
) -> None:
    torch.manual_seed(0)
    encoder = ConformerConfig(input_dim=16, d_model=32, num_layers=2, num_heads=2,
                              conv_kernel_size=5, dropout=0.0)  # fmt: skip
    model = build_ssl_model(SslConfig(objective=objective_name, encoder=encoder)).train()
    objective = SslObjective(SslLossConfig(num_distractors=5))
    lens = torch.tensor([300, 240])
    batch = Batch(torch.randn(2, 300, 16), lens, torch.zeros(2, 0, dtype=torch.long),
                  torch.zeros(2, dtype=torch.long), ["a", "b"], ["", ""])  # fmt: skip

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses = objective(model, batch, step=3)
        losses["loss"].backward()
        return losses["loss"].detach(), [
            p.grad.clone() for p in model.parameters() if p.grad is not None
        ]

    loss, grads = step()
    assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads)
    again, grads_again = step()  # masks, distractors and Gumbel noise: from (seed, step, ids)
    assert torch.equal(loss, again)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_again, strict=True))

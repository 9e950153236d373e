"""build_optimizer: the AdamW of training and of the batch-size probes."""

import pytest
import torch

from asr.training.optimizer import build_optimizer


def _model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    model[1].bias.requires_grad_(False)  # frozen parameters are left out
    return model


def test_weight_decay_on_matrices_only_and_settings_from_the_config() -> None:
    model = _model()
    cfg = {"lr": 2e-3, "betas": [0.8, 0.9], "eps": 1e-6, "weight_decay": 0.01}
    opt = build_optimizer(model, cfg, fused=False)
    decay, no_decay = opt.param_groups
    assert [p.shape for p in decay["params"]] == [torch.Size([3, 4])]
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in no_decay["params"]} == {id(model[0].bias), id(model[1].weight)}
    assert decay["lr"] == 2e-3 and decay["betas"] == (0.8, 0.9) and decay["eps"] == 1e-6
    assert decay["fused"] is False
    model(torch.randn(2, 4)).sum().backward()
    before = model[0].weight.detach().clone()
    opt.step()
    assert not torch.equal(model[0].weight, before)


def test_unknown_or_missing_keys_are_named() -> None:
    with pytest.raises(
        ValueError, match=r"unknown config key optim.momentun; valid keys of optim: \['betas'"
    ):
        build_optimizer(_model(), {"lr": 1e-3, "momentun": 0.9})
    with pytest.raises(ValueError, match=r"optim \['momentum'\] do not apply to optim.kind=adamw"):
        build_optimizer(_model(), {"lr": 1e-3, "momentum": 0.9})
    with pytest.raises(ValueError, match="config key optim.lr is required"):
        build_optimizer(_model(), {"weight_decay": 0.1})
    with pytest.raises(ValueError, match="unknown config key optim.scheduler.warmup;"):
        build_optimizer(_model(), {"lr": 1e-3, "scheduler": {"kind": "noam", "warmup": 3}})


def test_sgd_with_momentum_or_with_the_momentum_left_to_a_hook() -> None:
    cfg = {"kind": "sgd", "lr": 0.1, "weight_decay": 0.01, "nesterov": True}
    sgd = build_optimizer(_model(), cfg, fused=False)
    assert isinstance(sgd, torch.optim.SGD)
    assert sgd.param_groups[0]["momentum"] == 0.9 and sgd.param_groups[0]["nesterov"]
    plain = build_optimizer(_model(), cfg, fused=False, moments_in_hook=True)
    assert plain.param_groups[0]["momentum"] == 0.0 and not plain.param_groups[0]["nesterov"]
    with pytest.raises(ValueError, match=r"optim \['betas'\] do not apply to optim.kind=sgd"):
        build_optimizer(_model(), {**cfg, "betas": [0.9, 0.9]})


def test_adamw_whose_moments_a_hook_keeps_becomes_plain_sgd_with_its_decay() -> None:
    cfg = {"lr": 2e-3, "weight_decay": 0.01}
    sgd = build_optimizer(_model(), cfg, fused=False, moments_in_hook=True)
    assert isinstance(sgd, torch.optim.SGD)
    decay, no_decay = sgd.param_groups
    assert decay["lr"] == 2e-3 and decay["momentum"] == 0.0
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0


def test_sgd_momentum_copes_with_parameters_that_get_gradients_late() -> None:
    """The CTC-only warm-up leaves the predictor and joiner without gradient at first."""
    model = _model()
    sgd = build_optimizer(model, {"kind": "sgd", "lr": 0.1})
    model[0].weight.grad = torch.ones_like(model[0].weight)
    sgd.step()
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    sgd.step()  # torch's fused SGD raised a TypeError here
    assert sgd.state[model[0].bias]["momentum_buffer"] is not None

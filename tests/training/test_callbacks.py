"""The EMA that follows the batch size: the scaling rule, and a real run that keeps,
resumes, evaluates with and exports the EMA."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch

from asr.config_keys import ConfigError
from asr.inference.bundle import bundle_from_checkpoints, export_bundle
from asr.inference.recognizer import load_recognizer
from asr.training.callbacks import EmaConfig, EmaWeights, update
from asr.training.train import run


def _ema_after(steps: list[tuple[float, torch.Tensor]], start: torch.Tensor, rule) -> torch.Tensor:
    ema = {"w": start.clone()}
    for seconds, weights in steps:
        update(ema, {"w": weights}, rule(seconds))
    return ema["w"]


def test_one_step_of_twice_the_batch_moves_the_ema_as_two_steps_do() -> None:
    config = EmaConfig(decay=0.99, reference_batch_seconds=30.0)
    start = torch.zeros(1000, dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    theta = torch.randn(1000, dtype=torch.float64, generator=generator)
    # weights that do not move: exactly the same EMA
    two = _ema_after([(30.0, theta), (30.0, theta)], start, config.momentum)
    one = _ema_after([(60.0, theta)], start, config.momentum)
    assert torch.allclose(two, one, rtol=0, atol=1e-14)
    # weights that move by delta per step of B: the same to first order in delta
    delta = 1e-3 * torch.randn(1000, dtype=torch.float64, generator=generator)
    two = _ema_after([(30.0, theta), (30.0, theta + delta)], start, config.momentum)
    one = _ema_after([(60.0, theta + delta)], start, config.momentum)
    rho = config.momentum(30.0)
    assert torch.allclose(two - one, -rho * (1 - rho) * delta, atol=1e-15)  # the only gap
    # a momentum that ignored the batch size would stay ~ (1 - rho) |theta| away
    fixed = _ema_after([(60.0, theta + delta)], start, lambda _: rho)
    assert (fixed - two).abs().mean() > 50 * (one - two).abs().mean()


def test_momentum_follows_the_batch_and_the_config_is_checked() -> None:
    config = EmaConfig(decay=0.999, reference_batch_seconds=60.0)
    assert config.momentum(60.0) == pytest.approx(0.999)
    assert config.momentum(120.0) == pytest.approx(0.999**2)
    assert config.momentum(15.0) == pytest.approx(0.999**0.25)
    with pytest.raises(ConfigError, match="ema.decay must be in"):
        EmaConfig(decay=1.0)
    with pytest.raises(ConfigError, match="reference_batch_seconds"):
        EmaConfig(reference_batch_seconds=0)


def _metric_rows(exp_dir: Path) -> list[dict[str, str]]:
    rows = []
    for path in sorted((exp_dir / "csv").glob("version_*/metrics.csv")):
        with open(path) as f:
            rows += list(csv.DictReader(f))
    return rows


@pytest.mark.slow
def test_a_run_keeps_resumes_evaluates_with_and_exports_the_ema(
    compose_train, feature_manifests, tmp_path: Path
) -> None:
    exp = tmp_path / "exp"
    overrides = ["experiment=demo", "ema=scaled", "ema.decay=0.9", "ema.reference_batch_seconds=10"]
    run(compose_train(exp, *overrides, "trainer.max_epochs=1", "run_test=false"))
    first = torch.load(exp / "checkpoints" / "last.ckpt", weights_only=False)
    state = first["callbacks"]["EmaWeights"]
    steps = first["global_step"]
    assert state["updates"] == steps > 2
    rows = [r for r in _metric_rows(exp) if r.get("ema/momentum")]
    for row in rows[1:]:  # each step's momentum follows its seconds of audio
        seconds = float(
            next(
                r
                for r in _metric_rows(exp)
                if r["step"] == row["step"] and r.get("train/audio_seconds")
            )["train/audio_seconds"]
        )
        assert float(row["ema/momentum"]) == pytest.approx(0.9 ** (seconds / 10), rel=1e-5)
    raw = {k[len("model.") :]: v for k, v in first["state_dict"].items() if k.startswith("model.")}
    moved = [n for n, w in state["weights"].items() if not torch.equal(w, raw[n].float())]
    assert len(moved) > len(state["weights"]) // 2  # the EMA lags the weights

    # resuming continues the same EMA
    run(compose_train(exp, *overrides, "trainer.max_epochs=2", "run_test=false"))
    second = torch.load(exp / "checkpoints" / "last.ckpt", weights_only=False)
    assert second["callbacks"]["EmaWeights"]["updates"] == second["global_step"] == 2 * steps

    # validation saw the EMA weights: its WER is the EMA model's
    ema_bundle = bundle_from_checkpoints([exp / "checkpoints" / "last.ckpt"], ema=True)
    plain_bundle = bundle_from_checkpoints([exp / "checkpoints" / "last.ckpt"])
    name = next(iter(state["weights"]))
    assert torch.equal(
        ema_bundle["state_dict"][name], second["callbacks"]["EmaWeights"]["weights"][name]
    )
    assert not torch.equal(ema_bundle["state_dict"][name], plain_bundle["state_dict"][name])
    assert ema_bundle["ema"] and not plain_bundle["ema"]

    # asr-decode --ema (load_recognizer's ema) decodes a checkpoint's EMA, not a plain bundle
    last = exp / "checkpoints" / "last.ckpt"
    decoded = load_recognizer(last, ema=True).model.state_dict()
    assert torch.equal(decoded[name], ema_bundle["state_dict"][name])
    plain = export_bundle(last, tmp_path / "plain.bundle.pt")
    with pytest.raises(ValueError, match="bundle of the trained weights: for the EMA, export"):
        load_recognizer(plain, ema=True)


class _Recorder(L.LightningModule):
    """A linear model that records the weights each evaluation step sees."""

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Linear(3, 2)
        self.seen: list[torch.Tensor] = []

    def validation_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        self.seen.append(self.model.weight.detach().clone())

    test_step = validation_step


def test_evaluation_sees_the_ema_and_training_gets_its_weights_back() -> None:
    module = _Recorder()
    callback = EmaWeights(EmaConfig())
    callback.weights = {n: torch.full_like(p, 0.5) for n, p in module.model.named_parameters()}
    trained = module.model.weight.detach().clone()
    loader = torch.utils.data.DataLoader(torch.zeros(2, 3), batch_size=1)
    trainer = L.Trainer(
        callbacks=[callback], logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.validate(module, loader, verbose=False)
    trainer.test(module, loader, verbose=False)
    assert len(module.seen) == 4
    assert all(torch.equal(w, torch.full_like(w, 0.5)) for w in module.seen)
    assert torch.equal(module.model.weight, trained)  # swapped back

from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
from lhotse import CutSet

from asr.data.corpus import load_cuts
from asr.data.dataset import SKIP_REASONS, UNREADABLE
from asr.training.step_guard import (
    MIN_CUTS_MID_EPOCH,
    FaultConfig,
    NonFiniteGuard,
    SkipBudget,
    StepTotals,
    TrainingStopped,
)
from asr.training.train import build

TRAIN = "train-clean-100"


def totals(used: int, **skipped: int) -> StepTotals:
    counts = dict.fromkeys(SKIP_REASONS, 0)
    counts.update({reason.replace("_", " "): n for reason, n in skipped.items()})
    return StepTotals(nonfinite_ranks=0, utterances=used, audio_seconds=0.0, skipped=counts)


def test_skip_budget_judges_mid_epoch_only_on_enough_cuts() -> None:
    budget = SkipBudget(max_fraction=0.05)
    budget.add(totals(10, unreadable_audio=10))  # 50 %, but only 20 cuts seen
    budget.check()
    with pytest.raises(
        TrainingStopped, match=r"10 of the 20 cuts .* \(50.0 %\) .*'unreadable audio'"
    ):
        budget.check(epoch_end=True)


def test_skip_budget_names_the_commonest_reason_and_resets_per_epoch() -> None:
    budget = SkipBudget(max_fraction=0.05)
    budget.add(totals(MIN_CUTS_MID_EPOCH, empty_transcript=30, unreadable_audio=120))
    with pytest.raises(TrainingStopped, match=r"commonest reason: 'unreadable audio' \(120"):
        budget.check()
    budget.start_epoch()
    budget.add(totals(MIN_CUTS_MID_EPOCH, empty_transcript=100))  # 4.8 %: within the limit
    budget.check(epoch_end=True)


def test_nonfinite_guard_stops_after_k_in_a_row_only() -> None:
    guard = NonFiniteGuard(max_consecutive=3)
    for step, bad in enumerate([True, True, False, True, True]):
        guard.record(bad, step, "nan")
    assert (guard.total, guard.consecutive) == (4, 2)
    with pytest.raises(TrainingStopped, match=r"3 optimizer steps in a row .* step 5: nan"):
        guard.record(True, 5, "nan")


def test_fault_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"unknown config key faults\.max_skip; valid keys of"):
        FaultConfig.from_mapping({"max_skip": 0.1})
    with pytest.raises(ValueError, match="faults.max_skipped_fraction must be in"):
        FaultConfig.from_mapping({"max_skipped_fraction": 2})


class NanFrom:
    """The objective, with a NaN loss from global step `step` on."""

    def __init__(self, objective, step: int) -> None:
        self.objective, self.step = objective, step

    def __call__(self, model, batch, step: int):
        out = self.objective(model, batch, step)
        if step >= self.step and torch.is_grad_enabled():
            out["loss"] = out["loss"] * float("nan")
        return out


def _tiny(compose_train, exp: Path, *overrides: str):
    return compose_train(
        exp,
        "experiment=demo",
        "trainer.check_val_every_n_epoch=100",
        "run_test=false",
        *overrides,
    )


@pytest.mark.slow
def test_consecutive_nonfinite_steps_stop_the_run_with_good_weights(
    compose_train, feature_manifests, tmp_path, single_thread
) -> None:
    cfg = _tiny(
        compose_train,
        tmp_path / "exp",
        "faults.max_consecutive_nonfinite=3",
        "checkpoint.every_n_train_steps=1",
    )
    L.seed_everything(cfg.seed)
    trainer, module, datamodule, _ = build(cfg)
    module.objective = NanFrom(module.objective, step=4)
    with pytest.raises(TrainingStopped, match=r"3 optimizer steps in a row .* step 6"):
        trainer.fit(module, datamodule=datamodule)
    last = torch.load(tmp_path / "exp" / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 6  # steps 4 and 5 were skipped, and checkpointed
    weights = {k[len("model.") :]: v for k, v in last["state_dict"].items()}
    params = dict(module.model.named_parameters())
    for name, param in params.items():
        assert torch.isfinite(param).all() and torch.equal(param, weights[name]), name


@pytest.mark.slow
def test_too_many_unusable_cuts_stop_the_epoch_naming_the_reason(
    compose_train, feature_manifests, tmp_path, single_thread
) -> None:
    cuts = list(load_cuts(feature_manifests[TRAIN]))
    broken = [
        replace(c, features=replace(c.features, storage_path=str(tmp_path / "gone.lca")))
        if i % 3 == 0
        else c
        for i, c in enumerate(cuts)
    ]
    manifest = tmp_path / "train.jsonl.gz"
    CutSet.from_cuts(broken).to_file(manifest)
    cfg = _tiny(compose_train, tmp_path / "exp", f"data.train_cuts=[{manifest}]")
    trainer, module, datamodule, _ = build(cfg)
    with pytest.raises(TrainingStopped) as stopped:
        trainer.fit(module, datamodule=datamodule)
    n = len(cuts[::3])
    assert f"{n} of the {len(cuts)} cuts seen this epoch" in str(stopped.value)
    assert f"commonest reason: '{UNREADABLE}' ({n} cuts)" in str(stopped.value)
    assert trainer.current_epoch == 0

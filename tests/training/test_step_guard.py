import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
from lhotse import CutSet
from omegaconf import OmegaConf

from asr.data.buckets import build_sampler
from asr.data.corpus import load_cuts, open_cuts
from asr.data.dataset import SKIP_REASONS, UNREADABLE
from asr.data.tokenizer import Tokenizer
from asr.training.step_guard import (
    FIRST_STEPS_ALL_UNUSABLE,
    MIN_CUTS_MID_EPOCH,
    FaultConfig,
    NonFiniteGuard,
    SkipBudget,
    StepTotals,
    TrainingStopped,
)
from asr.training.train import build

TRAIN = "train-clean-100"
ASR_TRAIN = Path(sys.executable).with_name("asr-train")
TIMEOUT = 120  # seconds for any one asr-train run: a hang fails the test, not the suite


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


def test_skip_budget_state_carries_an_unfinished_epoch_only() -> None:
    budget = SkipBudget(max_fraction=0.05)
    budget.add(totals(100, unreadable_audio=3, empty_transcript=1))
    resumed = SkipBudget(max_fraction=0.05)
    resumed.load_state_dict(budget.state_dict())
    assert (resumed.used, resumed.skipped, resumed.fraction) == (100, budget.skipped, 4 / 104)
    budget.end_epoch()  # 3.8 %: within the limit
    next_epoch = SkipBudget(max_fraction=0.05)
    next_epoch.load_state_dict(budget.state_dict())
    assert next_epoch.seen == 0


def test_a_run_whose_first_steps_had_no_usable_cut_stops_at_once() -> None:
    budget = SkipBudget(max_fraction=0.05)
    for step in range(FIRST_STEPS_ALL_UNUSABLE - 1):
        budget.add(totals(0, unreadable_audio=4), "cut a: unreadable (gone.flac)" if step else "")
        budget.check()  # not yet
    budget.add(totals(0, empty_transcript=2), "cut b: empty transcript")
    first = re.escape("the first: cut a: unreadable (gone.flac)")
    with pytest.raises(TrainingStopped, match=rf"first 10 cuts of this run \(3 steps\).*{first}"):
        budget.check()
    started = SkipBudget(max_fraction=0.05)  # one usable cut first: judged by the fraction
    started.add(totals(1))
    for _ in range(2 * FIRST_STEPS_ALL_UNUSABLE):
        started.add(totals(0, unreadable_audio=4))
        started.check()


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
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_consecutive_nonfinite_steps_stop_the_run_with_good_weights(
    compose_train, demo_feature_manifests, tmp_path, single_thread
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
    last_path = tmp_path / "exp" / "checkpoints" / "last.ckpt"
    last = torch.load(last_path, weights_only=False)
    assert last["global_step"] == 6  # steps 4 and 5 were skipped, and checkpointed
    weights = {k[len("model.") :]: v for k, v in last["state_dict"].items()}
    params = dict(module.model.named_parameters())
    for name, param in params.items():
        assert torch.isfinite(param).all() and torch.equal(param, weights[name]), name
    # Resumed, the run counts on from the checkpoint: its first step is the third in a row.
    trainer, module, datamodule, _ = build(cfg)
    module.objective = NanFrom(module.objective, step=4)
    with pytest.raises(TrainingStopped, match=r"3 optimizer steps in a row .* step 6"):
        trainer.fit(module, datamodule=datamodule, ckpt_path=last_path)


@pytest.mark.slow
def test_too_many_unusable_cuts_stop_the_epoch_naming_the_reason(
    compose_train, demo_feature_manifests, tmp_path, single_thread
) -> None:
    cuts = list(load_cuts(demo_feature_manifests[TRAIN]))
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


# --- asr-train's own stops, as a user meets them ---------------------------------------------


@pytest.fixture(scope="module")
def skip_budget_run(
    compose_train, train_overrides, demo_feature_manifests, tmp_path_factory
) -> dict:
    """An `asr-train` command whose run stops for its skip budget at the end of epoch 0: every
    cut of the epoch's first two batches (about 13 % of the cuts) has a missing feature file,
    `faults.max_skipped_fraction=0.05`, `last.ckpt` every 2 steps (`command(exp)`), and its
    uninterrupted run: `whole` (the finished process), `whole_last` (its last.ckpt), `stop`
    (the counts its message names)."""
    root = tmp_path_factory.mktemp("skip_budget")
    overrides = [
        "experiment=demo",
        "trainer.check_val_every_n_epoch=100",
        "run_test=false",
        "trainer.max_epochs=2",  # an epoch more than the stop needs: a miscount runs on
        "checkpoint.every_n_train_steps=2",
        "faults.max_skipped_fraction=0.05",
    ]
    data = OmegaConf.to_container(compose_train(root / "probe", *overrides).data, resolve=True)
    sampler = build_sampler(
        open_cuts(data["train_cuts"]), data["sampler"], tokenizer=Tokenizer.load(data["tokenizer"])
    )
    sampler.set_epoch(0)
    batches = [list(batch.ids) for batch in sampler]
    victims = set(batches[0] + batches[1])  # trained on before the first checkpoint
    cuts = list(load_cuts(demo_feature_manifests[TRAIN]))
    assert 0.05 < len(victims) / len(cuts) < 0.2, (len(victims), len(cuts))
    missing = str(root / "missing.lca")
    broken = [
        replace(c, features=replace(c.features, storage_path=missing)) if c.id in victims else c
        for c in cuts
    ]
    manifest = root / "train-broken.jsonl.gz"
    CutSet.from_cuts(broken).to_file(manifest)

    def command(exp: str) -> list[str]:
        args = [*train_overrides(root / exp), *overrides, f"data.train_cuts=[{manifest}]"]
        return [str(ASR_TRAIN), *args]

    done = asr_train(command("whole"))
    last = torch.load(root / "whole" / "checkpoints" / "last.ckpt", weights_only=False)
    stop = f"{len(victims)} of the {len(cuts)} cuts seen this epoch"
    return {"root": root, "command": command, "whole": done, "whole_last": last, "stop": stop}


def asr_train(command: list[str], **env: str) -> subprocess.CompletedProcess:
    """Run `command` to its end with one torch thread; stdout and stderr are captured."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=TIMEOUT)


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one line of stderr that names the skip budget; no traceback anywhere."""
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Error executing job" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "max_skipped_fraction" in line]
    assert len(lines) == 1 and lines[0] == done.stderr.strip().splitlines()[-1], done.stderr
    return lines[0]


@pytest.mark.slow
def test_asr_train_ends_its_own_stop_with_one_line(skip_budget_run) -> None:
    stop = skip_budget_run["stop"]
    line = error_line(skip_budget_run["whole"])
    assert line.startswith(f"asr-train: error: {stop} (")
    assert f"commonest reason: '{UNREADABLE}' ({stop.split()[0]} cuts)" in line
    debug = asr_train(skip_budget_run["command"]("debug"), ASR_DEBUG="1")
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and f"TrainingStopped: {stop}" in debug.stderr


@pytest.mark.slow
def test_relative_paths_read_from_elsewhere_stop_at_once_naming_the_directory(
    train_overrides, demo_feature_manifests, tmp_path: Path
) -> None:
    """A manifest with paths relative to the corpus, trained from another directory: every
    cut is unreadable, and the run stops within its first steps in one line that names the
    first path and the directory it was read from (not after MIN_CUTS_MID_EPOCH cuts)."""
    cuts = list(load_cuts(demo_feature_manifests[TRAIN]))
    corpus = Path(cuts[0].features.storage_path).parent
    relative = [
        replace(c, features=replace(c.features, storage_path=Path(c.features.storage_path).name))
        for c in cuts
    ]
    manifest = tmp_path / "relative.jsonl.gz"
    CutSet.from_cuts(relative).to_file(manifest)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = [*train_overrides(tmp_path / "exp"), "experiment=demo", f"data.train_cuts=[{manifest}]"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [str(ASR_TRAIN), *args, "run_test=false"],
        capture_output=True, text=True, env=env, cwd=elsewhere, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("asr-train: error: the first ") and "were all unusable" in line
    assert relative[0].features.storage_path in line and str(corpus) not in line
    assert f"read from the working directory {elsewhere}" in line
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "exp" / "checkpoints" / "epoch=00.ckpt").exists()


def kill_after_first_checkpoint(command: list[str], last: Path) -> None:
    """Start `command` in its own session and kill -9 it once `last` exists."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while proc.poll() is None and not last.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before its first checkpoint"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
@pytest.mark.long
def test_skip_budget_counts_on_after_kill_and_resume(skip_budget_run) -> None:
    """Killed after a mid-epoch checkpoint and run again, the run stops where the
    uninterrupted one did, with the same counts (not a budget started afresh at the resume,
    which sees none of the broken cuts and trains through another epoch)."""
    command, root = skip_budget_run["command"]("killed"), skip_budget_run["root"]
    last = root / "killed" / "checkpoints" / "last.ckpt"
    kill_after_first_checkpoint(command, last)
    killed = torch.load(last, weights_only=False)
    whole = skip_budget_run["whole_last"]
    assert killed["AsrDataModule"]["epoch"] == 0 and killed["global_step"] < whole["global_step"]
    assert killed["AsrDataModule"]["batches_done"] >= 2  # the broken batches are behind it
    resumed = asr_train(command)  # the same command again: resume=auto
    assert error_line(resumed) == error_line(skip_budget_run["whole"])
    last = torch.load(last, weights_only=False)
    assert (last["global_step"], last["epoch"]) == (whole["global_step"], whole["epoch"])

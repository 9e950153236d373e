import csv
import subprocess
import sys
from pathlib import Path
from statistics import mean

import hydra
import lightning as L
import numpy as np
import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

import asr
from asr.decoding.transducer import GreedyOptions
from asr.decoding.transducer_beam import BeamOptions
from asr.training.command import CONFIG_DIR
from asr.training.train import build, resume_path, run

ASR_TRAIN = Path(sys.executable).with_name("asr-train")


def compose(*overrides: str) -> DictConfig:
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra.compose("train", overrides=list(overrides))


# --- configuration -----------------------------------------------------------------------


def test_experiment_preset_sets_its_run_directories() -> None:
    # asr/configs/experiment/demo.yaml: data_dir: data/demo, exp_dir: exp/demo
    cfg = compose("experiment=demo")
    assert (cfg.data_dir, cfg.exp_dir) == ("data/demo", "exp/demo")
    assert cfg.data.tokenizer == "data/demo/tokenizer/bpe128.model"


def test_csv_logger_choice_has_no_wandb() -> None:
    assert compose("experiment=demo", "logger=csv").logger.wandb is None
    assert compose("logger=csv").logger.wandb is None


def test_sizes_follow_the_model() -> None:
    cfg = compose("experiment=demo", "data.features.num_mel_bins=64")
    assert cfg.model.encoder.input_dim == 64
    assert cfg.data.subsampling_factor == cfg.model.encoder.subsampling_factor == 4
    cfg = compose("experiment=demo", "model.encoder.subsampling_factor=8")
    assert cfg.data.subsampling_factor == 8  # the token-length filter follows the encoder


def test_misspelt_override_fails_at_composition_naming_the_key() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose("experiment=demo", "model.encoder.num_layer=2")
    assert "model.encoder.num_layer" in str(err.value)


def test_misspelt_added_model_key_fails_before_training(compose_train, tmp_path: Path) -> None:
    cfg = compose_train(tmp_path / "exp", "experiment=demo", "+model.encoder.num_layer=2")
    with pytest.raises(ValueError, match=r"unknown config key model\.encoder\.num_layer"):
        run(cfg)
    assert not (tmp_path / "exp").exists()  # nothing was trained or written


def test_misspelt_added_sampler_key_fails_before_training(compose_train, tmp_path: Path) -> None:
    cfg = compose_train(tmp_path / "exp", "experiment=demo", "+data.sampler.max_durations=5")
    with pytest.raises(ValueError, match=r"unknown config key data\.sampler\.max_durations;"):
        run(cfg)
    assert not (tmp_path / "exp").exists()


def test_validation_beam_size_chooses_the_validation_search(compose_train, tmp_path: Path) -> None:
    greedy = build(compose_train(tmp_path / "greedy"))[1]
    beam = build(compose_train(tmp_path / "beam", "validation_beam_size=4"))[1]
    assert greedy.search == GreedyOptions() and beam.search == BeamOptions(beam_size=4)


@pytest.mark.slow
def test_cfg_job_prints_the_composed_config(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ASR_TRAIN), "experiment=demo", "data_dir=/data/x", "--cfg", "job"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    printed = OmegaConf.create(done.stdout)
    assert printed.model.encoder.d_model == 144  # from the demo preset
    assert printed.data_dir == "/data/x"  # from the command line
    assert printed.optim.scheduler.kind == "warmup_cosine"
    # interpolations are printed as written, and resolve within the printed config
    assert OmegaConf.to_container(printed.data)["tokenizer"] == "${data_dir}/tokenizer/bpe128.model"
    assert printed.data.tokenizer == "/data/x/tokenizer/bpe128.model"
    assert printed.model.encoder.input_dim == 80
    assert "hydra" not in printed
    assert list(tmp_path.iterdir()) == []  # printing the config runs nothing


# --- training ----------------------------------------------------------------------------


def _metrics_rows(exp_dir: Path, version: int = 0) -> list[dict[str, str]]:
    with open(exp_dir / "csv" / f"version_{version}" / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_training_loss_falls(trained_run) -> None:
    # The run does not shuffle: each epoch has the same batches in the same order, so the
    # per-step losses of two epochs differ only by the model.
    losses: dict[str, list[float]] = {}
    for row in _metrics_rows(trained_run.exp_dir):
        if row["train/loss"]:
            losses.setdefault(row["epoch"], []).append(float(row["train/loss"]))
    first, last = losses["0"], losses[str(trained_run.epochs - 1)]
    assert len(losses) == trained_run.epochs and len(first) == len(last) >= 12
    assert mean(last) < 0.9 * mean(first), f"epoch means {mean(first):.1f} -> {mean(last):.1f}"
    assert last[0] < 0.6 * first[0], "the first batch, from random weights to trained"


@pytest.mark.slow
def test_checkpoints_exist_and_load(trained_run) -> None:
    ckpts = trained_run.checkpoints
    epochs = [f"epoch={e:02d}.ckpt" for e in range(trained_run.epochs)]
    names = {"last.ckpt", "best.ckpt", *epochs}
    assert names <= {p.name for p in ckpts.iterdir()}
    steps = {}
    for name in names:
        checkpoint = torch.load(ckpts / name, map_location="cpu", weights_only=False)
        steps[name] = checkpoint["global_step"]
        assert any(k.startswith("model.encoder.") for k in checkpoint["state_dict"])
        assert checkpoint["asr_bundle"]["model"]["encoder"]["d_model"] == 64
    assert 0 < steps[epochs[0]] < steps[epochs[1]] < steps[epochs[2]]
    assert steps["last.ckpt"] == steps[epochs[-1]]
    recognizer = asr.load_model(ckpts / "last.ckpt")
    assert isinstance(recognizer.transcribe(np.zeros(16_000, np.float32))[0], str)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The dirpath has changed")  # rebuilt in tmp_path, on purpose
def test_run_tests_the_best_checkpoint(
    trained_run, compose_train, tmp_path: Path, single_thread
) -> None:
    """The test metrics `run` returns are those of `best.ckpt`'s weights (the best
    validation WER), not of another checkpoint's: a fresh test of each tells which was
    tested."""
    ckpts = trained_run.checkpoints

    def tested(name: str) -> dict[str, float]:
        exp_dir = tmp_path / name.replace("=", "_")  # a Hydra override holds no "="
        built = build(compose_train(exp_dir, *trained_run.overrides))
        (results,) = built.trainer.test(
            built.module, datamodule=built.datamodule, ckpt_path=str(ckpts / name)
        )
        return results

    def step(name: str) -> int:
        return torch.load(ckpts / name, map_location="cpu", weights_only=False)["global_step"]

    # another checkpoint than the best (the last, unless the last epoch was the best)
    other = "last.ckpt" if step("last.ckpt") != step("best.ckpt") else "epoch=00.ckpt"
    assert step(other) != step("best.ckpt")
    best, different = tested("best.ckpt"), tested(other)
    assert best["test/loss"] != pytest.approx(different["test/loss"])  # they can be told apart
    for name in ("test/loss", "test/wer"):
        assert trained_run.metrics[name] == pytest.approx(best[name], rel=1e-5), name


@pytest.mark.slow
def test_validation_after_every_epoch(trained_run) -> None:
    rows = _metrics_rows(trained_run.exp_dir)
    epochs = [str(e) for e in range(trained_run.epochs)]
    assert [r["epoch"] for r in rows if r["val/wer"]] == epochs
    assert [r["epoch"] for r in rows if r["val/loss"]] == epochs


# --- resuming ----------------------------------------------------------------------------


class BatchRecorder(L.Callback):
    """(global step, epoch, batch index, cut ids) of every training batch."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, int, int, list[str]]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append((trainer.global_step, trainer.current_epoch, batch_idx, batch.cut_ids))


def _fit(cfg: DictConfig) -> tuple[BatchRecorder, dict[str, torch.Tensor], int]:
    """What `run` does for fitting, with a recorder added to the trainer."""
    L.seed_everything(cfg.seed, workers=True)
    trainer, module, datamodule, _ = build(cfg)
    recorder = BatchRecorder()
    trainer.callbacks.append(recorder)
    ckpt = resume_path(cfg.resume, Path(cfg.exp_dir) / "checkpoints")
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    weights = {k: v.detach().clone() for k, v in module.model.state_dict().items()}
    return recorder, weights, trainer.global_step


# ~16 batches per epoch: stop mid-epoch 0 (and, run C, mid-epoch 1), end in epoch 1
STOP, STOP_EPOCH1, TOTAL, CADENCE = 9, 18, 24, 3


@pytest.fixture(scope="module")
def resume_runs(compose_train, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run A trains TOTAL steps; run B stops at STOP, then resumes (resume=auto) to TOTAL.

    Deterministic setup so that both must agree exactly: no dropout, no SpecAugment, a
    schedule that does not depend on max_steps (noam), no validation in between."""
    root = tmp_path_factory.mktemp("resume")

    def cfg(exp: str, max_steps: int, *extra: str) -> DictConfig:
        return compose_train(
            root / exp,
            *extra,
            "data=demo",
            "optim=adamw_noam",
            "data.spec_augment=null",
            "model.encoder.dropout=0.0",
            "model.predictor.dropout=0.0",
            f"checkpoint.every_n_train_steps={CADENCE}",
            f"trainer.max_steps={max_steps}",
            "trainer.check_val_every_n_epoch=100",
            "run_test=false",
        )

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = _fit(cfg("a", TOTAL))
        b1 = _fit(cfg("b", STOP))
        stopped = torch.load(root / "b" / "checkpoints" / "last.ckpt", weights_only=False)
        b2 = _fit(cfg("b", TOTAL))
        _fit(cfg("c", STOP_EPOCH1))
        c2 = _fit(cfg("c", TOTAL))
        epoch0 = root / "a" / "checkpoints" / "epoch=00.ckpt"
        d = _fit(cfg("d", TOTAL, f"resume='{epoch0}'"))  # max_steps: iteration-based
        e = _fit(cfg("e", -1, f"resume='{epoch0}'", "trainer.max_epochs=2"))  # epoch-based
    finally:
        torch.set_num_threads(before)
    runs = {"a": a, "b1": b1, "b2": b2, "c2": c2, "d": d, "e": e}
    return {**runs, "stopped": stopped, "b_dir": root / "b"}


@pytest.mark.slow
def test_stop_is_mid_epoch_and_checkpointed(resume_runs) -> None:
    a_batches = resume_runs["a"][0].batches
    assert [b[:3] for b in a_batches[STOP - 1 : STOP + 1]] == [
        (STOP - 1, 0, STOP - 1),
        (STOP, 0, STOP),
    ]
    assert any(epoch == 1 for _, epoch, _, _ in a_batches), "run A goes into a second epoch"
    assert resume_runs["b1"][2] == STOP
    assert resume_runs["b1"][0].batches == a_batches[:STOP]
    stopped = resume_runs["stopped"]
    assert stopped["global_step"] == STOP
    assert stopped["AsrDataModule"] == {"epoch": 0, "batches_done": STOP, "world_size": 1}


@pytest.mark.slow
def test_resume_keeps_the_first_runs_metrics(resume_runs) -> None:
    exp_dir = resume_runs["b_dir"]
    first = {int(r["step"]) for r in _metrics_rows(exp_dir, 0) if r.get("train/loss")}
    second = {int(r["step"]) for r in _metrics_rows(exp_dir, 1) if r.get("train/loss")}
    assert first and second and max(first) < min(second)


@pytest.mark.slow
def test_resume_continues_at_the_stop_step(resume_runs) -> None:
    resumed = resume_runs["b2"][0].batches
    assert resumed[0][:3] == (STOP, 0, STOP)
    assert resume_runs["b2"][2] == TOTAL


@pytest.mark.slow
def test_resume_sees_the_same_batches(resume_runs) -> None:
    assert resume_runs["b2"][0].batches == resume_runs["a"][0].batches[STOP:]


@pytest.mark.slow
def test_resume_reaches_the_same_weights(resume_runs) -> None:
    a, b = resume_runs["a"][1], resume_runs["b2"][1]
    assert a.keys() == b.keys()
    worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    assert worst <= 1e-6


@pytest.mark.slow
def test_resume_inside_a_later_epoch_sees_that_epochs_batches(resume_runs) -> None:
    a = resume_runs["a"][0].batches
    epoch1 = [b for b in a if b[1] == 1]
    assert epoch1 and epoch1[0][0] < STOP_EPOCH1  # the stop is inside epoch 1
    assert [b[3] for b in a if b[1] == 0] != [b[3] for b in epoch1][: len(a)]  # shuffled
    assert resume_runs["c2"][0].batches == a[STOP_EPOCH1:]
    assert resume_runs["c2"][1].keys() == resume_runs["a"][1].keys()
    worst = max(
        (resume_runs["a"][1][k].double() - resume_runs["c2"][1][k].double()).abs().max().item()
        for k in resume_runs["a"][1]
    )
    assert worst <= 1e-6


@pytest.mark.slow
def test_resume_from_an_end_of_epoch_checkpoint_starts_the_next_epoch(resume_runs) -> None:
    # Lightning numbers the epoch of an iteration-based run (max_steps) resumed from an
    # end-of-epoch checkpoint one lower; the batches must still be the next epoch's.
    a = resume_runs["a"][0].batches
    epoch1 = [b[3] for b in a if b[1] == 1]
    assert [b[3] for b in resume_runs["d"][0].batches] == epoch1
    e = resume_runs["e"][0].batches
    assert [b[3] for b in e][: len(epoch1)] == epoch1 and {b[1] for b in e} == {1}


class LossRecorder(L.Callback):
    """The optimized loss of every training step."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


@pytest.mark.slow
def test_samplewise_and_batched_losses_train_alike(
    compose_train, feature_manifests, tmp_path: Path, single_thread
) -> None:
    """Same seed, same data, the demo model: 20 steps with either loss give the same losses."""
    losses = {}
    for kind in ("batched", "samplewise"):
        cfg = compose_train(
            tmp_path / kind,
            "experiment=demo",
            *(f"model.encoder.{k}" for k in ("d_model=144", "num_layers=6", "num_heads=4")),
            "model.predictor.embed_dim=160",
            "model.predictor.hidden_dim=160",
            "model.joiner.joint_dim=160",
            f"model.loss.kind={kind}",
            "model.loss.transducer_start_step=0",
            "trainer.precision=32-true",  # exact comparison: no bf16 rounding in either
            "trainer.max_steps=20",
            "trainer.check_val_every_n_epoch=100",
            "run_test=false",
        )
        L.seed_everything(cfg.seed, workers=True)
        trainer, module, datamodule, _ = build(cfg)
        recorder = LossRecorder()
        trainer.callbacks.append(recorder)
        trainer.fit(module, datamodule=datamodule)
        losses[kind] = recorder.losses
    assert len(losses["batched"]) == 20
    relative = [
        abs(s - b) / abs(b) for b, s in zip(losses["batched"], losses["samplewise"], strict=True)
    ]
    assert max(relative) < 1e-4, relative
    assert losses["batched"][-1] < losses["batched"][0]  # it trained


def test_asr_train_ends_a_bad_config_with_one_line(tmp_path: Path) -> None:
    """An unknown loss kind: one line naming the key and the valid values, exit 1."""
    done = subprocess.run(
        [
            str(ASR_TRAIN),
            "experiment=demo",
            "model.loss.kind=nope",
            f"exp_dir={tmp_path / 'exp'}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    error = done.stderr.strip().splitlines()[-1]
    assert (
        error
        == "asr-train: error: model.loss.kind='nope' is unknown; valid: ['batched', 'samplewise']"
    )
    assert "Traceback" not in done.stderr

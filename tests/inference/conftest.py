"""Fixtures of the inference tests: the shared training run's last two epochs exported once
through `asr-export` (`bundle`), an attention encoder-decoder run (`aed_run`), the test
part of the tiny corpus, and a runner of the console scripts (`cli`)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

TEST = "test-clean"


@dataclass(frozen=True)
class ConsoleScripts:
    """The package's console scripts, run as a shell runs them."""

    bin: Path
    env: dict[str, str]

    def command(self, name: str, *args: str | Path) -> list[str]:
        return [str(self.bin / name), *map(str, args)]

    def __call__(self, name: str, *args: str | Path) -> str:
        """Run a console script of the package; its stdout."""
        done = subprocess.run(
            self.command(name, *args), capture_output=True, text=True, timeout=300, env=self.env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout


@pytest.fixture(scope="session")
def cli() -> ConsoleScripts:
    # one intra-op thread in the subprocesses too (see the single_thread fixture)
    return ConsoleScripts(Path(sys.executable).parent, {**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="session")
def bundle(trained_run, cli: ConsoleScripts, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`asr-export epoch=02.ckpt --average 2`: the mean of the last two epochs."""
    path = tmp_path_factory.mktemp("export") / "model.bundle.pt"
    last_epoch = trained_run.checkpoints / f"epoch={trained_run.epochs - 1:02d}.ckpt"
    out = cli("asr-export", last_epoch, "--average", "2", "-o", path)
    assert f"wrote {path}" in out and "weights averaged over 2 checkpoint(s)" in out
    return path


@pytest.fixture(scope="session")
def test_cuts(tiny_corpus) -> Path:
    return tiny_corpus.cuts(TEST)


@pytest.fixture(scope="session")
def test_flacs(tiny_corpus) -> list[Path]:
    return sorted((tiny_corpus.librispeech / TEST).rglob("*.flac"))


@pytest.fixture(scope="session")
def aed_run(compose_train, feature_manifests, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 epochs of experiment=demo_aed_flash, shrunk to the tiny model; its exp_dir."""
    from asr.training.train import run

    exp_dir = tmp_path_factory.mktemp("aed") / "exp"
    cfg = compose_train(
        exp_dir,
        "experiment=demo_aed_flash",
        "trainer.max_epochs=2",
        "optim.lr=3e-3",
        kind="aed",
    )
    metrics = run(cfg)
    assert {"val/wer", "val/ctc_wer", "train/cross_entropy", "train/ctc"} <= set(metrics)
    return exp_dir


# experiment=demo_streaming shrunk, from scratch, 6 steps within the CTC warm-up (so its
# joiner emits many tokens): what the streaming fixtures train.
TINY_STREAMING = (
    "experiment=demo_streaming",
    "init_from=null",
    "model.loss.transducer_start_step=280",
    "model.encoder.streaming.chunk_sizes=[2,4,-1]",
    "model.encoder.streaming.left_contexts=[8]",
    "trainer.max_epochs=1",
    "trainer.max_steps=6",
    "optim.lr=3e-3",
)


@pytest.fixture(scope="session")
def streaming_run(
    compose_train, train_tiny, tiny_corpus, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """experiment=demo_streaming shrunk and from scratch, 6 steps (within a CTC warm-up, so
    its joiner emits many tokens), after the recipe's stage 3 for it: librosa features and their
    statistics. Its last checkpoint."""
    from asr.data.feature_stats import compute_feature_stats
    from asr.data.features import FeatureConfig, precompute_features

    librosa = FeatureConfig(frontend="librosa")
    for part in ("train-clean-100", "dev-clean"):
        target = tiny_corpus.cuts(f"{part}-librosa-feats")
        precompute_features(tiny_corpus.cuts(part), target, librosa)
    stats = compute_feature_stats([tiny_corpus.cuts("train-clean-100-librosa-feats")], librosa)
    stats.write(tiny_corpus.root / "feature_stats_librosa.json")
    exp_dir = tmp_path_factory.mktemp("streaming") / "exp"
    train_tiny(compose_train(exp_dir, *TINY_STREAMING))
    return exp_dir / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="session")
def streaming_tdt_run(
    streaming_run, compose_train, train_tiny, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """`streaming_run` as a token-and-duration transducer (durations 0-4), on the features
    `streaming_run` computed (within the CTC warm-up too: its joiner emits many tokens, with
    all durations): its last checkpoint."""
    exp_dir = tmp_path_factory.mktemp("streaming_tdt") / "exp"
    train_tiny(compose_train(exp_dir, *TINY_STREAMING, "model.joiner.durations=[0,1,2,3,4]"))
    return exp_dir / "checkpoints" / "last.ckpt"

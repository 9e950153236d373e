"""Session fixtures shared by the data, training and export tests.

One tiny synthetic corpus (about 2 minutes of espeak-ng speech in LibriSpeech layout) is
built once per session with its manifests, a 64-piece BPE tokenizer and stored features;
one short training run on it is shared by the slow training and export tests. Tests that
need to damage data work on copies, never on these.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import hydra
import pytest
import torch
from omegaconf import DictConfig

from asr.data.corpus import CorpusDir, prepare_manifests
from asr.data.features import FeatureConfig, precompute_features
from asr.data.tokenizer import Tokenizer, train_tokenizer
from asr.demo.synth import make_demo_corpus
from asr.training.command import CONFIG_DIR

# `make test` runs two pytest-xdist workers (one per core). Each test file goes whole to one
# worker (its module fixtures are built once), and the tests that start several ranks at
# once all go to the same one, one file after another, so that at most one multi-process
# test runs beside one single-process test.
RANK_TESTS = "tests/training/distributed/"
# The inference tests share trained runs (session fixtures, per worker): one scope, so that
# they are trained once.
INFERENCE_TESTS = "tests/inference/"
SHARED_SCOPES = (RANK_TESTS, INFERENCE_TESTS)

if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker, its commands included
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


# The scopes that take longest (minutes each, `make test --durations`), started first so that
# the other scopes fill both workers around them instead of one worker finishing alone with
# a 3-minute recipe test (805 s in all before this order, with the ONNX tests).
LONG_SCOPES_FIRST = (
    RANK_TESTS,
    "tests/test_librispeech_recipe.py",
    INFERENCE_TESTS,
    "tests/gpu_check/test_rehearsal.py",
    "tests/test_demo_ssl_recipe.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collection order, which xdist's scope scheduler follows: `LONG_SCOPES_FIRST` first
    (in that order), the other tests after them as collected."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        found = [i for i, scope in enumerate(LONG_SCOPES_FIRST) if path.startswith(scope)]
        return found[0] if found else len(LONG_SCOPES_FIRST)

    items.sort(key=rank)  # stable: each scope keeps its own order


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduling with a scope per file; the multi-process files are one
    scope, and so are the inference files."""
    from xdist.scheduler import LoadScopeScheduling

    # keep the collection order (`pytest_collection_modifyitems`), not xdist's default of
    # the scopes with most tests first, which started the one-test recipe files last
    config.option.loadscopereorder = False

    class FilesRanksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((scope for scope in SHARED_SCOPES if path.startswith(scope)), path)

    return FilesRanksTogether(config, log)


# ~30 training, ~11 dev and ~14 test utterances of ~3.5 s: built in a few seconds.
TINY_CORPUS = {"train_hours": 0.03, "dev_minutes": 0.5, "test_minutes": 0.8, "seed": 0}
VOCAB_SIZE = 64
TRAIN, DEV, TEST = "train-clean-100", "dev-clean", "test-clean"


TinyCorpus = CorpusDir  # the tiny corpus of the tests: VOCAB_SIZE pieces


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> TinyCorpus:
    corpus = CorpusDir(tmp_path_factory.mktemp("tiny_corpus"), VOCAB_SIZE)
    make_demo_corpus(corpus.root, **TINY_CORPUS, num_jobs=2)
    prepare_manifests(corpus.librispeech, corpus.manifests)
    train_tokenizer(corpus.transcripts(TRAIN).values(), corpus.tokenizer, vocab_size=VOCAB_SIZE)
    return corpus


@pytest.fixture(scope="session")
def tokenizer(tiny_corpus: TinyCorpus) -> Tokenizer:
    return Tokenizer.load(tiny_corpus.tokenizer)


@pytest.fixture(scope="session")
def feature_manifests(tiny_corpus: TinyCorpus) -> dict[str, Path]:
    """Stored features for train and dev under the names the demo presets use: the Kaldi
    front end's (returned: demo_stateless, the AED and pre-training presets), the librosa
    one's (`*-librosa-feats`: demo_streaming) and the librosa_povey one's (experiment=demo)."""
    for frontend in ("librosa", "librosa_povey"):
        for part in (TRAIN, DEV):
            target = tiny_corpus.cuts(f"{part}-{frontend}-feats")
            precompute_features(tiny_corpus.cuts(part), target, FeatureConfig(frontend=frontend))
    return {
        part: precompute_features(tiny_corpus.cuts(part), tiny_corpus.cuts(f"{part}-feats"))
        for part in (TRAIN, DEV)
    }


@pytest.fixture(scope="session")
def demo_feature_manifests(
    tiny_corpus: TinyCorpus, feature_manifests: dict[str, Path]
) -> dict[str, Path]:
    """The stored features experiment=demo trains on (its librosa_povey front end)."""
    return {part: tiny_corpus.cuts(f"{part}-librosa_povey-feats") for part in feature_manifests}


@pytest.fixture
def tiny_transducer_config() -> dict:
    """The config of a tiny Transducer with a CTC head, for `build_model(cfg, vocab_size)`
    (69k parameters at vocabulary size 16)."""
    return {
        "kind": "transducer",
        "encoder": {"input_dim": 80, "d_model": 32, "num_layers": 1, "num_heads": 2},
        "predictor": {"embed_dim": 32, "hidden_dim": 32},
        "joiner": {"joint_dim": 32},
        "ctc_head": True,
    }


@pytest.fixture
def single_thread() -> Iterator[None]:
    """One intra-op thread: the tiny models gain nothing from more, and on a shared 2-core
    machine two threads made training steps 10x slower and erratic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def train_single_threaded(cfg: DictConfig) -> dict[str, float]:
    """`asr.training.train.run(cfg)` on one intra-op thread (see `single_thread`)."""
    from asr.training.train import run

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(cfg)
    finally:
        torch.set_num_threads(before)


def tiny_overrides(corpus: TinyCorpus, exp_dir: Path, kind: str = "transducer") -> list[str]:
    """Hydra overrides: a ~0.4M-parameter Transducer (or, `kind="aed"`, encoder-decoder;
    `kind="ssl"`, a pre-training model) on the tiny corpus, CSV logging only."""
    if kind == "aed":
        model = ["model.decoder.d_model=64", "model.decoder.num_layers=1"]
        model += ["model.decoder.num_heads=2"]
    elif kind == "ssl":  # BEST-RQ's and w2v-BERT's own parts, shrunk
        model = ["model.best_rq.num_codes=64", "model.w2v_bert.code_dim=32"]
        model += ["model.w2v_bert.num_codes=16", "model.loss.num_distractors=10"]
    else:
        model = ["model.predictor.embed_dim=64", "model.predictor.hidden_dim=64"]
        model += ["model.joiner.joint_dim=64"]
    return [
        f"data_dir={corpus.root}",
        f"exp_dir={exp_dir}",
        f"data.tokenizer={corpus.tokenizer}",
        "logger=csv",
        "trainer.accelerator=cpu",
        "trainer.devices=1",
        "trainer.log_every_n_steps=1",
        "model.encoder.d_model=64",
        "model.encoder.num_layers=2",
        "model.encoder.num_heads=2",
        "model.encoder.subsampling_factor=4",
        "model.encoder.subsampling_channels=64",  # the tiny model's, whatever the demo's
        *model,
        "~batches",  # the demo's shipped buckets belong to the demo corpus, not this one
        "data.sampler.max_duration=10",
        "data.sampler.max_cut_duration=10",
        "data.sampler.num_buckets=4",
        "data.num_workers=0",
        "optim.scheduler.warmup_steps=5",
    ]


@pytest.fixture(scope="session")
def train_overrides(
    tiny_corpus: TinyCorpus, feature_manifests: dict[str, Path]
) -> Callable[..., list[str]]:
    """`overrides(exp_dir, kind=...)`: the tiny overrides as a list, for an `asr-train`
    command line (subprocess tests); the stored features that `experiment=demo` reads exist."""

    def overrides(exp_dir: Path, kind: str = "transducer") -> list[str]:
        return tiny_overrides(tiny_corpus, exp_dir, kind)

    return overrides


@pytest.fixture(scope="session")
def compose_train(tiny_corpus: TinyCorpus) -> Callable[..., DictConfig]:
    """`compose(exp_dir, *overrides, kind=...)`: asr/configs/train.yaml with the tiny overrides
    of that model kind, then yours (`experiment=...` among them picks the model group)."""

    def compose(exp_dir: Path, *overrides: str, kind: str = "transducer") -> DictConfig:
        tiny = tiny_overrides(tiny_corpus, exp_dir, kind)
        with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return hydra.compose("train", overrides=[*tiny, *overrides])

    return compose


@dataclass(frozen=True)
class TrainedRun:
    exp_dir: Path
    metrics: dict[str, float]  # what `run` returned
    epochs: int
    overrides: tuple[str, ...]  # after the tiny ones: `compose_train(exp_dir, *overrides)`

    @property
    def checkpoints(self) -> Path:
        return self.exp_dir / "checkpoints"


TRAINED_EPOCHS = 3


@pytest.fixture(scope="session")
def trained_run(
    compose_train: Callable[..., DictConfig],
    feature_manifests: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> TrainedRun:
    """`asr.training.train.run` of experiment=demo, shrunk: 3 epochs (~45 steps), fit + test.

    Without shuffling every epoch sees the same batches in the same order, so the training
    losses of two epochs compare the model alone, not the batches' lengths."""

    exp_dir = tmp_path_factory.mktemp("trained") / "exp"
    overrides = (
        "experiment=demo",
        "~ema",  # the demo's EMA averages over its 7 epochs: after 45 steps, near the init
        f"trainer.max_epochs={TRAINED_EPOCHS}",
        "data.sampler.shuffle=false",
        "optim.lr=3e-3",
    )
    metrics = train_single_threaded(compose_train(exp_dir, *overrides))
    return TrainedRun(exp_dir, metrics, TRAINED_EPOCHS, overrides)


@pytest.fixture(scope="session")
def train_tiny() -> Callable[[DictConfig], dict[str, float]]:
    """`train_single_threaded`, for the tests' own tiny runs."""
    return train_single_threaded

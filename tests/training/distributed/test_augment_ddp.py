"""Training with on-the-fly augmentation (speed, volume, reverberation, noise: data/augment=demo)
on 2 real gloo processes: the ranks hear different augmented audio, an epoch hears other
draws than the one before, and a run killed with -9 mid-epoch and started again with the
same command trains on the same augmented batches as the uninterrupted run, to the same
weights bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from lhotse import CutSet, Recording
from processes import kill_when_checkpointed, records, run, worker

from tests.conftest import DEV, TRAIN

pytestmark = [pytest.mark.slow, pytest.mark.long]
EPOCHS = 2


@pytest.fixture(scope="module")
def noise_manifest(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("augment_noise")
    rng = np.random.default_rng(0)
    paths = []
    for name, seconds in (("hiss", 1.5), ("rumble", 4.0)):
        audio = rng.normal(0, 0.05, int(seconds * 16000))
        if name == "rumble":
            audio = np.cumsum(audio) / 40
        paths.append(root / f"{name}.flac")
        sf.write(paths[-1], (audio / np.abs(audio).max() * 0.3).astype(np.float32), 16000)
    manifest = root / "noise_cuts.jsonl.gz"
    CutSet.from_cuts(Recording.from_file(p).to_cut() for p in paths).to_file(manifest)
    return manifest


def augment_overrides(train_overrides, tiny_corpus, exp_dir: Path, noise: Path) -> list[str]:
    return [
        *train_overrides(exp_dir),
        "experiment=demo",
        "data/augment=demo",
        f"data.augment.noise.cuts=[{noise}]",
        "data.augment.noise.p=0.8",
        "data.augment.reverb.p=0.5",
        "trainer=cpu_ddp",
        "trainer.devices=2",
        f"trainer.max_epochs={EPOCHS}",
        f"data.train_cuts=[{tiny_corpus.cuts(TRAIN)}]",
        f"data.valid_cuts=[{tiny_corpus.cuts(DEV)}]",
        "data.features.source=on_the_fly",
        "checkpoint.every_n_train_steps=2",
        "run_test=false",
    ]


@pytest.fixture(scope="module")
def whole_run(train_overrides, tiny_corpus, noise_manifest, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("augment_ddp")
    overrides = augment_overrides(train_overrides, tiny_corpus, root / "whole", noise_manifest)
    run(worker(root / "whole_record", overrides), root / "whole.log")
    return {"root": root, "overrides": overrides, "records": records(root / "whole_record")}


def test_ranks_and_epochs_hear_different_augmented_audio(whole_run) -> None:
    ranks = whole_run["records"]
    assert len(ranks[0]["steps"]) == len(ranks[1]["steps"]) > 2
    for a, b in zip(ranks[0]["steps"], ranks[1]["steps"], strict=True):
        assert not set(a["cut_ids"]) & set(b["cut_ids"])
        assert a["cut_ids"] or b["cut_ids"]  # an empty batch only beside a rank's last ones
        assert not a["skipped"] and not b["skipped"]
    # the batches with cuts (a rank through its part trains on an empty one)
    features = [s["features"] for rank in ranks for s in rank["steps"] if s["cut_ids"]]
    assert len(set(features)) == len(features)  # no batch heard twice, in either epoch
    assert ranks[0]["digest"] == ranks[1]["digest"]


def test_kill_mid_epoch_then_resume_hears_the_same_augmented_audio(whole_run) -> None:
    root = whole_run["root"]
    whole_exp, killed_exp = str(root / "whole"), str(root / "killed")
    overrides = [o.replace(whole_exp, killed_exp) for o in whole_run["overrides"]]
    command = worker(root / "killed_record", overrides)
    last = root / "killed" / "checkpoints" / "last.ckpt"
    kill_when_checkpointed(command, last, 2, root / "killed.log")
    state = torch.load(last, map_location="cpu", weights_only=False)["AsrDataModule"]
    assert state["batches_done"] > 0 and state["world_size"] == 2, state  # inside an epoch
    run(command, root / "resumed.log")  # the same command again
    resumed = records(root / "killed_record")
    whole = whole_run["records"]
    first = resumed[0]["steps"][0]["step"]
    assert first > 1
    for rank in range(2):
        after = [(s["cut_ids"], s["features"]) for s in whole[rank]["steps"] if s["step"] >= first]
        assert [(s["cut_ids"], s["features"]) for s in resumed[rank]["steps"]] == after
    assert resumed[0]["digest"] == resumed[1]["digest"] == whole[0]["digest"]

"""recipes/demo/augment.sh end to end on a copy of the tiny corpus, but for its `prepare`
stage (run.sh's, tested by `make demo`): the noise corpus, the noisy and reverberant test
sets, a tiny model trained without (for the demo's epochs and for the augmented preset's)
and with augmentation through run.sh's train stage,
both decoded on every test set, and the comparison table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lhotse import load_manifest_lazy

ROOT = Path(__file__).resolve().parents[1]
TINY = [  # every asr-train of the recipe: a tiny transducer on the CPU, 2 epochs
    "logger=csv", "trainer.log_every_n_steps=1", "trainer.max_epochs=2",
    "model.encoder.d_model=64", "model.encoder.num_layers=2", "model.encoder.num_heads=2",
    "model.encoder.subsampling_channels=64", "model.predictor.embed_dim=64",
    "model.predictor.hidden_dim=64", "model.joiner.joint_dim=64", "~batches",
    "data.sampler.max_duration=10", "data.sampler.max_cut_duration=10",
    "data.sampler.num_buckets=4", "data.num_workers=0", "optim.scheduler.warmup_steps=5",
    "model.loss.transducer_start_step=3",
]  # fmt: skip
TESTSETS = ["test-clean", "test-clean-snr10", "test-clean-reverb", "test-clean-reverb-snr10"]


@pytest.mark.slow
@pytest.mark.long
def test_every_stage_after_prepare_runs_and_compares(
    tiny_corpus, demo_feature_manifests, tmp_path
) -> None:
    exp, data = tmp_path / "exp", tmp_path / "data"
    shutil.copytree(tiny_corpus.root, data)  # the noise corpus must not land in the fixture
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "DATA": str(data), "EXP": str(exp), "SNRS": "10", "NOISE_CLIPS": "2",
        "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
    }  # fmt: skip
    tokenizer = f"data.tokenizer={data / 'tokenizer' / tiny_corpus.tokenizer.name}"
    done = subprocess.run(
        ["bash", str(ROOT / "recipes" / "demo" / "augment.sh"), "--stage", "noise", "--",
         *TINY, tokenizer],
        capture_output=True, text=True, env=env, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    for stage in ("noise", "testsets", "train", "decode", "compare"):
        assert f": {stage} (" in done.stdout
    manifests = data / "manifests"
    clean_path = manifests / "librispeech_cuts_test-clean.jsonl.gz"
    clean = {c.id: c for c in load_manifest_lazy(clean_path)}
    for testset in TESTSETS[1:]:
        noisy = list(load_manifest_lazy(manifests / f"librispeech_cuts_{testset}.jsonl.gz"))
        assert [c.id for c in noisy] == list(clean)
        assert noisy[0].supervisions[0].text == clean[noisy[0].id].supervisions[0].text
    augmented = (exp / "augment" / "hydra" / ".hydra" / "config.yaml").read_text()
    assert "noise_cuts_train.jsonl.gz" in augmented and "source: on_the_fly" in augmented
    longer = (exp / "none_12ep" / "hydra" / ".hydra" / "overrides.yaml").read_text()
    assert "trainer.max_epochs=12" in longer  # then the test's own 2 epochs, given after it
    table = json.loads((exp / "compare.json").read_text())
    assert table["testsets"] == TESTSETS
    models = {m["model"]: m for m in table["models"]}
    assert set(models) == {"none", "none_12ep", "augment"}
    for record in models.values():
        assert set(record["wer"]) == set(TESTSETS)
        assert record["wall_seconds"] > 0 and record["training"]["seconds_per_step"] > 0
    assert models["none"]["clean_wer_change"] == 0
    change = models["augment"]["wer"]["test-clean"] - models["none"]["wer"]["test-clean"]
    assert models["augment"]["clean_wer_change"] == pytest.approx(change, abs=1e-3)

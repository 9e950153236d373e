"""recipes/demo/ssl.sh end to end on a copy of the tiny corpus, but for its `prepare` stage
(run.sh's, tested by `make demo`): the unlabelled part, the subset, w2v-BERT pre-training on
both, the encoder export, fine-tuning (experiment=demo_finetune) from scratch and from the
encoder at two learning rates, decoding and the comparison table."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = [  # every asr-train of the recipe: a tiny encoder on the CPU
    "trainer.accelerator=cpu", "trainer.devices=1", "logger=csv", "trainer.log_every_n_steps=1",
    "model.encoder.d_model=64", "model.encoder.num_layers=2", "model.encoder.num_heads=2",
    "data.num_workers=0", "data.sampler.max_duration=10", "data.sampler.max_cut_duration=10",
    "data.sampler.num_buckets=4",
]  # fmt: skip
PRETRAIN = ["model.w2v_bert.code_dim=32", "model.w2v_bert.num_codes=16",
            "model.loss.num_distractors=10",
            "optim.scheduler.warmup_steps=5"]  # fmt: skip
FINETUNE = ["model.predictor.embed_dim=64", "model.predictor.hidden_dim=64",
            "model.joiner.joint_dim=64"]  # fmt: skip
STEPS = 10


@pytest.mark.slow
@pytest.mark.long
def test_every_stage_after_prepare_runs_and_compares(tiny_corpus, feature_manifests, tmp_path):
    exp, data = tmp_path / "exp", tmp_path / "data"
    shutil.copytree(tiny_corpus.root, data)  # the unlabelled part must not land in the fixture
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "DATA": str(data), "EXP": str(exp), "OBJECTIVES": "w2v_bert", "UNLABELLED_HOURS": "0.004",
        "SCRATCH_LRS": "0.0015", "FINETUNE_LRS": "0.0015 0.003", "STEPS": str(STEPS),
        "VAL_EPOCHS": "1", "FRACTION": "0.25", "CTC_STEPS": "2", "FREEZE_STEPS": "3",
        "BATCH_SIZES": "", "SEED": "3", "PRETRAIN_EPOCHS": "2", "PRETRAIN_ARGS": " ".join(PRETRAIN),
        "FINETUNE_ARGS": " ".join([*FINETUNE, f"data.tokenizer={tiny_corpus.tokenizer}"]),
        "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
    }  # fmt: skip
    done = subprocess.run(
        ["bash", str(ROOT / "recipes" / "demo" / "ssl.sh"), "--stage", "unlabelled", "--",
         *SHARED],
        capture_output=True, text=True, env=env, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    for stage in ("unlabelled", "subset", "pretrain", "encoders", "finetune", "decode", "compare"):
        assert f": {stage} (" in done.stdout
    unlabelled = data / "manifests" / "librispeech_cuts_train-unlabelled-feats.jsonl.gz"
    assert unlabelled.is_file()
    pretrain_overrides = exp / "pretrain_w2v_bert" / "hydra" / ".hydra" / "overrides.yaml"
    assert str(unlabelled) in pretrain_overrides.read_text()
    table = json.loads((exp / "compare-seed3.json").read_text())
    assert table["subset"]["seconds"] >= 0.25 * table["subset"]["of_seconds"] - 0.1
    assert table["protocol"] | {"subset": None} == {
        "subset": None, "steps": STEPS, "seed": 3, "ctc_only_steps": 2,
        "warmup_steps": STEPS // 10, "checkpoint": "best.ckpt (lowest dev WER)",
    }  # fmt: skip
    runs = {r["run"]: r for r in table["finetuning"]}
    assert set(runs) == {
        "scratch_lr0.0015-seed3", "w2v_bert_lr0.0015-seed3", "w2v_bert_lr0.003-seed3"
    }  # fmt: skip
    assert table["baseline"] == "scratch_lr0.0015-seed3"
    by_dev = min(("w2v_bert_lr0.0015-seed3", "w2v_bert_lr0.003-seed3"),
                 key=lambda name: runs[name]["best_dev_wer"])  # fmt: skip
    assert table["chosen"] == {"scratch": "scratch_lr0.0015-seed3", "w2v_bert": by_dev}
    for record in runs.values():
        assert record["optimizer_steps"] == STEPS
        assert record["test_wer"] >= 0 and record["best_dev_wer"] >= 0
        assert record["training"]["audio_seconds_per_second"] > 0
    chosen = runs[by_dev]
    assert chosen["init"] == "w2v_bert" and math.isfinite(chosen["relative_cut"])
    overrides = (exp / f"finetune_{by_dev}" / "hydra" / ".hydra" / "overrides.yaml").read_text()
    for override in (f"init_encoder_from={exp}/pretrain_w2v_bert/encoder.pt",
                     "freeze_encoder_steps=3", "encoder_lr_scale=0.5"):  # fmt: skip
        assert override in overrides
    (pretraining,) = table["pretraining"]
    assert pretraining["objective"] == "w2v_bert" and pretraining["wall_seconds"] > 0
    assert 0 < pretraining["code_use"]["mean"] <= 1
    assert math.isfinite(pretraining["best_dev_loss"])
    assert pretraining["training"]["audio_seconds_per_second"] > 0
    curve = pretraining["curves"]["training"]
    assert curve and [p["step"] for p in curve] == sorted(p["step"] for p in curve)
    assert all(math.isfinite(p["train/loss"]) for p in curve)
    assert len(pretraining["curves"]["dev"]) == 2  # one validation per epoch

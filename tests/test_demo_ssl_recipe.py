"""recipes/demo/ssl.sh end to end on the tiny corpus, but for its `prepare` stage (run.sh's,
tested by `make demo`): the subset, w2v-BERT pre-training, the encoder export, fine-tuning
from scratch and from the encoder, decoding and the comparison table."""

from __future__ import annotations

import json
import math
import os
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
            "model.loss.num_distractors=10", "trainer.max_epochs=2",
            "optim.scheduler.warmup_steps=5"]  # fmt: skip
FINETUNE = ["model.predictor.embed_dim=64", "model.predictor.hidden_dim=64",
            "model.joiner.joint_dim=64"]  # fmt: skip
STEPS = 10


@pytest.mark.slow
@pytest.mark.long
def test_every_stage_after_prepare_runs_and_compares(tiny_corpus, feature_manifests, tmp_path):
    exp = tmp_path / "exp"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "DATA": str(tiny_corpus.root), "EXP": str(exp), "OBJECTIVES": "w2v_bert",
        "SCRATCH_LRS": "0.0015", "STEPS": str(STEPS), "VAL_EPOCHS": "1", "FRACTION": "0.25",
        "CTC_STEPS": "2", "BATCH_SIZES": "", "SEED": "3",
        "PRETRAIN_ARGS": " ".join(PRETRAIN),
        "FINETUNE_ARGS": " ".join([*FINETUNE, f"data.tokenizer={tiny_corpus.tokenizer}"]),
        "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
    }  # fmt: skip
    done = subprocess.run(
        ["bash", str(ROOT / "recipes" / "demo" / "ssl.sh"), "--stage", "subset", "--", *SHARED],
        capture_output=True, text=True, env=env, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    for stage in ("subset", "pretrain", "encoders", "finetune", "decode", "compare"):
        assert f": {stage} (" in done.stdout
    table = json.loads((exp / "compare-seed3.json").read_text())
    assert table["subset"]["seconds"] >= 0.25 * table["subset"]["of_seconds"] - 0.1
    assert table["protocol"] | {"subset": None} == {
        "subset": None, "steps": STEPS, "seed": 3, "ctc_only_steps": 2,
        "warmup_steps": STEPS // 10, "checkpoint": "best.ckpt (lowest dev WER)",
    }  # fmt: skip
    runs = {r["run"]: r for r in table["finetuning"]}
    assert set(runs) == {"scratch_lr0.0015-seed3", "w2v_bert-seed3"}
    assert table["baseline"] == "scratch_lr0.0015-seed3"
    for record in runs.values():
        assert record["optimizer_steps"] == STEPS
        assert record["test_wer"] >= 0 and record["best_dev_wer"] >= 0
        assert record["training"]["audio_seconds_per_second"] > 0
    pre_trained = runs["w2v_bert-seed3"]
    assert pre_trained["init"] == "w2v_bert" and math.isfinite(pre_trained["relative_cut"])
    overrides = exp / "finetune_w2v_bert-seed3" / "hydra" / ".hydra" / "overrides.yaml"
    assert f"init_encoder_from={exp}/pretrain_w2v_bert/encoder.pt" in overrides.read_text()
    (pretraining,) = table["pretraining"]
    assert pretraining["objective"] == "w2v_bert" and pretraining["wall_seconds"] > 0
    assert 0 < pretraining["code_use"]["mean"] <= 1
    assert math.isfinite(pretraining["best_dev_loss"])
    assert pretraining["training"]["audio_seconds_per_second"] > 0

"""Pre-training through asr-train: both objectives on the tiny corpus, audio alone."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from lhotse import CutSet
from omegaconf import OmegaConf

from asr.data.dataset import AsrDataset
from asr.data.features import FeatureConfig
from asr.inference.bundle import (
    BEST_CHECKPOINT,
    BUNDLE_KEY,
    CHECKPOINT_DIR,
    ENCODER_FILE,
    LAST_CHECKPOINT,
    export_bundle,
    export_encoder,
)
from asr.models.build import model_config
from asr.models.conformer import ConformerEncoder
from asr.training.encoder_init import load_encoder
from asr.training.train import run


def test_audio_alone_keeps_cuts_without_transcripts(tiny_corpus) -> None:
    cuts = CutSet.from_file(tiny_corpus.cuts("train-clean-100")).subset(first=4).to_eager()
    silent = [cut.map_supervisions(lambda s: s.transform_text(lambda _: "")) for cut in cuts]
    batch = AsrDataset(None, FeatureConfig())[CutSet.from_cuts(silent)]
    assert len(batch) == 4 and batch.skipped == {}
    assert batch.token_lens.tolist() == [0, 0, 0, 0]


def _rows(exp_dir: Path) -> list[dict[str, str]]:
    with open(exp_dir / "csv" / "version_0" / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("objective", "terms"),
    [
        ("best_rq", ["mlm", "mlm_accuracy", "code_use"]),
        ("w2v_bert", ["contrastive", "diversity", "mlm", "contrastive_accuracy", "perplexity"]),
    ],
)
def test_pre_training_runs_validates_by_loss_and_keeps_the_best(
    compose_train,
    feature_manifests,  # the presets read stored features
    tmp_path: Path,
    single_thread,
    objective: str,
    terms: list[str],
) -> None:
    exp_dir = tmp_path / "exp"
    cfg = compose_train(
        exp_dir,
        f"experiment=demo_ssl_{objective}",
        "trainer.max_epochs=2",
        "run_test=false",
        kind="ssl",
    )
    metrics = run(cfg)
    assert "val/wer" not in metrics and torch.isfinite(torch.tensor(metrics["val/loss"]))
    rows = _rows(exp_dir)
    logged = set().union(*(row for row in rows))
    for term in terms:
        assert f"train/{term}" in logged
    losses = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(losses) == 2
    checkpoints = exp_dir / CHECKPOINT_DIR
    best = torch.load(checkpoints / BEST_CHECKPOINT, map_location="cpu", weights_only=False)
    epochs_best = best["epoch"]
    assert losses[epochs_best] == min(losses)  # best.ckpt is the lower validation loss
    last = torch.load(checkpoints / LAST_CHECKPOINT, map_location="cpu", weights_only=False)
    assert last[BUNDLE_KEY]["tokenizer"] is None and last[BUNDLE_KEY]["model"]["kind"] == "ssl"
    if objective == "best_rq":  # the frozen quantizer is saved with the model, unchanged
        assert "model.quantizer.projection" in last["state_dict"]
    # the encoder export loads exactly into a supervised model's encoder
    export = export_encoder([checkpoints / BEST_CHECKPOINT], exp_dir / ENCODER_FILE)
    encoder = ConformerEncoder(
        model_config(OmegaConf.to_container(cfg.model, resolve=True)).encoder
    )
    load_encoder(encoder, export)
    for name, value in encoder.state_dict().items():
        assert torch.equal(value, best["state_dict"][f"model.encoder.{name}"])
    with pytest.raises(ValueError, match="--encoder-only"):
        export_bundle([checkpoints / BEST_CHECKPOINT], exp_dir / "model.bundle.pt")

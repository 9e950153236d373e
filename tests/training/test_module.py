from dataclasses import replace

import lightning as L
import pytest
import torch
from lhotse import CutSet

from asr.data.corpus import load_cuts
from asr.data.dataset import AsrDataset
from asr.decoding.search import decode
from asr.inference.bundle import BUNDLE_KEY
from asr.metrics import corpus_errors
from asr.models.build import build_model
from asr.training.module import AsrLitModule
from asr.training.objective import TransducerLossConfig, TransducerObjective


@pytest.fixture
def module(tokenizer, single_thread, tiny_transducer_config) -> AsrLitModule:
    torch.manual_seed(0)
    return AsrLitModule(
        build_model(tiny_transducer_config, tokenizer.vocab_size),
        TransducerObjective(TransducerLossConfig(ctc_weight=0.3)),
        tokenizer,
        optim={"lr": 1e-3, "scheduler": {"kind": "noam", "warmup_steps": 10}},
        bundle_meta={"model": tiny_transducer_config, "features": {}},
    )


@pytest.fixture(scope="module")
def dev_batches(tiny_corpus, tokenizer) -> list:
    cuts = load_cuts(tiny_corpus.cuts("dev-clean")).to_eager()
    dataset = AsrDataset(tokenizer)
    return [dataset[cuts.subset(first=3)], dataset[CutSet.from_cuts(list(cuts)[3:8])]]


def _validate(module: AsrLitModule, batches: list) -> dict[str, float]:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=lambda b: b)
    trainer.validate(module, dataloaders=loader, verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def test_validation_wer_is_the_corpus_wer(
    module: AsrLitModule, dev_batches: list, tokenizer
) -> None:
    model = module.model.eval()
    refs = [text for batch in dev_batches for text in batch.texts]
    hyps = [
        tokenizer.decode(ids)
        for batch in dev_batches
        for ids in decode(model, *model.encode(batch.features, batch.feature_lens))
    ]
    expected = 100 * corpus_errors(refs, hyps).wer  # errors summed over batches, not averaged
    metrics = _validate(module, dev_batches)
    assert metrics["val/wer"] == pytest.approx(expected)
    assert metrics["val/wer"] > 0  # an untrained model makes errors


def test_validation_without_usable_cuts_reports_no_perfect_wer(
    module: AsrLitModule, tiny_corpus, tokenizer
) -> None:
    # Every cut is dropped by the dataset (e.g. all transcripts too long for the encoder):
    # nothing was recognized, so val/wer must not claim 0 % (best.ckpt minimizes it).
    cuts = load_cuts(tiny_corpus.cuts("dev-clean")).to_eager()
    empty = AsrDataset(tokenizer)[
        CutSet.from_cuts(
            replace(c, supervisions=[replace(c.supervisions[0], text="")])
            for c in cuts.subset(first=2)
        )
    ]
    assert len(empty) == 0
    metrics = _validate(module, [empty])
    assert metrics.get("val/wer", float("inf")) != 0.0


def test_checkpoint_carries_the_bundle(
    module: AsrLitModule, tokenizer, tiny_transducer_config
) -> None:
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    bundle = checkpoint[BUNDLE_KEY]
    assert bundle["model"] == tiny_transducer_config and bundle["features"] == {}
    assert bundle["tokenizer"] == tokenizer.to_bytes()


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fused_adamw_is_clipped_in_every_precision_without_a_loss_scaler(
    module: AsrLitModule, precision: str
) -> None:
    # Lightning's mixed-precision plugin refuses to clip for fused optimizers by itself
    module.trainer = L.Trainer(accelerator="cpu", precision=precision, logger=False)
    optimizer = module.configure_optimizers()["optimizer"]
    assert optimizer.defaults["fused"]
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.full_like(p, 3.0)
    module.configure_gradient_clipping(optimizer, 0.5, "norm")
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
    assert norm.item() == pytest.approx(0.5, rel=1e-4)
    module.configure_gradient_clipping(optimizer, 1e-3, "value")
    assert all(p.grad.abs().max() <= 1e-3 for p in params)

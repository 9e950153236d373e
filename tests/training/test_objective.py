"""Objectives from `model.loss` keys: which one per model kind, key checks, how parts add up."""

import pytest
import torch
from omegaconf import OmegaConf

from asr.data.batch import Batch
from asr.losses.cross_entropy import label_smoothed_cross_entropy
from asr.losses.ctc import ctc_loss
from asr.losses.transducer import samplewise_transducer_loss
from asr.models.aed import AedOutput
from asr.models.build import build_model
from asr.models.transducer import TransducerOutput
from asr.training import objective as objective_module
from asr.training.config_files import CONFIG_DIR
from asr.training.objective import (
    AedLossConfig,
    AedObjective,
    TransducerObjective,
    build_objective,
)


def test_each_model_kind_gets_its_objective_and_unknown_keys_are_named() -> None:
    assert isinstance(build_objective("transducer", {"ctc_weight": 0.3}), TransducerObjective)
    aed = build_objective("aed", {"label_smoothing": 0.2, "ctc_weight": 0.3})
    assert isinstance(aed, AedObjective) and aed.config.label_smoothing == 0.2
    with pytest.raises(
        ValueError, match=r"model.loss.transducer_start_step; valid keys of model.loss: \['cross_en"
    ):
        build_objective("aed", {"transducer_start_step": 5})
    with pytest.raises(ValueError, match=r"unknown config key model.loss.label_smoothing"):
        build_objective("transducer", {"label_smoothing": 0.1})
    with pytest.raises(ValueError, match=r"^model.loss.ctc_weight must be >= 0, got -0.1$"):
        build_objective("aed", {"ctc_weight": -0.1})
    with pytest.raises(ValueError, match=r"^model.loss.ctc_weight must be >= 0, got -0.1$"):
        build_objective("transducer", {"ctc_weight": -0.1})
    with pytest.raises(ValueError, match=r"^model.loss.cross_entropy_weight must be > 0, got 0.0$"):
        build_objective("aed", {"cross_entropy_weight": 0.0})
    with pytest.raises(ValueError, match=r"model.loss.lattice='cuda' is unknown"):
        build_objective("transducer", {"lattice": "cuda"})
    with pytest.raises(ValueError, match=r"\['lattice'\] apply only to kind=samplewise"):
        build_objective("transducer", {"kind": "batched", "lattice": "triton"})
    batched = build_objective("transducer", {"kind": "batched", "logits_dtype": "float32"})
    assert batched.config.loss_options() == {"logits_dtype": torch.float32}  # both kinds


def test_aed_loss_is_the_weighted_sum_of_cross_entropy_and_ctc() -> None:
    model, batch = _tiny_model_and_batch(
        "aed", decoder={"d_model": 32, "num_layers": 1, "num_heads": 2, "dropout": 0.0}
    )
    weights = {"cross_entropy_weight": 0.75, "ctc_weight": 0.25}
    losses = build_objective("aed", {"label_smoothing": 0.1, **weights})(model, batch, 0)
    out = model(batch.features, batch.feature_lens, batch.tokens, batch.token_lens)
    assert out.ctc_log_probs is None  # only when asked for
    ce = label_smoothed_cross_entropy(out.logits, out.targets, label_smoothing=0.1)
    enc, enc_lens = out.encoder_out, out.encoder_lens
    ctc = ctc_loss(model.ctc_log_probs(enc), enc_lens, batch.tokens, batch.token_lens)
    torch.testing.assert_close(losses["cross_entropy"], ce)
    torch.testing.assert_close(losses["ctc"], ctc)
    torch.testing.assert_close(losses["loss"], 0.75 * ce + 0.25 * ctc)
    without_ctc = build_objective("aed", {"ctc_weight": 0.0})(model, batch, 0)
    assert set(without_ctc) == {"loss", "cross_entropy"}
    torch.testing.assert_close(without_ctc["loss"], 0.7 * ce)  # the default weight


def test_ctc_weight_is_the_ctc_terms_weight_for_both_model_kinds(monkeypatch) -> None:
    """Fixed terms (cross-entropy 2, CTC 3, transducer 4): each loss is the weighted sum
    of its terms, and ctc_weight takes nothing away from the other term (the formula of
    earlier versions, (1 - w) x cross-entropy + w x CTC, gives 0.5 x 2 + 0.5 x 3 = 2.5 and
    refused w = 1.5)."""
    fixed = {"ce": torch.tensor(2.0), "ctc": torch.tensor(3.0), "transducer": torch.tensor(4.0)}
    monkeypatch.setattr(objective_module, "ctc_loss", lambda *args, **kw: fixed["ctc"])
    monkeypatch.setattr(
        objective_module, "label_smoothed_cross_entropy", lambda *args, **kw: fixed["ce"]
    )
    batch = Batch(
        features=torch.zeros(1, 4, 2), feature_lens=torch.tensor([4]),
        tokens=torch.tensor([[5]]), token_lens=torch.tensor([1]), cut_ids=["a"], texts=[""],
    )  # fmt: skip
    anything = torch.zeros(1, 1, 1)
    lens = torch.tensor([1])

    aed = build_objective("aed", {"cross_entropy_weight": 1.0, "ctc_weight": 0.5})
    out = AedOutput(anything, lens, anything, anything, ctc_log_probs=anything)
    assert aed.losses(out, batch, blank=0)["loss"].item() == 1.0 * 2.0 + 0.5 * 3.0 == 3.5
    aed = build_objective("aed", {"cross_entropy_weight": 0.25, "ctc_weight": 1.5})
    assert aed.losses(out, batch, blank=0)["loss"].item() == 0.25 * 2.0 + 1.5 * 3.0 == 5.0
    without_ctc = AedOutput(anything, lens, anything, anything)
    assert aed.losses(without_ctc, batch, blank=0)["loss"].item() == 0.25 * 2.0

    transducer = build_objective("transducer", {"ctc_weight": 0.5})
    transducer._loss_fn = lambda *args, **kw: fixed["transducer"]
    out = TransducerOutput(anything, lens, predictor_out=anything, ctc_log_probs=anything)
    losses = transducer.losses(out, torch.nn.Identity(), batch, blank=0)
    assert losses["loss"].item() == 4.0 + 0.5 * 3.0 == 5.5
    transducer = build_objective("transducer", {"ctc_weight": 1.5})
    transducer._loss_fn = lambda *args, **kw: fixed["transducer"]
    losses = transducer.losses(out, torch.nn.Identity(), batch, blank=0)
    assert losses["loss"].item() == 4.0 + 1.5 * 3.0 == 8.5


def test_shipped_aed_weights_are_those_of_the_old_formula_to_the_bit() -> None:
    """model/aed.yaml writes cross_entropy_weight 1 - ctc_weight as a literal: the same
    float, so the loss is bit for bit that of earlier versions, (1 - w) x CE + w x CTC."""
    shipped = OmegaConf.load(CONFIG_DIR / "model" / "aed.yaml").loss
    w = shipped.ctc_weight
    assert shipped.cross_entropy_weight == 1 - w
    assert AedLossConfig().cross_entropy_weight == 1 - AedLossConfig().ctc_weight
    ce, ctc = torch.rand(100, dtype=torch.float32) * 50, torch.rand(100) * 80
    assert torch.equal(shipped.cross_entropy_weight * ce + w * ctc, (1 - w) * ce + w * ctc)


def test_transducer_loss_comes_from_the_models_forward_output() -> None:
    model, batch = _tiny_model_and_batch(
        "transducer",
        predictor={"embed_dim": 16, "hidden_dim": 16, "dropout": 0.0},
        joiner={"joint_dim": 16},
    )
    outputs = []
    model.register_forward_hook(lambda module, args, out: outputs.append(out))
    objective = build_objective("transducer", {"ctc_weight": 0.25, "transducer_start_step": 3})
    losses = objective(model, batch, step=3)
    (out,) = outputs  # training goes through Transducer.forward, once
    rnnt = samplewise_transducer_loss(
        model.joiner, out.encoder_out, out.predictor_out, batch.tokens, out.encoder_lens,
        batch.token_lens, blank=model.blank_id,
    )  # fmt: skip
    ctc = ctc_loss(out.ctc_log_probs, out.encoder_lens, batch.tokens, batch.token_lens)
    torch.testing.assert_close(losses["transducer"], rnnt)
    torch.testing.assert_close(losses["loss"], rnnt + 0.25 * ctc)
    warm_up = objective(model, batch, step=2)  # CTC alone: the predictor does not run
    assert outputs[-1].predictor_out is None and set(warm_up) == {"ctc", "loss"}
    torch.testing.assert_close(warm_up["loss"], ctc)


def _tiny_model_and_batch(kind: str, **parts: dict) -> tuple[torch.nn.Module, Batch]:
    """A one-layer model of `kind` with a CTC head (float64, no dropout) and a batch of two."""
    torch.manual_seed(0)
    encoder = {"input_dim": 20, "d_model": 32, "num_layers": 1, "num_heads": 2}
    encoder |= {"conv_kernel_size": 7, "dropout": 0.0}
    model = build_model({"kind": kind, "encoder": encoder, "ctc_head": True, **parts}, 30)
    batch = Batch(
        features=torch.randn(2, 80, 20, dtype=torch.double),
        feature_lens=torch.tensor([80, 60]),
        tokens=torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]]),
        token_lens=torch.tensor([4, 2]),
        cut_ids=["a", "b"],
        texts=["", ""],
    )
    return model.double(), batch

"""Objectives from `model.loss` keys: which one per model kind, key checks, how parts add up."""

import pytest
import torch

from asr.data.batch import Batch
from asr.losses.cross_entropy import label_smoothed_cross_entropy
from asr.losses.ctc import ctc_loss
from asr.losses.transducer import samplewise_transducer_loss
from asr.models.build import build_model
from asr.training.objective import AedObjective, TransducerObjective, build_objective


def test_each_model_kind_gets_its_objective_and_unknown_keys_are_named() -> None:
    assert isinstance(build_objective("transducer", {"ctc_weight": 0.3}), TransducerObjective)
    aed = build_objective("aed", {"label_smoothing": 0.2, "ctc_weight": 0.3})
    assert isinstance(aed, AedObjective) and aed.config.label_smoothing == 0.2
    with pytest.raises(
        ValueError, match=r"model.loss.transducer_start_step; valid keys of model.loss: \['ctc_w"
    ):
        build_objective("aed", {"transducer_start_step": 5})
    with pytest.raises(ValueError, match=r"unknown config key model.loss.label_smoothing"):
        build_objective("transducer", {"label_smoothing": 0.1})
    with pytest.raises(ValueError, match="ctc_weight must be in"):
        build_objective("aed", {"ctc_weight": 1.0})
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
    losses = build_objective("aed", {"label_smoothing": 0.1, "ctc_weight": 0.25})(model, batch, 0)
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

"""The GPU check's `aed` section on the CPU: EOS suppression fixes the decoded lengths and
the deep preset matches the flash one but for the layer split (the section's whole run:
test_rehearsal.py)."""

import io

import pytest
import torch
from omegaconf import OmegaConf

from asr.decoding.aed import greedy_search, max_output_lengths
from asr.gpu_check.aed import GPU_CASE, Pass, check_counts
from asr.gpu_check.random_models import (
    TOKENS_PER_SECOND,
    batches,
    eos_suppressed,
    utterance_features,
)
from asr.gpu_check.report import Report
from asr.models.aed import EncoderDecoder
from asr.models.build import build_model, count_parameters
from asr.training.oomptimizer import compose_config


def eager_to_stop_aed(seed: int) -> EncoderDecoder:
    """A tiny random AED whose EOS logit dominates: unsuppressed, it stops at once."""
    torch.manual_seed(seed)
    cfg = {
        "kind": "aed",
        "encoder": {"input_dim": 20, "d_model": 32, "num_layers": 1, "num_heads": 2}
        | {"conv_kernel_size": 7, "dropout": 0.0},
        "decoder": {"d_model": 32, "num_layers": 2, "num_heads": 4, "dropout": 0.0},
    }
    model = build_model(cfg, 24).eval()
    with torch.no_grad():
        model.decoder.output_bias[model.eos_id] = 50.0
    return model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_eos_suppressed_decodes_every_utterance_to_its_length_limit(seed: int) -> None:
    model = eager_to_stop_aed(seed)
    feats = torch.randn(3, 260, 20)
    lens = torch.tensor([260, 130, 47])
    with torch.inference_mode():
        encoder_out, encoder_lens = model.encode(feats, lens)
    limits = max_output_lengths(encoder_lens, model.frame_seconds, TOKENS_PER_SECOND).tolist()
    assert limits == [10, 6, 2]  # 65, 33, 12 frames of 40 ms: ceil(9.88), ceil(5.016), ceil(1.824)
    assert greedy_search(model, encoder_out, encoder_lens, TOKENS_PER_SECOND) == [[], [], []]
    with eos_suppressed(model):
        ids = greedy_search(model, encoder_out, encoder_lens, TOKENS_PER_SECOND)
    assert [len(i) for i in ids] == limits
    assert model.decoder.output_bias[model.eos_id].item() == 50.0  # restored


def test_utterances_spread_evenly_over_the_durations_and_are_seeded() -> None:
    feats = utterance_features(GPU_CASE, 80)
    assert [f.shape[0] for f in feats] == list(range(500, 2001, 100))  # 5, 6, ..., 20 s
    assert all(f.shape[1] == 80 for f in feats)
    again = utterance_features(GPU_CASE, 80)
    assert all(torch.equal(a, b) for a, b in zip(feats, again, strict=True))


def test_batches_pad_consecutive_utterances() -> None:
    feats = [torch.ones(n, 2) for n in (3, 5, 4)]
    (x1, l1), (x2, l2) = batches(feats, 2, "cpu")
    assert x1.shape == (2, 5, 2) and l1.tolist() == [3, 5]
    assert x2.shape == (1, 4, 2) and l2.tolist() == [4]
    assert x1[0, 3:].abs().sum() == 0  # padding is zero


def test_a_wrong_token_count_is_a_failure_naming_model_and_utterance() -> None:
    report = Report(io.StringIO())
    good = Pass(0.1, 0.2, tokens=[3, 5], expected=[3, 5], finite=True)
    check_counts(report, "flash", 1, [good])
    assert report.failures == []
    check_counts(report, "deep", 16, [good, Pass(0.1, 0.2, [3, 4], [3, 5], finite=True)])
    assert report.failures == ["deep model, batch 16: utterance 1: 4 tokens, expected 5"]


def test_deep_preset_differs_from_flash_only_in_the_layer_split() -> None:
    flash = compose_config(["experiment=librispeech_aed_flash"])
    deep = compose_config(["experiment=librispeech_aed_deep"])
    for key in ("data", "trainer", "optim"):
        assert OmegaConf.to_container(deep[key]) == OmegaConf.to_container(flash[key]), key
    deep_model = OmegaConf.to_container(deep.model, resolve=True)
    flash_model = OmegaConf.to_container(flash.model, resolve=True)
    with torch.device("meta"):
        deep_params = count_parameters(build_model(deep_model, 1024))
        flash_params = count_parameters(build_model(flash_model, 1024))
    assert abs(deep_params / flash_params - 1) < 0.05
    assert (deep_params, flash_params) == (181_764_608, 184_138_752)  # the preset's comment
    assert deep_model["encoder"]["num_layers"] < flash_model["encoder"]["num_layers"]
    assert deep_model["decoder"]["num_layers"] > flash_model["decoder"]["num_layers"]
    for part in ("encoder", "decoder"):
        deep_model[part]["num_layers"] = flash_model[part]["num_layers"]
    assert deep_model == flash_model

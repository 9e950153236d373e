"""Fine-tuning from a pre-trained encoder: exact loading, one-line errors naming the keys,
and an encoder held still through its parameter groups."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asr.config_keys import ConfigError
from asr.errors import InputFault
from asr.models.build import build_model
from asr.models.conformer import ConformerConfig, StreamingConfig
from asr.models.ssl import SslConfig, build_ssl_model
from asr.training.encoder_init import (
    causal_kernel,
    encoder_group_ids,
    hold_encoder,
    load_encoder,
    load_model_weights,
)
from asr.training.optimizer import OptimConfig, build_optimizer
from asr.training.schedules import SchedulerConfig, build_scheduler

ENCODER = ConformerConfig(input_dim=16, d_model=32, num_layers=2, num_heads=2, conv_kernel_size=5)


def _transducer(encoder: ConformerConfig = ENCODER, durations=None):
    config = {
        "kind": "transducer",
        "encoder": vars(encoder),
        "predictor": {"embed_dim": 16, "hidden_dim": 16},
        "joiner": {"joint_dim": 16, "durations": durations},
    }
    return build_model(config, vocab_size=20)


def _checkpoint(tmp_path: Path) -> tuple[Path, dict]:
    torch.manual_seed(1)
    pretrained = build_ssl_model(SslConfig(objective="best_rq", encoder=ENCODER))
    path = tmp_path / "pretrain.ckpt"
    state = {f"model.{k}": v for k, v in pretrained.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 3}, path)
    return path, pretrained.encoder.state_dict()


def test_the_encoder_loads_exactly_from_a_pre_training_checkpoint_or_an_export(tmp_path) -> None:
    path, expected = _checkpoint(tmp_path)
    model = _transducer()
    assert load_encoder(model.encoder, path) == len(expected)
    for name, value in model.encoder.state_dict().items():
        assert torch.equal(value, expected[name])
    export = tmp_path / "encoder.pt"
    torch.save({"encoder": expected}, export)
    other = _transducer()
    load_encoder(other.encoder, export)
    assert all(torch.equal(v, expected[k]) for k, v in other.encoder.state_dict().items())


def test_a_mismatch_or_a_bad_file_fails_in_one_line_naming_it(tmp_path) -> None:
    path, _ = _checkpoint(tmp_path)
    wider = _transducer(ConformerConfig(**{**vars(ENCODER), "d_model": 64}))
    with pytest.raises(
        ConfigError, match=r"does not fit model\.encoder: other shapes for .*and \d+ more"
    ):
        load_encoder(wider.encoder, path)
    deeper = _transducer(ConformerConfig(**{**vars(ENCODER), "num_layers": 3}))
    with pytest.raises(ConfigError, match=r"missing layers\.2\."):
        load_encoder(deeper.encoder, path)
    with pytest.raises(InputFault, match="no such file"):
        load_encoder(deeper.encoder, tmp_path / "nothing.ckpt")
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(InputFault, match=r"cut\.ckpt: not a checkpoint"):
        load_encoder(deeper.encoder, cut)


def test_held_encoder_groups_leave_the_encoder_bitwise_unchanged(tmp_path) -> None:
    torch.manual_seed(0)
    model = _transducer()
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2), own_groups=model.encoder)
    groups = encoder_group_ids(optimizer, model.encoder)
    assert groups == [0, 1] and len(optimizer.param_groups) == 4
    start = {k: v.clone() for k, v in model.state_dict().items()}
    for step in range(3):
        optimizer.zero_grad()
        sum((p * torch.randn_like(p)).sum() for p in model.parameters()).backward()
        for group in optimizer.param_groups:
            group["lr"] = 1e-2  # what the schedule sets each step
        if step < 2:
            hold_encoder(optimizer, groups)
        optimizer.step()
        if step < 2:
            encoder = model.encoder.state_dict()
            assert all(torch.equal(v, start[f"encoder.{k}"]) for k, v in encoder.items())
            assert not torch.equal(model.joiner.output.weight, start["joiner.output.weight"])
    changed = [
        k
        for k, v in model.encoder.state_dict().items()
        if not torch.equal(v, start[f"encoder.{k}"])
    ]
    assert changed  # after the held steps the encoder trains
    # without own groups: the same two groups as ever
    assert len(build_optimizer(model, OptimConfig(lr=1e-2)).param_groups) == 2


def test_encoder_lr_scale_trains_the_encoder_at_that_share_of_the_scheduled_rate() -> None:
    torch.manual_seed(0)
    model = _transducer()
    config = OptimConfig(lr=0.1, kind="sgd", momentum=0.0, weight_decay=0.0)
    optimizer = build_optimizer(model, config, own_groups=model.encoder, own_lr_scale=0.25)
    scheduler = build_scheduler(
        optimizer, SchedulerConfig(kind="warmup_cosine", warmup_steps=4), total_steps=10
    )
    encoder_groups = encoder_group_ids(optimizer, model.encoder)
    for _ in range(3):  # through the warm-up: the schedule scales both rates alike
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        optimizer.zero_grad()
        sum((p * torch.randn_like(p)).sum() for p in model.parameters()).backward()
        rates = [group["lr"] for group in optimizer.param_groups]
        optimizer.step()
        scheduler.step()
        head = max(rates)
        assert head > 0 and all(rates[i] == pytest.approx(0.25 * head) for i in encoder_groups)
        for name, p in model.named_parameters():  # SGD: the step is rate x gradient
            rate = 0.25 * head if name.startswith("encoder.") else head
            torch.testing.assert_close(before[name] - p.detach(), rate * p.grad)
    with pytest.raises(ConfigError, match="encoder_lr_scale"):
        build_optimizer(model, config, own_groups=model.encoder, own_lr_scale=-1.0)


STREAMING_ENCODER = ConformerConfig(
    **{**vars(ENCODER), "feature_stats": "stats", "streaming": StreamingConfig((2, -1), (4,))}
)


def _bundle(tmp_path: Path, model) -> Path:
    """`model` saved as a bundle holds it (format, config, weights)."""
    path = tmp_path / "model.bundle.pt"
    config = {"encoder": {"streaming": None}}
    if hasattr(model, "joiner"):
        config["joiner"] = {"durations": model.durations}
    torch.save({"format": "asr-bundle-1", "model": config, "state_dict": model.state_dict()}, path)
    return path


def test_causal_kernels_keep_past_offsets_and_fold_the_future_into_the_present() -> None:
    symmetric = torch.arange(1.0, 6.0).view(1, 1, 5)  # offsets -2..+2: 1 2 3 4 5
    assert causal_kernel(symmetric, "truncate").flatten().tolist() == [0, 0, 1, 2, 3]
    assert causal_kernel(symmetric, "fold").flatten().tolist() == [0, 0, 1, 2, 12]
    assert causal_kernel(symmetric, "mirror").flatten().tolist() == [0, 0, 6, 6, 3]
    assert causal_kernel(symmetric, "as_is").flatten().tolist() == [1, 2, 3, 4, 5]
    constant = torch.ones(1, 1, 9)
    ours = torch.nn.functional.conv1d(constant, causal_kernel(symmetric, "fold"))
    theirs = torch.nn.functional.conv1d(constant, symmetric)
    torch.testing.assert_close(ours, theirs)  # the same response to a steady input


def test_a_streaming_model_starts_from_a_full_context_one(tmp_path) -> None:
    torch.manual_seed(2)
    trained = _transducer()
    streaming = _transducer(STREAMING_ENCODER)
    streaming.encoder.set_feature_stats(torch.full((16,), 3.0), torch.full((16,), 2.0))
    loaded = load_model_weights(streaming, _bundle(tmp_path, trained))
    assert loaded == len(trained.state_dict())
    ours, theirs = streaming.state_dict(), trained.state_dict()
    for name, value in theirs.items():
        if name.endswith("depthwise.weight"):
            torch.testing.assert_close(ours[name], causal_kernel(value, "truncate"))
        else:
            assert torch.equal(ours[name], value), name
    assert torch.equal(ours["encoder.feature_mean"], torch.full((16,), 3.0))  # its own
    # An asr-train checkpoint of a streaming model: kernels taken as they are.
    checkpoint = tmp_path / "last.ckpt"
    state = {f"model.{k}": v for k, v in ours.items()}
    meta = {"model": {"encoder": {"streaming": {"chunk_sizes": [2, -1]}}}}
    torch.save({"state_dict": state, "asr_bundle": meta}, checkpoint)
    again = _transducer(STREAMING_ENCODER)
    load_model_weights(again, checkpoint)
    for name, value in again.state_dict().items():
        assert torch.equal(value, ours[name]) != ("feature" in name), name  # stats: its own


def test_init_from_a_model_of_another_size_names_what_differs(tmp_path) -> None:
    wider = _transducer(ConformerConfig(**{**vars(ENCODER), "d_model": 64}))
    with pytest.raises(ConfigError, match=r"init_from=.* does not fit the model: other shapes"):
        load_model_weights(_transducer(), _bundle(tmp_path, wider))
    with pytest.raises(InputFault, match="init_from=.*no such file"):
        load_model_weights(_transducer(), tmp_path / "missing.pt")


def test_a_tdt_model_and_a_plain_transducer_do_not_start_from_each_other(tmp_path) -> None:
    tdt, plain = _transducer(durations=[0, 1, 2, 3, 4]), _transducer()
    with pytest.raises(ConfigError, match=r"^init_from=.* is a token-and-duration transducer"):
        load_model_weights(plain, _bundle(tmp_path, tdt))
    with pytest.raises(ConfigError, match=r"^init_from=.* is a plain transducer.*durations"):
        load_model_weights(tdt, _bundle(tmp_path, plain))
    other = _transducer(durations=[0, 1, 2])
    with pytest.raises(ConfigError, match=r"durations: \[0, 1, 2\]"):
        load_model_weights(other, _bundle(tmp_path, tdt))
    assert load_model_weights(_transducer(durations=[0, 1, 2, 3, 4]), _bundle(tmp_path, tdt)) > 0

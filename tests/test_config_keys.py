"""asr.config_keys: one rule for unknown keys, missing keys and unknown choices."""

import pytest

from asr.config_keys import ConfigError, check_choice, dataclass_from_keys
from asr.models.build import AedConfig, TransducerConfig, model_config
from asr.models.conformer import ConformerConfig
from asr.models.transducer import JoinerConfig
from asr.training.optimizer import OptimConfig


def test_nested_sections_are_read_into_their_dataclasses() -> None:
    config = model_config(
        {"encoder": {"d_model": 32, "num_heads": 4}, "predictor": {"embed_dim": 8, "hidden_dim": 8}}
    )
    assert isinstance(config, TransducerConfig)
    assert config.encoder.d_model == 32  # given
    assert config.encoder.num_layers == ConformerConfig().num_layers  # default kept
    assert config.predictor.hidden_dim == 8
    assert config.joiner.joint_dim == JoinerConfig().joint_dim  # a section not given: defaults
    assert isinstance(model_config({"kind": "aed"}), AedConfig)


def test_an_unknown_nested_key_is_named_with_its_section_and_the_valid_keys() -> None:
    with pytest.raises(ConfigError) as caught:
        model_config({"predictor": {"embed_dim": 8, "hidden_dim": 8, "layers": 2}})
    message = str(caught.value)
    assert message.startswith("unknown config key model.predictor.layers; valid keys of ")
    assert "'num_layers'" in message and "'context_size'" in message


def test_a_missing_required_key_is_named() -> None:
    with pytest.raises(ConfigError, match="config key optim.lr is required"):
        dataclass_from_keys(OptimConfig, {}, "optim")
    with pytest.raises(ConfigError, match="config key optim.scheduler.warmup_steps is required"):
        dataclass_from_keys(OptimConfig, {"lr": 1.0, "scheduler": {"kind": "noam"}}, "optim")


def test_an_optional_section_may_be_null_and_a_section_must_be_a_mapping() -> None:
    assert (
        dataclass_from_keys(OptimConfig, {"lr": 1.0, "scheduler": None}, "optim").scheduler is None
    )
    with pytest.raises(ConfigError, match="config section optim.scheduler must be a mapping"):
        dataclass_from_keys(OptimConfig, {"lr": 1.0, "scheduler": "noam"}, "optim")


def test_unknown_choices_name_the_valid_ones() -> None:
    check_choice("model.kind", "aed", ["transducer", "aed"])
    with pytest.raises(
        ConfigError, match=r"model.kind='ctc' is unknown; valid: \['transducer', 'aed'\]"
    ):
        check_choice("model.kind", "ctc", ["transducer", "aed"])
    with pytest.raises(ConfigError, match=r"model.encoder.conv_norm='group_norm' is unknown"):
        model_config({"kind": "aed", "encoder": {"conv_norm": "group_norm"}})

"""asr.training.config_files: the YAML group files are generated from the config
dataclasses, and the hand-written files (presets, adjustments of a generated file) only
override."""

import dataclasses
from pathlib import Path
from typing import Any

import hydra
import pytest
from omegaconf import OmegaConf

from asr.config_keys import ConfigError
from asr.data.buckets import SamplerConfig
from asr.training.config_files import CONFIG_DIR, FILES, generate, main
from asr.training.config_render import NOTE, ConfigFile, Part, key_docs, render
from asr.training.distributed.communication.adpsgd import DecentralizedConfig
from asr.training.distributed.communication.gossip import GossipConfig
from asr.training.optimizer import OptimConfig

GENERATED = {file.path for file in FILES}
HAND_WRITTEN = sorted(
    str(path.relative_to(CONFIG_DIR))
    for path in CONFIG_DIR.rglob("*.yaml")
    if str(path.relative_to(CONFIG_DIR)) not in GENERATED
)
PRESETS = [path for path in HAND_WRITTEN if path.startswith("experiment/")]
# Shipped buckets and batch sizes (`batches=...`): searched data, not defaults.
BATCH_PLANS = [path for path in HAND_WRITTEN if path.startswith("batches/")]
ADJUSTMENTS = [path for path in HAND_WRITTEN if path not in PRESETS + BATCH_PLANS]


def test_the_committed_files_are_as_generated(tmp_path: Path) -> None:
    """A default or a comment changed in a dataclass but not in the YAML (or the other way
    round) fails here: run `python -m asr.training.config_files`."""
    differ = [
        str(path.relative_to(tmp_path))
        for path in generate(tmp_path)
        if path.read_bytes() != (CONFIG_DIR / path.relative_to(tmp_path)).read_bytes()
    ]
    assert not differ, f"not as generated (python -m asr.training.config_files): {differ}"
    claim = NOTE.splitlines()[0]
    unlisted = [path for path in HAND_WRITTEN if claim in (CONFIG_DIR / path).read_text()]
    assert not unlisted, f"say they are generated but are not in FILES: {unlisted}"
    assert main(["--check"]) == 0


def test_check_names_a_file_that_is_not_as_generated(tmp_path: Path, capsys) -> None:
    generate(tmp_path)
    path = tmp_path / "ema" / "scaled.yaml"
    path.write_text(path.read_text() + "decay: 0.5\n")  # a value edited by hand
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert "ema/scaled.yaml is not as generated" in capsys.readouterr().out


@dataclasses.dataclass(frozen=True)
class Inner:
    """- `size`: a width.
    - `names`: some strings.
    """

    size: int = 4
    names: tuple[str, ...] = ("a", "b")


@dataclasses.dataclass(frozen=True)
class Outer:
    """Keys of an example.

    - `rate`: a rate, documented on two lines of the docstring that the generator joins
      into one comment.
    - `inner`: an `Inner`.
    - `dims`: numbers.
    - `source`: taken from another group.
    """

    rate: float
    inner: Inner = Inner()
    dims: tuple[float, ...] = (0.5, 1e-8)
    source: int = 80


def test_a_file_is_the_defaults_with_the_variants_overrides_links_and_omissions() -> None:
    file = ConfigFile(
        "x.yaml",
        "An example.",
        (Part(Outer, {"rate": 2e-3, "inner": {"size": 8}}), Part(Inner, key="extra", doc="more.")),
        package="x",
        links={"source": "${data.bins}"},
        omit=("extra.names",),
    )
    assert render(file) == (
        "# @package x\n# An example.\n"
        + "".join(f"# {line}\n" for line in NOTE.splitlines())
        + "# a rate, documented on two lines of the docstring that the generator joins into one"
        " comment.\nrate: 0.002\n"
        "# an `Inner`.\ninner:\n  # a width.\n  size: 8\n  # some strings.\n  names:\n"
        "    - a\n    - b\n"
        "# numbers.\ndims: [0.5, 1.0e-08]\n"
        "# taken from another group.\nsource: ${data.bins}\n"
        "# more.\nextra:\n  # a width.\n  size: 4\n"
    )


def test_a_variant_is_checked_as_the_config_it_makes() -> None:
    with pytest.raises(ConfigError, match=r"\['momentum'\] do not apply to optim.kind=adamw"):
        render(ConfigFile("o.yaml", "", (Part(OptimConfig, {"lr": 1.0, "momentum": 0.5}),)))
    with pytest.raises(ConfigError, match="config key o.yaml.lr is required"):
        render(ConfigFile("o.yaml", "", (Part(OptimConfig),)))
    with pytest.raises(ConfigError, match=r"links or omit name keys it does not have: \['lr2'\]"):
        render(ConfigFile("o.yaml", "", (Part(OptimConfig, {"lr": 1.0}),), omit=("lr2",)))


def test_every_key_needs_one_docstring_line() -> None:
    @dataclasses.dataclass
    class Undocumented:
        """- `size`: a width.
        - `colour`: not a key.
        """

        size: int = 1
        depth: int = 2

    with pytest.raises(ValueError, match=r"undocumented \['depth'\], not keys \['colour'\]"):
        key_docs(Undocumented)
    assert key_docs(Inner) == {"size": "a width.", "names": "some strings."}


def leaf_overrides(override: dict, base: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(key, override's value, base's value) for every leaf of `override`; a key the base
    lacks has the base value `KeyError`."""
    out = []
    for key, value in override.items():
        base_value = base.get(key, KeyError) if isinstance(base, dict) else KeyError
        if isinstance(value, dict) and isinstance(base_value, dict):
            out += leaf_overrides(value, base_value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value, base_value))
    return out


def restated(override: dict, base: dict) -> list[str]:
    """The keys of `override` that the base lacks or holds with the same value."""
    return [
        f"{key}={value!r} ({'no such key' if was is KeyError else 'the same value'} in the base)"
        for key, value, was in leaf_overrides(override, base)
        if was is KeyError or value == was
    ]


@pytest.mark.parametrize("path", ADJUSTMENTS)
def test_a_hand_written_group_file_adjusts_a_generated_one(path: str) -> None:
    """`trainer/gpu.yaml` and the like: their generated base first, then only overrides."""
    own = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / path))
    defaults = own.pop("defaults")
    base = f"{Path(path).parent}/{defaults[0]}.yaml"
    assert defaults == [defaults[0], "_self_"] and base in GENERATED, defaults
    assert restated(own, OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / base))) == []


@pytest.mark.parametrize("path", PRESETS)
def test_a_preset_only_overrides(path: str) -> None:
    """Each key a preset sets differs from the config of its groups (or of the preset it
    builds on, a plain name in its defaults) without it."""
    preset = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / path))
    groups = [
        f"experiment={entry}" if isinstance(entry, str) else
        f"{next(iter(entry)).removeprefix('override /')}={next(iter(entry.values()))}"
        for entry in preset.pop("defaults")
        if entry != "_self_"
    ]  # fmt: skip
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        base = OmegaConf.to_container(hydra.compose("train", overrides=groups))
    assert restated(preset, base) == []


@pytest.mark.parametrize("path", BATCH_PLANS)
def test_a_batch_plan_is_a_sampler_bins_file(path: str) -> None:
    """`batches/*.yaml`: Hydra places its keys at `data.sampler`; they are the keys a bins file
    holds, and the sampler reads them as one (so `asr-plot bins` and `bins_file=` take it)."""
    text = (CONFIG_DIR / path).read_text()
    assert text.startswith("# @package data.sampler\n")
    keys = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / path))
    assert set(keys) == {"bucket_duration_bins", "bucket_batch_size", "max_tps"}
    config = SamplerConfig.from_mapping({"bins_file": str(CONFIG_DIR / path)})
    assert len(config.bucket_batch_size) == len(config.bucket_duration_bins) == len(keys["max_tps"])
    users = [
        p
        for p in PRESETS
        if f"override /batches: {Path(path).stem}" in (CONFIG_DIR / p).read_text()
    ]
    assert users, f"no preset picks {path}"


def test_the_gossip_keys_are_read_with_their_checks() -> None:
    """`distributed.gossip` is read into DecentralizedConfig, a GossipConfig with the
    learner keys: the exchange's checks apply, and so do the learner's."""
    config = DecentralizedConfig(ring="random", node_size=2)
    assert isinstance(config, GossipConfig) and config.ring == "random" and config.seed == 0
    with pytest.raises(ConfigError, match="distributed.gossip.ring='star'"):
        DecentralizedConfig(ring="star")
    with pytest.raises(ConfigError, match="exclude each other"):
        DecentralizedConfig(synchronous=True, delay_by_one=True)
    with pytest.raises(ConfigError, match="node_size must be >= 1"):
        DecentralizedConfig(node_size=0)

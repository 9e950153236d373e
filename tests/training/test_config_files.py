"""asr.training.config_files: the YAML group files are generated from the config
dataclasses."""

import dataclasses
from pathlib import Path

import pytest

from asr.config_keys import ConfigError
from asr.training.config_files import (
    CONFIG_DIR,
    FILES,
    NOTE,
    ConfigFile,
    Part,
    generate,
    key_docs,
    main,
    render,
)
from asr.training.distributed.adpsgd import DecentralizedConfig
from asr.training.distributed.gossip import GossipConfig
from asr.training.optimizer import OptimConfig

GENERATED = {file.path for file in FILES}
HAND_WRITTEN = sorted(
    str(path.relative_to(CONFIG_DIR))
    for path in CONFIG_DIR.rglob("*.yaml")
    if str(path.relative_to(CONFIG_DIR)) not in GENERATED
)


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
    path.write_text(path.read_text().replace("decay: 0.999", "decay: 0.99"))
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


def test_the_gossip_keys_share_their_defaults() -> None:
    """`distributed.gossip` is read into DecentralizedConfig, which hands GossipConfig its
    keys: both must default alike."""
    shared = {f.name for f in dataclasses.fields(GossipConfig)}
    assert shared <= {f.name for f in dataclasses.fields(DecentralizedConfig)}
    gossip, decentralized = GossipConfig(), DecentralizedConfig()
    assert {k: getattr(decentralized, k) for k in shared} == dataclasses.asdict(gossip)

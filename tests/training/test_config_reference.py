"""The config reference page lists exactly the keys of the generated config files, with
their defaults (`asr.training.config_reference`)."""

from __future__ import annotations

import re

import yaml

from asr.training.config_files import CONFIG_DIR, FILES
from asr.training.config_reference import markdown

ROW = re.compile(r"^\| `([\w.]+)` \| `(.*)` \| (.+) \|$")


def _sections() -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current = None
    for line in markdown().splitlines():
        if line.startswith("## `"):
            current = sections.setdefault(line[4:-1], {})
        elif (match := ROW.match(line)) and current is not None:
            current[match.group(1)] = match.group(2)
    return sections


def _flat(mapping: dict, prefix: str) -> dict[str, object]:
    keys: dict[str, object] = {}
    for name, value in mapping.items():
        if isinstance(value, dict) and value:
            keys.update(_flat(value, f"{prefix}{name}."))
        else:
            keys[prefix + name] = value
    return keys


def test_every_key_of_every_generated_file_is_listed_once() -> None:
    sections = _sections()
    assert set(sections) == {file.path.removesuffix(".yaml") for file in FILES}
    for file in FILES:
        loaded = yaml.safe_load((CONFIG_DIR / file.path).read_text())
        loaded = {k: v for k, v in loaded.items() if k not in ("defaults", "hydra")}
        package = file.package or file.path.rpartition("/")[0].replace("/", ".")
        want = _flat(loaded, f"{package}." if package else "")
        assert set(sections[file.path.removesuffix(".yaml")]) == set(want), file.path


def test_defaults_are_the_dataclasses() -> None:
    sections = _sections()
    dgc = sections["distributed/compression/dgc"]
    assert dgc["distributed.compression.sparsity"] == "0.996"
    assert dgc["distributed.compression.exchange"] == "allgather"
    assert sections["train"]["distributed.startup_timeout"] == "600.0"
    assert sections["optim/sgd_cosine"]["optim.lr"] == "0.05"
    assert "optim.betas" not in sections["optim/sgd_cosine"]  # omitted: AdamW only

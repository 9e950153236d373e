"""The config reference as Markdown: every key of every generated config file, with its
default and its docstring line, from the same config dataclasses and `FILES` that write
`asr/configs` (`asr.training.config_files`). The documentation site builds its "Config
reference" page from it (docs/hooks.py), so no key or default is written twice:

    python -m asr.training.config_reference > reference.md
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from asr.training.config_files import FILES
from asr.training.config_render import (
    ConfigFile,
    entries,
    field_values,
    part_values,
    yaml_scalar,
)

INTRO = """# Config reference

Every key `asr-train` reads, group by group, with its default and what it does. This page
is generated from the config dataclasses (`python -m asr.training.config_reference`), the
same source as the YAML files in `asr/configs/`: see [Configuration](../configuration.md).
Override any key on the command line (`asr-train experiment=demo optim.lr=1e-3`); pick a
group's file with `group=name` (`optim=sgd_cosine`, `distributed/compression=dgc`).
Presets (`experiment=...`) and the hand-written files that adjust these
(`trainer=gpu`, `trainer=cpu_ddp`, `data=demo`) override a few keys each.
"""


def markdown() -> str:
    """The whole reference page."""
    sections = [INTRO]
    for file in FILES:
        sections.append(_section(file))
    return "\n".join(sections)


def _section(file: ConfigFile) -> str:
    name = file.path.removesuffix(".yaml")
    select = "the entry config" if name == "train" else f"`{_selector(name)}`"
    lines = [f"## `{name}`", "", f"{_sentence(file.header)} Selected by {select}.", ""]
    lines += ["| key | default | meaning |", "| --- | --- | --- |"]
    prefix = _prefix(file)
    for part in file.parts:
        values = part_values(part.cls, part.overrides, part.key or file.path)
        start = f"{part.key}." if part.key else ""
        for key, value, doc in _rows(part.cls, values, start, file):
            lines.append(f"| `{prefix}{key}` | {_default(value)} | {_cell(doc)} |")
    return "\n".join(lines) + "\n"


def _rows(
    cls: type, values: Mapping[str, Any], prefix: str, file: ConfigFile
) -> Iterator[tuple[str, Any, str]]:
    """(key in the file, default, docstring line) of each key of `cls`, nested sections
    flattened."""
    for key, _, value, doc in entries(cls, values, prefix, file):
        if dataclasses.is_dataclass(value):
            yield from _rows(type(value), field_values(value), f"{key}.", file)
        else:
            yield key, value, doc


def _prefix(file: ConfigFile) -> str:
    """Where the file's keys live in the composed config: its Hydra package."""
    if file.package:
        return file.package + "."
    group = file.path.rpartition("/")[0]
    return group.replace("/", ".") + "." if group else ""


def _selector(name: str) -> str:
    group, _, option = name.rpartition("/")
    return f"{group}={option}"


def _default(value: Any) -> str:
    text = yaml_scalar(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"`{text}`".replace("|", "\\|")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _sentence(text: str) -> str:
    """The header in one line, without its indented example commands and `Select with:`."""
    kept = [line.strip() for line in text.splitlines() if not line.startswith("  ")]
    joined = " ".join(kept).replace(" Override anything from the command line, e.g.", "")
    joined = joined.partition("Select with:")[0].strip().removesuffix(":")
    return joined if joined.endswith(".") else joined + "."


if __name__ == "__main__":
    print(markdown())

"""How a generated config file is written: `Part`s of config classes, a key's comment
from its docstring line, YAML values (`asr.training.config_files` lists the files)."""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from asr.config_keys import ConfigError, dataclass_from_keys

WIDTH = 100  # of the comment lines
KEY_LINE = re.compile(r"- `(\w+)`: (.*)")


@dataclass(frozen=True)
class Part:
    """The keys of `cls` with `overrides` in place of its defaults; under `key` with the
    comment `doc` when given (else at the top level of the file)."""

    cls: type
    overrides: Mapping[str, Any] = field(default_factory=dict)
    key: str | None = None
    doc: str = ""


@dataclass(frozen=True)
class ConfigFile:
    """One generated file: `path` under `asr/configs`, the comment `header` (what the file
    is, how to select it), the parts' keys, and Hydra's own lines verbatim: the `package`
    directive, a defaults list (`head`) and settings after the keys (`tail`)."""

    path: str
    header: str
    parts: tuple[Part, ...]
    package: str | None = None
    head: str = ""
    tail: str = ""
    links: Mapping[str, str] = field(default_factory=dict)
    omit: tuple[str, ...] = ()


NOTE = (
    "Generated from the config dataclasses by `python -m asr.training.config_files`: change a\n"
    "default or a comment there, not here (docs/configuration.md)."
)


def render(file: ConfigFile) -> str:
    """The text of `file`."""
    lines = [f"# @package {file.package}"] if file.package else []
    for text in (file.header, NOTE):
        lines += [f"# {line}".rstrip() for line in text.splitlines()]
    lines += file.head.splitlines()
    seen: set[str] = set()
    for part in file.parts:
        values = part_values(part.cls, part.overrides, part.key or file.path)
        if part.key is None:
            lines += _mapping(part.cls, values, 0, "", file, seen)
        else:
            lines += [*_comment(part.doc, 0), f"{part.key}:"]
            lines += _mapping(part.cls, values, 2, f"{part.key}.", file, seen)
    lines += file.tail.splitlines()
    unknown = sorted(set(file.links) - seen) + sorted(set(file.omit) - seen)
    if unknown:
        raise ConfigError(f"{file.path}: links or omit name keys it does not have: {unknown}")
    return "\n".join(lines) + "\n"


def part_values(cls: type, overrides: Mapping[str, Any], section: str) -> dict[str, Any]:
    """Each key of `cls` with its value: the override, else the default. A dataclass is
    built from the overrides (`dataclass_from_keys`), so a variant is checked as a config."""
    if dataclasses.is_dataclass(cls):
        config = dataclass_from_keys(cls, overrides, section)
        return field_values(config)
    parameters = _keyword_arguments(cls)
    unknown = sorted(set(overrides) - set(parameters))
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown} of {section}")
    values = {name: overrides.get(name, p.default) for name, p in parameters.items()}
    missing = [name for name, value in values.items() if value is inspect.Parameter.empty]
    if missing:
        raise ConfigError(f"config key(s) {missing} of {section} are required")
    return values


def key_docs(cls: type) -> dict[str, str]:
    """Key -> the text of its `- `key`: text` line in `cls`'s docstring (continuation
    lines joined), or in a config dataclass it extends (the keys it inherits); an error
    names a key without one, or one for a key `cls` lacks."""
    docs: dict[str, str] = {}
    bases = [c for c in cls.__mro__[1:] if dataclasses.is_dataclass(c)]
    for owner in [*reversed(bases), cls]:
        docs |= _docstring_keys(owner)
    keys = _keys(cls)
    undocumented = [k for k in keys if k not in docs]
    unknown = [k for k in docs if k not in keys]
    if undocumented or unknown:
        raise ValueError(
            f"{cls.__qualname__}'s docstring needs one line `- `key`: text` per key: "
            f"undocumented {undocumented}, not keys {unknown}"
        )
    return docs


def _docstring_keys(cls: type) -> dict[str, str]:
    """The `- `key`: text` lines of `cls`'s own docstring."""
    docs, key = {}, None
    for line in inspect.cleandoc(cls.__doc__ or "").splitlines():
        match = KEY_LINE.fullmatch(line)
        if match:
            key = match.group(1)
            docs[key] = match.group(2)
        elif key is not None and line.startswith("  "):
            docs[key] += " " + line.strip()
        else:
            key = None
    return docs


def entries(
    cls: type,
    values: Mapping[str, Any],
    prefix: str,
    file: ConfigFile,
    seen: set[str] | None = None,
) -> Iterator[tuple[str, str, Any, str]]:
    """(key under `prefix`, name, value, docstring line) of each key of `cls` that `file`
    does not omit, its link in place of its value; every key goes into `seen`."""
    docs = key_docs(cls)
    for name, value in values.items():
        key = prefix + name
        if seen is not None:
            seen.add(key)
        if key not in file.omit:
            yield key, name, file.links.get(key, value), docs[name]


def field_values(config: Any) -> dict[str, Any]:
    """A dataclass instance's keys and values."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _mapping(
    cls: type,
    values: Mapping[str, Any],
    indent: int,
    prefix: str,
    file: ConfigFile,
    seen: set[str],
) -> list[str]:
    """The lines of `values`, the keys of `cls`, each under its comment; the full keys
    go into `seen`."""
    pad, lines = " " * indent, []
    for key, name, value, doc in entries(cls, values, prefix, file, seen):
        lines += _comment(doc, indent)
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{name}:")
            lines += _mapping(type(value), field_values(value), indent + 2, f"{key}.", file, seen)
        elif _is_sequence(value) and any(isinstance(item, str) for item in value):
            lines.append(f"{pad}{name}:")
            lines += [f"{pad}  - {yaml_scalar(item)}" for item in value]
        else:
            lines.append(f"{pad}{name}: {yaml_scalar(value)}")
    return lines


def _comment(text: str, indent: int) -> list[str]:
    pad = " " * indent + "# "
    return textwrap.wrap(text, WIDTH, initial_indent=pad, subsequent_indent=pad)


def yaml_scalar(value: Any) -> str:
    """`value` in YAML, in one line (a sequence of numbers in flow style)."""
    if _is_sequence(value):
        value = [list(v) if _is_sequence(v) else v for v in value]
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...")


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str)


def _keys(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(_keyword_arguments(cls))


def _keyword_arguments(cls: type) -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}

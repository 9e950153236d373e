"""Config sections read into typed dataclasses, with one rule for bad keys and values.

Every part of the framework that reads a config section declares a dataclass whose fields
are the section's keys (the model parts, the loss, the optimizer, the sampler, ...). The
two helpers here turn a mapping into that dataclass and check a choice among named
values, so a mistyped key or value is always reported the same way: the full key, what is
wrong, and what would be valid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


class ConfigError(ValueError):
    """A config key or value that is unknown, missing or out of range."""


def config_keys(cls: type) -> list[str]:
    """The keys a config dataclass accepts, sorted."""
    return sorted(f.name for f in dataclasses.fields(cls))


def checked_keys(cls: type, cfg: Mapping[str, Any] | None, section: str) -> dict[str, Any]:
    """`cfg` as a dict, after checking it is a mapping whose keys are all fields of `cls`;
    otherwise an error naming `section`, the unknown key(s) and the valid ones."""
    if cfg is None:
        return {}
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"config section {section} must be a mapping, got {cfg!r}")
    known = config_keys(cls)
    unknown = sorted(set(cfg) - set(known))
    if unknown:
        names = ", ".join(f"{section}.{key}" for key in unknown)
        raise ConfigError(f"unknown config key {names}; valid keys of {section}: {known}")
    return dict(cfg)


def dataclass_from_keys(cls: type[T], cfg: Mapping[str, Any] | None, section: str) -> T:
    """`cls(**cfg)` for a config dataclass `cls`, checked by `checked_keys`. A field whose
    type is itself a config dataclass is read from the nested mapping the same way (its
    keys named `section.field.key`); a required field that is missing is named too."""
    values = checked_keys(cls, cfg, section)
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        part, optional = _config_part(hints[field.name])
        value = values.get(field.name)
        if part is not None and not isinstance(value, part) and not (optional and value is None):
            values[field.name] = dataclass_from_keys(part, value, f"{section}.{field.name}")
        elif field.name not in values and _is_required(field):
            raise ConfigError(f"config key {section}.{field.name} is required")
    return cls(**values)


def check_choice(key: str, value: Any, valid: Iterable[Any]) -> None:
    """Raise a ConfigError naming `key`, `value` and the valid choices unless `value` is one."""
    valid = list(valid)
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is unknown; valid: {valid}")


def _config_part(hint: Any) -> tuple[type | None, bool]:
    """(the config dataclass a field holds, or None; whether the field may be None)."""
    args = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    parts = [a for a in args if dataclasses.is_dataclass(a)]
    return (parts[0] if parts else None), type(None) in args


def _is_required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING

"""Config sections read into typed dataclasses: an unknown key is an error naming it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def dataclass_from_keys(cls: type[T], cfg: Mapping[str, Any] | None, section: str) -> T:
    """`cls(**cfg)` for a dataclass `cls`; a key `cls` has no field for raises a KeyError
    that names it, the config `section` and the valid keys."""
    values = dict(cfg or {})
    known = sorted(f.name for f in fields(cls))  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise KeyError(f"unknown {section} key(s) {unknown}; valid keys: {known}")
    return cls(**values)

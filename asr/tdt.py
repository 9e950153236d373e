"""What a token-and-duration transducer's (TDT) duration set may hold: the one rule the
model (`asr.models.transducer.Joiner`) and the loss (`asr.losses.lattice.tdt_lattice`)
share, here because neither may import the other."""

from __future__ import annotations

from numbers import Integral

from asr.config_keys import ConfigError


def check_durations(durations: object, key: str = "durations") -> tuple[int, ...]:
    """`durations` as a tuple of ints, or a ConfigError naming `key`: a TDT duration set
    holds 1 (a blank must be able to advance one frame), no negative and no repeated value."""
    values = list(durations) if isinstance(durations, list | tuple) else None
    if not values or not all(isinstance(d, Integral) and not isinstance(d, bool) for d in values):
        raise ConfigError(
            f"{key}={durations!r} must be a list of frame counts, like [0, 1, 2, 3, 4]"
        )
    values = [int(d) for d in values]
    if min(values) < 0 or len(set(values)) != len(values) or 1 not in values:
        raise ConfigError(
            f"{key}={values} must hold 1 and no negative or repeated value, like [0, 1, 2, 3, 4]"
        )
    return tuple(values)

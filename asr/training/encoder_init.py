"""Fine-tuning from a pre-trained encoder: `init_encoder_from` and `freeze_encoder_steps`.

`init_encoder_from=PATH` (a run-level key, so bundles never carry it) reads the encoder's
weights from a pre-training checkpoint (`model.encoder.*` in its state dict), any other
`asr-train` checkpoint, or an encoder export (`asr-export --encoder-only`: a file with an
`encoder` state dict), and loads them exactly into the new model's encoder; keys that do
not match fail at once, in one line that names them.

`freeze_encoder_steps=N` keeps the encoder's weights unchanged for the first N optimizer
steps by giving its parameter groups a learning rate of 0 (the schedule's rate returns at
step N). Every parameter still receives its gradient, so data-parallel training sees the
same parameters in every step; AdamW's moments of the encoder keep accumulating.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from asr.config_keys import ConfigError
from asr.errors import InputFault
from asr.inference.bundle import ENCODER_KEY

CHECKPOINT_PREFIX = "model.encoder."
SHOWN_KEYS = 5


def encoder_weights(path: str | Path) -> dict[str, Tensor]:
    """The encoder's state dict stored in `path` (a checkpoint or an encoder export)."""
    path = Path(path)
    if not path.is_file():
        raise InputFault(f"init_encoder_from={path}: no such file")
    try:
        stored = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # a truncated or foreign file: say which, in one line
        raise InputFault(f"init_encoder_from={path}: not a checkpoint ({err})") from err
    if isinstance(stored, Mapping) and isinstance(stored.get(ENCODER_KEY), Mapping):
        return dict(stored[ENCODER_KEY])
    state = stored.get("state_dict") if isinstance(stored, Mapping) else None
    if not isinstance(state, Mapping):
        raise InputFault(
            f"init_encoder_from={path}: neither an asr-train checkpoint nor an encoder export"
        )
    weights = {
        k[len(CHECKPOINT_PREFIX) :]: v for k, v in state.items() if k.startswith(CHECKPOINT_PREFIX)
    }
    if not weights:
        raise InputFault(f"init_encoder_from={path}: the checkpoint holds no encoder weights")
    return weights


def _named(keys: set[str]) -> str:
    shown = sorted(keys)[:SHOWN_KEYS]
    more = f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    return ", ".join(shown) + more


def load_encoder(encoder: nn.Module, path: str | Path) -> int:
    """Load the encoder weights of `path` into `encoder`, exactly; returns their count. A
    missing or unexpected key, or a shape that differs, is a `ConfigError` naming them."""
    weights = encoder_weights(path)
    own = encoder.state_dict()
    missing, unexpected = set(own) - set(weights), set(weights) - set(own)
    shapes = {k for k in set(own) & set(weights) if own[k].shape != weights[k].shape}
    problems = []
    if missing:
        problems.append(f"missing {_named(missing)}")
    if unexpected:
        problems.append(f"unexpected {_named(unexpected)}")
    if shapes:
        problems.append(f"other shapes for {_named(shapes)}")
    if problems:
        raise ConfigError(
            f"init_encoder_from={path} does not fit model.encoder: {'; '.join(problems)} "
            "(the model.encoder keys must match the pre-training's)"
        )
    encoder.load_state_dict(weights, strict=True)
    return len(weights)


def encoder_group_ids(optimizer: torch.optim.Optimizer, encoder: nn.Module) -> list[int]:
    """Indices of the optimizer's parameter groups that hold only encoder parameters."""
    ids = {id(p) for p in encoder.parameters()}
    return [
        i
        for i, group in enumerate(optimizer.param_groups)
        if group["params"] and all(id(p) in ids for p in group["params"])
    ]


def hold_encoder(optimizer: torch.optim.Optimizer, groups: list[int]) -> None:
    """Set the learning rate of the encoder's groups to 0 for the coming step."""
    for i in groups:
        optimizer.param_groups[i]["lr"] = 0.0

"""Starting weights: `init_from`, `init_encoder_from` and `freeze_encoder_steps`.

`init_from=PATH` (a run-level key, as all three) starts the whole model (encoder,
predictor, joiner, CTC head) from a trained one: a bundle (`asr-export`, with the weights
it was exported with, the EMA's for `--ema`) or an `asr-train` checkpoint (its trained
weights). Every tensor must fit; a full-context model's symmetric depthwise convolutions
are mapped into a streaming model's causal ones (`causal_kernel`), and the new model keeps
its own feature statistics. This is how a streaming model starts from a trained
full-context one (docs/streaming.md).

`init_encoder_from=PATH` reads the encoder's
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
from typing import Any

import torch
from torch import Tensor, nn

from asr.config_keys import ConfigError
from asr.errors import InputFault
from asr.inference.bundle import BUNDLE_KEY, ENCODER_KEY

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


def mismatches(
    own: Mapping[str, Tensor], weights: Mapping[str, Tensor], ignored: set[str] = frozenset()
) -> str:
    """What keeps `weights` from loading into a module whose state dict is `own` (keys
    missing or unexpected, other shapes; `ignored` keys need not be there), in a few
    words; empty when they fit."""
    missing = set(own) - set(weights) - ignored
    unexpected = set(weights) - set(own)
    shapes = {k for k in set(own) & set(weights) if own[k].shape != weights[k].shape}
    problems = []
    if missing:
        problems.append(f"missing {_named(missing)}")
    if unexpected:
        problems.append(f"unexpected {_named(unexpected)}")
    if shapes:
        problems.append(f"other shapes for {_named(shapes)}")
    return "; ".join(problems)


def _named(keys: set[str]) -> str:
    shown = sorted(keys)[:SHOWN_KEYS]
    more = f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    return ", ".join(shown) + more


def load_encoder(encoder: nn.Module, path: str | Path) -> int:
    """Load the encoder weights of `path` into `encoder`, exactly; returns their count. A
    missing or unexpected key, or a shape that differs, is a `ConfigError` naming them."""
    weights = encoder_weights(path)
    problems = mismatches(encoder.state_dict(), weights)
    if problems:
        raise ConfigError(
            f"init_encoder_from={path} does not fit model.encoder: {problems} "
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


FEATURE_STATS_KEYS = ("encoder.feature_mean", "encoder.feature_scale")
CONV_MAPPINGS = ("fold", "truncate", "mirror", "as_is")


def causal_kernel(symmetric: Tensor, mapping: str = "truncate") -> Tensor:
    """A symmetric depthwise kernel (D, 1, K), centred on its frame, as a causal one whose
    last tap is the current frame. `truncate`: the past and current taps keep their
    offsets, the future ones are dropped; `fold`: as `truncate`, with the future taps
    added to the current one (a constant input gives the same output); `mirror`: each
    future tap added to the past tap as far back; `as_is`: the taps unchanged (the kernel
    then reads K // 2 frames later than it was trained to). `truncate` starts a streaming
    model best (recipes/demo/RESULTS.md, "Streaming")."""
    k = symmetric.size(-1)
    half = k // 2
    if mapping == "as_is":
        return symmetric.clone()
    causal = torch.zeros_like(symmetric)
    causal[..., k - 1 - half :] = symmetric[..., : half + 1]  # offsets -half..0
    future = symmetric[..., half + 1 :]  # offsets +1..+half
    if mapping == "fold":
        causal[..., k - 1] += future.sum(-1)
    elif mapping == "mirror":
        causal[..., k - 1 - half : k - 1] += future.flip(-1)
    elif mapping != "truncate":
        raise ValueError(f"conv mapping must be one of {CONV_MAPPINGS}, got {mapping!r}")
    return causal


def trained_model(path: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The model's state dict in a bundle or an asr-train checkpoint, and its `model`
    config (empty where the file holds none)."""
    path = Path(path)
    if not path.is_file():
        raise InputFault(f"init_from={path}: no such file")
    try:
        stored = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # a truncated or foreign file: say which, in one line
        raise InputFault(f"init_from={path}: not a checkpoint or bundle ({err})") from err
    state = stored.get("state_dict") if isinstance(stored, Mapping) else None
    if not isinstance(state, Mapping):
        raise InputFault(f"init_from={path}: neither an asr bundle nor an asr-train checkpoint")
    if "format" in stored:  # a bundle: the model's own keys and config
        weights, config = dict(state), stored.get("model")
    else:
        prefix = "model."
        weights = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        config = (stored.get(BUNDLE_KEY) or {}).get("model")
    return weights, dict(config or {})


def _kind_of_transducer(durations: object) -> str:
    if durations is None:
        return "a plain transducer (model.joiner.durations: null)"
    return f"a token-and-duration transducer (model.joiner.durations: {list(durations)})"


def check_same_durations(path: str | Path, config: Mapping[str, Any], model: nn.Module) -> None:
    """A ConfigError, in one line, when the trained model in `path` (its `config`) and
    `model` are not both plain transducers or both TDTs with the same durations."""
    if "joiner" not in config or not hasattr(model, "joiner"):
        return
    theirs = (config.get("joiner") or {}).get("durations")
    theirs = None if theirs is None else tuple(theirs)
    ours = getattr(model, "durations", None)
    if theirs != ours:
        raise ConfigError(
            f"init_from={path} is {_kind_of_transducer(theirs)}, this model "
            f"{_kind_of_transducer(ours)}: set model.joiner.durations to the trained model's"
        )


def load_model_weights(model: nn.Module, path: str | Path, mapping: str = "truncate") -> int:
    """Load the weights of the trained model in `path` into `model`; returns their count.
    Depthwise kernels of a causal convolution module come from symmetric ones through
    `causal_kernel`; the feature statistics stay `model`'s. A key that is missing or
    unexpected, or a shape that differs, is a `ConfigError` naming them."""
    weights, config = trained_model(path)
    check_same_durations(path, config, model)
    streaming_source = (config.get("encoder") or {}).get("streaming") is not None
    own = model.state_dict()
    keep = set(FEATURE_STATS_KEYS) & set(own)
    weights = {k: v for k, v in weights.items() if k not in FEATURE_STATS_KEYS}
    problems = mismatches(own, weights, keep)
    if problems:
        raise ConfigError(
            f"init_from={path} does not fit the model: {problems} (it must be the same model "
            "kind and size)"
        )
    if not streaming_source:
        for name, module in model.named_modules():
            if getattr(module, "causal", False):
                key = f"{name}.depthwise.weight"
                weights[key] = causal_kernel(weights[key], mapping)
    for key in keep:
        weights[key] = own[key]
    model.load_state_dict(weights, strict=True)
    return len(weights) - len(keep)

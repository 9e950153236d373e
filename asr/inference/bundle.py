"""Checkpoint(s) -> self-contained inference bundle -> model.

A bundle is one file, loadable with `torch.load(weights_only=True)`, holding the model
weights (optionally averaged over epochs, icefall's `--epoch/--avg`, or the EMA), the model
config, the feature config and the serialized SentencePiece model. `load_bundle` rebuilds
the network from it without Hydra or Lightning. The checkpoint file names live here too, so
that training (which writes them) and inference (which reads them) spell them once.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from asr.data.tokenizer import Tokenizer
from asr.errors import first_line
from asr.models.build import Model, build_model

# File names of a run: asr.training.checkpointing writes them, this module reads them.
CHECKPOINT_DIR = "checkpoints"  # in the run's exp_dir
CHECKPOINT_SUFFIX = ".ckpt"
LAST_CHECKPOINT = "last" + CHECKPOINT_SUFFIX  # the newest state (resume=auto continues it)
BEST_CHECKPOINT = "best" + CHECKPOINT_SUFFIX  # lowest val/wer (pre-training: val/loss)
_EPOCH_PREFIX = "epoch="
# one per epoch, kept for averaging; a str.format template (and Lightning's `filename` one)
EPOCH_CHECKPOINT = _EPOCH_PREFIX + "{epoch:02d}" + CHECKPOINT_SUFFIX
_EPOCH_FILE = re.compile(re.escape(_EPOCH_PREFIX) + r"(\d+)" + re.escape(CHECKPOINT_SUFFIX) + "$")
BUNDLE_FILE = "model.bundle.pt"  # asr-export's default output, in the run's exp_dir

BUNDLE_FORMAT = "asr-bundle-1"
ONNX_DIR = "onnx"  # asr-export --format onnx's default output directory, in the exp_dir
ENCODER_FILE = "encoder.pt"  # asr-export --encoder-only's default output, in the exp_dir
ENCODER_FORMAT = "asr-encoder-1"
ENCODER_KEY = "encoder"  # the encoder's state dict in an encoder export
BUNDLE_KEY = "asr_bundle"  # where asr-train puts model config + tokenizer in checkpoints
EMA_STATE_KEY = "EmaWeights"  # the callback state asr.training.callbacks keeps


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path} (made by the 'train' stage)")
    return _torch_load(path, weights_only=False)


def _torch_load(path: Path, *, weights_only: bool) -> Any:
    """torch.load, with an error naming `path` when the file is truncated or not torch's."""
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as err:
        # a file cut short fails in the zip reader (RuntimeError), in pickle (EOFError,
        # UnpicklingError) or in a seek past its end (OSError: [Errno 22] Invalid argument)
        reason = first_line(err, with_type=False)
        raise ValueError(f"cannot read {path}: truncated or not a torch file ({reason})") from err


def epoch_of(path: str | Path) -> int | None:
    """The NN of an `epoch=NN.ckpt` path; None for any other name."""
    match = _EPOCH_FILE.search(Path(path).name)
    return int(match.group(1)) if match else None


def epoch_checkpoints(directory: Path) -> dict[int, Path]:
    """The `epoch=NN.ckpt` files of `directory`, by epoch number."""
    return {
        epoch: p
        for p in directory.glob(f"{_EPOCH_PREFIX}*{CHECKPOINT_SUFFIX}")
        if (epoch := epoch_of(p)) is not None
    }


def checkpoints_to_average(ckpt: str | Path, n: int) -> list[Path]:
    """`ckpt` plus the epoch checkpoints before it in its directory, `n` in all.

    `ckpt` may be `epoch=NN.ckpt` or any checkpoint (last/best) whose stored epoch says
    where to end; the epochs averaged are the `n` consecutive epochs ending there.
    """
    ckpt = Path(ckpt)
    if n <= 1:
        return [ckpt]
    end = epoch_of(ckpt)
    if end is None:
        end = int(_load(ckpt)["epoch"])
    wanted = range(end - n + 1, end + 1)
    found = epoch_checkpoints(ckpt.parent)
    missing = [e for e in wanted if e not in found]
    if missing:
        raise FileNotFoundError(
            f"--average {n} needs epoch checkpoints {list(wanted)} in {ckpt.parent}; "
            f"missing {missing} (available: {sorted(found)})"
        )
    return [found[e] for e in wanted]


def select_checkpoints(
    source: str | Path, epoch: int | None = None, avg: int = 1, best: bool = False
) -> list[Path]:
    """The checkpoints whose weights a model is made of, icefall-style: `source` is a
    checkpoint file (with `avg` > 1, it and the epochs before it), or a run's
    `checkpoints/` directory (or its exp_dir) with `epoch` E (`epoch=EE.ckpt`, 0-based as
    the files are named: the average of epochs E-avg+1..E) or `best` (`best.ckpt`)."""
    source = Path(source)
    if epoch is None and not best:
        if source.is_dir():
            raise ValueError(f"{source} is a directory: say which checkpoint (--epoch E or --best)")
        return checkpoints_to_average(source, avg)
    if epoch is not None and best:
        raise ValueError("--epoch and --best exclude each other")
    directory = source if source.name == CHECKPOINT_DIR else source / CHECKPOINT_DIR
    if not directory.is_dir():
        directory = source
    if best:
        if avg > 1:
            raise ValueError("--best is one checkpoint: it cannot be averaged (--avg 1)")
        return [directory / BEST_CHECKPOINT]
    assert epoch is not None
    if epoch < 0:
        raise ValueError(f"--epoch must be >= 0 (the NN of epoch=NN.ckpt), got {epoch}")
    return checkpoints_to_average(directory / EPOCH_CHECKPOINT.format(epoch=epoch), avg)


def _model_state(checkpoint: dict[str, Any], ema: bool = False) -> dict[str, torch.Tensor]:
    """The model's weights in `checkpoint`; with `ema`, its parameters replaced by the EMA
    that `asr.training.callbacks.EmaWeights` kept (buffers stay the model's own)."""
    prefix = "model."
    state = {
        k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)
    }
    if ema:
        averaged = (checkpoint.get("callbacks") or {}).get(EMA_STATE_KEY)
        if not averaged:
            raise ValueError(
                "this checkpoint has no EMA weights: train with ema=scaled "
                "(docs/savers.md#an-ema-that-follows-the-batch-size) or export without --ema"
            )
        state.update({k: v.to(state[k].dtype) for k, v in averaged["weights"].items()})
    return state


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of floating tensors; other tensors (counters) from the last."""
    out = {}
    for key, last in states[-1].items():
        if last.is_floating_point():
            out[key] = sum(s[key].double() for s in states).div(len(states)).to(last.dtype)
        else:
            out[key] = last.clone()
    return out


def bundle_from_checkpoints(paths: list[Path], ema: bool = False) -> dict[str, Any]:
    """The bundle dict of the averaged weights of `paths` (config from the last one);
    with `ema`, of their EMA weights."""
    checkpoints = [_load(p) for p in paths]
    meta = checkpoints[-1].get(BUNDLE_KEY)
    if meta is None:
        raise ValueError(f"{paths[-1]} has no '{BUNDLE_KEY}' entry: not written by asr-train")
    return {
        "format": BUNDLE_FORMAT,
        "model": meta["model"],
        "features": meta["features"],
        "tokenizer": meta["tokenizer"],
        "state_dict": average_state_dicts([_model_state(c, ema) for c in checkpoints]),
        "averaged": [str(p) for p in paths],
        "ema": ema,
    }


def export_bundle(
    ckpt: str | Path | list[Path], output: str | Path, average: int = 1, ema: bool = False
) -> Path:
    """Write a bundle from `ckpt` (weights averaged over `average` epochs, or over the list
    of checkpoints given; with `ema`, the EMA weights). Returns its path."""
    paths = ckpt if isinstance(ckpt, list) else checkpoints_to_average(ckpt, average)
    bundle = bundle_from_checkpoints(paths, ema)
    check_decodable(bundle, paths[-1])
    return _save_atomically(bundle, Path(output))


def check_decodable(bundle: dict[str, Any], source: Path) -> None:
    """Raise unless `bundle` (from `source`) is a model that decodes (not pre-training)."""
    if bundle["model"].get("kind") == "ssl":
        raise ValueError(
            f"{source} is a pre-training checkpoint (model.kind=ssl): it has no decoder; "
            "export its encoder with asr-export --encoder-only"
        )


def export_encoder(paths: list[Path], output: str | Path, ema: bool = False) -> Path:
    """Write the encoder alone (its averaged weights and config, the feature config) for
    `init_encoder_from`: what a pre-training run hands to fine-tuning. Returns its path."""
    bundle = bundle_from_checkpoints(paths, ema)
    prefix = "encoder."
    weights = {k[len(prefix) :]: v for k, v in bundle["state_dict"].items() if k.startswith(prefix)}
    export = {
        "format": ENCODER_FORMAT,
        ENCODER_KEY: weights,
        "encoder_config": bundle["model"]["encoder"],
        "features": bundle["features"],
        "averaged": bundle["averaged"],
        "ema": ema,
    }
    return _save_atomically(export, Path(output))


def _save_atomically(obj: Any, output: Path) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    tmp.replace(output)
    return output


def load_bundle(
    path: str | Path | list[Path], ema: bool = False
) -> tuple[Model, Tokenizer, dict[str, Any]]:
    """(model in eval mode, tokenizer, feature config) from a bundle, a training checkpoint,
    or a list of checkpoints (their averaged weights); with `ema`, a checkpoint's EMA
    weights (a bundle holds the weights it was exported with)."""
    if isinstance(path, list):
        bundle = bundle_from_checkpoints(path, ema)
        path = path[-1]
    else:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"model file not found: {path} (made by asr-export or asr-train)"
            )
        if path.suffix == CHECKPOINT_SUFFIX:
            bundle = bundle_from_checkpoints([path], ema)
        else:
            bundle = _torch_load(path, weights_only=True)
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{path} is neither an asr bundle nor an asr-train checkpoint")
    if ema and not bundle.get("ema"):
        raise ValueError(
            f"{path} is a bundle of the trained weights: for the EMA, export a checkpoint "
            "with asr-export --ema, or give the checkpoint"
        )
    return model_from_bundle(bundle)


def model_from_bundle(bundle: dict[str, Any]) -> tuple[Model, Tokenizer, dict[str, Any]]:
    """(model in eval mode, tokenizer, feature config) of a bundle dict."""
    tokenizer = Tokenizer.from_bytes(bundle["tokenizer"])
    model = build_model(bundle["model"], tokenizer.vocab_size)
    model.load_state_dict(bundle["state_dict"])
    return model.eval(), tokenizer, dict(bundle["features"])

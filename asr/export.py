"""Checkpoint (optionally averaged over the last N epochs) -> self-contained inference bundle.

A bundle is one file, loadable with `torch.load(weights_only=True)`, holding the model
weights, the model config, the feature config and the serialized SentencePiece model.
`load_bundle` rebuilds the network from it without Hydra or Lightning.

    asr-export exp/demo/checkpoints/last.ckpt --average 3 -o exp/demo/model.bundle.pt
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from asr.cli import command
from asr.data.tokenizer import Tokenizer
from asr.errors import first_line
from asr.models.build import Model, build_model

BUNDLE_FORMAT = "asr-bundle-1"
BUNDLE_KEY = "asr_bundle"  # where asr-train puts model config + tokenizer in checkpoints
EMA_STATE_KEY = "EmaWeights"  # the callback state asr.training.callbacks keeps
_EPOCH_FILE = re.compile(r"epoch=(\d+)\.ckpt$")


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path} (made by the 'train' stage)")
    return _torch_load(path, weights_only=False)


def _torch_load(path: Path, *, weights_only: bool) -> Any:
    """torch.load, with an error naming `path` when the file is truncated or not torch's."""
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as err:
        reason = first_line(err, with_type=False)
        raise ValueError(f"cannot read {path}: truncated or not a torch file ({reason})") from err


def epoch_checkpoints(directory: Path) -> dict[int, Path]:
    """The `epoch=NN.ckpt` files of `directory`, by epoch number."""
    return {
        int(m.group(1)): p
        for p in directory.glob("epoch=*.ckpt")
        if (m := _EPOCH_FILE.search(p.name))
    }


def checkpoints_to_average(ckpt: str | Path, n: int) -> list[Path]:
    """`ckpt` plus the epoch checkpoints before it in its directory, `n` in all.

    `ckpt` may be `epoch=NN.ckpt` or any checkpoint (last/best) whose stored epoch says
    where to end; the epochs averaged are the `n` consecutive epochs ending there.
    """
    ckpt = Path(ckpt)
    if n <= 1:
        return [ckpt]
    match = _EPOCH_FILE.search(ckpt.name)
    end = int(match.group(1)) if match else int(_load(ckpt)["epoch"])
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
    directory = source if source.name == "checkpoints" else source / "checkpoints"
    if not directory.is_dir():
        directory = source
    if best:
        if avg > 1:
            raise ValueError("--best is one checkpoint: it cannot be averaged (--avg 1)")
        return [directory / "best.ckpt"]
    assert epoch is not None
    if epoch < 0:
        raise ValueError(f"--epoch must be >= 0 (the NN of epoch=NN.ckpt), got {epoch}")
    return checkpoints_to_average(directory / f"epoch={epoch:02d}.ckpt", avg)


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
                "this checkpoint has no EMA weights: train with ema=scaled (README, 'EMA "
                "that follows the batch size') or export without --ema"
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
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    torch.save(bundle, tmp)
    tmp.replace(output)
    return output


def load_bundle(path: str | Path | list[Path]) -> tuple[Model, Tokenizer, dict[str, Any]]:
    """(model in eval mode, tokenizer, feature config) from a bundle, a training checkpoint,
    or a list of checkpoints (their averaged weights)."""
    if isinstance(path, list):
        bundle = bundle_from_checkpoints(path)
        path = path[-1]
    else:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"model file not found: {path} (made by asr-export or asr-train)"
            )
        if path.suffix == ".ckpt":
            bundle = bundle_from_checkpoints([path])
        else:
            bundle = _torch_load(path, weights_only=True)
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        raise ValueError(f"{path} is neither an asr bundle nor an asr-train checkpoint")
    tokenizer = Tokenizer.from_bytes(bundle["tokenizer"])
    model = build_model(bundle["model"], tokenizer.vocab_size)
    model.load_state_dict(bundle["state_dict"])
    return model.eval(), tokenizer, dict(bundle["features"])


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export a checkpoint as an inference bundle.")
    parser.add_argument(
        "checkpoint", type=Path, help="a .ckpt, or a run's checkpoints/ (or exp) directory"
    )
    add_checkpoint_arguments(parser)
    parser.add_argument("--ema", action="store_true", help="the EMA weights (ema=scaled runs)")
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="default: beside the exp dir"
    )
    args = parser.parse_args(argv)
    paths = select_checkpoints(args.checkpoint, args.epoch, args.avg, args.best)
    output = args.output or paths[-1].parent.parent / "model.bundle.pt"
    path = export_bundle(paths, output, ema=args.ema)
    weights = "EMA weights" if args.ema else "weights"
    print(
        f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {weights} averaged over "
        f"{len(paths)} checkpoint(s))"
    )


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """`--epoch E --avg N` / `--best` (and `--average`, `--avg`'s old name) of asr-export
    and asr-decode, so that a recipe decodes exactly the model it exports."""
    parser.add_argument(
        "--epoch", type=int, default=None, help="end at epoch=EE.ckpt (0-based, as the files)"
    )
    parser.add_argument(
        "--avg", "--average", type=int, default=1, help="average N epochs ending there"
    )
    parser.add_argument("--best", action="store_true", help="best.ckpt (lowest dev WER)")


if __name__ == "__main__":
    main()

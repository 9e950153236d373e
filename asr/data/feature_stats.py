"""Global feature statistics: the mean and standard deviation of every filterbank bin over
the training cuts, which a streaming model normalizes with (a live stream has no
per-utterance statistics). `asr-feature-stats` writes them as JSON; training reads them
into the encoder (`model.encoder.feature_stats`), so checkpoints and exports carry them.

    asr-feature-stats --cuts data/demo/manifests/train.jsonl.gz --frontend librosa \\
        --output data/demo/feature_stats_librosa.json
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.progress import track

from asr.cli import command
from asr.data.corpus import open_cuts
from asr.data.dataset import AsrDataset
from asr.data.features import FRONTENDS, FeatureConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureStats:
    """Per-bin mean and standard deviation (F,) of `frames` feature frames of one front end."""

    mean: np.ndarray
    std: np.ndarray
    frames: int
    frontend: str

    def write(self, path: str | Path) -> Path:
        """Write as JSON (atomically)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "frontend": self.frontend,
                    "frames": self.frames,
                    "mean": [round(float(v), 6) for v in self.mean],
                    "std": [round(float(v), 6) for v in self.std],
                },
                indent=1,
            )
        )
        tmp.replace(path)
        return path


def compute_feature_stats(
    cuts_paths: Sequence[str | Path], features: FeatureConfig, progress: bool = True
) -> FeatureStats:
    """Statistics of the unnormalized features of every readable cut (unreadable ones are
    skipped and counted in a warning), accumulated in float64."""
    unnormalized = FeatureConfig(**{**features.__dict__, "normalize": "none"})
    loader = AsrDataset(None, unnormalized)
    total = np.zeros(features.num_mel_bins)
    squares = np.zeros(features.num_mel_bins)
    frames = skipped = 0
    cuts = open_cuts(cuts_paths)
    for cut in track(cuts, description="feature statistics") if progress else cuts:
        feats = loader.load_features(cut)
        if isinstance(feats, str):
            skipped += 1
            log.warning("skipping cut %s: %s", cut.id, feats)
            continue
        feats = feats.astype(np.float64)
        total += feats.sum(axis=0)
        squares += np.square(feats).sum(axis=0)
        frames += feats.shape[0]
    if frames == 0:
        raise ValueError(f"no readable features in {', '.join(map(str, cuts_paths))}")
    if skipped:
        log.warning("feature statistics: %d unreadable cuts skipped", skipped)
    mean = total / frames
    std = np.sqrt(np.maximum(squares / frames - np.square(mean), 0.0))
    return FeatureStats(mean, std, frames, features.frontend)


def read_feature_stats(path: str | Path, num_mel_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) float32 tensors (F,) from an `asr-feature-stats` file, with an error
    naming the file when it is missing or does not fit."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"feature statistics not found: {path} (model.encoder.feature_stats; made by "
            "asr-feature-stats, or the recipe's 'stats' stage)"
        )
    try:
        stats = json.loads(path.read_text())
        mean = torch.tensor(stats["mean"], dtype=torch.float32)
        std = torch.tensor(stats["std"], dtype=torch.float32)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a feature statistics file: {err}") from None
    if mean.shape != (num_mel_bins,) or std.shape != (num_mel_bins,):
        raise ValueError(
            f"{path} holds statistics of {mean.numel()} bins, the model reads {num_mel_bins}"
        )
    return mean, std


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Global mean and standard deviation of the training features (JSON)."
    )
    parser.add_argument("--cuts", type=Path, nargs="+", required=True, help="cut manifests")
    parser.add_argument("--output", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--frontend", choices=FRONTENDS, default="kaldi", help="see FeatureConfig")
    parser.add_argument("--num-mel-bins", type=int, default=80)
    parser.add_argument(
        "--source",
        choices=("on_the_fly", "precomputed"),
        default="precomputed",
        help="stored features where the cuts have them (of this front end), else from audio",
    )
    args = parser.parse_args(argv)
    config = FeatureConfig(
        num_mel_bins=args.num_mel_bins, source=args.source, frontend=args.frontend
    )
    stats = compute_feature_stats(args.cuts, config)
    print(f"wrote {stats.write(args.output)} ({stats.frames} frames)")


if __name__ == "__main__":
    main()

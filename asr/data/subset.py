"""`asr-subset-cuts`: a fixed, seeded share of a cut manifest, by audio duration.

    asr-subset-cuts CUTS --fraction 0.1 --seed 0 -o SUBSET     # 10 % of the audio, by seed

The few-labels setting of self-supervised pre-training (docs/ssl.md): the cuts are shuffled
with `seed` and taken in that order until their durations reach `fraction` of the whole
manifest's, so the same manifest, fraction and seed give the same subset on any machine,
and a larger fraction with the same seed holds the smaller one's cuts.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from lhotse import CutSet

from asr.cli import command
from asr.data.corpus import load_cuts


def seeded_subset(cuts: CutSet, fraction: float, seed: int) -> CutSet:
    """The cuts, shuffled by `seed`, taken until their total duration reaches `fraction` of
    all of them (at least one cut); in the manifest's order."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"--fraction must be in (0, 1], got {fraction}")
    items = list(cuts)
    if not items:
        raise ValueError("the manifest has no cuts to choose from")
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    target = fraction * sum(cut.duration for cut in items)
    chosen: set[int] = set()
    total = 0.0
    for index in order:
        if total >= target:
            break
        chosen.add(index)
        total += items[index].duration
    return CutSet.from_cuts(cut for i, cut in enumerate(items) if i in chosen)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="asr-subset-cuts", description="Write a fixed, seeded share of a cut manifest."
    )
    parser.add_argument("cuts", type=Path, help="lhotse cut manifest (.jsonl.gz)")
    parser.add_argument("--fraction", type=float, required=True, help="share of the audio")
    parser.add_argument("--seed", type=int, default=0, help="which subset (default 0)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the subset manifest")
    return parser.parse_args(argv)


@command
def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    cuts = load_cuts(args.cuts)
    try:
        subset = seeded_subset(cuts, args.fraction, args.seed)
    except ValueError as error:
        raise ValueError(f"{args.cuts}: {error}") from None
    args.output.parent.mkdir(parents=True, exist_ok=True)
    subset.to_file(args.output)
    seconds = sum(cut.duration for cut in subset)
    print(json.dumps({
        "output": str(args.output), "cuts": len(subset), "of_cuts": len(cuts),
        "seconds": round(seconds, 1), "of_seconds": round(sum(c.duration for c in cuts), 1),
        "fraction": args.fraction, "seed": args.seed,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

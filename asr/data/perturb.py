"""Speed perturbation of training cuts (`asr-perturb-speed`), as Kaldi and icefall recipes
do for LibriSpeech: each cut plus copies played at 0.9x and 1.1x speed (ids suffixed
`_sp0.9`, `_sp1.1`), three times the audio with new pitches and durations.

Nothing is resampled here: lhotse records the speed change in each copy's recording and
applies it when the audio is loaded (on-the-fly features), or when `asr-compute-features`
stores features of the perturbed manifest. The manifest is streamed, so a 960 h part needs
no memory for it.

    asr-perturb-speed --cuts data/manifests/librispeech_cuts_train-clean-100.jsonl.gz \\
        --output data/manifests/librispeech_cuts_train-clean-100-sp.jsonl.gz
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from rich.progress import track

from asr.cli import command
from asr.data.corpus import load_cuts

DEFAULT_FACTORS = (0.9, 1.1)


def perturb_speed(
    cuts_path: str | Path, output: str | Path, factors: Sequence[float] = DEFAULT_FACTORS
) -> int:
    """Write `output`: every cut of `cuts_path`, then a copy of each at each speed
    `factor` (a cut with attached features would lose them: perturb before computing
    features). The number of cuts written."""
    for factor in factors:
        if not 0 < factor != 1.0:
            raise ValueError(f"speed factors must be > 0 and not 1 (the original), got {factor}")
    cuts = load_cuts(cuts_path)
    if any(cut.has_features for cut in cuts.subset(first=1)):
        raise ValueError(
            f"{cuts_path} has features attached, which speed perturbation drops: perturb "
            "the manifest without features, then compute features of the result"
        )
    every = cuts
    for factor in factors:
        every = every + cuts.perturb_speed(factor)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name.replace(".jsonl", ".tmp.jsonl"))
    written = 0
    with every.open_writer(tmp) as writer:
        for cut in track(every, description=f"Speed x{', x'.join(map(str, factors))}"):
            writer.write(cut)
            written += 1
    tmp.replace(output)
    return written


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuts", type=Path, required=True, help="cut manifest (no features)")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--factors", type=float, nargs="+", default=list(DEFAULT_FACTORS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    count = perturb_speed(args.cuts, args.output, args.factors)
    speeds = ", x".join(map(str, args.factors))
    print(f"wrote {args.output}: {count} cuts (the originals and x{speeds})")


if __name__ == "__main__":
    main()

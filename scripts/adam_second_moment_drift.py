"""How far AdamW's second moment moves during a run, from its epoch checkpoints; prints one
JSON line per checkpoint after the reference one.

    python scripts/adam_second_moment_drift.py exp/benchmark_dgc/dense_adamw_e24 [--reference 1]

A second moment frozen at some step (DGC's AdamW runs) is right as long as
every coordinate's sqrt(v) stays near where it was then. Per checkpoint (`epoch=NN.ckpt`
of the run's `checkpoints/`): the median and the 10 % and 90 % quantiles over the
coordinates of sqrt(v_now / v_reference), and the ratio of the root mean squares (whole
model). Coordinates with v = 0 at the reference (parts without a gradient yet) are left out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from asr.inference.bundle import epoch_checkpoints

QUANTILE_SAMPLE = 1_000_000  # torch.quantile takes at most 16 M values; a sample is plenty


def second_moment(checkpoint: Path) -> tuple[int, torch.Tensor]:
    """The optimizer step and every `exp_avg_sq` of an AdamW checkpoint, flat in state order."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    per_param = state["optimizer_states"][0]["state"]
    if not per_param or "exp_avg_sq" not in next(iter(per_param.values())):
        raise SystemExit(f"{checkpoint}: no AdamW second moment in its optimizer state")
    flat = torch.cat([per_param[k]["exp_avg_sq"].flatten().double() for k in sorted(per_param)])
    return int(state["global_step"]), flat


def drift(reference: torch.Tensor, now: torch.Tensor) -> dict[str, float]:
    """Quantiles of sqrt(now / reference) over the coordinates, and the ratio of the RMS."""
    known = reference > 0
    ratio = (now[known] / reference[known]).sqrt()
    generator = torch.Generator().manual_seed(0)
    if ratio.numel() > QUANTILE_SAMPLE:
        ratio = ratio[torch.randint(ratio.numel(), (QUANTILE_SAMPLE,), generator=generator)]
    q10, median, q90 = torch.quantile(ratio, torch.tensor([0.1, 0.5, 0.9], dtype=ratio.dtype))
    return {
        "sqrt_ratio_q10": round(float(q10), 3),
        "sqrt_ratio_median": round(float(median), 3),
        "sqrt_ratio_q90": round(float(q90), 3),
        "rms_ratio": round(float((now.sum() / reference.sum()).sqrt()), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="an experiment directory with checkpoints/")
    parser.add_argument("--reference", type=int, default=1, help="epoch of the reference")
    args = parser.parse_args()
    epoch_of = epoch_checkpoints(args.run / "checkpoints")
    if not epoch_of:
        raise SystemExit(f"{args.run / 'checkpoints'}: no epoch=NN.ckpt files")
    if args.reference not in epoch_of:
        raise SystemExit(f"no epoch={args.reference:02d}.ckpt in {args.run / 'checkpoints'}")
    reference_step, reference = second_moment(epoch_of[args.reference])
    for epoch in sorted(e for e in epoch_of if e > args.reference):
        step, now = second_moment(epoch_of[epoch])
        record = {"epoch": epoch, "step": step, "reference_step": reference_step}
        print(json.dumps({**record, **drift(reference, now)}), flush=True)


if __name__ == "__main__":
    main()

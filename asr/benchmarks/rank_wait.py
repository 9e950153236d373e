"""The share of each training step that each rank spent waiting in DDP's gradient all-reduce,
from the step times `debug.step_times_dir` records (`asr.training.step_times`): for
`scripts/benchmark_rank_wait.py`."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def read_steps(step_times_dir: Path, rank: int) -> list[dict[str, Any]]:
    """The step records rank `rank` wrote, in order."""
    text = (step_times_dir / f"rank{rank}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def rank_wait(steps: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """One rank's steps after the first `warmup`: the mean of allreduce_wait_s / step_s
    (None where the wait was not timed), of the wait and of step_s, and how many steps it
    recorded in all."""
    timed = [
        s for s in steps[warmup:] if s["step_s"] is not None and s["allreduce_wait_s"] is not None
    ]
    measured = [s["step_s"] for s in steps[warmup:] if s["step_s"] is not None]
    return {
        "steps": len(steps),
        "wait_share": statistics.fmean(s["allreduce_wait_s"] / s["step_s"] for s in timed)
        if timed
        else None,
        "wait_seconds": statistics.fmean(s["allreduce_wait_s"] for s in timed) if timed else None,
        "step_seconds": statistics.fmean(measured) if measured else None,
    }


def rank_waits(step_times_dir: Path, processes: int, warmup: int) -> dict[str, Any]:
    """Every rank's `rank_wait`, and their means over the ranks: `wait_share` (the share of
    a step spent waiting in the all-reduce) and `step_seconds`."""
    ranks = [rank_wait(read_steps(step_times_dir, r), warmup) for r in range(processes)]
    shares = [r["wait_share"] for r in ranks]
    step_seconds = [r["step_seconds"] for r in ranks]
    return {
        "steps_per_rank": [r["steps"] for r in ranks],
        "wait_share": _mean(shares),
        "wait_share_per_rank": [_round(s) for s in shares],
        "wait_seconds_per_rank": [_round(r["wait_seconds"]) for r in ranks],
        "step_seconds_mean": _mean(step_seconds),
    }


def _mean(values: list[float | None]) -> float | None:
    return None if None in values or not values else _round(statistics.fmean(values))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)

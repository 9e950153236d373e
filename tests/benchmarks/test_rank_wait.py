"""The rank-wait benchmark's summary of the step times: the share of each step a rank
waited in the all-reduce, after the warm-up steps, per rank and over the ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asr.benchmarks.rank_wait import rank_waits


def write_steps(folder: Path, rank: int, steps: list[tuple[float | None, float | None]]) -> None:
    records = [
        {"step": i + 1, "step_s": seconds, "allreduce_wait_s": wait}
        for i, (seconds, wait) in enumerate(steps)
    ]
    (folder / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_shares_are_means_of_wait_over_step_seconds_after_the_warm_up(tmp_path: Path) -> None:
    write_steps(tmp_path, 0, [(None, 9.0), (5.0, 4.0), (1.0, 0.5), (2.0, 0.5)])
    write_steps(tmp_path, 1, [(None, 9.0), (5.0, 4.0), (1.0, 0.0), (2.0, 0.0)])
    summary = rank_waits(tmp_path, processes=2, warmup=2)
    assert summary["steps_per_rank"] == [4, 4]
    assert summary["wait_share_per_rank"] == [pytest.approx((0.5 + 0.25) / 2), 0.0]
    assert summary["wait_seconds_per_rank"] == [0.5, 0.0]
    assert summary["wait_share"] == pytest.approx(0.375 / 2, abs=1e-4)
    assert summary["step_seconds_mean"] == 1.5


def test_without_a_timed_allreduce_the_share_is_none(tmp_path: Path) -> None:
    write_steps(tmp_path, 0, [(None, None), (1.0, None)])
    summary = rank_waits(tmp_path, processes=1, warmup=0)
    assert summary["wait_share"] is None and summary["wait_share_per_rank"] == [None]
    assert summary["step_seconds_mean"] == 1.0

"""Fixtures of the multi-process tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("hook_worker.py")
GOSSIP_WORKER = Path(__file__).with_name("gossip_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def _run_ranks(
    tmp_path: Path,
    mode: str,
    steps: int,
    world: int = 2,
    worker: Path = WORKER,
    extra: tuple[str, ...] = (),
) -> list[dict]:
    name = f"{worker.stem}-{mode}-{world}"
    out = tmp_path / name
    out.mkdir()
    init = tmp_path / f"{name}.init"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(worker),
                str(r),
                str(world),
                str(init),
                str(out),
                mode,
                str(steps),
                *extra,
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        )
        for r in range(world)
    ]
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, err[-3000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.fixture
def run_ranks() -> Callable[..., list[dict]]:
    """`run_ranks(tmp_path, mode, steps, world=2)`: run hook_worker.py's `mode` on `world`
    real processes over gloo (2 minutes at most) and return each rank's record."""
    return _run_ranks


@pytest.fixture
def run_gossip() -> Callable[..., list[dict]]:
    """`run_gossip(tmp_path, mode, steps, world, lr)`: run gossip_worker.py's `mode` on
    `world` real processes over gloo and return each rank's record."""

    def run(tmp_path: Path, mode: str, steps: int, world: int, lr: float) -> list[dict]:
        return _run_ranks(tmp_path, mode, steps, world, GOSSIP_WORKER, (str(lr),))

    return run

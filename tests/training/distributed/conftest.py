"""Fixtures of the multi-process tests."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("hook_worker.py")
GOSSIP_WORKER = Path(__file__).with_name("gossip_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def _run_workers(commands: list[list[str]], timeout: float) -> None:
    """Start every command at once (one per rank, one thread each) and wait for all: a
    failure or a hang (`timeout` seconds) fails the test with the failing rank's stderr."""
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True, env=env)
        for command in commands
    ]
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, err[-3000:]


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
    command = [sys.executable, str(worker)]
    _run_workers(
        [
            [*command, str(r), str(world), str(init), str(out), mode, str(steps), *extra]
            for r in range(world)
        ],
        timeout=120,
    )
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


@pytest.fixture
def run_workers() -> Callable[[list[list[str]], float], None]:
    """`run_workers(commands, timeout)`: run one process per command at once, as ranks."""
    return _run_workers


@pytest.fixture
def train_two_ranks(train_overrides) -> Callable[..., list[dict[str, str]]]:
    """`train_two_ranks(exp_dir, *overrides)`: `asr-train` on the tiny corpus with the demo
    preset, 2 CPU processes over gloo (one thread each), the transducer loss from the first
    step, no test (5 minutes at most); returns the rows of its metrics.csv files, every
    version in order."""

    def train(exp_dir: Path, *extra: str) -> list[dict[str, str]]:
        command = [
            str(Path(sys.executable).parent / "asr-train"),
            *train_overrides(exp_dir),
            "experiment=demo",
            "trainer=cpu_ddp",
            "trainer.devices=2",
            "model.loss.transducer_start_step=0",
            "run_test=false",
            *extra,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        rows: list[dict[str, str]] = []
        for path in sorted((exp_dir / "csv").glob("version_*/metrics.csv")):
            with open(path) as f:
                rows += list(csv.DictReader(f))
        return rows

    return train

"""Fixtures of the multi-process tests."""

from __future__ import annotations

import csv
import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

RANK_RUNNER = Path(__file__).with_name("rank_runner.py")
sys.path.insert(0, str(Path(__file__).parent))  # processes.py, for the test modules here
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
    tmp_path: Path, scenario: Callable[..., dict], steps: int, world: int = 2, **params: Any
) -> list[dict]:
    out = Path(tempfile.mkdtemp(prefix=f"{scenario.__name__}-{world}-", dir=tmp_path))
    init = out / "init"
    source = inspect.getsourcefile(scenario)
    command = [sys.executable, str(RANK_RUNNER)]
    _run_workers(
        [
            [*command, str(r), str(world), str(init), str(out), source, scenario.__name__]
            + [str(steps), json.dumps(params)]
            for r in range(world)
        ],
        timeout=120,
    )
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.fixture
def run_ranks() -> Callable[..., list[dict]]:
    """`run_ranks(tmp_path, scenario, steps, world=2, **params)`: run the scenario function
    `scenario(rank, world, out_dir, steps, **params)` (defined in a test module, `params`
    JSON) on `world` real processes over gloo (2 minutes at most) and return each rank's
    record."""
    return _run_ranks


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

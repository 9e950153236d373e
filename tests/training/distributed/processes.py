"""Real training processes for the multi-process tests: `ddp_worker.py` command lines, run
to their end or killed with -9 once a checkpoint holds enough steps, and the per-rank
records they write. Imported by test modules of this folder (its conftest puts the folder
on `sys.path`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("ddp_worker.py")
BIN = Path(sys.executable).parent
TIMEOUT = 300  # seconds for any one launch: a hang fails the test instead of the suite
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def worker(record: Path, overrides: list[str], *extra: str) -> list[str]:
    """The command line of `ddp_worker.py` recording into `record`."""
    return [sys.executable, str(WORKER), "--record", str(record), *extra, *overrides]


def run(command: list[str], log: Path, env: dict | None = None) -> None:
    """Run `command` to its end (`TIMEOUT` at most), its output in `log`; it must succeed."""
    with open(log, "w") as out:
        done = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, env=env or ENV, timeout=TIMEOUT
        )
    assert done.returncode == 0, log.read_text()[-3000:]


def start(command: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start `command` in its own session (so that killpg reaches all its processes)."""
    with open(log, "w") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env or ENV, start_new_session=True
        )


def records(record: Path, world_size: int = 2) -> list[dict]:
    """What each rank of a `ddp_worker.py` run wrote."""
    return [json.loads((record / f"rank{r}.json").read_text()) for r in range(world_size)]


def checkpoint_step(ckpt: Path) -> int:
    """The optimizer steps `ckpt` holds; -1 while it is missing or half written."""
    try:
        return torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"]
    except (FileNotFoundError, EOFError, RuntimeError):
        return -1


def kill_when_checkpointed(command: list[str], ckpt: Path, step: int, log: Path) -> None:
    """Start `command` in its own session; kill -9 all its processes once `ckpt` holds at
    least `step` steps."""
    proc = start(command, log)
    try:
        deadline, seen = time.monotonic() + TIMEOUT, None
        while time.monotonic() < deadline and proc.poll() is None:
            mtime = ckpt.stat().st_mtime if ckpt.exists() else None
            if mtime != seen and (seen := mtime) and checkpoint_step(ckpt) >= step:
                break
            time.sleep(0.1)
        assert proc.poll() is None, f"finished before step {step}: {log.read_text()[-2000:]}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

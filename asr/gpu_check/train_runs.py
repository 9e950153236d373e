"""`asr-train` runs of the GPU check's training sections (`ddp`, `ssl`, `streaming`).

Each section starts its runs as subprocesses, together (Python and Lightning's imports
dominate a run), on the noise corpus (`asr.gpu_check.noise_corpus`), each writing its
output to a log file in the section's work directory: `MAX_STEPS` optimizer steps under
1-process DDP, a validation every `VALIDATE_EVERY`, CSV metrics of every step. Here: the
overrides every run shares, starting and waiting for runs, and what every run must show.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from asr.data.corpus import CorpusDir
from asr.gpu_check.noise_corpus import DEV, TRAIN
from asr.gpu_check.report import Report, SectionOptions

MAX_STEPS = 6
VALIDATE_EVERY = 3  # training batches between validations: 2 in a run
TINY_MODEL = (
    "experiment=demo",
    "model.encoder.d_model=64",
    "model.encoder.num_layers=2",
    "model.encoder.num_heads=2",
    "model.predictor.embed_dim=64",
    "model.predictor.hidden_dim=64",
    "model.joiner.joint_dim=64",
    # the transducer loss from the first step: variance_freeze_step must come after
    # the CTC-only warm-up (check_variance_freeze), and the GPU presets have none
    "model.loss.transducer_start_step=0",
    "~batches",  # the demo's shipped buckets fit its corpus, not the noise: data.sampler's own
)
BACKENDS = {"cuda": "nccl", "cpu": "gloo"}
RUN_TARGET_S = {"cuda": 25.0, "cpu": 60.0}  # wall seconds per run (both run at once)
STARTUP_S = 20.0  # of the section's limit: its imports, the corpus and the records after the runs
LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class TrainRun:
    """One `asr-train` run of the section: `name` (its log and exp dir), what it checks,
    whether it runs the DGC hook (`dgc`) and its own overrides."""

    name: str
    checks: str
    dgc: bool = False
    overrides: tuple[str, ...] = ()


PRECISIONS = {"cuda": "bf16-mixed", "cpu": "32-true"}  # what trainer.precision=auto must pick


def device_overrides(device: str) -> tuple[str, ...]:
    """The trainer on `device`, with `trainer.precision=auto` (bf16-mixed where the device
    has bf16 arithmetic: the GPU); one thread on the CPU, where the two runs share the cores
    (with torch's default of 2 threads, one run alone made 10-20x fewer steps per second on
    a shared 2-core machine)."""
    if device == "cuda":
        return ("trainer.accelerator=gpu", "trainer.precision=auto")
    return ("trainer.accelerator=cpu", "trainer.precision=auto", "distributed.cpu_threads=1")


def run_overrides(
    corpus: CorpusDir, exp_dir: Path, device: str, tokenizer: Path | None
) -> list[str]:
    """What every training run of the check shares: the noise corpus (features from the
    audio; `tokenizer` None: audio alone), 1-process DDP, `MAX_STEPS` steps with a
    validation every `VALIDATE_EVERY`, CSV metrics of every step."""
    return [
        f"data_dir={corpus.root}",
        f"exp_dir={exp_dir}",
        f"data.tokenizer={tokenizer if tokenizer is not None else 'null'}",
        f"data.train_cuts=[{corpus.cuts(TRAIN)}]",
        f"data.valid_cuts=[{corpus.cuts(DEV)}]",
        "data.features.source=on_the_fly",
        "data.sampler.max_duration=10",
        "data.sampler.max_cut_duration=10",
        "data.sampler.num_buckets=4",
        "data.num_workers=0",
        "optim.scheduler.warmup_steps=5",
        "logger=csv",
        "run_test=false",
        "resume=false",
        f"trainer.max_steps={MAX_STEPS}",
        f"+trainer.val_check_interval={VALIDATE_EVERY}",  # greedy decoding and WER mid-run
        "trainer.log_every_n_steps=1",
        "trainer.devices=1",
        "trainer.strategy=ddp",
        *device_overrides(device),
    ]


def column(rows: list[dict[str, str]], name: str) -> list[tuple[int, float]]:
    """(step, value) of every row that has `name`."""
    return [(int(r["step"]), float(r[name])) for r in rows if r.get(name)]


def tail(text: str) -> str:
    return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])


def check_common(
    report: Report, what: str, device: str, exit_code: int | None, log: Path, facts: dict
) -> bool:
    """Fail on what every training run of the check must show (`facts`: exit code aside,
    `backend`, `precision`, `validations`, `optimizer_steps`, `losses_finite`); False when
    the run did not end well, and nothing else was checked."""
    if exit_code != 0:
        ended = "was stopped at its time limit" if exit_code is None else f"exited {exit_code}"
        text = log.read_text(errors="replace") if log.is_file() else ""
        report.fail(f"{what} {ended}; last lines of {log}:\n{tail(text)}")
        return False
    expected = BACKENDS[device]
    if facts["backend"] != expected:
        report.fail(f"{what}: distributed backend {facts['backend']}, expected {expected} ({log})")
    if facts["precision"] != PRECISIONS[device]:
        report.fail(f"{what}: precision {facts['precision']}, expected {PRECISIONS[device]}")
    if facts["validations"] != MAX_STEPS // VALIDATE_EVERY:
        report.fail(f"{what}: {facts['validations']} validations, expected 2 ({log})")
    if facts["optimizer_steps"] != MAX_STEPS:
        report.fail(f"{what}: {facts['optimizer_steps']} optimizer steps, expected {MAX_STEPS}")
    if not facts["losses_finite"]:
        report.fail(f"{what}: training losses not all finite: {facts['losses']}")
    return True


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports of this machine (all held open while they are read)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def launch(command: list[str], cwd: Path, log: IO[str], port: int) -> subprocess.Popen:
    """Start `command` with its output in `log`, its process group's rendezvous on `port`
    (the two runs start at once: each its own port, whatever MASTER_PORT says here)."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONUNBUFFERED": "1",
        "WANDB_MODE": "disabled",
    }
    return subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)


@dataclass
class Started:
    """A run under way, then ended: `exit_code` None while it runs or when it was killed
    at the deadline."""

    run: TrainRun
    process: subprocess.Popen
    began: float
    overrides: list[str]
    exp_dir: Path
    log: Path
    exit_code: int | None = None
    wall_s: float = 0.0


def ended(runs: list[Started], deadline: float) -> Iterator[Started]:
    """Each run as it ends (in that order), with its exit code and wall seconds; the runs
    still going at `deadline` are killed and come last."""
    pending = list(runs)
    while pending:
        for started in list(pending):
            started.exit_code = started.process.poll()
            timed_out = time.monotonic() >= deadline
            if started.exit_code is None and timed_out:
                started.process.kill()
                started.process.wait()
            if started.exit_code is not None or timed_out:
                started.wall_s = time.monotonic() - started.began
                pending.remove(started)
                yield started
        if pending:
            time.sleep(0.1)


def start_training(
    train_run: TrainRun, overrides: list[str], exp_dir: Path, options: SectionOptions, port: int
) -> Started:
    """`asr-train OVERRIDES` in a fresh `exp_dir`, its output in WORK/<name>.log."""
    work = Path(options.work_dir)
    shutil.rmtree(exp_dir, ignore_errors=True)
    log = work / f"{train_run.name}.log"
    command = [sys.executable, "-m", "asr.training.command", *overrides]
    with open(log, "w") as out:  # the child holds its own descriptor
        process = launch(command, work, out, port)
    return Started(train_run, process, time.monotonic(), overrides, exp_dir, log)

"""GPU check, section `ddp`: `asr-train` under 1-process DDP, with and without the DGC hook.

A one-process run cannot show that several GPUs agree, but it runs everything the
distributed path adds on a GPU at least once: the NCCL process group (gloo in a CPU
rehearsal), `HookedDDPStrategy` and, with `distributed/compression=dgc`, the hook's dense
AdamW steps (all-reduce), its sparse steps ((index, value) pairs all-gathered as bytes),
a bf16 refresh of the frozen second moment, and the per-rank hook state written beside
`last.ckpt`. AD-PSGD and H-ADPSGD need two processes: the runner's summary lists them as
not executed.

Both runs train a tiny transducer (`experiment=demo`, shrunk) for `MAX_STEPS` optimizer
steps on a corpus of noise (`asr.gpu_check.noise_corpus`; no speech synthesizer), as
subprocesses started together (Python and Lightning's imports dominate a run), each
writing its output to a log file in the work directory. Each run's record says what its
log and metrics show: exit code, wall seconds, optimizer steps, the distributed backend,
the training losses and, with DGC, every step's traffic.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from asr.data.corpus import CorpusDir, load_cuts
from asr.gpu_check.noise_corpus import DEV, TRAIN, make_noise_corpus
from asr.gpu_check.report import Report, SectionOptions
from asr.training.metrics_csv import metric_rows

MAX_STEPS = 6
VALIDATE_EVERY = 3  # training batches between validations: 2 in a run
# DGC as tests/training/distributed/test_savers.py's frozen-variance run: 2 dense AdamW
# steps, then one step at each of the warm-up's sparsities (75 %, 93.75 %, 98.4 %,
# 99.6 %); the third sparse step first refreshes the second moment (a bf16 all-reduce).
DGC_OVERRIDES = (
    "distributed/compression=dgc",
    "distributed.compression.variance_freeze_step=2",
    "distributed.compression.variance_refresh_steps=2",
    "distributed.compression.warmup_steps=1",
)
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
LATTICE_GIVEN_UP = "given up"  # asr.losses.lattice_choice's warning when Triton fell back


@dataclass(frozen=True)
class TrainRun:
    """One `asr-train` run of the section: `name` (its log and exp dir), what it checks,
    whether it runs the DGC hook (`dgc`) and its own overrides."""

    name: str
    checks: str
    dgc: bool = False
    overrides: tuple[str, ...] = ()


RUNS = (
    TrainRun("ddp", "plain DDP"),
    TrainRun("ddp_dgc", "DDP with the DGC communication hook", True, DGC_OVERRIDES),
)


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


def train_overrides(corpus: CorpusDir, exp_dir: Path, device: str) -> list[str]:
    """The overrides both runs share: the tiny transducer on the noise corpus."""
    return [*TINY_MODEL, *run_overrides(corpus, exp_dir, device, corpus.tokenizer)]


def column(rows: list[dict[str, str]], name: str) -> list[tuple[int, float]]:
    """(step, value) of every row that has `name`."""
    return [(int(r["step"]), float(r[name])) for r in rows if r.get(name)]


def dgc_traffic(rows: list[dict[str, str]]) -> dict[str, Any]:
    """What `CompressionMonitor` logged per optimizer step, and how many steps were sparse
    (this rank's payload smaller than its gradient buckets: at any number of ranks, one
    included, where the ring bytes are all 0)."""
    payload = [v for _, v in column(rows, "comm/payload_bytes")]
    buckets = [v for _, v in column(rows, "comm/bucket_bytes")]
    return {
        "payload_bytes": payload,
        "bucket_bytes": buckets,
        "sent_bytes": [v for _, v in column(rows, "comm/sent_bytes")],
        "dense_bytes": [v for _, v in column(rows, "comm/dense_bytes")],
        "sparsity": [v for _, v in column(rows, "comm/sparsity")],
        "compression": [v for _, v in column(rows, "comm/compression")],
        "sparse_steps": sum(p < b for p, b in zip(payload, buckets, strict=False)),
    }


def summarize(run: TrainRun, log_text: str, rows: list[dict[str, str]]) -> dict[str, Any]:
    """What a finished run's log and metrics show."""
    backend = re.search(r"distributed_backend=(\w+)", log_text)
    precision = re.search(r"precision: (\S+)", log_text)
    losses = column(rows, "train/loss")
    out: dict[str, Any] = {
        "backend": backend.group(1) if backend else None,
        "precision": precision.group(1) if precision else None,
        "validations": len(column(rows, "val/wer")),
        "optimizer_steps": len({step for step, _ in losses}),
        "losses": [loss for _, loss in losses],
        "losses_finite": bool(losses) and all(math.isfinite(loss) for _, loss in losses),
        "lattice_given_up": LATTICE_GIVEN_UP in log_text,
    }
    if run.dgc:
        out["dgc"] = dgc_traffic(rows)
    return out


def rank_state_saved(exp_dir: Path) -> bool:
    """Whether rank 0 wrote its DGC hook state beside the run's resume checkpoint."""
    # here, not at the top: it imports Lightning, which only the DGC run's record needs
    from asr.training.checkpointing import RESUME_CHECKPOINT
    from asr.training.distributed.savers.dgc_state import rank_state_path

    return rank_state_path(exp_dir / "checkpoints" / RESUME_CHECKPOINT, 0).is_file()


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


def check_run(
    report: Report, run: TrainRun, device: str, exit_code: int | None, log: Path, facts: dict
) -> None:
    """Fail or warn on what `facts` (from `summarize`) show of `run`."""
    what = f"{run.name} ({run.checks})"
    if not check_common(report, what, device, exit_code, log, facts):
        return
    if facts["lattice_given_up"]:
        report.warn(f"{what}: the Triton lattice kernels were given up (see {log})")
    if run.dgc and facts["dgc"]["sparse_steps"] == 0:
        report.fail(f"{what}: no sparse step: the DGC hook sent every gradient dense ({log})")
    if run.dgc and not facts["dgc"]["rank_state_saved"]:
        report.fail(f"{what}: no DGC hook state beside last.ckpt ({log})")


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


def start_run(
    train_run: TrainRun, corpus: CorpusDir, options: SectionOptions, port: int
) -> Started:
    """`asr-train` with `train_run`'s overrides, its output in WORK/<name>.log."""
    exp_dir = Path(options.work_dir) / f"exp_{train_run.name}"
    overrides = [*train_overrides(corpus, exp_dir, options.device), *train_run.overrides]
    return start_training(train_run, overrides, exp_dir, options, port)


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


def report_run(report: Report, started: Started, device: str) -> None:
    """The record of an ended run, and its failures and warnings."""
    train_run = started.run
    facts = summarize(
        train_run, started.log.read_text(errors="replace"), metric_rows(started.exp_dir)
    )
    if train_run.dgc:
        facts["dgc"]["rank_state_saved"] = rank_state_saved(started.exp_dir)
    report.record(
        "train_run",
        run=train_run.name,
        checks=train_run.checks,
        exit_code=started.exit_code,
        wall_s=started.wall_s,
        max_steps=MAX_STEPS,
        **facts,
        log=started.log,
        overrides=started.overrides,
    )
    check_run(report, train_run, device, started.exit_code, started.log, facts)
    target = RUN_TARGET_S[device]
    if started.exit_code == 0 and started.wall_s > target:
        report.warn(f"{train_run.name}: took {started.wall_s:.1f} s, more than {target:.0f} s")


def run(report: Report, options: SectionOptions) -> None:
    began = time.monotonic()
    work = Path(options.work_dir)
    shutil.rmtree(work / "corpus", ignore_errors=True)
    with contextlib.redirect_stdout(sys.stderr):  # the manifests' progress bars
        corpus = make_noise_corpus(work / "corpus")
    durations = {part: [c.duration for c in load_cuts(corpus.cuts(part))] for part in (TRAIN, DEV)}
    report.record(
        "corpus",
        root=corpus.root,
        utterances={part: len(d) for part, d in durations.items()},
        audio_seconds={part: sum(d) for part, d in durations.items()},
        vocab_size=corpus.vocab_size,
        seconds=time.monotonic() - began,
    )
    deadline = began + options.limit_s - STARTUP_S
    ports = free_ports(len(RUNS))
    runs = [start_run(r, corpus, options, port) for r, port in zip(RUNS, ports, strict=True)]
    try:
        for started in ended(runs, deadline):
            report_run(report, started, options.device)
    finally:
        for started in runs:
            if started.process.poll() is None:
                started.process.kill()
                started.process.wait()

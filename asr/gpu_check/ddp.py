"""GPU check, section `ddp`: `asr-train` under 1-process DDP, with and without the DGC hook.

A one-process run cannot show that several GPUs agree, but it runs everything the
distributed path adds on a GPU at least once: the NCCL process group (gloo in a CPU
rehearsal), `HookedDDPStrategy` and, with `distributed/compression=dgc`, the hook's dense
AdamW steps (all-reduce), its sparse steps ((index, value) pairs all-gathered as bytes),
a bf16 refresh of the frozen second moment, and the per-rank hook state written beside
`last.ckpt`. AD-PSGD and H-ADPSGD need two processes: the runner's summary lists them as
not executed.

Both runs train a tiny transducer (`experiment=demo`, shrunk) on a corpus of noise (no
speech synthesizer), as `asr.gpu_check.train_runs` starts them. Each run's record says what
its log and metrics show: exit code, wall seconds, optimizer steps, the distributed backend,
the training losses and, with DGC, every step's traffic.
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from asr.data.corpus import CorpusDir, load_cuts
from asr.gpu_check.noise_corpus import DEV, TRAIN, make_noise_corpus
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.train_runs import (
    MAX_STEPS,
    RUN_TARGET_S,
    STARTUP_S,
    TINY_MODEL,
    Started,
    TrainRun,
    check_common,
    column,
    ended,
    free_ports,
    run_overrides,
    start_training,
)
from asr.training.metrics_csv import metric_rows

# DGC as tests/training/distributed/test_savers.py's frozen-variance run: 2 dense AdamW
# steps, then one step at each of the warm-up's sparsities (75 %, 93.75 %, 98.4 %,
# 99.6 %); the third sparse step first refreshes the second moment (a bf16 all-reduce).
DGC_OVERRIDES = (
    "distributed/compression=dgc",
    "distributed.compression.variance_freeze_step=2",
    "distributed.compression.variance_refresh_steps=2",
    "distributed.compression.warmup_steps=1",
)
LATTICE_GIVEN_UP = "given up"  # asr.losses.lattice_choice's warning when Triton fell back


RUNS = (
    TrainRun("ddp", "plain DDP"),
    TrainRun("ddp_dgc", "DDP with the DGC communication hook", True, DGC_OVERRIDES),
)


def train_overrides(corpus: CorpusDir, exp_dir: Path, device: str) -> list[str]:
    """The overrides both runs share: the tiny transducer on the noise corpus."""
    return [*TINY_MODEL, *run_overrides(corpus, exp_dir, device, corpus.tokenizer)]


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
    from asr.training.distributed.communication.dgc.state import rank_state_path

    return rank_state_path(exp_dir / "checkpoints" / RESUME_CHECKPOINT, 0).is_file()


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


def start_run(
    train_run: TrainRun, corpus: CorpusDir, options: SectionOptions, port: int
) -> Started:
    """`asr-train` with `train_run`'s overrides, its output in WORK/<name>.log."""
    exp_dir = Path(options.work_dir) / f"exp_{train_run.name}"
    overrides = [*train_overrides(corpus, exp_dir, options.device), *train_run.overrides]
    return start_training(train_run, overrides, exp_dir, options, port)


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

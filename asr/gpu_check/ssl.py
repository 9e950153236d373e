"""GPU check, section `ssl`: both pre-training objectives through `asr-train` under bf16.

`experiment=demo_ssl_best_rq` and `experiment=demo_ssl_w2v_bert`, shrunk as the `ddp`
section shrinks the transducer, pre-train for `MAX_STEPS` optimizer steps on the noise
corpus's audio (no tokenizer) under 1-process DDP with `trainer.precision=auto`: on a GPU
that is bf16-mixed, so the Gumbel quantizer's fp32 logits and noise inside CUDA autocast,
the random-projection quantizer's buffers on the device, span masking and the contrastive
and masked-prediction losses all run as a GPU user's pre-training runs them. Both runs start
together; each record says what the run's log and metrics show: exit code, wall seconds,
optimizer steps, backend, precision, every training loss, the validations (by loss: a
pre-training run decodes nothing) and which loss terms were logged.
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

from asr.data.corpus import CorpusDir
from asr.gpu_check.noise_corpus import make_noise_corpus
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.train_runs import (
    MAX_STEPS,
    RUN_TARGET_S,
    STARTUP_S,
    TrainRun,
    check_common,
    column,
    ended,
    free_ports,
    run_overrides,
    start_training,
)
from asr.training.metrics_csv import metric_rows

TINY_ENCODER = (
    "model.encoder.d_model=64",
    "model.encoder.num_layers=2",  # w2v-BERT: one contrastive layer, one MLM layer
    "model.encoder.num_heads=2",
    "model.best_rq.num_codes=64",
    "model.w2v_bert.code_dim=32",
    "model.w2v_bert.num_codes=16",
    "model.loss.num_distractors=10",
)
RUNS = (
    TrainRun("ssl_best_rq", "BEST-RQ pre-training", overrides=("experiment=demo_ssl_best_rq",)),
    TrainRun("ssl_w2v_bert", "w2v-BERT pre-training", overrides=("experiment=demo_ssl_w2v_bert",)),
)
TERMS = {  # train/<term> each run must log
    "ssl_best_rq": ("loss", "mlm", "mlm_accuracy", "code_use"),
    "ssl_w2v_bert": (
        "loss", "contrastive", "diversity", "mlm", "contrastive_accuracy", "mlm_accuracy",
        "perplexity", "code_use", "temperature",
    ),
}  # fmt: skip


def train_overrides(corpus: CorpusDir, exp_dir: Path, device: str) -> list[str]:
    """What both runs share: the shrunk encoder on the noise corpus's audio, no tokenizer."""
    return [*TINY_ENCODER, *run_overrides(corpus, exp_dir, device, tokenizer=None)]


def summarize(run: TrainRun, log_text: str, rows: list[dict[str, str]]) -> dict[str, Any]:
    """What a finished pre-training run's log and metrics show."""
    backend = re.search(r"distributed_backend=(\w+)", log_text)
    precision = re.search(r"precision: (\S+)", log_text)
    losses = column(rows, "train/loss")
    logged = set().union(*rows) if rows else set()
    return {
        "backend": backend.group(1) if backend else None,
        "precision": precision.group(1) if precision else None,
        "validations": len(column(rows, "val/loss")),
        "decoded": "val/wer" in logged,
        "optimizer_steps": len({step for step, _ in losses}),
        "losses": [loss for _, loss in losses],
        "losses_finite": bool(losses) and all(math.isfinite(loss) for _, loss in losses),
        "terms_missing": [t for t in TERMS[run.name] if f"train/{t}" not in logged],
        "code_use": [v for _, v in column(rows, "train/code_use")],
    }


def check_run(
    report: Report, run: TrainRun, device: str, exit_code: int | None, log: Path, facts: dict
) -> None:
    """Fail on what `facts` (from `summarize`) show of `run`."""
    what = f"{run.name} ({run.checks})"
    if not check_common(report, what, device, exit_code, log, facts):
        return
    if facts["decoded"]:
        report.fail(f"{what}: a pre-training run decoded (val/wer logged; {log})")
    if facts["terms_missing"]:
        report.fail(f"{what}: not logged: {facts['terms_missing']} ({log})")


def run(report: Report, options: SectionOptions) -> None:
    began = time.monotonic()
    work = Path(options.work_dir)
    shutil.rmtree(work / "corpus", ignore_errors=True)
    with contextlib.redirect_stdout(sys.stderr):  # the manifests' progress bars
        corpus = make_noise_corpus(work / "corpus")
    deadline = began + options.limit_s - STARTUP_S
    started = []
    for train_run, port in zip(RUNS, free_ports(len(RUNS)), strict=True):
        exp_dir = work / f"exp_{train_run.name}"
        overrides = [*train_overrides(corpus, exp_dir, options.device), *train_run.overrides]
        started.append(start_training(train_run, overrides, exp_dir, options, port))
    try:
        for done in ended(started, deadline):
            rows = metric_rows(done.exp_dir)
            facts = summarize(done.run, done.log.read_text(errors="replace"), rows)
            report.record(
                "train_run", run=done.run.name, checks=done.run.checks,
                exit_code=done.exit_code, wall_s=done.wall_s, max_steps=MAX_STEPS, **facts,
                log=done.log, overrides=done.overrides,
            )  # fmt: skip
            check_run(report, done.run, options.device, done.exit_code, done.log, facts)
            target = RUN_TARGET_S[options.device]
            if done.exit_code == 0 and done.wall_s > target:
                report.warn(f"{done.run.name}: took {done.wall_s:.1f} s, more than {target:.0f} s")
    finally:
        for each in started:
            if each.process.poll() is None:
                each.process.kill()
                each.process.wait()

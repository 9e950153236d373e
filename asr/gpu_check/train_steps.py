"""bf16 optimizer steps of a preset's model with random weights on worst-case batches, and
`asr-oomptimizer`'s batch-size search before them: what the check's `training` section and
the bench's `batching` and `streaming` sections run."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from asr.data.batch import Batch
from asr.gpu_check.report import Report
from asr.gpu_check.timing import synchronize
from asr.losses.lattice_choice import active_lattice
from asr.models.build import count_parameters
from asr.training.objective import Objective
from asr.training.oomptimizer import Bucket, BucketResult, search_buckets
from asr.training.probes import (
    ModelSetup,
    ProbeResult,
    build_training,
    cpu_probe,
    cuda_probe,
    worst_case_batch,
)

PRECISION = "bf16-mixed"  # the probes' and the steps' autocast (ModelSetup.precision)

TINY_MODEL = (
    "experiment=demo", "model.encoder.num_layers=1", "model.encoder.d_model=32",
    "model.encoder.num_heads=2", "model.predictor.embed_dim=32", "model.predictor.hidden_dim=32",
    "model.joiner.joint_dim=32",
    # oneDNN has no bf16 LSTM on CPUs without bf16 arithmetic ("could not create a primitive
    # descriptor"): the rehearsal's predictor is the stateless one.
    "model.predictor.kind=stateless",
)  # fmt: skip


class SearchSettings(Protocol):
    """How a batch-size search runs (a `TrainingCase`, or a GPU bench section's case)."""

    @property
    def start(self) -> int: ...  # first batch size the search tries

    @property
    def rel_tolerance(self) -> float: ...

    @property
    def max_size(self) -> int | None: ...


def random_weights_setup(cfg: DictConfig, vocab_size: int) -> ModelSetup:
    """`ModelSetup` of `cfg` at `vocab_size` in bf16-mixed, never reading `data.tokenizer`:
    the check and the bench build random weights at a fixed vocabulary, and a tokenizer left
    in the checkout (the demo's 128 pieces under data/demo) must not change or refuse it."""
    cfg = cfg.copy()
    OmegaConf.update(cfg, "data.tokenizer", None)
    return replace(ModelSetup.from_config(cfg, vocab_size), precision=PRECISION)


def training_step(
    model: torch.nn.Module,
    objective: Objective,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    step: int,
    device: str,
) -> float | None:
    """One optimizer step on `batch` (on `device`) under bf16 autocast -> its loss, or None
    when CUDA ran out of memory (the step is lost, its memory freed)."""
    try:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = objective(model, batch, step=step)["loss"]
        loss.backward()
        optimizer.step()
        return loss.item()  # waits for the step
    except torch.cuda.OutOfMemoryError:
        loss = None  # its graph
        optimizer.zero_grad(set_to_none=True)
        gc.collect()  # the exception's frames held tensors until here
        torch.cuda.empty_cache()
        return None


def train_steps(
    setup: ModelSetup, bucket: Bucket, batch_size: int, steps: int, device: str
) -> dict:
    """`steps` optimizer steps on worst-case batches of `bucket`; OOMs are counted."""
    model, objective, optimizer, step = build_training(setup, device)
    ddp_buckets = [torch.zeros_like(p) for p in model.parameters()] if setup.ddp_grad_copy else []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses, ooms = [], [], []
    for i in range(steps):
        batch = worst_case_batch(
            batch_size, bucket.max_duration, bucket.max_tokens, setup.num_mel_bins, setup.vocab_size
        ).to(device)
        synchronize(device)
        began = time.perf_counter()
        loss = training_step(model, objective, optimizer, batch, step + i, device)
        synchronize(device)
        if loss is None:
            ooms.append(i)
        else:
            losses.append(loss)
        times.append(time.perf_counter() - began)
    del ddp_buckets
    steady = times[2:] or times
    audio = batch_size * bucket.max_duration
    return {
        "parameters": count_parameters(model),
        "steps": steps,
        "oom_steps": len(ooms),
        "oom_step_indices": ooms,
        "batch_size": batch_size,
        "audio_seconds_per_step": audio,
        "seconds_per_step": statistics.median(steady),
        "audio_seconds_per_second": audio / statistics.median(steady),
        "first_step_s": times[0],
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if device == "cuda" else None,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "losses_finite": all(np.isfinite(losses)),
    }


def search_batch_sizes(
    report: Report,
    case: SearchSettings,
    setup: ModelSetup,
    buckets: list[Bucket],
    budget: int,
    device: str,
    **labels: Any,
) -> list[BucketResult]:
    """`asr-oomptimizer`'s search over `buckets` under `budget` (from `case.start`, to
    `case.rel_tolerance`, at most `case.max_size`), every probe reported; `labels` are
    added to each record."""

    def on_probe(bucket: Bucket, size: int, outcome: ProbeResult) -> None:
        report.record(
            "probe",
            **labels,
            max_duration=bucket.max_duration,
            max_tokens=bucket.max_tokens,
            batch_size=size,
            fits=outcome.fits,
            peak_bytes=outcome.peak_bytes,
            seconds=outcome.seconds,
            reason=outcome.reason,
        )

    began = time.perf_counter()
    probing = cuda_probe(setup, budget) if device == "cuda" else cpu_probe(setup, budget, 1)
    with probing as probe:
        results = search_buckets(
            buckets,
            probe,
            start=case.start,
            rel_tolerance=case.rel_tolerance,
            max_size=case.max_size,
            on_probe=on_probe,
        )
    report.record(
        "batch_sizes",
        **labels,
        bucket_duration_bins=[r.bucket.max_duration for r in results],
        bucket_batch_size=[r.batch_size for r in results],
        peak_bytes=[r.peak_bytes for r in results],
        probes=sum(r.probes for r in results),
        seconds=time.perf_counter() - began,
        lattice=active_lattice(setup.model["loss"]["lattice"], torch.device(device)),
    )
    return results

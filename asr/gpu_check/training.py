"""GPU check, section `training`: the `librispeech_transducer` preset (102 M parameters) in
bf16-mixed, sized by the batch-size search and then trained.

1. Bins: duration buckets estimated (`asr.data.bins.estimate_bins`) from LibriSpeech-like
   synthetic cut lengths (1-35 s), with their per-bucket tokens-per-second limits.
2. `asr-oomptimizer`'s search (`search_buckets` with `cuda_probe`: the allocator capped
   at the memory budget, `torch.cuda.OutOfMemoryError` caught) for every bucket, the
   probes' transducer loss on the lattice training will use.
3. 30 optimizer steps at the largest bucket's batch size, worst-case batches (every
   utterance at the bucket's longest duration and most tokens), under the same cap and
   with DDP's extra gradient copy held as the probes held it: audio seconds per second,
   peak memory, and the number of steps that hit CUDA OOM, which must be 0.

A rehearsal runs the same code on the CPU (forked probe processes) with a tiny model,
shorter cuts and 3 steps.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from asr.data.batch import Batch
from asr.data.bins import estimate_bins
from asr.data.buckets import cut_lengths
from asr.data.synthetic_cuts import synthetic_cuts
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.timing import synchronize
from asr.losses.lattice_choice import active_lattice
from asr.models.build import count_parameters
from asr.training.objective import Objective
from asr.training.oomptimizer import (
    Bucket,
    BucketResult,
    buckets_from_bins,
    compose_config,
    search_buckets,
)
from asr.training.probes import (
    ModelSetup,
    ProbeResult,
    build_training,
    cpu_probe,
    cuda_probe,
    worst_case_batch,
)

PRECISION = "bf16-mixed"  # the probes' and the steps' autocast (ModelSetup.precision)


class SearchSettings(Protocol):
    """How a batch-size search runs (a `TrainingCase`, or a GPU bench section's case)."""

    @property
    def start(self) -> int: ...  # first batch size the search tries

    @property
    def rel_tolerance(self) -> float: ...

    @property
    def max_size(self) -> int | None: ...


@dataclass(frozen=True)
class TrainingCase:
    overrides: tuple[str, ...]
    vocab_size: int
    num_buckets: int
    duration_scale: float  # of the synthetic cuts' 1-35 s
    steps: int
    start: int  # first batch size the search tries
    rel_tolerance: float
    max_size: int | None = None
    max_budget: int | None = None


GPU_CASE = TrainingCase(
    ("experiment=librispeech_transducer",),
    vocab_size=1024,
    num_buckets=4,
    duration_scale=1.0,
    steps=30,
    start=16,
    rel_tolerance=0.2,
)
TINY_MODEL = (
    "experiment=demo", "model.encoder.num_layers=1", "model.encoder.d_model=32",
    "model.encoder.num_heads=2", "model.predictor.embed_dim=32", "model.predictor.hidden_dim=32",
    "model.joiner.joint_dim=32",
    # oneDNN has no bf16 LSTM on CPUs without bf16 arithmetic ("could not create a primitive
    # descriptor"): the rehearsal's predictor is the stateless one.
    "model.predictor.kind=stateless",
)  # fmt: skip
REHEARSAL_CASE = TrainingCase(
    TINY_MODEL,
    vocab_size=32,
    num_buckets=2,
    duration_scale=0.15,
    steps=3,
    start=2,
    rel_tolerance=0.5,
    max_size=8,
    max_budget=512 * 2**20,
)


def random_weights_setup(cfg: DictConfig, vocab_size: int) -> ModelSetup:
    """`ModelSetup` of `cfg` at `vocab_size` in bf16-mixed, never reading `data.tokenizer`:
    the check and the bench build random weights at a fixed vocabulary, and a tokenizer left
    in the checkout (the demo's 128 pieces under data/demo) must not change or refuse it."""
    cfg = cfg.copy()
    OmegaConf.update(cfg, "data.tokenizer", None)
    return replace(ModelSetup.from_config(cfg, vocab_size), precision=PRECISION)


def synthetic_buckets(case: TrainingCase) -> tuple[list[Bucket], dict]:
    """Buckets from the lengths of 2,000 LibriSpeech-like synthetic cuts."""
    lengths = cut_lengths(synthetic_cuts(2000, seed=0, duration_scale=case.duration_scale))
    keys, _ = estimate_bins(lengths, case.num_buckets)
    buckets, _ = buckets_from_bins(keys["bucket_duration_bins"], keys["max_tps"])
    return buckets, keys


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


def run(report: Report, options: SectionOptions) -> None:
    device = options.device
    case = REHEARSAL_CASE if options.rehearsal else GPU_CASE
    budget = min(options.memory_budget, case.max_budget or options.memory_budget)
    cfg = compose_config(case.overrides)
    setup = random_weights_setup(cfg, case.vocab_size)
    buckets, keys = synthetic_buckets(case)
    report.record(
        "setup",
        overrides=case.overrides,
        precision=PRECISION,
        memory_budget_bytes=budget,
        bucket_duration_bins=keys["bucket_duration_bins"],
        max_tokens=[b.max_tokens for b in buckets],
    )

    results = search_batch_sizes(report, case, setup, buckets, budget, device)
    largest = results[-1]
    if device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(budget / total)
    steps = train_steps(setup, largest.bucket, largest.batch_size, case.steps, device)
    lattice = active_lattice(cfg.model.loss.lattice, torch.device(device))
    report.record("steps", bucket=largest.bucket.max_duration, lattice=lattice, **steps)
    if steps["oom_steps"]:
        report.fail(
            f"{steps['oom_steps']} of {steps['steps']} steps ran out of memory at the batch "
            f"size the search found ({largest.batch_size})"
        )
    if not steps["losses_finite"]:
        report.fail("a training loss was not finite")
    if "fell back" in lattice:
        report.fail(f"the transducer lattice fell back on this device: {lattice}")

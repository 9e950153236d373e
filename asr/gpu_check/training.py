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

from dataclasses import dataclass

import torch

from asr.data.bins import estimate_bins
from asr.data.buckets import cut_lengths
from asr.data.synthetic_cuts import synthetic_cuts
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.train_steps import (
    PRECISION,
    TINY_MODEL,
    random_weights_setup,
    search_batch_sizes,
    train_steps,
)
from asr.losses.lattice_choice import active_lattice
from asr.training.oomptimizer import (
    Bucket,
    buckets_from_bins,
    compose_config,
)


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


def synthetic_buckets(case: TrainingCase) -> tuple[list[Bucket], dict]:
    """Buckets from the lengths of 2,000 LibriSpeech-like synthetic cuts."""
    lengths = cut_lengths(synthetic_cuts(2000, seed=0, duration_scale=case.duration_scale))
    keys, _ = estimate_bins(lengths, case.num_buckets)
    buckets, _ = buckets_from_bins(keys["bucket_duration_bins"], keys["max_tps"])
    return buckets, keys


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

"""GPU bench, section `batching`: how much audio a training step and a second of training
take with this project's batching against the common one, for the `librispeech_transducer`
preset (102 M parameters) in bf16-mixed, with the sample-wise loss and with torchaudio's.

The claims (Żelasko et al., arXiv 2503.05931, Canary-1B's training): without 2D bucketing,
TPS filtering and an OOM-probing batch-size search, "more than 50 % of computation spent on
padding"; with them a "5x increase in average batch sizes", "4x fewer GPUs in the same
wall time or 2x shorter wall time".

Data: LibriSpeech-shaped synthetic cuts (`asr.data.synthetic_cuts`: durations 1-35 s, token
counts at LibriSpeech's rate for BPE 1,024), no audio: each step's batch is random features
and tokens of its cuts' exact lengths, made on the device before the step's clock starts
(the data pipeline is not timed). Two strategies, both on the same duration bins (equal
total duration each, `asr.data.bins.equal_total_edges`), each under the same memory cap
(`--memory-budget`, default 20 GiB, the allocator capped as `asr-train` would be):

- `buckets_1d`, the common baseline (lhotse's `DynamicBucketingSampler` as icefall and NeMo
  use it): duration buckets and one `max_duration`, the largest that does not run out of
  memory on the longest bucket: the batch-size search (`asr.training.oomptimizer`) on that
  bucket's worst case (its longest duration, the most tokens of any of its cuts), times
  the bucket's duration. lhotse closes a batch when one more cut as long as its longest
  would cross `max_duration`, so a long cut arriving late takes the padded batch past it
  (up to about twice in a 16-35 s bucket): such steps may run out of memory; they are
  counted, as a run would meet them (a run would stop; the bench goes on).
- `buckets_2d`, this project's default (`recipes/librispeech/run.sh` stages 6-7): each
  duration bucket split into token sub-buckets, the per-bucket tokens-per-second (TPS)
  filter, and the search's batch size for every bucket.

Each strategy's search runs once per loss (`model.loss.kind=samplewise` and `batched`:
torchaudio's `rnnt_loss`, whose B x T x U x V logits change what fits). Each plan's record
(`plan`) holds its sampler settings and, over one epoch of the synthetic cuts without
training, its padding and mean audio per batch (`epoch`: the whole picture, where the runs
see a few dozen batches). Then each of the four runs trains a fresh model: warm-up steps,
then up to `steps` timed steps (synchronized before and after each). Per run: mean audio
seconds per step (real audio, not padding), audio seconds per second (of the steps that did
not run out of memory, over every timed step's wall time), the padding of input frames,
tokens and transducer lattice nodes (`asr.data.buckets.padding_stats`), out-of-memory
steps. Then the ratios 2D / 1D and sample-wise / torchaudio.

Time: the issue asks 60 timed steps per run. The searches (about 60 probes; a probe builds
the model and runs a worst-case step, 1.6-2 s each on an H100 and an H200 in the GPU check)
take most of the section's limit (155 s), so each run stops at `steps` or at its share of the
time left (the section's limit less a margin, split evenly over the runs still to come,
less a run's own model build and warm-up), whichever comes first; its record says how many
steps it timed and which bound stopped it. The GPU case uses 3 duration buckets x 2 token
buckets (the recipe, 30 x 2) so that the searches fit; the longest duration bucket then
spans about 16-35 s, which pads the 1D baseline more than 30 buckets would (compare
`scripts/benchmark_batching.py`, which measures the padding of both at any bucket count
without a GPU).

torchaudio's kernels index the logits with 32-bit integers and fault the device beyond
2**31 elements (pytorch/audio#3736): at the default 20 GiB no batch of the `batched` runs
comes near (about 14 utterances of 35 s would); a budget above about 40 GiB may, and then
the section stops with a CUDA error.

A rehearsal runs the tiny transducer of the `training` section on the CPU (forked probe
processes), with shortened cuts and a few steps.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from lhotse import CutSet

from asr.data.bins import CutLengths, equal_total_edges, estimate_bins
from asr.data.buckets import build_sampler, cut_lengths, num_tokens, padding_stats
from asr.data.rank_sync import RankSynchronizedSampler
from asr.data.synthetic_cuts import synthetic_cuts
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.timing import synchronize
from asr.gpu_check.train_steps import (
    PRECISION,
    TINY_MODEL,
    random_weights_setup,
    search_batch_sizes,
    training_step,
)
from asr.losses.lattice_choice import active_lattice
from asr.training.oomptimizer import Bucket, buckets_from_bins, compose_config
from asr.training.probes import ModelSetup, build_training, random_batch

STRATEGIES = ("buckets_1d", "buckets_2d")  # the common baseline, this project's default
LOSSES = ("samplewise", "batched")  # model.loss.kind: this project's loss, torchaudio's
RUN_OVERHEAD_S = 5.0  # first guess of a run's model build and warm-up steps (then measured)
MARGIN_S = 20.0  # of the section's limit: the imports before `run`, the last run's teardown


@dataclass(frozen=True)
class BatchingCase:
    """The model, the synthetic data, the buckets, the searches (`start`, `rel_tolerance`,
    `max_size`, at most `max_budget` bytes) and the runs (`warmup_steps`, then at most
    `steps` timed steps)."""

    overrides: tuple[str, ...]
    vocab_size: int
    num_cuts: int
    duration_scale: float  # of the synthetic cuts' 1-35 s (and their token counts)
    num_buckets: int
    num_token_buckets: int
    warmup_steps: int
    steps: int
    start: int
    rel_tolerance: float
    max_size: int | None = None
    max_budget: int | None = None
    buffer_size: int = 5000


GPU_CASE = BatchingCase(
    ("experiment=librispeech_transducer",),
    vocab_size=1024,
    num_cuts=20_000,
    duration_scale=1.0,
    num_buckets=3,
    num_token_buckets=2,
    warmup_steps=3,
    steps=60,
    start=16,
    rel_tolerance=0.25,
)
REHEARSAL_CASE = BatchingCase(
    TINY_MODEL,
    vocab_size=128,  # experiment=demo's BPE: data/demo/tokenizer/bpe128.model, where it exists
    num_cuts=1000,
    duration_scale=0.15,
    num_buckets=2,
    num_token_buckets=2,
    warmup_steps=1,
    steps=6,
    start=2,
    rel_tolerance=0.5,
    max_size=8,
    max_budget=512 * 2**20,
    buffer_size=1000,
)


@dataclass(frozen=True)
class Plan:
    """One strategy's sampler settings (`data.sampler` keys) for one loss."""

    strategy: str
    loss: str
    sampler: dict[str, Any]


def endless(sampler: RankSynchronizedSampler) -> Iterator[CutSet]:
    """The sampler's batches, epoch after epoch."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from sampler
        epoch += 1


def train_run(
    setup: ModelSetup,
    plan: Plan,
    cuts: CutSet,
    case: BatchingCase,
    time_budget: float,
    device: str,
) -> dict[str, Any]:
    """A fresh model trained on `plan`'s batches: `case.warmup_steps`, then timed steps
    until `case.steps` or `time_budget` seconds of timed steps (at least one)."""
    model, objective, optimizer, step = build_training(setup, device)
    ddp_buckets = [torch.zeros_like(p) for p in model.parameters()] if setup.ddp_grad_copy else []
    batches = endless(build_sampler(cuts, plan.sampler))

    def one_step(i: int) -> tuple[CutSet, float | None, float]:
        batch_cuts = next(batches)
        batch = random_batch(
            [c.duration for c in batch_cuts],
            [num_tokens(c) for c in batch_cuts],
            setup.num_mel_bins,
            setup.vocab_size,
            device,
        )
        synchronize(device)
        began = time.perf_counter()
        loss = training_step(model, objective, optimizer, batch, step + i, device)
        synchronize(device)
        return batch_cuts, loss, time.perf_counter() - began

    warmup_ooms = sum(one_step(i)[1] is None for i in range(case.warmup_steps))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    timed, losses, seconds, oom = [], [], [], []
    while len(timed) < case.steps and (not timed or sum(seconds) < time_budget):
        batch_cuts, loss, took = one_step(case.warmup_steps + len(timed))
        timed.append(batch_cuts)
        seconds.append(took)
        oom.append(loss is None)
        if loss is not None:
            losses.append(loss)
    del ddp_buckets
    audio = [sum(c.duration for c in b) for b in timed]
    trained_audio = sum(a for a, failed in zip(audio, oom, strict=True) if not failed)
    return {
        "strategy": plan.strategy,
        "loss": plan.loss,
        "steps": len(timed),
        "stopped_by": "steps" if len(timed) >= case.steps else "time budget",
        "time_budget_s": time_budget,
        "seconds": sum(seconds),
        "median_step_s": statistics.median(seconds),
        "max_step_s": max(seconds),  # a Triton kernel compiled for a new shape shows here
        "audio_seconds_per_step": statistics.fmean(audio),
        "audio_seconds_per_second": trained_audio / sum(seconds),
        "utterances_per_step": statistics.fmean(len(b) for b in timed),
        **{k: v for k, v in padding_stats(timed).items() if k.endswith("_padding")},
        "oom_steps": sum(oom),
        "warmup_oom_steps": warmup_ooms,
        "losses_finite": bool(losses) and all(math.isfinite(x) for x in losses),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
        "lattice": active_lattice(setup.model["loss"]["lattice"], torch.device(device))
        if plan.loss == "samplewise"
        else None,
    }


def longest_1d_bucket(lengths: CutLengths, duration_bins: list[float]) -> Bucket:
    """The last duration bucket's worst case: its edge, and the most tokens of any of its
    cuts (no TPS filter in the baseline: outliers included)."""
    inside = lengths.durations > (duration_bins[-2] if len(duration_bins) > 1 else 0.0)
    return Bucket(duration_bins[-1], int(lengths.tokens[inside].max()))


def search_plans(
    report: Report,
    case: BatchingCase,
    setup: ModelSetup,
    loss: str,
    buckets: dict[str, list[Bucket]],
    common: dict[str, Any],
    budget: int,
    device: str,
) -> list[Plan]:
    """Both strategies' sampler settings for `loss`, from the batch-size searches."""
    (longest,) = search_batch_sizes(
        report, case, setup, buckets["buckets_1d"], budget, device, strategy="buckets_1d", loss=loss
    )
    max_duration = longest.batch_size * longest.bucket.max_duration
    searched = search_batch_sizes(
        report,
        replace(case, start=longest.batch_size),  # a lower bound for the longest 2D bucket
        setup,
        buckets["buckets_2d"],
        budget,
        device,
        strategy="buckets_2d",
        loss=loss,
    )
    return [
        Plan(
            "buckets_1d",
            loss,
            {**common["buckets_1d"], "max_duration": max_duration},
        ),
        Plan(
            "buckets_2d",
            loss,
            {**common["buckets_2d"], "bucket_batch_size": [r.batch_size for r in searched]},
        ),
    ]


def ratios(runs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """2D / 1D per loss and sample-wise / torchaudio per strategy, of audio seconds per
    second and per step (only where both runs exist)."""
    out: dict[str, Any] = {}
    keys = ("audio_seconds_per_second", "audio_seconds_per_step")

    def ratio(a: tuple[str, str], b: tuple[str, str]) -> dict[str, float] | None:
        if a not in runs or b not in runs:
            return None
        return {k: runs[a][k] / runs[b][k] for k in keys}

    for loss in LOSSES:
        out[f"2d_over_1d_{loss}"] = ratio(("buckets_2d", loss), ("buckets_1d", loss))
    for strategy in STRATEGIES:
        out[f"samplewise_over_torchaudio_{strategy}"] = ratio(
            (strategy, "samplewise"), (strategy, "batched")
        )
    return out


def run(report: Report, options: SectionOptions) -> None:
    began = time.monotonic()
    device = options.device
    case = REHEARSAL_CASE if options.rehearsal else GPU_CASE
    deadline = began + options.limit_s - MARGIN_S
    budget = min(options.memory_budget, case.max_budget or options.memory_budget)
    cuts = synthetic_cuts(case.num_cuts, seed=0, duration_scale=case.duration_scale)
    lengths = cut_lengths(cuts)
    duration_bins = equal_total_edges(lengths.durations, case.num_buckets)
    keys_2d, dropped = estimate_bins(lengths, case.num_buckets, case.num_token_buckets)
    bins_2d = keys_2d["bucket_duration_bins"]
    buckets = {
        "buckets_1d": [longest_1d_bucket(lengths, duration_bins)],
        "buckets_2d": buckets_from_bins(bins_2d, keys_2d["max_tps"])[0],
    }
    sampler_common = {
        "min_cut_duration": 0.0,
        "max_cut_duration": float(lengths.durations.max()),
        "buffer_size": case.buffer_size,
        "seed": 0,
    }
    common = {
        "buckets_1d": {**sampler_common, "bucket_duration_bins": duration_bins},
        "buckets_2d": {
            **sampler_common,
            "bucket_duration_bins": bins_2d,
            "max_tps": keys_2d["max_tps"],
        },
    }
    report.record(
        "setup",
        **{k: v for k, v in asdict(case).items() if k != "overrides"},
        overrides=case.overrides,
        precision=PRECISION,
        memory_budget_bytes=budget,
        device_name=torch.cuda.get_device_name() if device == "cuda" else device,
        hours=float(lengths.durations.sum() / 3600),
        mean_duration_s=float(lengths.durations.mean()),
        tokens_per_second=float(lengths.tokens.sum() / lengths.durations.sum()),
        duration_bins=duration_bins,
        bins_2d=bins_2d,
        max_tps=keys_2d["max_tps"],
        tps_dropped={"above_max": dropped.above_max, "below_min": dropped.below_min},
        longest_1d_bucket=asdict(buckets["buckets_1d"][0]),
    )
    setups, plans = {}, []
    for loss in LOSSES:
        cfg = compose_config([*case.overrides, f"model.loss.kind={loss}"])
        setups[loss] = random_weights_setup(cfg, case.vocab_size)
        found = search_plans(report, case, setups[loss], loss, buckets, common, budget, device)
        for plan in found:
            epoch = padding_stats(build_sampler(cuts, plan.sampler))
            report.record(
                "plan", strategy=plan.strategy, loss=loss, sampler=plan.sampler, epoch=epoch
            )
        plans += found
    if device == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(budget / total)
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    overhead = RUN_OVERHEAD_S  # a run's wall time besides its timed steps, the most seen
    for i, plan in enumerate(plans):
        started = time.monotonic()
        share = (deadline - started) / (len(plans) - i) - overhead
        result = train_run(setups[plan.loss], plan, cuts, case, share, device)
        wall = time.monotonic() - started
        overhead = max(overhead, wall - result["seconds"])
        runs[(plan.strategy, plan.loss)] = result
        report.record("run", **result, wall_s=wall)
        if not result["losses_finite"]:
            report.fail(f"{plan.strategy} with the {plan.loss} loss: a loss was not finite")
        if result["lattice"] and "fell back" in result["lattice"]:
            report.fail(f"the transducer lattice fell back on this device: {result['lattice']}")
        if device == "cuda":
            torch.cuda.empty_cache()
    report.record("ratios", **ratios(runs))

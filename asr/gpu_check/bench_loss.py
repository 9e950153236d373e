"""GPU bench, section `loss-headline`: the sample-wise transducer loss at the headline setting
of Braun, McDermott and Hsiao, "Neural Transducer Training: Reduced Memory Consumption with
Sample-wise Computation" (arXiv 2211.16270), beside torchaudio's `rnnt_loss`.

The claim (the paper's abstract): the transducer loss and its gradients "for a batch size of
1024, and audio length of 40 seconds, using only 6 GB of memory" (their introduction sizes
GPUs as V100 32 GB, A100/H100 80 GB). The paper's frame rate after subsampling, label
length, vocabulary and joiner width were not found in the text this bench was written from
(its abstract and introduction); what is assumed in their place, and recorded in every run:

- T = 1,000 encoder frames: 40 s at 40 ms a frame (x4 subsampling of 10 ms features, as
  this project's presets subsample);
- U = 100 tokens per utterance (2.5 a second; LibriSpeech at BPE 1,024 runs at about 3.8,
  so U = 152 would be a LibriSpeech utterance of 40 s);
- V = 1,024 (the LibriSpeech preset's BPE);
- encoder, predictor and joiner width 512; the joiner is `asr.models.transducer.Joiner`
  (two projections, tanh, output layer), every utterance at the full T and U, float32
  throughout (no autocast; torch's default float32 matmul precision, recorded).

These sizes are `PAPER` (`asr.gpu_check.loss_runs`), which the `tdt-loss` section and
`scripts/benchmark_transducer_loss.py` take too.

Measured, for the Triton lattice and for the PyTorch lattice (`lattice=triton|torch`): the
time of one loss forward + backward (gradients of the encoder and predictor outputs and of
every joiner parameter) of the whole batch, and its peak memory above the inputs (the
inputs and joiner allocated before; the gradients, alive at the end, count; the inputs'
own bytes are recorded beside, and `asr.losses.samplewise.predicted_peak_bytes`'s
prediction). Target: at most 6 GB (6e9 bytes, the stricter reading of "6 GB"); a warning if
missed. First each lattice runs on `warmup` utterances (Triton compiles its kernels), then
`probe` utterances are timed: when they predict the whole batch to take longer than the
lattice's time budget (`budget_s`, or less when the section's time runs short), the whole
batch is not run, its time is scaled from the probe (`scaled: true`) and its memory is not
measured. Beside them, torchaudio's `rnnt_loss` (`batched_transducer_loss`: the padded
B x T x (U+1) x V logits) at the same T, U, V and joiner: the largest batch that fits in
the GPU's memory (doubling, then bisecting, `torch.cuda.OutOfMemoryError` caught), its time
and peak memory at that batch. Two caps: the headline batch, and torchaudio's own limit,
logits of fewer than 2**31 elements (its kernels index them with 32-bit integers and fault
the device beyond: pytorch/audio#3736), which at these shapes is 20 utterances, likely
below what an 80 GB GPU holds; the record says which bound the batch met, and estimates
the batch the GPU's memory would hold (linear in the measured peak). A rehearsal
runs tiny shapes on the CPU (Triton interpreted; peak memory from the resident set size,
rough).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import torch

from asr.gpu_check.loss_runs import (
    PAPER,
    PAPER_ASSUMED,
    STARTUP_S,
    TARGET_BYTES,
    LossCase,
    build_joiner,
    full_length_inputs,
    measure_lattices,
    out_of_memory,
    release,
    run_facts,
    tensor_bytes,
    timed,
)
from asr.gpu_check.report import Report, SectionOptions
from asr.losses.samplewise import predicted_peak_bytes
from asr.losses.transducer import batched_transducer_loss
from asr.models.transducer import Joiner
from asr.training.oomptimizer import BatchSizeSearch

TORCHAUDIO_RESERVE_S = 25.0  # kept for torchaudio's search when a lattice is budgeted
INT32_ELEMENTS = 2**31 - 1  # torchaudio's rnnt_loss faults on larger logits (audio#3736)

REHEARSAL_CASE = LossCase(6, 16, 4, 33, 256, 256, 256, warmup=1, probe=2, budget_s=60.0)


def torchaudio_largest_batch(
    report: Report, case: LossCase, joiner: Joiner, device: str
) -> dict[str, Any] | None:
    """torchaudio's `rnnt_loss` at the case's shapes: the largest batch (at most
    `case.batch`) whose forward + backward fits, its time and peak memory; None when this
    torchaudio has no `rnnt_loss` (recorded)."""
    int32_cap = INT32_ELEMENTS // (case.frames * (case.tokens + 1) * case.vocab)
    search = BatchSizeSearch(start=1, rel_tolerance=0.0, max_size=min(case.batch, int32_cap))
    probes = []
    while (size := search.next_size()) is not None:
        inputs = full_length_inputs(case, size, device)
        try:
            seconds, peak = timed(batched_transducer_loss, joiner, inputs, device)
            fits, reason = True, ""
        except AttributeError as err:  # a torchaudio without rnnt_loss
            report.record("torchaudio", unavailable=str(err))
            return None
        except Exception as err:
            if not out_of_memory(err):
                raise
            seconds, peak, fits, reason = None, None, False, type(err).__name__
        del inputs
        release(device)
        probes.append({"batch": size, "fits": fits, "seconds": seconds, "peak_bytes": peak})
        search.report(size, fits)
        if reason:
            probes[-1]["reason"] = reason
    largest = search.result
    if largest == 0:
        report.record("torchaudio", probes=probes, largest_batch=0)
        return None
    inputs = full_length_inputs(case, largest, device)
    seconds, peak = timed(batched_transducer_loss, joiner, inputs, device)
    bounds = {case.batch: "headline batch", int32_cap: "int32 logits"}
    per_utterance = (peak + tensor_bytes(inputs)) / largest
    return {
        "largest_batch": largest,
        "bound": bounds.get(largest, "memory"),
        "int32_logits_batch_limit": int32_cap,
        "seconds": seconds,
        "seconds_per_utterance": seconds / largest,
        "peak_bytes": peak,
        "peak_bytes_per_utterance": peak / largest,
        "input_bytes": tensor_bytes(inputs),
        # what the GPU would hold were torchaudio's indices wide enough: a linear estimate
        "memory_batch_estimate": int(torch.cuda.get_device_properties(0).total_memory
                                     // per_utterance) if device == "cuda" else None,
        "probes": probes,
    }  # fmt: skip


def run(report: Report, options: SectionOptions) -> None:
    began = time.monotonic()
    device = options.device
    case = REHEARSAL_CASE if options.rehearsal else PAPER
    deadline = began + options.limit_s - STARTUP_S
    joiner = build_joiner(case, device)
    inputs = full_length_inputs(case, case.batch, device)
    formula = predicted_peak_bytes(
        batch_size=case.batch,
        max_frames=case.frames,
        max_tokens=case.tokens,
        vocab_size=case.vocab,
        encoder_dim=case.encoder_dim,
        predictor_dim=case.predictor_dim,
        joint_dim=case.joint_dim,
    )
    report.record(
        "setup",
        **asdict(case),
        audio_seconds=case.audio_seconds,
        paper_claim="loss and gradients for batch 1024 of 40 s audio in 6 GB (arXiv 2211.16270)",
        assumed=PAPER_ASSUMED,
        input_bytes=tensor_bytes(inputs),
        predicted_peak_bytes=formula,
        target_bytes=TARGET_BYTES,
        **run_facts(device, options.rehearsal),
    )
    until = deadline - TORCHAUDIO_RESERVE_S
    measured = measure_lattices(report, case, joiner, inputs, until, device)
    del inputs
    release(device)
    baseline = torchaudio_largest_batch(report, case, joiner, device)
    if baseline is None:
        return
    report.record("torchaudio", **baseline)
    ours = measured["triton"]
    report.record(
        "against_torchaudio",
        batch_ratio=case.batch / baseline["largest_batch"],
        seconds_per_utterance_ratio=baseline["seconds_per_utterance"]
        / (ours["seconds"] / case.batch),
        bytes_per_utterance_ratio=baseline["peak_bytes_per_utterance"]
        / (ours["peak_bytes"] / case.batch)
        if ours["peak_bytes"]
        else None,
    )

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

`scripts/benchmark_transducer_loss.py` takes its `PAPER` case from `PAPER` here.

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

import gc
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from asr.gpu_check.facts import device_facts, package_versions, project_commit
from asr.gpu_check.joiner_loss import Loss, loss_and_grads, seeded_joiner
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.timing import clock
from asr.losses.samplewise import predicted_peak_bytes
from asr.losses.transducer import batched_transducer_loss, samplewise_transducer_loss
from asr.models.transducer import Joiner
from asr.profiling import PeakMemory
from asr.training.oomptimizer import BatchSizeSearch

TARGET_BYTES = 6 * 10**9  # the paper's "6 GB"
LATTICES = ("triton", "torch")
TORCHAUDIO_RESERVE_S = 25.0  # kept for torchaudio's search when a lattice is budgeted
PROBE_RESERVE_S = 15.0  # kept by the Triton lattice for the PyTorch lattice's warm-up and probe
STARTUP_S = 10.0  # of the section's limit: the imports before `run`
INT32_ELEMENTS = 2**31 - 1  # torchaudio's rnnt_loss faults on larger logits (audio#3736)


@dataclass(frozen=True)
class LossCase:
    """The batch (every utterance at `frames` x `tokens`), the joiner, and how the lattices
    are timed: `warmup` and `probe` utterances first, the whole batch only when the probe
    predicts it within `budget_s` seconds (per lattice)."""

    batch: int
    frames: int
    tokens: int
    vocab: int
    encoder_dim: int
    predictor_dim: int
    joint_dim: int
    warmup: int
    probe: int
    budget_s: float

    @property
    def audio_seconds(self) -> float:
        """Each utterance's audio at 40 ms an encoder frame."""
        return self.frames * 0.04


PAPER = LossCase(1024, 1000, 100, 1024, 512, 512, 512, warmup=8, probe=64, budget_s=70.0)
REHEARSAL_CASE = LossCase(6, 16, 4, 33, 256, 256, 256, warmup=1, probe=2, budget_s=60.0)


def build_joiner(case: LossCase, device: str) -> Joiner:
    """The case's joiner with seeded random weights, on `device`."""
    joiner = seeded_joiner(case.encoder_dim, case.predictor_dim, case.joint_dim, case.vocab)
    return joiner.to(device)


def full_length_inputs(case: LossCase, batch: int, device: str) -> list[Tensor]:
    """(encoder_out (B, T, D), predictor_out (B, U+1, D), targets (B, U), encoder_lens,
    target_lens) of `batch` utterances all at the case's T and U, seeded, made on `device`."""
    g = torch.Generator(device=device).manual_seed(0)
    return [
        torch.randn(batch, case.frames, case.encoder_dim, generator=g, device=device),
        torch.randn(batch, case.tokens + 1, case.predictor_dim, generator=g, device=device),
        torch.randint(1, case.vocab, (batch, case.tokens), generator=g, device=device),
        torch.full((batch,), case.frames, device=device),
        torch.full((batch,), case.tokens, device=device),
    ]


def tensor_bytes(tensors: list[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _first(inputs: list[Tensor], n: int) -> list[Tensor]:
    return [x[:n] for x in inputs]


def timed(loss_fn: Loss, joiner: Joiner, inputs: list[Tensor], device: str) -> tuple[float, int]:
    """One loss forward + backward -> (seconds, peak bytes above what was allocated before:
    the inputs and the joiner)."""
    with PeakMemory(device) as memory:  # synchronizes the device on entry and exit
        began = time.perf_counter()
        result = loss_and_grads(loss_fn, joiner, inputs)
        seconds = clock(device) - began
    if not torch.isfinite(result[0]):
        raise RuntimeError(f"the loss is not finite ({float(result[0])})")
    return seconds, memory.extra_bytes


def samplewise(lattice: str) -> Loss:
    return lambda *args: samplewise_transducer_loss(*args, lattice=lattice)


def measure_lattice(
    lattice: str, case: LossCase, joiner: Joiner, inputs: list[Tensor], budget_s: float, device: str
) -> dict[str, Any]:
    """The sample-wise loss with `lattice` on the whole batch, or its time scaled from
    `case.probe` utterances when the whole batch would overrun `budget_s`."""
    loss_fn = samplewise(lattice)
    began = time.perf_counter()
    timed(loss_fn, joiner, _first(inputs, case.warmup), device)
    warmup_s = time.perf_counter() - began
    probe_s, _ = timed(loss_fn, joiner, _first(inputs, case.probe), device)
    predicted = probe_s / case.probe * case.batch
    fields: dict[str, Any] = {
        "lattice": lattice, "batch": case.batch, "warmup_s": warmup_s,
        "probe_utterances": case.probe, "probe_s": probe_s, "predicted_s": predicted,
        "budget_s": budget_s,
    }  # fmt: skip
    if predicted > budget_s:
        return fields | {
            "scaled": True, "timed_utterances": case.probe, "seconds": predicted,
            "peak_bytes": None,
            "not_run": f"the whole batch was predicted to take {predicted:.0f} s, over the "
            f"lattice's budget of {budget_s:.0f} s: its time is scaled from the probe and its "
            "memory not measured",
        }  # fmt: skip
    seconds, peak = timed(loss_fn, joiner, inputs, device)
    return fields | {
        "scaled": False, "timed_utterances": case.batch, "seconds": seconds, "peak_bytes": peak,
        "seconds_per_utterance": seconds / case.batch,
        "meets_target": peak <= TARGET_BYTES,
    }  # fmt: skip


def _out_of_memory(err: BaseException) -> bool:
    return isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError))


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
            if not _out_of_memory(err):
                raise
            seconds, peak, fits, reason = None, None, False, type(err).__name__
        del inputs
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
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
        assumed="T = 1000 (40 ms frames), U = 100, V = 1024, widths 512: the paper's are not "
        "in the text this bench was written from",
        dtype="float32",
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        input_bytes=tensor_bytes(inputs),
        predicted_peak_bytes=formula,
        target_bytes=TARGET_BYTES,
        triton_interpreted=options.rehearsal,
        python=platform.python_version(),
        packages=package_versions(),
        commit=project_commit(),
        **device_facts(device),
    )
    measured: dict[str, dict[str, Any]] = {}
    for i, lattice in enumerate(LATTICES):  # Triton first: the headline
        left = deadline - time.monotonic() - TORCHAUDIO_RESERVE_S
        later = PROBE_RESERVE_S * (len(LATTICES) - 1 - i)  # the lattices after this one
        budget = min(case.budget_s, left - later)
        measured[lattice] = measure_lattice(lattice, case, joiner, inputs, budget, device)
        report.record("samplewise", **measured[lattice])
        peak = measured[lattice]["peak_bytes"]
        if peak is not None and peak > TARGET_BYTES:
            report.warn(
                f"the sample-wise loss with the {lattice} lattice peaked at {peak / 1e9:.2f} GB "
                f"above its inputs at batch {case.batch}, over the paper's 6 GB"
            )
    del inputs
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
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

"""What the GPU bench's loss sections (`loss-headline`, `tdt-loss`) share: a transducer
loss's forward + backward on one batch of full-length utterances (every one at the case's
T and U), timed, with its peak memory above the inputs; and the sample-wise loss measured
per lattice, the whole batch run only when a probe predicts it within a time budget.

A case with `durations` is a token-and-duration transducer (TDT): its joiner emits V token
logits then one per duration, and the losses are given `durations` and `sigma`.
"""

from __future__ import annotations

import gc
import platform
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from asr.gpu_check.facts import device_facts, package_versions, project_commit
from asr.gpu_check.joiner_loss import Loss, loss_and_grads, seeded_joiner
from asr.gpu_check.report import Report
from asr.gpu_check.timing import clock
from asr.losses.transducer import batched_transducer_loss, samplewise_transducer_loss
from asr.models.transducer import Joiner
from asr.profiling import PeakMemory

TARGET_BYTES = 6 * 10**9  # Braun et al.'s "6 GB" (arXiv 2211.16270)
LATTICES = ("triton", "torch")  # Triton first: the headline (`lattice=auto` on CUDA)
STARTUP_S = 10.0  # of a section's limit: the imports before its `run`
PROBE_RESERVE_S = 15.0  # kept by a lattice for the warm-up and probe of each lattice after it


@dataclass(frozen=True)
class LossCase:
    """The batch (every utterance at `frames` x `tokens`), the joiner, and how the lattices
    are timed: `warmup` and `probe` utterances first, the whole batch only when the probe
    predicts it within `budget_s` seconds (per lattice). `durations` make it a TDT case,
    with `sigma` and `omega` as `asr.losses.samplewise.TdtOptions` reads them."""

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
    durations: tuple[int, ...] | None = None
    sigma: float = 0.0
    omega: float = 0.0

    @property
    def audio_seconds(self) -> float:
        """Each utterance's audio at 40 ms an encoder frame."""
        return self.frames * 0.04

    @property
    def loss_options(self) -> dict[str, Any]:
        """The TDT keywords of the losses (none for a plain transducer)."""
        if self.durations is None:
            return {}
        return {"durations": self.durations, "sigma": self.sigma, "omega": self.omega}


# Braun et al.'s headline batch, 1024 x 40 s, with the sizes the paper's text did not give
# assumed (why each: asr.gpu_check.bench_loss); scripts/benchmark_transducer_loss.py and
# the tdt-loss section take it from here.
PAPER = LossCase(1024, 1000, 100, 1024, 512, 512, 512, warmup=8, probe=64, budget_s=70.0)
PAPER_ASSUMED = (
    "T = 1000 (40 ms frames), U = 100, V = 1024, widths 512: the paper's are not in the text "
    "this bench was written from"
)


def build_joiner(case: LossCase, device: str) -> Joiner:
    """The case's joiner (with its durations) with seeded random weights, on `device`."""
    joiner = seeded_joiner(
        case.encoder_dim, case.predictor_dim, case.joint_dim, case.vocab, case.durations
    )
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


def first(inputs: list[Tensor], n: int) -> list[Tensor]:
    """The first `n` utterances of a batch."""
    return [x[:n] for x in inputs]


def release(device: str) -> None:
    """Give freed memory back, so that the next measurement starts from what is alive."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def out_of_memory(err: BaseException) -> bool:
    return isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError))


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


def samplewise(lattice: str, case: LossCase) -> Loss:
    """The sample-wise loss with `lattice`, for the case's transducer (plain or TDT)."""
    options = case.loss_options
    return lambda *args: samplewise_transducer_loss(*args, lattice=lattice, **options)


def batched(case: LossCase) -> Loss:
    """The batched loss (torchaudio's `rnnt_loss`, or with durations the TDT lattice under
    autograd) for the case's transducer."""
    options = case.loss_options
    return lambda *args: batched_transducer_loss(*args, **options)


def measure_lattice(
    lattice: str, case: LossCase, joiner: Joiner, inputs: list[Tensor], budget_s: float, device: str
) -> dict[str, Any]:
    """The sample-wise loss with `lattice` on the whole batch, or its time scaled from
    `case.probe` utterances when the whole batch would overrun `budget_s`."""
    loss_fn = samplewise(lattice, case)
    began = time.perf_counter()
    timed(loss_fn, joiner, first(inputs, case.warmup), device)
    warmup_s = time.perf_counter() - began
    probe_s, _ = timed(loss_fn, joiner, first(inputs, case.probe), device)
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


def measure_lattices(
    report: Report,
    case: LossCase,
    joiner: Joiner,
    inputs: list[Tensor],
    until: float,
    device: str,
    loss_name: str = "sample-wise loss",
) -> dict[str, dict[str, Any]]:
    """`measure_lattice` for each of `LATTICES`, each budgeted to end by `until`
    (`time.monotonic()`) with `PROBE_RESERVE_S` kept for each lattice after it; a
    `samplewise` record each, and a warning when a peak passes `TARGET_BYTES`."""
    measured: dict[str, dict[str, Any]] = {}
    for i, lattice in enumerate(LATTICES):
        later = PROBE_RESERVE_S * (len(LATTICES) - 1 - i)
        budget = min(case.budget_s, until - time.monotonic() - later)
        measured[lattice] = measure_lattice(lattice, case, joiner, inputs, budget, device)
        report.record("samplewise", **measured[lattice])
        peak = measured[lattice]["peak_bytes"]
        if peak is not None and peak > TARGET_BYTES:
            report.warn(
                f"the {loss_name} with the {lattice} lattice peaked at {peak / 1e9:.2f} GB "
                f"above its inputs at batch {case.batch}, over the paper's 6 GB"
            )
    return measured


def run_facts(device: str, rehearsal: bool) -> dict[str, Any]:
    """What every loss section's setup record states of the run: fp32 and torch's matmul
    precision, whether Triton was interpreted, the stack, the commit and the device."""
    return {
        "dtype": "float32",
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "triton_interpreted": rehearsal,
        "python": platform.python_version(),
        "packages": package_versions(),
        "commit": project_commit(),
        **device_facts(device),
    }

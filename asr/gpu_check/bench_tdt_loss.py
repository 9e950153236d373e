"""GPU bench, section `tdt-loss`: the sample-wise loss of a token-and-duration transducer
(TDT; Xu et al. 2023, arXiv 2304.06795) at the `loss-headline` section's batch, and against
the batched TDT loss at LibriSpeech sizes.

A TDT's joiner emits V token logits and one logit per duration (D of them); its lattice has
an arc per duration at every node. Computed over the whole batch at once, the loss holds
B x T x (U+1) x (V + D) logits and, under autograd, the lattice's per-diagonal tensors; the
sample-wise loss (`samplewise_transducer_loss(..., durations=...)`) never holds more than
one sample's logits. Both here are float32, every utterance at the full T and U, durations
(0, 1, 2, 3, 4), sigma 0.05 (NeMo's) and omega 0 (the TDT loss alone); the joiner is
`asr.models.transducer.Joiner` with those durations (V + 5 outputs), seeded.

- `samplewise` (the headline): `PAPER`'s batch, 1,024 utterances of 40 s (T = 1,000,
  U = 100, V = 1,024, widths 512: the `loss-headline` section's assumed sizes), with the
  Triton and the PyTorch lattice: the time of one forward + backward and its peak memory
  above the inputs. Target: at most 6 GB, as the plain loss's claim (Braun et al., arXiv
  2211.16270); a warning if missed. As in `loss-headline` (`asr.gpu_check.loss_runs`):
  `warmup` utterances first (Triton compiles), then `probe` utterances timed, and the whole
  batch only when the probe predicts it within the lattice's budget (else its time scaled
  and its memory not measured), the budgets cut to what the section's limit leaves.
- `librispeech`: 32 utterances of 20 s (T = 500, U = 100, V = 1,024, widths 512): the
  sample-wise TDT loss (both lattices) and `batched_transducer_loss` with the same
  durations (the TDT lattice differentiated by autograd: the reference the sample-wise
  loss is tested against), each after one call on `warmup` utterances: time and peak
  memory above the inputs; a batched loss that runs out of memory is recorded as such.
  Then `against_batched`, per lattice, sample-wise over batched: `memory_ratio` (target
  at most 0.1) and `time_ratio` (target at most 1, no slower). The targets are read for
  the Triton lattice (`lattice=auto`'s choice on CUDA): a warning if missed; the PyTorch
  lattice's ratios are recorded beside.

Time: the section's 60 s hold the imports (`STARTUP_S`), the Triton lattice's compilation
in its warm-up, its probe and whole headline batch, the PyTorch lattice's warm-up and probe
(`PROBE_RESERVE_S`; its whole batch only if the probe predicts it within what is left),
and `LIBRISPEECH_RESERVE_S` for the LibriSpeech comparison, which is short: batch 32.

A rehearsal runs tiny shapes on the CPU (Triton interpreted; peak memory from the resident
set size, rough): its figures say nothing of a GPU, so its ratios give no warning.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import Any

import torch

from asr.errors import first_line
from asr.gpu_check.joiner_loss import Loss
from asr.gpu_check.loss_runs import (
    LATTICES,
    PAPER,
    PAPER_ASSUMED,
    STARTUP_S,
    TARGET_BYTES,
    LossCase,
    batched,
    build_joiner,
    first,
    full_length_inputs,
    measure_lattices,
    out_of_memory,
    release,
    run_facts,
    samplewise,
    tensor_bytes,
    timed,
)
from asr.gpu_check.report import Report, SectionOptions
from asr.models.transducer import Joiner

DURATIONS = (0, 1, 2, 3, 4)
TDT = {"durations": DURATIONS, "sigma": 0.05, "omega": 0.0}
MEMORY_RATIO_TARGET = 0.1  # sample-wise peak over batched peak, at most
TIME_RATIO_TARGET = 1.0  # sample-wise seconds over batched seconds, at most
LIBRISPEECH_RESERVE_S = 15.0  # kept for the LibriSpeech comparison when a lattice is budgeted

HEADLINE = replace(PAPER, **TDT)
# The whole batch always runs: `probe` and `budget_s` are not used.
LIBRISPEECH = LossCase(32, 500, 100, 1024, 512, 512, 512, warmup=4, probe=32, budget_s=0, **TDT)
UNUSED = ("probe", "budget_s")  # of the LibriSpeech case
REHEARSAL_HEADLINE = LossCase(4, 8, 2, 33, 32, 32, 32, warmup=1, probe=2, budget_s=60, **TDT)
REHEARSAL_LIBRISPEECH = LossCase(3, 6, 2, 33, 32, 32, 32, warmup=1, probe=3, budget_s=0, **TDT)


def warm_then_timed(
    loss_fn: Loss, joiner: Joiner, inputs: list[torch.Tensor], case: LossCase, device: str
) -> dict[str, Any]:
    """One call on `case.warmup` utterances, then the whole batch timed: its seconds and
    peak memory, or `out_of_memory` (with the error's first line) when either call ran out."""
    began = time.perf_counter()
    try:
        timed(loss_fn, joiner, first(inputs, case.warmup), device)
        warmup_s = time.perf_counter() - began
        seconds, peak = timed(loss_fn, joiner, inputs, device)
    except Exception as err:
        if not out_of_memory(err):
            raise
        return {"out_of_memory": True, "error": first_line(err), "seconds": None,
                "peak_bytes": None}  # fmt: skip
    finally:
        release(device)
    return {
        "out_of_memory": False, "warmup_s": warmup_s, "seconds": seconds, "peak_bytes": peak,
        "seconds_per_utterance": seconds / case.batch,
    }  # fmt: skip


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def against_batched(
    report: Report, case: LossCase, joiner: Joiner, device: str, judge: bool
) -> dict[str, dict[str, Any]]:
    """The LibriSpeech comparison: a `librispeech` record per loss, an `against_batched`
    record per lattice; warnings for the Triton lattice's missed targets when `judge`."""
    inputs = full_length_inputs(case, case.batch, device)
    losses = {lattice: samplewise(lattice, case) for lattice in LATTICES}
    measured = {}
    for name, loss_fn in (*losses.items(), ("batched", batched(case))):
        kind = "batched" if name == "batched" else "samplewise"
        lattice = None if name == "batched" else name
        measured[name] = warm_then_timed(loss_fn, joiner, inputs, case, device)
        report.record("librispeech", loss=kind, lattice=lattice, batch=case.batch, **measured[name])
    base = measured["batched"]
    compared = {}
    for lattice in LATTICES:
        ours = measured[lattice]
        if ours["out_of_memory"]:  # the sample-wise loss at batch 32: a fault, not a figure
            report.fail(f"the sample-wise TDT loss ({lattice} lattice) ran out of memory")
            continue
        memory = ratio(ours["peak_bytes"], base["peak_bytes"])
        seconds = ratio(ours["seconds"], base["seconds"])
        compared[lattice] = {
            "lattice": lattice, "batched_out_of_memory": base["out_of_memory"],
            "memory_ratio": memory, "time_ratio": seconds,
            "meets_memory_target": None if memory is None else memory <= MEMORY_RATIO_TARGET,
            "meets_time_target": None if seconds is None else seconds <= TIME_RATIO_TARGET,
        }  # fmt: skip
        report.record("against_batched", **compared[lattice])
        if not judge or lattice != "triton":
            continue
        if compared[lattice]["meets_memory_target"] is False:
            report.warn(
                f"the sample-wise TDT loss peaked at {memory:.3f} x the batched one's memory "
                f"at batch {case.batch} x {case.frames} frames, over the {MEMORY_RATIO_TARGET} "
                "target"
            )
        if compared[lattice]["meets_time_target"] is False:
            report.warn(
                f"the sample-wise TDT loss took {seconds:.2f} x the batched one's time at "
                f"batch {case.batch} x {case.frames} frames, over the {TIME_RATIO_TARGET} target"
            )
    return compared


def run(report: Report, options: SectionOptions) -> None:
    began = time.monotonic()
    device = options.device
    headline, librispeech = HEADLINE, LIBRISPEECH
    if options.rehearsal:
        headline, librispeech = REHEARSAL_HEADLINE, REHEARSAL_LIBRISPEECH
    deadline = began + options.limit_s - STARTUP_S
    joiner = build_joiner(headline, device)
    inputs = full_length_inputs(headline, headline.batch, device)
    report.record(
        "setup",
        **asdict(headline),
        audio_seconds=headline.audio_seconds,
        librispeech={k: v for k, v in asdict(librispeech).items() if k not in UNUSED},
        librispeech_audio_seconds=librispeech.audio_seconds,
        assumed=PAPER_ASSUMED,
        input_bytes=tensor_bytes(inputs),
        target_bytes=TARGET_BYTES,
        memory_ratio_target=MEMORY_RATIO_TARGET,
        time_ratio_target=TIME_RATIO_TARGET,
        **run_facts(device, options.rehearsal),
    )
    until = deadline - LIBRISPEECH_RESERVE_S
    measure_lattices(
        report, headline, joiner, inputs, until, device, loss_name="sample-wise TDT loss"
    )
    del inputs, joiner
    release(device)
    joiner = build_joiner(librispeech, device)
    against_batched(report, librispeech, joiner, device, judge=not options.rehearsal)

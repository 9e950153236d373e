"""GPU check, section `lattice`: the sample-wise transducer loss with the Triton lattice
(`model.loss.lattice=auto`'s choice on CUDA) against the PyTorch lattice and torchaudio's
batched `rnnt_loss`, on one random batch of varied lengths at the LibriSpeech preset's
sizes (V = 1024, up to T = 1,000 frames after subsampling and U = 150 tokens, the preset's
joiner), in fp32.

Agreement, in two tiers; gradients (encoder output, predictor output, the joiner's
output layer) are compared by their largest difference relative to the reference's
largest entry, losses relatively:
- Triton against the PyTorch lattice, both fp32 and the same algorithm: losses within
  1e-5, gradients within 1e-3 (4e-4 on an H200).
- Each fp32 implementation, torchaudio's too, against the referee, the PyTorch lattice
  in float64: losses within 1e-5, gradients within 5e-2. fp32 itself is that far off on
  this batch: a T = 1,000 lattice of random inputs chains 1,150 log-additions per path,
  whose rounding the occupancies exp(alpha + beta - log P) carry into gradients that
  are sums of large, cancelling terms. On an H200 all three were 2.1-2.3 % off float64
  on the encoder output (the first GPU run, comparing only fp32 implementations, took
  torchaudio's 2 % for a disagreement); a wrong index or a race makes errors of order 1.
The Triton or PyTorch lattice off a bound fails the section; torchaudio off its bound
is a warning (training uses it only when asked to, and it is not this project's code).
Each implementation's record also holds the largest gradient it left on padding (frames
past a sample's length, tokens past its transcript), which must be 0. Then each
implementation's time per loss forward + backward (median of a few calls, after one that
includes Triton's compilations) and its peak memory above the inputs. Then `auto` itself:
its first-use check on this GPU must keep the kernels (a false alarm would make every run
fall back).

Last, the token-and-duration transducer's lattice (`tdt_lattice`, durations 0-4, sigma
0.05): the Triton kernel against the PyTorch one on the batch's first `TDT_SAMPLES` samples
(sample 0 at T = 1,000 and U = 150), their node scores and duration log-probabilities from
the same joiner with duration outputs, float32. Compared: the losses and every gradient
term of `TdtGradientTerms`, the log-domain ones (`shift`, `log_occupancy`) as the
occupancies they carry (exp(shift + lse), exp(log_occupancy)), all in the same two tiers
as above (Triton against the fp32 PyTorch lattice at 1e-3, each against the PyTorch
lattice in float64 at 5e-2); either off its bound fails the section. Each implementation's
time (first call, then one more) is recorded.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from asr.gpu_check.joiner_loss import Loss, loss_and_grads, seeded_joiner
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.timing import synchronize
from asr.losses import lattice as torch_lattice
from asr.losses.lattice import TdtGradientTerms, duration_log_probs_, padded_labels
from asr.losses.lattice_choice import AUTO_ON_CUDA, FallbackLattice, LatticeOps, lattice_ops
from asr.losses.transducer import batched_transducer_loss, samplewise_transducer_loss
from asr.models.transducer import Joiner

REFERENCE = "torch_float64"
OURS = ("triton", "torch")  # off the referee: a failure; torchaudio off it: a warning
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-3  # same algorithm, same precision: of the reference gradient's largest entry
FP32_GRAD_RTOL = 5e-2  # fp32 against float64: rounding alone gave 2.3 % (H200)
GRADIENTS = ("encoder_out", "predictor_out", "output_weight", "output_bias")
TDT_DURATIONS = (0, 1, 2, 3, 4)  # NeMo's TDT presets, and this project's
TDT_SIGMA = 0.05
TDT_SAMPLES = 4  # the batch's first: sample 0 holds both maxima
TDT_TERMS = ("shift", "blank_move", "neg_label_move", "log_occupancy", "duration_moves")


@dataclass(frozen=True)
class LatticeCase:
    """One random batch: sizes of the lattice and of the joiner."""

    batch: int
    max_frames: int
    max_tokens: int
    vocab: int
    encoder_dim: int
    predictor_dim: int
    joint_dim: int
    repeats: int


# The librispeech_transducer preset's joiner (encoder 512, predictor and joint 640, BPE 1024).
GPU_CASE = LatticeCase(8, 1000, 150, 1024, 512, 640, 640, repeats=3)
REHEARSAL_CASE = LatticeCase(3, 20, 6, 33, 16, 12, 16, repeats=1)


def random_batch(
    case: LatticeCase, device: str, durations: tuple[int, ...] | None = None
) -> tuple[Joiner, list[Tensor]]:
    """The joiner (a TDT joiner with `durations`) and (encoder_out, predictor_out, targets,
    encoder_lens, target_lens): lengths spread from a quarter of the maximum to the
    maximum, shuffled so that long audio does not always come with long transcripts;
    sample 0 has both maxima."""
    g = torch.Generator().manual_seed(0)
    joiner = seeded_joiner(
        case.encoder_dim, case.predictor_dim, case.joint_dim, case.vocab, durations
    )
    b = case.batch
    frames = torch.linspace(case.max_frames / 4, case.max_frames, b).round().long()
    tokens = torch.linspace(case.max_tokens / 4, case.max_tokens, b).round().long()
    frames, tokens = frames.flip(0), tokens[torch.randperm(b, generator=g)]
    tokens[tokens.argmax()], tokens[0] = tokens[0].clone(), tokens.max()
    inputs = [
        torch.randn(b, case.max_frames, case.encoder_dim, generator=g),
        torch.randn(b, case.max_tokens + 1, case.predictor_dim, generator=g),
        torch.randint(1, case.vocab, (b, case.max_tokens), generator=g),
        frames,
        tokens,
    ]
    return joiner.to(device), [x.to(device) for x in inputs]


def implementations() -> dict[str, Loss]:
    def samplewise(lattice: str) -> Loss:
        return lambda *args: samplewise_transducer_loss(*args, lattice=lattice)

    return {
        "triton": samplewise("triton"),
        "torch": samplewise("torch"),
        "torchaudio": batched_transducer_loss,
    }


def float64_reference(joiner: Joiner, inputs: list[Tensor]) -> list[Tensor]:
    """The referee: loss and gradients of the PyTorch lattice in float64 (joiner and
    inputs promoted), returned in float32 for comparison."""
    joiner64 = copy.deepcopy(joiner).double()
    inputs64 = [x.double() if x.is_floating_point() else x for x in inputs]
    return [x.float() for x in loss_and_grads(implementations()["torch"], joiner64, inputs64)]


def padding_gradient(result: list[Tensor], inputs: list[Tensor]) -> float:
    """The largest gradient entry on padding: encoder frames at or past each sample's
    length and predictor positions past its transcript's (the loss never reads them)."""
    _, d_encoder, d_predictor, *_ = result
    frames, tokens = inputs[3], inputs[4]
    time_index = torch.arange(d_encoder.size(1), device=d_encoder.device)
    label_index = torch.arange(d_predictor.size(1), device=d_predictor.device)
    pad_frames = time_index[None, :] >= frames[:, None]
    pad_labels = label_index[None, :] > tokens[:, None]
    largest = torch.zeros((), device=d_encoder.device)
    if pad_frames.any():
        largest = torch.maximum(largest, d_encoder[pad_frames].abs().max())
    if pad_labels.any():
        largest = torch.maximum(largest, d_predictor[pad_labels].abs().max())
    return float(largest)


def measure(
    name: str, loss_fn: Loss, joiner: Joiner, inputs: list[Tensor], case: LatticeCase, device: str
) -> tuple[dict, list[Tensor]]:
    """One implementation: first call (compilations), median time, peak memory."""
    synchronize(device)
    began = time.perf_counter()
    result = loss_and_grads(loss_fn, joiner, inputs)
    synchronize(device)
    first = time.perf_counter() - began
    times, peak = [], None
    for _ in range(case.repeats):
        del result
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        began = time.perf_counter()
        result = loss_and_grads(loss_fn, joiner, inputs)
        synchronize(device)
        times.append(time.perf_counter() - began)
        if device == "cuda":
            peak = torch.cuda.max_memory_allocated() - before
    fields = {
        "implementation": name,
        "first_call_s": first,
        "seconds": statistics.median(times),
        "peak_bytes": peak,
        "loss": float(result[0]),
        "padding_grad_max": padding_gradient(result, inputs),
    }
    return fields, result


def disagreement(
    got: list[Tensor],
    want: list[Tensor],
    grad_rtol: float = GRAD_RTOL,
    names: Sequence[str] = GRADIENTS,
) -> dict:
    """The loss's relative difference (the largest of a per-sample loss's) and each
    gradient's largest difference relative to the largest entry of the reference's (by
    `names`); ok when within LOSS_RTOL and `grad_rtol`."""
    loss_rel = float(((got[0] - want[0]).abs() / want[0].abs().clamp_min(1e-30)).max())
    grad_rel = {
        name: float((g - w).abs().max() / w.abs().max().clamp_min(1e-30))
        for name, g, w in zip(names, got[1:], want[1:], strict=False)
    }
    ok = loss_rel <= LOSS_RTOL and all(v <= grad_rtol for v in grad_rel.values())
    return {"loss_rel": loss_rel, "grad_rel": grad_rel, "ok": ok}


def check_auto(joiner: Joiner, inputs: list[Tensor], device: str) -> dict:
    """`lattice=auto` as training runs it: on CUDA the process-wide `AUTO_ON_CUDA` (a
    rehearsal's CPU has no fallback to check: a fresh `FallbackLattice` stands in)."""
    auto = AUTO_ON_CUDA if device == "cuda" else FallbackLattice()
    loss_and_grads(lambda *args: samplewise_transducer_loss(*args, lattice=auto), joiner, inputs)
    return {"active": auto.active, "reason": auto.reason}


def tdt_scores(case: LatticeCase, device: str) -> list[Tensor]:
    """The TDT lattice's inputs for the batch's first `TDT_SAMPLES` samples: the token
    logits' node scores lse, z_blank, z_label (C, T, U1) and the durations'
    log-probabilities (C, T, U1, D) from `random_batch`'s joiner with duration outputs,
    one sample's logits at a time (as the sample-wise loss makes them), then frames and
    tokens (C,)."""
    joiner, inputs = random_batch(case, device, TDT_DURATIONS)
    c = min(TDT_SAMPLES, case.batch)
    enc, pred, targets, frames, tokens = (x[:c] for x in inputs)
    t, u1, vocab = case.max_frames, case.max_tokens + 1, case.vocab
    lse, z_blank, z_label = enc.new_zeros((3, c, t, u1)).unbind(0)
    duration_lp = enc.new_zeros((c, t, u1, len(TDT_DURATIONS)))
    labels = padded_labels(targets, u1, blank=0, vocab=vocab)
    with torch.no_grad():
        for i, (f, k) in enumerate(zip(frames.tolist(), (tokens + 1).tolist(), strict=True)):
            logits = joiner(enc[i : i + 1, :f, None], pred[i : i + 1, None, :k])
            duration_log_probs_(logits[..., vocab:], out=duration_lp[i : i + 1, :f, :k])
            torch_lattice.node_scores_(
                logits[..., :vocab], labels[i : i + 1, :k], blank=0,
                lse=lse[i : i + 1, :f, :k], z_blank=z_blank[i : i + 1, :f, :k],
                z_label=z_label[i : i + 1, :f, :k],
            )  # fmt: skip
    return [lse, z_blank, z_label, duration_lp, frames, tokens]


def tdt_outputs(ops: LatticeOps, scores: list[Tensor]) -> list[Tensor]:
    """`ops.tdt_lattice` on copies of `scores`: [nll (C,), then every gradient term, the
    log-domain ones as occupancies], in float32."""
    lse, z_blank, z_label, duration_lp, frames, tokens = scores
    nll, terms = ops.tdt_lattice(
        lse.clone(), z_blank.clone(), z_label.clone(), duration_lp, frames, tokens,
        durations=TDT_DURATIONS, sigma=TDT_SIGMA, gradient=True,
    )  # fmt: skip
    assert isinstance(terms, TdtGradientTerms)
    tok = terms.tokens
    found = [nll, (tok.shift + lse).exp(), tok.blank_move, tok.neg_label_move]
    found += [terms.log_occupancy.exp(), terms.duration_moves]
    return [x.float() for x in found]


def check_tdt(report: Report, case: LatticeCase, device: str) -> None:
    """The Triton TDT lattice against the PyTorch one in fp32 and float64: a
    `tdt_implementation` record each, then `agreement` records; a failure off a bound."""
    scores = tdt_scores(case, device)
    report.record(
        "tdt_batch", samples=scores[0].size(0), frames=scores[4].tolist(),
        tokens=scores[5].tolist(), durations=TDT_DURATIONS, sigma=TDT_SIGMA, dtype="float32",
    )  # fmt: skip
    scores64 = [x.double() if x.is_floating_point() else x for x in scores]
    runs = {
        "triton_tdt": (lattice_ops("triton", torch.device(device)), scores),
        "torch_tdt": (torch_lattice, scores),
        "torch_tdt_float64": (torch_lattice, scores64),
    }
    results = {}
    for name, (ops, inputs) in runs.items():
        times = []
        for _ in range(2):  # the first call compiles Triton's kernel
            synchronize(device)
            began = time.perf_counter()
            results[name] = tdt_outputs(ops, inputs)
            synchronize(device)
            times.append(time.perf_counter() - began)
        report.record(
            "tdt_implementation", implementation=name, first_call_s=times[0],
            seconds=times[1], loss=float(results[name][0].sum()),
        )  # fmt: skip
    comparisons = [("triton_tdt", "torch_tdt", GRAD_RTOL)]
    comparisons += [
        (name, "torch_tdt_float64", FP32_GRAD_RTOL) for name in ("triton_tdt", "torch_tdt")
    ]
    for name, against, grad_rtol in comparisons:
        found = disagreement(results[name], results[against], grad_rtol, TDT_TERMS)
        report.record(
            "agreement", implementation=name, reference=against, grad_rtol=grad_rtol, **found
        )
        if not found["ok"]:
            report.fail(f"{name} against {against}: {found}, gradient bound {grad_rtol:g}")


def run(report: Report, options: SectionOptions) -> None:
    device = options.device
    case = REHEARSAL_CASE if options.rehearsal else GPU_CASE
    joiner, inputs = random_batch(case, device)
    report.record(
        "batch",
        **case.__dict__,
        frames=inputs[3].tolist(),
        tokens=inputs[4].tolist(),
        dtype="float32",
    )
    results, measured = {}, {}
    for name, loss_fn in implementations().items():
        try:
            measured[name], results[name] = measure(name, loss_fn, joiner, inputs, case, device)
        except AttributeError as err:  # a torchaudio without rnnt_loss
            if name != "torchaudio":
                raise
            report.record("implementation", implementation=name, unavailable=str(err))
            continue
        report.record("implementation", **measured[name])
    report.record(
        "triton_against",
        **{
            name: {
                "time_ratio": m["seconds"] / measured["triton"]["seconds"],
                "memory_ratio": m["peak_bytes"] / measured["triton"]["peak_bytes"]
                if m["peak_bytes"] and measured["triton"]["peak_bytes"]
                else None,
            }
            for name, m in measured.items()
            if name != "triton"
        },
    )
    comparisons = [("triton", "torch", results["torch"], GRAD_RTOL)]
    reference = float64_reference(joiner, inputs)
    comparisons += [(name, REFERENCE, reference, FP32_GRAD_RTOL) for name in results]
    for name, against, want, grad_rtol in comparisons:
        found = disagreement(results[name], want, grad_rtol)
        report.record(
            "agreement", implementation=name, reference=against, grad_rtol=grad_rtol, **found
        )
        if found["ok"] and not measured[name]["padding_grad_max"]:
            continue
        message = (
            f"{name} against {against}: {found}, gradient bound {grad_rtol:g}, largest "
            f"gradient on padding {measured[name]['padding_grad_max']:.3g}"
        )
        if name in OURS:
            report.fail(message)
        else:
            report.warn(f"{message} (a third-party loss: training uses it only when asked to)")
    auto = check_auto(joiner, inputs, device)
    report.record("auto", **auto)
    if auto["reason"]:
        report.fail(f"lattice=auto gave the Triton kernels up on this device: {auto['reason']}")
    check_tdt(report, case, device)

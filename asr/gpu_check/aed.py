"""GPU check, section `aed`: issue 5's decoding-speed target for the flash AED layout.

`experiment=librispeech_aed_flash` (deep encoder, 4 decoder layers) against
`experiment=librispeech_aed_deep` (its equal-size deep-decoder counterpart), both with
random weights: greedy decoding (`model.encode`, then `greedy_search`, as `asr-transcribe`
runs it) of 16 utterances of 5-20 s, one at a time and all 16 in one batch. Random weights
would stop at a random EOS, so EOS is suppressed and every utterance decodes exactly its
length limit at LibriSpeech's token rate: both models emit the same tokens, and the RTFx
ratio flash / deep measures the layer split alone. Target: >= 2.5x (a warning if missed).
A rehearsal runs the demo pair on 1-2 s inputs on the CPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from asr.decoding.aed import greedy_search, max_output_lengths
from asr.frames import FRAMES_PER_SECOND
from asr.gpu_check.random_models import (
    TOKENS_PER_SECOND,
    AedCase,
    batches,
    build,
    eos_suppressed,
    utterance_features,
)
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.timing import clock
from asr.models.aed import EncoderDecoder
from asr.models.build import count_parameters

TARGET_RATIO = 2.5  # issue 5: flash decodes at least 2.5x faster than deep, whole decode
# `asr-transcribe` runs the model as loaded: float32 weights, no autocast.
PRECISION = "float32"
MODELS = ("deep", "flash")


GPU_CASE = AedCase(
    "librispeech_aed_deep", "librispeech_aed_flash", 1024, 5.0, 20.0, 16, (16, 1), repeats=3
)
REHEARSAL_CASE = AedCase("demo_aed_deep", "demo_aed_flash", 64, 1.0, 2.0, 4, (2, 1), repeats=2)


@dataclass(frozen=True)
class Pass:
    """One model's decode of every utterance at one batch size."""

    encoder_s: float
    search_s: float
    tokens: list[int]  # per utterance, in input order
    expected: list[int]  # the search's length limit of each utterance
    finite: bool  # every encoder output was finite

    @property
    def seconds(self) -> float:
        return self.encoder_s + self.search_s


@torch.inference_mode()
def decode_pass(
    model: EncoderDecoder, batches: Sequence[tuple[Tensor, Tensor]], device: str
) -> Pass:
    """Encode and greedy-search every batch (EOS suppressed by the caller), timed."""
    encoder_s = search_s = 0.0
    tokens: list[int] = []
    expected: list[int] = []
    finite = True
    for features, lens in batches:
        start = clock(device)
        encoder_out, encoder_lens = model.encode(features, lens)
        encoded = clock(device)
        ids = greedy_search(model, encoder_out, encoder_lens, TOKENS_PER_SECOND)
        done = clock(device)
        encoder_s += encoded - start
        search_s += done - encoded
        tokens += [len(i) for i in ids]
        limits = max_output_lengths(encoder_lens, model.frame_seconds, TOKENS_PER_SECOND)
        expected += limits.tolist()
        finite = finite and bool(torch.isfinite(encoder_out).all())
    return Pass(encoder_s, search_s, tokens, expected, finite)


def timed_passes(
    models: dict[str, EncoderDecoder],
    batched: Sequence[tuple[Tensor, Tensor]],
    repeats: int,
    device: str,
) -> dict[str, list[Pass]]:
    """`repeats` passes of each model, in the order deep, flash, flash, deep, ... so that
    drift in the machine's speed hits both alike."""
    passes: dict[str, list[Pass]] = {name: [] for name in models}
    order = list(models)
    for _ in range(repeats):
        for name in order:
            passes[name].append(decode_pass(models[name], batched, device))
        order.reverse()
    return passes


def check_counts(report: Report, name: str, batch_size: int, passes: Sequence[Pass]) -> None:
    """`report.fail` unless every pass decoded exactly the expected tokens per utterance
    and its encoder outputs were finite."""
    for p in passes:
        wrong = [
            f"utterance {i}: {got} tokens, expected {want}"
            for i, (got, want) in enumerate(zip(p.tokens, p.expected, strict=True))
            if got != want
        ]
        if wrong:
            report.fail(f"{name} model, batch {batch_size}: " + "; ".join(wrong[:4]))
            return
        if not p.finite:
            report.fail(f"{name} model, batch {batch_size}: non-finite encoder output")
            return


def decode_record(passes: Sequence[Pass], audio_s: float) -> dict[str, Any]:
    """RTFx and the medians of the passes' encoder, search and whole times."""
    seconds = statistics.median(p.seconds for p in passes)
    search_s = statistics.median(p.search_s for p in passes)
    tokens = sum(passes[0].tokens)
    return {
        "rtfx": audio_s / seconds,
        "seconds": seconds,
        "encoder_seconds": statistics.median(p.encoder_s for p in passes),
        "search_seconds": search_s,
        "search_tokens_per_second": tokens / search_s,
        "tokens": tokens,
        "pass_seconds": [p.seconds for p in passes],
    }


def run(report: Report, options: SectionOptions) -> None:
    if not options.rehearsal:
        compare(report, GPU_CASE, options.device)
        return
    # One intra-op thread: the toy models gain nothing from more, and on a small shared
    # CPU two threads made the rehearsal's passes several times slower and erratic.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        compare(report, REHEARSAL_CASE, options.device)
    finally:
        torch.set_num_threads(threads)


def compare(report: Report, case: AedCase, device: str) -> None:
    """Build both models, decode at every batch size, report times, ratios and faults."""
    presets = {"deep": case.deep, "flash": case.flash}
    models = {name: build(presets[name], case.vocab_size, device) for name in MODELS}
    for name, model in models.items():
        report.record(
            "model", model=name, preset=presets[name], parameters=count_parameters(model),
            encoder_layers=len(model.encoder.layers), decoder_layers=len(model.decoder.layers),
            vocab_size=case.vocab_size,
        )  # fmt: skip
    features = utterance_features(case, models["deep"].encoder.config.input_dim)
    audio_s = sum(f.size(0) for f in features) / FRAMES_PER_SECOND
    report.record(
        "setup", device=device, precision=PRECISION,
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        utterances=len(features), audio_seconds=audio_s,
        shortest_s=case.shortest_s, longest_s=case.longest_s,
        tokens_per_second=TOKENS_PER_SECOND, repeats=case.repeats,
    )  # fmt: skip
    layer_ratio = len(models["deep"].decoder.layers) / len(models["flash"].decoder.layers)
    with eos_suppressed(models["deep"]), eos_suppressed(models["flash"]):
        for model in models.values():  # warm-up: CUDA context, kernels, cuBLAS workspaces
            for size in case.batch_sizes:
                decode_pass(model, batches(features, size, device)[-1:], device)
        for size in case.batch_sizes:
            passes = timed_passes(models, batches(features, size, device), case.repeats, device)
            lines = {}
            for name in MODELS:
                check_counts(report, name, size, passes[name])
                lines[name] = decode_record(passes[name], audio_s)
                report.record("decode", model=name, batch_size=size, **lines[name])
            if passes["deep"][0].expected != passes["flash"][0].expected:
                report.fail(f"batch {size}: the models' token limits differ (subsampling?)")
            ratio = lines["flash"]["rtfx"] / lines["deep"]["rtfx"]
            decoder_only = lines["deep"]["search_seconds"] / lines["flash"]["search_seconds"]
            report.record(
                "ratio", batch_size=size, rtfx_ratio=ratio, decoder_only_ratio=decoder_only,
                decoder_layer_ratio=layer_ratio, target=TARGET_RATIO,
            )  # fmt: skip
            if ratio < TARGET_RATIO:
                report.warn(
                    f"batch {size}: flash decodes {ratio:.2f}x as fast as deep, below the "
                    f"{TARGET_RATIO}x target (search alone: {decoder_only:.2f}x; the deep "
                    f"model has {layer_ratio:.2f}x the decoder layers)"
                )

"""GPU bench, section `decode`: decoding speed (RTFx) of the searches `asr-decode` and
`asr-transcribe` run, and the shallow-decoder AED's claim.

Claim (Żelasko et al., arXiv 2503.05931, Canary-1B-Flash): moving decoder layers into the
encoder gives about 3x the inference speed (RTFx) at equal accuracy. Measured before this
section: 1.50-1.67x on an H100/H200 at batch 16, the greedy loop bound by kernel launches
from Python. Target here: flash/deep >= 2.5x at batch 32 with the CUDA-graph search, or
the bound shown by where the time goes (encoder against search).

Inputs: 5-20 s of random features (a rehearsal: 1-2 s), random weights, float32 as the
commands load a model, timed at batch 32 (every utterance) and batch 1 (the first
`single_utterances`, one at a time); each time is encoder + search, synchronized.

- Transducer (`experiment=librispeech_transducer`, 102 M): greedy search frame by frame
  (`greedy_search_timed`, the CPU's search), label-looping with CUDA graphs (what the
  commands use on CUDA) and without them, and beam search (4). Random weights would emit
  at a random rate: the blank logit's bias is set (bisection) so that greedy search emits
  LibriSpeech's 3.8 tokens per second, and every search decodes the same model. The
  label-looping search must give the frame-looping one's tokens and frames exactly, and
  again with a biasing graph (phrases: token trigrams of the frame-looping hypotheses), its
  tables in the graph's static buffers.
- AED flash/deep (`librispeech_aed_flash` against `librispeech_aed_deep`, as the GPU
  check's `aed` section): EOS suppressed, so each utterance decodes exactly its length
  limit at 3.8 tokens per second with either model; greedy search with a growing cache
  (the CPU's) and with the preallocated cache replayed from a CUDA graph (CUDA's), which
  must give the same tokens. Ratio flash/deep per search and batch size.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from asr.decoding.aed import StaticGreedySearch, greedy_search
from asr.decoding.biasing import BiasingGraph
from asr.decoding.label_looping import LabelLoopingGreedy
from asr.decoding.search import decode_with
from asr.decoding.transducer import FrameLoopingGreedy
from asr.decoding.transducer_beam import BeamOptions, BeamSearch
from asr.frames import FRAMES_PER_SECOND
from asr.gpu_check.random_models import (
    RATE_TOLERANCE,
    TOKENS_PER_SECOND,
    AedCase,
    Search,
    batches,
    blank_shift,
    calibrate_blank,
    eos_suppressed,
    utterance_features,
)
from asr.gpu_check.random_models import build as build_model_of
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.timing import clock
from asr.models.build import count_parameters
from asr.models.transducer import Transducer
from asr.training.oomptimizer import compose_config

TARGET_RATIO = 2.5  # issue 46: flash/deep at batch 32 with the CUDA-graph search


@dataclass(frozen=True)
class DecodeCase:
    """The transducer preset, the AED pair and its inputs (`AedCase`: utterances, their
    durations, vocabulary), the batch sizes, how many utterances batch 1 decodes, and the
    timed passes per search."""

    transducer: str
    aed: AedCase
    batch_sizes: tuple[int, ...]
    single_utterances: int
    repeats: int


GPU_CASE = DecodeCase(
    "librispeech_transducer",
    AedCase(
        "librispeech_aed_deep", "librispeech_aed_flash", 1024, 5.0, 20.0, 32, (32, 1), repeats=3
    ),
    batch_sizes=(32, 1),
    single_utterances=8,
    repeats=2,
)
REHEARSAL_CASE = DecodeCase(
    "demo",
    AedCase("demo_aed_deep", "demo_aed_flash", 64, 1.0, 2.0, 4, (4, 1), repeats=2),
    batch_sizes=(4, 1),
    single_utterances=2,
    repeats=1,
)


@dataclass(frozen=True)
class Timed:
    """One timed pass: encoder and search seconds, and each utterance's tokens."""

    encoder_s: float
    search_s: float
    hyps: list[list[int]]


@torch.inference_mode()
def timed_pass(
    encode: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    search: Search,
    batched: Sequence[tuple[Tensor, Tensor]],
    device: str,
) -> Timed:
    """Encode and search every batch, timed apart."""
    encoder_s = search_s = 0.0
    hyps: list[list[int]] = []
    for features, lens in batched:
        start = clock(device)
        out, out_lens = encode(features, lens)
        encoded = clock(device)
        hyps += search(out, out_lens)
        search_s += clock(device) - encoded
        encoder_s += encoded - start
    return Timed(encoder_s, search_s, hyps)


def rate_record(passes: Sequence[Timed], audio_s: float) -> dict[str, Any]:
    """RTFx and the medians of the passes' encoder and search seconds."""
    encoder_s = statistics.median(p.encoder_s for p in passes)
    search_s = statistics.median(p.search_s for p in passes)
    tokens = sum(map(len, passes[0].hyps))
    return {
        "rtfx": audio_s / (encoder_s + search_s),
        "seconds": encoder_s + search_s,
        "encoder_seconds": encoder_s,
        "search_seconds": search_s,
        "search_share": search_s / (encoder_s + search_s),
        "tokens": tokens,
        "search_tokens_per_second": tokens / search_s if search_s > 0 else None,
    }


@torch.inference_mode()
def search_profile(
    search: Search, encoded: Sequence[tuple[Tensor, Tensor]], device: str
) -> dict[str, Any]:
    """Where a search's time goes: its wall seconds over `encoded`, and on CUDA the
    seconds its kernels kept the GPU busy (`torch.profiler`): a busy share near 1 means
    the search is bound by its arithmetic, far below 1 by launches and round trips."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        start = clock(device)
        for out, lens in encoded:
            search(out, lens)
        wall = clock(device) - start
    events = prof.key_averages()
    syncs = sum(e.count for e in events if e.key == "aten::_local_scalar_dense")
    record: dict[str, Any] = {"wall_seconds": wall, "host_reads": syncs}
    if device == "cuda":
        busy = sum(e.self_device_time_total for e in events) / 1e6
        record.update(gpu_busy_seconds=busy, gpu_busy_share=busy / wall)
    return record


def transducer_searches(model: Transducer) -> dict[str, Search]:
    """The searches compared, by name: each gives token ids per utterance."""
    searches = {
        "greedy_frame_looping": FrameLoopingGreedy(),
        "greedy_label_looping_graphs": LabelLoopingGreedy(loops="auto"),
        "greedy_label_looping_eager": LabelLoopingGreedy(loops="eager"),
        "beam_4": BeamSearch(BeamOptions(beam_size=4)),
    }

    def tokens_of(search: Any) -> Search:
        return lambda e, n: [h.tokens for h in decode_with(search, model, e, n)]

    return {name: tokens_of(search) for name, search in searches.items()}


def bench_transducer(report: Report, case: DecodeCase, features: list[Tensor], device: str) -> None:
    model = build_model_of(case.transducer, case.aed.vocab_size, device, Transducer)
    report.record(
        "model", kind="transducer", preset=case.transducer, parameters=count_parameters(model)
    )
    audio_s = sum(f.size(0) for f in features) / FRAMES_PER_SECOND
    searches = transducer_searches(model)
    with torch.inference_mode():
        encoded = [model.encode(f, n) for f, n in batches(features, case.batch_sizes[0], device)]
    # Random weights emit at a random rate, and beam search (summing over alignments)
    # emits fewer tokens than greedy search on the same weights: each gets its own shift.
    shifts = {}
    for name in ("greedy_frame_looping", "beam_4"):
        shift, rate = calibrate_blank(model, encoded, audio_s, searches[name])
        shifts[name] = shift
        report.record(
            "calibration", search=name, blank_bias_shift=shift, tokens_per_second=rate,
            target_tokens_per_second=TOKENS_PER_SECOND,
        )  # fmt: skip
        if abs(rate / TOKENS_PER_SECOND - 1) > RATE_TOLERANCE:
            report.warn(f"{name} emits {rate:.2f} tokens/s after calibration, not ~3.8")
    del encoded
    shift_of = {n: shifts["beam_4" if n == "beam_4" else "greedy_frame_looping"] for n in searches}
    for size in case.batch_sizes:
        inputs = features if size > 1 else features[: case.single_utterances]
        seconds = sum(f.size(0) for f in inputs) / FRAMES_PER_SECOND
        batched = batches(inputs, size, device)
        for name, search in searches.items():  # warm-up: kernels, cuDNN plans, graph capture
            with blank_shift(model, shift_of[name]):
                timed_pass(model.encode, search, batched[-1:], device)
        lines = {}
        for name, search in searches.items():
            with blank_shift(model, shift_of[name]):
                passes = [
                    timed_pass(model.encode, search, batched, device) for _ in range(case.repeats)
                ]
            lines[name] = passes
            report.record("decode", model="transducer", search=name, batch_size=size,
                          utterances=len(inputs), audio_seconds=seconds,
                          **rate_record(passes, seconds))  # fmt: skip
        frame = lines["greedy_frame_looping"][0].hyps
        for name in ("greedy_label_looping_graphs", "greedy_label_looping_eager"):
            if lines[name][0].hyps != frame:
                differ = sum(a != b for a, b in zip(lines[name][0].hyps, frame, strict=True))
                report.fail(f"batch {size}: {name} differs from frame-looping greedy search "
                            f"on {differ} of {len(frame)} utterances")  # fmt: skip
        if size == case.batch_sizes[0]:
            with blank_shift(model, shift_of["greedy_frame_looping"]):
                check_biased_label_looping(report, model, batched, frame)
        base = rate_record(lines["greedy_frame_looping"], seconds)["rtfx"]
        report.record(
            "speedup", model="transducer", batch_size=size,
            label_looping_graphs=rate_record(lines["greedy_label_looping_graphs"], seconds)["rtfx"]
            / base,
            label_looping_eager=rate_record(lines["greedy_label_looping_eager"], seconds)["rtfx"]
            / base,
        )  # fmt: skip


BIASING_SCORE = 2.0  # per token: enough to change some random-weight hypotheses


def check_biased_label_looping(
    report: Report,
    model: Transducer,
    batched: Sequence[tuple[Tensor, Tensor]],
    hyps: list[list[int]],
) -> None:
    """With a biasing graph of token trigrams taken from `hyps`, the label-looping search
    (CUDA graphs on CUDA) must give frame-looping greedy search's tokens and frames."""
    phrases = [
        (h[i : i + 3], BIASING_SCORE)
        for h in hyps
        for i in range(0, len(h) - 2, 4)
        if min(h[i : i + 3]) > 3  # text tokens only
    ][:200]
    graph = BiasingGraph.from_tokens(
        phrases or [([4, 5, 6], BIASING_SCORE)], model.joiner.vocab_size
    )
    search, greedy = LabelLoopingGreedy(loops="auto"), FrameLoopingGreedy()
    differ = changed = 0
    with torch.inference_mode():
        for features, lens in batched:
            out, out_lens = model.encode(features, lens)
            frame = decode_with(greedy, model, out, out_lens, graph)
            plain = decode_with(greedy, model, out, out_lens)
            label = decode_with(search, model, out, out_lens, graph)
            differ += sum(
                (a.tokens, a.frames) != (b.tokens, b.frames)
                for a, b in zip(label, frame, strict=True)
            )
            changed += sum(a.tokens != b.tokens for a, b in zip(frame, plain, strict=True))
    report.record(
        "context_biasing", phrases=graph.num_phrases, states=graph.num_states,
        utterances_changed_by_biasing=changed, label_looping_differs=differ,
    )  # fmt: skip
    if differ:
        report.fail(
            f"with a biasing graph, label looping differs from frame-looping greedy search "
            f"on {differ} utterances"
        )


def bench_aed(report: Report, case: DecodeCase, features: list[Tensor], device: str) -> None:
    pair = {"deep": case.aed.deep, "flash": case.aed.flash}
    models = {
        name: build_model_of(preset, case.aed.vocab_size, device) for name, preset in pair.items()
    }
    for name, model in models.items():
        report.record("model", kind="aed", model=name, preset=pair[name],
                      parameters=count_parameters(model),
                      encoder_layers=len(model.encoder.layers),
                      decoder_layers=len(model.decoder.layers))  # fmt: skip
    searches: dict[str, dict[str, Search]] = {
        name: {
            "greedy_growing_cache": lambda e, n, m=model: greedy_search(m, e, n, TOKENS_PER_SECOND),
            "greedy_static_cache_graphs": StaticGreedySearch(model, TOKENS_PER_SECOND),
        }
        for name, model in models.items()
    }
    with eos_suppressed(models["deep"]), eos_suppressed(models["flash"]):
        for size in case.batch_sizes:
            inputs = features if size > 1 else features[: case.single_utterances]
            seconds = sum(f.size(0) for f in inputs) / FRAMES_PER_SECOND
            batched = batches(inputs, size, device)
            rtfx: dict[tuple[str, str], dict[str, Any]] = {}
            for name, model in models.items():
                for search in searches[name].values():
                    timed_pass(model.encode, search, batched[-1:], device)
                hyps = {}
                for search_name, search in searches[name].items():
                    passes = [
                        timed_pass(model.encode, search, batched, device)
                        for _ in range(case.repeats)
                    ]
                    hyps[search_name] = passes[0].hyps
                    rtfx[name, search_name] = rate_record(passes, seconds)
                    report.record("decode", model=f"aed_{name}", search=search_name,
                                  batch_size=size, utterances=len(inputs), audio_seconds=seconds,
                                  **rtfx[name, search_name])  # fmt: skip
                if hyps["greedy_static_cache_graphs"] != hyps["greedy_growing_cache"]:
                    report.fail(f"aed {name}, batch {size}: the static-cache search's tokens "
                                "differ from greedy search's")  # fmt: skip
            for search_name in searches["deep"]:
                deep, flash = rtfx["deep", search_name], rtfx["flash", search_name]
                ratio = flash["rtfx"] / deep["rtfx"]
                report.record(
                    "ratio", search=search_name, batch_size=size, rtfx_ratio=ratio,
                    search_only_ratio=deep["search_seconds"] / flash["search_seconds"],
                    encoder_only_ratio=deep["encoder_seconds"] / flash["encoder_seconds"],
                    # With a free search the ratio would be the encoders' alone; with a free
                    # encoder, the searches' alone: where the measured ratio sits between.
                    flash_search_share=flash["search_share"],
                    deep_search_share=deep["search_share"], target=TARGET_RATIO,
                )  # fmt: skip
                graphs = search_name == "greedy_static_cache_graphs"
                if graphs and size == max(case.batch_sizes):
                    for name, model in models.items():
                        with torch.inference_mode():
                            encoded = [model.encode(f, n) for f, n in batched]
                        report.record(
                            "profile", model=f"aed_{name}", search=search_name, batch_size=size,
                            **search_profile(searches[name][search_name], encoded, device),
                        )  # fmt: skip
                        del encoded
                if graphs and size == max(case.batch_sizes) and ratio < TARGET_RATIO:
                    report.warn(
                        f"batch {size}: flash decodes {ratio:.2f}x as fast as deep with the "
                        f"CUDA-graph search, below {TARGET_RATIO}x: the search takes "
                        f"{deep['search_share']:.0%} of deep's time and "
                        f"{flash['search_share']:.0%} of flash's (the encoders alone: "
                        f"{deep['encoder_seconds'] / flash['encoder_seconds']:.2f}x)"
                    )


def run(report: Report, options: SectionOptions) -> None:
    case = REHEARSAL_CASE if options.rehearsal else GPU_CASE
    threads = torch.get_num_threads()
    if options.rehearsal:
        torch.set_num_threads(1)  # toy models; two threads made the CPU's passes erratic
    try:
        input_dim = compose_config([f"experiment={case.transducer}"]).model.encoder.input_dim
        features = utterance_features(case.aed, input_dim)
        report.record(
            "setup", device=options.device, precision="float32",
            utterances=len(features), single_utterances=case.single_utterances,
            shortest_s=case.aed.shortest_s, longest_s=case.aed.longest_s,
            audio_seconds=sum(f.size(0) for f in features) / FRAMES_PER_SECOND,
            batch_sizes=case.batch_sizes, repeats=case.repeats,
            tokens_per_second=TOKENS_PER_SECOND,
        )  # fmt: skip
        bench_transducer(report, case, features, options.device)
        bench_aed(report, case, features, options.device)
    finally:
        torch.set_num_threads(threads)

"""Models with seeded random weights and random inputs, as the decoding sections time them.

The check's `aed` section and the bench's `decode`, `lm-fusion` and `streaming` sections
decode random weights: a preset's model built and seeded (`build`), utterances of random
features at evenly spread durations (`utterance_features`, padded into `batches`), and,
where random weights would stop at a random EOS, EOS suppressed so that every utterance
decodes exactly its length limit at LibriSpeech's token rate (`TOKENS_PER_SECOND`); where a
transducer's random weights would emit at a random rate, its blank logit raised until a
search emits that rate (`calibrate_blank`, then `blank_shift`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
from omegaconf import OmegaConf
from torch import Tensor

from asr.frames import FRAMES_PER_SECOND
from asr.models.aed import EncoderDecoder
from asr.models.build import build_model
from asr.models.transducer import Transducer
from asr.training.oomptimizer import compose_config

# LibriSpeech speech runs at about 2.7 words per second (test-clean: 52,576 words in
# 5.4 h) and BPE 1024 spends about 1.4 tokens per word.
TOKENS_PER_SECOND = 3.8
RATE_TOLERANCE = 0.1  # a calibrated emission rate within 10 % of TOKENS_PER_SECOND
BIAS_STEPS = 14  # bisection steps on the blank bias

# A search as the sections time it: encoder output (B, T, D) and lengths (B,) -> token ids.
Search = Callable[[Tensor, Tensor], list[list[int]]]


@dataclass(frozen=True)
class AedCase:
    """The presets compared, the inputs, and how often each decode is timed."""

    deep: str  # experiment preset of the deep-decoder model
    flash: str
    vocab_size: int
    shortest_s: float
    longest_s: float
    utterances: int
    batch_sizes: tuple[int, ...]  # the cheap full batch first: its ratio is reported soonest
    repeats: int  # timed passes per model and batch size, in alternating order


@contextmanager
def eos_suppressed(model: EncoderDecoder) -> Iterator[None]:
    """Within: the decoder's EOS logit is -inf, so greedy search decodes every utterance
    to its length limit ceil(seconds x max_tps), whatever the weights. Restored after."""
    bias = model.decoder.output_bias
    saved = bias[model.eos_id].item()
    with torch.no_grad():
        bias[model.eos_id] = -math.inf
    try:
        yield
    finally:
        with torch.no_grad():
            bias[model.eos_id] = saved


ModelT = TypeVar("ModelT", bound=torch.nn.Module)


def build(preset: str, vocab_size: int, device: str, kind: type[ModelT] = EncoderDecoder) -> ModelT:
    """The preset's model with seeded random weights, built on `device`, in eval mode; it
    must be a `kind` (an AED by default)."""
    cfg = compose_config([f"experiment={preset}"])
    torch.manual_seed(0)
    with torch.device(device):
        model = build_model(OmegaConf.to_container(cfg.model, resolve=True), vocab_size)
    if not isinstance(model, kind):
        raise TypeError(
            f"experiment={preset} builds a {type(model).__name__}, not a {kind.__name__}"
        )
    return model.eval()


def utterance_features(case: AedCase, input_dim: int) -> list[Tensor]:
    """`case.utterances` random (T, F) feature matrices, durations evenly spread from
    `shortest_s` to `longest_s` (10 ms frames), shortest first, seeded."""
    return random_features(case.utterances, case.shortest_s, case.longest_s, input_dim)


def random_features(
    count: int, shortest_s: float, longest_s: float, input_dim: int
) -> list[Tensor]:
    """`count` random (T, F) feature matrices, durations evenly spread from `shortest_s`
    to `longest_s` (10 ms frames), shortest first, seeded."""
    generator = torch.Generator().manual_seed(0)
    seconds = torch.linspace(shortest_s, longest_s, count)
    frames = (seconds * FRAMES_PER_SECOND).round().long().tolist()
    return [torch.randn(n, input_dim, generator=generator) for n in frames]


def batches(features: Sequence[Tensor], size: int, device: str) -> list[tuple[Tensor, Tensor]]:
    """Consecutive groups of `size` utterances, padded, on `device`: (B, T, F), (B,)."""
    out = []
    for start in range(0, len(features), size):
        group = features[start : start + size]
        lens = torch.tensor([f.size(0) for f in group])
        padded = torch.nn.utils.rnn.pad_sequence(list(group), batch_first=True)
        out.append((padded.to(device), lens.to(device)))
    return out


@contextmanager
def blank_shift(model: Transducer, shift: float) -> Iterator[None]:
    """Within: the joiner's blank logit raised by `shift` (more blanks, fewer tokens); then
    exactly as it was (set back, not shifted back: no rounding builds up over many uses)."""
    bias = model.joiner.output.bias
    saved = bias[model.blank_id].item()
    with torch.no_grad():
        bias[model.blank_id] = saved + shift
    try:
        yield
    finally:
        with torch.no_grad():
            bias[model.blank_id] = saved


@torch.inference_mode()
def calibrate_blank(
    model: Transducer,
    encoded: Sequence[tuple[Tensor, Tensor]],
    audio_s: float,
    search: Search,
    around: float = 0.0,
    span: float = 30.0,
    steps: int = BIAS_STEPS,
) -> tuple[float, float]:
    """The blank shift (bisection from `around`, within `span` of it, at most `steps`
    steps) at which `search` emits about TOKENS_PER_SECOND tokens per second of audio on
    the encoder outputs `encoded`: (shift, tokens per second)."""

    def rate(shift: float) -> float:
        with blank_shift(model, shift):
            return sum(len(h) for out, lens in encoded for h in search(out, lens)) / audio_s

    low, high = around - span, around + span  # more blank as the shift grows: the rate falls
    shift, found = around, rate(around)
    for _ in range(steps):
        if abs(found / TOKENS_PER_SECOND - 1) <= RATE_TOLERANCE:
            break
        low, high = (shift, high) if found > TOKENS_PER_SECOND else (low, shift)
        shift = (low + high) / 2
        found = rate(shift)
    return shift, found

"""GPU bench, section `streaming`: what a streaming transducer costs to train at each chunk
size it is trained with, and how fast it decodes many live streams at once.

`experiment=librispeech_streaming` (the 102 M Conformer-Transducer, chunked and causal;
docs/streaming.md) with random weights, no data:

- training: one fresh model per trained chunk size (160, 320, 640 ms and full context),
  each built with that chunk size alone and the largest trained left context, so that
  every step draws it; `TRAIN_STEPS` optimizer steps in bf16 autocast on worst-case batches
  (`asr.gpu_check.train_steps.train_steps`: `train_batch` utterances of `train_seconds`, 32 x
  15 s, with LibriSpeech's token rate); the median step time after two (forward, backward,
  optimizer step), audio seconds per second and peak memory per chunk size.
- decoding: the model with every chunk size at its largest left context, as
  `StreamingRecognizer` runs it on a GPU (bf16 autocast, greedy search), fed
  `stream_seconds` of noise per stream in 0.1 s pieces (`asr.gpu_check.streams.
  decode_streams`: all streams decoded after each piece, the device synchronized at the
  end), with 1, 16 and 64 concurrent streams at each chunk size: RTFx (audio seconds of all
  streams over wall seconds, the front end's features included) after one untimed pass
  over the first second of every stream. Random weights would emit a token at nearly every
  frame (the search's cap is 3 a frame: 75 a second), a search 20 times busier than a
  trained model's, so the blank's output bias is first raised (by bisection, on 4 s of
  one stream at the largest chunk) until the model emits LibriSpeech's 3.8 tokens a second;
  each record counts the tokens it emitted.

A rehearsal runs `experiment=demo_streaming` (with the stateless predictor: oneDNN has no
bf16 LSTM on CPUs without bf16 arithmetic) on the CPU, in float32 for decoding, with 1, 2
and 4 streams of 2 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import OmegaConf

from asr.data.features import FeatureConfig
from asr.frames import FRAMES_PER_SECOND, SAMPLE_RATE
from asr.gpu_check.random_models import TOKENS_PER_SECOND
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.streams import decode_streams
from asr.gpu_check.train_steps import PRECISION, random_weights_setup, train_steps
from asr.inference.streaming import StreamingRecognizer
from asr.models.build import build_model, count_parameters
from asr.models.conformer import FULL_CONTEXT, Chunking
from asr.models.transducer import Transducer
from asr.training.oomptimizer import Bucket, compose_config
from asr.training.probes import ModelSetup

TRAIN_STEPS = 6  # the first two are not timed (train_steps' median skips them)
BISECTIONS = 10  # of the blank's bias, over [0, MAX_BLANK_BIAS]
MAX_BLANK_BIAS = 32.0
CALIBRATION_SECONDS = 4.0  # of the first stream's audio


@dataclass(frozen=True)
class StreamingCase:
    """The preset, the training batches (`train_batch` utterances of `train_seconds`) and
    the streams (`stream_counts` of `stream_seconds` each)."""

    overrides: tuple[str, ...]
    vocab_size: int
    train_batch: int
    train_seconds: float
    stream_counts: tuple[int, ...]
    stream_seconds: float


GPU_CASE = StreamingCase(
    ("experiment=librispeech_streaming",), 1024, train_batch=32, train_seconds=15.0,
    stream_counts=(1, 16, 64), stream_seconds=10.0,
)  # fmt: skip
REHEARSAL_CASE = StreamingCase(
    ("experiment=demo_streaming", "model.predictor.kind=stateless"), 128, train_batch=2,
    train_seconds=2.0, stream_counts=(1, 2, 4), stream_seconds=2.0,
)  # fmt: skip


def chunk_setup(case: StreamingCase, chunk: int, left: int) -> ModelSetup:
    """The preset trained at `chunk` encoder frames (-1: full context) and `left` alone."""
    cfg = compose_config([
        *case.overrides,
        f"model.encoder.streaming.chunk_sizes=[{chunk}]",
        f"model.encoder.streaming.left_contexts=[{left}]",
    ])  # fmt: skip
    return random_weights_setup(cfg, case.vocab_size)


def training(
    report: Report, case: StreamingCase, chunks: list[int], left: int, frame_ms: float, device: str
) -> None:
    """A `training` record per chunk size (`frame_ms`: an encoder frame's milliseconds)."""
    tokens = max(1, round(case.train_seconds * TOKENS_PER_SECOND))
    bucket = Bucket(case.train_seconds, tokens)
    for chunk in chunks:
        setup = chunk_setup(case, chunk, left)
        steps = train_steps(setup, bucket, case.train_batch, TRAIN_STEPS, device)
        report.record(
            "training",
            chunk_frames=chunk,
            chunk_ms=None if chunk == FULL_CONTEXT else chunk * frame_ms,
            left_frames=None if chunk == FULL_CONTEXT else left,
            utterance_seconds=case.train_seconds,
            tokens=tokens,
            precision=PRECISION,
            **steps,
        )
        if steps["oom_steps"]:
            report.fail(f"chunk {chunk}: {steps['oom_steps']} training steps ran out of memory")
        if not steps["losses_finite"]:
            report.fail(f"chunk {chunk}: a training loss was not finite")
        if device == "cuda":
            torch.cuda.empty_cache()


def noise(case: StreamingCase, count: int) -> list[np.ndarray]:
    """`count` recordings of `case.stream_seconds` of seeded noise, 16 kHz float32."""
    rng = np.random.default_rng(0)
    samples = round(case.stream_seconds * SAMPLE_RATE)
    return [(0.1 * rng.standard_normal(samples)).astype(np.float32) for _ in range(count)]


def calibrate_blank(recognizer: StreamingRecognizer, audio: np.ndarray) -> dict[str, float]:
    """Raise the blank's output bias until `audio` decoded as one stream emits about
    `TOKENS_PER_SECOND` (bisection: more bias, fewer tokens) -> the bias added and the rate."""
    bias = recognizer.model.joiner.output.bias
    blank = recognizer.model.blank_id
    base = bias.detach()[blank].item()
    seconds = len(audio) / SAMPLE_RATE
    low, high = 0.0, MAX_BLANK_BIAS

    def rate(added: float) -> float:
        with torch.no_grad():
            bias[blank] = base + added
        tokens, _ = decode_streams(recognizer, [audio])
        return len(tokens[0]) / seconds

    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        if rate(middle) > TOKENS_PER_SECOND:
            low = middle
        else:
            high = middle
    added = (low + high) / 2
    return {"blank_bias_added": added, "calibration_tokens_per_second": rate(added)}


def decoding(
    report: Report, case: StreamingCase, chunks: list[int], left: int, device: str
) -> None:
    """A `decode` record per chunk size and number of streams."""
    cfg = compose_config(list(case.overrides))
    torch.manual_seed(0)
    with torch.device(device):
        model = build_model(OmegaConf.to_container(cfg.model, resolve=True), case.vocab_size)
    if not isinstance(model, Transducer):
        raise TypeError(f"{case.overrides} builds a {type(model).__name__}, not a transducer")
    features = FeatureConfig(**OmegaConf.to_container(cfg.data.features, resolve=True))
    autocast = torch.bfloat16 if device == "cuda" else None
    audio = noise(case, max(case.stream_counts))
    recognizers = {
        # the tokenizer is read only for text, which this section never asks for
        chunk: StreamingRecognizer(
            model, None, features, Chunking(chunk, left), device=device, autocast=autocast  # type: ignore[arg-type]
        )
        for chunk in chunks
    }  # fmt: skip
    calibration = calibrate_blank(
        recognizers[max(chunks)], audio[0][: round(CALIBRATION_SECONDS * SAMPLE_RATE)]
    )
    report.record(
        "decode_setup",
        parameters=count_parameters(model),
        chunks=chunks,
        left_frames=left,
        stream_seconds=case.stream_seconds,
        precision=str(autocast or "float32"),
        target_tokens_per_second=TOKENS_PER_SECOND,
        **calibration,
    )
    for chunk, recognizer in recognizers.items():
        for count in case.stream_counts:
            streams = audio[:count]
            decode_streams(recognizer, [a[:SAMPLE_RATE] for a in streams])  # warm-up
            tokens, seconds = decode_streams(recognizer, streams)
            audio_s = count * case.stream_seconds
            report.record(
                "decode",
                chunk_frames=chunk,
                chunk_ms=recognizer.chunk_seconds * 1000,
                streams=count,
                audio_s=audio_s,
                seconds=seconds,
                rtfx=audio_s / seconds,
                tokens_per_audio_second=sum(len(t) for t in tokens) / audio_s,
            )


def run(report: Report, options: SectionOptions) -> None:
    device = options.device
    case = REHEARSAL_CASE if options.rehearsal else GPU_CASE
    cfg = compose_config(list(case.overrides))
    streaming = cfg.model.encoder.streaming
    chunks = [int(c) for c in streaming.chunk_sizes]
    left = max(int(x) for x in streaming.left_contexts)
    frame_ms = cfg.model.encoder.subsampling_factor * 1000 / FRAMES_PER_SECOND
    report.record(
        "setup",
        overrides=case.overrides,
        trained_chunk_frames=chunks,
        left_frames=left,
        frame_ms=frame_ms,
        device_name=torch.cuda.get_device_name() if device == "cuda" else device,
    )
    training(report, case, chunks, left, frame_ms, device)
    decoding(report, case, [c for c in chunks if c != FULL_CONTEXT], left, device)

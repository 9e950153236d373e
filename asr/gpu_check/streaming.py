"""GPU check, section `streaming`: a streaming transducer trained and decoded on CUDA.

`experiment=demo_streaming`, shrunk as the `ddp` section shrinks the transducer, trains
`MAX_STEPS` optimizer steps through `asr-train` (1-process DDP, `trainer.precision=auto`:
bf16-mixed on a GPU) on the noise corpus, with its global feature statistics computed
first as the recipe's stage 3 computes them; each step draws its chunk size (80 or 160 ms,
or full context) and left context. Its checkpoint then decodes `STREAMS` concurrent
streams fed 0.1 s pieces on the device, under bf16 autocast (its RTFx is recorded), and
in fp32 chunk by chunk against the whole utterances through the same chunked masks: the
tokens must be equal (the blank's bias is lowered first, so that the briefly trained model
emits tokens).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asr.data.corpus import load_cuts
from asr.data.feature_stats import compute_feature_stats
from asr.data.features import FeatureConfig
from asr.decoding.search import decode_with
from asr.decoding.transducer import FrameLoopingGreedy
from asr.gpu_check.noise_corpus import DEV, TRAIN, make_noise_corpus
from asr.gpu_check.report import Report, SectionOptions
from asr.gpu_check.streams import decode_streams
from asr.gpu_check.train_runs import (
    TINY_MODEL,
    TrainRun,
    check_common,
    column,
    ended,
    free_ports,
    run_overrides,
    start_training,
)
from asr.inference.bundle import load_bundle
from asr.inference.streaming import StreamingRecognizer, ended_as_a_stream
from asr.models.conformer import Chunking
from asr.training.metrics_csv import metric_rows

STREAMS = 8
CHUNKS, LEFT = (2, 4), 8  # encoder frames (x 40 ms)
BLANK_HANDICAP = 4.0  # subtracted from the blank's logit bias before decoding
TINY_STREAMING = (  # the ddp section's tiny transducer, streaming
    "experiment=demo_streaming",
    "init_from=null",  # the tiny model starts from scratch, not from make demo's bundle
    *(o for o in TINY_MODEL if not o.startswith("experiment=")),
    f"model.encoder.streaming.chunk_sizes=[{CHUNKS[0]},{CHUNKS[1]},-1]",
    f"model.encoder.streaming.left_contexts=[{LEFT}]",
)
RUN = TrainRun("streaming", "streaming transducer training, a chunk size drawn per step")


def whole_utterances(recognizer: StreamingRecognizer, audio: list[np.ndarray]) -> list[list[int]]:
    """The tokens of each utterance encoded whole through the recognizer's chunked masks,
    ending as a stream ends (`ended_as_a_stream`)."""
    model, device = recognizer.model, recognizer.device
    extractor = recognizer.features.extractor()
    tokens = []
    with torch.inference_mode():
        for samples in audio:
            padded, frames = ended_as_a_stream(samples, model, recognizer.chunking)
            feats = torch.from_numpy(extractor.extract(padded, 16000)[:frames])[None].to(device)
            lens = torch.tensor([feats.size(1)], device=device)
            out, lens = model.encode(feats, lens, recognizer.chunking)
            tokens.append(decode_with(FrameLoopingGreedy(), model, out, lens)[0].tokens)
    return tokens


def check_decoding(report: Report, checkpoint: Path, corpus_cuts: list[Path], device: str) -> None:
    """The `decode` record: bf16 streams' RTFx, and fp32 streams against whole utterances."""
    model, tokenizer, features = load_bundle(checkpoint)
    with torch.no_grad():  # 6 steps teach blanks only: equal empty hypotheses would show nothing
        model.joiner.output.bias[model.blank_id] -= BLANK_HANDICAP
    cuts = [c for path in corpus_cuts for c in load_cuts(path)][:STREAMS]
    audio = [c.load_audio()[0].astype(np.float32) for c in cuts]
    seconds = sum(len(a) for a in audio) / 16000
    config = FeatureConfig(**features)
    results: dict[str, Any] = {"streams": len(audio), "audio_s": seconds}
    autocast = torch.bfloat16 if device == "cuda" else None
    for chunk in CHUNKS:
        chunking = Chunking(chunk, LEFT)
        fast = StreamingRecognizer(
            model, tokenizer, config, chunking, device=device, autocast=autocast
        )
        decode_streams(fast, audio[:1])  # warm-up: kernels, allocator
        _, took = decode_streams(fast, audio)
        exact = StreamingRecognizer(model, tokenizer, config, chunking, device=device)
        streamed, _ = decode_streams(exact, audio)
        whole = whole_utterances(exact, audio)
        same = sum(s == w for s, w in zip(streamed, whole, strict=True))
        results[f"chunk_{chunk}"] = {
            "rtfx": seconds / took,
            "fp32_equal_to_whole": same,
            "tokens": sum(len(t) for t in streamed),
        }
        if not results[f"chunk_{chunk}"]["tokens"]:
            report.fail(f"streaming at chunk {chunk} on {device}: no tokens emitted")
        if same != len(audio):
            report.fail(
                f"streaming at chunk {chunk} on {device}: {len(audio) - same} of {len(audio)} "
                "streams' tokens differ from the whole utterances' through the same masks"
            )
    report.record("decode", device=device, precision=str(autocast or "fp32"), **results)


def _found(pattern: str, text: str) -> str | None:
    match = re.search(pattern, text)
    return match.group(1) if match else None


def run(report: Report, options: SectionOptions) -> None:
    began = time.monotonic()
    work = Path(options.work_dir)
    shutil.rmtree(work / "corpus", ignore_errors=True)
    with contextlib.redirect_stdout(sys.stderr):  # the manifests' progress bars
        corpus = make_noise_corpus(work / "corpus")
    stats_path = work / "feature_stats.json"
    librosa = FeatureConfig(frontend="librosa", source="on_the_fly")
    compute_feature_stats([corpus.cuts(TRAIN)], librosa, progress=False).write(stats_path)
    exp_dir = work / f"exp_{RUN.name}"
    overrides = [
        *TINY_STREAMING,
        *run_overrides(corpus, exp_dir, options.device, corpus.tokenizer),
        f"model.encoder.feature_stats={stats_path}",
    ]
    deadline = began + options.limit_s - 25.0  # the decoding after it
    started = start_training(RUN, overrides, exp_dir, options, free_ports(1)[0])
    (done,) = list(ended([started], deadline))
    rows = metric_rows(exp_dir)
    log_text = done.log.read_text(errors="replace")
    losses = column(rows, "train/loss")
    facts = {
        "optimizer_steps": len({step for step, _ in losses}),
        "losses": [loss for _, loss in losses],
        "losses_finite": bool(losses) and all(np.isfinite(loss) for _, loss in losses),
        "validations": len(column(rows, "val/wer")),
        "backend": _found(r"distributed_backend=(\w+)", log_text),
        "precision": _found(r"precision: (\S+)", log_text),
    }
    report.record("train_run", run=RUN.name, exit_code=done.exit_code, wall_s=done.wall_s, **facts)
    if not check_common(report, RUN.checks, options.device, done.exit_code, done.log, facts):
        return
    cuts = [corpus.cuts(DEV), corpus.cuts(TRAIN)]
    check_decoding(report, exp_dir / "checkpoints" / "last.ckpt", cuts, options.device)

"""Streaming on the demo: WER per chunk size, latency, RTFx with 1 and 8 streams, memory over
a long stream, and sherpa-onnx's online recognizer against ours. Prints JSON lines.

    python scripts/benchmark_streaming.py exp/demo_streaming/model.bundle.pt \\
        data/demo/manifests/librispeech_cuts_test-clean.jsonl.gz \\
        --baseline exp/demo/model.bundle.pt --onnx exp/demo_streaming/onnx

Sections (`--only` picks some, comma-separated):

- `wer`: each trained chunk size (and full context) decoded through its chunked masks,
  which chunk-by-chunk decoding equals (tests/inference/test_streaming.py), greedy; beside
  it the `--baseline` full-context model's WER on the same cuts.
- `latency`: one stream fed 10 ms pieces as they would arrive; for each chunk, the
  milliseconds from the piece that completes it to its partial result (the compute); the
  algorithmic latency is the chunk plus the last feature frame's overhang (120 samples).
- `rtfx`: audio seconds per wall second with 1 and with 8 concurrent streams fed 100 ms
  pieces (torch threads: `--threads`), at each chunk size.
- `memory`: one stream of `--long-minutes` minutes (the cuts repeated) fed 100 ms pieces;
  the process's resident memory every 5 minutes of audio.
- `sherpa`: `--onnx` (the streaming export) decoded by sherpa-onnx's OnlineRecognizer fed
  100 ms pieces and followed by the silence a client sends (the export's
  `tail_padding_seconds`, or `--tail-seconds`) and `input_finished()`, against our
  recognizer at the exported chunk on the recording alone (sherpa-onnx's 10 symbols per
  frame): the share of utterances with the same text and with the same last word, and
  both WERs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import torch

from asr.data.corpus import cut_text, load_cuts
from asr.data.features import FeatureConfig
from asr.frames import SAMPLE_RATE
from asr.inference.bundle import load_bundle
from asr.inference.manifest_decoding import decode_manifest
from asr.inference.recognizer import load_recognizer
from asr.inference.streaming import StreamingRecognizer, largest_chunking
from asr.metrics import corpus_errors
from asr.models.conformer import FULL, Chunking

SECTIONS = ("wer", "latency", "rtfx", "memory", "sherpa")


class Loaded:
    """The streaming model, tokenizer and features, loaded once; `at(chunk, ...)` gives a
    recognizer at a trained chunk (None: the largest) and the largest left context (or
    `left`)."""

    def __init__(self, path: Path) -> None:
        self.model, self.tokenizer, features = load_bundle(path)
        self.features = FeatureConfig(**features)

    def at(
        self, chunk: int | None = None, left: int | None = None, **options
    ) -> StreamingRecognizer:
        largest = largest_chunking(self.model)
        chunking = Chunking(chunk or largest.chunk, left or largest.left)
        return StreamingRecognizer(self.model, self.tokenizer, self.features, chunking, **options)


def emit(section: str, **fields) -> None:
    print(json.dumps({"section": section, **fields}), flush=True)


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def wer_section(args, model_path: Path, trained: list[int], frame_ms: float) -> None:
    loaded = load_recognizer(model_path)
    model = loaded.model
    left = max(model.encoder.streaming.left_contexts)
    for chunk in [*trained, -1]:
        recognizer = loaded.with_chunking(Chunking(chunk, left) if chunk > 0 else FULL)
        name = f"chunk{chunk}" if chunk > 0 else "full"
        summary = decode_manifest(recognizer, args.cuts, args.work / f"decode-{name}", 200.0, 1)
        emit("wer", model=str(model_path), chunk_ms=chunk * frame_ms if chunk > 0 else None,
             left_frames=left if chunk > 0 else None, wer=summary["wer"],
             words=summary["ref_words"])  # fmt: skip
    if args.baseline:
        summary = decode_manifest(
            load_recognizer(args.baseline), args.cuts, args.work / "decode-baseline", 200.0, 1
        )
        emit("wer", model=str(args.baseline), chunk_ms=None, baseline=True,
             wer=summary["wer"], words=summary["ref_words"])  # fmt: skip


def latency_section(args, loaded: Loaded, audio: list[np.ndarray], trained: list[int]) -> None:
    piece = SAMPLE_RATE // 100  # 10 ms
    for chunk in trained:
        recognizer = loaded.at(chunk)
        span_samples = recognizer.span * SAMPLE_RATE // 100
        waits = []
        for samples in audio[: args.latency_utterances]:
            stream = recognizer.create_stream()
            for start in range(0, len(samples), piece):
                stream.accept_waveform(samples[start : start + piece])
                before = stream.encoded
                began = time.perf_counter()
                recognizer.decode([stream])
                if stream.encoded > before:  # this piece completed a chunk: its partial result
                    waits.append((time.perf_counter() - began) * 1000)
        ms = span_samples * 1000 // SAMPLE_RATE
        emit("latency", chunk_ms=ms, algorithmic_ms=ms + 120 * 1000 / SAMPLE_RATE,
             compute_ms_median=statistics.median(waits),
             compute_ms_p95=float(np.percentile(waits, 95)), chunks=len(waits),
             threads=torch.get_num_threads())  # fmt: skip


def rtfx_section(loaded: Loaded, audio: list[np.ndarray], trained: list[int]) -> None:
    seconds = sum(len(a) for a in audio) / SAMPLE_RATE
    for chunk in trained:
        recognizer = loaded.at(chunk)
        for streams in (1, 8):
            recognizer.feed(audio[:streams])  # warm-up
            began = time.perf_counter()
            for group in range(0, len(audio), streams):
                recognizer.feed(audio[group : group + streams])
            took = time.perf_counter() - began
            emit("rtfx", chunk_ms=recognizer.chunk_seconds * 1000, streams=streams,
                 audio_s=seconds, wall_s=took, rtfx=seconds / took,
                 threads=torch.get_num_threads())  # fmt: skip


def memory_section(args, loaded: Loaded, audio: list[np.ndarray]) -> None:
    recognizer = loaded.at()
    stream = recognizer.create_stream()
    total = int(args.long_minutes * 60 * SAMPLE_RATE)
    joined = np.concatenate(audio)
    fed, next_mark, began = 0, 0, time.perf_counter()
    marks = []
    while fed < total:
        piece = joined[fed % len(joined) :][:1600]
        stream.accept_waveform(piece)
        recognizer.decode([stream])
        fed += len(piece)
        if fed >= next_mark:
            marks.append(
                {"audio_minutes": round(fed / SAMPLE_RATE / 60, 2), "rss_mib": resident_mib()}
            )
            next_mark += 5 * 60 * SAMPLE_RATE
    stream.finish()
    recognizer.decode([stream])
    marks.append({"audio_minutes": round(fed / SAMPLE_RATE / 60, 2), "rss_mib": resident_mib()})
    emit("memory", chunk_ms=recognizer.chunk_seconds * 1000, marks=marks,
         growth_mib=marks[-1]["rss_mib"] - marks[1]["rss_mib"], words=len(stream.text.split()),
         rtfx=fed / SAMPLE_RATE / (time.perf_counter() - began))  # fmt: skip


def sherpa_section(args, loaded: Loaded, audio: list[np.ndarray], refs: list[str]) -> None:
    import sherpa_onnx

    meta = {p.key: p.value for p in onnx.load(args.onnx / "encoder.onnx").metadata_props}
    chunk = int(meta["chunk_frames"])
    ours = loaded.at(chunk, int(meta["left_context"]), max_symbols_per_frame=10)  # sherpa's
    # sherpa-onnx decodes whole windows only, and one when a frame past it is ready: its
    # client sends the silence the export's metadata names after each recording (ours
    # decodes the last, shorter chunk itself: it gets the recording alone)
    tail = float(meta["tail_padding_seconds"]) if args.tail_seconds is None else args.tail_seconds
    pad = np.zeros(int(tail * SAMPLE_RATE), np.float32)
    d = args.onnx
    sherpa = sherpa_onnx.OnlineRecognizer.from_transducer(
        tokens=str(d / "tokens.txt"), encoder=str(d / "encoder.onnx"),
        decoder=str(d / "decoder.onnx"), joiner=str(d / "joiner.onnx"), num_threads=1,
    )  # fmt: skip
    theirs, mine = [], []
    for samples in audio:
        padded = np.concatenate([samples, pad])
        stream = sherpa.create_stream()
        for start in range(0, len(padded), 1600):
            stream.accept_waveform(SAMPLE_RATE, padded[start : start + 1600])
            while sherpa.is_ready(stream):
                sherpa.decode_stream(stream)
        stream.input_finished()  # its last feature frames become ready
        while sherpa.is_ready(stream):
            sherpa.decode_stream(stream)
        theirs.append(" ".join(sherpa.get_result(stream).split()))
        mine.append(" ".join(ours.feed([samples])[0].text.split()))
    same = sum(a == b for a, b in zip(theirs, mine, strict=True))
    last = sum(a.split()[-1:] == b.split()[-1:] for a, b in zip(theirs, mine, strict=True))
    emit("sherpa", chunk_ms=ours.chunk_seconds * 1000, tail_seconds=tail,
         utterances=len(audio), same_text=same / len(audio), same_last_word=last / len(audio),
         wer_sherpa=corpus_errors(refs, theirs).wer,
         wer_ours=corpus_errors(refs, mine).wer)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", type=Path, help="a streaming model's bundle or checkpoint")
    parser.add_argument("cuts", type=Path, help="the cuts to decode (test-clean)")
    parser.add_argument("--baseline", type=Path, help="a full-context model to compare WER with")
    parser.add_argument("--onnx", type=Path, help="the streaming model's ONNX export (sherpa)")
    parser.add_argument(
        "--tail-seconds",
        type=float,
        default=None,
        help="sherpa: silence after each recording (default: the export's tail_padding_seconds)",
    )
    parser.add_argument("--only", default=",".join(SECTIONS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--latency-utterances", type=int, default=20)
    parser.add_argument("--long-minutes", type=float, default=30.0)
    parser.add_argument("--work", type=Path, default=Path("exp/benchmark_streaming"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sections = args.only.split(",")
    loaded = Loaded(args.model)
    trained = list(loaded.model.encoder.streaming.streaming_chunk_sizes)
    frame_ms = loaded.model.frame_seconds * 1000
    cuts = list(load_cuts(args.cuts))
    audio = [c.load_audio()[0].astype(np.float32) for c in cuts]
    refs = [cut_text(c) for c in cuts]
    emit("setup", model=str(args.model), cuts=str(args.cuts), utterances=len(cuts),
         audio_s=sum(len(a) for a in audio) / SAMPLE_RATE,
         trained_chunks_ms=[c * frame_ms for c in trained], threads=args.threads)  # fmt: skip
    if "wer" in sections:
        wer_section(args, args.model, trained, frame_ms)
    if "latency" in sections:
        latency_section(args, loaded, audio, trained)
    if "rtfx" in sections:
        rtfx_section(loaded, audio, trained)
    if "memory" in sections:
        memory_section(args, loaded, audio)
    if "sherpa" in sections and args.onnx:
        sherpa_section(args, loaded, audio, refs)


if __name__ == "__main__":
    main()

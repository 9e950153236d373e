"""ONNX export against PyTorch on a test set: equal hypotheses, WER, and decoding speed.

    python scripts/benchmark_export.py exp/demo/checkpoints/last.ckpt \
        data/demo/manifests/librispeech_cuts_test-clean.jsonl.gz --onnx exp/demo/onnx

Exports the checkpoint to `--onnx` first when that directory has no export. Then, greedy
search on every utterance of the manifest, one utterance at a time (a file transcribed as
it comes), audio read once beforehand, each decoder warmed up on the first utterance:

- `wer` lines: WER of PyTorch at the default tokens per frame (3) and at sherpa-onnx's
  limit (1 in icefall's contract, a stateless predictor; 10 in NeMo's, an LSTM one; 5 for
  a token-and-duration transducer in NeMo's), of
  this package's onnxruntime decoder (`--onnx`, fp32 and int8) and of sherpa-onnx (fp32,
  int8) at that limit;
- `equality` lines: the share of utterances on which sherpa-onnx's hypothesis equals
  PyTorch's at that limit (fp32 and int8), and the WER differences;
- `rtfx` lines: seconds of audio per second of decoding (features included) for
  sherpa-onnx, the onnxruntime decoder and PyTorch, with 1 and 2 threads.

Every line is JSON; the last one sums them up.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from asr.data.corpus import cut_text, load_cuts
from asr.frames import SAMPLE_RATE
from asr.inference.onnx_durations import SHERPA_TDT_TOKENS_PER_FRAME
from asr.inference.onnx_export import export_onnx
from asr.inference.onnx_runtime import (
    DECODER,
    ENCODER,
    JOINER,
    TOKENS,
    load_onnx_recognizer,
    onnx_file,
)
from asr.inference.recognizer import load_recognizer
from asr.metrics import corpus_errors

Transcriber = Callable[[np.ndarray], str]


def sherpa_transcriber(directory: Path, int8: bool, threads: int, nemo: bool) -> Transcriber:
    import sherpa_onnx

    parts = [str(directory / onnx_file(name, int8)) for name in (ENCODER, DECODER, JOINER)]
    recognizer = sherpa_onnx.OfflineRecognizer.from_transducer(
        *parts,
        str(directory / TOKENS),
        num_threads=threads,
        decoding_method="greedy_search",
        model_type="nemo_transducer" if nemo else "",
    )

    def transcribe(samples: np.ndarray) -> str:
        stream = recognizer.create_stream()
        stream.accept_waveform(SAMPLE_RATE, samples)
        recognizer.decode_stream(stream)
        return " ".join(stream.result.text.split())

    return transcribe


def run(transcribe: Transcriber, audio: list[np.ndarray]) -> tuple[list[str], float]:
    """Hypotheses of every utterance, and the seconds it took."""
    start = time.perf_counter()
    hyps = [transcribe(samples) for samples in audio]
    return hyps, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--onnx", type=Path, required=True, help="export directory")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--max-utterances", type=int, default=None)
    parser.add_argument("--ema", action="store_true", help="the checkpoint's EMA weights")
    args = parser.parse_args()
    if not (args.onnx / onnx_file(ENCODER)).is_file():
        export_onnx([args.checkpoint], args.onnx, ema=args.ema)
    cuts = list(load_cuts(args.manifest))[: args.max_utterances]
    audio = [cut.load_audio()[0].astype(np.float32) for cut in cuts]
    refs = [cut_text(cut) for cut in cuts]
    seconds = sum(cut.duration for cut in cuts)
    results: dict[str, dict] = {}
    exported = load_onnx_recognizer(args.onnx).model
    stateless = exported.predictor.kind == "stateless"
    limit = 1 if stateless else 10  # sherpa-onnx's greedy search: icefall's, NeMo's
    if exported.durations is not None:  # NeMo's TDT greedy search (DecodeOneTDT)
        limit = SHERPA_TDT_TOKENS_PER_FRAME

    def record(name: str, threads: int, transcribe: Transcriber) -> None:
        transcribe(audio[0])  # warm-up: first-call allocations and kernel choices untimed
        hyps, elapsed = run(transcribe, audio)
        line = {
            "decoder": name,
            "threads": threads,
            "wer": round(100 * corpus_errors(refs, hyps).wer, 3),
            "rtfx": round(seconds / elapsed, 1),
            "utterances": len(hyps),
            "audio_seconds": round(seconds, 1),
        }
        results[f"{name}@{threads}"] = {**line, "hyps": hyps}
        print(json.dumps({"kind": "run", **line}), flush=True)

    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for symbols in (None, limit):
            recognizer = load_recognizer(
                args.checkpoint, "cpu", max_symbols_per_frame=symbols, ema=args.ema
            )
            name = f"pytorch-sym{symbols or 'default'}"
            record(name, threads, lambda s, r=recognizer: r.transcribe([s], 1)[0])
        for int8 in (False, True):
            precision = "int8" if int8 else "fp32"
            ours = load_onnx_recognizer(args.onnx, 1, limit, int8, threads)
            name = f"onnxruntime-{precision}-sym{limit}"
            record(name, threads, lambda s, r=ours: r.transcribe([s], 1)[0])
            record(
                f"sherpa-onnx-{precision}",
                threads,
                sherpa_transcriber(args.onnx, int8, threads, nemo=not stateless),
            )
    base = results[f"pytorch-sym{limit}@1"]
    summary = {"kind": "summary", "checkpoint": str(args.checkpoint), "onnx": str(args.onnx)}
    for precision in ("fp32", "int8"):
        other = results[f"sherpa-onnx-{precision}@1"]
        same = sum(a == b for a, b in zip(base["hyps"], other["hyps"], strict=True))
        line = {
            "kind": "equality",
            "compared": f"sherpa-onnx {precision} vs pytorch, {limit} token(s) per frame",
            "equal_utterances": same,
            "utterances": len(cuts),
            "equal_share": round(same / len(cuts), 4),
            "wer_difference": round(other["wer"] - base["wer"], 3),
        }
        print(json.dumps(line), flush=True)
        summary[f"sherpa_{precision}_equal_share"] = line["equal_share"]
        summary[f"sherpa_{precision}_wer_difference"] = line["wer_difference"]
    summary["wer"] = {k: v["wer"] for k, v in results.items() if k.endswith("@1")}
    summary["rtfx"] = {k: v["rtfx"] for k, v in results.items()}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

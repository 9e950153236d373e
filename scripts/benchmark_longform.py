"""Long recordings and word timestamps on the demo test set, against the synthesizer's
word times.

    python scripts/benchmark_longform.py exp/demo_stateless/model.bundle.pt \
        data/demo/manifests/librispeech_cuts_test-clean.jsonl.gz \
        --onnx exp/demo_stateless/onnx --minutes 5 30 --sweep

Every line is JSON:

- `utterances`: each test utterance decoded alone and whole: WER and word start error (mean and
  95th percentile of |start - true start|, and the mean signed error).
- `sherpa`: with `--onnx`, sherpa-onnx's token timestamps (greedy search) turned into word
  starts, against the truth and against this package's on the same export.
- `long`: per `--minutes`, a file of the test utterances joined with 0.5-1.5 s gaps
  (repeated to that length) transcribed in windows in a fresh process: WER, the WER of the
  same utterances decoded one by one, word start errors, RTFx, and the process's peak
  RSS beside its RSS once the model is loaded and warm.
- `sweep`: with `--sweep`, the first length cut at longer pauses only (0.5 s) and in fixed
  windows only (`max_pause` 0); the same utterances joined without gaps, cut as by default
  and, as one stretch of speech, in windows of several sizes merged at the overlaps.

The joined files go to `--work-dir` (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from asr.benchmarks.longform import (
    cut_words,
    error_summary,
    join_cuts,
    matched_starts,
    sherpa_word_times,
)
from asr.data.corpus import cut_text, load_cuts
from asr.frames import SAMPLE_RATE
from asr.inference.longform import DEFAULT_MAX_PAUSE, DEFAULT_OVERLAP, DEFAULT_WINDOW, WindowConfig
from asr.inference.recognizer import Recognizer, load_recognizer
from asr.inference.timestamps import Transcript, Word
from asr.metrics import corpus_errors

GAPS = (0.5, 1.5)  # seconds of noise floor between two joined utterances
NO_GAPS = (0.0, 0.0)  # 0.3 s of quiet between two utterances: their own edges
# --sweep: (gaps, window, overlap, max_pause). The joined file cut at longer pauses only
# and in fixed windows only; then the utterances joined without gaps, cut at pauses as by
# default, and as one stretch of speech in overlapping windows merged at the overlaps.
SWEEP = (
    (GAPS, DEFAULT_WINDOW, DEFAULT_OVERLAP, 0.5),
    (GAPS, DEFAULT_WINDOW, DEFAULT_OVERLAP, 0.0),
    (NO_GAPS, DEFAULT_WINDOW, DEFAULT_OVERLAP, DEFAULT_MAX_PAUSE),
    (NO_GAPS, 10.0, 2.0, 0.0),
    (NO_GAPS, 20.0, 2.0, 0.0),
    (NO_GAPS, 20.0, 4.0, 0.0),
    (NO_GAPS, 30.0, 6.0, 0.0),
)


def emit(line: dict) -> None:
    print(json.dumps(line), flush=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args: argparse.Namespace) -> None:
    """Transcribe one file in windows; print its words, time and memory as JSON."""
    windows = WindowConfig(args.window, args.overlap, args.max_pause)
    recognizer = load_recognizer(args.model, windows=windows)
    recognizer.transcribe(np.zeros(SAMPLE_RATE, np.float32))  # warm up
    loaded = peak_rss_mb()
    start = time.perf_counter()
    (transcript,) = recognizer.transcribe(args.worker, timestamps=True)
    seconds = time.perf_counter() - start
    words = [asdict(w) for w in transcript.words]
    print(
        json.dumps(
            {
                "words": words,
                "seconds": seconds,
                "model_rss_mb": loaded,
                "peak_rss_mb": peak_rss_mb(),
            }
        )
    )


def run_worker(model: Path, path: Path, window: float, overlap: float, max_pause: float) -> dict:
    command = [
        sys.executable,
        __file__,
        str(model),
        "-",
        "--worker",
        str(path),
        "--window",
        str(window),
        "--overlap",
        str(overlap),
        "--max-pause",
        str(max_pause),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["words"] = [Word(**w) for w in result["words"]]
    return result


def alone(recognizer: Recognizer, audio: list[np.ndarray]) -> list[Transcript]:
    """Each utterance decoded alone, whole (not cut at pauses): the baseline."""
    return [
        recognizer.transcripts_of_features([recognizer.features_of(samples)])[0]
        for samples in audio
    ]


def utterance_lines(args: argparse.Namespace, cuts: list) -> dict[str, str]:
    """Decode each test utterance alone (PyTorch, and with --onnx sherpa-onnx and our
    onnxruntime decoder at one token per frame); emit the lines; hypotheses by cut id."""
    recognizer = load_recognizer(args.model)
    audio = [cut.load_audio()[0] for cut in cuts]
    truth = [cut_words(cut) for cut in cuts]
    start = time.perf_counter()
    ours = alone(recognizer, audio)
    elapsed = time.perf_counter() - start
    refs = [cut_text(cut) for cut in cuts]
    errors = [e for t, ref in zip(ours, truth, strict=True) for e in matched_starts(t.words, ref)]
    emit(
        {
            "line": "utterances",
            "model": str(args.model),
            "utterances": len(cuts),
            "wer": round(100 * corpus_errors(refs, [t.text for t in ours]).wer, 2),
            "rtfx": round(sum(c.duration for c in cuts) / elapsed, 1),
            "word_start": error_summary(errors),
        }
    )
    if args.onnx is not None:
        from asr.inference.onnx_runtime import load_onnx_recognizer

        onnx = load_onnx_recognizer(args.onnx, max_symbols_per_frame=1)
        ours_onnx = alone(onnx, audio)
        sherpa = sherpa_word_times(args.onnx, audio)
        emit(
            {
                "line": "sherpa",
                "onnx": str(args.onnx),
                "sherpa_word_start": error_summary(
                    e for s, ref in zip(sherpa, truth, strict=True) for e in matched_starts(s, ref)
                ),
                "ours_word_start": error_summary(
                    e
                    for t, ref in zip(ours_onnx, truth, strict=True)
                    for e in matched_starts(t.words, ref)
                ),
                "ours_minus_sherpa": error_summary(
                    e
                    for t, s in zip(ours_onnx, sherpa, strict=True)
                    for e in matched_starts(t.words, s)
                ),
                "same_text_share": round(
                    float(
                        np.mean(
                            [
                                " ".join(w.word for w in s) == t.text
                                for s, t in zip(sherpa, ours_onnx, strict=True)
                            ]
                        )
                    ),
                    4,
                ),
            }
        )
    return {cut.id: t.text for cut, t in zip(cuts, ours, strict=True)}


def long_line(args, cuts, one_by_one, minutes, gaps, window, overlap, max_pause) -> dict:
    path = args.work_dir / f"joined_{minutes:g}min_gaps{gaps[0]:g}-{gaps[1]:g}.flac"
    joined = join_cuts(cuts, path, minutes * 60, gaps)
    result = run_worker(args.model, path, window, overlap, max_pause)
    hyp = " ".join(w.word for w in result["words"])
    order = [cuts[i % len(cuts)].id for i in range(joined.utterances)]
    alone = " ".join(one_by_one[cut_id] for cut_id in order)
    return {
        "minutes": minutes,
        "audio_seconds": round(joined.duration, 1),
        "window": window,
        "overlap": overlap,
        "max_pause": max_pause,
        "gaps": list(gaps),
        "wer": round(100 * corpus_errors([joined.text], [hyp]).wer, 2),
        "wer_one_by_one": round(100 * corpus_errors([joined.text], [alone]).wer, 2),
        "word_start": error_summary(matched_starts(result["words"], joined.words)),
        "rtfx": round(joined.duration / result["seconds"], 1),
        "peak_rss_mb": round(result["peak_rss_mb"], 1),
        "model_rss_mb": round(result["model_rss_mb"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a bundle or checkpoint (a transducer)")
    parser.add_argument("manifest", help="a test cut manifest whose supervisions have word times")
    parser.add_argument("--onnx", type=Path, default=None, help="its ONNX export (sherpa-onnx)")
    parser.add_argument("--minutes", type=float, nargs="+", default=[5.0, 30.0])
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW)
    parser.add_argument("--overlap", type=float, default=DEFAULT_OVERLAP)
    parser.add_argument("--sweep", action="store_true", help="other windows on the first length")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--max-pause", type=float, default=DEFAULT_MAX_PAUSE)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.work_dir = args.work_dir or Path(tmp)
        cuts = list(load_cuts(args.manifest))
        one_by_one = utterance_lines(args, cuts)
        settings = (GAPS, args.window, args.overlap, args.max_pause)
        for minutes in args.minutes:
            emit({"line": "long", **long_line(args, cuts, one_by_one, minutes, *settings)})
        for setting in SWEEP if args.sweep else ():
            line = long_line(args, cuts, one_by_one, args.minutes[0], *setting)
            emit({"line": "sweep", **line})


if __name__ == "__main__":
    main()

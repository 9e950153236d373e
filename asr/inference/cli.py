"""The inference command lines: `asr-export`, `asr-transcribe`, `asr-decode` and `asr-serve`.

    asr-export exp/demo/checkpoints/last.ckpt --average 3 -o exp/demo/model.bundle.pt
    asr-transcribe exp/demo/model.bundle.pt a.flac b.wav --beam-size 4
    asr-decode exp/demo/model.bundle.pt data/demo/manifests/librispeech_cuts_test-clean.jsonl.gz
    asr-export exp/demo/checkpoints/last.ckpt --format onnx -o exp/demo/onnx
    asr-transcribe --onnx exp/demo/onnx a.flac --max-symbols-per-frame 1
    asr-transcribe exp/demo/model.bundle.pt meeting.wav --timestamps --output-format srt
    asr-transcribe exp/demo/model.bundle.pt a.flac --biasing-phrases names.txt --biasing-score 2
    asr-decode exp/demo/model.bundle.pt MANIFEST --beam-size 8 --lm lm.arpa --lm-weight 0.3 \
        --lodr lodr.arpa --lodr-weight 0.1
    arecord -f S16_LE -r 16000 -c 1 -t raw | asr-transcribe --streaming --chunk-ms 320 \
        exp/demo_streaming/model.bundle.pt -

`asr-transcribe` takes recordings of any length (overlapping windows, `--window`,
`--overlap`; docs/transcribe.md); a file that cannot be read is named on stderr and the
others are still transcribed (exit status 1). With `--streaming` (a streaming model,
docs/streaming.md) it feeds each file, or raw 16 kHz 16-bit PCM on standard input (`-`),
to the model chunk by chunk, shows the partial transcript on a terminal as it changes,
and prints the final one.

`asr-decode MODEL MANIFEST` decodes a cut manifest, writes hypotheses and prints the WER.
MODEL is a bundle (asr-export) or a training checkpoint; `--onnx DIR` instead of MODEL
decodes an ONNX export with onnxruntime (docs/export.md). It writes into `--output-dir`:
`hyps.jsonl` (one line per utterance: id, ref, hyp, substitutions, deletions,
insertions, ref_words) and `wer.json` (corpus totals; with `--lm`, `language_model`: the
files and weights fused, which the output directory's name also gives). An utterance whose
audio cannot be read is never left out of the WER: it counts as all deletions (an empty
hypothesis, marked `"unreadable"` in hyps.jsonl), and the number of such utterances is
printed. Errors that are not about one file (a wrong sample rate, a bug) stop the run.

`--lm`, `--lm-weight`, `--lodr` and `--lodr-weight` (asr-transcribe, asr-decode, asr-serve)
fuse a token n-gram (`asr-train-lm`) with the search; `asr-sweep` chooses the weights on a
dev set (`asr.inference.sweep`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from asr.cli import command
from asr.decoding.biasing import (
    DEFAULT_BIASING_SCORE,
    MAX_BIASING_SCORE,
    BiasingGraph,
    check_biasing_score,
    read_biasing_phrases,
)
from asr.frames import SAMPLE_RATE
from asr.inference.audio import open_audio
from asr.inference.bundle import (
    BUNDLE_FILE,
    ENCODER_FILE,
    ONNX_DIR,
    epoch_of,
    export_bundle,
    export_encoder,
    select_checkpoints,
)
from asr.inference.language_model import (
    add_lm_arguments,
    check_lm_options,
    language_model_of,
    lm_description,
    lm_settings,
)
from asr.inference.longform import DEFAULT_MAX_PAUSE, DEFAULT_OVERLAP, DEFAULT_WINDOW, WindowConfig
from asr.inference.manifest_decoding import decode_manifest
from asr.inference.recognizer import Recognizer, load_recognizer
from asr.inference.streaming import chunking_of_ms, load_streaming_recognizer
from asr.inference.timestamps import OUTPUT_FORMATS, Transcript, render

log = logging.getLogger(__name__)


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """`--epoch E --avg N` / `--best` (and `--average`, `--avg`'s old name) of asr-export
    and asr-decode, so that a recipe decodes exactly the model it exports."""
    parser.add_argument(
        "--epoch", type=int, default=None, help="end at epoch=EE.ckpt (0-based, as the files)"
    )
    parser.add_argument(
        "--avg", "--average", type=int, default=1, help="average N epochs ending there"
    )
    parser.add_argument(
        "--best",
        action="store_true",
        help="best.ckpt (lowest dev WER; pre-training: lowest dev loss)",
    )
    parser.add_argument("--ema", action="store_true", help="the EMA weights (ema=scaled runs)")


def _add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and search options of asr-transcribe and asr-decode."""
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--beam-size",
        type=int,
        default=1,
        help="1: greedy search; more: beam search of that width",
    )
    parser.add_argument(
        "--max-symbols-per-frame",
        type=int,
        default=None,
        help="transducers: at most N tokens per encoder frame (default 3; sherpa-onnx's "
        "greedy search emits 1)",
    )
    parser.add_argument(
        "--onnx",
        type=Path,
        default=None,
        metavar="DIR",
        help="decode the ONNX export in DIR (asr-export --format onnx) with onnxruntime on "
        "the CPU; then no MODEL argument",
    )
    parser.add_argument("--int8", action="store_true", help="--onnx: the *.int8.onnx files")
    parser.add_argument("--num-threads", type=int, default=1, help="--onnx: onnxruntime's threads")
    parser.add_argument(
        "--biasing-phrases",
        type=Path,
        default=None,
        metavar="FILE",
        help="phrases to boost (names, jargon), one per line, each optionally followed by "
        "' :SCORE' (docs/decoding.md#context-biasing)",
    )
    parser.add_argument(
        "--biasing-score",
        type=_biasing_score,
        default=DEFAULT_BIASING_SCORE,
        metavar="S",
        help=f"--biasing-phrases: the bonus per token of a phrase without its own score "
        f"(default {DEFAULT_BIASING_SCORE:g}, at most {MAX_BIASING_SCORE:g})",
    )
    add_lm_arguments(parser)


def _biasing_score(text: str) -> float:
    """`--biasing-score`'s value, checked (`check_biasing_score`)."""
    try:
        return check_biasing_score(text, "the score")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _biasing(args: argparse.Namespace, tokenizer) -> BiasingGraph | None:
    """The graph of `--biasing-phrases` with `--biasing-score`, or None."""
    if args.biasing_phrases is None:
        if args.biasing_score != DEFAULT_BIASING_SCORE:
            raise ValueError("--biasing-score goes with --biasing-phrases FILE")
        return None
    phrases = read_biasing_phrases(args.biasing_phrases)
    return BiasingGraph.from_phrases(phrases, tokenizer, args.biasing_score)


def _recognizer(
    args: argparse.Namespace,
    source: Path | list[Path] | None,
    windows: WindowConfig | None = None,
) -> Recognizer:
    """The recognizer the arguments ask for: `--onnx DIR`'s, or `source`'s (a bundle or
    checkpoints); `windows`: how long recordings are cut."""
    if args.onnx is not None:
        from asr.inference.onnx_runtime import load_onnx_recognizer

        return load_onnx_recognizer(
            args.onnx,
            args.beam_size,
            args.max_symbols_per_frame,
            args.int8,
            args.num_threads,
            windows,
        )
    if args.int8:
        raise ValueError("--int8 selects the int8 files of an ONNX export: give --onnx DIR")
    assert source is not None
    return load_recognizer(
        source,
        args.device,
        args.beam_size,
        args.max_symbols_per_frame,
        windows,
        ema=getattr(args, "ema", False),
    )


def _split_model(args: argparse.Namespace, inputs: list[Path], needed: int) -> Path | None:
    """The MODEL of `inputs` (the first) unless `--onnx` names it; checks that `needed`
    arguments remain."""
    if len(inputs) < needed + (args.onnx is None):
        raise ValueError("expected MODEL (or --onnx DIR) and then the files to decode")
    return None if args.onnx is not None else inputs.pop(0)


@command
def export_main(argv: list[str] | None = None) -> None:
    """`asr-export`: checkpoint(s) -> bundle."""
    parser = argparse.ArgumentParser(description="Export a checkpoint as an inference bundle.")
    parser.add_argument(
        "checkpoint",
        type=Path,
        help="a .ckpt, or a run's checkpoints/ (or exp) directory; --format onnx: or a bundle",
    )
    add_checkpoint_arguments(parser)
    parser.add_argument(
        "--encoder-only",
        action="store_true",
        help=f"only the encoder, for init_encoder_from= (default name {ENCODER_FILE})",
    )
    parser.add_argument(
        "--format",
        choices=("bundle", "onnx"),
        default="bundle",
        help="bundle: one file for this package; onnx: a directory of ONNX graphs and "
        f"tokens.txt that sherpa-onnx decodes (default name {ONNX_DIR}/)",
    )
    parser.add_argument(
        "--no-int8", action="store_true", help="onnx: skip the int8-quantized copies"
    )
    add_chunking_arguments(parser, "--format onnx of a streaming model: exported at ")
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="default: in the run's exp dir"
    )
    args = parser.parse_args(argv)
    paths = select_checkpoints(args.checkpoint, args.epoch, args.avg, args.best)
    if args.format != "onnx" and _chunking_given(args):
        parser.error("--chunk-ms and --left-context-ms pick a streaming model's ONNX export")
    if args.format == "onnx":
        if args.encoder_only:
            raise ValueError("--encoder-only writes a bundle for fine-tuning, not ONNX")
        _export_onnx(paths, args.output or paths[-1].parent.parent / ONNX_DIR, args)
        return
    name = ENCODER_FILE if args.encoder_only else BUNDLE_FILE
    output = args.output or paths[-1].parent.parent / name
    export = export_encoder if args.encoder_only else export_bundle
    path = export(paths, output, ema=args.ema)
    weights = "EMA weights" if args.ema else "weights"
    weights = f"encoder {weights}" if args.encoder_only else weights
    print(
        f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {weights} averaged over "
        f"{len(paths)} checkpoint(s))"
    )


def _export_onnx(paths: list[Path], output: Path, args: argparse.Namespace) -> None:
    from asr.inference.onnx_export import export_onnx

    def report(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    export = export_onnx(
        paths,
        output,
        ema=args.ema,
        int8=not args.no_int8,
        report=report,
        chunk_ms=args.chunk_ms,
        left_context_ms=args.left_context_ms,
    )
    size = sum(f.stat().st_size for f in export.files) / 1e6
    print(f"wrote {len(export.files)} files to {export.directory} ({size:.1f} MB)")
    if export.sherpa_note:
        print(export.sherpa_note)


def _add_transcribe_arguments(parser: argparse.ArgumentParser) -> None:
    """asr-transcribe's own options: timestamps, output format, long recordings."""
    parser.add_argument(
        "--timestamps", action="store_true", help="each word's start and end (transducers)"
    )
    parser.add_argument(
        "--output-format",
        choices=OUTPUT_FORMATS,
        default="text",
        help="text: 'path<TAB>text' per file; json: one object per file; srt: subtitles; "
        "ctm: one line per word (srt and ctm imply --timestamps)",
    )
    parser.add_argument(
        "-o",
        "--output-dir",
        type=Path,
        default=None,
        help="write one file per input (<name>.<format>) here instead of to stdout",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW,
        help=f"a stretch of speech without pauses longer than this is decoded in "
        f"overlapping windows of this many seconds "
        f"(default {DEFAULT_WINDOW:g})",
    )
    parser.add_argument(
        "--overlap",
        type=float,
        default=DEFAULT_OVERLAP,
        help=f"seconds shared by consecutive windows (default {DEFAULT_OVERLAP:g})",
    )
    parser.add_argument(
        "--max-pause",
        type=float,
        default=DEFAULT_MAX_PAUSE,
        help=f"recordings are cut at pauses longer than this many seconds (default "
        f"{DEFAULT_MAX_PAUSE:g}; 0: windows only)",
    )


def add_chunking_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """--chunk-ms and --left-context-ms, a streaming model's latency; `what` starts their
    help."""
    parser.add_argument(
        "--chunk-ms",
        type=float,
        default=None,
        help=what + "a chunk of this many milliseconds, one it was trained with (default: its "
        "largest)",
    )
    parser.add_argument(
        "--left-context-ms",
        type=float,
        default=None,
        help=what + "this many milliseconds of left context, trained (default: its largest)",
    )


def _chunking_given(args: argparse.Namespace) -> bool:
    return args.chunk_ms is not None or args.left_context_ms is not None


def _add_streaming_arguments(parser: argparse.ArgumentParser, decoding: bool) -> None:
    """--chunk-ms and --left-context-ms (asr-decode: the whole utterance through the chunked
    masks, which streaming equals), and asr-transcribe's --streaming."""
    if not decoding:
        parser.add_argument(
            "--streaming",
            action="store_true",
            help="a streaming model, fed chunk by chunk; AUDIO '-' reads raw 16 kHz 16-bit "
            "mono PCM from standard input",
        )
        parser.add_argument(
            "--piece-ms",
            type=float,
            default=100.0,
            help="--streaming: milliseconds of audio per read (default 100)",
        )
    what = "a streaming model decoded through the masks of " if decoding else "--streaming: "
    add_chunking_arguments(parser, what)


STDIN = Path("-")


def _pcm_pieces(stream, piece_bytes: int) -> Iterator[np.ndarray]:
    """Float samples of raw 16-bit little-endian PCM read from `stream` in pieces."""
    rest = b""
    while data := stream.read(piece_bytes):
        data = rest + data
        whole = len(data) - len(data) % 2
        rest = data[whole:]
        yield np.frombuffer(data[:whole], dtype="<i2").astype(np.float32) / 32768.0


def _file_pieces(path: Path, piece_samples: int) -> Iterator[np.ndarray]:
    samples = open_audio(path).read()
    for start in range(0, len(samples), piece_samples):
        yield samples[start : start + piece_samples]


def _transcribe_streaming(
    recognizer, inputs: list[Path], args: argparse.Namespace, timestamps: bool
) -> int:
    """Stream each input (a file or standard input) through `recognizer`, the partial
    transcript on stderr when it is a terminal, the final one on stdout; the number of
    inputs that could not be read."""
    piece_samples = max(1, int(args.piece_ms * SAMPLE_RATE / 1000))
    biasing = _biasing(args, recognizer.tokenizer)
    lm = language_model_of(args, recognizer)
    live = sys.stderr.isatty()
    failed = 0
    for path in inputs:
        name = "<stdin>" if path == STDIN else str(path)
        try:
            pieces = (
                _pcm_pieces(sys.stdin.buffer, 2 * piece_samples)
                if path == STDIN
                else _file_pieces(path, piece_samples)
            )
            stream = recognizer.create_stream(biasing, lm=lm)
            shown = ""
            for piece in pieces:
                stream.accept_waveform(piece)
                recognizer.decode([stream])
                if live and stream.text != shown:
                    shown = stream.text
                    print(f"\r\033[K{shown[-150:]}", end="", file=sys.stderr, flush=True)
        except (OSError, ValueError) as err:
            print(f"asr-transcribe: error: {err}", file=sys.stderr)
            failed += 1
            continue
        stream.finish()
        recognizer.decode([stream])
        if live:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
        sys.stdout.write(render(stream.transcript(), name, args.output_format, timestamps))
        sys.stdout.flush()
    return failed


def _readable(paths: list[Path]) -> tuple[list[Path], int]:
    """The paths whose audio opens, and how many did not (each named in one line)."""
    good = []
    for path in paths:
        try:
            open_audio(path)
        except (OSError, ValueError) as err:
            print(f"asr-transcribe: error: {err}", file=sys.stderr)
            continue
        good.append(path)
    return good, len(paths) - len(good)


@command
def transcribe_main(argv: list[str] | None = None) -> None:
    """`asr-transcribe`: one line `path<TAB>text` per audio file (or json, srt, ctm)."""
    parser = argparse.ArgumentParser(
        description="Transcribe audio files of any length with an asr bundle, checkpoint or "
        "ONNX export.",
        usage="%(prog)s [options] (MODEL | --onnx DIR) AUDIO [AUDIO ...]",
    )
    parser.add_argument(
        "inputs",
        type=Path,
        nargs="+",
        metavar="MODEL AUDIO",
        help="model bundle (asr-export) or checkpoint, then audio files (flac, wav, ...)",
    )
    _add_search_arguments(parser)
    _add_transcribe_arguments(parser)
    _add_streaming_arguments(parser, decoding=False)
    args = parser.parse_intermixed_args(argv)  # options may stand between MODEL and AUDIO
    inputs = list(args.inputs)
    timestamps = args.timestamps or args.output_format in ("srt", "ctm")
    windows = WindowConfig(args.window, args.overlap, args.max_pause)
    model = _split_model(args, inputs, 1)
    check_lm_options(args)
    if args.streaming:
        if args.onnx is not None:
            parser.error(
                "--streaming decodes a bundle or checkpoint; sherpa-onnx's online recognizer "
                "decodes the streaming ONNX export (docs/streaming.md)"
            )
        if args.output_format == "srt" and len(inputs) > 1:
            parser.error("--streaming writes to stdout: srt of one input at a time")
        if inputs.count(STDIN) > 1:
            parser.error("standard input ('-') can be read once")
        recognizer = load_streaming_recognizer(
            model,
            args.chunk_ms,
            args.left_context_ms,
            args.beam_size,
            args.device,
            max_symbols_per_frame=args.max_symbols_per_frame,
        )
        failed = _transcribe_streaming(recognizer, inputs, args, timestamps)
        if failed:
            raise SystemExit(
                f"asr-transcribe: {failed} of {len(inputs)} input(s) could not be read"
            )
        return
    if _chunking_given(args):
        parser.error("--chunk-ms and --left-context-ms go with --streaming")
    if args.output_format == "srt" and len(inputs) > 1 and args.output_dir is None:
        parser.error("srt of several files needs --output-dir (one .srt per file)")
    stems = [path.stem for path in inputs]
    if args.output_dir is not None and len(set(stems)) < len(stems):
        twice = sorted({stem for stem in stems if stems.count(stem) > 1})
        parser.error(f"--output-dir: several inputs are named {', '.join(twice)} (one file each)")
    recognizer = _recognizer(args, model, windows)
    biasing = _biasing(args, recognizer.tokenizer)
    lm = language_model_of(args, recognizer)
    paths, failed = _readable(inputs)
    transcripts = (
        recognizer.transcribe(paths, timestamps=True, biasing=biasing, lm=lm)
        if timestamps
        else None
    )
    texts = None if timestamps else recognizer.transcribe(paths, biasing=biasing, lm=lm)
    if args.output_dir is not None:
        args.output_dir.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(paths):
        transcript = transcripts[i] if transcripts else Transcript(texts[i], [])
        out = render(transcript, str(path), args.output_format, timestamps)
        if args.output_dir is None:
            sys.stdout.write(out)
            continue
        suffix = "txt" if args.output_format == "text" else args.output_format
        target = args.output_dir / f"{path.stem}.{suffix}"
        target.write_text(out)
        print(f"wrote {target}", file=sys.stderr)
    if failed and len(inputs) > 1:
        raise SystemExit(f"asr-transcribe: {failed} of {len(inputs)} file(s) could not be read")
    if failed:  # the one file, named above
        raise SystemExit(1)


@command
def decode_main(argv: list[str] | None = None) -> None:
    """`asr-decode`: decode a manifest, write hyps.jsonl and wer.json, print the WER."""
    parser = argparse.ArgumentParser(description="Decode a cut manifest and report WER.")
    parser.add_argument(
        "inputs",
        type=Path,
        nargs="+",
        metavar="MODEL MANIFEST",
        help="bundle (asr-export), .ckpt, or a run's checkpoints/ directory (none with "
        "--onnx DIR); then a lhotse cut manifest (.jsonl.gz)",
    )
    parser.add_argument(
        "-o", "--output-dir", type=Path, default=None, help="default: beside the model"
    )
    parser.add_argument("--max-duration", type=float, default=200.0, help="seconds per batch")
    _add_search_arguments(parser)
    parser.add_argument(
        "--nbest", type=int, default=1, help="also list the N best hypotheses (N <= beam size)"
    )
    _add_streaming_arguments(parser, decoding=True)
    add_checkpoint_arguments(parser)
    args = parser.parse_intermixed_args(argv)  # as the docs type it: MODEL --epoch 6 MANIFEST
    inputs = list(args.inputs)
    model = _split_model(args, inputs, 1)
    if len(inputs) != 1:
        parser.error("expected one MANIFEST after the model")
    args.model, args.manifest = model or args.onnx, inputs[0]
    if not 1 <= args.nbest <= args.beam_size:
        parser.error(f"--nbest {args.nbest} needs --beam-size of at least {args.nbest}")
    if args.ema and args.onnx is not None:
        parser.error("--ema picks a checkpoint's weights: export the ONNX graphs with --ema")
    check_lm_options(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    source: Path | list[Path] = args.model
    name = f"decode-{args.manifest.name.split('.')[0]}"
    if args.onnx is not None:
        name += "-onnx-int8" if args.int8 else "-onnx"
    elif args.epoch is not None or args.best or args.avg > 1:  # checkpoints, averaged
        source = select_checkpoints(args.model, args.epoch, args.avg, args.best)
        name += "-best" if args.best else f"-epoch{epoch_of(source[-1]):02d}-avg{len(source)}"
    if args.ema:
        name += "-ema"
    if args.beam_size > 1:
        name += f"-beam{args.beam_size}"
    if args.max_symbols_per_frame is not None:
        name += f"-sym{args.max_symbols_per_frame}"
    recognizer = _recognizer(args, source)
    biasing = _biasing(args, recognizer.tokenizer)
    if biasing is not None:
        name += f"-biasing-{args.biasing_phrases.stem}-score{args.biasing_score:g}"
    lm = language_model_of(args, recognizer)
    if lm is not None:
        name += f"-lm-{args.lm.name.split('.')[0]}-w{lm.weight:g}"
        if args.lodr is not None:
            name += f"-lodr-{args.lodr.name.split('.')[0]}-w{lm.lodr_weight:g}"
    if _chunking_given(args):
        if args.onnx is not None:
            parser.error("--chunk-ms decodes a bundle or checkpoint, not an ONNX export")
        chunking = chunking_of_ms(recognizer.model, args.chunk_ms, args.left_context_ms)
        recognizer = recognizer.with_chunking(chunking)
        frame_ms = recognizer.model.frame_seconds * 1000
        name += f"-chunk{recognizer.chunking.chunk * frame_ms:g}ms"
        name += f"-left{recognizer.chunking.left * frame_ms:g}ms"
    model_dir = args.model if args.model.is_dir() else args.model.parent
    output_dir = args.output_dir or model_dir / name
    summary = decode_manifest(
        recognizer,
        args.manifest,
        output_dir,
        args.max_duration,
        args.nbest,
        biasing,
        lm,
        lm_settings(args, lm),
    )
    print(json.dumps(summary))
    print(f"WER {summary['wer']:.2f}% on {summary['ref_words']} words ({output_dir}/hyps.jsonl)")
    if summary["utterances_skipped"]:
        print(
            f"{summary['utterances_skipped']} utterance(s) had unreadable audio and count as all "
            "deletions (see the warnings above; 'unreadable' in hyps.jsonl)"
        )


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """asr-serve's arguments: the model, where to listen, the search, the limits, the
    endpoint rules and the page's example."""
    from asr.inference.endpoint import EndpointRules
    from asr.inference.server import ServeConfig

    parser.add_argument("model", type=Path, help="bundle (asr-export) or checkpoint")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; beyond it, a browser's microphone needs "
        "https: put a TLS proxy in front, docs/serving.md)",
    )
    parser.add_argument("--port", type=int, default=8000)
    add_chunking_arguments(parser, "")
    parser.add_argument("--beam-size", type=int, default=1, help="1: greedy; more: beam search")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ema", action="store_true", help="the EMA weights (ema=scaled runs)")
    parser.add_argument(
        "--max-streams", type=int, default=32, help="connections at once (default 32)"
    )
    parser.add_argument(
        "--batch-wait-ms",
        type=float,
        default=10.0,
        help="wait this long after audio arrives for other streams' audio to decode in the "
        "same model step (default 10)",
    )
    rules, defaults = EndpointRules(), ServeConfig()
    for flag, default, what in (
        (
            "--silence-after-speech",
            rules.silence_after_speech_s,
            "endpoint: a segment with words ends after this long without a token",
        ),
        (
            "--silence",
            rules.silence_s,
            "endpoint: a segment without words restarts after this long",
        ),
        ("--max-segment", rules.max_segment_s, "endpoint: the longest segment"),
        ("--idle-timeout", defaults.idle_timeout_s, "close a connection silent this long"),
    ):
        parser.add_argument(
            flag,
            type=float,
            default=default,
            metavar="SECONDS",
            help=f"{what} (default {default:g})",
        )
    parser.add_argument(
        "--max-frame-bytes",
        type=int,
        default=defaults.max_frame_bytes,
        help=f"the largest binary frame a client may send (default {defaults.max_frame_bytes})",
    )
    parser.add_argument(
        "--max-biasing-phrases",
        type=int,
        default=defaults.max_biasing_phrases,
        help="the most phrases a connection may ask to boost in its start message "
        f"(default {defaults.max_biasing_phrases})",
    )
    add_lm_arguments(parser)  # one LM, read at start-up, that every connection's search fuses
    parser.add_argument(
        "--example",
        type=Path,
        default=None,
        metavar="AUDIO",
        help="an audio file the model transcribes well (e.g. one of its test utterances): the "
        "page's 'Play the example' button streams it at real time",
    )
    parser.add_argument(
        "--num-threads", type=int, default=None, help="torch's intra-op threads (default: its own)"
    )


@command
def serve_main(argv: list[str] | None = None) -> None:
    """`asr-serve`: live transcription of a streaming model over a websocket, and a page
    with the microphone (docs/serving.md)."""
    from asr.inference.endpoint import EndpointRules
    from asr.inference.server import ServeConfig, create_app

    parser = argparse.ArgumentParser(
        description="Serve a streaming model: a websocket at /ws that takes 16 kHz PCM and "
        "answers partial and final transcripts, and a page at / that streams the microphone "
        "or a file to it.",
    )
    _add_serve_arguments(parser)
    args = parser.parse_args(argv)
    if args.example is not None and not args.example.is_file():
        raise ValueError(f"--example {args.example}: no such file")
    check_lm_options(args)
    config = ServeConfig(
        max_streams=args.max_streams,
        batch_wait_ms=args.batch_wait_ms,
        max_frame_bytes=args.max_frame_bytes,
        idle_timeout_s=args.idle_timeout,
        endpoints=EndpointRules(args.silence_after_speech, args.silence, args.max_segment),
        max_biasing_phrases=args.max_biasing_phrases,
    )
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    recognizer = load_streaming_recognizer(
        args.model, args.chunk_ms, args.left_context_ms, args.beam_size, args.device, args.ema
    )
    lm = language_model_of(args, recognizer)  # shared by every connection: one search step
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    print(
        f"asr-serve: {args.model} at http://{args.host}:{args.port}/ (websocket /ws), "
        f"{recognizer.chunk_seconds * 1000:g} ms chunks, up to {args.max_streams} streams"
        + lm_description(args, lm),
        file=sys.stderr,
        flush=True,
    )
    app = create_app(recognizer, config, args.example, lm)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")

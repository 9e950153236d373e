"""`asr-decode MODEL MANIFEST`: decode a cut manifest, write hypotheses, print WER.

MODEL is a bundle (asr-export) or a training checkpoint. Writes into `--output-dir`:
`hyps.jsonl` (one line per utterance: id, ref, hyp, substitutions, deletions,
insertions, ref_words) and `wer.json` (corpus totals). An utterance whose audio cannot be
read is never left out of the WER: it counts as all deletions (an empty hypothesis, marked
`"unreadable"` in hyps.jsonl), and the number of such utterances is printed. Errors that are
not about one file (a wrong sample rate, a bug) stop the run.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
from rich.progress import Progress

from asr.cli import command
from asr.data.buckets import build_eval_sampler
from asr.data.corpus import cut_text, load_cuts
from asr.data.dataset import FILE_ERRORS
from asr.data.features import check_sample_rate
from asr.errors import first_line
from asr.export import add_checkpoint_arguments, select_checkpoints
from asr.metrics import ErrorCounts, word_errors
from asr.transcribe import Recognizer, load_recognizer

log = logging.getLogger(__name__)


def decode_manifest(
    recognizer: Recognizer,
    manifest: str | Path,
    output_dir: str | Path,
    max_duration: float = 200.0,
    nbest: int = 1,
) -> dict:
    """Decode every cut of `manifest`; write hyps.jsonl and wer.json; return the totals.
    With `nbest` > 1 each line of hyps.jsonl also lists the n best hypotheses and their
    scores (`nbest`: [{"hyp", "score"}, ...], best first; `hyp` is the first)."""
    cuts = load_cuts(manifest)
    sampler = build_eval_sampler(cuts, max_duration)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    total, skipped, utterances, audio_seconds = ErrorCounts(), [], 0, 0.0
    start = time.perf_counter()
    with open(output_dir / "hyps.jsonl", "w") as out, Progress(transient=True) as progress:
        task = progress.add_task(f"Decoding {Path(manifest).name}", total=None)
        for batch in sampler:
            feats, kept, lines = [], [], []
            for cut in batch:
                check_sample_rate(cut.id, cut.sampling_rate)
                try:
                    audio = cut.load_audio()
                except FILE_ERRORS as err:
                    skipped.append(cut.id)
                    log.warning(
                        "%s: unreadable audio, counted as all deletions (%s)",
                        cut.id,
                        first_line(err),
                    )
                    lines.append((cut, "", first_line(err)))
                    continue
                feats.append(recognizer.features_of(audio))
                kept.append(cut)
            if nbest > 1:
                lists = recognizer.nbest_features(feats, nbest) if kept else []
                hyps = [h[0][0] if h else "" for h in lists]
            else:
                lists, hyps = [], recognizer.transcribe_features(feats) if kept else []
            alternatives = dict(zip([cut.id for cut in kept], lists, strict=False))
            lines += [(cut, hyp, None) for cut, hyp in zip(kept, hyps, strict=True)]
            for cut, hyp, unreadable in lines:
                ref = cut_text(cut)
                errors = word_errors(ref, hyp)
                total = total + errors
                utterances += 1
                audio_seconds += 0.0 if unreadable else cut.duration
                line = {"id": cut.id, "ref": ref, "hyp": hyp, **errors.__dict__}
                if unreadable:
                    line["unreadable"] = unreadable
                if cut.id in alternatives:
                    line["nbest"] = [
                        {"hyp": text, "score": round(score, 4)}
                        for text, score in alternatives[cut.id]
                    ]
                out.write(json.dumps(line) + "\n")
            progress.update(
                task, advance=len(lines), description=f"Decoding: WER {100 * total.wer:.2f}%"
            )
    elapsed = time.perf_counter() - start
    summary = {
        "manifest": str(manifest),
        "wer": round(100 * total.wer, 3),
        **total.__dict__,
        "utterances": utterances,
        "utterances_skipped": len(skipped),  # unreadable: counted as all deletions
        "audio_seconds": round(audio_seconds, 1),
        "decode_seconds": round(elapsed, 2),
        "rtfx": round(audio_seconds / elapsed, 1) if elapsed > 0 else None,
    }
    (output_dir / "wer.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Decode a cut manifest and report WER.")
    parser.add_argument(
        "model", type=Path, help="bundle (asr-export), .ckpt, or a run's checkpoints/ directory"
    )
    parser.add_argument("manifest", type=Path, help="lhotse cut manifest (.jsonl.gz)")
    parser.add_argument(
        "-o", "--output-dir", type=Path, default=None, help="default: beside the model"
    )
    parser.add_argument("--max-duration", type=float, default=200.0, help="seconds per batch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--beam-size",
        type=int,
        default=1,
        help="1: greedy search; more: beam search of that width",
    )
    parser.add_argument(
        "--nbest", type=int, default=1, help="also list the N best hypotheses (N <= beam size)"
    )
    add_checkpoint_arguments(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.nbest <= args.beam_size:
        parser.error(f"--nbest {args.nbest} needs --beam-size of at least {args.nbest}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    source: Path | list[Path] = args.model
    name = f"decode-{args.manifest.name.split('.')[0]}"
    if args.epoch is not None or args.best or args.avg > 1:  # checkpoints, averaged
        source = select_checkpoints(args.model, args.epoch, args.avg, args.best)
        name += "-best" if args.best else f"-epoch{source[-1].stem[6:]}-avg{len(source)}"
    if args.beam_size > 1:
        name += f"-beam{args.beam_size}"
    model_dir = args.model if args.model.is_dir() else args.model.parent
    output_dir = args.output_dir or model_dir / name
    summary = decode_manifest(
        load_recognizer(source, args.device, args.beam_size),
        args.manifest,
        output_dir,
        args.max_duration,
        args.nbest,
    )
    print(json.dumps(summary))
    print(f"WER {summary['wer']:.2f}% on {summary['ref_words']} words ({output_dir}/hyps.jsonl)")
    if summary["utterances_skipped"]:
        print(
            f"{summary['utterances_skipped']} utterance(s) had unreadable audio and count as all "
            "deletions (see the warnings above; 'unreadable' in hyps.jsonl)"
        )


if __name__ == "__main__":
    main()
